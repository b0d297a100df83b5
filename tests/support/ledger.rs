//! `Ledger`: the test entity. Each entity is a list of numbers that must be appended in order
//! (`Append { n }` is accepted only when `n` equals the list's length), so a lost, reordered or
//! doubled command shows as a rejection or a gap.

use jetshard::{Codec, CodecError, Effects, Entity, Snapshots};
use serde::{Deserialize, Serialize};

/// The test entity.
pub struct Ledger;

/// The mark of a fired timer's number in the state (`Fired { n }` adds `FIRED | n`), so that
/// an `Append`'s place counts appended numbers only.
pub const FIRED: u64 = 1 << 63;

/// The mark of a disarmed timer in the state (`Disarmed { name }` adds [`disarmed`]`(name)`).
pub const DISARMED: u64 = 1 << 62;

/// What disarming the timer `name` adds to the state: `DISARMED` and 32 bits of FNV-1a of the
/// name (a disarm names its timer, not its number).
pub fn disarmed(name: &str) -> u64 {
    let hash = name.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    DISARMED | u64::from(hash)
}

/// The numbers of `state` that commands appended (timers' marks left out).
pub fn appended(state: &[u64]) -> impl Iterator<Item = u64> + '_ {
    state
        .iter()
        .copied()
        .filter(|n| n & (FIRED | DISARMED) == 0)
}

/// Its commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum LedgerCmd {
    /// Append `n`; accepted when `n` is the next index.
    Append { n: u64 },
    /// Append `count` numbers from `from` at once (several events for one command).
    AppendMany { from: u64, count: u64 },
    /// Append `n` without checking the order, so a doubled command shows as two events.
    Push { n: u64 },
    /// Panics in `decide`, at every delivery.
    Panic,
    /// Always rejected.
    Refuse,
    /// Aborts the process in `decide`: a command that kills whoever runs it (as a stack
    /// overflow or an allocation failure would). Only for child node processes.
    Abort,
    /// Append `n` without checking the order, `decide` taking `ms` (a slow handler); it prints
    /// `DECIDING <n>` on stdout as it starts, so that a test sees a child node running it.
    Slow { n: u64, ms: u64 },
    /// Append `n` without checking the order, and through the outbox: send `Push { n }` to the
    /// ledger `to`, and publish `n` (JSON) to `sink.<n>`.
    Forward { n: u64, to: String },
    /// Arms the timer `name`: `Push { n }` to this ledger `after_ms` from now.
    Remind { name: String, n: u64, after_ms: u64 },
    /// Disarms the timer `name`.
    Forget { name: String },
    /// Arms the timer `name` (`Fire { name, n }` to this ledger `after_ms` from now) and
    /// records it: `Armed { name, n }`, so the history checker sees every timer set.
    Arm { name: String, n: u64, after_ms: u64 },
    /// Disarms the timer `name` and records it: `Disarmed { name }`.
    Disarm { name: String },
    /// What an `Arm` timer sends when it fires: `Fired { name, n }`.
    Fire { name: String, n: u64 },
    /// The first step of the saga: records `Ordered` and sends `StockCmd::Reserve` to the stock
    /// entity `stock` through the outbox; the stock answers `Settle` to `reply_to` (this ledger's
    /// own id: `decide` does not know it).
    Order {
        order: u64,
        stock: String,
        qty: u64,
        reply_to: String,
    },
    /// The saga's answer from the stock, through its outbox: `Settled { order, reserved }`.
    Settle { order: u64, reserved: bool },
}

/// Its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerEvt {
    /// `n` was appended.
    Appended { n: u64 },
    /// The timer `name` was armed to fire `n`.
    Armed { name: String, n: u64 },
    /// The timer `name` was disarmed (whether or not it was still armed).
    Disarmed { name: String },
    /// The timer `name` fired `n`.
    Fired { name: String, n: u64 },
    /// The order `order` of `qty` was sent to the stock `stock`.
    Ordered { order: u64, stock: String, qty: u64 },
    /// The stock answered the order `order`: reserved or refused.
    Settled { order: u64, reserved: bool },
}

impl Entity for Ledger {
    type Command = LedgerCmd;
    type Event = LedgerEvt;
    type State = Vec<u64>;
    type Rejection = String;

    fn decide(state: &Vec<u64>, command: LedgerCmd) -> Result<Vec<LedgerEvt>, String> {
        Self::decide_with_effects(state, command, &mut Effects::new(Codec::Json))
    }

