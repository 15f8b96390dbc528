//! The server: accepts connections, decodes request frames, runs each request as its own task
//! and writes responses back in completion order.
//!
//! Per connection there is one reader (this file's `connection`) and one writer task
//! (`io::writer_loop`). The reader stops reading while `in_flight_per_connection_max`
//! requests are running, which pushes back on the client through TCP. A frame that breaks the
//! protocol gets a goodbye frame (status [`status::BAD_FRAME`]) and closes that connection
//! only; nothing is allocated for a payload before its header has passed every check.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use stria_proto::fs::FsStatus;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::auth::{self, AuthError, ClusterSecret};
use crate::data::Data;
use crate::frame::{self, Frame, Kind, Limits, REQUEST_ID_CONNECTION};
use crate::io::{FrameReader, Outgoing, ReadError, linger, writer_loop};
use crate::status;
use crate::transport::{BoxFuture, Duplex, Listener, TcpAcceptor};

/// One request as a service sees it.
#[derive(Debug)]
pub struct Request {
    pub method: u16,
    pub request_id: u64,
    /// The postcard-encoded part (see [`Request::decode`]).
    pub message: Bytes,
    /// The raw bulk part, exactly as the client sent it.
    pub data: Bytes,
    /// When the caller stops waiting. A handler doing long work should give up by then.
    pub deadline: Instant,
    pub peer: SocketAddr,
}

impl Request {
    /// Decodes the message part; a failure is already the [`status::BAD_REQUEST`] response to
    /// send back, so handlers can write `let req: Foo = match req.decode() { .. }` or use `?`
    /// inside a helper returning `Result<Response, Response>`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, Response> {
        postcard::from_bytes(&self.message).map_err(|e| {
            Response::error(status::BAD_REQUEST, format!("cannot decode request message: {e}"))
        })
    }

    /// Time left until the deadline (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// What a service answers.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Response {
    pub status: u16,
    pub message: Bytes,
    pub data: Data,
}

impl Response {
    pub fn ok(message: Bytes, data: impl Into<Data>) -> Response {
        Response { status: status::OK, message, data: data.into() }
    }

    /// An ok response whose message part is `value`, postcard-encoded. An encoding failure
    /// (a bug, or a value over the message limit) becomes an [`status::INTERNAL`] response.
    pub fn encode<T: Serialize>(value: &T, data: impl Into<Data>) -> Response {
        match crate::client::encode_message(value) {
            Ok(message) => Response::ok(message, data),
            Err(e) => Response::error(status::INTERNAL, format!("cannot encode response: {e}")),
        }
    }

    /// A failed response with a text explanation (the rule for transport codes).
    pub fn error(code: u16, text: impl Into<String>) -> Response {
        Response { status: code, message: Bytes::from(text.into()), data: Data::new() }
    }

    /// A failed response with any code and message (service codes with a typed body).
    pub fn with_status(code: u16, message: Bytes, data: impl Into<Data>) -> Response {
        Response { status: code, message, data: data.into() }
    }

    /// A file-system error, as `3000 + n`, with an empty message.
    pub fn fs_error(fs: FsStatus) -> Response {
        Response::with_status(status::fs_status_code(fs), Bytes::new(), Bytes::new())
    }
}

/// A service: gets every request of a server and answers it. Requests run concurrently, so
/// implementations share state through `&self`.
pub trait Service: Send + Sync + 'static {
    fn call(&self, request: Request) -> BoxFuture<'static, Response>;
}

type Handler = Box<dyn Fn(Request) -> BoxFuture<'static, Response> + Send + Sync>;

/// A [`Service`] built from one handler per method number; other methods get
/// [`status::UNKNOWN_METHOD`].
#[derive(Default)]
pub struct Router {
    routes: HashMap<u16, Handler>,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut methods: Vec<_> = self.routes.keys().collect();
        methods.sort();
        f.debug_struct("Router").field("methods", &methods).finish()
    }
}

impl Router {
    pub fn new() -> Router {
        Router::default()
    }

    /// Adds the handler of `method`. Registering a method twice is a bug.
    pub fn route<F, Fut>(mut self, method: u16, handler: F) -> Router
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let previous = self.routes.insert(method, Box::new(move |req| Box::pin(handler(req))));
        assert!(previous.is_none(), "method {method} registered twice");
        self
    }
}

impl Service for Router {
    fn call(&self, request: Request) -> BoxFuture<'static, Response> {
        match self.routes.get(&request.method) {
            Some(handler) => handler(request),
            None => {
                let method = request.method;
                Box::pin(async move {
                    Response::error(status::UNKNOWN_METHOD, format!("no method {method}"))
                })
            }
        }
    }
}

