//! One schedule's world: the server (or the R3 cluster) with its client ([`Scenario`]), the
//! node processes, each connected through TCP proxies of its own, and the faults applied to
//! them; [`World::run_plan`] runs a seed's schedule under load from start to verdict.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use jetshard_testkit::TcpProxy;
use jetshard_testkit::history::History;
use jetshard_tests::Scenario;
use jetshard_tests::model::Op;

use super::{
    Fault, FeatureRun, Features, Figures, Load, NODES, Nodes, Run, Totals, kill_server,
    one_at_a_time, replay_hint, seeds, soak_line, start_journal_copy, verify, wait_journal_copied,
};

/// The one-server world's pin TTL and ack wait.
const SINGLE_PIN_TTL: Duration = Duration::from_millis(1000);
const SINGLE_ACK_WAIT: Duration = Duration::from_millis(3000);
/// The R3 world's: leader elections take seconds.
const CLUSTER_PIN_TTL: Duration = Duration::from_millis(1500);
const CLUSTER_ACK_WAIT: Duration = Duration::from_millis(5000);

/// The R3 world's background compaction interval (with every feature on): short, so that
/// sweeps run through every fault of a schedule.
const CLUSTER_COMPACTION: Duration = Duration::from_secs(2);

/// The pace of a world's load and how long its waits are bounded.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Entities of the load (half of them with every feature on).
    pub entities: usize,
    /// The pause between two commands of one entity.
    pub interval: Duration,
    /// How long an unconfirmed publish is sent again.
    pub give_up: Duration,
    /// How long the nodes may take to own every partition.
    pub owned_within: Duration,
    /// The load after the last fault.
    pub last_stretch: Duration,
    /// How long [`verify`] may wait for the consumers to drain.
    pub verify_within: Duration,
}

/// One schedule's world.
pub struct World {
    /// The server(s), client and timings.
    pub s: Scenario,
    /// Each slot's proxies, one per server: its node connects through them alone.
    pub proxies: Vec<Vec<TcpProxy>>,
    /// The node processes.
    pub nodes: Nodes,
    /// The test file (`chaos`, `cluster`), for messages.
    pub file: &'static str,
    /// The load's pace.
    pub pace: Pace,
    /// Whether the nodes compact the ledger's journal in the background.
    pub compacting: bool,
}

impl World {
    /// One server, [`NODES`] nodes each behind its own proxy. With `features`, the nodes also
    /// run the saga's `stock` entity type, and the journal has a mirror
    /// ([`super::JOURNAL_COPY`]).
    pub async fn single(partitions: u32, features: bool) -> World {
        let s = Scenario::single(partitions)
            .await
            .pin_ttl(SINGLE_PIN_TTL)
            .ack_wait(SINGLE_ACK_WAIT);
        let mut proxies = Vec::new();
        for _ in 0..NODES {
            proxies.push(vec![
                TcpProxy::start(s.server().addr()).await.expect("proxy"),
            ]);
        }
        let pace = Pace {
            entities: 12,
            // One command per entity every 40 ms: about 300 commands a second in all.
            interval: Duration::from_millis(40),
            give_up: Duration::from_secs(20),
            owned_within: Duration::from_secs(20),
            last_stretch: Duration::from_millis(500),
            verify_within: Duration::from_secs(90),
        };
        World::with_nodes(s, proxies, vec![], features, "chaos", pace, None).await
    }

