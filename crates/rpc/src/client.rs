//! The client: one pipelined connection to one server address, opened lazily and reopened
//! after it breaks.
//!
//! A call takes a request id, parks a oneshot in the pending map, queues its frame to the
//! writer task and waits. The reader task matches each response to its waiter by request id,
//! in whatever order they come. A call that times out (or is dropped) removes its waiter; a
//! late response for it is discarded. When the connection breaks, every waiter fails with
//! [`RpcError::ConnectionLost`] and the next call connects again.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use stria_proto::fs::FsStatus;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::debug;

use crate::auth::{self, AuthError, ClusterSecret};
use crate::data::Data;
use crate::frame::{self, Frame, FrameError, Kind, Limits, REQUEST_ID_CONNECTION};
use crate::io::{FrameReader, Incoming, Outgoing, writer_loop};
use crate::status;
use crate::transport::{TcpTransport, Transport};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    /// The authentication handshake failed: a secret differs or is missing on one side.
    #[error("{addr} refused the connection: {reason}")]
    Unauthenticated { addr: SocketAddr, reason: String },
    /// The connection broke after the request may have been sent: it may or may not have run.
    #[error("connection to {addr} lost: {reason}")]
    ConnectionLost { addr: SocketAddr, reason: String },
    /// No reply within the call's timeout: the request may or may not have run.
    #[error("call to {addr} (method {method}) timed out after {timeout:?}")]
    Timeout { addr: SocketAddr, method: u16, timeout: Duration },
    /// The server answered with a status other than ok (typed calls only; `call` returns it
    /// in the [`Reply`]).
    #[error("{addr} answered status {status} ({}){}", status::name(*.status), text_of(.message))]
    Status { addr: SocketAddr, status: u16, message: Bytes },
    /// The request would break a frame limit; nothing was sent.
    #[error("request not sent: {0}")]
    TooLarge(FrameError),
    #[error("cannot encode message: {0}")]
    Encode(String),
    #[error("cannot decode reply message: {0}")]
    Decode(String),
}

fn text_of(message: &Bytes) -> String {
    match std::str::from_utf8(message) {
        Ok(text) if !text.is_empty() => format!(": {text}"),
        _ => String::new(),
    }
}

impl RpcError {
    /// Whether sending an idempotent request again could succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            RpcError::Connect { .. } | RpcError::ConnectionLost { .. } => true,
            RpcError::Timeout { .. } => true,
            RpcError::Status { status, .. } => status::is_retryable(*status),
            RpcError::Unauthenticated { .. } => false,
            RpcError::TooLarge(_) | RpcError::Encode(_) | RpcError::Decode(_) => false,
        }
    }

    /// The remote status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            RpcError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The file-system error the server answered with, if any.
    pub fn fs_status(&self) -> Option<FsStatus> {
        self.status().and_then(status::fs_status_from_code)
    }
}

/// A server's answer: its status and both payload parts.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Reply {
    pub status: u16,
    pub message: Bytes,
    pub data: Data,
}

/// Encodes a message part with postcard, refusing anything over the frame limit.
pub fn encode_message<T: Serialize>(value: &T) -> Result<Bytes, RpcError> {
    let bytes = postcard::to_allocvec(value).map_err(|e| RpcError::Encode(e.to_string()))?;
    frame::check_outgoing(bytes.len(), 0).map_err(RpcError::TooLarge)?;
    Ok(Bytes::from(bytes))
}

/// Decodes a message part with postcard.
pub fn decode_message<T: DeserializeOwned>(message: &[u8]) -> Result<T, RpcError> {
    postcard::from_bytes(message).map_err(|e| RpcError::Decode(e.to_string()))
}

/// Client limits and timeouts.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub connect_timeout: Duration,
    /// Calls in flight at once on the connection; more wait (within their timeout).
    pub in_flight_max: usize,
    pub limits: Limits,
    /// A server that accepts no request bytes for this long is given up on.
    pub write_stall_timeout: Duration,
    /// Put a payload CRC on requests.
    pub payload_crc: bool,
    /// Prove this secret to the server on every new connection, and require the server to
    /// prove it too ([`crate::auth`]); within `connect_timeout`.
    pub secret: Option<ClusterSecret>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(5),
            in_flight_max: 4096,
            limits: Limits::default(),
            write_stall_timeout: Duration::from_secs(30),
            payload_crc: true,
            secret: None,
        }
    }
}

/// Bounded retries with exponential backoff, for idempotent calls only.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Tries in all, the first included (at least 1).
    pub attempts_max: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts_max: 4,
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// The pause before try number `attempt + 1` (attempt counts from 1): doubling, capped,
    /// plus up to 50 % jitter so clients that failed together do not retry together.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doubling = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        let base = self.backoff_initial.saturating_mul(doubling).min(self.backoff_max);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        base + base.mul_f64(f64::from(nanos % 1000) / 2000.0)
    }
}

