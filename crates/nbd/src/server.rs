//! The listener side: accepting connections, limits, counters and graceful shutdown.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::export::Exports;
use crate::tls::{TlsConfig, TlsSetupError};
use crate::transport::Transport;
use crate::wire::REQUEST_BYTES_MAX;
use crate::{handshake, transmission};

/// Limits and timeouts of a server. Every field has a safe default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// From accept to entering transmission; idle or slow handshakes are dropped after it.
    pub handshake_timeout: Duration,
    /// Longest the client's socket may take to accept any of the replies being sent. A client
    /// that stops reading is disconnected after it, so it cannot pin server memory.
    pub reply_write_timeout: Duration,
    /// Longest a WRITE payload may take to arrive once its header has; a client that stalls
    /// mid-payload is disconnected (nothing of that write reaches the backend).
    pub payload_read_timeout: Duration,
    /// Connections served at once (handshaking or transmitting); more are closed at accept.
    pub connections_max: usize,
    /// Request and reply data one connection may hold in memory at once. When it is used up
    /// the server stops reading that connection's requests until replies drain.
    pub in_flight_bytes_per_connection_max: usize,
    /// Requests one connection may have in progress at once.
    pub in_flight_requests_per_connection_max: usize,
    /// After shutdown, how long in-flight requests may take before connections are cut.
    pub shutdown_grace: Duration,
    /// TLS (`NBD_OPT_STARTTLS`); `None` serves plain TCP only.
    pub tls: Option<TlsConfig>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            handshake_timeout: Duration::from_secs(10),
            reply_write_timeout: Duration::from_secs(60),
            payload_read_timeout: Duration::from_secs(60),
            connections_max: 256,
            in_flight_bytes_per_connection_max: 128 * 1024 * 1024,
            in_flight_requests_per_connection_max: 256,
            shutdown_grace: Duration::from_secs(30),
            tls: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("invalid server configuration: {0}")]
    Config(&'static str),
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
}

/// Server-wide counters, updated as connections run; read them at any time (for metrics).
#[derive(Debug, Default)]
pub struct ServerStats {
    pub(crate) connections_accepted: AtomicU64,
    pub(crate) connections_active: AtomicU64,
    pub(crate) connections_over_limit: AtomicU64,
    pub(crate) handshakes_failed: AtomicU64,
    pub(crate) refusals: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) protocol_violations: AtomicU64,
    pub(crate) connections_revoked: AtomicU64,
}

/// A copy of [`ServerStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStatsSnapshot {
    pub connections_accepted: u64,
    pub connections_active: u64,
    /// Closed at accept because `connections_max` were open.
    pub connections_over_limit: u64,
    /// Handshakes that ended without transmission for any reason but a clean `NBD_OPT_ABORT`
    /// (timeouts, bad magic, unsupported flags, TLS failures, refused `NBD_OPT_EXPORT_NAME`).
    pub handshakes_failed: u64,
    /// Access-list refusals over all exports.
    pub refusals: u64,
    /// Transmission requests received (all commands).
    pub requests: u64,
    /// Bytes returned by successful reads.
    pub bytes_read: u64,
    /// Bytes stored by successful writes.
    pub bytes_written: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Connections closed because the client broke the protocol (bad magic, oversized write).
    pub protocol_violations: u64,
    /// Connections closed because their export changed under them: removed, its access list
    /// no longer letting the client in, or serving other data or another mode.
    pub connections_revoked: u64,
}

impl ServerStats {
    pub fn snapshot(&self) -> ServerStatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ServerStatsSnapshot {
            connections_accepted: get(&self.connections_accepted),
            connections_active: get(&self.connections_active),
            connections_over_limit: get(&self.connections_over_limit),
            handshakes_failed: get(&self.handshakes_failed),
            refusals: get(&self.refusals),
            requests: get(&self.requests),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            errors: get(&self.errors),
            protocol_violations: get(&self.protocol_violations),
            connections_revoked: get(&self.connections_revoked),
        }
    }
}

