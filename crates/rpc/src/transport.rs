//! The seam between RPC and the network: something that connects to an address (client side)
//! or accepts connections (server side) and yields a duplex byte stream, already split into a
//! read half and a write half. TCP is the only implementation today; RDMA can come later
//! without touching framing, pipelining or deadlines.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

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
            let stream = TcpStream::connect(addr).await?;
            tcp_duplex(stream, addr)
        })
    }
}

/// A bound TCP listening socket.
#[derive(Debug)]
pub struct TcpAcceptor {
    listener: TcpListener,
}

impl TcpAcceptor {
    pub async fn bind(addr: SocketAddr) -> io::Result<TcpAcceptor> {
        Ok(TcpAcceptor { listener: TcpListener::bind(addr).await? })
    }
}

impl Listener for TcpAcceptor {
    fn accept(&self) -> BoxFuture<'_, io::Result<Duplex>> {
        Box::pin(async move {
            let (stream, peer) = self.listener.accept().await?;
            tcp_duplex(stream, peer)
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}
