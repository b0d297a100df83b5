//! Balancing rounds: this process's heartbeat, hand-offs when it owns more than its share, and
//! what the crash watch and each owner are told (who is live, who stands by, who holds back).
//! The rules themselves are `runtime/balance.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::state::SystemState;
use crate::runtime::balance::{Heartbeat, heartbeat_period};
use crate::runtime::owner::{OwnerMsg, Shared};

/// Says how many partitions this process owns, and hands partitions off if it owns more than
/// its share while others own less (see `balance.rs`).
pub(super) async fn balance(state: &mut SystemState) {
    if state.stopping {
        return;
    }
    let mut owned = Vec::new();
    for owner in state.owners.iter().flatten() {
        if let Ok(ractor::rpc::CallResult::Success(status)) = owner
            .call(OwnerMsg::Status, Some(Duration::from_secs(1)))
            .await
            && status.generation.is_some()
        {
            owned.push((status.partition, owner.clone()));
        }
    }
    let shared = Arc::clone(&state.shared);
    let config = &shared.config;
    let now = Instant::now();
    // Every pin TTL in a fleet of a few dozen; less often in a larger one, but a change of
    // what this process owns is said at once (`heartbeat_period`).
    let period = heartbeat_period(state.membership.live(now).len(), config.pin_ttl);
    let due = state.said.is_none_or(|(at, said)| {
        said != owned.len() as u32 || now.duration_since(at) + config.pin_ttl / 2 >= period
    });
    if due {
        let heartbeat = Heartbeat {
            node: config.node_id.clone(),
            owned: owned.len() as u32,
            leaving: false,
            incarnation: Some(shared.incarnation.clone()),
            // Rounds come every pin TTL: the next heartbeat is up to one round late.
            every_ms: (period > config.pin_ttl)
                .then(|| u64::try_from((period + config.pin_ttl).as_millis()).unwrap_or(u64::MAX)),
        };
        publish_heartbeat(&state.shared, &heartbeat).await;
        state.said = Some((now, owned.len() as u32));
    }
    // Time for the last hand-offs to land and show in the heartbeats before the next ones.
    let settled = state
        .last_hand_off
        .is_none_or(|at| now.duration_since(at) >= config.pin_ttl * 2);
    let shed = state
        .membership
        .shed_count(owned.len() as u32, config.partitions, now) as usize;
    state.owned = owned.len() as u32;
    tell_members(state, now);
    // Every round, for owners restarted since.
    tell_holding(state, now, true);
    if settled && shed > 0 {
        for (partition, owner) in owned.iter().rev().take(shed) {
            tracing::info!(partition, node = %config.node_id, owned = owned.len(), "handing a partition off to balance the processes");
            let _ = owner.cast(OwnerMsg::HandOff);
        }
        state.last_hand_off = Some(now);
    }
}

/// Tells the crash watch who is live, and chooses the partitions this process stands by for
/// again, when the members changed.
pub(super) fn tell_members(state: &mut SystemState, now: Instant) {
    let incarnations = state.membership.incarnations(now);
    state.peers.send_if_modified(|peers| {
        let changed = *peers != incarnations;
        if changed {
            *peers = incarnations;
        }
        changed
    });
    let live = state.membership.live(now);
    let changed = state.members.send_if_modified(|members| {
        let changed = members.as_ref() != Some(&live);
        if changed {
            *members = Some(live.clone());
        }
        changed
    });
    if changed {
        let config = &state.shared.config;
        state.standing_by = crate::runtime::balance::standing_by(
            &config.node_id,
            &live,
            config.partitions,
            config.standbys,
        );
    }
}

/// Tells each owner whether its standby pauses its pulls: when this process holds back (another
/// owns two fewer partitions), or when it is not one of the partition's standbys and is not
/// under its share while another process is over (then it pulls everything, to take what is
/// handed off). `all`: every owner, else only those whose answer changed.
pub(super) fn tell_holding(state: &mut SystemState, now: Instant, all: bool) {
    let partitions = state.shared.config.partitions;
    let hold_back = state.membership.holds_back(state.owned, now);
    let every = state
        .membership
        .pulls_every_partition(state.owned, partitions, now);
    let mut paused = 0;
    for (partition, owner) in state.owners.iter().enumerate() {
        let hold = hold_back || !(every || state.standing_by[partition]);
        paused += usize::from(hold);
        if (all || hold != state.holding[partition])
            && let Some(owner) = owner
        {
            let _ = owner.cast(OwnerMsg::HoldBack(hold));
        }
        state.holding[partition] = hold;
    }
    tracing::trace!(node = %state.shared.config.node_id, hold_back, every, paused, owned = state.owned, "standbys told whether to pull");
}

/// Says `heartbeat` on `<t>.nodes` (core NATS, best effort: the next one follows a pin TTL
/// later).
pub(super) async fn publish_heartbeat(shared: &Shared, heartbeat: &Heartbeat) {
    heartbeat.publish(&shared.client, &shared.names).await;
}
