//! [`Scenario`]: what a test of the ledger starts from.
//!
//! A scenario owns a real server (or a 3-node cluster), a client, a
//! [`CommandSender<Ledger>`] and the [`History`] of what the test sent, and starts in-process
//! [`ShardSystem`]s and `ledger-node` child processes ([`Node`]) with one set of timings. A test
//! is then its fault and its assertions; [`Scenario::check`] judges the journal with
//! `jetshard_testkit::history` (see [`crate::model`]).

use std::fmt::Write as _;
use std::time::Duration;

use async_nats::jetstream::{self, Context};
use jetshard::{CommandSender, ShardConfig, ShardConfigBuilder, ShardSystem};
use jetshard_testkit::history::{Ack, History, Report};
use jetshard_testkit::{NatsCluster, NatsServer, wait_until};

use crate::ledger::Ledger;
use crate::model::{Op, check_journal, journal_excerpt};
use crate::node::{Node, NodeOptions, NodeSpec};

/// How long [`Scenario::check`] waits for the command stream to drain.
const DRAIN_WITHIN: Duration = Duration::from_secs(60);
/// How long [`Scenario::wait_owns_all`] and [`Scenario::wait_unpinned`] wait.
pub(crate) const OWN_WITHIN: Duration = Duration::from_secs(20);

/// The servers of a scenario.
enum Servers {
    Single(Box<NatsServer>),
    Cluster(NatsCluster),
}

/// A ledger test's world: server(s), client, sender, history, and the timings every shard
/// system and node of the test runs with. Dropping it stops the servers.
pub struct Scenario {
    servers: Servers,
    /// A client of the servers (reconnecting quickly).
    pub client: async_nats::Client,
    /// JetStream on [`client`](Scenario::client).
    pub js: Context,
    /// Sends ledger commands; [`Scenario::send`] also records them.
    pub sender: CommandSender<Ledger>,
    /// What the test sent, for [`Scenario::check`].
    pub history: History<Op>,
    /// The ledger's partition count.
    pub(crate) partitions: u32,
    pin_ttl: Duration,
    ack_wait: Duration,
    replicas: usize,
    journal_streams: Option<u32>,
}

impl Scenario {
    /// One fresh server; `partitions` partitions, pin TTL 1 s, ack wait 3 s.
    pub async fn single(partitions: u32) -> Scenario {
        let server = NatsServer::start().await.expect("start nats-server");
        Scenario::on(Servers::Single(Box::new(server)), partitions, 1).await
    }

    /// A fresh 3-server JetStream cluster with R3 streams (the client knows every server).
    pub async fn cluster(partitions: u32) -> Scenario {
        Scenario::cluster_of(3, partitions).await
    }

    /// A fresh JetStream cluster of `servers` servers with R3 streams.
    pub async fn cluster_of(servers: usize, partitions: u32) -> Scenario {
        let cluster = NatsCluster::start(servers)
            .await
            .expect("start the cluster");
        Scenario::on(Servers::Cluster(cluster), partitions, 3).await
    }

    async fn on(servers: Servers, partitions: u32, replicas: usize) -> Scenario {
        let urls = match &servers {
            Servers::Single(server) => vec![server.url()],
            Servers::Cluster(cluster) => cluster.nodes().iter().map(|n| n.url()).collect(),
        };
        let client = async_nats::ConnectOptions::new()
            .reconnect_delay_callback(|_| Duration::from_millis(100))
            .connect(urls)
            .await
            .expect("connect");
        // A leader election takes seconds: a request may wait that long.
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .build(client.clone());
        let config = crate::ledger_config(partitions, "test")
            .build()
            .expect("config");
        Scenario {
            servers,
            sender: CommandSender::new(client.clone(), &config),
            client,
            js,
            history: History::new(),
            partitions,
            pin_ttl: Duration::from_secs(1),
            ack_wait: Duration::from_secs(3),
            replicas,
            journal_streams: None,
        }
    }

    /// Spreads the commands and journal of every system and node started from now on over
    /// `streams` streams each (else as [`crate::journal_streams`] says); the scenario's sender
    /// publishes in that layout.
    pub fn journal_streams(mut self, streams: u32) -> Scenario {
        self.journal_streams = Some(streams);
        let config = self.config("test").build().expect("config");
        self.sender = CommandSender::new(self.client.clone(), &config);
        self
    }

