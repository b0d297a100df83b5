//! The end of a schedule: the checks ([`verify`]), the figures of a run, the soak's progress
//! line and the replay hint.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use async_nats::jetstream::context::Context;
use jetshard_testkit::history;
use jetshard_testkit::history::{Ack, History, Violation};
use jetshard_tests::model::{
    LedgerModel, Op, check_effects, check_journal, check_query_answers,
    check_query_answers_by_state, check_states, client_outcomes, journal_excerpt, read_ledger,
    read_stock,
};

use super::features::ledger_sender;
use super::{FeatureRun, JOURNAL_COPY, Nodes, wait_consumers_drained, wait_journal_copied};

/// Figures of one schedule.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    /// Commands in the history.
    pub commands: usize,
    /// Of those unknown.
    pub unknown: usize,
    /// Publishes sent again.
    pub retries: u64,
    /// Faults injected.
    pub faults: usize,
    /// Violations found.
    pub violations: usize,
    /// Dead letters.
    pub dead_letters: usize,
    /// Fence records (acquisitions).
    pub fences: usize,
    /// Timers armed, fired, cancelled before they fired.
    pub timers: (usize, usize, usize),
    /// Orders, reserved, refused.
    pub orders: (usize, usize, usize),
    /// Keyed requests answered.
    pub keyed: u64,
    /// Query answers.
    pub queries: usize,
}

/// Totals over a test's schedules, printed when the test ends (seen with `--nocapture`).
#[derive(Debug, Default)]
pub struct Totals {
    schedules: usize,
    figures: Figures,
    faults: BTreeMap<String, usize>,
}

impl Totals {
    /// Adds one schedule.
    pub fn add(&mut self, figures: &Figures, faults: &[String]) {
        self.schedules += 1;
        let t = &mut self.figures;
        t.commands += figures.commands;
        t.unknown += figures.unknown;
        t.retries += figures.retries;
        t.faults += figures.faults;
        t.violations += figures.violations;
        t.dead_letters += figures.dead_letters;
        t.fences += figures.fences;
        for fault in faults {
            let kind = fault
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            *self.faults.entry(kind).or_default() += 1;
        }
    }

    /// One line of totals.
    pub fn line(&self, test: &str) -> String {
        let f = &self.figures;
        format!(
            "TOTALS {test}: {} schedules, {} commands ({} unknown, {} publishes re-sent), {} faults injected {:?}, {} fence records, {} dead letters, {} violations",
            self.schedules,
            f.commands,
            f.unknown,
            f.retries,
            f.faults,
            self.faults,
            f.fences,
            f.dead_letters,
            f.violations
        )
    }
}

/// One schedule of a test, for its messages.
#[derive(Clone, Copy, Debug)]
pub struct Run<'a> {
    /// The test file (`chaos`, `cluster`).
    pub file: &'a str,
    /// The test.
    pub test: &'a str,
    /// The seed.
    pub seed: u64,
}

