//! Keeping a spread layout's stream leaders spread over the cluster's servers.
//!
//! The server places a new replicated stream on the servers that hold the fewest, but elects
//! its leader at random among its replicas, and never moves a leader back after a server
//! restarts (its leaderships go elsewhere when it stops). A journal spread over several streams
//! so that several servers lead its writes may then be led by one or two of them, which do most
//! of its work. So one process, the owner of partition 0, looks every [`CHECK_INTERVAL`] at
//! where the journal's streams are led (and, apart, the command streams) and, while a server
//! leads at least two more of one set than
//! another server holding a current replica of one of its streams, asks that stream's leader to
//! step down in favour of that server (the step-down request's preferred server, nats-server
//! 2.11+). One move a round: a step-down holds the stream's writes for a moment (they are
//! confirmed late, or retried under the same message ids).
//!
//! Cost: for the one process that owns partition 0, one stream info request per command and
//! journal stream a round and at most one step-down; nothing for the others, whatever their
//! number.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::response::Response;
use serde::{Deserialize, Serialize};

use crate::health::{HealthBoard, PartitionHealth};
use crate::journal::server::stream_info;
use crate::wire::{Names, stream_leader_stepdown};

/// How often the owner of partition 0 looks at where the journal's streams are led.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Where one journal stream is led, and which servers hold a replica it could lead from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) stream: String,
    pub(crate) leader: Option<String>,
    /// The other replicas: their server, and whether it is current and online (only such a
    /// server is asked to take over).
    pub(crate) replicas: Vec<(String, bool)>,
}

/// A leader to move: `stream`'s leader steps down in favour of `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    pub(crate) stream: String,
    pub(crate) from: String,
    pub(crate) to: String,
}

/// The next move towards leaders spread evenly, if any: from a server leading the most
/// streams, along the shortest chain of "a stream it leads has a replica on that server" to a
/// server leading at least two fewer; the chain's last stream moves first (so no server ever
/// leads more than before), the next round moves the one before it. None once no server can
/// reach one leading two fewer. Deterministic: ties go to the first name.
pub(crate) fn next_move(placements: &[Placement]) -> Option<Move> {
    let mut leads: BTreeMap<&str, usize> = BTreeMap::new();
    for placement in placements {
        for (server, _) in &placement.replicas {
            leads.entry(server).or_default();
        }
        if let Some(leader) = &placement.leader {
            *leads.entry(leader).or_default() += 1;
        }
    }
    let mut busiest: Vec<(&str, usize)> = leads.iter().map(|(s, n)| (*s, *n)).collect();
    busiest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (start, led) in busiest {
        let mut seen = std::collections::BTreeSet::from([start]);
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(server) = queue.pop_front() {
            for placement in placements
                .iter()
                .filter(|p| p.leader.as_deref() == Some(server))
            {
                for (to, usable) in &placement.replicas {
                    if !usable || !seen.insert(to) {
                        continue;
                    }
                    if leads[to.as_str()] + 2 <= led {
                        return Some(Move {
                            stream: placement.stream.clone(),
                            from: server.to_owned(),
                            to: to.clone(),
                        });
                    }
                    queue.push_back(to);
                }
            }
        }
    }
    None
}

/// Keeps the journal's stream leaders spread while this process owns partition 0 (see the
/// module docs); runs until aborted.
pub(crate) async fn keep_spread(js: Context, names: Arc<Names>, health: Arc<HealthBoard>) {
    let mut ticks = tokio::time::interval(CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let owning = matches!(
            health.phases().first(),
            Some(PartitionHealth::Serving | PartitionHealth::Isolating)
        );
        if !owning {
            continue;
        }
        // Each set apart: a server leading one command stream and one journal stream is
        // balanced, one leading two journal streams is not.
        for streams in [names.journal_streams(), names.command_streams()] {
            match placements(&js, streams).await {
                Ok(placements) => {
                    if let Some(step) = next_move(&placements) {
                        step_down(&js, &step).await;
                        break;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "stream leaders not read"),
            }
        }
    }
}

async fn placements(js: &Context, streams: &[String]) -> Result<Vec<Placement>, crate::Error> {
    let mut placements = Vec::with_capacity(streams.len());
    for name in streams {
        let info = stream_info(js, name).await?;
        let Some(cluster) = info.cluster else {
            continue;
        };
        placements.push(Placement {
            stream: name.clone(),
            leader: cluster.leader,
            replicas: cluster
                .replicas
                .into_iter()
                .map(|peer| (peer.name, peer.current && !peer.offline))
                .collect(),
        });
    }
    Ok(placements)
}

#[derive(Serialize)]
struct StepDownRequest<'a> {
    placement: Preferred<'a>,
}

#[derive(Serialize)]
struct Preferred<'a> {
    preferred: &'a str,
}

