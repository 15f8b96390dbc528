//! What a workload runs against: a [`Target`] (a directory of any mounted file system, Stria's
//! client library, or a block device carved into regions) and the [`DataFile`]s it opens.
//!
//! Paths are relative to the target's root and use `/`. Every workload works inside its own
//! directory and removes it at the end.

use std::io;

/// What kind of target, for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// A directory, through plain POSIX calls.
    Posix,
    /// Stria's client library, bypassing FUSE.
    Native,
    /// A block device (a volume or an NBD export): files are regions of it.
    Block,
}

/// How a data file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenMode {
    pub write: bool,
    /// Create (and truncate) it.
    pub create: bool,
    /// The largest size the file will reach (block targets reserve a region this big).
    pub size_hint: u64,
    /// Every transfer is a multiple of 4 KiB at a 4 KiB-aligned offset, so O_DIRECT is possible.
    pub aligned: bool,
}

/// A directory entry, for `find`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub is_dir: bool,
}

pub trait Target: Send + Sync {
    /// The name in tables and charts (a path, `stria-native`, `nbd://…`).
    fn label(&self) -> String;
    fn kind(&self) -> TargetKind;
    /// Whether directories and names exist (not on block targets).
    fn has_namespace(&self) -> bool {
        true
    }
    fn mkdir(&self, path: &str) -> io::Result<()>;
    fn rmdir(&self, path: &str) -> io::Result<()>;
    fn open(&self, path: &str, mode: OpenMode) -> io::Result<Box<dyn DataFile>>;
    /// The size of a file.
    fn stat(&self, path: &str) -> io::Result<u64>;
    fn unlink(&self, path: &str) -> io::Result<()>;
    fn list(&self, path: &str) -> io::Result<Vec<Entry>>;
    /// Makes the next read of `path` come from the storage, not a cache, as far as the target
    /// allows. Returns how (for the report), e.g. "O_DIRECT" or "fsync + POSIX_FADV_DONTNEED".
    fn drop_cache(&self, path: &str) -> io::Result<()>;
    /// How reads are kept from being served by a cache on this target, in words.
    fn cache_policy(&self, aligned: bool) -> String;
}

/// One open file (or region). Not shared between threads: each worker opens its own.
pub trait DataFile: Send {
    /// Writes all of `data` at `offset`.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Fills all of `buf` from `offset`; reading past the end is an error.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Makes what was written durable.
    fn sync(&mut self) -> io::Result<()>;
    /// Closes, reporting an error a deferred write met.
    fn close(self: Box<Self>) -> io::Result<()>;
}

/// Joins a target-relative path onto a root.
pub(crate) fn join(root: &str, path: &str) -> String {
    if path.is_empty() { root.to_string() } else { format!("{root}/{path}") }
}

pub(crate) fn short_read(offset: u64, wanted: usize, got: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "read {got} of {wanted} bytes at offset {offset}: the file is shorter than written"
        ),
    )
}
