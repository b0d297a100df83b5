//! The sizes of what an entity actor's message costs it (issue 22, stop 41).
//!
//! ractor builds each message's `handle` future and moves it, unstarted, into the actor's
//! processing loop, which lives in the actor's task on the heap: every message writes the
//! whole future's size into memory of that one actor. Round-robin over 10,000 resident actors,
//! that memory is cold for every command, so `handle`'s future is kept to its message and a
//! pointer, and a command's locals live in its boxed future (`command`), one allocation.

use ractor::{Actor, ActorRef};

use super::{EntityActor, EntityMsg, EntityState, command};
use crate::test_alloc::{SMALL_ALLOCATION, future_size};
use crate::test_entity::Counter;

const ACTOR: EntityActor<Counter> = EntityActor(std::marker::PhantomData);

/// The size of the future `f` returns from three arguments, without building one.
fn future_size3<A, B, C, F: std::future::Future>(_: impl FnOnce(A, B, C) -> F) -> usize {
    std::mem::size_of::<F>()
}

#[test]
fn an_entity_actors_handle_future_is_its_message_and_little_more() {
    let handle = future_size3(
        |myself: ActorRef<EntityMsg>,
         message: EntityMsg,
         state: &'static mut EntityState<Counter>| ACTOR.handle(myself, message, state),
    );
    let message = std::mem::size_of::<EntityMsg>();
    eprintln!("VALUE EntityMsg: {message} bytes");
    eprintln!("FUTURE EntityActor::handle: {handle} bytes");
    // The test build keeps the message and the command taken out of it apart (2 x 112 bytes);
    // before stop 41, with the command's span, locals and outcome inline: 576 bytes.
    assert!(
        handle <= 2 * message + 64,
        "the entity actor's handle future is {handle} bytes, its message {message}: \
         box what it holds across an await"
    );
}

/// What `handle` boxes per command: one small allocation (see `process`'s test).
#[test]
#[allow(unreachable_code, clippy::diverging_sub_expression)]
fn a_commands_boxed_future_is_a_small_allocation() {
    let size = future_size(|| command::<Counter>(unreachable!(), unreachable!(), unreachable!()));
    eprintln!("FUTURE command: {size} bytes");
    assert!(
        size <= SMALL_ALLOCATION,
        "a command's boxed future is {size} bytes"
    );
}