    /// A 3-server cluster with R3 streams, [`NODES`] nodes: node `i` connects through three
    /// proxies of its own, to server `i` first, and ignores the servers the cluster
    /// advertises (so a cut at its proxies cuts it off). With `features`, as
    /// [`World::single`], and the owners compact the ledger's journal in the background every
    /// [`CLUSTER_COMPACTION`], as users run them: a sweep purges what is one interval old, so
    /// a leader election that holds the journal's mirror back longer than that lets purges
    /// outrun it, and what needs a purged record is judged by the entities' states
    /// ([`super::verify`]). [`Fault::Compact`] still waits for the mirror first.
    pub async fn cluster(partitions: u32, features: bool) -> World {
        let s = Scenario::cluster(partitions)
            .await
            .pin_ttl(CLUSTER_PIN_TTL)
            .ack_wait(CLUSTER_ACK_WAIT);
        let servers = s.cluster_servers().nodes();
        let mut proxies = Vec::new();
        for slot in 0..NODES {
            let mut own = Vec::new();
            for k in 0..servers.len() {
                let server = &servers[(slot + k) % servers.len()];
                own.push(TcpProxy::start(server.addr()).await.expect("proxy"));
            }
            proxies.push(own);
        }
        let mut args = s.node_options().args;
        args.extend(["--ignore-discovered".to_owned(), "on".to_owned()]);
        let pace = Pace {
            entities: 9,
            interval: Duration::from_millis(50),
            give_up: Duration::from_secs(40),
            owned_within: Duration::from_secs(30),
            last_stretch: Duration::from_millis(1000),
            verify_within: Duration::from_secs(120),
        };
        let compaction = features.then_some(CLUSTER_COMPACTION);
        World::with_nodes(s, proxies, args, features, "cluster", pace, compaction).await
    }

    async fn with_nodes(
        s: Scenario,
        proxies: Vec<Vec<TcpProxy>>,
        mut args: Vec<String>,
        features: bool,
        file: &'static str,
        pace: Pace,
        compaction: Option<Duration>,
    ) -> World {
        let interval = compaction.map(|c| c.as_millis().to_string());
        // Debug lines name each command's fate (`already applied`, acks), for failures.
        let mut env = vec![("RUST_LOG", "jetshard=debug")];
        if let Some(ms) = &interval {
            env.push(("JETSHARD_COMPACTION_MS", ms));
        }
        let spec = s.node_spec(&env);
        let urls = proxies
            .iter()
            .map(|own| own.iter().map(TcpProxy::url).collect::<Vec<_>>().join(","))
            .collect();
        if features {
            args.extend(["--stock".to_owned(), "on".to_owned()]);
        }
        let nodes = Nodes::start(urls, spec, args).await;
        if features {
            let replicas = if file == "cluster" { 3 } else { 1 };
            start_journal_copy(&s.js, replicas).await;
        }
        World {
            s,
            proxies,
            nodes,
            file,
            pace,
            compacting: compaction.is_some(),
        }
    }

    /// The slot a fault on `partition` hits: its owner's, or `fallback`.
    fn target(&mut self, partition: u32, fallback: usize) -> (usize, bool) {
        match self.nodes.owner_of(partition) {
            Some(slot) => (slot, true),
            None => (fallback, false),
        }
    }