pub(crate) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// Stops a running [`Server::serve`]: no new connections, handshakes get
/// `NBD_REP_ERR_SHUTDOWN`, transmission stops reading new requests and closes once in-flight
/// ones are answered (or `shutdown_grace` passes).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    tx: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.tx.send_replace(true);
    }
}

/// One connected client in transmission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientInfo {
    pub peer: SocketAddr,
    pub export: String,
    /// The connection runs TLS.
    pub tls: bool,
    /// When it entered transmission, in seconds since the Unix epoch.
    pub since_unix_s: u64,
}

/// The clients in transmission, shared with whoever lists them.
#[derive(Clone, Debug, Default)]
pub struct Clients {
    inner: Arc<std::sync::Mutex<(u64, std::collections::BTreeMap<u64, ClientInfo>)>>,
}

impl Clients {
    /// Every client in transmission now, oldest first.
    pub fn list(&self) -> Vec<ClientInfo> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.1.values().cloned().collect()
    }

    fn add(&self, client: ClientInfo) -> ClientGuard {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.0 += 1;
        let id = inner.0;
        inner.1.insert(id, client);
        ClientGuard { clients: self.clone(), id }
    }
}

/// Removes a client from the list when its connection ends.
struct ClientGuard {
    clients: Clients,
    id: u64,
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.clients.inner.lock().unwrap_or_else(|e| e.into_inner()).1.remove(&self.id);
    }
}

/// What every connection task shares.
pub(crate) struct Shared {
    pub exports: Exports,
    pub config: ServerConfig,
    pub tls: Option<TlsAcceptor>,
    pub tls_required: bool,
    pub stats: Arc<ServerStats>,
    pub clients: Clients,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("exports", &self.exports)
            .field("config", &self.config)
            .field("tls", &self.tls.is_some())
            .field("stats", &self.stats)
            .finish()
    }
}

/// An NBD server over a shared [`Exports`] registry.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    shutdown: Arc<watch::Sender<bool>>,
}

impl Server {
    /// Checks the configuration and loads TLS material (so bad paths fail here, not at the
    /// first client).
    pub fn new(exports: Exports, config: ServerConfig) -> Result<Server, ServerError> {
        if config.connections_max == 0 {
            return Err(ServerError::Config("connections_max must be at least 1"));
        }
        if config.in_flight_requests_per_connection_max == 0
            || config.in_flight_requests_per_connection_max > Semaphore::MAX_PERMITS
        {
            return Err(ServerError::Config("in_flight_requests_per_connection_max out of range"));
        }
        // One maximal request must fit, or a client asking for it would wait forever.
        if config.in_flight_bytes_per_connection_max < REQUEST_BYTES_MAX as usize
            || config.in_flight_bytes_per_connection_max > u32::MAX as usize
        {
            return Err(ServerError::Config(
                "in_flight_bytes_per_connection_max must be between 32 MiB and 4 GiB - 1",
            ));
        }
        let tls = config.tls.as_ref().map(crate::tls::acceptor).transpose()?;
        let tls_required = config.tls.as_ref().is_some_and(|t| t.required);
        let (tx, _) = watch::channel(false);
        let shared = Shared {
            exports,
            config,
            tls,
            tls_required,
            stats: Arc::default(),
            clients: Clients::default(),
        };
        Ok(Server { shared: Arc::new(shared), shutdown: Arc::new(tx) })
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle { tx: self.shutdown.clone() }
    }

    pub fn stats(&self) -> Arc<ServerStats> {
        self.shared.stats.clone()
    }

    /// The clients in transmission, listable while the server runs.
    pub fn clients(&self) -> Clients {
        self.shared.clients.clone()
    }

    pub fn exports(&self) -> &Exports {
        &self.shared.exports
    }

