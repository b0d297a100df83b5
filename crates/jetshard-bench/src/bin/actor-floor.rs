//! `actor-floor`: what one message costs a round robin over N live actors, by kind of actor, with
//! no NATS at all: the floor the actors alone set under jetshard's warm pass.
//!
//! One driver (like an owner) sends messages round-robin, one per entity in turn, keeping
//! `--window` in flight; each entity updates its state and answers the driver (like an outcome);
//! each answer lets the driver send the next message. Four kinds of entity, alternated round by
//! round in one process (a shared machine: compare within the run):
//! - `ractor`: one ractor actor per entity, linked to the driver (itself a ractor actor), as
//!   jetshard's entity actors are to their owner; answers through a callback casting to the
//!   driver, as `EntityContext::report` does;
//! - `ractor-owned`: the same, with the driver keeping what jetshard's owner keeps per entity
//!   (a table keyed by `Arc<str>` ids, each slot with its queue of commands in hand);
//! - `tokio`: one tokio task and one unbounded `tokio::sync::mpsc` channel per entity, the
//!   driver a task with one channel;
//! - `map`: no tasks: the driver's loop updates a `HashMap<id, State>` in place.
//!
//! Printed per kind and N: wall ns and CPU ns (user + system, `getrusage`) per message,
//! allocations per message, and the ratio of each N's CPU to the smallest N's.
//!
//! `cargo build --release -p jetshard-bench --bin actor-floor &&
//! target/release/actor-floor --entities 500,2000,10000 --messages 200000 --rounds 3`

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::Parser;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{mpsc, oneshot};

/// Counts allocations per message.
#[global_allocator]
static ALLOCATOR: jetshard_bench::allocs::Counting = jetshard_bench::allocs::Counting;

#[derive(Parser, Debug)]
struct Cli {
    /// Entity counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "500,2000,10000")]
    entities: Vec<usize>,
    /// Messages per measurement (after one warm-up pass over every entity).
    #[arg(long, default_value_t = 200_000)]
    messages: usize,
    /// Messages in flight.
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Rounds (each runs every kind at every N, kinds alternated).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Kinds to run, comma-separated (ractor, ractor-owned, tokio, map).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ractor,ractor-owned,tokio,map"
    )]
    kinds: Vec<String>,
    /// Each entity awaits a round trip through one shared "writer" task before it answers (as
    /// an entity actor awaits its journal write's answer): two polls of its task per message.
    #[arg(long)]
    write_hop: bool,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
}

/// A command, as an entity actor gets one (a sequence and a payload).
struct Cmd {
    seq: u64,
    payload: bytes::Bytes,
}

/// The shared writer task's inbox: each request is answered at once (`--write-hop`).
type Writer = mpsc::UnboundedSender<oneshot::Sender<()>>;

