//! `load`: publishes a realistic mix of commands for many orders.
//!
//! Each order follows a script drawn from a deterministic generator (same seed, same scripts):
//! mostly complete flows (`Place`, `AddItem`s, `Pay`, `Ship`), some cancelled or abandoned
//! orders, some flows that break a rule (and so leave `Rejected` events), and a few bodies that
//! are not commands at all (published raw; jetshard dead-letters them).
//!
//! An order's commands are published one after the other, each only after the stream has
//! confirmed the previous one, so they are stored in script order; many orders are in flight at
//! once. An optional rate caps the commands per second over all orders.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::Client;
use futures::StreamExt;
use indicatif::ProgressBar;
use jetshard::CommandSender;
use tokio::sync::Mutex;
use tokio::time::MissedTickBehavior;

use crate::order::{self, ENTITY_TYPE, Order, OrderCommand};

/// What to publish.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// How many orders.
    pub orders: u32,
    /// Commands per second over all orders; `None` for as fast as the server confirms them.
    pub rate: Option<u32>,
    /// Orders in flight at once.
    pub concurrency: usize,
    /// Seed of the script generator.
    pub seed: u64,
    /// Order ids are `<prefix>-<n>`.
    pub prefix: String,
}

/// What was published.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// Orders whose scripts were run.
    pub orders: u32,
    /// Commands the stream confirmed (malformed bodies included).
    pub published: u64,
    /// Of those, bodies that are not commands.
    pub malformed: u64,
    /// Publishes the stream did not confirm; the rest of that order's script was skipped.
    pub failed: u64,
    /// Script steps not sent because an earlier publish of their order failed.
    pub skipped: u64,
    /// How long it took.
    pub elapsed: Duration,
}

/// One step of an order's script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A command, encoded with the entity's codec.
    Command(OrderCommand),
    /// A body that is not a valid command, published as is.
    Raw(&'static str),
}

/// Bodies that do not decode as an order command.
const MALFORMED: [&str; 4] = [
    "this is not json",
    r#"{"type":"Teleport","to":"moon"}"#,
    r#"{"type":"AddItem","sku":"sku-1"}"#,
    r#"{"type":"AddItem","sku":"sku-1","qty":-2,"price_cents":100}"#,
];

/// SplitMix64: a small deterministic generator, enough for picking scripts.
#[derive(Debug, Clone)]
pub struct Scripts {
    state: u64,
}

impl Scripts {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn items(&mut self, steps: &mut Vec<Step>, max: u64) -> u64 {
        let mut total = 0;
        for _ in 0..1 + self.below(max) {
            let qty = 1 + self.below(3) as u32;
            let price_cents = 100 * (1 + self.below(50));
            total += u64::from(qty) * price_cents;
            steps.push(Step::Command(OrderCommand::AddItem {
                sku: format!("sku-{}", self.below(500)),
                qty,
                price_cents,
            }));
        }
        total
    }

    /// The next order's script.
    pub fn script(&mut self) -> Vec<Step> {
        use OrderCommand as C;
        let mut steps = vec![Step::Command(C::Place {
            customer: format!("c-{}", self.below(1000)),
        })];
        let roll = self.below(100);
        match roll {
            // A complete order.
            0..60 => {
                let total = self.items(&mut steps, 4);
                steps.push(Step::Command(C::Pay {
                    amount_cents: total,
                }));
                steps.push(Step::Command(C::Ship));
            }
            // Cancelled before or after payment.
            60..72 => {
                let total = self.items(&mut steps, 2);
                if self.below(2) == 0 {
                    steps.push(Step::Command(C::Pay {
                        amount_cents: total,
                    }));
                }
                steps.push(Step::Command(C::Cancel));
            }
            // Abandoned: never paid.
            72..80 => {
                self.items(&mut steps, 3);
            }
            // Flows that break a rule somewhere: each leaves at least one Rejected event.
            80..95 => match self.below(6) {
                0 => {
                    let total = self.items(&mut steps, 2);
                    steps.push(Step::Command(C::Pay {
                        amount_cents: total + 1,
                    }));
                    steps.push(Step::Command(C::Pay {
                        amount_cents: total,
                    }));
                    steps.push(Step::Command(C::Ship));
                }
                1 => {
                    let total = self.items(&mut steps, 2);
                    steps.push(Step::Command(C::Ship));
                    steps.push(Step::Command(C::Pay {
                        amount_cents: total,
                    }));
                    steps.push(Step::Command(C::Ship));
                }
                2 => {
                    steps.push(Step::Command(C::AddItem {
                        sku: "sku-0".into(),
                        qty: 0,
                        price_cents: 100,
                    }));
                    steps.push(Step::Command(C::Pay { amount_cents: 0 }));
                }
                3 => {
                    steps.push(steps[0].clone());
                    let total = self.items(&mut steps, 1);
                    steps.push(Step::Command(C::Pay {
                        amount_cents: total,
                    }));
                    steps.push(Step::Command(C::Ship));
                    steps.push(Step::Command(C::Cancel));
                }
                4 => {
                    let total = self.items(&mut steps, 2);
                    steps.push(Step::Command(C::Pay {
                        amount_cents: total,
                    }));
                    self.items(&mut steps, 1);
                    steps.push(Step::Command(C::Ship));
                    steps.push(Step::Command(C::Ship));
                }
                _ => {
                    // Commands before the order exists.
                    steps.insert(0, Step::Command(C::Ship));
                    steps.insert(0, Step::Command(C::Cancel));
                    self.items(&mut steps, 2);
                    steps.push(Step::Command(C::Cancel));
                }
            },
            // A body that is not a command, in the middle of an otherwise good flow.
            _ => {
                let total = self.items(&mut steps, 2);
                let bad = MALFORMED[self.below(MALFORMED.len() as u64) as usize];
                steps.push(Step::Raw(bad));
                steps.push(Step::Command(C::Pay {
                    amount_cents: total,
                }));
                steps.push(Step::Command(C::Ship));
            }
        }
        steps
    }
}

