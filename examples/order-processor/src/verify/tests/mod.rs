use super::*;
use crate::inventory::InventoryCommand;
use crate::order::{OrderCommand, OrderEvent, PAYMENT_TIMER};
use jetshard::Entity;
use world::*;

mod world;

#[test]
fn a_correct_journal_has_no_violation() {
    let report = healthy().check();
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.unsettled.is_empty(), "{report}");
    assert_eq!(report.orders.commands, 10);
    assert_eq!(report.orders.entities, 3);
    assert_eq!(report.orders.dead_letters, 1);
    assert_eq!(report.orders.events["Rejected"], 1);
    assert_eq!(report.takeovers(), PARTITIONS as usize);
}

#[test]
fn a_command_without_outcome_is_unsettled_then_a_violation() {
    let mut w = healthy();
    w.store(T::Order, "o-3", br#"{"type":"Cancel"}"#, None, None);
    let report = w.check();
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.unsettled.len(), 1, "{report}");
    let report = report.finish();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].contains("has no outcome yet"));
}

#[test]
fn a_command_applied_twice_is_a_violation() {
    let mut w = healthy();
    let seq = w.order("o-3", OrderCommand::Cancel);
    w.event(
        T::Order,
        "o-3",
        seq,
        Codec::Json.encode(&OrderEvent::Cancelled).unwrap(),
    );
    let report = w.check();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].contains("found 2 event(s)"));
}

#[test]
fn an_event_the_rules_would_not_give_is_a_violation_reported_once() {
    let mut w = healthy();
    let seq = w.store(T::Order, "o-3", br#"{"type":"Ship"}"#, None, None);
    // An unpaid order shipped (as if commands were applied out of order).
    w.event(
        T::Order,
        "o-3",
        seq,
        Codec::Json.encode(&OrderEvent::Shipped).unwrap(),
    );
    if let Some(state) = w.order_states.get_mut("o-3") {
        Order::apply(state, &OrderEvent::Shipped);
    }
    // The next command is decided on the state the journal gives (shipped): not an error.
    w.order("o-3", OrderCommand::Cancel);
    let report = w.check();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].contains("the rules say Rejected"));
}

#[test]
fn an_event_for_another_order_or_a_command_never_sent_is_a_violation() {
    let mut w = healthy();
    let cancelled = Codec::Json.encode(&OrderEvent::Cancelled).unwrap();
    // Command 1 is o-1's.
    w.event(T::Order, "o-2", 1, cancelled.clone());
    let report = w.check();
    assert_violation(&report, "filed under o-2");
    let mut w = healthy();
    w.event(T::Order, "o-2", 0, cancelled);
    let report = w.check();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].contains("which was never sent"));
}

#[test]
fn a_write_by_a_stale_generation_is_a_violation() {
    let mut w = healthy();
    let p = World::partition("o-3");
    // The partition moves on; then the old owner's write lands.
    w.claim(T::Order, p, "c");
    *w.generation.get_mut(&(T::Order, p)).unwrap() -= 1;
    w.order("o-3", OrderCommand::Cancel);
    let report = w.check();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].contains("a stale owner wrote"));
}

#[test]
fn a_generation_skipped_or_claimed_twice_is_a_violation() {
    let mut w = healthy();
    w.claim(T::Order, 0, "c");
    *w.generation.get_mut(&(T::Order, 0)).unwrap() -= 1;
    w.claim(T::Order, 0, "d");
    let report = w.check();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].contains("claims generation"));
}

#[test]
fn a_malformed_command_must_be_dead_lettered_not_answered() {
    let mut w = healthy();
    let seq = w.store(T::Order, "o-3", b"junk", None, None);
    let rejected = OrderEvent::Rejected {
        reason: "junk".into(),
    };
    w.event(T::Order, "o-3", seq, Codec::Json.encode(&rejected).unwrap());
    let report = w.check();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].contains("expected a dead letter"));
}

#[test]
fn a_command_in_the_wrong_partition_is_a_violation() {
    let mut w = healthy();
    w.orders.commands[0].partition = (w.orders.commands[0].partition + 1) % PARTITIONS;
    let report = w.check();
    assert_violation(&report, "belongs to partition");
}

/// Orders through the saga and the payment timer: shipped, out of stock, cancelled with
/// its reservation released, expired by its timer, and one still within its time.
fn saga() -> World {
    let mut w = World::new(SAGA);
    w.order("ok", place());
    w.order("ok", add("s-1", 2));
    w.order("ok", add("s-2", 1));
    w.settle();
    w.order("ok", OrderCommand::Pay { amount_cents: 150 });
    w.order("ok", OrderCommand::Ship);

    w.order("big", place());
    w.order("big", add("s-1", 1));
    w.order("big", add("s-2", STOCK));
    w.settle();

    w.order("gone", place());
    w.order("gone", add("s-1", 1));
    w.settle();
    w.order("gone", OrderCommand::Cancel);
    w.settle();

    let set = w.order("late", place());
    w.order("late", add("s-3", 1));
    w.settle();
    w.fire("late", set);
    w.settle();

    w.order("open", place());
    w
}