/// Starts the shared writer task, if `--write-hop`.
fn writer(cli: &Cli) -> Option<Writer> {
    if !cli.write_hop {
        return None;
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    tokio::spawn(async move {
        while let Some(answer) = rx.recv().await {
            let _ = answer.send(());
        }
    });
    Some(tx)
}

/// One round trip through the writer, if there is one.
async fn write(writer: Option<&Writer>) {
    if let Some(writer) = writer {
        let (tx, rx) = oneshot::channel();
        if writer.send(tx).is_ok() {
            let _ = rx.await;
        }
    }
}

/// The answer, as an outcome (the entity's id and the command's sequence).
struct Done {
    entity: u32,
    seq: u64,
}

/// An entity's state: what it counts, and where it reports.
struct EntityState {
    id: u32,
    writer: Option<Writer>,
    applied: u64,
    sum: u64,
    report: Arc<dyn Fn(Done) + Send + Sync>,
}

struct EntityActor;

impl Actor for EntityActor {
    type Msg = Cmd;
    type State = EntityState;
    type Arguments = EntityState;

    async fn pre_start(
        &self,
        _: ActorRef<Cmd>,
        state: EntityState,
    ) -> Result<EntityState, ActorProcessingErr> {
        Ok(state)
    }

    async fn handle(
        &self,
        _: ActorRef<Cmd>,
        cmd: Cmd,
        state: &mut EntityState,
    ) -> Result<(), ActorProcessingErr> {
        write(state.writer.as_ref()).await;
        state.applied += 1;
        state.sum = state.sum.wrapping_add(cmd.seq ^ cmd.payload.len() as u64);
        (state.report)(Done {
            entity: state.id,
            seq: cmd.seq,
        });
        Ok(())
    }
}

/// What jetshard's owner holds per entity, in miniature: its actor and its commands in hand.
struct Slot {
    actor: ActorRef<Cmd>,
    queue: VecDeque<u64>,
}

/// Where the driver finds an entity's actor.
enum Table {
    /// By index: the least a driver can keep.
    Plain(Vec<ActorRef<Cmd>>),
    /// As jetshard's owner keeps them: `Arc<str>` ids hashed, a slot with a queue each.
    Owned {
        ids: Vec<Arc<str>>,
        slots: HashMap<Arc<str>, Slot>,
    },
}

enum DriverMsg {
    /// Where the entities are (before the first `Run`).
    Table(Table),
    Run {
        messages: usize,
        done: oneshot::Sender<()>,
    },
    Done(Done),
}

struct Driver;

struct DriverState {
    table: Table,
    next: u64,
    sent: usize,
    answered: usize,
    target: usize,
    window: usize,
    payload: bytes::Bytes,
    done: Option<oneshot::Sender<()>>,
}

impl DriverState {
    fn send_next(&mut self) {
        let seq = self.next;
        self.next += 1;
        self.sent += 1;
        let cmd = Cmd {
            seq,
            payload: self.payload.clone(),
        };
        match &mut self.table {
            Table::Plain(actors) => {
                let _ = actors[seq as usize % actors.len()].cast(cmd);
            }
            Table::Owned { ids, slots } => {
                let id = &ids[seq as usize % ids.len()];
                if let Some(slot) = slots.get_mut(&**id) {
                    slot.queue.push_back(seq);
                    let _ = slot.actor.cast(cmd);
                }
            }
        }
    }
}

impl Actor for Driver {
    type Msg = DriverMsg;
    type State = DriverState;
    type Arguments = DriverState;

    async fn pre_start(
        &self,
        _: ActorRef<DriverMsg>,
        state: DriverState,
    ) -> Result<DriverState, ActorProcessingErr> {
        Ok(state)
    }

    async fn handle(
        &self,
        _: ActorRef<DriverMsg>,
        message: DriverMsg,
        state: &mut DriverState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            DriverMsg::Table(table) => state.table = table,
            DriverMsg::Run { messages, done } => {
                state.target = messages;
                state.sent = 0;
                state.answered = 0;
                state.done = Some(done);
                while state.sent < state.window.min(state.target) {
                    state.send_next();
                }
            }
            DriverMsg::Done(done) => {
                if let Table::Owned { ids, slots } = &mut state.table {
                    let id = &ids[done.entity as usize];
                    if let Some(slot) = slots.get_mut(&**id)
                        && let Some(at) = slot.queue.iter().position(|s| *s == done.seq)
                    {
                        slot.queue.remove(at);
                    }
                }
                state.answered += 1;
                if state.sent < state.target {
                    state.send_next();
                } else if state.answered == state.target
                    && let Some(done) = state.done.take()
                {
                    let _ = done.send(());
                }
            }
        }
        Ok(())
    }
}

/// One measurement: CPU (user + system) and wall time and allocations over `messages`.
struct Measured {
    wall_ns: f64,
    cpu_ns: f64,
    allocs: f64,
}

fn measure(messages: usize, started: (Instant, jetshard_bench::kernel::Kernel, u64)) -> Measured {
    let (at, kernel, allocs) = started;
    let wall = at.elapsed();
    let spent = jetshard_bench::kernel::now().since(kernel);
    let allocs_now = jetshard_bench::allocs::now().allocs;
    let n = messages as f64;
    Measured {
        wall_ns: wall.as_nanos() as f64 / n,
        cpu_ns: (spent.user_us + spent.system_us) as f64 * 1000.0 / n,
        allocs: allocs_now.saturating_sub(allocs) as f64 / n,
    }
}

