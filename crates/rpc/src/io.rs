//! Frames over a byte stream: a buffered reader that allocates each payload only after its
//! header has passed every check, and a vectored writer that sends header, message and data
//! without gluing them into one buffer.

use std::io::{self, IoSlice};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::frame::{FrameError, HEADER_BYTES, Header, Limits};

/// Bytes read from the socket at a time for headers and small frames. Big payloads bypass it
/// and are read straight into their own buffer.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Most frames gathered into one vectored write (3 slices each; Linux allows 1024 slices).
pub(crate) const WRITE_BATCH_FRAMES_MAX: usize = 64;
/// Stop adding frames to a batch beyond this many bytes so a burst of big responses does not
/// hold up the small ones queued behind it for too long.
pub(crate) const WRITE_BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("connection closed in the middle of a frame ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

/// A decoded frame as the reader hands it out. The message and data of one frame share one
/// allocation.
#[derive(Debug)]
pub struct Incoming {
    pub header: Header,
    pub message: Bytes,
    pub data: Bytes,
}

#[derive(Debug)]
pub struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    limits: Limits,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R, limits: Limits) -> Self {
        FrameReader { io, buf: BytesMut::with_capacity(READ_BUFFER_BYTES), limits }
    }

    /// The byte stream, for draining it before a close (see [`linger`]).
    pub fn into_inner(self) -> R {
        self.io
    }

    /// Bytes already read but not yet consumed.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Reads whatever the socket has into the buffer; 0 means end of stream. Cancel-safe, so
    /// it can race a shutdown signal while the connection is idle between frames.
    pub async fn fill(&mut self) -> io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < HEADER_BYTES {
            self.buf.reserve(READ_BUFFER_BYTES);
        }
        self.io.read_buf(&mut self.buf).await
    }

    /// Reads one frame. `Ok(None)` is a clean end of stream at a frame boundary. Not
    /// cancel-safe once it has consumed a header: callers race it only against closing.
    pub async fn read_frame(&mut self) -> Result<Option<Incoming>, ReadError> {
        while self.buf.len() < HEADER_BYTES {
            if self.fill().await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(ReadError::Truncated { got: self.buf.len(), want: HEADER_BYTES });
            }
        }
        let head = self.buf.first_chunk::<HEADER_BYTES>().copied().unwrap_or([0; HEADER_BYTES]);
        // The lengths are bounded by `limits` once this returns Ok: only then do we allocate.
        let header = Header::decode(&head, &self.limits)?;
        self.buf.advance(HEADER_BYTES);
        let want = header.payload_len();
        let mut payload = if self.buf.len() >= want {
            self.buf.split_to(want)
        } else {
            // Big payload: give it its own buffer of exactly the declared size, move over the
            // few bytes already read, and let the socket fill the rest in place.
            let mut payload = BytesMut::with_capacity(want);
            payload.put(self.buf.split());
            while payload.len() < want {
                let remaining = want - payload.len();
                let n = self.io.read_buf(&mut (&mut payload).limit(remaining)).await?;
                if n == 0 {
                    return Err(ReadError::Truncated {
                        got: HEADER_BYTES + payload.len(),
                        want: HEADER_BYTES + want,
                    });
                }
            }
            payload
        };
        let message = payload.split_to(header.message_len as usize).freeze();
        let data = payload.freeze();
        header.verify_payload(&message, &data)?;
        Ok(Some(Incoming { header, message, data }))
    }
}

/// Longest a closing side keeps reading (and discarding) so its goodbye frame is not lost.
const LINGER: Duration = Duration::from_millis(500);
/// Most bytes discarded while lingering.
const LINGER_BYTES_MAX: usize = 1024 * 1024;

/// Reads and discards what the peer still sends, briefly, after our side has said goodbye.
/// Closing a TCP socket with unread bytes makes the kernel send a reset, and a reset can make
/// the peer drop our last frame unread; draining first lets the goodbye arrive.
pub(crate) async fn linger<R: AsyncRead + Unpin>(mut io: R) {
    let mut scratch = vec![0u8; 8192];
    let mut discarded = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while discarded < LINGER_BYTES_MAX {
            match io.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => discarded += n,
            }
        }
    })
    .await;
}

