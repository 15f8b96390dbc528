//! The storage behind an export: a blocking trait the server calls from
//! `tokio::task::spawn_blocking`, so a synchronous client library can sit behind it.

use std::future::Future;
use std::pin::Pin;

use crate::wire::NbdErrno;

/// A boxed future borrowing the backend and the request's buffer.
pub type BackendFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BackendError>> + Send + 'a>>;

/// What [`Backend::read_parts_async`] returns: the bytes read, in order, in the backend's own
/// buffers.
pub type PartsFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<bytes::Bytes>, BackendError>> + Send + 'a>>;

/// One run of the allocation map returned by [`Backend::block_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Bytes in this run; never zero.
    pub length: u64,
    /// Not allocated in the backend (writing here may need new space).
    pub hole: bool,
    /// Reads as all zeroes.
    pub zero: bool,
}

/// The class of a backend failure; decides the error value the client sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// The device or a lower layer failed.
    Io,
    /// Out of space or over a quota.
    NoSpace,
    /// The request made no sense to the backend (range, alignment, arguments).
    Invalid,
    /// The backend is read-only (for example a poisoned target).
    ReadOnly,
    /// The caller lacks permission.
    PermissionDenied,
    /// The operation is not implemented by this backend.
    Unsupported,
    /// The backend is shutting down.
    ShuttingDown,
}

/// A backend failure: a class plus a message for logs and, with structured replies, for the
/// client's user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct BackendError {
    pub kind: BackendErrorKind,
    pub message: String,
}

impl BackendError {
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> BackendError {
        BackendError { kind, message: message.into() }
    }

    pub fn io(message: impl Into<String>) -> BackendError {
        BackendError::new(BackendErrorKind::Io, message)
    }

    pub fn invalid(message: impl Into<String>) -> BackendError {
        BackendError::new(BackendErrorKind::Invalid, message)
    }

    pub fn no_space(message: impl Into<String>) -> BackendError {
        BackendError::new(BackendErrorKind::NoSpace, message)
    }

    /// The NBD error value for this failure; the one place backend errors meet the wire.
    pub fn nbd_errno(&self) -> NbdErrno {
        match self.kind {
            BackendErrorKind::Io => NbdErrno::Io,
            BackendErrorKind::NoSpace => NbdErrno::NoSpace,
            BackendErrorKind::Invalid => NbdErrno::Invalid,
            BackendErrorKind::ReadOnly | BackendErrorKind::PermissionDenied => NbdErrno::Perm,
            // The protocol reserves ENOTSUP for fast-zero requests, which this server does not
            // advertise; an unsupported operation is an invalid request from the client's view.
            BackendErrorKind::Unsupported => NbdErrno::Invalid,
            BackendErrorKind::ShuttingDown => NbdErrno::Shutdown,
        }
    }
}

impl From<std::io::Error> for BackendError {
    fn from(e: std::io::Error) -> BackendError {
        use std::io::ErrorKind as K;
        let kind = match e.kind() {
            K::InvalidInput => BackendErrorKind::Invalid,
            K::PermissionDenied => BackendErrorKind::PermissionDenied,
            K::ReadOnlyFilesystem => BackendErrorKind::ReadOnly,
            K::StorageFull | K::QuotaExceeded | K::FileTooLarge => BackendErrorKind::NoSpace,
            K::Unsupported => BackendErrorKind::Unsupported,
            _ => BackendErrorKind::Io,
        };
        BackendError::new(kind, e.to_string())
    }
}

