//! The order's rules, without a server.

use super::*;
use crate::inventory::InventoryCommand;
use crate::rules::{Message, Timer};
use OrderCommand as C;
use OrderEvent as E;

fn place() -> C {
    C::Place {
        customer: "c-1".into(),
    }
}

fn add(qty: u32, price_cents: u64) -> C {
    C::AddItem {
        sku: "sku-1".into(),
        qty,
        price_cents,
    }
}

fn rejected(refusal: Refusal) -> E {
    E::Rejected {
        reason: refusal.to_string(),
    }
}

#[test]
fn a_paid_order_ships() {
    let (events, state) = run([
        place(),
        add(2, 150),
        add(1, 700),
        C::Pay { amount_cents: 1000 },
        C::Ship,
    ]);
    assert_eq!(events.last(), Some(&E::Shipped));
    assert!(events.iter().all(|e| !matches!(e, E::Rejected { .. })));
    assert_eq!(state.phase, Phase::Shipped);
    assert_eq!(state.total_cents, 1000);
    assert_eq!(state.lines, 2);
}

#[test]
fn every_command_leaves_exactly_one_event() {
    let commands = vec![place(), place(), C::Ship, add(0, 5), C::Cancel, C::Cancel];
    let (events, _) = run(commands.clone());
    assert_eq!(events.len(), commands.len());
}

#[test]
fn an_order_is_placed_only_once() {
    let (events, _) = run([place(), place()]);
    assert_eq!(events[1], rejected(Refusal::AlreadyPlaced));
}

#[test]
fn nothing_but_place_is_accepted_before_place() {
    for command in [add(1, 1), C::Pay { amount_cents: 0 }, C::Ship, C::Cancel] {
        let (events, state) = run([command]);
        assert_eq!(events, vec![rejected(Refusal::NotPlaced)]);
        assert_eq!(state, OrderState::default());
    }
}

#[test]
fn items_need_a_quantity_and_an_open_order() {
    let (events, _) = run([place(), add(0, 100)]);
    assert_eq!(events[1], rejected(Refusal::ZeroQuantity));
    let (events, _) = run([
        place(),
        add(1, 100),
        C::Pay { amount_cents: 100 },
        add(1, 1),
    ]);
    assert_eq!(events[3], rejected(Refusal::NotOpen(Phase::Paid)));
    let (events, _) = run([place(), C::Cancel, add(1, 1)]);
    assert_eq!(events[2], rejected(Refusal::NotOpen(Phase::Cancelled)));
}

#[test]
fn a_total_that_overflows_is_refused() {
    let (events, state) = run([place(), add(2, u64::MAX / 2 + 1)]);
    assert_eq!(events[1], rejected(Refusal::TotalTooLarge));
    assert_eq!(state.total_cents, 0);
}

#[test]
fn payment_must_match_the_total_of_at_least_one_item() {
    let (events, _) = run([place(), C::Pay { amount_cents: 0 }]);
    assert_eq!(events[1], rejected(Refusal::NoItems));
    let (events, state) = run([place(), add(3, 100), C::Pay { amount_cents: 299 }]);
    assert_eq!(
        events[2],
        rejected(Refusal::WrongAmount {
            expected: 300,
            offered: 299
        })
    );
    assert_eq!(state.phase, Phase::Open);
    let (events, _) = run([
        place(),
        add(3, 100),
        C::Pay { amount_cents: 300 },
        C::Pay { amount_cents: 300 },
    ]);
    assert_eq!(events[3], rejected(Refusal::NotOpen(Phase::Paid)));
}

#[test]
fn only_a_paid_order_ships_and_only_once() {
    let (events, _) = run([place(), add(1, 5), C::Ship]);
    assert_eq!(events[2], rejected(Refusal::NotShippable(Phase::Open)));
    let (events, _) = run([
        place(),
        add(1, 5),
        C::Pay { amount_cents: 5 },
        C::Ship,
        C::Ship,
    ]);
    assert_eq!(events[3], E::Shipped);
    assert_eq!(events[4], rejected(Refusal::NotShippable(Phase::Shipped)));
}

