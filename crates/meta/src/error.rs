//! The one error type of the metadata service and its mapping to [`FsStatus`].

use stria_proto::fs::FsStatus;

/// What a metadata operation can fail with.
///
/// `Fs` errors are the POSIX outcomes a caller returns to the application as they are;
/// `Store` and `Corrupt` are environment failures that map to `EIO`.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// A file-system outcome (ENOENT, EEXIST, EACCES ...) with a short context for logs.
    #[error("{status} ({context})")]
    Fs { status: FsStatus, context: &'static str },
    /// The inline file must first move to chunks ([`crate::Meta::spill_begin`]); nothing changed.
    #[error("inline file must be spilled to chunks first")]
    MustSpill,
    /// The embedded store failed (I/O, full disk, ...).
    #[error("metadata store: {0}")]
    Store(#[from] redb::Error),
    /// A record on disk could not be decoded.
    #[error("corrupt metadata record: {0}")]
    Corrupt(String),
}

impl MetaError {
    /// The status the RPC layer puts on the wire.
    pub fn status(&self) -> FsStatus {
        match self {
            MetaError::Fs { status, .. } => *status,
            MetaError::MustSpill => FsStatus::TooBig,
            MetaError::Store(_) | MetaError::Corrupt(_) => FsStatus::Io,
        }
    }
}

pub type Result<T, E = MetaError> = std::result::Result<T, E>;

/// Shorthand for a file-system outcome.
pub(crate) fn fs(status: FsStatus, context: &'static str) -> MetaError {
    MetaError::Fs { status, context }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for MetaError {
            fn from(e: $t) -> Self {
                MetaError::Store(redb::Error::from(e))
            }
        }
    )*};
}
from_redb!(
    redb::StorageError,
    redb::TransactionError,
    redb::TableError,
    redb::CommitError,
    redb::DatabaseError,
    redb::SetDurabilityError
);
