//! The engine's one error type and its mapping to file-system status codes.

use std::path::PathBuf;

use stria_proto::fs::{ChunkId, FsStatus};
use stria_raid::RaidError;

/// Everything an engine call can fail with. The storage service maps it to a wire status with
/// [`EngineError::status`]; nothing else should inspect the variants to pick a status.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Not enough free blocks for the write; nothing stored was changed.
    #[error("no space left on target: {needed_bytes} bytes needed, {free_bytes} free")]
    NoSpace { needed_bytes: u64, free_bytes: u64 },
    /// The caller's CRC32C of the write payload does not match the payload; nothing was written.
    #[error(
        "write payload checksum mismatch: caller sent {expected:#010x}, payload has {actual:#010x}"
    )]
    PayloadChecksum { expected: u32, actual: u32 },
    /// A block read back from the array does not match the CRC32C kept in the chunk map. The
    /// read fails rather than returning the bytes.
    #[error(
        "chunk {chunk} block {block} (array block {physical}) fails its checksum: map has {expected:#010x}, data has {actual:#010x}"
    )]
    Corrupt { chunk: ChunkId, block: u32, physical: u64, expected: u32, actual: u32 },
    /// The request ends past the largest chunk size.
    #[error("chunk {chunk}: range ends at byte {end_bytes}, past the chunk limit {limit_bytes}")]
    TooBig { chunk: ChunkId, end_bytes: u64, limit_bytes: u32 },
    /// A malformed request.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The array refused or failed the I/O.
    #[error("array I/O failed: {0}")]
    Io(#[from] RaidError),
    /// The array failed a batch of packed small writes this write was part of.
    #[error("array I/O failed for a batch of small writes: {0}")]
    PackedWrite(String),
    /// The chunk map store (redb) failed.
    #[error("chunk map store failed: {0}")]
    Store(String),
    /// The chunk map holds a record that cannot be right (bad encoding, overlapping blocks).
    #[error("chunk map is damaged: {0}")]
    MapCorrupt(String),
    /// The chunk map and the array do not belong together.
    #[error("the chunk map does not belong to this array: {0}")]
    WrongArray(String),
    /// Block 0 of the array is not an engine superblock of a format we read.
    #[error("array holds no usable engine superblock: {0}")]
    Superblock(String),
    /// A chunk map file already exists where `create` would write one.
    #[error("a chunk map already exists at {0}; open it instead of creating a new one")]
    Exists(PathBuf),
    /// No chunk map file where `open` expected one.
    #[error("no chunk map at {0}")]
    MissingMap(PathBuf),
    /// An earlier commit or flush failed: the target refuses changes until it is reopened.
    #[error("target is read-only after an earlier failure: {0}")]
    Poisoned(String),
    /// Creating the chunk map's directory failed.
    #[error("chunk map directory: {0}")]
    Dir(#[from] std::io::Error),
}

impl EngineError {
    /// The stable status the storage service puts on the wire for this error.
    pub fn status(&self) -> FsStatus {
        match self {
            EngineError::NoSpace { .. } => FsStatus::NoSpace,
            EngineError::PayloadChecksum { .. } | EngineError::Invalid(_) => FsStatus::Invalid,
            EngineError::TooBig { .. } => FsStatus::TooBig,
            EngineError::Exists(_) => FsStatus::Exists,
            EngineError::MissingMap(_) => FsStatus::NotFound,
            EngineError::Poisoned(_) => FsStatus::ReadOnly,
            EngineError::Corrupt { .. }
            | EngineError::Io(_)
            | EngineError::PackedWrite(_)
            | EngineError::Store(_)
            | EngineError::MapCorrupt(_)
            | EngineError::WrongArray(_)
            | EngineError::Superblock(_)
            | EngineError::Dir(_) => FsStatus::Io,
        }
    }
}

macro_rules! store_error {
    ($($t:ty),*) => {$(
        impl From<$t> for EngineError {
            fn from(e: $t) -> EngineError {
                EngineError::Store(e.to_string())
            }
        }
    )*};
}

store_error!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);
