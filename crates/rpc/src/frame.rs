//! The on-wire frame: a fixed 40-byte little-endian header, then the message bytes, then the
//! bulk data bytes. Everything here is pure (no I/O) so that it can be unit-tested and fuzzed;
//! `io.rs` drives it over a socket.
//!
//! ```text
//!  0       4    5    6        8        10       12                20       24       28       32       36       40
//!  | magic | ver|kind| flags  | method | status | request id      | budget | msg len| data len| pay crc| hdr crc|
//!  |  u32  | u8 | u8 |  u16   |  u16   |  u16   |      u64        | u32 ms |  u32   |  u32   |  u32   |  u32   |
//! ```
//!
//! The header CRC32C covers bytes 0..36 (so it protects the payload CRC field as well). The
//! payload CRC32C covers the message then the data and is only meaningful when
//! [`FLAG_PAYLOAD_CRC`] is set; otherwise it must be zero.

use bytes::Bytes;

/// "SRPC" read as a little-endian u32: the first four bytes on the wire are `S R P C`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SRPC");
/// The only header layout this code speaks. A peer with another version is refused.
pub const VERSION: u8 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_BYTES: usize = 40;

/// Largest postcard-encoded message part of one frame.
pub const MESSAGE_BYTES_MAX: u32 = 4 * 1024 * 1024;
/// Largest raw data part of one frame: the largest chunk plus room for a little framing slack.
pub const DATA_BYTES_MAX: u32 = 32 * 1024 * 1024 + 64 * 1024;

/// The payload CRC field is set and covers message + data.
pub const FLAG_PAYLOAD_CRC: u16 = 1 << 0;
/// Every flag this version understands; a frame with any other bit set is refused.
pub const FLAGS_KNOWN: u16 = FLAG_PAYLOAD_CRC;

/// Request id 0 is never used by a call: a response frame carrying it is the peer's last word
/// on a connection it is about to close (status says why, message is UTF-8 text).
pub const REQUEST_ID_CONNECTION: u64 = 0;

// A chunk (the largest thing the storage service moves in one call) must fit in one frame.
const _: () = assert!(DATA_BYTES_MAX >= stria_proto::fs::CHUNK_BYTES_MAX);
// Both lengths together must not overflow the u32/usize arithmetic of the reader.
const _: () = assert!((MESSAGE_BYTES_MAX as u64 + DATA_BYTES_MAX as u64) < u32::MAX as u64);
const _: () = assert!(HEADER_BYTES == 40);

/// Whether a frame asks or answers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Kind {
    Request = 0,
    Response = 1,
}

/// The size bounds a reader enforces. Defaults are the protocol maxima; a service may lower
/// them (never raise them: the constants are what every peer promises to accept).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Limits {
    pub message_bytes_max: u32,
    pub data_bytes_max: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { message_bytes_max: MESSAGE_BYTES_MAX, data_bytes_max: DATA_BYTES_MAX }
    }
}

/// The decoded fixed header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Header {
    pub kind: Kind,
    pub flags: u16,
    pub method: u16,
    /// 0 on requests; the outcome on responses (see [`crate::status`]).
    pub status: u16,
    pub request_id: u64,
    /// Requests: milliseconds the caller is still willing to wait, 0 = no deadline.
    /// Responses: 0.
    pub budget_ms: u32,
    pub message_len: u32,
    pub data_len: u32,
    /// CRC32C of message then data when [`FLAG_PAYLOAD_CRC`] is set, else 0.
    pub payload_crc: u32,
}

/// Why a frame was refused. Every variant closes the connection it arrived on.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {found:#010x} (not a Stria RPC peer)")]
    BadMagic { found: u32 },
    #[error("unsupported protocol version {found} (this side speaks {VERSION})")]
    BadVersion { found: u8 },
    #[error("header checksum mismatch: header says {expected:#010x}, bytes give {actual:#010x}")]
    HeaderChecksum { expected: u32, actual: u32 },
    #[error("unknown frame kind {found}")]
    BadKind { found: u8 },
    #[error("unknown flags {found:#06x}")]
    BadFlags { found: u16 },
    #[error("payload checksum field is {found:#010x} but the checksum flag is clear")]
    StrayPayloadChecksum { found: u32 },
    #[error("message of {len} bytes exceeds the limit of {max}")]
    MessageTooLarge { len: u32, max: u32 },
    #[error("data of {len} bytes exceeds the limit of {max}")]
    DataTooLarge { len: u32, max: u32 },
    #[error("payload checksum mismatch: header says {expected:#010x}, bytes give {actual:#010x}")]
    PayloadChecksum { expected: u32, actual: u32 },
    #[error("unexpected {found:?} frame")]
    UnexpectedKind { found: Kind },
}

