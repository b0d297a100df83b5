//! A hand-made world: command streams and journals as a correct system would write them, for
//! the checks' unit tests to break one promise at a time.

use std::collections::VecDeque;

use super::super::*;
use crate::inventory::InventoryCommand;
use crate::order::{OrderCommand, PAYMENT_TIMER};
use jetshard::Entity;

pub(super) const PARTITIONS: u32 = 4;
/// "Now" for the checks; timers are due before or after it as a test needs.
pub(super) const NOW_MS: u64 = 1_000_000;
pub(super) const SAGA: Features = Features {
    inventory: true,
    payment_timeout: Some(Duration::from_secs(10)),
};

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum T {
    Order,
    Inventory,
}

/// Builds matching streams: commands, and journals as a correct system would write them.
pub(super) struct World {
    pub(super) features: Features,
    pub(super) orders: Recorded,
    pub(super) inventory: Recorded,
    pub(super) order_states: HashMap<String, OrderState>,
    pub(super) inventory_states: HashMap<String, InventoryState>,
    pub(super) generation: HashMap<(T, u32), u64>,
    /// Outbox messages decided and not delivered yet: (source, command seq, index, message).
    pub(super) outbox: VecDeque<(T, u64, usize, Message)>,
    /// When a timer set now falls due.
    pub(super) due_ms: u64,
}

impl World {
    pub(super) fn new(features: Features) -> Self {
        let mut w = Self {
            features,
            orders: Recorded::default(),
            inventory: Recorded::default(),
            order_states: HashMap::new(),
            inventory_states: HashMap::new(),
            generation: HashMap::new(),
            outbox: VecDeque::new(),
            due_ms: NOW_MS + 60_000,
        };
        for p in 0..PARTITIONS {
            w.claim(T::Order, p, "a");
            w.claim(T::Inventory, p, "a");
        }
        w
    }

    pub(super) fn recorded(&mut self, t: T) -> &mut Recorded {
        match t {
            T::Order => &mut self.orders,
            T::Inventory => &mut self.inventory,
        }
    }

    pub(super) fn partition(id: &str) -> u32 {
        partition_of(&EntityId::new(id).unwrap(), PARTITIONS)
    }

    pub(super) fn record(&mut self, t: T, partition: u32, kind: RecordKind) {
        let generation = self.generation.get(&(t, partition)).copied();
        let journal = &mut self.recorded(t).journal;
        journal.push(JournalRecord {
            seq: journal.len() as u64 + 1,
            partition,
            generation,
            kind,
        });
    }

    pub(super) fn claim(&mut self, t: T, partition: u32, node: &str) {
        let generation = self.generation.entry((t, partition)).or_default();
        *generation += 1;
        let claim = FenceRecord::new(partition, *generation, node);
        self.record(t, partition, RecordKind::Fence(Ok(claim)));
    }

    /// Stores a command and returns its sequence, without processing it.
    pub(super) fn store(
        &mut self,
        t: T,
        id: &str,
        body: &[u8],
        msg_id: Option<String>,
        timer: Option<(String, u64)>,
    ) -> u64 {
        let commands = &mut self.recorded(t).commands;
        let seq = commands.len() as u64 + 1;
        commands.push(StoredCommand {
            seq,
            partition: Self::partition(id),
            entity: id.to_owned(),
            payload: Bytes::copy_from_slice(body),
            msg_id,
            timer,
        });
        seq
    }

    pub(super) fn event(&mut self, t: T, id: &str, seq: u64, payload: Vec<u8>) {
        let kind = RecordKind::Event {
            entity: id.to_owned(),
            command_seq: Some(seq),
            payload: payload.into(),
        };
        self.record(t, Self::partition(id), kind);
    }

    pub(super) fn timer_record(&mut self, id: &str, seq: u64, op: TimerOp) {
        let kind = RecordKind::Timer {
            entity: id.to_owned(),
            name: PAYMENT_TIMER.to_owned(),
            command_seq: Some(seq),
            op,
        };
        self.record(T::Order, Self::partition(id), kind);
    }

    /// Processes a stored order command as jetshard would.
    pub(super) fn decide_order(&mut self, id: &str, seq: u64, command: OrderCommand) {
        let state = self.order_states.entry(id.to_owned()).or_default();
        let decision = Order::decision(&self.features, id, state, command);
        Order::apply(state, &decision.event);
        self.event(
            T::Order,
            id,
            seq,
            Codec::Json.encode(&decision.event).unwrap(),
        );
        for timer in &decision.timers {
            let op = match timer {
                Timer::Set { .. } => TimerOp::Set {
                    due_ms: self.due_ms,
                },
                Timer::Cancel { .. } => TimerOp::Cancel,
            };
            self.timer_record(id, seq, op);
        }
        for (i, m) in decision.messages.into_iter().enumerate() {
            self.outbox.push_back((T::Order, seq, i, m));
        }
    }

