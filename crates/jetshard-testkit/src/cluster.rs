//! A JetStream cluster of `nats-server` processes on loopback.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};

use crate::server::{START_ATTEMPTS, free_ports};
use crate::{Error, NatsServer, TcpProxy};

/// The `--cluster_name` of every testkit cluster.
const CLUSTER_NAME: &str = "jetshard";

/// How long [`NatsCluster::start`] waits for the cluster to place and serve a stream.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one attempt at the readiness stream may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The pause between two attempts at the readiness stream.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);

/// The stream created, written and deleted to prove the cluster can serve replicated streams.
const PROBE_STREAM: &str = "JETSHARD_TESTKIT_READY";
const PROBE_SUBJECT: &str = "jetshard_testkit.ready";

/// JetStream does not place more replicas than this.
const MAX_REPLICAS: usize = 5;

/// An n-node JetStream cluster on loopback; node `i` is named `s<i>`.
///
/// Every node is a [`NatsServer`] with its own port, store and log, so it can be killed,
/// paused, resumed and restarted on its own. Dropping the cluster kills every node.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use jetshard_testkit::NatsCluster;
///
/// let cluster = NatsCluster::start(3).await?;
/// let client = cluster.connect().await?;
/// cluster.node(1).kill()?;
/// cluster.node(1).restart().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
    /// In front of the last node's cluster port, when it reaches its peers only through it.
    route_proxy: Option<TcpProxy>,
}

impl NatsCluster {
    /// Starts `nodes` servers that route to each other and waits until the cluster is ready:
    /// every node answers JetStream requests, and a stream with `min(nodes, 5)` replicas
    /// could be created, written and deleted.
    ///
    /// # Errors
    ///
    /// [`Error::EmptyCluster`] for zero nodes; otherwise as
    /// [`NatsServerBuilder::start`](crate::NatsServerBuilder::start), and
    /// [`Error::NotReady`] (with every node's log tail) when the cluster cannot serve a
    /// replicated stream within 30 s.
    pub async fn start(nodes: usize) -> Result<NatsCluster, Error> {
        NatsCluster::start_routed(nodes, false).await
    }

    /// As [`start`](Self::start), but the last node, `s<nodes-1>`, exchanges every byte with
    /// its peers through a [`TcpProxy`] ([`route_proxy`](Self::route_proxy)): stalling it
    /// leaves that node running and serving its clients from its own replicas while the
    /// others go on without it, a replica genuinely behind; healing it lets it catch up.
    ///
    /// Its peers route to it through the proxy and it routes only to itself; it advertises the
    /// proxy, and its peers advertise addresses nothing listens on, so no route learnt by
    /// gossip goes around the proxy.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); [`Error::EmptyCluster`] also for a single node.
    pub async fn start_with_proxied_routes(nodes: usize) -> Result<NatsCluster, Error> {
        if nodes < 2 {
            return Err(Error::EmptyCluster);
        }
        NatsCluster::start_routed(nodes, true).await
    }