/// Runs `op` until it succeeds, fails with a non-retryable error, or `policy` runs out.
/// Only for operations that may safely run more than once.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, mut op: F) -> Result<T, RpcError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RpcError>>,
{
    let attempts_max = policy.attempts_max.max(1);
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(e) if attempt < attempts_max && e.is_retryable() => {
                debug!(attempt, error = %e, "retrying idempotent call");
                tokio::time::sleep(policy.backoff(attempt)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

type Waiter = oneshot::Sender<Result<Incoming, RpcError>>;

struct PendingMap {
    waiters: HashMap<u64, Waiter>,
    /// Set once the connection is broken; no new waiter is admitted after that.
    closed: Option<String>,
}

struct Shared {
    addr: SocketAddr,
    pending: Mutex<PendingMap>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, PendingMap> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts
        // and removes), so a poisoned lock is still usable.
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }

    /// Marks the connection broken and fails every waiting call.
    fn fail_all(&self, reason: String) {
        let waiters: Vec<Waiter> = {
            let mut pending = self.lock();
            if pending.closed.is_none() {
                debug!(addr = %self.addr, %reason, "connection closed");
                pending.closed = Some(reason.clone());
            }
            pending.waiters.drain().map(|(_, w)| w).collect()
        };
        for waiter in waiters {
            let _ = waiter
                .send(Err(RpcError::ConnectionLost { addr: self.addr, reason: reason.clone() }));
        }
    }
}

struct Connection {
    tx: mpsc::Sender<Outgoing>,
    in_flight: Arc<Semaphore>,
    shared: Arc<Shared>,
    reader: AbortHandle,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Nobody can be waiting (every call holds the connection), so the reader has nothing
        // left to deliver.
        self.reader.abort();
    }
}

/// Removes a call's waiter when the call ends without its reply (timeout, drop).
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u64,
    armed: bool,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.lock().waiters.remove(&self.id);
        }
    }
}

struct ClientInner {
    addr: SocketAddr,
    transport: Arc<dyn Transport>,
    config: ClientConfig,
    next_id: AtomicU64,
    /// The live connection, checked by every call without waiting.
    current: Mutex<Option<Arc<Connection>>>,
    /// Held while connecting so concurrent calls share one new connection.
    connecting: tokio::sync::Mutex<()>,
}

/// A pipelined connection to one server. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("addr", &self.inner.addr).finish_non_exhaustive()
    }
}

impl Client {
    /// A client that connects on its first call (and again after a broken connection).
    pub fn new(addr: SocketAddr, config: ClientConfig) -> Client {
        Client::with_transport(addr, Arc::new(TcpTransport), config)
    }

