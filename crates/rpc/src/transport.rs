//! The seam between RPC and the network: something that connects to an address (client side)
//! or accepts connections (server side) and yields a duplex byte stream, already split into a
//! read half and a write half. TCP is the network implementation; RDMA can come later
//! without touching framing, pipelining or deadlines.
//!
//! A server can also take connections from clients of its own process through memory
//! ([`ServerConfig::in_process`](crate::ServerConfig::in_process)): its address is then
//! registered here, and [`TcpTransport`] hands a client that dials it one end of an in-memory
//! pipe instead of a loopback socket. Frames, authentication and deadlines are the same; only
//! the kernel's TCP stack is skipped.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Bytes an in-memory pipe buffers each way: a 1 MiB chunk and its frame fit at once.
const PIPE_BYTES: usize = 2 << 20;

type Registry = Mutex<HashMap<SocketAddr, mpsc::UnboundedSender<Duplex>>>;

/// The addresses served in this process through memory, and how to reach their acceptors.
fn registry() -> &'static Registry {
    static LOCAL: OnceLock<Registry> = OnceLock::new();
    LOCAL.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether a server of this process takes clients at `addr` through memory.
pub fn served_in_process(addr: SocketAddr) -> bool {
    registry().lock().unwrap_or_else(|p| p.into_inner()).contains_key(&addr)
}

/// A connection through memory to the acceptor registered for `addr`, if there is one.
fn connect_in_process(addr: SocketAddr) -> Option<Duplex> {
    let sender = registry().lock().unwrap_or_else(|p| p.into_inner()).get(&addr)?.clone();
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let (their_reader, their_writer) = tokio::io::split(theirs);
    let server_side =
        Duplex { reader: Box::new(their_reader), writer: Box::new(their_writer), peer: addr };
    sender.send(server_side).ok()?;
    let (reader, writer) = tokio::io::split(ours);
    Some(Duplex { reader: Box::new(reader), writer: Box::new(writer), peer: addr })
}

/// A boxed future, as the transport traits return them (no async-trait dependency).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One established connection, split so a reader task and a writer task can own a half each.
pub struct Duplex {
    pub reader: Box<dyn AsyncRead + Send + Unpin>,
    pub writer: Box<dyn AsyncWrite + Send + Unpin>,
    pub peer: SocketAddr,
}

impl fmt::Debug for Duplex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Duplex").field("peer", &self.peer).finish_non_exhaustive()
    }
}

/// Client side: opens connections.
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    fn connect(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Duplex>>;
}

/// Server side: accepts connections.
pub trait Listener: Send + Sync + fmt::Debug + 'static {
    fn accept(&self) -> BoxFuture<'_, io::Result<Duplex>>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// Plain TCP with Nagle off: requests are small and latency-bound, and the writers already
/// batch frames into vectored writes themselves.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpTransport;

fn tcp_duplex(stream: TcpStream, peer: SocketAddr) -> io::Result<Duplex> {
    stream.set_nodelay(true)?;
    let (reader, writer) = stream.into_split();
    Ok(Duplex { reader: Box::new(reader), writer: Box::new(writer), peer })
}

impl Transport for TcpTransport {
    fn connect(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Duplex>> {
        Box::pin(async move {
            if let Some(duplex) = connect_in_process(addr) {
                return Ok(duplex);
            }
            let stream = TcpStream::connect(addr).await?;
            tcp_duplex(stream, addr)
        })
    }
}

/// A bound TCP listening socket, also taking this process's clients through memory when
/// asked to.
#[derive(Debug)]
pub struct TcpAcceptor {
    listener: TcpListener,
    /// Connections from this process, when registered (see the module documentation).
    in_process: Option<tokio::sync::Mutex<mpsc::UnboundedReceiver<Duplex>>>,
}

impl TcpAcceptor {
    pub async fn bind(addr: SocketAddr) -> io::Result<TcpAcceptor> {
        Ok(TcpAcceptor { listener: TcpListener::bind(addr).await?, in_process: None })
    }

    /// Also accepts clients of this process through memory, at the bound address.
    pub fn serve_in_process(mut self) -> io::Result<TcpAcceptor> {
        let addr = self.listener.local_addr()?;
        let (sender, receiver) = mpsc::unbounded_channel();
        registry().lock().unwrap_or_else(|p| p.into_inner()).insert(addr, sender);
        self.in_process = Some(tokio::sync::Mutex::new(receiver));
        Ok(self)
    }
}

impl Drop for TcpAcceptor {
    fn drop(&mut self) {
        if self.in_process.is_some()
            && let Ok(addr) = self.listener.local_addr()
        {
            registry().lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
        }
    }
}

impl Listener for TcpAcceptor {
    fn accept(&self) -> BoxFuture<'_, io::Result<Duplex>> {
        Box::pin(async move {
            let Some(in_process) = &self.in_process else {
                let (stream, peer) = self.listener.accept().await?;
                return tcp_duplex(stream, peer);
            };
            let mut in_process = in_process.lock().await;
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (stream, peer) = accepted?;
                    tcp_duplex(stream, peer)
                }
                Some(duplex) = in_process.recv() => Ok(duplex),
            }
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}