/// Ends a schedule: waits (bounded by `within`) until no partition consumer holds a command,
/// checks the journal against `history`, and panics with everything needed to debug a failure
/// (the replay line, the report, the journal of the entities it names, the node log lines of
/// the first commands it names, every node's log tail). With `features` (a schedule with every
/// feature on) it also waits (bounded) until every armed timer fired and every order was
/// answered, reads the ledger's history from [`JOURNAL_COPY`] (a compaction purged the
/// journal), and checks the timers, the saga, the stock's state (queried), the query answers
/// and the keyed answers. Returns the schedule's figures and how many acknowledged commands
/// the command stream still holds.
#[allow(clippy::too_many_arguments)]
pub async fn verify(
    js: &Context,
    nodes: &Nodes,
    run: Run<'_>,
    history: &History<Op>,
    injected: &[String],
    retries: u64,
    within: Duration,
    features: Option<FeatureRun>,
) -> (Figures, u64) {
    let Run { file, test, seed } = run;
    let drained = wait_consumers_drained(js, nodes.spec().partitions, within).await;
    let partitions = nodes.spec().partitions;
    let mut history = history.clone();
    let mut extra = Vec::new();
    let mut effects = None;
    let report = match &features {
        None => {
            let report = check_journal(js, &history).await;
            match query_states(js, partitions, &history).await {
                Ok(states) => {
                    let judged = check_states(&history, &states);
                    extra.extend(judged.violations);
                    extra.extend(judged.missing.into_iter().map(|m| format!("lost: {m}")));
                }
                Err(e) => extra.push(e),
            }
            report
        }
        Some(features) => {
            history.extend(features.history.clone());
            // With background compaction, a purge may have outrun the journal's mirror: what
            // needs a purged record is judged by the entities' states instead.
            let compacting = features.compacting;
            // Timers due and answers on their way: wait until nothing is pending.
            let mut last = None;
            let deadline = Instant::now() + within;
            let settled = loop {
                let read = async {
                    wait_journal_copied(js, Duration::from_secs(30)).await?;
                    let ledger = read_ledger(js, Some(JOURNAL_COPY)).await?;
                    let stock = read_stock(js).await?;
                    let states = query_states(js, partitions, &history).await?;
                    Ok::<_, String>((ledger, stock, states))
                };
                match read.await {
                    Ok((ledger, stock, states)) => {
                        let report = check_effects(&ledger, &stock);
                        let judged = check_states(&history, &states);
                        let done =
                            judged.missing.is_empty() && (compacting || report.pending.is_empty());
                        last = Some((ledger, report, states, judged));
                        if done {
                            break Ok(());
                        }
                    }
                    Err(e) => extra.push(format!("reading the journals and states: {e}")),
                }
                if Instant::now() >= deadline {
                    break Err(());
                }
                // Polling the journals: timers are due, answers on their way.
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            if last.is_some() {
                // Reads that failed before one succeeded were the server coming back.
                extra.clear();
            }
            extra.truncate(3);
            match last {
                Some((ledger, report, states, judged)) => {
                    if settled.is_err() {
                        extra.extend(judged.missing.iter().take(10).map(|m| format!("lost: {m}")));
                        if !compacting {
                            extra.extend(
                                report.pending.iter().take(10).map(|p| format!("lost: {p}")),
                            );
                        }
                    }
                    extra.extend(judged.violations.iter().take(20).cloned());
                    extra.extend(
                        report
                            .violations
                            .iter()
                            .filter(|v| !compacting || !report.unplaced.contains(v))
                            .take(20)
                            .cloned(),
                    );
                    extra.extend(check_query_answers_by_state(&states, &features.answers));
                    if !compacting {
                        extra.extend(check_query_answers(&ledger, &features.answers));
                    }
                    extra.extend(features.bad_replies.iter().cloned());
                    let config =
                        jetshard_tests::stock::stock_config(features.partitions, "chaos-client")
                            .build()
                            .expect("config");
                    let sender: jetshard::CommandSender<jetshard_tests::stock::Stock> =
                        jetshard::CommandSender::new(js.client(), &config);
                    for stock in &features.stocks {
                        let units = report.stock_units.get(stock).copied().unwrap_or(0);
                        match sender.get(stock, Duration::from_secs(20)).await {
                            Ok(s) if s.state.reserved == units => {}
                            Ok(s) => extra.push(format!(
                                "stock {stock}: its state says {} units reserved, its journal {units}",
                                s.state.reserved
                            )),
                            Err(e) => extra.push(format!("stock {stock}: query failed: {e}")),
                        }
                    }
                    let mut history_report =
                        history::check(&LedgerModel, &history, &client_outcomes(&ledger));
                    if compacting {
                        let aside = set_aside_losses(&mut history_report, &history);
                        let journals = jetshard_tests::ledger_journals(js).await;
                        let copies = jetshard_tests::copy_names(JOURNAL_COPY, &journals);
                        eprintln!(
                            "seed {seed}: compacted in the background: the journal holds {} records, its mirror {}; {} losses in the mirror judged by the states instead, {} (of commands that change no state) judged by neither; {} effects naming a record the mirror lacks not judged",
                            messages(js, &journals).await,
                            messages(js, &copies).await,
                            aside.0,
                            aside.1,
                            report.unplaced.len()
                        );
                    }
                    effects = Some(report);
                    history_report
                }
                None => {
                    extra.push("the journals could not be read".to_owned());
                    // With a compaction, the journal lacks what it purged: the mirror, if it
                    // can be read, keeps it (else every purged command would read as lost).
                    match read_ledger(js, compacting.then_some(JOURNAL_COPY)).await {
                        Ok(records) => {
                            history::check(&LedgerModel, &history, &client_outcomes(&records))
                        }
                        Err(_) => check_journal(js, &history).await,
                    }
                }
            }
        }
    };
    let summary = report.summary();
    let mut figures = Figures {
        commands: summary.commands,
        unknown: summary.unknown,
        retries,
        faults: injected.len(),
        violations: report.violations().len() + extra.len(),
        dead_letters: summary.dead_letters,
        fences: summary.fences,
        ..Figures::default()
    };
    if let (Some(effects), Some(features)) = (&effects, &features) {
        figures.timers = (
            effects.timers_set,
            effects.timers_fired,
            effects.timers_cancelled,
        );
        figures.orders = (effects.orders, effects.reserved, effects.refused);
        figures.keyed = features.keyed;
        figures.queries = features.answers.len();
    }
    eprintln!("seed {seed}: {report}\n  faults: {injected:#?}");
    if drained.is_err() || !report.is_ok() || !extra.is_empty() {
        let mut traces = String::new();
        for violation in report.violations().iter().take(3) {
            if let Violation::Lost { command_seq, .. }
            | Violation::Duplicated { command_seq, .. }
            | Violation::Reordered { command_seq, .. } = violation
            {
                traces += &format!(
                    "node log lines of command {command_seq}:\n{}\n",
                    nodes.grep_logs(&format!("cmd_seq={command_seq}"), 40)
                );
            }
        }
        panic!(
            "{test} seed {seed} failed\n{}\nthe nodes' whole logs: {}\ndrained: {drained:?}\n{report}\ntimers, saga, queries, keyed answers: {extra:#?}\n{}\n{traces}faults: {injected:#?}\n{}",
            replay_hint(file, test, seed),
            nodes.keep_logs(seed),
            journal_excerpt(js, &report, 3).await,
            nodes.describe()
        );
    }
    (figures, drained.unwrap_or_default())
}

/// Each entity of `history`'s state, asked of its owner (the ledger's `partitions`).
///
/// # Errors
/// A query that failed (each waits up to 20 s).
async fn query_states(
    js: &Context,
    partitions: u32,
    history: &History<Op>,
) -> Result<BTreeMap<String, Vec<u64>>, String> {
    let sender = ledger_sender(js.client(), partitions);
    let entities: BTreeSet<&str> = history.sent().iter().map(|s| s.entity.as_str()).collect();
    let mut states = BTreeMap::new();
    for entity in entities {
        let answer = sender
            .get(entity, Duration::from_secs(20))
            .await
            .map_err(|e| format!("query of {entity}'s state: {e}"))?;
        states.insert(entity.to_owned(), answer.state);
    }
    Ok(states)
}

/// The messages `streams` hold, summed (0 for a stream unreadable).
async fn messages(js: &Context, streams: &[String]) -> u64 {
    let mut sum = 0;
    for name in streams {
        if let Ok(mut stream) = js.get_stream(name).await
            && let Ok(info) = stream.info().await
        {
            sum += info.state.messages;
        }
    }
    sum
}

/// Takes the losses out of `report` (a check of a mirror that purges may have outrun): those
/// of commands whose effect shows in their entity's state ([`check_states`] judged them), and
/// the others (a rejected or dead-lettered command's, which changes no state), which nothing
/// else judges. Returns how many of each.
fn set_aside_losses(report: &mut history::Report, history: &History<Op>) -> (usize, usize) {
    let shown: BTreeSet<(&str, u64)> = history
        .sent()
        .iter()
        .filter_map(|sent| match (&sent.command, sent.ack) {
            (
                Op::Push(_)
                | Op::Append(_)
                | Op::Many { .. }
                | Op::Arm { .. }
                | Op::Disarm { .. }
                | Op::Order { .. },
                Ack::Acked(seq),
            ) => Some((sent.entity.as_str(), seq)),
            _ => None,
        })
        .collect();
    let aside = report.set_aside(|v| matches!(v, Violation::Lost { .. }));
    let judged = aside
        .iter()
        .filter(|v| matches!(v, Violation::Lost { entity, command_seq } if shown.contains(&(entity.as_str(), *command_seq))))
        .count();
    (judged, aside.len() - judged)
}

/// One progress line of a soak (`scripts/soak` reads it): `SOAK <file> <test> seed=<s> ...`.
pub fn soak_line(
    run: Run<'_>,
    took: Duration,
    figures: &Figures,
    injected: &[String],
    partitions: u32,
) -> String {
    let kinds: Vec<&str> = injected
        .iter()
        .filter_map(|f| f.split_whitespace().next())
        .collect();
    format!(
        "SOAK {} {} seed={} secs={:.1} commands={} unknown={} faults={} kinds={} takeovers={} timers={}/{}/{} orders={}/{}/{} keyed={} queries={} dead_letters={} violations={}",
        run.file,
        run.test,
        run.seed,
        took.as_secs_f64(),
        figures.commands,
        figures.unknown,
        figures.faults,
        if kinds.is_empty() {
            "-".to_owned()
        } else {
            kinds.join(",")
        },
        figures.fences.saturating_sub(partitions as usize),
        figures.timers.0,
        figures.timers.1,
        figures.timers.2,
        figures.orders.0,
        figures.orders.1,
        figures.orders.2,
        figures.keyed,
        figures.queries,
        figures.dead_letters,
        figures.violations
    )
}

/// The line that tells how to run one seed again.
pub fn replay_hint(test_file: &str, test: &str, seed: u64) -> String {
    format!(
        "replay: JETSHARD_SEED={seed} cargo test -p jetshard-tests --test {test_file} {test} -- --nocapture"
    )
}