    pub fn with_transport(
        addr: SocketAddr,
        transport: Arc<dyn Transport>,
        config: ClientConfig,
    ) -> Client {
        assert!(config.in_flight_max > 0);
        Client {
            inner: Arc::new(ClientInner {
                addr,
                transport,
                config,
                next_id: AtomicU64::new(1),
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Connects now with the default configuration, so an unreachable server shows up here.
    pub async fn connect(addr: SocketAddr) -> Result<Client, RpcError> {
        Client::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects now with `config` (its secret, if any, is proven right away).
    pub async fn connect_with(addr: SocketAddr, config: ClientConfig) -> Result<Client, RpcError> {
        let client = Client::new(addr, config);
        client.connection().await?;
        Ok(client)
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Whether a connection is open right now (a later call reconnects if not).
    pub fn is_connected(&self) -> bool {
        self.live_connection().is_some()
    }

    fn live_connection(&self) -> Option<Arc<Connection>> {
        let current = self.inner.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().filter(|c| !c.shared.is_closed()).cloned()
    }

    async fn connection(&self) -> Result<Arc<Connection>, RpcError> {
        if let Some(conn) = self.live_connection() {
            return Ok(conn);
        }
        let inner = &*self.inner;
        let _connecting = inner.connecting.lock().await;
        // Another call may have connected while this one waited for the lock.
        if let Some(conn) = self.live_connection() {
            return Ok(conn);
        }
        let addr = inner.addr;
        let connect = async {
            let mut duplex = inner.transport.connect(addr).await.map_err(AuthError::Io)?;
            if let Some(secret) = &inner.config.secret {
                auth::connect(&mut duplex.reader, &mut duplex.writer, secret).await?;
            }
            Ok(duplex)
        };
        let duplex = match tokio::time::timeout(inner.config.connect_timeout, connect).await {
            Ok(Ok(duplex)) => duplex,
            Ok(Err(AuthError::Io(source))) => return Err(RpcError::Connect { addr, source }),
            Ok(Err(AuthError::Refused(reason))) => {
                return Err(RpcError::Unauthenticated { addr, reason });
            }
            Err(_) => {
                let source = io::Error::new(io::ErrorKind::TimedOut, "connect timed out");
                return Err(RpcError::Connect { addr, source });
            }
        };
        debug!(%addr, "connected");
        let shared = Arc::new(Shared {
            addr,
            pending: Mutex::new(PendingMap { waiters: HashMap::new(), closed: None }),
        });
        // The queue only smooths bursts; the in-flight semaphore is the real bound.
        let (tx, rx) = mpsc::channel::<Outgoing>(1024);
        let writer_shared = shared.clone();
        let stall = inner.config.write_stall_timeout;
        tokio::spawn(async move {
            let reason = match writer_loop(duplex.writer, rx, stall).await {
                Ok(()) => "client closed the connection".to_owned(),
                Err(e) => format!("write failed: {e}"),
            };
            writer_shared.fail_all(reason);
        });
        let reader_shared = shared.clone();
        let reader = FrameReader::new(duplex.reader, inner.config.limits);
        let reader = tokio::spawn(read_responses(reader, reader_shared)).abort_handle();
        let conn = Arc::new(Connection {
            tx,
            in_flight: Arc::new(Semaphore::new(inner.config.in_flight_max)),
            shared,
            reader,
        });
        *inner.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn.clone());
        Ok(conn)
    }

    /// Sends one request and waits for its reply, at most `timeout` in all (connecting
    /// included). The server learns the remaining budget and skips the request if it cannot
    /// start it in time. A non-ok status is a successful call: see [`Reply::status`].
    pub async fn call(
        &self,
        method: u16,
        message: Bytes,
        data: Bytes,
        timeout: Duration,
    ) -> Result<Reply, RpcError> {
        frame::check_outgoing(message.len(), data.len()).map_err(RpcError::TooLarge)?;
        // A timeout too large to add (Duration::MAX as "forever") is capped at a year.
        let now = Instant::now();
        let deadline =
            now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600));
        let addr = self.inner.addr;
        match tokio::time::timeout_at(deadline, self.call_inner(method, message, data, deadline))
            .await
        {
            Ok(result) => result,
            Err(_) => Err(RpcError::Timeout { addr, method, timeout }),
        }
    }

    async fn call_inner(
        &self,
        method: u16,
        message: Bytes,
        data: Bytes,
        deadline: Instant,
    ) -> Result<Reply, RpcError> {
        let addr = self.inner.addr;
        if let Some(service) =
            crate::server::direct_service(addr, self.inner.config.secret.as_ref())
        {
            // A server of this process: its handler runs here, with no connection between.
            let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
            let request = crate::server::Request {
                method,
                request_id: id,
                message,
                data,
                deadline: deadline.into(),
                peer: addr,
            };
            let response = crate::server::call_direct(&*service, request).await;
            return Ok(Reply {
                status: response.status,
                message: response.message,
                data: response.data,
            });
        }
        let conn = self.connection().await?;
        let _permit: OwnedSemaphorePermit = match conn.in_flight.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => unreachable!("the in-flight semaphore is never closed"),
        };
        let addr = conn.shared.addr;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, reply) = oneshot::channel();
        {
            let mut pending = conn.shared.lock();
            if let Some(reason) = &pending.closed {
                return Err(RpcError::ConnectionLost { addr, reason: reason.clone() });
            }
            pending.waiters.insert(id, waiter);
        }
        let mut guard = PendingGuard { shared: &conn.shared, id, armed: true };
        let budget_ms = budget_ms(deadline);
        let frame =
            Frame::request(method, id, budget_ms, message, data, self.inner.config.payload_crc);
        if conn.tx.send(Outgoing::from_frame(frame)).await.is_err() {
            let reason =
                conn.shared.lock().closed.clone().unwrap_or_else(|| "writer stopped".into());
            return Err(RpcError::ConnectionLost { addr, reason });
        }
        let incoming = match reply.await {
            Ok(result) => result?,
            Err(_) => {
                return Err(RpcError::ConnectionLost { addr, reason: "reply dropped".into() });
            }
        };
        guard.armed = false;
        Ok(Reply {
            status: incoming.header.status,
            message: incoming.message,
            data: incoming.data.into(),
        })
    }

    /// [`Client::call`] with retries for idempotent requests: retried on connection loss,
    /// timeouts and retryable statuses (overloaded, shutting down). Each try gets `timeout`.
    pub async fn call_idempotent(
        &self,
        method: u16,
        message: Bytes,
        data: Bytes,
        timeout: Duration,
        policy: &RetryPolicy,
    ) -> Result<Reply, RpcError> {
        retry(policy, || {
            let (message, data) = (message.clone(), data.clone());
            async move {
                let reply = self.call(method, message, data, timeout).await?;
                if status::is_retryable(reply.status) {
                    return Err(RpcError::Status {
                        addr: self.inner.addr,
                        status: reply.status,
                        message: reply.message,
                    });
                }
                Ok(reply)
            }
        })
        .await
    }

    /// A call with a postcard-encoded request and reply message. A non-ok status becomes
    /// [`RpcError::Status`].
    pub async fn call_typed<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u16,
        request: &Req,
        data: Bytes,
        timeout: Duration,
    ) -> Result<(Resp, Data), RpcError> {
        let message = encode_message(request)?;
        let reply = self.call(method, message, data, timeout).await?;
        if reply.status != status::OK {
            return Err(RpcError::Status {
                addr: self.inner.addr,
                status: reply.status,
                message: reply.message,
            });
        }
        Ok((decode_message(&reply.message)?, reply.data))
    }
}

