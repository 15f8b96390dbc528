//! One connection's byte stream: plain TCP until `NBD_OPT_STARTTLS`, TLS after.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_rustls::server::TlsStream;

pub(crate) enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// An in-memory pipe ([`crate::Server::serve_in_memory`]): tests and fuzzing drive the
    /// real protocol code without sockets. `NBD_OPT_STARTTLS` is refused on it.
    Memory(tokio::io::DuplexStream),
}

impl Transport {
    /// The receiving and the sending side, to be driven by two tasks at once. Plain TCP splits
    /// into halves that share nothing; a TLS session (one state for both directions) and the
    /// in-memory pipe split around a lock, which a read waits on while a write is under way.
    pub(crate) fn split(self) -> (TransportReader, TransportWriter) {
        match self {
            Transport::Plain(s) => {
                let (r, w) = s.into_split();
                (TransportReader::Plain(r), TransportWriter::Plain(w))
            }
            shared => {
                let (r, w) = tokio::io::split(shared);
                (TransportReader::Shared(r), TransportWriter::Shared(w))
            }
        }
    }
}

/// The receiving side of a [`Transport`].
pub(crate) enum TransportReader {
    Plain(OwnedReadHalf),
    Shared(ReadHalf<Transport>),
}

/// The sending side of a [`Transport`].
pub(crate) enum TransportWriter {
    Plain(OwnedWriteHalf),
    Shared(WriteHalf<Transport>),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Plain(_) => "Transport::Plain",
            Transport::Tls(_) => "Transport::Tls",
            Transport::Memory(_) => "Transport::Memory",
        })
    }
}

/// Implements `AsyncRead` for an enum whose every variant holds a reader, by delegation.
macro_rules! delegate_read {
    ($ty:ident: $($variant:ident),+) => {
        impl AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }
    };
}

/// Implements `AsyncWrite` for an enum whose every variant holds a writer, by delegation.
macro_rules! delegate_write {
    ($ty:ident: $($variant:ident),+) => {
        impl AsyncWrite for $ty {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_write(cx, buf),)+
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $($ty::$variant(s) => s.is_write_vectored(),)+
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}

delegate_read!(Transport: Plain, Tls, Memory);
delegate_write!(Transport: Plain, Tls, Memory);
delegate_read!(TransportReader: Plain, Shared);
delegate_write!(TransportWriter: Plain, Shared);
