//! The servers of an R3 cluster as fault targets: which server a kill hits (a stream's or a
//! consumer's leader, or the server an owner is connected to), the kill itself, and when the
//! cluster has healed.

use std::time::{Duration, Instant};

use async_nats::jetstream::context::Context;
use jetshard_testkit::{NatsCluster, wait_until};

use super::Nodes;

/// Which server a kill hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victim {
    /// The leader of `LEDGER_JOURNAL` (of partition 0's journal stream, for a spread journal).
    JournalLeader,
    /// The leader of `LEDGER_CMD` (of partition 0's command stream, for a spread layout).
    CommandLeader,
    /// The leader of a partition's consumer.
    ConsumerLeader,
    /// The server the owner of a partition is connected to.
    OwnersServer,
}

/// The leaders a leader kill picks from.
pub const LEADERS: [Victim; 3] = [
    Victim::JournalLeader,
    Victim::CommandLeader,
    Victim::ConsumerLeader,
];

impl Victim {
    /// The kind a fault report names: `leader-kill` or `server-kill` (the owner's server).
    pub fn kind(self) -> &'static str {
        match self {
            Victim::OwnersServer => "server-kill",
            _ => "leader-kill",
        }
    }
}

/// The name of the server `victim` names now (for `partition`), e.g. `s1`.
pub async fn victim_server(
    js: &Context,
    nodes: &mut Nodes,
    victim: Victim,
    partition: u32,
) -> Option<String> {
    match victim {
        Victim::JournalLeader | Victim::CommandLeader => {
            let name = if victim == Victim::JournalLeader {
                jetshard_tests::ledger_journal_of(js, 0).await
            } else {
                jetshard_tests::ledger_command_stream(js, 0).await
            };
            js.get_stream(name)
                .await
                .ok()?
                .info()
                .await
                .ok()?
                .cluster
                .clone()?
                .leader
        }
        Victim::ConsumerLeader => {
            let name = jetshard_tests::ledger_command_stream(js, partition).await;
            let stream = js.get_stream_no_info(name).await.ok()?;
            let info = stream
                .consumer_info(format!("ledger-p{partition}"))
                .await
                .ok()?;
            info.cluster.clone()?.leader
        }
        Victim::OwnersServer => {
            let slot = nodes.owner_of(partition)?;
            nodes.slots[slot].node.as_ref()?.server()
        }
    }
}

/// Whether both streams and `partitions` partition consumers have a leader and all replicas
/// current.
pub async fn healthy(js: &Context, partitions: u32) -> bool {
    let current = |cluster: Option<async_nats::jetstream::stream::ClusterInfo>| {
        cluster.is_some_and(|c| {
            c.leader.is_some()
                && c.replicas.len() == 2
                && c.replicas.iter().all(|r| r.current && !r.offline)
        })
    };
    let names = jetshard_tests::ledger_names(js).await;
    let streams = names
        .journal_streams()
        .iter()
        .chain(names.command_streams());
    for name in streams {
        let Ok(mut stream) = js.get_stream(name).await else {
            return false;
        };
        let Ok(info) = stream.info().await else {
            return false;
        };
        if !current(info.cluster.clone()) {
            return false;
        }
    }
    for partition in 0..partitions {
        let Ok(stream) = js.get_stream_no_info(names.command_stream(partition)).await else {
            return false;
        };
        let Ok(info) = stream.consumer_info(format!("ledger-p{partition}")).await else {
            return false;
        };
        if !current(info.cluster.clone()) {
            return false;
        }
    }
    true
}

/// SIGKILLs the server `victim` names now (for `partition`), starts it again on its store
/// after `down`, and waits (bounded) until the cluster has healed; returns what happened, for
/// the report (its first word the kind). Panics when the cluster does not heal within 60 s.
pub async fn kill_server(
    js: &Context,
    cluster: &NatsCluster,
    nodes: &mut Nodes,
    victim: Victim,
    partition: u32,
    down: Duration,
) -> String {
    let kind = victim.kind();
    let Some(name) = victim_server(js, nodes, victim, partition).await else {
        return format!("{kind} {victim:?}: no such server now, skipped");
    };
    let server = cluster.node_by_name(&name).expect("a cluster node");
    server.kill().expect("kill");
    let killed = Instant::now();
    // Part of the fault: the server stays down this long.
    tokio::time::sleep(down).await;
    server.restart().await.expect("restart");
    let restarted = killed.elapsed();
    let partitions = nodes.spec().partitions;
    let healed = wait_until(Duration::from_secs(60), "the cluster to heal", || {
        healthy(js, partitions)
    })
    .await;
    let report = format!(
        "{kind} {victim:?} {name} (p{partition}), down {down:?}, back after {restarted:.1?}, healed after {:.1?}: {}",
        killed.elapsed(),
        healed.is_ok()
    );
    healed.unwrap_or_else(|e| panic!("{e}: {report}"));
    report
}