impl Header {
    /// Serialises the header and fills in its CRC. Lengths are not checked here (the reader
    /// checks them), which lets tests build hostile frames with the real encoder.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.kind as u8;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..10].copy_from_slice(&self.method.to_le_bytes());
        b[10..12].copy_from_slice(&self.status.to_le_bytes());
        b[12..20].copy_from_slice(&self.request_id.to_le_bytes());
        b[20..24].copy_from_slice(&self.budget_ms.to_le_bytes());
        b[24..28].copy_from_slice(&self.message_len.to_le_bytes());
        b[28..32].copy_from_slice(&self.data_len.to_le_bytes());
        b[32..36].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = stria_proto::crc32c(&b[0..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and validates a header. Checks run in this order so the error names the most
    /// useful cause: magic (is this our protocol at all), version (can we read the layout),
    /// header CRC (are the remaining fields trustworthy), then kind, flags and lengths.
    /// Lengths are checked before anyone allocates for them.
    pub fn decode(b: &[u8; HEADER_BYTES], limits: &Limits) -> Result<Header, FrameError> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        if b[4] != VERSION {
            return Err(FrameError::BadVersion { found: b[4] });
        }
        let expected = u32_at(36);
        let actual = stria_proto::crc32c(&b[0..36]);
        if expected != actual {
            return Err(FrameError::HeaderChecksum { expected, actual });
        }
        let kind = match b[5] {
            0 => Kind::Request,
            1 => Kind::Response,
            found => return Err(FrameError::BadKind { found }),
        };
        let flags = u16_at(6);
        if flags & !FLAGS_KNOWN != 0 {
            return Err(FrameError::BadFlags { found: flags });
        }
        let message_len = u32_at(24);
        if message_len > limits.message_bytes_max {
            return Err(FrameError::MessageTooLarge {
                len: message_len,
                max: limits.message_bytes_max,
            });
        }
        let data_len = u32_at(28);
        if data_len > limits.data_bytes_max {
            return Err(FrameError::DataTooLarge { len: data_len, max: limits.data_bytes_max });
        }
        let payload_crc = u32_at(32);
        if flags & FLAG_PAYLOAD_CRC == 0 && payload_crc != 0 {
            return Err(FrameError::StrayPayloadChecksum { found: payload_crc });
        }
        Ok(Header {
            kind,
            flags,
            method: u16_at(8),
            status: u16_at(10),
            request_id: u64::from_le_bytes([
                b[12], b[13], b[14], b[15], b[16], b[17], b[18], b[19],
            ]),
            budget_ms: u32_at(20),
            message_len,
            data_len,
            payload_crc,
        })
    }

    /// Bytes of message and data that follow this header.
    pub fn payload_len(&self) -> usize {
        self.message_len as usize + self.data_len as usize
    }

    /// Checks the payload CRC when the frame carries one.
    pub fn verify_payload(&self, message: &[u8], data: &[u8]) -> Result<(), FrameError> {
        if self.flags & FLAG_PAYLOAD_CRC == 0 {
            return Ok(());
        }
        let actual = payload_crc(message, data);
        if actual != self.payload_crc {
            return Err(FrameError::PayloadChecksum { expected: self.payload_crc, actual });
        }
        Ok(())
    }
}

/// CRC32C of the message followed by the data.
pub fn payload_crc(message: &[u8], data: &[u8]) -> u32 {
    stria_proto::crc32c_append(stria_proto::crc32c(message), data)
}

/// One whole frame: header plus its two payload parts. `message` and `data` are separate
/// `Bytes` so bulk data is never copied into a contiguous buffer with the header.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Frame {
    pub header: Header,
    pub message: Bytes,
    pub data: Bytes,
}

impl Frame {
    /// A request frame; lengths and (when `checksum`) the payload CRC are filled in.
    /// The caller guarantees the parts fit the protocol maxima (see [`check_outgoing`]).
    pub fn request(
        method: u16,
        request_id: u64,
        budget_ms: u32,
        message: Bytes,
        data: Bytes,
        checksum: bool,
    ) -> Frame {
        Frame::build(Kind::Request, method, 0, request_id, budget_ms, message, data, checksum)
    }

    /// A response frame; see [`Frame::request`].
    pub fn response(
        method: u16,
        status: u16,
        request_id: u64,
        message: Bytes,
        data: Bytes,
        checksum: bool,
    ) -> Frame {
        Frame::build(Kind::Response, method, status, request_id, 0, message, data, checksum)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        kind: Kind,
        method: u16,
        status: u16,
        request_id: u64,
        budget_ms: u32,
        message: Bytes,
        data: Bytes,
        checksum: bool,
    ) -> Frame {
        let (flags, crc) =
            if checksum { (FLAG_PAYLOAD_CRC, payload_crc(&message, &data)) } else { (0, 0) };
        let header = Header {
            kind,
            flags,
            method,
            status,
            request_id,
            budget_ms,
            message_len: message.len() as u32,
            data_len: data.len() as u32,
            payload_crc: crc,
        };
        Frame { header, message, data }
    }

