//! RPC frames: the pure reference decoder (`decode_frame`) and the socket reader
//! (`FrameReader`) must agree frame by frame, every accepted frame must re-encode to exactly
//! the bytes it came from, and the reader must not allocate past its limits.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use stria_rpc::frame::{FrameError, HEADER_BYTES, Limits, decode_frame};
use stria_rpc::io::{FrameReader, READ_BUFFER_BYTES, ReadError};
use tokio::io::{AsyncRead, ReadBuf};

use crate::{largest_allocation_during, mode_and_rest};

/// Small limits, so a declared length past them is easy for the fuzzer to produce and an
/// allocation for it easy to tell from a legitimate one.
pub const FUZZ_LIMITS: Limits = Limits { message_bytes_max: 16 * 1024, data_bytes_max: 256 * 1024 };

/// Most frames looked at per input: enough for pipelining, bounded for speed.
const FRAMES_MAX: usize = 64;

/// Input: one mode byte, then the byte stream a peer sends. Mode bit 0: recompute every
/// header CRC (walking the declared lengths) so mutations reach the checks behind it; bits
/// 1..7: how many bytes the fake socket hands out per read (short reads take the reader's
/// big-payload path).
pub fn rpc_frame(data: &[u8]) {
    let (mode, stream) = mode_and_rest(data);
    let mut stream = stream.to_vec();
    if mode & 1 == 1 {
        fix_header_crcs(&mut stream);
    }
    let chunk = 1 + (mode >> 1) as usize * 97;
    let expected = reference(&stream);
    let mut reader = FrameReader::new(Chunked { data: &stream, at: 0, chunk }, FUZZ_LIMITS);
    let mut offset = 0usize;
    for want in expected {
        let (got, largest) = largest_allocation_during(|| poll_ready(reader.read_frame()));
        if let Some(largest) = largest {
            let bound = 4 * READ_BUFFER_BYTES
                + HEADER_BYTES
                + FUZZ_LIMITS.message_bytes_max as usize
                + FUZZ_LIMITS.data_bytes_max as usize;
            assert!(largest <= bound, "the reader allocated {largest} bytes (bound {bound})");
        }
        match (want, got) {
            (Outcome::Frame(frame_bytes), Ok(Some(incoming))) => {
                let mut again = incoming.header.encode().to_vec();
                again.extend_from_slice(&incoming.message);
                again.extend_from_slice(&incoming.data);
                assert_eq!(again, frame_bytes, "frame at {offset} does not re-encode to its bytes");
                offset += frame_bytes.len();
            }
            (Outcome::End, Ok(None)) => return,
            (Outcome::Truncated, Err(ReadError::Truncated { .. })) => return,
            (Outcome::Refused(want), Err(ReadError::Frame(got))) => {
                assert_eq!(
                    got, want,
                    "reader and reference refuse the frame at {offset} differently"
                );
                return;
            }
            (want, got) => {
                panic!("frame at {offset}: reference says {want:?}, reader says {got:?}")
            }
        }
    }
}

#[derive(Debug)]
enum Outcome {
    Frame(Vec<u8>),
    End,
    Truncated,
    Refused(FrameError),
}

/// What the pure decoder makes of the stream, frame by frame.
fn reference(stream: &[u8]) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut rest = stream;
    while out.len() < FRAMES_MAX {
        match decode_frame(rest, &FUZZ_LIMITS) {
            Ok(Some((frame, used))) => {
                assert!(used >= HEADER_BYTES && used <= rest.len(), "consumed {used} bytes");
                assert_eq!(frame.to_vec(), rest[..used], "decoded frame re-encodes differently");
                out.push(Outcome::Frame(rest[..used].to_vec()));
                rest = &rest[used..];
            }
            Ok(None) if rest.is_empty() => {
                out.push(Outcome::End);
                break;
            }
            Ok(None) => {
                out.push(Outcome::Truncated);
                break;
            }
            Err(e) => {
                out.push(Outcome::Refused(e));
                break;
            }
        }
    }
    out
}

/// Rewrites the CRC of every header in the stream, following the declared lengths.
pub(crate) fn fix_header_crcs(stream: &mut [u8]) {
    let mut at = 0usize;
    while at + HEADER_BYTES <= stream.len() {
        let h = &mut stream[at..at + HEADER_BYTES];
        let crc = crc32c::crc32c(&h[..36]);
        h[36..40].copy_from_slice(&crc.to_le_bytes());
        let len = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) as usize;
        let payload = len(24).saturating_add(len(28));
        at = at.saturating_add(HEADER_BYTES).saturating_add(payload);
    }
}

/// A byte source that never blocks and hands out at most `chunk` bytes per read.
struct Chunked<'a> {
    data: &'a [u8],
    at: usize,
    chunk: usize,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.chunk.min(buf.remaining()).min(self.data.len() - self.at);
        let start = self.at;
        buf.put_slice(&self.data[start..start + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

/// Polls a future whose I/O never blocks; it must finish in one poll.
pub(crate) fn poll_ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a reader over in-memory bytes returned Pending"),
    }
}