/// Milliseconds left until `deadline`, rounded up so a short timeout never reads as "none"
/// (0) and capped at what the header holds.
fn budget_ms(deadline: Instant) -> u32 {
    let left = deadline.saturating_duration_since(Instant::now());
    let ms = left.as_nanos().div_ceil(1_000_000).max(1);
    u32::try_from(ms).unwrap_or(u32::MAX)
}

async fn read_responses<R: tokio::io::AsyncRead + Unpin>(
    mut reader: FrameReader<R>,
    shared: Arc<Shared>,
) {
    let reason = loop {
        match reader.read_frame().await {
            Ok(Some(incoming)) => {
                let header = incoming.header;
                if header.kind != Kind::Response {
                    break "server sent a request frame".to_owned();
                }
                if header.request_id == REQUEST_ID_CONNECTION {
                    break format!(
                        "server closed the connection: {}{}",
                        status::name(header.status),
                        text_of(&incoming.message)
                    );
                }
                let waiter = shared.lock().waiters.remove(&header.request_id);
                match waiter {
                    Some(waiter) => {
                        let _ = waiter.send(Ok(incoming));
                    }
                    // The call timed out or was dropped; its late reply has no one to go to.
                    None => debug!(id = header.request_id, "reply for a call no longer waiting"),
                }
            }
            Ok(None) => break "server closed the connection".to_owned(),
            Err(e) => break e.to_string(),
        }
    };
    shared.fail_all(reason);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let policy = RetryPolicy {
            attempts_max: 10,
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(100),
        };
        let b1 = policy.backoff(1);
        assert!(b1 >= Duration::from_millis(10) && b1 <= Duration::from_millis(15));
        let b3 = policy.backoff(3);
        assert!(b3 >= Duration::from_millis(40) && b3 <= Duration::from_millis(60));
        let b30 = policy.backoff(30);
        assert!(b30 >= Duration::from_millis(100) && b30 <= Duration::from_millis(150));
    }

    #[tokio::test]
    async fn retry_stops_on_success_and_on_permanent_errors() {
        let policy =
            RetryPolicy { backoff_initial: Duration::from_millis(1), ..Default::default() };
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let mut tries = 0;
        let out = retry(&policy, || {
            tries += 1;
            let fail = tries < 3;
            async move {
                if fail {
                    Err(RpcError::ConnectionLost { addr, reason: "x".into() })
                } else {
                    Ok(7)
                }
            }
        })
        .await;
        assert_eq!(out.unwrap(), 7);
        assert_eq!(tries, 3);

        let mut tries = 0;
        let out: Result<(), _> = retry(&policy, || {
            tries += 1;
            async move { Err(RpcError::Decode("bad".into())) }
        })
        .await;
        assert!(out.is_err());
        assert_eq!(tries, 1);

        let mut tries = 0;
        let out: Result<(), _> = retry(&policy, || {
            tries += 1;
            async move { Err(RpcError::ConnectionLost { addr, reason: "x".into() }) }
        })
        .await;
        assert!(out.is_err());
        assert_eq!(tries, policy.attempts_max);
    }

    #[test]
    fn budget_rounds_up() {
        let now = Instant::now();
        assert_eq!(budget_ms(now), 1);
        let b = budget_ms(now + Duration::from_micros(2500));
        assert!((1..=3).contains(&b));
        assert_eq!(budget_ms(now + Duration::from_secs(100 * 86_400)), u32::MAX);
    }
}
