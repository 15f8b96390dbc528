//! One connection's byte stream: plain TCP until `NBD_OPT_STARTTLS`, TLS after.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

pub(crate) enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// An in-memory pipe ([`crate::Server::serve_in_memory`]): tests and fuzzing drive the
    /// real protocol code without sockets. `NBD_OPT_STARTTLS` is refused on it.
    Memory(tokio::io::DuplexStream),
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

/// Runs `$body` with `$s` bound to the stream inside whichever variant `$value` is (each arm
/// has its own type, so the body is written once and expanded per arm).
macro_rules! each_variant {
    ($value:expr, $s:ident => $body:expr, $($variant:path),+) => {
        match $value {
            $($variant($s) => $body,)+
        }
    };
}

/// The reading side's and the writing side's `tokio::io` traits, forwarded to every variant of
/// `$kind`.
macro_rules! forward_io {
    (write $kind:ty, $($variant:path),+) => {
        impl AsyncWrite for $kind {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                each_variant!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf), $($variant),+)
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                each_variant!(
                    self.get_mut(), s => Pin::new(s).poll_write_vectored(cx, bufs), $($variant),+
                )
            }

            fn is_write_vectored(&self) -> bool {
                each_variant!(self, s => s.is_write_vectored(), $($variant),+)
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                each_variant!(self.get_mut(), s => Pin::new(s).poll_flush(cx), $($variant),+)
            }

            fn poll_shutdown(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                each_variant!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx), $($variant),+)
            }
        }
    };
    ($kind:ty, $($variant:path),+) => {
        impl AsyncRead for $kind {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                each_variant!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf), $($variant),+)
            }
        }
    };
}

// A boxed TLS stream forwards like the others: tokio implements the traits for `Box<T>`.
forward_io!(Transport, Transport::Plain, Transport::Tls, Transport::Memory);
forward_io!(write Transport, Transport::Plain, Transport::Tls, Transport::Memory);
forward_io!(ReadHalf, ReadHalf::Plain, ReadHalf::Shared);
forward_io!(write WriteHalf, WriteHalf::Plain, WriteHalf::Shared);

impl Transport {
    /// The reading and the writing side, for the connection's reader and its reply writer.
    /// Plain TCP splits into halves that share no lock: a reader shared with a writer through
    /// a mutex (`tokio::io::split`) blocked its worker thread on the futex while the writer
    /// sent a 1 MiB reply. TLS keeps one session state, so its halves share it that way.
    pub(crate) fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Transport::Plain(s) => {
                let (read, write) = s.into_split();
                (ReadHalf::Plain(read), WriteHalf::Plain(write))
            }
            other => {
                let (read, write) = tokio::io::split(other);
                (ReadHalf::Shared(read), WriteHalf::Shared(write))
            }
        }
    }
}

pub(crate) enum ReadHalf {
    Plain(tokio::net::tcp::OwnedReadHalf),
    Shared(tokio::io::ReadHalf<Transport>),
}

pub(crate) enum WriteHalf {
    Plain(tokio::net::tcp::OwnedWriteHalf),
    Shared(tokio::io::WriteHalf<Transport>),
}