/// Server limits and timeouts.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Connections served at once; one more gets an [`status::OVERLOADED`] goodbye.
    pub connections_max: usize,
    /// Requests running at once per connection; beyond it the server stops reading.
    pub in_flight_per_connection_max: usize,
    pub limits: Limits,
    /// The deadline of a request that carries none (budget 0).
    pub deadline_default: Duration,
    /// Once the first byte of a frame has arrived, the rest must follow within this time.
    pub frame_read_timeout: Duration,
    /// A peer that accepts no bytes of a response for this long is disconnected.
    pub write_stall_timeout: Duration,
    /// Put a payload CRC on responses.
    pub payload_crc: bool,
    /// When set, a connection is served only after its peer proves it holds this secret
    /// ([`crate::auth`]); until then nothing but the handshake is read from it.
    pub secret: Option<ClusterSecret>,
    /// A peer that has not finished the authentication handshake by then is disconnected.
    pub handshake_timeout: Duration,
    /// Let clients of this process that hold the server's secret call the service directly,
    /// with no connection (see [`served_in_process`]); for a node that runs roles and their
    /// clients together. Every other client connects as usual.
    pub in_process: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            connections_max: 1024,
            in_flight_per_connection_max: 256,
            limits: Limits::default(),
            deadline_default: Duration::from_secs(60),
            frame_read_timeout: Duration::from_secs(30),
            write_stall_timeout: Duration::from_secs(30),
            payload_crc: true,
            secret: None,
            handshake_timeout: Duration::from_secs(10),
            in_process: false,
        }
    }
}

/// A bound, not yet serving, RPC server.
pub struct Server {
    listener: Box<dyn Listener>,
    local_addr: SocketAddr,
    config: ServerConfig,
    shutdown: Arc<watch::Sender<bool>>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

/// Stops a server: no new connections, no new requests; running requests finish and their
/// responses are sent, then `serve` returns.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    tx: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.tx.send_replace(true);
    }
}

