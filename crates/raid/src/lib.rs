//! Software RAID 0, 1, 10, 5 and 6 over [`stria_io::BlockDevice`]s.
//!
//! This crate owns where bytes live on the drives of one array (the target of the file system
//! and of block volumes): geometry, parity through `stria-parity`, per-block CRC32C checked on
//! every read, the write-intent bitmap, the stripe journal that closes the RAID 5/6 write hole,
//! degraded reads, rebuild, resync and scrub. It never opens files or sockets itself (drives
//! arrive as trait objects) and it never returns data it cannot vouch for: a block that fails
//! its checksum is repaired from redundancy or reported as an error.
//!
//! On-disk formats and the recovery design are described in `docs/internals/raid.md`.

mod array;
mod array_assembly;
mod array_members;
mod array_read;
mod array_write;
pub mod bitmap;
pub mod checksum;
pub mod geometry;
pub mod journal;
mod rebuild;
mod scrub;
mod status;
pub mod superblock;

pub use array::{Array, ArrayConfig, CreateOptions, REBUILD_RATE_BYTES_S_DEFAULT};
pub use geometry::{Geometry, Level};
pub use scrub::ScrubReport;
pub use status::{ArrayState, ArrayStatus, MemberStatus, inspect};
pub use stria_parity::Kernel;

use stria_proto::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum RaidError {
    #[error("{0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Io(#[from] stria_io::IoError),
    #[error("{device}: {source}")]
    Superblock { device: String, source: superblock::SuperblockError },
    #[error(
        "{device} belongs to another array ({found}), not to array {expected}: remove it from the list"
    )]
    Foreign { device: String, expected: Uuid, found: Uuid },
    #[error(
        "{first} and {second} carry the same drive id {uuid}: one is a copy of the other; remove one"
    )]
    Duplicate { first: String, second: String, uuid: Uuid },
    #[error(
        "array has failed: {failed} of {drives} drives are out and {level} tolerates {tolerated}; I/O refused so no wrong data is returned"
    )]
    ArrayFailed { level: geometry::Level, drives: usize, failed: usize, tolerated: usize },
    #[error("data at array offset {offset} cannot be recovered: {reason}")]
    Unrecoverable { offset: u64, reason: String },
    #[error("request at offset {offset} length {len} is not 4096-byte aligned")]
    Misaligned { offset: u64, len: u64 },
    #[error("request at offset {offset} length {len} ends past the array end {capacity}")]
    OutOfRange { offset: u64, len: u64, capacity: u64 },
    #[error("{0}")]
    Refused(String),
}
