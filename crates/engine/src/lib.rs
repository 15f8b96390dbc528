//! The chunk engine of one storage target: it stores chunks (pieces of files and volumes,
//! addressed by object id and chunk index) on one RAID array, keeps their map in an embedded
//! transactional store (redb), checks a CRC32C on every 4 KiB block it reads, and recovers to a
//! consistent state after a crash. It never returns bytes that fail their checksum, and it never
//! overwrites a block that the last durable chunk map still names.
//!
//! The on-disk format and the crash-safety argument are in `docs/internals/engine.md`; in short:
//!
//! - **Array**: block 0 is the engine superblock (target id, engine uuid, array uuid, data area
//!   bounds, CRC32C); the rest of the first RAID stripe is reserved; every later 4 KiB block is
//!   data, named by one chunk, or by several after a clone ([`Engine::clone_object`]).
//! - **Chunk map** (redb file `chunkmap.redb` in the caller's directory): table `chunks`,
//!   `(object, index) -> record` (length, extents logical -> physical, one CRC32C per block),
//!   and table `meta` with the identity that must match the superblock.
//! - **Writes are copy-on-write per block**: new blocks are allocated and written, the record is
//!   staged (committed with others later, and durably by the next sync), and the replaced
//!   blocks are parked until the next durable commit. On RAID 5/6, writes smaller than a
//!   stripe are packed into an open stripe held in memory, so the array sees no
//!   partial-stripe updates (`packer.rs`). [`Engine::sync`] flushes the array, then commits
//!   durably, then frees the parked blocks. The free-space map lives in memory and is rebuilt
//!   from the chunk map at open, which is the whole of crash recovery.

mod alloc;
mod cache;
mod commit;
mod crc;
mod engine;
mod error;
mod hash;
mod packer;
// Public only so the fuzz targets (crates/fuzzing) can reach the decoder; not an API.
#[doc(hidden)]
pub mod record;
mod records;
mod shares;
// Public only so the fuzz targets (crates/fuzzing) can reach the decoder; not an API.
#[doc(hidden)]
pub mod superblock;
pub mod testing;
mod usage;

pub use cache::ReadCacheStats;
pub use engine::{Engine, MAP_FILE_NAME, SharingCheck, SpaceStats, WriteDone};
pub use error::EngineError;
pub use packer::Retired;
pub use usage::ObjectUsage;

/// The engine's block: the unit of allocation and of checksums.
pub(crate) const BLOCK: usize = stria_proto::BLOCK_BYTES;