impl Server {
    /// Binds a TCP listener with the default configuration (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr) -> io::Result<Server> {
        Server::bind_with(addr, ServerConfig::default()).await
    }

    pub async fn bind_with(addr: SocketAddr, config: ServerConfig) -> io::Result<Server> {
        Server::with_listener(Box::new(TcpAcceptor::bind(addr).await?), config)
    }

    /// A server on any transport.
    pub fn with_listener(listener: Box<dyn Listener>, config: ServerConfig) -> io::Result<Server> {
        assert!(config.connections_max > 0 && config.in_flight_per_connection_max > 0);
        assert!(config.connections_max <= u32::MAX as usize);
        assert!(config.in_flight_per_connection_max <= u32::MAX as usize);
        let local_addr = listener.local_addr()?;
        let (tx, _) = watch::channel(false);
        Ok(Server { listener, local_addr, config, shutdown: Arc::new(tx) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle { tx: self.shutdown.clone() }
    }

    /// Serves until [`ShutdownHandle::shutdown`], then waits for every connection to drain.
    pub async fn serve(self, service: Arc<dyn Service>) -> io::Result<()> {
        let Server { listener, local_addr, config, shutdown } = self;
        if config.in_process {
            direct_services()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(local_addr, (service.clone(), config.secret.clone()));
        }
        let config = Arc::new(config);
        let slots = Arc::new(Semaphore::new(config.connections_max));
        let mut stop = shutdown.subscribe();
        loop {
            let accepted = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                accepted = listener.accept() => accepted,
            };
            let duplex = match accepted {
                Ok(duplex) => duplex,
                Err(e) => {
                    // Typically EMFILE: back off a little instead of spinning.
                    warn!(%local_addr, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match slots.clone().try_acquire_owned() {
                Ok(slot) => {
                    let service = service.clone();
                    let config = config.clone();
                    let stop = shutdown.subscribe();
                    tokio::spawn(async move {
                        if let Some(duplex) = authenticate(duplex, &config).await {
                            connection(duplex, service, config, stop).await;
                        }
                        drop(slot);
                    });
                }
                Err(_) => {
                    warn!(peer = %duplex.peer, max = config.connections_max, "connection refused: limit reached");
                    tokio::spawn(refuse(
                        duplex,
                        status::OVERLOADED,
                        "connection limit reached".into(),
                    ));
                }
            }
        }
        drop(listener);
        if config.in_process {
            direct_services().lock().unwrap_or_else(|p| p.into_inner()).remove(&local_addr);
        }
        debug!(%local_addr, "stopped accepting; draining connections");
        // Every connection task holds one slot until its writer is done.
        let _all = slots.acquire_many(config.connections_max as u32).await;
        Ok(())
    }
}

fn goodbye(code: u16, text: &str) -> Outgoing {
    let frame = Frame::response(
        0,
        code,
        REQUEST_ID_CONNECTION,
        Bytes::from(text.to_owned()),
        Bytes::new(),
        false,
    );
    Outgoing { close_after: true, ..Outgoing::from_frame(frame) }
}

async fn refuse(duplex: Duplex, code: u16, text: String) {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.send(goodbye(code, &text)).await;
    drop(tx);
    let _ = writer_loop(duplex.writer, rx, Duration::from_secs(1)).await;
    linger(duplex.reader).await;
}

/// Runs the server's half of the handshake when a secret is configured. A peer that fails
/// it gets a goodbye saying why and is dropped; `None` then.
async fn authenticate(mut duplex: Duplex, config: &ServerConfig) -> Option<Duplex> {
    let Some(secret) = &config.secret else { return Some(duplex) };
    let peer = duplex.peer;
    let handshake = auth::accept(&mut duplex.reader, &mut duplex.writer, secret);
    let reason = match tokio::time::timeout(config.handshake_timeout, handshake).await {
        Ok(Ok(())) => {
            debug!(%peer, "peer authenticated");
            return Some(duplex);
        }
        Ok(Err(AuthError::Refused(reason))) => reason,
        Ok(Err(AuthError::Io(e))) => {
            debug!(%peer, error = %e, "connection ended during the authentication handshake");
            return None;
        }
        Err(_) => format!("no authentication handshake within {:?}", config.handshake_timeout),
    };
    warn!(%peer, %reason, "connection refused: not authenticated");
    refuse(duplex, status::UNAUTHENTICATED, reason).await;
    None
}

enum Stop {
    Eof,
    Shutdown,
    WriterGone,
    Io(io::Error),
    Bad(String),
}

async fn connection(
    duplex: Duplex,
    service: Arc<dyn Service>,
    config: Arc<ServerConfig>,
    mut shutdown: watch::Receiver<bool>,
) {
    let peer = duplex.peer;
    debug!(%peer, "connection accepted");
    let in_flight_max = config.in_flight_per_connection_max;
    let (tx, rx) = mpsc::channel::<Outgoing>(in_flight_max + 1);
    let writer = tokio::spawn(writer_loop(duplex.writer, rx, config.write_stall_timeout));
    let in_flight = Arc::new(Semaphore::new(in_flight_max));
    let mut reader = FrameReader::new(duplex.reader, config.limits);

    let stop = loop {
        if reader.buffered() == 0 {
            // Idle between frames: the only place a shutdown is taken, so a frame is never
            // cut in half by it.
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|s| *s) => break Stop::Shutdown,
                _ = tx.closed() => break Stop::WriterGone,
                filled = reader.fill() => match filled {
                    Ok(0) => break Stop::Eof,
                    Ok(_) => {}
                    Err(e) => break Stop::Io(e),
                },
            }
        }
        let incoming =
            match tokio::time::timeout(config.frame_read_timeout, reader.read_frame()).await {
                Err(_) => {
                    break Stop::Bad(format!(
                        "frame not completed within {:?}",
                        config.frame_read_timeout
                    ));
                }
                Ok(Ok(Some(incoming))) => incoming,
                Ok(Ok(None)) => break Stop::Eof,
                Ok(Err(ReadError::Io(e))) => break Stop::Io(e),
                Ok(Err(e)) => break Stop::Bad(e.to_string()),
            };
        let header = incoming.header;
        if header.kind != Kind::Request {
            break Stop::Bad(frame::FrameError::UnexpectedKind { found: header.kind }.to_string());
        }
        if header.request_id == REQUEST_ID_CONNECTION {
            break Stop::Bad("request id 0 is reserved".to_owned());
        }
        let received = Instant::now();
        let deadline = if header.budget_ms == 0 {
            received + config.deadline_default
        } else {
            received + Duration::from_millis(u64::from(header.budget_ms))
        };
        // Backpressure: while the connection is at its limit we read nothing more.
        let permit = tokio::select! {
            permit = in_flight.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break Stop::WriterGone,
            },
            _ = tx.closed() => break Stop::WriterGone,
        };
        let request = Request {
            method: header.method,
            request_id: header.request_id,
            message: incoming.message,
            data: incoming.data,
            deadline,
            peer,
        };
        let service = service.clone();
        let tx = tx.clone();
        let checksum = config.payload_crc;
        tokio::spawn(async move {
            let response = if Instant::now() >= deadline {
                Response::error(status::DEADLINE_EXCEEDED, "deadline passed before the request ran")
            } else {
                run_service(&*service, request).await
            };
            let response = checked(response, header.method, peer);
            let frame = Frame::response(
                header.method,
                response.status,
                header.request_id,
                response.message,
                // A connection sends one buffer (a copy when the handler answered with more).
                response.data.into_bytes(),
                checksum,
            );
            // A send error means the connection is gone; the response has nowhere to go.
            let _ = tx.send(Outgoing::from_frame(frame)).await;
            drop(permit);
        });
    };

    let said_goodbye = match stop {
        Stop::Bad(reason) => {
            warn!(%peer, %reason, "closing connection after a bad frame");
            tx.send(goodbye(status::BAD_FRAME, &reason)).await.is_ok()
        }
        Stop::Shutdown => {
            // Let running requests queue their responses first, then say goodbye.
            let _all = in_flight.acquire_many(in_flight_max as u32).await;
            tx.send(goodbye(status::SHUTTING_DOWN, "server shutting down")).await.is_ok()
        }
        Stop::Io(e) => {
            debug!(%peer, error = %e, "connection read failed");
            false
        }
        Stop::Eof | Stop::WriterGone => {
            debug!(%peer, "connection closed by peer");
            false
        }
    };
    drop(tx);
    match writer.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(%peer, error = %e, "connection write failed"),
        Err(e) => warn!(%peer, error = %e, "connection writer task failed"),
    }
    if said_goodbye {
        linger(reader.into_inner()).await;
    }
    debug!(%peer, "connection done");
}