#[test]
fn cancel_is_allowed_until_shipped_and_only_once() {
    let (events, state) = run([place(), add(1, 5), C::Pay { amount_cents: 5 }, C::Cancel]);
    assert_eq!(events[3], E::Cancelled);
    assert_eq!(state.phase, Phase::Cancelled);
    let (events, _) = run([place(), C::Cancel, C::Cancel]);
    assert_eq!(
        events[2],
        rejected(Refusal::NotCancellable(Phase::Cancelled))
    );
    let (events, _) = run([
        place(),
        add(1, 5),
        C::Pay { amount_cents: 5 },
        C::Ship,
        C::Cancel,
    ]);
    assert_eq!(events[4], rejected(Refusal::NotCancellable(Phase::Shipped)));
    let (events, _) = run([place(), C::Cancel, C::Ship]);
    assert_eq!(events[2], rejected(Refusal::NotShippable(Phase::Cancelled)));
}

#[test]
fn the_wire_format_is_json_tagged_by_type() {
    let command: OrderCommand =
        serde_json::from_str(r#"{"type":"Place","customer":"c-1"}"#).unwrap();
    assert_eq!(command, place());
    let command: OrderCommand = serde_json::from_str(r#"{"type":"Ship"}"#).unwrap();
    assert_eq!(command, C::Ship);
    let command: OrderCommand =
        serde_json::from_str(r#"{"type":"AddItem","sku":"s","qty":2,"price_cents":5}"#).unwrap();
    assert_eq!(
        command,
        C::AddItem {
            sku: "s".into(),
            qty: 2,
            price_cents: 5
        }
    );
    let event = Codec::Json
        .encode(&E::Rejected {
            reason: "not placed".into(),
        })
        .unwrap();
    assert_eq!(
        String::from_utf8(event).unwrap(),
        r#"{"type":"Rejected","reason":"not placed"}"#
    );
}

#[test]
fn bodies_that_are_not_commands_do_not_decode() {
    for body in [
        &b"not json"[..],
        br#"{"type":"Teleport"}"#,
        br#"{"type":"AddItem","sku":"s"}"#,
        br#"{"type":"AddItem","sku":"s","qty":-1,"price_cents":5}"#,
        br#"{"customer":"c-1"}"#,
    ] {
        assert!(
            Codec::Json.decode::<OrderCommand>(body).is_err(),
            "{body:?}"
        );
    }
}

/// Runs commands through [`Order::decision`] with `features`, for order `o-1`.
fn decide_all(
    features: &Features,
    commands: impl IntoIterator<Item = C>,
) -> (Vec<Decision<E>>, OrderState) {
    let mut state = OrderState::default();
    let mut decisions = Vec::new();
    for command in commands {
        let decision = Order::decision(features, "o-1", &state, command);
        Order::apply(&mut state, &decision.event);
        decisions.push(decision);
    }
    (decisions, state)
}

const INVENTORY: Features = Features {
    inventory: true,
    payment_timeout: None,
};
const TIMEOUT: Features = Features {
    inventory: false,
    payment_timeout: Some(std::time::Duration::from_secs(30)),
};

fn reserve(line: u32, qty: u32) -> Message {
    Message::Inventory {
        sku: "sku-1".into(),
        command: InventoryCommand::Reserve {
            order: "o-1".into(),
            line,
            qty,
        },
    }
}

fn release(line: u32) -> Message {
    Message::Inventory {
        sku: "sku-1".into(),
        command: InventoryCommand::Release {
            order: "o-1".into(),
            line,
        },
    }
}

#[test]
fn without_features_a_decision_is_the_first_examples_rule_and_nothing_else() {
    let script = [
        place(),
        add(2, 150),
        C::Ship,
        C::Pay { amount_cents: 300 },
        C::Ship,
        C::Cancel,
    ];
    let (decisions, _) = decide_all(&Features::NONE, script.clone());
    let (events, _) = run(script);
    for (decision, event) in decisions.iter().zip(&events) {
        assert_eq!(decision, &Decision::event(event.clone()));
    }
    let (decisions, state) = decide_all(
        &Features::NONE,
        [
            place(),
            add(1, 5),
            C::Reserved { line: 0 },
            C::OutOfStock { line: 0 },
            C::PaymentDue,
        ],
    );
    assert_eq!(
        decisions[2].event,
        rejected(Refusal::FeatureOff("--inventory"))
    );
    assert_eq!(
        decisions[4].event,
        rejected(Refusal::FeatureOff("--payment-timeout"))
    );
    assert_eq!(state.phase, Phase::Open);
}

#[test]
fn an_added_item_is_reserved_and_the_order_ships_only_once_all_are() {
    let (d, state) = decide_all(
        &INVENTORY,
        [
            place(),
            add(2, 100),
            add(1, 100),
            C::Reserved { line: 0 },
            C::Pay { amount_cents: 300 },
            C::Ship,
            C::Reserved { line: 1 },
            C::Reserved { line: 1 },
            C::Ship,
        ],
    );
    assert_eq!(d[1].messages, [reserve(0, 2)]);
    assert_eq!(d[2].messages, [reserve(1, 1)]);
    assert_eq!(d[5].event, rejected(Refusal::NotReserved));
    assert_eq!(d[7].event, rejected(Refusal::LineAnswered(1)));
    assert_eq!(d[8].event, E::Shipped);
    assert_eq!(state.reserved().count(), 2);
}

#[test]
fn an_item_out_of_stock_cancels_the_order_and_releases_what_it_holds() {
    let (d, state) = decide_all(
        &INVENTORY,
        [
            place(),
            add(1, 100),
            add(5, 100),
            C::Reserved { line: 0 },
            C::OutOfStock { line: 1 },
            C::Pay { amount_cents: 600 },
        ],
    );
    assert_eq!(d[4].event, E::ItemUnavailable { line: 1 });
    assert_eq!(d[4].messages, [release(0)]);
    assert_eq!(state.phase, Phase::Cancelled);
    assert_eq!(d[5].event, rejected(Refusal::NotOpen(Phase::Cancelled)));
}

#[test]
fn a_reservation_answered_after_the_order_ended_is_released_at_once() {
    let (d, _) = decide_all(
        &INVENTORY,
        [place(), add(1, 100), C::Cancel, C::Reserved { line: 0 }],
    );
    assert!(d[2].messages.is_empty(), "nothing held yet");
    assert_eq!(d[3].event, E::ItemReserved { line: 0 });
    assert_eq!(d[3].messages, [release(0)]);
}

#[test]
fn the_payment_timer_is_armed_when_placed_and_disarmed_by_payment() {
    let (d, _) = decide_all(
        &TIMEOUT,
        [
            place(),
            add(1, 5),
            C::Pay { amount_cents: 5 },
            C::PaymentDue,
        ],
    );
    assert_eq!(
        d[0].timers,
        [Timer::Set {
            name: PAYMENT_TIMER,
            after: std::time::Duration::from_secs(30),
            command: C::PaymentDue
        }]
    );
    assert_eq!(
        d[2].timers,
        [Timer::Cancel {
            name: PAYMENT_TIMER
        }]
    );
    // jetshard never delivers it now; were it to, it would change nothing.
    assert_eq!(d[3].event, rejected(Refusal::NotOpen(Phase::Paid)));
}

#[test]
fn an_unpaid_order_expires_and_releases_what_it_holds() {
    let both = Features {
        inventory: true,
        ..TIMEOUT
    };
    let (d, state) = decide_all(
        &both,
        [place(), add(1, 5), C::Reserved { line: 0 }, C::PaymentDue],
    );
    assert_eq!(d[3].event, E::Expired);
    assert_eq!(d[3].messages, [release(0)]);
    assert!(d[3].timers.is_empty(), "a fired timer is disarmed already");
    assert_eq!(state.phase, Phase::Cancelled);
    let (d, _) = decide_all(&both, [place(), C::Cancel]);
    assert_eq!(
        d[1].timers,
        [Timer::Cancel {
            name: PAYMENT_TIMER
        }]
    );
}

#[test]
fn the_shared_config_is_valid() {
    let config = shard_config().node_id("n").build().unwrap();
    assert_eq!(config.entity_type(), ENTITY_TYPE);
    assert_eq!(config.codec(), Codec::Json);
}