    /// Applies a fault and undoes it; returns what happened, for the report (its first word
    /// the fault's kind, which `scripts/soak` counts).
    pub async fn inject(&mut self, fault: &Fault) -> String {
        match *fault {
            Fault::Kill {
                partition,
                fallback,
                restart_after,
            } => {
                let (slot, owner) = self.target(partition, fallback);
                self.nodes.kill(slot).await;
                // Part of the fault: the slot stays empty this long.
                tokio::time::sleep(restart_after).await;
                self.nodes.restart(slot).await;
                format!(
                    "kill slot {slot} (owner of p{partition}: {owner}), restarted after {restart_after:?}"
                )
            }
            Fault::Freeze {
                partition,
                fallback,
                hold,
            } => {
                let (slot, owner) = self.target(partition, fallback);
                if self.nodes.live(slot).is_none() {
                    return format!("freeze slot {slot}: not running, skipped");
                }
                self.nodes.pause(slot);
                // Part of the fault: frozen past the pin TTL.
                tokio::time::sleep(hold).await;
                self.nodes.resume(slot);
                format!("freeze slot {slot} (owner of p{partition}: {owner}) for {hold:?}")
            }
            Fault::ServerRestart { crash, down } => {
                if crash {
                    self.s.server().kill().expect("kill server");
                } else {
                    self.s.server().stop().await.expect("stop server");
                }
                // Part of the fault: the server stays down this long.
                tokio::time::sleep(down).await;
                self.s.server().restart().await.expect("restart server");
                let how = if crash { "SIGKILL" } else { "SIGTERM" };
                format!("server-restart ({how}), down {down:?}")
            }
            Fault::ServerKill {
                victim,
                partition,
                down,
            } => {
                let cluster = self.s.cluster_servers();
                kill_server(
                    &self.s.js,
                    cluster,
                    &mut self.nodes,
                    victim,
                    partition,
                    down,
                )
                .await
            }
            Fault::Cut {
                partition,
                fallback,
                hold,
            }
            | Fault::Blip {
                partition,
                fallback,
                hold,
            }
            | Fault::Stall {
                partition,
                fallback,
                hold,
            } => {
                let (break_it, what): (fn(&TcpProxy), &str) = match fault {
                    Fault::Cut { .. } => (TcpProxy::cut, "cut"),
                    // A short drop, under the pin TTL.
                    Fault::Blip { .. } => (TcpProxy::cut, "blip"),
                    _ => (TcpProxy::stall, "stall"),
                };
                self.at_proxy(partition, fallback, hold, break_it, what)
                    .await
            }
            Fault::Terminate {
                partition,
                fallback,
                restart_after,
            } => {
                let (slot, owner) = self.target(partition, fallback);
                let started = Instant::now();
                self.nodes.terminate(slot).await;
                let took = started.elapsed();
                // Part of the fault: the slot stays empty this long.
                tokio::time::sleep(restart_after).await;
                self.nodes.restart(slot).await;
                format!(
                    "terminate slot {slot} (owner of p{partition}: {owner}), exited in {took:?}, restarted after {restart_after:?}"
                )
            }
            Fault::Compact => {
                // What the compaction is about to purge must be in the mirror first.
                if let Err(e) = wait_journal_copied(&self.s.js, Duration::from_secs(20)).await {
                    return format!("compact skipped: {e}");
                }
                let admin = jetshard::admin::Admin::new(self.s.client.clone(), "ledger");
                match tokio::time::timeout(Duration::from_secs(30), admin.compact(None)).await {
                    Ok(Ok(done)) => format!(
                        "compact ({} snapshots, {} records purged)",
                        done.snapshots, done.purged
                    ),
                    Ok(Err(e)) => format!("compact failed: {e}"),
                    Err(_) => "compact timed out".to_owned(),
                }
            }
            Fault::RollingRestart => {
                let mut took = Vec::new();
                for slot in 0..self.nodes.slots.len() {
                    let started = Instant::now();
                    self.nodes.terminate(slot).await;
                    took.push(started.elapsed());
                    self.nodes.restart(slot).await;
                }
                format!("rolling-restart of every node, each exited in {took:?}")
            }
        }
    }

    /// Breaks the connections of the owner of `partition` (or of slot `fallback`) at its
    /// proxies with `fault` (cut or stall) for `hold`, then heals them; returns what happened.
    async fn at_proxy(
        &mut self,
        partition: u32,
        fallback: usize,
        hold: Duration,
        fault: fn(&TcpProxy),
        what: &str,
    ) -> String {
        let (slot, owner) = self.target(partition, fallback);
        self.proxies[slot].iter().for_each(fault);
        // Part of the fault: the node's traffic is dropped or held this long.
        tokio::time::sleep(hold).await;
        self.proxies[slot].iter().for_each(TcpProxy::heal);
        format!("{what} slot {slot} (owner of p{partition}: {owner}) for {hold:?}")
    }

    /// Undoes whatever is still broken: proxies healed, nodes thawed or started again.
    pub async fn recover(&mut self) {
        self.proxies.iter().flatten().for_each(TcpProxy::heal);
        self.nodes.recover().await;
    }

    /// Ends a schedule: [`verify`] (panics with everything needed to debug a failure), with
    /// the checks of every feature when `features` ran.
    pub async fn verify(
        &mut self,
        test: &str,
        seed: u64,
        history: &History<Op>,
        injected: &[String],
        retries: u64,
        features: Option<FeatureRun>,
    ) -> Figures {
        // A restart of a single server (SIGKILL) has been seen to leave acknowledged commands in
        // the work-queue stream while every consumer's ack floor is past them (as a clustered
        // stream does after leader changes): judge by the consumers, and report what is left.
        let run = Run {
            file: self.file,
            test,
            seed,
        };
        let (figures, left) = verify(
            &self.s.js,
            &self.nodes,
            run,
            history,
            injected,
            retries,
            self.pace.verify_within,
            features,
        )
        .await;
        if left > 0 {
            eprintln!("seed {seed}: the command stream keeps {left} acknowledged commands");
        }
        figures
    }

