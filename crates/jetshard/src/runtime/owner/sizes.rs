//! The sizes of the owner's futures: ractor moves the whole `handle` future twice per
//! message (into `run_with_signal` and into its `select!`), and a move costs in proportion to
//! the size, which the largest arm sets. Printed (`cargo test -p jetshard --lib owner_future
//! -- --nocapture`), with a bound on the handle future: the rare paths are boxed apart.

use ractor::Actor;

use super::ack::{acknowledge, acknowledge_confirmed, respond};
use super::state::OwnerState;
use super::{OwnerActor, StepDown};
use crate::test_alloc::future_size;
use crate::test_entity::Counter;

type State = OwnerState<Counter>;

#[test]
#[allow(unreachable_code, clippy::diverging_sub_expression)]
fn owner_future_sizes() {
    let sizes = [
        (
            "handle",
            future_size(|| {
                <OwnerActor<Counter> as Actor>::handle(
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                )
            }),
        ),
        (
            "on_delivery",
            future_size(|| State::on_delivery(unreachable!(), unreachable!())),
        ),
        (
            "deliver",
            future_size(|| State::deliver(unreachable!(), unreachable!())),
        ),
        (
            "step_isolation",
            future_size(|| State::step_isolation(unreachable!())),
        ),
        (
            "route_delivery",
            future_size(|| State::route_delivery(unreachable!(), unreachable!(), unreachable!())),
        ),
        (
            "give_up_without_entity",
            future_size(|| {
                State::give_up_without_entity(
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                )
            }),
        ),
        (
            "on_outcome",
            future_size(|| State::on_outcome(unreachable!(), unreachable!())),
        ),
        (
            "carry_out",
            future_size(|| {
                State::carry_out(
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                )
            }),
        ),
        (
            "finish_release_if_drained",
            future_size(|| State::finish_release_if_drained(unreachable!())),
        ),
        (
            "step_down",
            future_size(|| State::step_down(unreachable!(), StepDown::Fenced)),
        ),
        (
            "decline",
            future_size(|| State::decline(unreachable!(), unreachable!())),
        ),
        (
            "acquire",
            future_size(|| State::acquire(unreachable!(), unreachable!(), unreachable!())),
        ),
        ("on_tick", future_size(|| State::on_tick(unreachable!()))),
        (
            "start_release",
            future_size(|| State::start_release(unreachable!(), unreachable!())),
        ),
        (
            "on_pull_loop_ended",
            future_size(|| State::on_pull_loop_ended(unreachable!(), unreachable!())),
        ),
        (
            "acknowledge",
            future_size(|| acknowledge(unreachable!(), 0, unreachable!(), unreachable!())),
        ),
        (
            "acknowledge_confirmed",
            future_size(|| {
                acknowledge_confirmed(
                    unreachable!(),
                    0,
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                )
            }),
        ),
        (
            "respond",
            future_size(|| {
                respond(
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                    unreachable!(),
                )
            }),
        ),
    ];
    let values = [
        (
            "Delivery",
            std::mem::size_of::<crate::runtime::pin::Delivery>(),
        ),
        (
            "CommandReport",
            std::mem::size_of::<crate::runtime::entity_actor::CommandReport>(),
        ),
        ("OwnerMsg", std::mem::size_of::<super::OwnerMsg>()),
        ("Settled", std::mem::size_of::<super::settle::Settled>()),
        ("Pending", std::mem::size_of::<super::slot::Pending>()),
        (
            "CommandOutcome",
            std::mem::size_of::<crate::CommandOutcome>(),
        ),
        (
            "Option<Detail>",
            std::mem::size_of::<Option<crate::reply::Detail>>(),
        ),
    ];
    for (name, size) in values {
        eprintln!("VALUE {name}: {size} bytes");
    }
    for (name, size) in sizes {
        eprintln!("FUTURE {name}: {size} bytes");
    }
    // 5,552 bytes while the rare paths (step-downs, isolation, acquisition, release, tick,
    // dead letters without an entity, replies) were inline; 2,336 boxed apart. The
    // common paths' own awaits (the acknowledgement: async-nats' publish, 848 bytes) set it now.
    let handle = sizes[0].1;
    assert!(
        handle <= 2_560,
        "the owner's handle future is {handle} bytes: a rare path inline again?"
    );
}