#[derive(Deserialize)]
struct StepDownAnswer {
    #[serde(default)]
    success: bool,
}

/// Asks `step.stream`'s leader to step down in favour of `step.to`. Whether it moved shows in
/// the next round's placements; a refusal (no permission, the server gone meanwhile) is logged.
async fn step_down(js: &Context, step: &Move) {
    let request = StepDownRequest {
        placement: Preferred {
            preferred: &step.to,
        },
    };
    let answer: Result<Response<StepDownAnswer>, _> = js
        .request(stream_leader_stepdown(&step.stream), &request)
        .await;
    match answer {
        Ok(Response::Ok(StepDownAnswer { success: true })) => {
            tracing::info!(stream = %step.stream, from = %step.from, to = %step.to, "moved a stream's leader to spread the leaders");
        }
        Ok(Response::Ok(_)) => {
            tracing::warn!(stream = %step.stream, to = %step.to, "leader step-down not done");
        }
        Ok(Response::Err { error }) => {
            tracing::warn!(stream = %step.stream, to = %step.to, %error, "journal leader step-down refused");
        }
        Err(e) => {
            tracing::warn!(stream = %step.stream, to = %step.to, error = %e, "journal leader step-down not answered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(stream: &str, leader: &str, replicas: &[&str]) -> Placement {
        Placement {
            stream: stream.to_owned(),
            leader: Some(leader.to_owned()),
            replicas: replicas.iter().map(|r| ((*r).to_owned(), true)).collect(),
        }
    }

    /// Applies moves until there is none; returns how many servers lead each count.
    fn settle(mut placements: Vec<Placement>) -> (usize, BTreeMap<String, usize>) {
        let mut moves = 0;
        while let Some(step) = next_move(&placements) {
            let p = placements
                .iter_mut()
                .find(|p| p.stream == step.stream)
                .unwrap();
            assert_eq!(p.leader.as_deref(), Some(step.from.as_str()));
            let to = p.replicas.iter().position(|(r, _)| *r == step.to).unwrap();
            p.replicas[to].0 = step.from.clone();
            p.leader = Some(step.to.clone());
            moves += 1;
            assert!(moves <= 20, "moves do not end");
        }
        let mut leads = BTreeMap::new();
        for p in &placements {
            *leads.entry(p.leader.clone().unwrap()).or_default() += 1;
        }
        (moves, leads)
    }

    #[test]
    fn leaders_on_one_server_spread_over_every_server_holding_replicas() {
        // Five streams over five servers, three replicas each, all led by n1 (which holds a
        // replica of each, as after the others restarted one by one).
        let others = ["n2", "n3", "n4", "n5"];
        let placements: Vec<Placement> = (0..5)
            .map(|k| {
                let replicas = [others[k % 4], others[(k + 1) % 4]];
                placed(&format!("J_{k}"), "n1", &replicas)
            })
            .collect();
        let (moves, leads) = settle(placements);
        assert!(moves >= 3, "{moves}");
        assert!(leads.values().all(|n| *n <= 2), "{leads:?}");
        assert!(leads.len() >= 4, "{leads:?}");
    }

    #[test]
    fn spread_leaders_stay_and_a_stale_replica_is_not_asked() {
        let even = vec![
            placed("J_0", "n1", &["n2", "n3"]),
            placed("J_1", "n2", &["n3", "n1"]),
            placed("J_2", "n3", &["n1", "n2"]),
        ];
        assert_eq!(next_move(&even), None);
        // A gap of one is left: moving would only swap it.
        let near = vec![
            placed("J_0", "n1", &["n2", "n3"]),
            placed("J_1", "n1", &["n3", "n2"]),
            placed("J_2", "n2", &["n1", "n3"]),
        ];
        assert_eq!(next_move(&near).map(|m| m.to), Some("n3".to_owned()));
        let mut stale = near.clone();
        for p in &mut stale {
            for replica in &mut p.replicas {
                replica.1 = replica.0 != "n3";
            }
        }
        assert_eq!(next_move(&stale), None);
    }

    #[test]
    fn a_leader_moves_along_a_chain_to_a_server_no_stream_of_the_busiest_reaches() {
        // n1 leads two; n4 leads none but holds no replica of n1's streams: J_2 moves from n3
        // to n4 first, then one of n1's to n3.
        let chained = vec![
            placed("J_0", "n1", &["n2", "n3"]),
            placed("J_1", "n1", &["n3", "n2"]),
            placed("J_2", "n3", &["n4", "n2"]),
            placed("J_3", "n2", &["n1", "n3"]),
        ];
        let first = next_move(&chained).expect("a move");
        assert_eq!((first.stream.as_str(), first.to.as_str()), ("J_2", "n4"));
        let (moves, leads) = settle(chained);
        assert_eq!(moves, 2);
        assert!(leads.values().all(|n| *n == 1), "{leads:?}");
    }
}
