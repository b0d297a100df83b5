//! The nats-servers the scenarios run on, every one started here: jetshard-testkit's servers
//! with its defaults (JetStream on, a file store in a temporary directory), one alone or
//! several in a cluster.

use anyhow::Context as _;
use jetshard_testkit::{NatsCluster, NatsServer};

/// A fresh nats-server.
pub async fn nats_server() -> anyhow::Result<NatsServer> {
    NatsServer::start().await.context("start nats-server")
}

/// A fresh cluster of `nodes` servers.
pub async fn nats_cluster(nodes: usize) -> anyhow::Result<NatsCluster> {
    NatsCluster::start(nodes)
        .await
        .with_context(|| format!("start a {nodes}-server cluster"))
}

/// The process ids of a cluster's servers (for their CPU time).
pub fn cluster_pids(cluster: &NatsCluster) -> Vec<u32> {
    cluster.nodes().iter().filter_map(|n| n.pid()).collect()
}

/// Where a scenario runs: one server, or a 3-server cluster.
pub enum Servers {
    /// One server.
    One(Box<NatsServer>),
    /// Three servers in a cluster.
    Three(NatsCluster),
}

impl Servers {
    /// A fresh 3-server cluster if `three`, else a fresh server.
    pub async fn start(three: bool) -> anyhow::Result<Self> {
        Ok(if three {
            Self::Three(nats_cluster(3).await?)
        } else {
            Self::One(Box::new(nats_server().await?))
        })
    }

    /// A client of the server, or of the cluster.
    pub async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        Ok(match self {
            Self::One(server) => server.connect().await?,
            Self::Three(cluster) => cluster.connect().await?,
        })
    }

    /// The servers' process ids (for their CPU time).
    pub fn pids(&self) -> Vec<u32> {
        match self {
            Self::One(server) => server.pid().into_iter().collect(),
            Self::Three(cluster) => cluster_pids(cluster),
        }
    }

    /// The server, or the cluster's node `index`.
    pub fn node(&self, index: usize) -> &NatsServer {
        match self {
            Self::One(server) => server,
            Self::Three(cluster) => cluster.node(index),
        }
    }
}