/// The storage behind one export.
///
/// Every method blocks; the server calls them from the blocking thread pool, many at once,
/// from many connections. The server checks every range against [`Backend::size`] and the
/// advertised 512-byte alignment before calling, so implementations see only in-range,
/// aligned requests of at most 32 MiB of data (TRIM and WRITE_ZEROES may be up to 4 GiB - 1).
/// A request that fails validation never reaches the backend.
pub trait Backend: Send + Sync + 'static {
    /// Size in bytes; a multiple of 512.
    fn size(&self) -> u64;
    /// Fills `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BackendError>;
    /// Writes `data` at `offset`; with `fua` the data is durable before this returns.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BackendError>;
    /// Makes every write that completed before this call durable, whichever connection (and,
    /// when [`Backend::flush_is_global`], whichever server) issued it.
    fn flush(&self) -> Result<(), BackendError>;
    /// The client no longer needs `[offset, offset + len)`; the backend may deallocate it.
    fn trim(&self, offset: u64, len: u64) -> Result<(), BackendError>;
    /// Makes `[offset, offset + len)` read as zeroes; `may_trim` allows deallocating it
    /// (the client did not send `NBD_CMD_FLAG_NO_HOLE`).
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_trim: bool,
        fua: bool,
    ) -> Result<(), BackendError>;
    /// The allocation map of `[offset, offset + len)`: consecutive runs from `offset`, covering
    /// at least a non-empty prefix of the range (they may stop early or run past its end).
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BackendError>;
    /// True when [`Backend::flush`] and FUA cover writes from every connection, so clients
    /// may spread I/O over several connections (`NBD_FLAG_CAN_MULTI_CONN`).
    fn flush_is_global(&self) -> bool {
        true
    }
    /// [`Backend::read`] without the blocking pool, for a backend whose I/O is asynchronous
    /// underneath: the server awaits it on the connection's task, saving two thread hand-offs
    /// per request. `None` (the default): the server calls `read` on the blocking pool.
    fn read_async<'a>(&'a self, _offset: u64, _buf: &'a mut [u8]) -> Option<BackendFuture<'a>> {
        None
    }
    /// [`Backend::read_async`] for a backend whose reads arrive in buffers of its own: the
    /// `len` bytes at `offset` as those buffers, in order (together exactly `len` bytes). The
    /// server sends them after the reply header as they are, with no reply buffer to zero and
    /// copy into. `None` (the default): the server uses `read_async`, or `read`.
    fn read_parts_async(&self, _offset: u64, _len: usize) -> Option<PartsFuture<'_>> {
        None
    }
    /// [`Backend::write`] without the blocking pool; as [`Backend::read_async`].
    fn write_async<'a>(
        &'a self,
        _offset: u64,
        _data: &'a [u8],
        _fua: bool,
    ) -> Option<BackendFuture<'a>> {
        None
    }
    /// [`Backend::trim`] without the blocking pool; as [`Backend::read_async`].
    fn trim_async(&self, _offset: u64, _len: u64) -> Option<BackendFuture<'_>> {
        None
    }
    /// [`Backend::write_zeroes`] without the blocking pool; as [`Backend::read_async`].
    fn write_zeroes_async(
        &self,
        _offset: u64,
        _len: u64,
        _may_trim: bool,
        _fua: bool,
    ) -> Option<BackendFuture<'_>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_map_to_protocol_error_values() {
        let cases = [
            (BackendErrorKind::Io, 5),
            (BackendErrorKind::NoSpace, 28),
            (BackendErrorKind::Invalid, 22),
            (BackendErrorKind::ReadOnly, 1),
            (BackendErrorKind::PermissionDenied, 1),
            (BackendErrorKind::Unsupported, 22),
            (BackendErrorKind::ShuttingDown, 108),
        ];
        for (kind, code) in cases {
            assert_eq!(BackendError::new(kind, "x").nbd_errno().code(), code, "{kind:?}");
        }
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(BackendError::from(full).kind, BackendErrorKind::NoSpace);
    }

    #[test]
    fn backend_is_object_safe() {
        fn takes(_: &std::sync::Arc<dyn Backend>) {}
        let backend: std::sync::Arc<dyn Backend> = std::sync::Arc::new(crate::MemBackend::new(512));
        takes(&backend);
    }
}