    /// The whole frame as one contiguous buffer (tests and fuzzing; the socket path writes
    /// the three parts with one vectored write instead).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_BYTES + self.header.payload_len());
        v.extend_from_slice(&self.header.encode());
        v.extend_from_slice(&self.message);
        v.extend_from_slice(&self.data);
        v
    }
}

/// Refuses to send what the peer would refuse to read.
pub fn check_outgoing(message_len: usize, data_len: usize) -> Result<(), FrameError> {
    if message_len > MESSAGE_BYTES_MAX as usize {
        return Err(FrameError::MessageTooLarge {
            len: u32::try_from(message_len).unwrap_or(u32::MAX),
            max: MESSAGE_BYTES_MAX,
        });
    }
    if data_len > DATA_BYTES_MAX as usize {
        return Err(FrameError::DataTooLarge {
            len: u32::try_from(data_len).unwrap_or(u32::MAX),
            max: DATA_BYTES_MAX,
        });
    }
    Ok(())
}

/// Decodes one frame from the front of `buf`. Returns `Ok(None)` when more bytes are needed,
/// `Ok(Some((frame, consumed)))` otherwise. Nothing is allocated before the header has been
/// validated, and then only the declared (bounded) payload. This is the reference decoder
/// that the socket reader mirrors; fuzz targets drive it directly.
pub fn decode_frame(buf: &[u8], limits: &Limits) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(head) = buf.first_chunk::<HEADER_BYTES>() else {
        return Ok(None);
    };
    let header = Header::decode(head, limits)?;
    let end = HEADER_BYTES + header.payload_len();
    if buf.len() < end {
        return Ok(None);
    }
    let message = &buf[HEADER_BYTES..HEADER_BYTES + header.message_len as usize];
    let data = &buf[HEADER_BYTES + header.message_len as usize..end];
    header.verify_payload(message, data)?;
    let frame = Frame {
        header,
        message: Bytes::copy_from_slice(message),
        data: Bytes::copy_from_slice(data),
    };
    Ok(Some((frame, end)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample(checksum: bool) -> Frame {
        Frame::request(
            2001,
            77,
            1500,
            Bytes::from_static(b"hello"),
            Bytes::from(vec![7u8; 3000]),
            checksum,
        )
    }

    fn decode_all(bytes: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
        decode_frame(bytes, &Limits::default())
    }

    /// Rewrites header bytes and fixes the header CRC, so a test reaches the check after it.
    fn patch(bytes: &mut [u8], at: usize, value: &[u8]) {
        bytes[at..at + value.len()].copy_from_slice(value);
        let crc = stria_proto::crc32c(&bytes[0..36]);
        bytes[36..40].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn round_trip_with_and_without_checksum() {
        for checksum in [true, false] {
            let frame = sample(checksum);
            let bytes = frame.to_vec();
            assert_eq!(bytes.len(), 40 + 5 + 3000);
            assert_eq!(&bytes[0..4], b"SRPC");
            let (back, used) = decode_all(&bytes).unwrap().unwrap();
            assert_eq!(used, bytes.len());
            assert_eq!(back, frame);
        }
    }

    #[test]
    fn short_input_asks_for_more() {
        let bytes = sample(true).to_vec();
        for cut in [0, 1, 39, 40, 44, bytes.len() - 1] {
            assert_eq!(decode_all(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn rejects_bad_magic() {
        let mut bytes = sample(true).to_vec();
        bytes[0] = b'X';
        assert!(matches!(decode_all(&bytes), Err(FrameError::BadMagic { .. })));
    }

    #[test]
    fn rejects_other_version() {
        let mut bytes = sample(true).to_vec();
        patch(&mut bytes, 4, &[2]);
        assert_eq!(decode_all(&bytes), Err(FrameError::BadVersion { found: 2 }));
    }

    #[test]
    fn rejects_header_checksum_mismatch() {
        let mut bytes = sample(true).to_vec();
        bytes[12] ^= 1; // request id, crc not fixed
        assert!(matches!(decode_all(&bytes), Err(FrameError::HeaderChecksum { .. })));
    }

    #[test]
    fn rejects_unknown_kind_and_flags() {
        let mut bytes = sample(true).to_vec();
        patch(&mut bytes, 5, &[9]);
        assert_eq!(decode_all(&bytes), Err(FrameError::BadKind { found: 9 }));
        let mut bytes = sample(true).to_vec();
        patch(&mut bytes, 6, &0x8001u16.to_le_bytes());
        assert_eq!(decode_all(&bytes), Err(FrameError::BadFlags { found: 0x8001 }));
    }

    #[test]
    fn rejects_stray_payload_checksum() {
        let mut bytes = sample(false).to_vec();
        patch(&mut bytes, 32, &5u32.to_le_bytes());
        assert_eq!(decode_all(&bytes), Err(FrameError::StrayPayloadChecksum { found: 5 }));
    }

    #[test]
    fn rejects_oversized_lengths_from_the_header_alone() {
        // Only the 40 header bytes are present: the verdict must not wait for (or allocate)
        // the declared payload.
        let mut bytes = sample(true).to_vec();
        patch(&mut bytes, 24, &(MESSAGE_BYTES_MAX + 1).to_le_bytes());
        assert_eq!(
            decode_all(&bytes[..40]),
            Err(FrameError::MessageTooLarge { len: MESSAGE_BYTES_MAX + 1, max: MESSAGE_BYTES_MAX })
        );
        let mut bytes = sample(true).to_vec();
        patch(&mut bytes, 28, &u32::MAX.to_le_bytes());
        assert_eq!(
            decode_all(&bytes[..40]),
            Err(FrameError::DataTooLarge { len: u32::MAX, max: DATA_BYTES_MAX })
        );
        // A lowered limit is honoured too.
        let small = Limits { message_bytes_max: 4, data_bytes_max: 1 << 20 };
        assert!(matches!(
            decode_frame(&sample(true).to_vec(), &small),
            Err(FrameError::MessageTooLarge { len: 5, max: 4 })
        ));
    }

    #[test]
    fn rejects_payload_checksum_mismatch() {
        let mut bytes = sample(true).to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        assert!(matches!(decode_all(&bytes), Err(FrameError::PayloadChecksum { .. })));
        // Without the flag the same corruption goes unnoticed: that is the caller's choice.
        let mut bytes = sample(false).to_vec();
        bytes[last] ^= 0x40;
        assert!(decode_all(&bytes).unwrap().is_some());
    }

    /// xorshift64*, so a failing case is reproducible from its iteration number.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    #[test]
    fn every_single_byte_corruption_is_caught() {
        let bytes = sample(true).to_vec();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..5000 {
            let mut bad = bytes.clone();
            let at = (next(&mut rng) % bad.len() as u64) as usize;
            let flip = (next(&mut rng) % 255 + 1) as u8;
            bad[at] ^= flip;
            let got = decode_all(&bad);
            assert!(got.is_err(), "byte {at} ^ {flip:#04x} went unnoticed: {got:?}");
        }
    }

    #[test]
    fn random_input_never_panics() {
        let mut rng = 1u64;
        for round in 0..3000 {
            let len = (next(&mut rng) % 200) as usize;
            let mut buf: Vec<u8> = (0..len).map(|_| next(&mut rng) as u8).collect();
            if round % 2 == 0 && len >= 4 {
                buf[0..4].copy_from_slice(b"SRPC"); // get past the magic check half the time
            }
            let _ = decode_all(&buf);
        }
    }

    #[test]
    fn outgoing_limits() {
        assert!(check_outgoing(MESSAGE_BYTES_MAX as usize, DATA_BYTES_MAX as usize).is_ok());
        assert!(check_outgoing(MESSAGE_BYTES_MAX as usize + 1, 0).is_err());
        assert!(check_outgoing(0, DATA_BYTES_MAX as usize + 1).is_err());
    }

    #[test]
    fn header_layout_is_stable() {
        // A fixture: these bytes are what version 1 puts on the wire for this header.
        let h = Header {
            kind: Kind::Response,
            flags: 0,
            method: 0x0102,
            status: 0x0304,
            request_id: 0x05060708090a0b0c,
            budget_ms: 0x0d0e0f10,
            message_len: 0x11,
            data_len: 0x12,
            payload_crc: 0,
        };
        let b = h.encode();
        assert_eq!(
            &b[..36],
            &[
                b'S', b'R', b'P', b'C', 1, 1, 0, 0, 0x02, 0x01, 0x04, 0x03, 0x0c, 0x0b, 0x0a, 0x09,
                0x08, 0x07, 0x06, 0x05, 0x10, 0x0f, 0x0e, 0x0d, 0x11, 0, 0, 0, 0x12, 0, 0, 0, 0, 0,
                0, 0
            ]
        );
        assert_eq!(Header::decode(&b, &Limits::default()), Ok(h));
    }
}