    /// Sets the pin TTL of every system and node started from now on.
    pub fn pin_ttl(mut self, pin_ttl: Duration) -> Scenario {
        self.pin_ttl = pin_ttl;
        self
    }

    /// Sets the ack wait of every system and node started from now on.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Scenario {
        self.ack_wait = ack_wait;
        self
    }

    /// The single server (panics on a cluster).
    pub fn server(&self) -> &NatsServer {
        match &self.servers {
            Servers::Single(server) => server,
            Servers::Cluster(_) => panic!("a cluster scenario has no single server"),
        }
    }

    /// The cluster (panics on a single server).
    pub fn cluster_servers(&self) -> &NatsCluster {
        match &self.servers {
            Servers::Cluster(cluster) => cluster,
            Servers::Single(_) => panic!("a single-server scenario has no cluster"),
        }
    }

    /// The server URLs, comma-separated, starting at server `first` (a cluster node connects
    /// to its own server first).
    pub fn urls_from(&self, first: usize) -> String {
        match &self.servers {
            Servers::Single(server) => server.url(),
            Servers::Cluster(cluster) => {
                let count = cluster.nodes().len();
                (0..count)
                    .map(|k| cluster.node((first + k) % count).url())
                    .collect::<Vec<_>>()
                    .join(",")
            }
        }
    }

    /// The ledger's config for node `node` with this scenario's partitions, timings and
    /// replicas; add settings before `build()`.
    pub fn config(&self, node: &str) -> ShardConfigBuilder {
        let config = crate::ledger_config(self.partitions, node)
            .pin_ttl(self.pin_ttl)
            .ack_wait(self.ack_wait)
            .replicas(self.replicas);
        match self.journal_streams {
            Some(streams) => config.journal_streams(streams),
            None => config,
        }
    }

    /// Creates the streams and consumers as node `provisioner` would, and owns nothing: the
    /// commands sent next wait for an owner.
    pub async fn provision(&self) {
        provision(
            self.client.clone(),
            &self.config("provisioner").build().expect("config"),
        )
        .await;
    }

    /// Starts an in-process shard system as node `node`.
    pub async fn system(&self, node: &str) -> ShardSystem {
        self.system_with(self.config(node)).await
    }

    /// Starts an in-process shard system with `config` (from [`Scenario::config`]).
    pub async fn system_with(&self, config: ShardConfigBuilder) -> ShardSystem {
        let config = config.build().expect("config");
        ShardSystem::start::<Ledger>(self.client.clone(), config)
            .await
            .expect("start the shard system")
    }

    /// The settings of a node process, with `env` (faults: `LEDGER_DECIDE_DELAY_MS`,
    /// `LEDGER_ABORT_ON_APPLY`).
    pub fn node_spec(&self, env: &[(&str, &str)]) -> NodeSpec {
        NodeSpec {
            partitions: self.partitions,
            pin_ttl: self.pin_ttl,
            ack_wait: self.ack_wait,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// The options of a node process: `--replicas 3` on a cluster, `--journal-streams <n>`
    /// where the scenario sets them.
    pub fn node_options(&self) -> NodeOptions {
        let mut args = Vec::new();
        if self.replicas > 1 {
            args.extend(["--replicas".into(), self.replicas.to_string()]);
        }
        if let Some(streams) = self.journal_streams {
            args.extend(["--journal-streams".into(), streams.to_string()]);
        }
        NodeOptions {
            args,
            log_file: None,
        }
    }

    /// Starts a `ledger-node` process with id `id` and waits (bounded) until it runs.
    pub async fn node(&self, id: &str) -> Node {
        self.node_with(id, &[]).await
    }

    /// Starts a `ledger-node` process with faults in its environment (see
    /// [`Scenario::node_spec`]) and waits (bounded) until it runs.
    pub async fn node_with(&self, id: &str, env: &[(&str, &str)]) -> Node {
        Node::start_with(
            &self.urls_from(0),
            id,
            &self.node_spec(env),
            &self.node_options(),
        )
        .await
    }

    /// Waits (bounded) until `node` owns every partition, by its own account.
    pub async fn wait_owns_all(&self, node: &Node) {
        let what = format!("{} to own all {} partitions", node.id, self.partitions);
        wait_until(OWN_WITHIN, &what, || async {
            node.owned().len() == self.partitions as usize
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: it owns {:?}", node.owned()));
    }

    /// Sends `op`'s command to `entity` and records it in the history; returns its sequence.
    pub async fn send(&mut self, entity: &str, op: Op) -> u64 {
        let command = op.command().expect("an op that is a command");
        let seq = self
            .sender
            .send(entity, &command)
            .await
            .unwrap_or_else(|e| panic!("send {op:?} to {entity}: {e}: {e:?}"));
        self.history.record(entity, op, Ack::Acked(seq));
        seq
    }

    /// Waits (bounded) until `entity` holds `want`, read from its owner.
    pub async fn wait_holds(&self, entity: &str, want: &[u64]) {
        let last = std::sync::Mutex::new(None);
        let what = format!("{entity} to hold {want:?}");
        let reached = wait_until(Duration::from_secs(30), &what, || async {
            let read = self.sender.get(entity, Duration::from_secs(2)).await;
            let done = read.as_ref().is_ok_and(|snapshot| snapshot.state == want);
            *last.lock().unwrap() = Some(read.map(|snapshot| snapshot.state));
            done
        })
        .await;
        if let Err(e) = reached {
            panic!("{e}; last read: {:?}", last.lock().unwrap());
        }
    }

    /// Publishes `payload` as a command for `entity`, as any client could, and records it as
    /// `op` (e.g. [`Op::Garbage`]); returns its sequence.
    pub async fn send_raw(&mut self, entity: &str, payload: Vec<u8>, op: Op) -> u64 {
        // Where this scenario's layout takes the entity's commands (the one-stream form for an
        // id that is no valid one: the server's transform places it).
        let subject = jetshard::EntityId::new(entity).map_or_else(
            |_| format!("ledger.cmd.{entity}"),
            |id| {
                self.config("raw")
                    .build()
                    .expect("config")
                    .names()
                    .command_subject(&id)
            },
        );
        let seq = self
            .js
            .publish(subject, payload.into())
            .await
            .expect("publish")
            .await
            .expect("stored")
            .sequence;
        self.history.record(entity, op, Ack::Acked(seq));
        seq
    }

    /// Sends `Append { n }` to each of `entities`.
    pub async fn append_to_all(&mut self, entities: &[String], n: u64) {
        for entity in entities {
            self.send(entity, Op::Append(n)).await;
        }
    }

    /// Sends `op`'s command to `entity` under the idempotency `key`: a send that meets a
    /// command stream's election (a killed leader, a step-down) is published again until the
    /// next leader stores it (`CommandSender::send_with_key`), where an unkeyed send fails at
    /// the client's ack timeout, stored or not. For sends while servers fail.
    pub async fn send_keyed(&mut self, entity: &str, key: &str, op: Op) -> u64 {
        let command = op.command().expect("an op that is a command");
        let seq = self
            .sender
            .send_with_key(entity, key, &command)
            .await
            .unwrap_or_else(|e| panic!("send {op:?} to {entity} under {key}: {e}"));
        self.history.record(entity, op, Ack::Acked(seq));
        seq
    }

    /// Sends `Append { n }` to each of `entities` under the key `append-<n>` ([`Self::send_keyed`]).
    pub async fn append_to_all_keyed(&mut self, entities: &[String], n: u64) {
        let key = format!("append-{n}");
        for entity in entities {
            self.send_keyed(entity, &key, Op::Append(n)).await;
        }
    }

    /// Restarts the node: `system` shuts down, a new shard system starts as `node`, and every
    /// partition must be acquired again and serve a new command (recorded in the history).
    /// Bad input and bad records often show only at the next takeover.
    pub async fn restart_serves(&mut self, system: ShardSystem, node: &str) -> ShardSystem {
        system.shutdown().await.expect("shut down the system");
        let restarted = self.system(node).await;
        for partition in 0..self.partitions {
            let entity = crate::id_in(&format!("restart-{node}-"), partition, self.partitions);
            self.send(&entity, Op::Push(0)).await;
        }
        let partitions = u64::from(self.partitions);
        wait_until(
            Duration::from_secs(20),
            "every partition acquired and serving after the restart",
            || async {
                restarted.status().await.is_ok_and(|s| {
                    s.iter().all(|p| p.generation.is_some())
                        && s.iter().map(|p| p.applied).sum::<u64>() >= partitions
                })
            },
        )
        .await
        .unwrap();
        restarted
    }

    /// Waits (bounded, 60 s) until every command was acknowledged or terminated, then checks
    /// the journal against the history: panics with the report and the journal of the first
    /// entities it names if anything is lost, doubled, reordered, not what the ledger does, or
    /// written under a stale generation. Returns the report for more assertions.
    pub async fn check(&self) -> Report {
        self.check_within(DRAIN_WITHIN).await
    }

    /// [`Scenario::check`], waiting up to `within` for the command stream to drain.
    pub async fn check_within(&self, within: Duration) -> Report {
        let drained = wait_drained(&self.js, within).await;
        let report = check_journal(&self.js, &self.history).await;
        if drained.is_err() || !report.is_ok() {
            panic!(
                "drained: {drained:?}\n{report}\n{}",
                journal_excerpt(&self.js, &report, 3).await
            );
        }
        report
    }
}

impl Scenario {
    /// Creates the streams, then a copy of the ledger's journal (`ledger_journal_mirror`, see
    /// [`copy_journal`]): it keeps every record the journal held, so a test whose owners
    /// compact the journal can still judge the whole history ([`Scenario::check_mirrored`]).
    pub async fn mirror_journal(&self) {
        self.provision().await;
        let journals = self.config("x").build().expect("config").names();
        copy_journal(&self.js, MIRROR, journals.journal_streams(), self.replicas).await;
    }

    /// [`Scenario::check`] against the journal's copy ([`Scenario::mirror_journal`]): waits
    /// until the command stream drained and the copy holds the journal's last records, then
    /// judges the copy's records against the history.
    pub async fn check_mirrored(&self) -> Report {
        let drained = wait_drained(&self.js, DRAIN_WITHIN).await;
        assert!(drained.is_ok(), "drained: {drained:?}");
        let journals = self.config("x").build().expect("config").names();
        wait_copied(
            &self.js,
            MIRROR,
            journals.journal_streams(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        let records = read_copy(&self.js, MIRROR, journals.journal_streams())
            .await
            .expect("read the mirror");
        let mut history = Vec::new();
        for record in records {
            if let Some(record) = jetshard_testkit::history::Record::from_journal(record)
                .expect("a record of the contract")
            {
                history.push(
                    record
                        .try_map_event(|body| {
                            serde_json::from_slice::<crate::ledger::LedgerEvt>(&body)
                        })
                        .expect("a ledger event"),
                );
            }
        }
        let report =
            jetshard_testkit::history::check(&crate::model::LedgerModel, &self.history, &history);
        assert!(report.is_ok(), "{report}");
        report
    }
}

/// The streams of the copy `name` of the journal in `journals` ([`copy_journal`]): `name`, a
/// mirror of a one-stream journal; `<name>_<k>`, a mirror of each stream of a spread one.
pub fn copy_names(name: &str, journals: &[String]) -> Vec<String> {
    match journals {
        [_] => vec![name.to_owned()],
        many => (0..many.len()).map(|k| format!("{name}_{k}")).collect(),
    }
}

/// Creates the copy `name` of the journal in `journals` ([`copy_names`]: a mirror of each of
/// its streams), which keeps what compaction purges from them. Retried while the journal's
/// streams are not there yet (a cluster still electing).
pub async fn copy_journal(js: &Context, name: &str, journals: &[String], replicas: usize) {
    for (copy, journal) in copy_names(name, journals).into_iter().zip(journals) {
        let config = jetstream::stream::Config {
            name: copy,
            mirror: Some(jetstream::stream::Source {
                name: journal.clone(),
                ..Default::default()
            }),
            allow_rollup: true,
            num_replicas: replicas,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        wait_until(Duration::from_secs(30), "the journal's copy", || async {
            js.get_or_create_stream(config.clone()).await.is_ok()
        })
        .await
        .expect("create the journal's copy");
    }
}

/// Waits (bounded) until each mirror of the copy `name` ([`copy_journal`]) holds everything
/// its journal stream held when called (its last sequence then).
///
/// # Errors
/// The timeout, or a journal stream unreadable.
pub async fn wait_copied(
    js: &Context,
    name: &str,
    journals: &[String],
    within: Duration,
) -> Result<(), String> {
    let last = |name: String| async move {
        match js.get_stream(name).await {
            Ok(mut stream) => stream.info().await.ok().map(|i| i.state.last_sequence),
            Err(_) => None,
        }
    };
    for (copy, journal) in copy_names(name, journals).into_iter().zip(journals) {
        let mut target = None;
        let deadline = tokio::time::Instant::now() + within;
        while target.is_none() && tokio::time::Instant::now() < deadline {
            target = last(journal.clone()).await;
            if target.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let target = target.ok_or("the journal's last sequence unreadable")?;
        wait_until(within, "the journal's copy to catch up", || async {
            last(copy.clone()).await.is_some_and(|seq| seq >= target)
        })
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The ledger's records in the copy `name` of `journals` ([`copy_journal`]), each mirror's in
/// its order.
///
/// # Errors
/// As [`jetshard_testkit::history::read_journal_from`].
pub async fn read_copy(
    js: &Context,
    name: &str,
    journals: &[String],
) -> Result<Vec<jetshard::JournalRecord>, String> {
    let mut records = Vec::new();
    for copy in copy_names(name, journals) {
        let stream = js
            .get_stream_no_info(&copy)
            .await
            .map_err(|e| format!("open {copy}: {e}"))?;
        let read = jetshard::JournalReader::new(stream, "ledger").all().await;
        records.extend(read.map_err(|e| format!("read {copy}: {e}"))?);
    }
    Ok(records)
}

/// The name of the journal's mirror ([`Scenario::mirror_journal`]).
pub const MIRROR: &str = "ledger_journal_mirror";

/// Creates the streams and consumers of `config`'s entity type, as a starting shard system
/// does, and stops at once: nobody owns a partition (a partition is owned only once a command
/// is delivered).
pub async fn provision(client: async_nats::Client, config: &ShardConfig) {
    // The library provisions only inside `ShardSystem::start`.
    ShardSystem::start::<Ledger>(client, config.clone())
        .await
        .expect("provision the streams")
        .shutdown()
        .await
        .expect("stop the provisioning system");
}

/// Waits (bounded) until the ledger's command stream holds nothing: every command was
/// acknowledged or terminated by its owner.
///
/// # Errors
/// The timeout, with what the partition consumers hold.
pub async fn wait_drained(js: &Context, within: Duration) -> Result<(), String> {
    let drained = wait_until(within, "the command stream to drain", || async {
        for name in crate::ledger_command_streams(js).await {
            let Ok(mut stream) = js.get_stream(name).await else {
                return false;
            };
            if !stream
                .info()
                .await
                .is_ok_and(|info| info.state.messages == 0)
            {
                return false;
            }
        }
        true
    })
    .await;
    match drained {
        Ok(()) => Ok(()),
        Err(e) => Err(format!("{e}\n{}", describe_consumers(js).await)),
    }
}

/// What the ledger's partition consumers hold, for a failure message.
pub async fn describe_consumers(js: &Context) -> String {
    let mut text = String::new();
    let names = crate::ledger_names(js).await;
    for name in names.command_streams() {
        let Ok(mut stream) = js.get_stream(name).await else {
            let _ = writeln!(text, "({name} unreadable)");
            continue;
        };
        if let Ok(info) = stream.info().await {
            let _ = writeln!(text, "{name} state: {:?}", info.state);
        }
    }
    for partition in 0.. {
        let Ok(stream) = js.get_stream_no_info(names.command_stream(partition)).await else {
            break;
        };
        let Ok(info) = stream.consumer_info(format!("ledger-p{partition}")).await else {
            break;
        };
        let _ = writeln!(
            text,
            "ledger-p{partition}: pending {} ack_pending {} redelivered {} waiting {} delivered {:?} ack_floor {:?} pinned {:?}",
            info.num_pending,
            info.num_ack_pending,
            info.num_redelivered,
            info.num_waiting,
            info.delivered,
            info.ack_floor,
            info.priority_groups
        );
    }
    text
}