    pub(super) fn decide_inventory(&mut self, sku: &str, seq: u64, command: InventoryCommand) {
        let state = self.inventory_states.entry(sku.to_owned()).or_default();
        let decision = Inventory::decision(state, command);
        Inventory::apply(state, &decision.event);
        let payload = Codec::Json.encode(&decision.event).unwrap();
        self.event(T::Inventory, sku, seq, payload);
        for (i, m) in decision.messages.into_iter().enumerate() {
            self.outbox.push_back((T::Inventory, seq, i, m));
        }
    }

    /// A client sends an order command; it is processed.
    pub(super) fn order(&mut self, id: &str, command: OrderCommand) -> u64 {
        let seq = self.store(
            T::Order,
            id,
            &Codec::Json.encode(&command).unwrap(),
            None,
            None,
        );
        self.decide_order(id, seq, command);
        seq
    }

    /// Delivers the next outbox message and processes it.
    pub(super) fn deliver_one(&mut self) {
        let Some((source, seq, index, message)) = self.outbox.pop_front() else {
            return;
        };
        let t = match source {
            T::Order => "order",
            T::Inventory => "inventory",
        };
        let msg_id = Some(format!("{t}:{seq}:out:{index}"));
        match message {
            Message::Inventory { sku, command } => {
                let body = Codec::Json.encode(&command).unwrap();
                let at = self.store(T::Inventory, &sku, &body, msg_id, None);
                self.decide_inventory(&sku, at, command);
            }
            Message::Order { order, command } => {
                let body = Codec::Json.encode(&command).unwrap();
                let at = self.store(T::Order, &order, &body, msg_id, None);
                self.decide_order(&order, at, command);
            }
        }
    }

    /// Delivers every outbox message, and those they cause.
    pub(super) fn settle(&mut self) {
        while !self.outbox.is_empty() {
            self.deliver_one();
        }
    }

    /// The order's payment timer fires (set by command `set_seq`) and is processed.
    pub(super) fn fire(&mut self, id: &str, set_seq: u64) -> u64 {
        let body = Codec::Json.encode(&OrderCommand::PaymentDue).unwrap();
        let timer = Some((PAYMENT_TIMER.to_owned(), set_seq));
        let msg_id = Some(format!("order:timer:{id}:{PAYMENT_TIMER}:{set_seq}"));
        let seq = self.store(T::Order, id, &body, msg_id, timer);
        self.decide_order(id, seq, OrderCommand::PaymentDue);
        self.timer_record(id, seq, TimerOp::Fired { set_seq });
        seq
    }

    pub(super) fn malformed(&mut self, id: &str) -> u64 {
        let seq = self.store(T::Order, id, b"junk", None, None);
        let kind = RecordKind::DeadLetter {
            entity: id.to_owned(),
            command_seq: Some(seq),
            reason: "malformed".into(),
        };
        self.record(T::Order, Self::partition(id), kind);
        seq
    }

    /// Stores a repeat of the payment timer's command for `id`'s first setting (the timer set
    /// by its first command); returns (set sequence, stored sequence). Nothing is decided.
    pub(super) fn payment_due_again(&mut self, id: &str) -> (u64, u64) {
        let set = self
            .orders
            .commands
            .iter()
            .find(|c| c.entity == id)
            .expect("the order was placed")
            .seq;
        let body = Codec::Json.encode(&OrderCommand::PaymentDue).unwrap();
        let timer = Some((PAYMENT_TIMER.to_owned(), set));
        (set, self.store(T::Order, id, &body, None, timer))
    }

    pub(super) fn check(&self) -> Report {
        check(
            PARTITIONS,
            &self.features,
            &self.orders,
            &self.inventory,
            NOW_MS,
        )
    }
}

pub(super) fn place() -> OrderCommand {
    OrderCommand::Place {
        customer: "c".into(),
    }
}

pub(super) fn add(sku: &str, qty: u32) -> OrderCommand {
    OrderCommand::AddItem {
        sku: sku.into(),
        qty,
        price_cents: 50,
    }
}

pub(super) fn healthy() -> World {
    let mut w = World::new(Features::NONE);
    for o in ["o-1", "o-2", "o-3"] {
        w.order(o, place());
        w.order(o, add("s", 2));
    }
    w.malformed("o-2");
    w.order("o-1", OrderCommand::Ship);
    for p in 0..PARTITIONS {
        w.claim(T::Order, p, "b");
    }
    w.order("o-1", OrderCommand::Pay { amount_cents: 100 });
    w.order("o-1", OrderCommand::Ship);
    w
}

/// Fails unless one of the report's violations contains `part`.
#[track_caller]
pub(super) fn assert_violation(report: &Report, part: &str) {
    assert!(
        report.violations.iter().any(|v| v.contains(part)),
        "no violation contains {part:?}: {report}"
    );
}