/// A frame ready to go out: the encoded header and the two payload parts, written with one
/// vectored write (possibly together with other frames).
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub header: [u8; HEADER_BYTES],
    pub message: Bytes,
    pub data: Bytes,
    /// The writer closes the connection once this frame is out (a goodbye frame).
    pub close_after: bool,
}

impl Outgoing {
    pub fn from_frame(frame: crate::frame::Frame) -> Outgoing {
        Outgoing {
            header: frame.header.encode(),
            message: frame.message,
            data: frame.data,
            close_after: false,
        }
    }

    pub fn len(&self) -> usize {
        HEADER_BYTES + self.message.len() + self.data.len()
    }
}

/// Writes every frame of `batch` in order, gathering them into vectored writes. Fails when
/// one write makes no progress for `stall_timeout` (a peer that stopped reading).
pub(crate) async fn write_frames<W: AsyncWrite + Unpin>(
    io: &mut W,
    batch: &[Outgoing],
    stall_timeout: Duration,
) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(batch.len() * 3);
    for frame in batch {
        slices.push(IoSlice::new(&frame.header));
        if !frame.message.is_empty() {
            slices.push(IoSlice::new(&frame.message));
        }
        if !frame.data.is_empty() {
            slices.push(IoSlice::new(&frame.data));
        }
    }
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = match tokio::time::timeout(stall_timeout, io.write_vectored(rest)).await {
            Ok(written) => written?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("peer accepted no bytes for {stall_timeout:?}"),
                ));
            }
        };
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "peer stopped accepting bytes"));
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    io.flush().await
}

/// The writer half of a connection: takes frames from `rx`, batches what is queued, writes it.
/// Returns when the channel closes (every sender gone), after a frame marked `close_after`,
/// or with the error that broke the connection. Shuts the write side down in every case.
pub(crate) async fn writer_loop<W: AsyncWrite + Unpin>(
    mut io: W,
    mut rx: mpsc::Receiver<Outgoing>,
    stall_timeout: Duration,
) -> io::Result<()> {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(WRITE_BATCH_FRAMES_MAX);
    let result = loop {
        let Some(first) = rx.recv().await else { break Ok(()) };
        let mut last = first.close_after;
        let mut bytes = first.len();
        batch.push(first);
        while !last && batch.len() < WRITE_BATCH_FRAMES_MAX && bytes < WRITE_BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(next) => {
                    last = next.close_after;
                    bytes += next.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let written = write_frames(&mut io, &batch, stall_timeout).await;
        batch.clear();
        if let Err(e) = written {
            break Err(e);
        }
        if last {
            break Ok(());
        }
    };
    // Closing the receiver first makes every queued or future send fail at once, which is
    // how the other tasks of the connection learn that it is gone.
    rx.close();
    let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::frame::Frame;

    #[tokio::test]
    async fn frames_survive_a_byte_at_a_time_pipe() {
        let (mut a, b) = tokio::io::duplex(1);
        let frames: Vec<Frame> = (0..5u64)
            .map(|i| {
                Frame::request(
                    9,
                    i + 1,
                    0,
                    Bytes::from(vec![i as u8; i as usize * 3]),
                    Bytes::from(vec![0xAA; 100_000 * i as usize]),
                    i % 2 == 0,
                )
            })
            .collect();
        let sent = frames.clone();
        let writer = tokio::spawn(async move {
            let out: Vec<Outgoing> = sent.into_iter().map(Outgoing::from_frame).collect();
            write_frames(&mut a, &out, Duration::from_secs(5)).await.unwrap();
        });
        let mut reader = FrameReader::new(b, Limits::default());
        for f in &frames {
            let got = reader.read_frame().await.unwrap().unwrap();
            assert_eq!(got.header, f.header);
            assert_eq!(got.message, f.message);
            assert_eq!(got.data, f.data);
        }
        writer.await.unwrap();
        assert!(reader.read_frame().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn truncated_payload_is_an_error() {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let frame = Frame::request(1, 1, 0, Bytes::new(), Bytes::from(vec![1u8; 1000]), true);
        let bytes = frame.to_vec();
        a.write_all(&bytes[..500]).await.unwrap();
        drop(a);
        let mut reader = FrameReader::new(b, Limits::default());
        assert!(matches!(
            reader.read_frame().await,
            Err(ReadError::Truncated { got: 500, want: 1040 })
        ));
    }
}