    async fn start_routed(nodes: usize, proxied: bool) -> Result<NatsCluster, Error> {
        if nodes == 0 {
            return Err(Error::EmptyCluster);
        }
        let mut attempt = 1;
        loop {
            match NatsCluster::try_start(nodes, proxied).await {
                Err(error) if error.is_address_in_use() && attempt < START_ATTEMPTS => {
                    tracing::debug!("a port was taken before nats-server bound it; retrying");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn try_start(count: usize, proxied: bool) -> Result<NatsCluster, Error> {
        let started = Instant::now();
        // Per node: client port, cluster port, and a port nothing listens on (to advertise).
        let ports = free_ports(3 * count)?;
        let (client_ports, rest) = ports.split_at(count);
        let (cluster_ports, unused_ports) = rest.split_at(count);
        let mut cluster_urls: Vec<String> = cluster_ports
            .iter()
            .map(|port| format!("nats://127.0.0.1:{port}"))
            .collect();
        let last = count - 1;
        let route_proxy = if proxied {
            let addr =
                std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, cluster_ports[last]));
            let proxy = TcpProxy::start(addr).await?;
            cluster_urls[last] = proxy.url();
            Some(proxy)
        } else {
            None
        };

        let mut nodes = Vec::with_capacity(count);
        for (index, client_port) in client_ports.iter().enumerate() {
            let routes: Vec<&str> = if proxied && index == last {
                // Clustered JetStream wants a route configured: its own, through the proxy,
                // which the server recognises as itself and drops.
                vec![cluster_urls[last].as_str()]
            } else {
                cluster_urls
                    .iter()
                    .enumerate()
                    .filter(|(other, _)| *other != index)
                    .map(|(_, url)| url.as_str())
                    .collect()
            };
            let listen = format!("nats://127.0.0.1:{}", cluster_ports[index]);
            let mut builder = NatsServer::builder()
                .name(format!("s{index}"))
                .ready_timeout(READY_TIMEOUT)
                .arg("--cluster_name")
                .arg(CLUSTER_NAME)
                .arg("--cluster")
                .arg(&listen);
            if proxied {
                let advertise = match &route_proxy {
                    Some(proxy) if index == last => proxy.addr().to_string(),
                    _ => format!("127.0.0.1:{}", unused_ports[index]),
                };
                builder = builder.arg("--cluster_advertise").arg(advertise);
            }
            if !routes.is_empty() {
                builder = builder.arg("--routes").arg(routes.join(","));
            }
            nodes.push(builder.spawn(*client_port)?);
        }
        let cluster = NatsCluster { nodes, route_proxy };

        futures::future::try_join_all(cluster.nodes.iter().map(NatsServer::wait_ready)).await?;
        cluster
            .wait_for_replicated_stream(READY_TIMEOUT.saturating_sub(started.elapsed()))
            .await?;
        Ok(cluster)
    }

    /// The proxy between the last node and its peers, for a cluster started with
    /// [`start_with_proxied_routes`](Self::start_with_proxied_routes).
    pub fn route_proxy(&self) -> Option<&TcpProxy> {
        self.route_proxy.as_ref()
    }

    /// All nodes, in order: `nodes()[i]` is named `s<i>`.
    pub fn nodes(&self) -> &[NatsServer] {
        &self.nodes
    }

    /// Node `index`, named `s<index>`.
    ///
    /// # Panics
    ///
    /// When `index` is not below the number of nodes, as slice indexing does.
    pub fn node(&self, index: usize) -> &NatsServer {
        &self.nodes[index]
    }

    /// The node with this server name, e.g. the `cluster.leader` of a stream's info.
    pub fn node_by_name(&self, name: &str) -> Option<&NatsServer> {
        self.nodes.iter().find(|node| node.name() == Some(name))
    }

    /// Every node's client URL, comma-separated, as NATS tools take a server list.
    pub fn urls(&self) -> String {
        self.client_urls().join(",")
    }

    /// Connects a client that knows every node, so it reconnects to a survivor when the node
    /// it uses dies.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when no node accepts the connection.
    pub async fn connect(&self) -> Result<async_nats::Client, Error> {
        async_nats::ConnectOptions::new()
            .connect(self.client_urls())
            .await
            .map_err(|source| Error::Connect {
                url: self.urls(),
                source,
            })
    }

    fn client_urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// Retries creating, writing and deleting a replicated stream until it works: proof that
    /// a meta leader exists, the peers are known and a stream's group elects a leader.
    async fn wait_for_replicated_stream(&self, timeout: Duration) -> Result<(), Error> {
        let started = Instant::now();
        let replicas = self.nodes.len().min(MAX_REPLICAS);
        let client = self.connect().await?;
        let context = jetstream::ContextBuilder::new()
            .timeout(PROBE_TIMEOUT)
            .build(client);
        loop {
            let last_error =
                match tokio::time::timeout(PROBE_TIMEOUT, probe_stream(&context, replicas)).await {
                    Ok(Ok(())) => return Ok(()),
                    Ok(Err(error)) => error,
                    Err(elapsed) => elapsed.into(),
                };
            if started.elapsed() >= timeout {
                return Err(Error::NotReady {
                    server: format!("{}-node cluster {CLUSTER_NAME}", self.nodes.len()),
                    after: timeout,
                    log_tail: self.log_tails(),
                    last_error: Some(last_error),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("{}: {}", node.describe(), node.log_tail_for_error()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

async fn probe_stream(
    context: &jetstream::Context,
    replicas: usize,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    context
        .get_or_create_stream(stream::Config {
            name: PROBE_STREAM.to_owned(),
            subjects: vec![PROBE_SUBJECT.to_owned()],
            num_replicas: replicas,
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
    context.publish(PROBE_SUBJECT, "".into()).await?.await?;
    context.delete_stream(PROBE_STREAM).await?;
    Ok(())
}