/// The scripts of `orders` orders from `seed`, with their ids.
pub fn plan(prefix: &str, orders: u32, seed: u64) -> Vec<(String, Vec<Step>)> {
    let mut scripts = Scripts::new(seed);
    (0..orders)
        .map(|n| (format!("{prefix}-{n}"), scripts.script()))
        .collect()
}

/// A prefix for order ids that differs between runs: `o<unix ms in base 36>`.
pub fn run_prefix() -> String {
    let mut ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut token = Vec::new();
    while ms > 0 {
        token.push(digits[(ms % 36) as usize]);
        ms /= 36;
    }
    token.reverse();
    format!("o{}", String::from_utf8_lossy(&token))
}

#[derive(Default)]
struct Counters {
    published: AtomicU64,
    malformed: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
}

/// Publishes the scripts of [`plan`] and advances `progress` by one per confirmed command.
///
/// # Errors
/// If the command stream does not exist (no node has run yet) or the server cannot be reached.
/// Publishes that fail later are counted in [`LoadReport::failed`], not returned.
pub async fn run(
    client: Client,
    options: &LoadOptions,
    progress: &ProgressBar,
) -> anyhow::Result<LoadReport> {
    let js = async_nats::jetstream::new(client.clone());
    crate::order::require_streams(&js).await?;
    let config = order::shard_config()
        .build()
        .context("order shard config")?;
    let sender = CommandSender::<Order>::new(client, &config);
    let scripts = plan(&options.prefix, options.orders, options.seed);
    let steps: usize = scripts.iter().map(|(_, s)| s.len()).sum();
    progress.set_length(steps as u64);

    let pace = options.rate.filter(|r| *r > 0).map(|rate| {
        let mut interval = tokio::time::interval(Duration::from_secs(1) / rate);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Arc::new(Mutex::new(interval))
    });
    let counters = Counters::default();
    let started = Instant::now();
    futures::stream::iter(scripts)
        .for_each_concurrent(options.concurrency.max(1), |(id, script)| {
            let (sender, js, pace, counters) = (&sender, &js, pace.clone(), &counters);
            async move {
                let total = script.len() as u64;
                for (done, step) in script.into_iter().enumerate() {
                    if let Some(pace) = &pace {
                        pace.lock().await.tick().await;
                    }
                    let sent = publish(sender, js, &id, &step).await;
                    if let Err(e) = sent {
                        tracing::warn!(order = %id, error = %e, "publish not confirmed; skipping the rest of this order");
                        counters.failed.fetch_add(1, Ordering::Relaxed);
                        counters
                            .skipped
                            .fetch_add(total - done as u64 - 1, Ordering::Relaxed);
                        progress.inc(total - done as u64);
                        return;
                    }
                    counters.published.fetch_add(1, Ordering::Relaxed);
                    if matches!(step, Step::Raw(_)) {
                        counters.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                    progress.inc(1);
                }
            }
        })
        .await;
    Ok(LoadReport {
        orders: options.orders,
        published: counters.published.into_inner(),
        malformed: counters.malformed.into_inner(),
        failed: counters.failed.into_inner(),
        skipped: counters.skipped.into_inner(),
        elapsed: started.elapsed(),
    })
}

async fn publish(
    sender: &CommandSender<Order>,
    js: &async_nats::jetstream::Context,
    id: &str,
    step: &Step,
) -> anyhow::Result<u64> {
    match step {
        Step::Command(command) => Ok(sender.send(id, command).await?),
        Step::Raw(body) => {
            // What any client could publish: jetshard must cope with it.
            let ack = js
                .publish(
                    format!("{ENTITY_TYPE}.cmd.{id}"),
                    body.as_bytes().to_vec().into(),
                )
                .await?
                .await?;
            Ok(ack.sequence)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::order::{OrderEvent, run as run_rules};

    #[test]
    fn the_same_seed_gives_the_same_scripts() {
        assert_eq!(plan("o", 50, 7), plan("o", 50, 7));
        assert_ne!(plan("o", 50, 7), plan("o", 50, 8));
    }

    #[test]
    fn the_mix_is_mostly_valid_with_some_rejections_and_a_few_malformed_bodies() {
        let scripts = plan("o", 1000, 42);
        let (mut commands, mut malformed, mut rejected, mut shipped) = (0, 0, 0, 0);
        for (_, script) in &scripts {
            let valid = script.iter().filter_map(|s| match s {
                Step::Command(c) => Some(c.clone()),
                Step::Raw(_) => None,
            });
            let (events, _) = run_rules(valid);
            commands += script.len();
            malformed += script.iter().filter(|s| matches!(s, Step::Raw(_))).count();
            rejected += events
                .iter()
                .filter(|e| matches!(e, OrderEvent::Rejected { .. }))
                .count();
            shipped += events
                .iter()
                .filter(|e| matches!(e, OrderEvent::Shipped))
                .count();
        }
        assert!(shipped > 500, "{shipped} of 1000 shipped");
        assert!(rejected > 100 && rejected < commands / 5, "{rejected}");
        assert!(malformed > 20 && malformed < 100, "{malformed}");
        for body in MALFORMED {
            assert!(
                jetshard::Codec::Json
                    .decode::<OrderCommand>(body.as_bytes())
                    .is_err()
            );
        }
    }

    #[test]
    fn run_prefixes_are_valid_ids() {
        let id = format!("{}-1", run_prefix());
        assert!(jetshard::EntityId::new(&id).is_ok(), "{id}");
    }
}
