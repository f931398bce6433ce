//! The server: accepts connections (TCP and in-process), serves each on a task of its
//! own, and runs lame duck mode and shutdown over them. What the connections share is
//! in `state`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use nats_wire::direct::{Link, Sink};
use net::{Acceptor, LogLimiter};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{self, Transport};
use crate::config::Config;
use crate::direct::DirectClient;
use crate::peer::IN_PROCESS_ADDR;
use crate::pipe::{self, InProcessStream};
use crate::state::{Shared, Stats, new_server_id};
use crate::sublist::SubjectIndex;
use crate::tls::HandshakeFailures;

/// Refusals past `max_connections`: a flood of them is one line a second.
static FULL_LOG: LogLimiter = LogLimiter::per_second();

/// A handle to one broker. Cheap to clone.
#[derive(Clone)]
pub struct Server(pub(crate) Arc<Shared>);

/// Attaches a direct connection by name, its messages going to the sink: see
/// [`Server::attacher`].
pub type Attacher = Arc<dyn Fn(&str, Arc<dyn Sink>) -> Option<Box<dyn Link>> + Send + Sync>;

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("id", &self.0.id).finish()
    }
}

impl Server {
    pub fn new(config: Config) -> Server {
        let id = new_server_id();
        let name = config.server_name.clone().unwrap_or_else(|| id.clone());
        Server(Arc::new(Shared {
            config,
            id,
            name,
            index: SubjectIndex::default(),
            clients: Mutex::default(),
            stats: Stats::default(),
            started: SystemTime::now(),
            started_at: Instant::now(),
            listen: OnceLock::new(),
            accept_errors: Arc::default(),
            tls_failures: HandshakeFailures::default(),
            lame_duck: CancellationToken::new(),
            refusing: AtomicBool::new(false),
            tasks: TaskTracker::new(),
            next_cid: AtomicU64::new(1),
        }))
    }

    /// The random id this server reports in INFO and `/varz`.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// Serves clients on `listener` until `shutdown` is cancelled, then closes every
    /// connection (flushing what each has queued) and returns. Lame duck mode (see
    /// [`Server::lame_duck`]) also ends it, once its last client is closed.
    pub async fn run(
        &self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let local = listener.local_addr()?;
        let _ = self.0.listen.set(local);
        // Out of file descriptors and the like: keep serving those we have, pausing
        // accepts instead of spinning on them.
        let mut listener = Acceptor::with_stats(listener, "broker", self.0.accept_errors.clone());
        loop {
            let (stream, addr) = tokio::select! {
                a = listener.accept() => a,
                () = shutdown.cancelled() => break,
                () = self.0.lame_duck.cancelled() => break,
            };
            let _ = stream.set_nodelay(true);
            let shared = self.0.clone();
            self.0
                .tasks
                .spawn(async move { accept(shared, stream, addr).await });
        }
        // Closing the listener: new clients are refused from here on.
        drop(listener);
        let clients = self.0.stop_accepting();
        if self.0.lame_duck.is_cancelled() && !shutdown.is_cancelled() {
            tokio::select! {
                () = crate::lame_duck::run(&self.0, clients) => {}
                () = shutdown.cancelled() => {}
            }
        }
        for client in self.0.clients() {
            client.close.cancel();
        }
        self.0.tasks.close();
        self.0.tasks.wait().await;
        Ok(())
    }

    /// Enters lame duck mode, the way nats-server does on SIGUSR2: [`Server::run`] stops
    /// accepting, sends every connected client an INFO with `"ldm":true`, waits the
    /// grace period, closes the clients spread over the rest of the lame duck duration,
    /// and returns. Asking again while it runs changes nothing.
    pub fn lame_duck(&self) {
        self.0.lame_duck.cancel();
    }

    /// Whether lame duck mode was asked for.
    pub fn in_lame_duck(&self) -> bool {
        self.0.lame_duck.is_cancelled()
    }

    /// Attaches a direct connection named `name` (as `/connz` shows it) whose messages go
    /// to `sink`: the protocol's operations as calls, no bytes ([`crate::direct`]).
    /// `None` once the server takes no more clients (lame duck mode, shutdown) or past
    /// `max_connections`. Any thread may call it; no runtime is needed.
    pub fn attach(&self, name: &str, sink: Arc<dyn Sink>) -> Option<DirectClient> {
        DirectClient::attach(&self.0, name, sink)
    }

    /// [`Server::attach`] as a function, what a direct bus connection is given to
    /// reach this server (`bus::BusOptions::direct`).
    pub fn attacher(&self) -> Attacher {
        let server = self.clone();
        Arc::new(move |name, sink| {
            let client = server.attach(name, sink)?;
            Some(Box::new(client) as Box<dyn Link>)
        })
    }

    /// Connects a client from inside this process, without TCP: the returned stream is
    /// served exactly like an accepted TCP connection (INFO first, then CONNECT, PUB,
    /// HPUB, SUB, UNSUB, PING, queue groups, headers, no_responders, and every limit
    /// of [`Config`]), over an in-memory pipe that buffers
    /// [`Config::in_process_buffer`] bytes each way.
    ///
    /// Authentication applies as for TCP: with [`Config::auth`] set, CONNECT must carry
    /// the credentials. TLS does not: the bytes never leave the process, so the INFO of
    /// an in-process connection never asks for it, whatever [`Config::tls`] says. The
    /// connection counts against `max_connections`, shows in `/connz` with address
    /// `0.0.0.0:0`, and is closed by lame duck mode and shutdown like any other.
    ///
    /// Must be called within a tokio runtime (the connection is served on a task of its
    /// own). Once the server stopped taking clients (lame duck mode or shutdown), the
    /// stream is closed before INFO: reading it gives end-of-file at once.
    pub fn connect_in_process(&self) -> InProcessStream {
        // An empty pipe could never carry a byte: 0 counts as 1.
        let (client_end, server_end) = pipe::pair(self.0.config.in_process_buffer);
        let shared = self.0.clone();
        self.0
            .tasks
            .spawn(async move { accept(shared, server_end, IN_PROCESS_ADDR).await });
        client_end
    }
}

/// Serves one accepted connection (TCP or in-process) until it closes.
async fn accept<S: Transport>(shared: Arc<Shared>, mut stream: S, addr: SocketAddr) {
    let client = match shared.admit(addr, S::IN_PROCESS, None) {
        Ok(client) => client,
        Err(None) => {
            tracing::debug!(%addr, "connection refused: the server takes no more clients");
            return;
        }
        Err(Some(cid)) => {
            if let Some(tally) = FULL_LOG.check() {
                tracing::warn!(%addr, "maximum connections exceeded{tally}");
            }
            let info = shared.info_line(cid, addr, S::IN_PROCESS, false);
            let _ = stream.write_all(&info).await;
            let _ = stream
                .write_all(b"-ERR 'maximum connections exceeded'\r\n")
                .await;
            return;
        }
    };
    let cid = client.cid;
    tracing::debug!(cid, %addr, in_process = S::IN_PROCESS, "client connected");
    let info = shared.info_line(cid, addr, S::IN_PROCESS, false);
    client::serve(shared, client, stream, info).await;
    tracing::debug!(cid, "client closed");
}