fn start() -> (Instant, jetshard_bench::kernel::Kernel, u64) {
    (
        Instant::now(),
        jetshard_bench::kernel::now(),
        jetshard_bench::allocs::now().allocs,
    )
}

async fn run_ractor(n: usize, cli: &Cli, owned: bool) -> anyhow::Result<Measured> {
    let payload = bytes::Bytes::from_static(&[7u8; 64]);
    let (driver, driver_task) = Actor::spawn(
        None,
        Driver,
        DriverState {
            table: Table::Plain(Vec::new()),
            next: 0,
            sent: 0,
            answered: 0,
            target: 0,
            window: cli.window,
            payload,
            done: None,
        },
    )
    .await
    .context("spawn the driver")?;
    let report: Arc<dyn Fn(Done) + Send + Sync> = {
        let driver = driver.clone();
        Arc::new(move |done| {
            let _ = driver.cast(DriverMsg::Done(done));
        })
    };
    let mut actors = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    let writer = writer(cli);
    for id in 0..n {
        let state = EntityState {
            id: id as u32,
            writer: writer.clone(),
            applied: 0,
            sum: 0,
            report: Arc::clone(&report),
        };
        let (actor, task) = Actor::spawn_linked(None, EntityActor, state, driver.get_cell())
            .await
            .context("spawn an entity actor")?;
        actors.push(actor);
        tasks.push(task);
    }
    let table = if owned {
        let ids: Vec<Arc<str>> = (0..n).map(|i| Arc::from(format!("e{i}"))).collect();
        let slots = ids
            .iter()
            .zip(&actors)
            .map(|(id, actor)| {
                let slot = Slot {
                    actor: actor.clone(),
                    queue: VecDeque::new(),
                };
                (Arc::clone(id), slot)
            })
            .collect();
        Table::Owned { ids, slots }
    } else {
        Table::Plain(actors.clone())
    };
    driver
        .cast(DriverMsg::Table(table))
        .map_err(|_| anyhow::anyhow!("the driver stopped"))?;
    // Warm: every entity once (the slots' queues allocated, every actor run once).
    run_driver(&driver, n).await?;
    let started = start();
    run_driver(&driver, cli.messages).await?;
    let measured = measure(cli.messages, started);
    driver.stop(None);
    let _ = driver_task.await;
    for task in tasks {
        let _ = task.await;
    }
    Ok(measured)
}

async fn run_driver(driver: &ActorRef<DriverMsg>, messages: usize) -> anyhow::Result<()> {
    let (tx, rx) = oneshot::channel();
    driver
        .cast(DriverMsg::Run { messages, done: tx })
        .map_err(|_| anyhow::anyhow!("the driver stopped"))?;
    rx.await.context("the driver's run")?;
    Ok(())
}

async fn run_tokio(n: usize, cli: &Cli) -> anyhow::Result<Measured> {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut senders = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    let writer = writer(cli);
    for id in 0..n {
        let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
        let done_tx = done_tx.clone();
        let writer = writer.clone();
        let mut state = (0u64, 0u64);
        tasks.push(tokio::spawn(async move {
            while let Some(cmd) = rx.recv().await {
                write(writer.as_ref()).await;
                state.0 += 1;
                state.1 = state.1.wrapping_add(cmd.seq ^ cmd.payload.len() as u64);
                let _ = done_tx.send(Done {
                    entity: id as u32,
                    seq: cmd.seq,
                });
            }
            std::hint::black_box(state);
        }));
        senders.push(tx);
    }
    drop(done_tx);
    let payload = bytes::Bytes::from_static(&[7u8; 64]);
    let (cmd_tx, mut cmd_rx) = mpsc::unbounded_channel::<(usize, oneshot::Sender<()>)>();
    let window = cli.window;
    let driver = tokio::spawn(async move {
        let mut next = 0u64;
        while let Some((messages, done)) = cmd_rx.recv().await {
            let mut sent = 0;
            let mut answered = 0;
            while sent < window.min(messages) {
                let cmd = Cmd {
                    seq: next,
                    payload: payload.clone(),
                };
                let _ = senders[next as usize % senders.len()].send(cmd);
                next += 1;
                sent += 1;
            }
            while answered < messages {
                let Some(_) = done_rx.recv().await else {
                    return;
                };
                answered += 1;
                if sent < messages {
                    let cmd = Cmd {
                        seq: next,
                        payload: payload.clone(),
                    };
                    let _ = senders[next as usize % senders.len()].send(cmd);
                    next += 1;
                    sent += 1;
                }
            }
            let _ = done.send(());
        }
    });
    let run = |messages: usize| {
        let (tx, rx) = oneshot::channel();
        let sent = cmd_tx.send((messages, tx));
        async move {
            sent.map_err(|_| anyhow::anyhow!("the driver stopped"))?;
            rx.await.context("the driver's run")
        }
    };
    run(n).await?;
    let started = start();
    run(cli.messages).await?;
    let measured = measure(cli.messages, started);
    drop(cmd_tx);
    let _ = driver.await;
    for task in tasks {
        let _ = task.await;
    }
    Ok(measured)
}

