//! Isolation: after a command was in hand at two takeovers in a row (a command that kills its
//! owners is suspected), the new owner runs the commands in hand one at a time, in stream order,
//! each acknowledged (and the acknowledgement confirmed) before the next starts. The first
//! command still in hand at the next claim is then the one that was running when its owner died:
//! the claim counts it (`fence::Trial`), and past the delivery limit it is given up before it is
//! decoded, while the commands around it go on.
//!
//! The commands earlier owners held are not run from the stream here (their deliveries belong to
//! the dead owner and cannot be acknowledged): the owner waits for the server to deliver them
//! again, at most about an ack wait.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;

use crate::runtime::pin::Delivery;

/// The commands of an isolated acquisition, and which one runs.
pub(super) struct Isolation {
    /// Commands earlier owners held, not settled yet.
    held: BTreeSet<u64>,
    /// Deliveries waiting their turn.
    waiting: BTreeMap<u64, Delivery>,
    /// The one command running.
    running: Option<u64>,
    /// Past it, the held commands that never came back are left to the normal path.
    deadline: Instant,
}

/// What to do next.
#[derive(Debug)]
pub(super) enum Next {
    /// Run this one (and nothing else until it is settled).
    Run(Delivery),
    /// Wait for a delivery or for the running command.
    Wait,
    /// Isolation is over: route these as usual, in order.
    Done(Vec<Delivery>),
}

impl Isolation {
    pub(super) fn new(held: impl IntoIterator<Item = u64>, deadline: Instant) -> Self {
        Self {
            held: held.into_iter().collect(),
            waiting: BTreeMap::new(),
            running: None,
            deadline,
        }
    }

    /// Takes a delivery: `Some` if it is to be routed at once (a redelivery of the command
    /// running), `None` if it waits its turn.
    pub(super) fn offer(&mut self, delivery: Delivery) -> Option<Delivery> {
        if self.running == Some(delivery.seq) {
            return Some(delivery);
        }
        // A later delivery of the same command replaces an earlier one: its ack is the live one.
        self.waiting.insert(delivery.seq, delivery);
        None
    }

    /// The running command is done with (acknowledged or given up).
    pub(super) fn settled(&mut self, seq: u64) {
        if self.running == Some(seq) {
            self.running = None;
        }
        self.held.remove(&seq);
    }

    pub(super) fn running(&self) -> Option<u64> {
        self.running
    }

    /// What comes next at `now`.
    pub(super) fn next(&mut self, now: Instant) -> Next {
        if self.running.is_some() {
            return Next::Wait;
        }
        if self.held.is_empty() || now >= self.deadline {
            return Next::Done(std::mem::take(&mut self.waiting).into_values().collect());
        }
        let first_held = self.held.first().copied().unwrap_or(u64::MAX);
        match self.waiting.first_key_value() {
            Some((&seq, _)) if seq <= first_held => {
                let delivery = self.waiting.remove(&seq).expect("present");
                self.running = Some(seq);
                Next::Run(delivery)
            }
            _ => Next::Wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn delivery(seq: u64) -> Delivery {
        Delivery {
            pin: Arc::from("p"),
            subject: "t.cmd.0.e".into(),
            reply: format!("$JS.ACK.S.C.2.{seq}.{seq}.0.0").into(),
            payload: Default::default(),
            seq,
            deliveries: 2,
            respond_to: None,
            pending: 0,
            trace: None,
            timer: None,
            wake: false,
            origin: None,
        }
    }

    fn run_seq(next: Next) -> Option<u64> {
        match next {
            Next::Run(d) => Some(d.seq),
            _ => None,
        }
    }

    #[test]
    fn held_commands_run_one_at_a_time_in_stream_order_as_they_come_back() {
        let now = Instant::now();
        let mut isolation = Isolation::new([3, 5, 9], now + Duration::from_secs(10));
        // A new command (10) waits behind the held ones; 5 waits for 3.
        assert!(isolation.offer(delivery(10)).is_none());
        assert!(isolation.offer(delivery(5)).is_none());
        assert!(matches!(isolation.next(now), Next::Wait));
        assert!(isolation.offer(delivery(3)).is_none());
        assert_eq!(run_seq(isolation.next(now)), Some(3));
        // Nothing else while 3 runs; its own redelivery goes straight through.
        assert!(matches!(isolation.next(now), Next::Wait));
        assert!(isolation.offer(delivery(3)).is_some());
        isolation.settled(3);
        assert_eq!(run_seq(isolation.next(now)), Some(5));
        isolation.settled(5);
        // 9 never came back (acknowledged by its owner meanwhile): wait, up to the deadline.
        assert!(matches!(isolation.next(now), Next::Wait));
        match isolation.next(now + Duration::from_secs(11)) {
            Next::Done(rest) => assert_eq!(rest.iter().map(|d| d.seq).collect::<Vec<_>>(), [10]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn isolation_ends_once_every_held_command_is_settled() {
        let now = Instant::now();
        let mut isolation = Isolation::new([4], now + Duration::from_secs(10));
        isolation.offer(delivery(4));
        isolation.offer(delivery(6));
        assert_eq!(run_seq(isolation.next(now)), Some(4));
        isolation.settled(4);
        match isolation.next(now) {
            Next::Done(rest) => assert_eq!(rest.len(), 1),
            other => panic!("{other:?}"),
        }
    }
}