    /// Runs one seed's `plan` under load (and every feature's traffic with `features`), then
    /// judges it ([`World::verify`]) and prints its soak line (its time counted from
    /// `started`); returns its figures and what was injected.
    pub async fn run_plan(
        mut self,
        run: Run<'_>,
        plan: &[(Duration, Fault)],
        features: bool,
        started: Instant,
    ) -> (Figures, Vec<String>) {
        let Run { test, seed, .. } = run;
        let partitions = self.nodes.spec().partitions;
        let pace = self.pace;
        let count = if features {
            pace.entities / 2
        } else {
            pace.entities
        };
        let prefix = if self.file == "cluster" { "c" } else { "s" };
        let entities: Vec<String> = (0..count).map(|e| format!("{prefix}{seed}-e{e}")).collect();
        let load = Load::start(
            self.s.client.clone(),
            partitions,
            &entities,
            pace.interval,
            pace.give_up,
        );
        let traffic =
            features.then(|| Features::start(self.s.client.clone(), seed, partitions, &entities));
        if let Err(e) = self
            .nodes
            .wait_all_owned(partitions, pace.owned_within)
            .await
        {
            panic!("{test} seed {seed}: {e}\n{}", self.nodes.describe());
        }
        let mut injected = Vec::new();
        for (pause, fault) in plan {
            // The schedule's own timing: load runs undisturbed for this long.
            tokio::time::sleep(*pause).await;
            injected.push(self.inject(fault).await);
        }
        // The schedule's own timing: a last stretch of load after the faults.
        tokio::time::sleep(pace.last_stretch).await;
        self.recover().await;
        let mut retries = load.retries.load(Ordering::Relaxed);
        let history = load.finish().await;
        let feature_run = match traffic {
            Some(traffic) => {
                retries += traffic.retries.load(Ordering::Relaxed);
                let mut run = traffic.finish().await;
                run.compacting = self.compacting;
                Some(run)
            }
            None => None,
        };
        let figures = self
            .verify(test, seed, &history, &injected, retries, feature_run)
            .await;
        eprintln!(
            "{test}: seed {seed} passed in {:.1?}: {figures:?}",
            started.elapsed()
        );
        eprintln!(
            "{}",
            soak_line(run, started.elapsed(), &figures, &injected, partitions)
        );
        (figures, injected)
    }
}

/// Runs a test's seeds (`seeds(base, default_seeds)`), one at a time: `start` gives each seed's
/// plan and world, [`World::run_plan`] runs it; prints the totals at the end.
pub async fn run_seeds<F, Fut>(
    file: &'static str,
    test: &str,
    (base, default_seeds): (u64, u64),
    features: bool,
    mut start: F,
) where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = (Vec<(Duration, Fault)>, World)>,
{
    jetshard_tests::init_tracing();
    let _one = one_at_a_time().await;
    let mut totals = Totals::default();
    for seed in seeds(base, default_seeds) {
        let started = Instant::now();
        eprintln!("{test}: seed {seed} ({})", replay_hint(file, test, seed));
        // `scripts/soak --self-test`: this seed fails, as a violation would.
        if std::env::var("JETSHARD_SOAK_FAIL_SEED").is_ok_and(|s| s == seed.to_string()) {
            panic!(
                "{test} seed {seed} failed (JETSHARD_SOAK_FAIL_SEED)\n{}",
                replay_hint(file, test, seed)
            );
        }
        let (plan, world) = start(seed).await;
        let run = Run { file, test, seed };
        let (figures, injected) = world.run_plan(run, &plan, features, started).await;
        totals.add(&figures, &injected);
    }
    eprintln!("{}", totals.line(test));
}