fn run_map(n: usize, cli: &Cli) -> Measured {
    let mut states: HashMap<u32, (u64, u64)> = (0..n as u32).map(|i| (i, (0, 0))).collect();
    let payload = bytes::Bytes::from_static(&[7u8; 64]);
    let mut pass = |messages: usize, next: &mut u64| {
        for _ in 0..messages {
            let cmd = Cmd {
                seq: *next,
                payload: payload.clone(),
            };
            *next += 1;
            let id = (cmd.seq % n as u64) as u32;
            if let Some(state) = states.get_mut(&id) {
                state.0 += 1;
                state.1 = state.1.wrapping_add(cmd.seq ^ cmd.payload.len() as u64);
            }
            std::hint::black_box(Done {
                entity: id,
                seq: cmd.seq,
            });
        }
    };
    let mut next = 0;
    pass(n, &mut next);
    let started = start();
    pass(cli.messages, &mut next);
    measure(cli.messages, started)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.workers)
        .enable_all()
        .build()
        .context("build the runtime")?;
    let mut results: HashMap<(String, usize), Vec<Measured>> = HashMap::new();
    for round in 0..cli.rounds {
        for &n in &cli.entities {
            for kind in &cli.kinds {
                let measured = match kind.as_str() {
                    "ractor" => runtime.block_on(run_ractor(n, &cli, false))?,
                    "ractor-owned" => runtime.block_on(run_ractor(n, &cli, true))?,
                    "tokio" => runtime.block_on(run_tokio(n, &cli))?,
                    "map" => run_map(n, &cli),
                    other => anyhow::bail!("unknown kind {other}"),
                };
                println!(
                    "round {} {kind:>12} N={n:>6}: wall {:>7.0} ns/msg, CPU {:>7.0} ns/msg, {:.2} allocs/msg",
                    round + 1,
                    measured.wall_ns,
                    measured.cpu_ns,
                    measured.allocs
                );
                results.entry((kind.clone(), n)).or_default().push(measured);
            }
        }
    }
    println!(
        "\nmedians of {} rounds ({} messages each, window {}, {} workers{}):",
        cli.rounds,
        cli.messages,
        cli.window,
        cli.workers,
        if cli.write_hop { ", write hop" } else { "" }
    );
    println!("| kind | N | wall ns/msg | CPU ns/msg | CPU against the smallest N | allocs/msg |");
    println!("|---|---|---|---|---|---|");
    for kind in &cli.kinds {
        let smallest = cli.entities.iter().min().copied().unwrap_or(0);
        let base = median(
            results
                .get(&(kind.clone(), smallest))
                .map(|m| m.iter().map(|m| m.cpu_ns).collect())
                .unwrap_or_else(|| vec![f64::NAN]),
        );
        for &n in &cli.entities {
            let Some(m) = results.get(&(kind.clone(), n)) else {
                continue;
            };
            let cpu = median(m.iter().map(|m| m.cpu_ns).collect());
            println!(
                "| {kind} | {n} | {:.0} | {:.0} | {:.2}x | {:.2} |",
                median(m.iter().map(|m| m.wall_ns).collect()),
                cpu,
                cpu / base,
                median(m.iter().map(|m| m.allocs).collect()),
            );
        }
    }
    Ok(())
}
