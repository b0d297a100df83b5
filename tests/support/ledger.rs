//! `Ledger`: the test entity. Each entity is a list of numbers that must be appended in order
//! (`Append { n }` is accepted only when `n` equals the list's length), so a lost, reordered or
//! doubled command shows as a rejection or a gap.

use jetshard::Entity;
use serde::{Deserialize, Serialize};

/// The test entity.
pub struct Ledger;

/// Its commands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum LedgerCmd {
    /// Append `n`; accepted when `n` is the next index.
    Append { n: u64 },
    /// Append `count` numbers from `from` at once (several events for one command).
    AppendMany { from: u64, count: u64 },
    /// Panics in `decide`, at every delivery.
    Panic,
    /// Always rejected.
    Refuse,
}

/// Its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerEvt {
    /// `n` was appended.
    Appended { n: u64 },
}

impl Entity for Ledger {
    type Command = LedgerCmd;
    type Event = LedgerEvt;
    type State = Vec<u64>;
    type Rejection = String;

    fn decide(state: &Vec<u64>, command: LedgerCmd) -> Result<Vec<LedgerEvt>, String> {
        let next = state.len() as u64;
        match command {
            LedgerCmd::Append { n } if n == next => Ok(vec![LedgerEvt::Appended { n }]),
            LedgerCmd::Append { n } => Err(format!("expected {next}, got {n}")),
            LedgerCmd::AppendMany { from, count } if from == next => {
                Ok((from..from + count).map(|n| LedgerEvt::Appended { n }).collect())
            }
            LedgerCmd::AppendMany { from, .. } => Err(format!("expected {next}, got {from}")),
            LedgerCmd::Panic => panic!("ledger told to panic"),
            LedgerCmd::Refuse => Err("refused".to_owned()),
        }
    }

    fn apply(state: &mut Vec<u64>, event: &LedgerEvt) {
        match event {
            LedgerEvt::Appended { n } => state.push(*n),
        }
    }
}