    fn decide_with_effects(
        state: &Vec<u64>,
        command: LedgerCmd,
        effects: &mut Effects,
    ) -> Result<Vec<LedgerEvt>, String> {
        if let Some(delay) = faults().decide_delay {
            std::thread::sleep(delay);
        }
        let next = appended(state).count() as u64;
        match command {
            LedgerCmd::Append { n } if n == next => Ok(vec![LedgerEvt::Appended { n }]),
            LedgerCmd::Append { n } => Err(format!("expected {next}, got {n}")),
            LedgerCmd::AppendMany { from, count } if from == next => Ok((from..from + count)
                .map(|n| LedgerEvt::Appended { n })
                .collect()),
            LedgerCmd::AppendMany { from, .. } => Err(format!("expected {next}, got {from}")),
            LedgerCmd::Push { n } => Ok(vec![LedgerEvt::Appended { n }]),
            LedgerCmd::Panic => panic!("ledger told to panic"),
            LedgerCmd::Refuse => Err("refused".to_owned()),
            LedgerCmd::Abort => std::process::abort(),
            LedgerCmd::Slow { n, ms } => {
                run_decide_hook(n);
                println!("DECIDING {n}");
                let _ = std::io::Write::flush(&mut std::io::stdout());
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(vec![LedgerEvt::Appended { n }])
            }
            LedgerCmd::Forward { n, to } => {
                run_decide_hook(n);
                effects.command("ledger", &to, &LedgerCmd::Push { n });
                effects.publish(&format!("sink.{n}"), n.to_string());
                Ok(vec![LedgerEvt::Appended { n }])
            }
            LedgerCmd::Remind { name, n, after_ms } => {
                let after = std::time::Duration::from_millis(after_ms);
                effects.set_timer_after(&name, after, &LedgerCmd::Push { n });
                Ok(vec![])
            }
            LedgerCmd::Forget { name } => {
                effects.cancel_timer(&name);
                Ok(vec![])
            }
            LedgerCmd::Arm { name, n, after_ms } => {
                run_decide_hook(n);
                let after = std::time::Duration::from_millis(after_ms);
                let fire = LedgerCmd::Fire {
                    name: name.clone(),
                    n,
                };
                effects.set_timer_after(&name, after, &fire);
                Ok(vec![LedgerEvt::Armed { name, n }])
            }
            LedgerCmd::Disarm { name } => {
                effects.cancel_timer(&name);
                Ok(vec![LedgerEvt::Disarmed { name }])
            }
            LedgerCmd::Fire { name, n } => Ok(vec![LedgerEvt::Fired { name, n }]),
            LedgerCmd::Order {
                order,
                stock,
                qty,
                reply_to,
            } => {
                let reserve = crate::stock::StockCmd::Reserve {
                    order,
                    qty,
                    reply_to,
                };
                effects.command("stock", &stock, &reserve);
                Ok(vec![LedgerEvt::Ordered { order, stock, qty }])
            }
            LedgerCmd::Settle { order, reserved } => {
                Ok(vec![LedgerEvt::Settled { order, reserved }])
            }
        }
    }

    fn snapshots() -> Option<Snapshots<Vec<u64>>> {
        Some(Snapshots::serde(1))
    }

    fn encode_state(state: &Vec<u64>, codec: Codec) -> Result<Vec<u8>, CodecError> {
        codec.encode(state)
    }

    fn apply(state: &mut Vec<u64>, event: &LedgerEvt) {
        if let (Some(at), LedgerEvt::Appended { n }) = (faults().abort_on_apply, event)
            && *n == at
        {
            // Dies between the durable write and the acknowledgement of its command.
            std::process::abort();
        }
        // A fired timer adds its number marked [`FIRED`], a disarm its timer's mark
        // ([`disarmed`]), a settled order its number: every command's effect shows in the
        // state, which the chaos schedules' state oracle reads (`model::check_states`); arming
        // and ordering leave it as it is.
        match event {
            LedgerEvt::Appended { n } => state.push(*n),
            LedgerEvt::Fired { n, .. } => state.push(FIRED | *n),
            LedgerEvt::Disarmed { name } => state.push(disarmed(name)),
            LedgerEvt::Settled { order, .. } => state.push(*order),
            LedgerEvt::Armed { .. } | LedgerEvt::Ordered { .. } => {}
        }
    }
}

/// Faults a test injects into a child node process through its environment.
struct Faults {
    /// `LEDGER_DECIDE_DELAY_MS`: every `decide` takes this long (the handler is busy).
    decide_delay: Option<std::time::Duration>,
    /// `LEDGER_ABORT_ON_APPLY`: the process aborts when it applies `Appended { n }` with this
    /// `n` live (the write is durable, the command not yet acknowledged).
    abort_on_apply: Option<u64>,
}

fn faults() -> &'static Faults {
    static FAULTS: std::sync::OnceLock<Faults> = std::sync::OnceLock::new();
    FAULTS.get_or_init(|| Faults {
        decide_delay: std::env::var("LEDGER_DECIDE_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(std::time::Duration::from_millis),
        abort_on_apply: std::env::var("LEDGER_ABORT_ON_APPLY")
            .ok()
            .and_then(|v| v.parse().ok()),
    })
}

/// A hook of this test process, run by the `decide` of the first `Slow`, `Forward` or `Arm`
/// with its `n` (in process: a node process never has one).
type DecideHook = Box<dyn FnOnce() + Send>;

fn decide_hooks() -> &'static std::sync::Mutex<std::collections::HashMap<u64, DecideHook>> {
    static HOOKS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<u64, DecideHook>>,
    > = std::sync::OnceLock::new();
    HOOKS.get_or_init(Default::default)
}

fn run_decide_hook(n: u64) {
    let hook = decide_hooks()
        .lock()
        .map(|mut h| h.remove(&n))
        .ok()
        .flatten();
    if let Some(hook) = hook {
        hook();
    }
}

/// Runs `hook` in the `decide` of the first `Slow`, `Forward` or `Arm` with this `n` (in this
/// process), before the command's records go to the journal: e.g. to stop the server while
/// that write is about to go out. Once.
pub fn on_decide(n: u64, hook: impl FnOnce() + Send + 'static) {
    if let Ok(mut hooks) = decide_hooks().lock() {
        hooks.insert(n, Box::new(hook));
    }
}
