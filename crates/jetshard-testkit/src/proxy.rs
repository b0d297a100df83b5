//! A loopback TCP proxy that can cut or stall the connections through it.

use std::net::{Ipv4Addr, SocketAddr};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::Error;

/// How much one relay reads before it forwards.
const CHUNK: usize = 16 * 1024;

/// A TCP proxy on a free loopback port in front of `upstream`, for network faults between a
/// client and a server: [`cut`](Self::cut), [`stall`](Self::stall), [`heal`](Self::heal).
///
/// Each accepted connection opens its own connection to the upstream. Its tasks belong to
/// the proxy: dropping the proxy stops them and closes every connection through it.
///
/// A clustered server advertises its peers' addresses to clients (`connect_urls`), which lets
/// a client go around a proxy; start such servers with `--no_advertise` when that matters.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use jetshard_testkit::{NatsServer, TcpProxy};
///
/// let server = NatsServer::start().await?;
/// let proxy = TcpProxy::start(server.addr()).await?;
/// let client = async_nats::connect(proxy.url()).await?;
/// proxy.cut(); // the client is disconnected and cannot reconnect...
/// proxy.heal(); // ...until now
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
    accept_task: JoinHandle<()>,
}

/// What the proxy does with traffic, and how many cuts have happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    mode: Mode,
    /// Bumped by every [`TcpProxy::cut`]: a connection accepted in an earlier epoch closes,
    /// even when the proxy is healed before its task gets to look.
    cut_epoch: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Forward,
    Stall,
    Cut,
}

impl TcpProxy {
    /// Starts forwarding from a free port on 127.0.0.1 to `upstream`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> Result<TcpProxy, Error> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|source| Error::io("bind the proxy's loopback port", source))?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::io("read the proxy's address", source))?;
        let (state, state_rx) = watch::channel(State {
            mode: Mode::Forward,
            cut_epoch: 0,
        });
        let accept_task = tokio::spawn(accept(listener, upstream, state_rx));
        Ok(TcpProxy {
            addr,
            state,
            accept_task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address as a NATS URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Closes every connection through the proxy, and closes new ones as soon as they are
    /// accepted, until [`heal`](Self::heal). Connections close within moments: their tasks
    /// notice the cut asynchronously.
    pub fn cut(&self) {
        self.state.send_modify(|state| {
            state.mode = Mode::Cut;
            state.cut_epoch += 1;
        });
    }

    /// Keeps every connection open but stops forwarding bytes in both directions, until
    /// [`heal`](Self::heal): a network that silently drops everything. Bytes already read are
    /// held and delivered on heal.
    pub fn stall(&self) {
        self.state.send_modify(|state| state.mode = Mode::Stall);
    }

    /// Forwards again after a [`cut`](Self::cut) or [`stall`](Self::stall).
    pub fn heal(&self) {
        self.state.send_modify(|state| state.mode = Mode::Forward);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // The accept task owns the relay tasks (a JoinSet); aborting it aborts them too.
        self.accept_task.abort();
    }
}

/// Accepts connections and runs one relay task each, until aborted.
async fn accept(listener: TcpListener, upstream: SocketAddr, state: watch::Receiver<State>) {
    let mut relays = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let client = match accepted {
                    Ok((client, _)) => client,
                    Err(error) => {
                        tracing::warn!(%error, "proxy accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let current = *state.borrow();
                if current.mode == Mode::Cut {
                    drop(client);
                    continue;
                }
                relays.spawn(relay(client, upstream, state.clone(), current.cut_epoch));
            }
            Some(_) = relays.join_next(), if !relays.is_empty() => {}
        }
    }
}

/// Relays one connection until either side closes or the proxy is cut.
async fn relay(client: TcpStream, upstream: SocketAddr, state: watch::Receiver<State>, epoch: u64) {
    let mut cut_state = state.clone();
    let cut = async {
        // An error means the proxy is gone: close as for a cut.
        let _ = cut_state.wait_for(|state| state.cut_epoch != epoch).await;
    };
    let forward = async {
        // An upstream that refuses looks to the client like a connection closed at once.
        let Ok(server) = TcpStream::connect(upstream).await else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::select! {
            () = pump(client_read, server_write, state.clone()) => {}
            () = pump(server_read, client_write, state) => {}
        }
    };
    tokio::select! {
        () = cut => {}
        () = forward => {}
    }
}

/// Copies bytes from `from` to `to`, holding them while the proxy is stalled.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut state: watch::Receiver<State>) {
    let mut buffer = vec![0; CHUNK];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        // On a cut this waits until the relay's cut branch drops it.
        if state
            .wait_for(|state| state.mode == Mode::Forward)
            .await
            .is_err()
        {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