#[test]
fn a_correct_saga_with_timers_has_no_violation() {
    let w = saga();
    let report = w.check();
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.unsettled.is_empty(), "{report}");
    assert_eq!(report.orders.count("Shipped"), 1, "{report}");
    assert_eq!(report.orders.count("ItemUnavailable"), 1, "{report}");
    assert_eq!(report.orders.count("Expired"), 1, "{report}");
    assert_eq!(report.inventory.count("Reserved"), 5, "{report}");
    assert_eq!(report.inventory.count("Released"), 3, "{report}");
    assert_eq!(report.timers.set, 5);
    assert_eq!(report.timers.fired, 1);
    assert_eq!(report.timers.cancelled, 3, "paid, out of stock, cancelled");
    assert_eq!(report.timers.armed_due_ms, [w.due_ms]);
    let holds: u32 = w.inventory_states["s-1"].holds.iter().map(|h| h.qty).sum();
    assert_eq!(holds, 2, "only the shipped order's");
}

#[test]
fn a_reservation_made_twice_is_a_violation() {
    let mut w = saga();
    // The inventory takes a repeat of `ok`'s reservation of line 0 as a new one.
    let seq = w.store(
        T::Inventory,
        "s-1",
        br#"{"type":"Reserve","order":"ok","line":0,"qty":2}"#,
        None,
        None,
    );
    let again = InventoryEvent::Reserved {
        order: "ok".into(),
        line: 0,
        qty: 2,
    };
    w.event(
        T::Inventory,
        "s-1",
        seq,
        Codec::Json.encode(&again).unwrap(),
    );
    let report = w.check().finish();
    assert_violation(&report, "line 0 of order ok was reserved 2 times");
}

#[test]
fn a_reservation_never_answered_or_a_message_lost_is_a_violation_once_settled() {
    let mut w = saga();
    w.order("open", add("s-4", 1));
    // The Reserve is never stored in INVENTORY_CMD.
    w.outbox.clear();
    let report = w.check();
    assert!(report.violations.is_empty(), "{report}");
    let report = report.finish();
    assert_eq!(report.violations.len(), 2, "{report}");
    assert_violation(&report, "is not stored");
    assert_violation(&report, "no answer");
}

#[test]
fn a_hold_not_released_by_a_cancelled_order_is_a_violation_once_settled() {
    let mut w = saga();
    w.order("ok2", place());
    w.order("ok2", add("s-5", 1));
    w.settle();
    w.order("ok2", OrderCommand::Cancel);
    // The Release is stored, but the inventory never processes it.
    let (_, seq, index, message) = w.outbox.pop_front().unwrap();
    let Message::Inventory { sku, command } = message else {
        panic!("{message:?}");
    };
    let body = Codec::Json.encode(&command).unwrap();
    let msg_id = Some(format!("order:{seq}:out:{index}"));
    let at = w.store(T::Inventory, &sku, &body, msg_id, None);
    let report = w.check().finish();
    assert_violation(&report, "holds 1 for line 0 of order ok2");
    assert_violation(
        &report,
        &format!("inventory command {at} of s-5 has no outcome"),
    );
}

#[test]
fn a_message_no_command_sent_is_a_violation() {
    let mut w = saga();
    let body = br#"{"type":"Release","order":"ok","line":0}"#;
    let seq = w.store(
        T::Inventory,
        "s-1",
        body,
        Some("order:999:out:0".into()),
        None,
    );
    w.decide_inventory(
        "s-1",
        seq,
        InventoryCommand::Release {
            order: "ok".into(),
            line: 0,
        },
    );
    let report = w.check().finish();
    assert_violation(&report, "claims to be outbox message order:999:out:0");
}

#[test]
fn a_timer_fired_after_payment_is_a_violation() {
    let mut w = saga();
    // `ok` paid, which cancelled its timer (set by its first command, 1); it fires anyway.
    let body = Codec::Json.encode(&OrderCommand::PaymentDue).unwrap();
    let timer = Some((PAYMENT_TIMER.to_owned(), 1));
    let seq = w.store(T::Order, "ok", &body, None, timer);
    let refused = OrderEvent::Rejected {
        reason: "order is Shipped, not open".into(),
    };
    w.event(T::Order, "ok", seq, Codec::Json.encode(&refused).unwrap());
    let report = w.check();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(
        report.violations[0].contains("was cancelled by command")
            && report.violations[0].contains("(Paid)"),
        "{report}"
    );
}

#[test]
fn a_timer_fired_twice_is_a_violation() {
    let mut w = saga();
    // The repeat is decided again (and the journal says it fired twice).
    let (set, seq) = w.payment_due_again("late");
    let refused = OrderEvent::Rejected {
        reason: "order is Cancelled, not open".into(),
    };
    w.event(T::Order, "late", seq, Codec::Json.encode(&refused).unwrap());
    w.timer_record("late", seq, TimerOp::Fired { set_seq: set });
    let report = w.check();
    assert_eq!(report.violations.len(), 2, "{report}");
    assert_violation(&report, "fired at command");
    assert_violation(&report, "fired 2 times");
}

#[test]
fn a_repeated_timer_command_that_is_dropped_is_no_violation() {
    let mut w = saga();
    w.payment_due_again("late");
    let report = w.check();
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.timers.dropped, 1);
}

#[test]
fn a_due_timer_that_never_fired_is_a_violation_once_settled() {
    let mut w = saga();
    w.due_ms = NOW_MS - 5_000;
    w.order("stuck", place());
    let report = w.check();
    assert!(report.violations.is_empty(), "{report}");
    let report = report.finish();
    assert_eq!(report.violations.len(), 1, "{report}");
    assert!(report.violations[0].contains("has not fired"), "{report}");
}

#[test]
fn without_features_the_saga_commands_are_never_sent() {
    let mut w = World::new(Features::NONE);
    w.order("o-1", place());
    w.order("o-1", add("s-1", 1));
    assert!(w.outbox.is_empty());
    let report = w.check();
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.unsettled.is_empty(), "{report}");
}
