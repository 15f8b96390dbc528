//! NBD wire constants, limits and message layouts, without I/O.
//!
//! Numbers follow the protocol document (`doc/proto.md` of the NetworkBlockDevice project);
//! everything on the wire is big-endian. Parsing helpers here work on byte slices that the
//! caller has already read completely, so a short or hostile message is an error value, never
//! a panic or an out-of-bounds read.

// ---- Handshake -------------------------------------------------------------------------------

/// `NBDMAGIC`, the first eight bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: follows `NBDMAGIC` in newstyle negotiation and prefixes every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefixes every option reply in fixed newstyle negotiation.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

/// Handshake flags (server → client, 16 bits).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

/// Client flags (client → server, 32 bits).
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;
pub const CLIENT_FLAGS_KNOWN: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;

/// Option numbers.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply types. Errors have bit 31 set.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

/// `NBD_REP_INFO` item types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags (16 bits), sent with the export size.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// The one metadata context this server offers, and the id it is given once selected.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
pub const META_BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` status bits.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// ---- Transmission ----------------------------------------------------------------------------

pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Request header: magic, flags, type, handle, offset, length.
pub const REQUEST_HEADER_BYTES: usize = 4 + 2 + 2 + 8 + 8 + 4;
/// Simple reply header: magic, error, handle.
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 4 + 4 + 8;
/// Structured reply chunk header: magic, flags, type, handle, payload length.
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 4 + 2 + 2 + 8 + 4;
/// Option request header after the magic: option, length.
pub const OPTION_HEADER_BYTES: usize = 8 + 4 + 4;
/// Option reply header: magic, option, reply type, length.
pub const OPTION_REPLY_HEADER_BYTES: usize = 8 + 4 + 4 + 4;
/// The zero padding after an `NBD_OPT_EXPORT_NAME` reply unless `NO_ZEROES` was agreed.
pub const EXPORT_NAME_PADDING_BYTES: usize = 124;

const _: () = assert!(REQUEST_HEADER_BYTES == 28);
const _: () = assert!(SIMPLE_REPLY_HEADER_BYTES == 16);
const _: () = assert!(STRUCTURED_REPLY_HEADER_BYTES == 20);
const _: () = assert!(OPTION_REPLY_HEADER_BYTES == 20);

/// Command types.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

/// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// Bytes in front of the data of a structured `OFFSET_DATA` chunk: header plus offset.
pub const OFFSET_DATA_PREFIX_BYTES: usize = STRUCTURED_REPLY_HEADER_BYTES + 8;

// ---- Limits ----------------------------------------------------------------------------------

/// Advertised block size constraints (`NBD_INFO_BLOCK_SIZE`), enforced on every request.
pub const BLOCK_SIZE_MIN_BYTES: u32 = 512;
pub const BLOCK_SIZE_PREFERRED_BYTES: u32 = 4096;
/// Largest READ, WRITE or WRITE_ZEROES payload accepted; the protocol document's
/// interoperability ceiling, so no well-behaved client is refused.
pub const REQUEST_BYTES_MAX: u32 = 32 * 1024 * 1024;
const _: () = assert!(BLOCK_SIZE_MIN_BYTES.is_power_of_two());
const _: () = assert!(BLOCK_SIZE_PREFERRED_BYTES.is_power_of_two());
const _: () = assert!(BLOCK_SIZE_PREFERRED_BYTES >= BLOCK_SIZE_MIN_BYTES);
const _: () = assert!(REQUEST_BYTES_MAX.is_multiple_of(BLOCK_SIZE_MIN_BYTES));
// A whole read fits one OFFSET_DATA chunk, so replies never need splitting and DF is free.
const _: () = assert!((REQUEST_BYTES_MAX as u64) + 8 <= u32::MAX as u64);

/// Strings (export names, descriptions, messages) are capped by the protocol at 4096 bytes.
pub const STRING_BYTES_MAX: usize = 4096;
/// Option payloads above this are drained unread and answered with `NBD_REP_ERR_TOO_BIG`.
pub const OPTION_DATA_BYTES_MAX: u32 = 64 * 1024;
/// Option payloads above this are treated as an attack: one error reply, then disconnect.
pub const OPTION_DATA_BYTES_HARD_MAX: u32 = 1024 * 1024;
const _: () = assert!(OPTION_DATA_BYTES_MAX as usize >= 2 * STRING_BYTES_MAX + 16);
const _: () = assert!(OPTION_DATA_BYTES_HARD_MAX > OPTION_DATA_BYTES_MAX);
/// Options one connection may send before it must enter transmission.
pub const OPTIONS_PER_HANDSHAKE_MAX: u32 = 256;
/// Block status descriptors in one reply; the client asks again for the rest.
pub const BLOCK_STATUS_DESCRIPTORS_MAX: usize = 16 * 1024;

// ---- Errors ----------------------------------------------------------------------------------

/// Error values carried in replies. These are wire numbers fixed by the protocol (they happen
/// to equal Linux errnos), never reused or renumbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum NbdErrno {
    Perm = 1,
    Io = 5,
    NoMem = 12,
    Invalid = 22,
    NoSpace = 28,
    Overflow = 75,
    Shutdown = 108,
}

impl NbdErrno {
    pub fn code(self) -> u32 {
        self as u32
    }
}

// ---- Requests --------------------------------------------------------------------------------

/// A transmission request header as read from the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// Why a request header could not be used. Either ends the connection: without a valid
/// magic the stream cannot be re-synchronised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("bad request magic {0:#010x}")]
    BadMagic(u32),
}

impl RequestHeader {
    pub fn parse(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, HeaderError> {
        let magic = be_u32(&bytes[0..4]);
        if magic != REQUEST_MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        Ok(RequestHeader {
            flags: be_u16(&bytes[4..6]),
            kind: be_u16(&bytes[6..8]),
            handle: be_u64(&bytes[8..16]),
            offset: be_u64(&bytes[16..24]),
            length: be_u32(&bytes[24..28]),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = [0u8; REQUEST_HEADER_BYTES];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

// ---- Replies ---------------------------------------------------------------------------------

pub fn simple_reply_header(error: u32, handle: u64) -> [u8; SIMPLE_REPLY_HEADER_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_HEADER_BYTES];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out
}

pub fn structured_reply_header(
    flags: u16,
    kind: u16,
    handle: u64,
    payload_len: u32,
) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
    let mut out = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out[16..20].copy_from_slice(&payload_len.to_be_bytes());
    out
}

/// A whole `NBD_REPLY_TYPE_ERROR` chunk (final), with a human-readable message.
pub fn structured_error_chunk(handle: u64, errno: NbdErrno, message: &str) -> Vec<u8> {
    let message = truncate_utf8(message, STRING_BYTES_MAX);
    let payload_len = 4 + 2 + message.len();
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + payload_len);
    out.extend_from_slice(&structured_reply_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        handle,
        payload_len as u32,
    ));
    out.extend_from_slice(&errno.code().to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

/// A whole `NBD_REPLY_TYPE_BLOCK_STATUS` chunk (final) for one context.
pub fn block_status_chunk(handle: u64, context_id: u32, descriptors: &[(u32, u32)]) -> Vec<u8> {
    assert!(!descriptors.is_empty(), "a block status reply needs at least one descriptor");
    let payload_len = 4 + 8 * descriptors.len();
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + payload_len);
    out.extend_from_slice(&structured_reply_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        handle,
        payload_len as u32,
    ));
    out.extend_from_slice(&context_id.to_be_bytes());
    for &(length, flags) in descriptors {
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
    out
}

/// An option reply: header plus payload.
pub fn option_reply(option: u32, reply_type: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_BYTES + payload.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The longest prefix of `s` that is at most `max` bytes and ends on a character boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

// ---- Option payload parsing ------------------------------------------------------------------

/// A cursor over a fully read option payload; every read is bounds-checked.
#[derive(Debug)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
}

/// The option payload is shorter than its own fields claim, or holds an invalid string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed option payload")]
pub struct Malformed;

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if n > self.bytes.len() {
            return Err(Malformed);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    pub fn u16(&mut self) -> Result<u16, Malformed> {
        Ok(be_u16(self.take(2)?))
    }

    pub fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(be_u32(self.take(4)?))
    }

    /// A protocol string: UTF-8, no NUL, at most [`STRING_BYTES_MAX`] bytes.
    pub fn string(&mut self, len: usize) -> Result<String, Malformed> {
        parse_string(self.take(len)?)
    }

    /// A string preceded by its 32-bit length.
    pub fn string_u32(&mut self) -> Result<String, Malformed> {
        let len = self.u32()? as usize;
        self.string(len)
    }
}

pub fn parse_string(bytes: &[u8]) -> Result<String, Malformed> {
    if bytes.len() > STRING_BYTES_MAX || bytes.contains(&0) {
        return Err(Malformed);
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| Malformed)
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_round_trips_and_rejects_bad_magic() {
        let header =
            RequestHeader { flags: 1, kind: CMD_WRITE, handle: 7, offset: 4096, length: 512 };
        let bytes = header.encode();
        assert_eq!(RequestHeader::parse(&bytes), Ok(header));
        let mut bad = bytes;
        bad[0] ^= 0xff;
        assert!(matches!(RequestHeader::parse(&bad), Err(HeaderError::BadMagic(_))));
    }

    #[test]
    fn cursor_never_reads_past_the_payload() {
        let mut c = Cursor::new(&[0, 0, 0, 9, b'a']);
        assert_eq!(c.string_u32(), Err(Malformed));
        let mut c = Cursor::new(&[0, 0, 0, 1, b'a', 0]);
        assert_eq!(c.string_u32().as_deref(), Ok("a"));
        assert_eq!(c.u16(), Err(Malformed));
    }

    #[test]
    fn strings_with_nul_or_bad_utf8_are_malformed() {
        assert_eq!(parse_string(b"a\0b"), Err(Malformed));
        assert_eq!(parse_string(&[0xff, 0xfe]), Err(Malformed));
        assert_eq!(parse_string(&vec![b'x'; STRING_BYTES_MAX + 1]), Err(Malformed));
    }

    #[test]
    fn error_chunk_layout() {
        let chunk = structured_error_chunk(5, NbdErrno::Invalid, "bad");
        assert_eq!(chunk.len(), STRUCTURED_REPLY_HEADER_BYTES + 4 + 2 + 3);
        assert_eq!(&chunk[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&chunk[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&chunk[16..20], &9u32.to_be_bytes());
        assert_eq!(&chunk[20..24], &22u32.to_be_bytes());
        assert_eq!(&chunk[26..], b"bad");
    }

    #[test]
    fn truncate_utf8_keeps_char_boundaries() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }
}
