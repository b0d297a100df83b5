//! A loopback TCP proxy that can cut or stall the connections through it.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
    seen: Arc<Seen>,
    accept_task: JoinHandle<()>,
}

/// What a test can watch of the proxy's connections, so that it waits for the fault to have
/// taken hold rather than for a time.
#[derive(Debug, Default)]
struct Seen {
    /// Connections relayed now.
    open: AtomicUsize,
    /// The bytes from the upstream that a stall holds, not yet forwarded to a client.
    held_for_clients: Mutex<Vec<u8>>,
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
    /// Stalled from the upstream to clients only.
    StallToClients,
    Cut,
}

impl Mode {
    /// Whether bytes flow in a direction: to clients (`to_clients`) or to the upstream.
    fn forwards(self, to_clients: bool) -> bool {
        match self {
            Mode::Forward => true,
            Mode::StallToClients => !to_clients,
            Mode::Stall | Mode::Cut => false,
        }
    }
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
        let seen = Arc::new(Seen::default());
        let accept_task = tokio::spawn(accept(listener, upstream, state_rx, Arc::clone(&seen)));
        Ok(TcpProxy {
            addr,
            state,
            seen,
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

    /// As [`stall`](Self::stall), but in one direction: what the upstream sends is held, what
    /// clients send still reaches it, until [`heal`](Self::heal). A client's requests (a
    /// consumer's pulls) then stay live at the server while its answers are held.
    pub fn stall_to_clients(&self) {
        self.state
            .send_modify(|state| state.mode = Mode::StallToClients);
    }

    /// Forwards again after a [`cut`](Self::cut) or a stall.
    pub fn heal(&self) {
        self.state.send_modify(|state| state.mode = Mode::Forward);
    }

    /// How many connections the proxy relays now: after a [`cut`](Self::cut), 0 once every
    /// connection through it is closed.
    pub fn open_connections(&self) -> usize {
        self.seen.open.load(Ordering::SeqCst)
    }

    /// The bytes the upstream sent that a [`stall`](Self::stall) holds, not yet forwarded to
    /// a client (empty once forwarded or dropped by a cut): e.g. to wait until a delivery is
    /// held before cutting the connection it was sent on.
    pub fn held_for_clients(&self) -> Vec<u8> {
        self.seen
            .held_for_clients
            .lock()
            .expect("the proxy's held bytes")
            .clone()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // The accept task owns the relay tasks (a JoinSet); aborting it aborts them too.
        self.accept_task.abort();
    }
}

/// Accepts connections and runs one relay task each, until aborted.
async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    state: watch::Receiver<State>,
    seen: Arc<Seen>,
) {
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
                seen.open.fetch_add(1, Ordering::SeqCst);
                let seen = Arc::clone(&seen);
                let state = state.clone();
                relays.spawn(async move {
                    relay(client, upstream, state, current.cut_epoch, &seen).await;
                    seen.held_for_clients.lock().expect("the proxy's held bytes").clear();
                    seen.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
            Some(_) = relays.join_next(), if !relays.is_empty() => {}
        }
    }
}

/// Relays one connection until either side closes or the proxy is cut.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    state: watch::Receiver<State>,
    epoch: u64,
    seen: &Seen,
) {
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
            () = pump(client_read, server_write, state.clone(), None) => {}
            () = pump(server_read, client_write, state, Some(&seen.held_for_clients)) => {}
        }
    };
    tokio::select! {
        () = cut => {}
        () = forward => {}
    }
}

/// Copies bytes from `from` to `to`, holding them while the proxy is stalled in this direction.
/// `held` is given for the direction to clients: it shows what is held there meanwhile.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    held: Option<&Mutex<Vec<u8>>>,
) {
    let mut buffer = vec![0; CHUNK];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        let to_clients = held.is_some();
        let holding = !state.borrow().mode.forwards(to_clients);
        if let Some(held) = held.filter(|_| holding) {
            let mut held = held.lock().expect("the proxy's held bytes");
            held.extend_from_slice(&buffer[..read]);
        }
        // On a cut this waits until the relay's cut branch drops it.
        if state
            .wait_for(|state| state.mode.forwards(to_clients))
            .await
            .is_err()
        {
            return;
        }
        if let Some(held) = held.filter(|_| holding) {
            held.lock().expect("the proxy's held bytes").clear();
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