/// Never send what the peer must refuse: an oversized response becomes an error response.
fn checked(response: Response, method: u16, peer: SocketAddr) -> Response {
    match frame::check_outgoing(response.message.len(), response.data.len()) {
        Ok(()) => response,
        Err(e) => {
            warn!(%peer, method, error = %e, "handler produced an oversized response");
            Response::error(status::INTERNAL, format!("response too large: {e}"))
        }
    }
}

/// A service of this process that its clients may call directly, and the secret its server
/// requires (see [`direct_service`]).
type Direct = (Arc<dyn Service>, Option<ClusterSecret>);

fn direct_services() -> &'static std::sync::Mutex<std::collections::HashMap<SocketAddr, Direct>> {
    static DIRECT: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<SocketAddr, Direct>>,
    > = std::sync::OnceLock::new();
    DIRECT.get_or_init(Default::default)
}

/// Whether a server of this process serves `addr` with [`ServerConfig::in_process`].
pub fn served_in_process(addr: SocketAddr) -> bool {
    direct_services().lock().unwrap_or_else(|p| p.into_inner()).contains_key(&addr)
}

/// The service a server of this process with [`ServerConfig::in_process`] serves at `addr`,
/// if a client holding `secret` may call it directly: no connection, no frames, the handler
/// runs on the caller's task. The server must require no secret, or this one.
pub(crate) fn direct_service(
    addr: SocketAddr,
    secret: Option<&ClusterSecret>,
) -> Option<Arc<dyn Service>> {
    let services = direct_services().lock().unwrap_or_else(|p| p.into_inner());
    let (service, required) = services.get(&addr)?;
    match (required, secret) {
        (None, _) => Some(service.clone()),
        (Some(required), Some(held)) if required.same_as(held) => Some(service.clone()),
        _ => None,
    }
}

/// Runs one request of a client of this process on the service directly, with the same panic
/// and size checks as a request from a connection.
pub(crate) async fn call_direct(service: &dyn Service, request: Request) -> Response {
    let (method, peer) = (request.method, request.peer);
    if Instant::now() >= request.deadline {
        return Response::error(
            status::DEADLINE_EXCEEDED,
            "deadline passed before the request ran",
        );
    }
    checked(run_service(service, request).await, method, peer)
}

/// Runs a handler, turning a panic into an [`status::INTERNAL`] response so one bad request
/// cannot take the connection down with it.
async fn run_service(service: &dyn Service, request: Request) -> Response {
    let method = request.method;
    let future = match std::panic::catch_unwind(AssertUnwindSafe(|| service.call(request))) {
        Ok(future) => future,
        Err(_) => return panicked(method),
    };
    CatchUnwind(future).await.unwrap_or_else(|()| panicked(method))
}

fn panicked(method: u16) -> Response {
    warn!(method, "request handler panicked");
    Response::error(status::INTERNAL, "request handler panicked")
}

struct CatchUnwind(BoxFuture<'static, Response>);

impl Future for CatchUnwind {
    type Output = Result<Response, ()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(Poll::Ready(response)) => Poll::Ready(Ok(response)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready(Err(())),
        }
    }
}