    /// Serves one connection arriving over an in-memory pipe, as if from `peer`, and returns
    /// when it ends. The handshake and transmission code is the one TCP connections run; tests
    /// and the fuzz targets (crates/fuzzing) use it to drive the server without sockets.
    #[doc(hidden)]
    pub async fn serve_in_memory(&self, stream: tokio::io::DuplexStream, peer: SocketAddr) {
        bump(&self.shared.stats.connections_accepted, 1);
        let shutdown = self.shutdown.subscribe();
        serve_connection(&self.shared, Transport::Memory(stream), peer, shutdown).await;
    }

    /// Serves connections from `listener` until [`ShutdownHandle::shutdown`], then waits for
    /// connections to finish (at most `shutdown_grace`) and returns.
    pub async fn serve(self, listener: TcpListener) -> io::Result<()> {
        let shared = self.shared;
        let connection_slots = Arc::new(Semaphore::new(shared.config.connections_max));
        let mut connections = JoinSet::new();
        let mut shutdown = self.shutdown.subscribe();
        if let Ok(addr) = listener.local_addr() {
            info!(%addr, "NBD server listening");
        }
        loop {
            tokio::select! {
                // The watch guard is dropped inside, so the future stays Send (spawnable).
                _ = async { drop(shutdown.wait_for(|stop| *stop).await) } => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        bump(&shared.stats.connections_accepted, 1);
                        let Ok(slot) = connection_slots.clone().try_acquire_owned() else {
                            bump(&shared.stats.connections_over_limit, 1);
                            warn!(%peer, limit = shared.config.connections_max,
                                "NBD connection refused: too many connections");
                            continue;
                        };
                        let shared = shared.clone();
                        let shutdown = self.shutdown.subscribe();
                        connections.spawn(async move {
                            serve_tcp(&shared, stream, peer, shutdown).await;
                            drop(slot);
                        });
                    }
                    Err(e) => {
                        // Usually out of file descriptors; back off instead of spinning.
                        warn!(error = %e, "NBD accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = connections.join_next(), if !connections.is_empty() => {
                    if let Err(e) = done
                        && e.is_panic()
                    {
                        warn!(error = %e, "NBD connection task panicked");
                    }
                }
            }
        }
        drop(listener);
        info!(connections = connections.len(), "NBD server shutting down");
        let drain = async { while connections.join_next().await.is_some() {} };
        if tokio::time::timeout(shared.config.shutdown_grace, drain).await.is_err() {
            warn!(left = connections.len(), "NBD shutdown grace expired; cutting connections");
            connections.abort_all();
            while connections.join_next().await.is_some() {}
        }
        Ok(())
    }
}

/// Decrements the active-connection gauge however the connection ends.
struct ActiveGuard<'a>(&'a ServerStats);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.connections_active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn serve_tcp(
    shared: &Shared,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    // Replies are whole messages; Nagle would only delay them.
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    serve_connection(shared, Transport::Plain(stream), peer, shutdown).await;
}

async fn serve_connection(
    shared: &Shared,
    transport: Transport,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    bump(&shared.stats.connections_active, 1);
    let _active = ActiveGuard(&shared.stats);
    let handshake = handshake::run(shared, transport, peer, &mut shutdown);
    let negotiated = match tokio::time::timeout(shared.config.handshake_timeout, handshake).await {
        Err(_) => {
            bump(&shared.stats.handshakes_failed, 1);
            debug!(%peer, "NBD handshake timed out");
            return;
        }
        Ok(Err(e)) => {
            bump(&shared.stats.handshakes_failed, 1);
            debug!(%peer, error = %e, "NBD handshake ended");
            return;
        }
        Ok(Ok(None)) => return,
        Ok(Ok(Some(negotiated))) => negotiated,
    };
    let since_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let _listed = shared.clients.add(ClientInfo {
        peer,
        export: negotiated.export_name.clone(),
        tls: matches!(negotiated.transport, Transport::Tls(_)),
        since_unix_s,
    });
    transmission::run(shared, negotiated, shutdown).await;
}
