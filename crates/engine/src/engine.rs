//! The engine: chunk reads and writes, copy-on-write at 4 KiB block granularity.

use std::hash::{Hash, Hasher};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, StorageBackend};
use serde::{Deserialize, Serialize};
use stria_proto::Uuid;
use stria_proto::fs::{CHUNK_BYTES_MAX, ChunkId, ObjectId, TargetId};
use stria_raid::Array;

use crate::alloc::{Allocator, Run};
use crate::cache::{BlockCache, Lookups, SMALL_IO_BLOCKS};
use crate::commit::{self, CHUNKS, Committer, META};
use crate::packer::{Cached, Packer, Retired};
use crate::record::{BlockRef, ChunkRecord, blocks_for, runs_of};
use crate::records::RecordCache;
use crate::superblock::{FORMAT_VERSION, Superblock};
use crate::{BLOCK, EngineError};

mod clones;

/// File name of the chunk map inside the directory the caller gives.
pub const MAP_FILE_NAME: &str = "chunkmap.redb";
/// Chunk locks are striped over this many reader-writer locks (by chunk id hash).
const CHUNK_LOCK_STRIPES: usize = 1024;
/// Largest single array request the engine issues; larger runs are split.
const ARRAY_IO_BYTES_MAX: usize = 4 * 1024 * 1024;

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteDone {
    /// The chunk's length after the write.
    pub chunk_len: u32,
}

/// Space on the target, in bytes of the data area (the reserved first stripe excluded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpaceStats {
    pub total_bytes: u64,
    /// Held by live chunks.
    pub used_bytes: u64,
    /// Allocatable now.
    pub free_bytes: u64,
    /// Freed by changes not yet durable; free after the next sync (a write that runs out of
    /// space syncs and takes them).
    pub reclaimable_bytes: u64,
    pub chunks: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct Identity {
    format_version: u32,
    target: u32,
    engine_uuid: [u8; 16],
    array_uuid: [u8; 16],
}

/// The chunk engine of one target. All methods take `&self` and may be called from many
/// threads; see the crate documentation for the format and the crash-safety argument.
pub struct Engine {
    array: Arc<Array>,
    /// Dropped by hand: redb promotes non-durable commits at close, which is only safe after the
    /// array is flushed (see `Drop`).
    db: ManuallyDrop<Database>,
    sb: Superblock,
    locks: Box<[RwLock<()>]>,
    alloc: Mutex<Allocator>,
    /// Small writes on parity arrays; None on other levels.
    packer: Option<Packer>,
    /// Blocks of small reads and writes (see `cache`); off until sized.
    cache: BlockCache,
    /// Decoded records of recently used chunks (see `records`).
    records: RecordCache,
    committer: Committer,
    chunks: AtomicU64,
    /// Copies begun and not finished (`clones`).
    clones: clones::Clones,
    /// Large reads still to pass over before one is tried from memory again (see
    /// [`Engine::read_if_in_memory`]).
    large_probe_skips: AtomicU32,
}

/// After a large read missed memory, this many more go straight to the blocking path before
/// one tries memory again.
const LARGE_PROBE_BACKOFF: u32 = 16;

/// The largest read answered from memory on an async worker (1 MiB): checking its CRCs takes
/// some 100 µs there.
const MEMORY_READ_BLOCKS_MAX: u64 = 256;

// The storage service shares one engine between all its request threads.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Engine>();
};

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("target", &self.sb.target).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn key(chunk: ChunkId) -> (u64, u64) {
    (chunk.object.0, chunk.index)
}

/// What [`Engine::check_sharing`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharingCheck {
    /// Blocks named by more than one record.
    pub shared_blocks: u64,
    /// Of those, blocks a record of an object that never shares names.
    pub wrongly_shared_blocks: u64,
}

/// Blocks to take one new copy of, and where they go in the chunk.
struct Segment {
    first_block: u32,
    bytes: Vec<u8>,
}

impl Engine {
    /// Formats `array` for a new target and creates its chunk map in `dir` (which may not hold
    /// one already).
    pub fn create(array: Arc<Array>, dir: &Path, target: TargetId) -> Result<Engine, EngineError> {
        let path = dir.join(MAP_FILE_NAME);
        if path.exists() {
            return Err(EngineError::Exists(path));
        }
        std::fs::create_dir_all(dir)?;
        let db = Database::builder().create(&path)?;
        let engine = Engine::format(array, db, target)?;
        // The new file's directory entry must be durable too, or a crash could lose the map.
        std::fs::File::open(dir)?.sync_all()?;
        Ok(engine)
    }

    /// Opens the target whose chunk map is in `dir`: checks that the map and the array belong
    /// together, then rebuilds the free-space map from the chunk map.
    pub fn open(array: Arc<Array>, dir: &Path) -> Result<Engine, EngineError> {
        let path: PathBuf = dir.join(MAP_FILE_NAME);
        if !path.exists() {
            return Err(EngineError::MissingMap(path));
        }
        let db = Database::builder().open(&path)?;
        Engine::load(array, db)
    }

    /// As [`Engine::create`], with the chunk map on a caller's redb backend (tests use
    /// [`crate::testing::MemMapStore`] to simulate crashes).
    pub fn create_with_backend(
        array: Arc<Array>,
        backend: impl StorageBackend,
        target: TargetId,
    ) -> Result<Engine, EngineError> {
        let db = Database::builder().create_with_backend(backend)?;
        if read_identity(&db)?.is_some() {
            return Err(EngineError::Invalid("the backend already holds a chunk map".into()));
        }
        Engine::format(array, db, target)
    }

    /// As [`Engine::open`], with the chunk map on a caller's redb backend.
    pub fn open_with_backend(
        array: Arc<Array>,
        backend: impl StorageBackend,
    ) -> Result<Engine, EngineError> {
        let db = Database::builder().create_with_backend(backend)?;
        Engine::load(array, db)
    }

    fn format(array: Arc<Array>, db: Database, target: TargetId) -> Result<Engine, EngineError> {
        let block_count = array.capacity_bytes() / BLOCK as u64;
        let stripe_blocks = (array.geometry().stripe_data_bytes() / BLOCK as u64).max(1);
        // The whole first stripe is reserved so data runs stay stripe-aligned; block 0 of it
        // holds the superblock.
        let data_start_block = stripe_blocks;
        if block_count <= data_start_block {
            return Err(EngineError::Invalid(format!(
                "array of {} bytes is too small for a chunk engine",
                array.capacity_bytes()
            )));
        }
        let sb = Superblock {
            target,
            engine_uuid: Uuid::random(),
            array_uuid: array.uuid(),
            data_start_block,
            block_count,
        };
        let identity = Identity {
            format_version: FORMAT_VERSION,
            target: target.0,
            engine_uuid: sb.engine_uuid.0,
            array_uuid: sb.array_uuid.0,
        };
        // Superblock first, durable, then the map's identity: a crash in between leaves a map
        // without identity, which open refuses, never a map that matches a foreign array.
        array.write(0, &sb.encode())?;
        array.flush()?;
        let tx = db.begin_write()?;
        {
            let mut meta = tx.open_table(META)?;
            let bytes = postcard::to_allocvec(&identity)
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            meta.insert("identity", bytes.as_slice())?;
            tx.open_table(CHUNKS)?;
        }
        tx.commit()?;
        tracing::info!(%target, "chunk engine created");
        Engine::assemble(array, db, sb, Vec::new(), 0)
    }

    fn load(array: Arc<Array>, db: Database) -> Result<Engine, EngineError> {
        let mut block0 = vec![0u8; BLOCK];
        array.read(0, &mut block0)?;
        let sb = Superblock::decode(&block0).map_err(EngineError::Superblock)?;
        let identity = read_identity(&db)?
            .ok_or_else(|| EngineError::WrongArray("the chunk map has no identity".into()))?;
        if identity.engine_uuid != sb.engine_uuid.0 || identity.target != sb.target.0 {
            return Err(EngineError::WrongArray(format!(
                "the array is target {} (engine {}), the chunk map is target {} (engine {})",
                sb.target,
                hex(&sb.engine_uuid.0),
                TargetId(identity.target),
                hex(&identity.engine_uuid)
            )));
        }
        if sb.array_uuid != array.uuid() || identity.array_uuid != array.uuid().0 {
            return Err(EngineError::WrongArray(format!(
                "the engine was created on array {}, this is array {}",
                hex(&sb.array_uuid.0),
                hex(&array.uuid().0)
            )));
        }
        if sb.block_count > array.capacity_bytes() / BLOCK as u64 {
            return Err(EngineError::WrongArray(format!(
                "the engine expects {} blocks, the array has {}",
                sb.block_count,
                array.capacity_bytes() / BLOCK as u64
            )));
        }
        // Recovery: every block named by a committed record is used, everything else is free.
        // Blocks written for changes that never committed are thereby free again.
        let mut used = Vec::new();
        let mut chunks = 0u64;
        {
            let tx = db.begin_read()?;
            let table = tx.open_table(CHUNKS)?;
            for entry in table.iter()? {
                let (k, v) = entry?;
                let (object, index) = k.value();
                let rec = ChunkRecord::decode(v.value()).map_err(|e| {
                    EngineError::MapCorrupt(format!("chunk {object:016x}:{index}: {e}"))
                })?;
                used.extend(rec.physical_runs());
                chunks += 1;
            }
        }
        tracing::info!(target = %sb.target, chunks, "chunk engine opened");
        Engine::assemble(array, db, sb, used, chunks)
    }

    fn assemble(
        array: Arc<Array>,
        db: Database,
        sb: Superblock,
        used: Vec<Run>,
        chunks: u64,
    ) -> Result<Engine, EngineError> {
        let stripe_blocks = (array.geometry().stripe_data_bytes() / BLOCK as u64).max(1);
        let alloc = Allocator::with_used(sb.data_start_block, sb.block_count, stripe_blocks, used)
            .map_err(EngineError::MapCorrupt)?;
        Ok(Engine {
            packer: Packer::for_array(&array),
            cache: BlockCache::default(),
            array,
            db: ManuallyDrop::new(db),
            sb,
            locks: (0..CHUNK_LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            records: RecordCache::for_target(CHUNK_LOCK_STRIPES),
            alloc: Mutex::new(alloc),
            committer: Committer::default(),
            chunks: AtomicU64::new(chunks),
            clones: clones::Clones::default(),
            large_probe_skips: AtomicU32::new(0),
        })
    }

    /// The target id recorded at creation.
    pub fn target(&self) -> TargetId {
        self.sb.target
    }

    pub(crate) fn lock_of(&self, chunk: ChunkId) -> &RwLock<()> {
        &self.locks[Self::lock_index(chunk)]
    }

    fn lock_index(chunk: ChunkId) -> usize {
        let mut h = crate::hash::WordHasher::default();
        chunk.hash(&mut h);
        // The high bits: the record cache's maps of one stripe index by the low ones.
        ((h.finish() >> 40) % CHUNK_LOCK_STRIPES as u64) as usize
    }

    /// The current record of `chunk`, from the record cache, the staged changes or the chunk
    /// map; the caller holds the chunk's lock (shared or exclusive), which keeps the cache
    /// coherent.
    pub(crate) fn load_record(
        &self,
        chunk: ChunkId,
    ) -> Result<Option<Arc<ChunkRecord>>, EngineError> {
        let shard = Self::lock_index(chunk);
        if let Some(rec) = self.records.get(shard, chunk) {
            return Ok(Some(rec));
        }
        let Some(rec) = self.decode_record(chunk)? else { return Ok(None) };
        let rec = Arc::new(rec);
        self.records.put(shard, chunk, rec.clone());
        Ok(Some(rec))
    }

    /// The record of `chunk` to change: taken out of the record cache (the change puts the
    /// new one back), or read from the staged changes or the chunk map. The chunk's lock is
    /// held exclusively.
    fn take_record(&self, chunk: ChunkId) -> Result<Option<ChunkRecord>, EngineError> {
        match self.records.take(Self::lock_index(chunk), chunk) {
            Some(rec) => Ok(Some(Arc::unwrap_or_clone(rec))),
            None => self.decode_record(chunk),
        }
    }

    fn decode_record(&self, chunk: ChunkId) -> Result<Option<ChunkRecord>, EngineError> {
        if let Some(staged) = self.committer.staged(key(chunk)) {
            return Ok(staged.map(Arc::unwrap_or_clone));
        }
        match commit::get(&self.db, key(chunk))? {
            None => Ok(None),
            Some(bytes) => ChunkRecord::decode(&bytes)
                .map(Some)
                .map_err(|e| EngineError::MapCorrupt(format!("chunk {chunk}: {e}"))),
        }
    }

    fn check_end(chunk: ChunkId, end_bytes: u64) -> Result<(), EngineError> {
        if end_bytes > CHUNK_BYTES_MAX as u64 {
            return Err(EngineError::TooBig { chunk, end_bytes, limit_bytes: CHUNK_BYTES_MAX });
        }
        Ok(())
    }

    /// Reads `out.len() / BLOCK` logical blocks starting at `first` into `out`, verifying each
    /// mapped block's CRC; holes read as zeros.
    fn read_blocks(
        &self,
        chunk: ChunkId,
        rec: &ChunkRecord,
        first: u32,
        out: &mut [u8],
    ) -> Result<(), EngineError> {
        let mut parts = Vec::new();
        self.append_blocks(chunk, rec, first, out.len() / BLOCK, &mut parts, None)?;
        let mut at = 0;
        for part in parts {
            out[at..at + part.len()].copy_from_slice(&part);
            at += part.len();
        }
        Ok(())
    }

    /// Appends `count` logical blocks starting at `first` to `out`, verifying each mapped
    /// block's CRC; holes append zeros. Cached blocks are appended as the cache's own buffers
    /// (no copy), a run read from the array or a packer image as one buffer. With
    /// `memory_only`, returns Ok(false) instead of reading the array when a block is neither
    /// in the read cache nor in a packer image (`out` then holds some of the blocks: the
    /// caller drops it), and tallies its cache lookups there instead of counting them.
    fn append_blocks(
        &self,
        chunk: ChunkId,
        rec: &ChunkRecord,
        first: u32,
        count: usize,
        out: &mut Vec<Bytes>,
        mut memory_only: Option<&mut Lookups>,
    ) -> Result<bool, EngineError> {
        let block_at = |i: usize| rec.blocks.get(first as usize + i).copied().flatten();
        let mut i = 0usize;
        while i < count {
            let Some(start) = block_at(i) else {
                let mut n = 1usize;
                while i + n < count && block_at(i + n).is_none() {
                    n += 1;
                }
                push_zeros(out, n * BLOCK);
                i += n;
                continue;
            };
            // Extend the run while the physical blocks stay contiguous.
            let mut n = 1usize;
            while i + n < count
                && n * BLOCK < ARRAY_IO_BYTES_MAX
                && matches!(block_at(i + n), Some(b) if b.physical == start.physical + n as u64)
            {
                n += 1;
            }
            let at = out.len();
            // The CRCs of the run's blocks, when they came from the array or the packer.
            let mut read_crcs = None;
            let tally = memory_only.as_deref_mut();
            if !(self.cache.enabled() && self.cache.get_run(start.physical, n, out, tally)) {
                // Not all cached: the run comes from the packer's images or the array.
                let mut run = vec![0u8; n * BLOCK];
                let mut crcs = vec![0u32; n];
                if !self.read_physical(
                    start.physical,
                    &mut run,
                    &mut crcs,
                    memory_only.is_some(),
                )? {
                    return Ok(false);
                }
                out.push(Bytes::from(run));
                read_crcs = Some(crcs);
            }
            let blocks = out[at..].iter().flat_map(|part| part.chunks_exact(BLOCK));
            for (k, bytes) in blocks.enumerate() {
                let logical = first + (i + k) as u32;
                let b = block_at(i + k).expect("a run holds mapped blocks only");
                let actual = match &read_crcs {
                    Some(crcs) => crcs[k],
                    None => stria_proto::crc32c(bytes),
                };
                if actual != b.crc {
                    tracing::error!(%chunk, block = logical, physical = b.physical, "checksum mismatch");
                    // Whatever held the bad copy, the next read goes to the array.
                    self.cache.invalidate(b.physical, 1);
                    return Err(EngineError::Corrupt {
                        chunk,
                        block: logical,
                        physical: b.physical,
                        expected: b.crc,
                        actual,
                    });
                }
            }
            i += n;
        }
        Ok(true)
    }

    /// Reads whole array blocks from `first` into `out`, past the read cache: blocks still
    /// held in the packer's images come from memory, the rest from the array (and may fill
    /// the cache). With `memory_only`, returns Ok(false) rather than read the array.
    /// `crcs` (one per block) gets the CRC32C of each block read. For blocks from the array
    /// these are the CRCs the array checked them against, which are the CRCs of these very
    /// bytes: the caller compares them with the chunk map's instead of checksumming the bytes
    /// a second time.
    fn read_physical(
        &self,
        first: u64,
        out: &mut [u8],
        crcs: &mut [u32],
        memory_only: bool,
    ) -> Result<bool, EngineError> {
        let count = (out.len() / BLOCK) as u64;
        let small = count <= SMALL_IO_BLOCKS;
        let parts = match &self.packer {
            Some(packer) => packer.cached(first, count),
            None => vec![Cached { at: 0, count, image: None }],
        };
        if memory_only && !(parts.len() == 1 && parts[0].image.is_some()) {
            return Ok(false);
        }
        for part in parts {
            let (at, len) = (part.at as usize * BLOCK, part.count as usize * BLOCK);
            let dest = &mut out[at..at + len];
            let dest_crcs = &mut crcs[part.at as usize..][..part.count as usize];
            match part.image {
                Some((image, from)) => {
                    let from = from as usize * BLOCK;
                    dest.copy_from_slice(&image[from..from + len]);
                    for (crc, block) in dest_crcs.iter_mut().zip(dest.chunks_exact(BLOCK)) {
                        *crc = stria_proto::crc32c(block);
                    }
                }
                None => {
                    self.array.read_with_crcs((first + part.at) * BLOCK as u64, dest, dest_crcs)?;
                    if small {
                        self.cache.put(first + part.at, dest);
                    } else {
                        self.cache.fill(first + part.at, dest);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Sets the read cache of small-I/O blocks (`crates/engine/src/cache.rs`); 0 turns it off.
    pub fn set_read_cache_bytes(&self, bytes: u64) {
        self.cache.set_capacity_bytes(bytes);
    }

    /// The read cache's size, contents and hits.
    pub fn read_cache_stats(&self) -> crate::ReadCacheStats {
        self.cache.stats()
    }

    /// Reads up to `len` bytes at `offset`. Returns fewer at the chunk end, none for a missing
    /// chunk; holes read as zeros. Every block is checked against its CRC32C first.
    pub fn read(&self, chunk: ChunkId, offset: u32, len: u32) -> Result<Vec<u8>, EngineError> {
        let mut parts = self.read_parts(chunk, offset, len)?;
        // One buffer (a run read from the array) is handed over as it is, not copied.
        match parts.len() {
            1 => Ok(Vec::from(parts.pop().expect("one part"))),
            _ => Ok(parts.concat()),
        }
    }

    /// As [`Engine::read`], as the buffers the bytes are in (in order, none empty): blocks of
    /// the read cache are handed out as they are, so a caller that sends them on copies
    /// nothing.
    pub fn read_parts(
        &self,
        chunk: ChunkId,
        offset: u32,
        len: u32,
    ) -> Result<Vec<Bytes>, EngineError> {
        Ok(self.read_with(chunk, offset, len, false)?.unwrap_or_default())
    }

    /// As [`Engine::read_parts`], but only from memory (the read cache and the open stripes):
    /// None when some block would have to come from the array. The storage service answers
    /// such reads on its async worker, with no hand-off to a blocking thread.
    ///
    /// A large read that misses costs the map lookup and the cache probes for nothing, and
    /// streaming reads of data that is not cached miss every time. So after a large read
    /// misses, the next [`LARGE_PROBE_BACKOFF`] large reads are not tried: a stream of cached
    /// large reads (a volume read back through NBD) is answered here, a stream of uncached
    /// ones pays for one try in seventeen.
    pub fn read_if_in_memory(
        &self,
        chunk: ChunkId,
        offset: u32,
        len: u32,
    ) -> Result<Option<Vec<Bytes>>, EngineError> {
        let span =
            (offset as u64 + len as u64).div_ceil(BLOCK as u64) - offset as u64 / BLOCK as u64;
        let large = span > SMALL_IO_BLOCKS;
        if large {
            if span > MEMORY_READ_BLOCKS_MAX || (!self.cache.enabled() && self.packer.is_none()) {
                return Ok(None);
            }
            let skipping = self
                .large_probe_skips
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
            if skipping {
                return Ok(None);
            }
        }
        let read = self.read_with(chunk, offset, len, true)?;
        if large && read.is_none() {
            self.large_probe_skips.store(LARGE_PROBE_BACKOFF, Ordering::Relaxed);
        }
        Ok(read)
    }

    fn read_with(
        &self,
        chunk: ChunkId,
        offset: u32,
        len: u32,
        memory_only: bool,
    ) -> Result<Option<Vec<Bytes>>, EngineError> {
        let _shared = self.lock_of(chunk).read().unwrap_or_else(|e| e.into_inner());
        let Some(rec) = self.load_record(chunk)? else { return Ok(Some(Vec::new())) };
        let end = (offset as u64 + len as u64).min(rec.len_bytes as u64);
        if offset as u64 >= end {
            return Ok(Some(Vec::new()));
        }
        let first = offset / BLOCK as u32;
        let last = ((end - 1) / BLOCK as u64) as u32;
        let count = (last - first + 1) as usize;
        let mut parts = Vec::new();
        // A read from memory only may be tried again from the array: its cache lookups count
        // once it is served.
        let mut lookups = Lookups::default();
        let tally = memory_only.then_some(&mut lookups);
        if !self.append_blocks(chunk, &rec, first, count, &mut parts, tally)? {
            return Ok(None);
        }
        self.cache.count(lookups);
        let skip = (offset % BLOCK as u32) as usize;
        Ok(Some(trim(parts, skip, (end - offset as u64) as usize)))
    }

    /// The chunk's length in bytes, None when it does not exist.
    pub fn chunk_len(&self, chunk: ChunkId) -> Result<Option<u32>, EngineError> {
        let _shared = self.lock_of(chunk).read().unwrap_or_else(|e| e.into_inner());
        Ok(self.load_record(chunk)?.map(|r| r.len_bytes))
    }

    /// The array byte offset of the block holding byte `offset` of the chunk, None for a hole
    /// or a missing chunk. For diagnostics and tests (corrupting a block on purpose).
    pub fn locate(&self, chunk: ChunkId, offset: u32) -> Result<Option<u64>, EngineError> {
        let _shared = self.lock_of(chunk).read().unwrap_or_else(|e| e.into_inner());
        let Some(rec) = self.load_record(chunk)? else { return Ok(None) };
        Ok(rec
            .blocks
            .get(offset as usize / BLOCK)
            .copied()
            .flatten()
            .map(|b| b.physical * BLOCK as u64))
    }

    /// Writes `data` at `offset` (any alignment), creating or extending the chunk. With `crc`,
    /// the payload's CRC32C must equal it or nothing is written.
    pub fn write(
        &self,
        chunk: ChunkId,
        offset: u32,
        data: &[u8],
        crc: Option<u32>,
    ) -> Result<WriteDone, EngineError> {
        let (done, retired) = self.write_deferring(chunk, offset, data, crc)?;
        self.write_out(retired)?;
        Ok(done)
    }

    /// As [`Engine::write`], but a small write that fills the open stripe of packed writes
    /// (`docs/internals/engine.md`) returns before that stripe's array write, with the stripe
    /// for the caller to write out ([`Engine::write_retired`]), on another thread if it likes.
    /// The write's bytes are readable at once either way. A stripe never written out is
    /// written by the next packed write short of room, or the next sync.
    pub fn write_deferring(
        &self,
        chunk: ChunkId,
        offset: u32,
        data: &[u8],
        crc: Option<u32>,
    ) -> Result<(WriteDone, Option<Retired>), EngineError> {
        let end = offset as u64 + data.len() as u64;
        Self::check_end(chunk, end)?;
        // Whole blocks go to the array as they are: their block CRCs also check the payload's.
        let whole_blocks = !data.is_empty()
            && (offset as usize).is_multiple_of(BLOCK)
            && data.len().is_multiple_of(BLOCK);
        let block_crcs = whole_blocks
            .then(|| data.chunks_exact(BLOCK).map(stria_proto::crc32c).collect::<Vec<u32>>());
        if let Some(expected) = crc {
            let actual = match &block_crcs {
                Some(crcs) => crate::crc::of_blocks(crcs),
                None => stria_proto::crc32c(data),
            };
            if actual != expected {
                return Err(EngineError::PayloadChecksum { expected, actual });
            }
        }
        self.committer.check()?;
        let _exclusive = self.lock_for_change(chunk)?;
        let existing = self.take_record(chunk)?;
        let existed = existing.is_some();
        let rec = existing.unwrap_or_default();
        if data.is_empty() {
            return Ok((WriteDone { chunk_len: rec.len_bytes }, None));
        }
        let new_len = rec.len_bytes.max(end as u32);
        if let Some(crcs) = block_crcs {
            let places = [(offset / BLOCK as u32, crcs.len())];
            let retired =
                self.apply_blocks(chunk, rec, existed, &places, data, crcs, None, new_len)?;
            return Ok((WriteDone { chunk_len: new_len }, retired));
        }
        let first = offset / BLOCK as u32;
        let last = ((end - 1) / BLOCK as u64) as u32;
        let n = (last - first + 1) as usize;
        let mut bytes = vec![0u8; n * BLOCK];
        // Partial edge blocks keep their old bytes (read-modify-write into the new copy).
        if !(offset as usize).is_multiple_of(BLOCK) {
            self.read_blocks(chunk, &rec, first, &mut bytes[..BLOCK])?;
        }
        if !(end as usize).is_multiple_of(BLOCK)
            && (last != first || (offset as usize).is_multiple_of(BLOCK))
        {
            self.read_blocks(chunk, &rec, last, &mut bytes[(n - 1) * BLOCK..])?;
        }
        let skip = offset as usize % BLOCK;
        bytes[skip..skip + data.len()].copy_from_slice(data);
        let segments = vec![Segment { first_block: first, bytes }];
        let retired = self.apply(chunk, rec, existed, segments, None, new_len)?;
        Ok((WriteDone { chunk_len: new_len }, retired))
    }

    /// Writes out a stripe [`Engine::write_deferring`] retired (nothing when another thread
    /// already started on it). Fails as the stripe's write did, or as an earlier stripe write
    /// did: one failure fails every later packed write and sync until the target is reopened.
    pub fn write_retired(&self, retired: Retired) -> Result<(), EngineError> {
        match &self.packer {
            Some(packer) => packer.write_retired(&self.array, &self.alloc, &self.cache, retired),
            None => Ok(()),
        }
    }

    /// Writes out the stripe a change of this thread retired, if it retired one.
    fn write_out(&self, retired: Option<Retired>) -> Result<(), EngineError> {
        retired.map_or(Ok(()), |retired| self.write_retired(retired))
    }

    /// Sets the chunk's length: shrinking frees the blocks past it (and zeroes the tail of a
    /// partial last block), growing adds a hole. Creates the chunk when missing.
    pub fn truncate(&self, chunk: ChunkId, len: u32) -> Result<(), EngineError> {
        Self::check_end(chunk, len as u64)?;
        self.committer.check()?;
        let _exclusive = self.lock_for_change(chunk)?;
        let existing = self.take_record(chunk)?;
        let existed = existing.is_some();
        let rec = existing.unwrap_or_default();
        if existed && rec.len_bytes == len {
            return Ok(());
        }
        let mut segments = Vec::new();
        let tail = len as usize % BLOCK;
        let block = len / BLOCK as u32;
        if len < rec.len_bytes
            && tail != 0
            && matches!(rec.blocks.get(block as usize), Some(Some(_)))
        {
            let mut bytes = vec![0u8; BLOCK];
            self.read_blocks(chunk, &rec, block, &mut bytes)?;
            bytes[tail..].fill(0);
            segments.push(Segment { first_block: block, bytes });
        }
        let retired = self.apply(chunk, rec, existed, segments, None, len)?;
        self.write_out(retired)
    }

    /// Makes `[offset, offset+len)` read as zeros and frees the whole blocks in it. The chunk
    /// length does not change; a missing chunk stays missing.
    pub fn punch(&self, chunk: ChunkId, offset: u32, len: u32) -> Result<(), EngineError> {
        self.punch_range(chunk, offset, len, false).map(|_| ())
    }

    /// As [`Engine::punch`], and a chunk left with no mapped block is removed; returns whether
    /// it was. For volumes, whose chunks have no length that matters: a missing chunk reads as
    /// zeros just as a hole does, and costs no record.
    pub fn discard(&self, chunk: ChunkId, offset: u32, len: u32) -> Result<bool, EngineError> {
        self.punch_range(chunk, offset, len, true)
    }

    fn punch_range(
        &self,
        chunk: ChunkId,
        offset: u32,
        len: u32,
        drop_empty: bool,
    ) -> Result<bool, EngineError> {
        self.committer.check()?;
        let _exclusive = self.lock_for_change(chunk)?;
        let Some(rec) = self.take_record(chunk)? else { return Ok(false) };
        let start = offset as u64;
        let end = (offset as u64 + len as u64).min(rec.len_bytes as u64);
        if start >= end {
            if drop_empty && rec.mapped_blocks() == 0 {
                self.remove_locked(chunk, &rec)?;
                return Ok(true);
            }
            return Ok(false);
        }
        let b = BLOCK as u64;
        let len_bytes = rec.len_bytes as u64;
        // A block is wholly punched when the range covers it up to the chunk end (bytes past
        // the end of the last block are zero already); only the two edge blocks can be partial.
        let whole = |blk: u64| start <= blk * b && end >= ((blk + 1) * b).min(len_bytes);
        let (first, last) = (start / b, (end - 1) / b);
        let mut partial = Vec::new();
        let mut lo = first;
        if !whole(first) {
            partial.push(first);
            lo = first + 1;
        }
        let mut hi = last + 1;
        if last >= lo && !whole(last) {
            partial.push(last);
            hi = last;
        }
        let mut segments = Vec::new();
        for blk in partial {
            if !matches!(rec.blocks.get(blk as usize), Some(Some(_))) {
                continue; // a hole already reads as zeros
            }
            let mut bytes = vec![0u8; BLOCK];
            self.read_blocks(chunk, &rec, blk as u32, &mut bytes)?;
            let from = start.max(blk * b) - blk * b;
            let to = end.min((blk + 1) * b) - blk * b;
            bytes[from as usize..to as usize].fill(0);
            segments.push(Segment { first_block: blk as u32, bytes });
        }
        let unmap = (lo < hi).then_some((lo as u32, hi as u32));
        // Partial edge blocks keep data around the punched bytes, so only a punch without
        // them can leave the chunk empty.
        let unmapped = |i: usize| unmap.is_some_and(|(lo, hi)| (lo..hi).contains(&(i as u32)));
        if drop_empty
            && segments.is_empty()
            && rec.blocks.iter().enumerate().all(|(i, slot)| slot.is_none() || unmapped(i))
        {
            self.remove_locked(chunk, &rec)?;
            return Ok(true);
        }
        let new_len = rec.len_bytes;
        let retired = self.apply(chunk, rec, true, segments, unmap, new_len)?;
        self.write_out(retired)?;
        Ok(false)
    }

    /// Removes the chunk and frees its blocks. Returns whether it existed.
    pub fn remove(&self, chunk: ChunkId) -> Result<bool, EngineError> {
        self.committer.check()?;
        let _exclusive = self.lock_for_change(chunk)?;
        let Some(rec) = self.take_record(chunk)? else { return Ok(false) };
        self.remove_locked(chunk, &rec)?;
        Ok(true)
    }

    /// Deletes the record of `chunk` and parks its blocks; the chunk's lock is held exclusively.
    fn remove_locked(&self, chunk: ChunkId, rec: &ChunkRecord) -> Result<(), EngineError> {
        self.committer.commit(&self.db, (key(chunk), None))?;
        self.release_later(&rec.physical_runs());
        self.chunks.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// Removes every chunk of `object`; returns how many there were.
    pub fn remove_object(&self, object: ObjectId) -> Result<u64, EngineError> {
        self.remove_objects(&[object])
    }

    /// Removes every chunk of each of `objects` with one chunk-map commit; returns how many
    /// chunks there were. Many small files' chunks go for the price of one commit.
    pub fn remove_objects(&self, objects: &[ObjectId]) -> Result<u64, EngineError> {
        self.committer.check()?;
        // An object named twice would have its chunks, and so its blocks, released twice.
        let mut objects = objects.to_vec();
        objects.sort_unstable();
        objects.dedup();
        let objects = &objects[..];
        // A copy into a removed object is of no use any more; one out of it must have every
        // chunk before the chunks go.
        self.cancel_clones_into(objects);
        let (chunks, _exclusive) = loop {
            self.finish_clones_from(objects)?;
            let mut chunks = Vec::new();
            for &object in objects {
                chunks.extend(
                    self.chunk_indices(object)?.into_iter().map(|index| ChunkId { object, index }),
                );
            }
            // Every chunk's lock, taken in stripe order (the copies in `clones`, the only
            // other paths that hold two, take them in that order too).
            let mut stripes: Vec<usize> = chunks.iter().map(|&c| Self::lock_index(c)).collect();
            stripes.sort_unstable();
            stripes.dedup();
            let exclusive: Vec<_> = stripes
                .iter()
                .map(|&i| self.locks[i].write().unwrap_or_else(|e| e.into_inner()))
                .collect();
            // A copy out of these objects begun meanwhile is finished first.
            let mut due = false;
            for &chunk in &chunks {
                due |= self.clone_due(chunk)?;
            }
            if !due {
                break (chunks, exclusive);
            }
        };
        let mut removals = Vec::new();
        let mut runs = Vec::new();
        for &chunk in &chunks {
            if let Some(rec) = self.take_record(chunk)? {
                removals.push((key(chunk), None));
                runs.extend(rec.physical_runs());
            }
        }
        if removals.is_empty() {
            return Ok(0);
        }
        let removed = removals.len() as u64;
        self.committer.commit_all(&self.db, removals)?;
        self.release_later(&runs);
        self.chunks.fetch_sub(removed, Ordering::Relaxed);
        Ok(removed)
    }

    /// A check of the chunk map for `fsck`: how many blocks more than one record names, and
    /// how many of those a record of an object that never shares names (`may_share` says
    /// which may: volumes, whose snapshots and clones share; a file's blocks are its own).
    /// The latter can only come from a damaged map: two chunks would overwrite each other.
    pub fn check_sharing(
        &self,
        may_share: impl Fn(ObjectId) -> bool,
    ) -> Result<SharingCheck, EngineError> {
        let mut all = Vec::new();
        let mut own = Vec::new();
        self.scan_records((0, 0)..=(u64::MAX, u64::MAX), |chunk, rec| {
            let runs = rec.physical_runs();
            if !may_share(chunk.object) {
                own.extend(runs.iter().copied());
            }
            all.extend(runs);
        })?;
        let (_, shares) = crate::shares::overlay(&all);
        let wrongly_shared = own.iter().map(|&run| shares.shared_in(run)).sum::<u64>();
        Ok(SharingCheck {
            shared_blocks: shares.shared_blocks(),
            wrongly_shared_blocks: wrongly_shared,
        })
    }

    /// Blocks named by more than one chunk record (clones).
    pub fn shared_bytes(&self) -> u64 {
        lock(&self.alloc).shared_blocks() * BLOCK as u64
    }

    /// The chunks of `object` on this target: (chunk index, length in bytes), by index.
    pub fn list_chunks(&self, object: ObjectId) -> Result<Vec<(u64, u32)>, EngineError> {
        let chunks = self.chunks_in((object.0, 0)..=(object.0, u64::MAX))?;
        Ok(chunks.into_iter().map(|(chunk, len)| (chunk.index, len)).collect())
    }

    /// Every chunk on the target with its length, in (object, index) order (for `fsck`).
    pub fn all_chunks(&self) -> Result<Vec<(ChunkId, u32)>, EngineError> {
        self.chunks_in((0, 0)..=(u64::MAX, u64::MAX))
    }

    fn chunks_in(
        &self,
        range: std::ops::RangeInclusive<(u64, u64)>,
    ) -> Result<Vec<(ChunkId, u32)>, EngineError> {
        let mut out = Vec::new();
        self.scan_records(range, |chunk, rec| out.push((chunk, rec.len_bytes)))?;
        Ok(out)
    }

    /// Calls `visit` with every record in `range`, in key order, from one consistent view of
    /// the map: a read transaction with the changes staged over it merged in.
    pub(crate) fn scan_records(
        &self,
        range: std::ops::RangeInclusive<(u64, u64)>,
        mut visit: impl FnMut(ChunkId, &ChunkRecord),
    ) -> Result<(), EngineError> {
        self.scan(range, true, |chunk, rec| visit(chunk, rec.expect("decoded")))
    }

    /// The chunk indices of `object`, by index, without decoding a record of the map.
    pub(crate) fn chunk_indices(&self, object: ObjectId) -> Result<Vec<u64>, EngineError> {
        let mut out = Vec::new();
        self.scan((object.0, 0)..=(object.0, u64::MAX), false, |chunk, _| out.push(chunk.index))?;
        Ok(out)
    }

    /// As [`Engine::scan_records`]; with `decode` false the map's records are not decoded
    /// (`visit` gets None for them), only the staged ones are at hand.
    fn scan(
        &self,
        range: std::ops::RangeInclusive<(u64, u64)>,
        decode: bool,
        mut visit: impl FnMut(ChunkId, Option<&ChunkRecord>),
    ) -> Result<(), EngineError> {
        let chunk_of = |(object, index): (u64, u64)| ChunkId { object: ObjectId(object), index };
        let (tx, staged) = self.committer.read_with_staged(&self.db, &range)?;
        // The staged changes, in key order, are merged in as the map's keys pass them; a staged
        // removal is a record not to visit.
        let mut staged = staged.into_iter().peekable();
        let table = tx.open_table(CHUNKS)?;
        for entry in table.range(range)? {
            let (k, v) = entry?;
            let key = k.value();
            while let Some((before, change)) = staged.next_if(|(staged_key, _)| *staged_key < key) {
                change.inspect(|rec| visit(chunk_of(before), Some(rec)));
            }
            if let Some((_, change)) = staged.next_if(|(staged_key, _)| *staged_key == key) {
                change.inspect(|rec| visit(chunk_of(key), Some(rec)));
                continue;
            }
            if !decode {
                visit(chunk_of(key), None);
                continue;
            }
            let rec = ChunkRecord::decode(v.value())
                .map_err(|e| EngineError::MapCorrupt(format!("chunk {}: {e}", chunk_of(key))))?;
            visit(chunk_of(key), Some(&rec));
        }
        for (after, change) in staged {
            change.inspect(|rec| visit(chunk_of(after), Some(rec)));
        }
        Ok(())
    }

    /// Makes every change that returned before this call durable: the array is flushed, then
    /// the chunk map commits durably, then the blocks those changes freed become reusable.
    pub fn sync(&self) -> Result<(), EngineError> {
        self.committer.durable(
            &self.db,
            // Taken with nothing staged meanwhile: every parked block was replaced by a change
            // that the durable commit covers.
            || lock(&self.alloc).take_pending(),
            || {
                // The open stripe closes before the flush: its blocks are about to become
                // durable and must never be written again.
                if let Some(p) = &self.packer {
                    p.close(&self.array, &self.alloc, &self.cache)?;
                }
                Ok(self.array.flush()?)
            },
            // Before the next sync may start, so a writer short of space that syncs after this
            // one finds the freed blocks.
            |parked, synced| {
                let mut alloc = lock(&self.alloc);
                if synced {
                    alloc.release(&parked);
                } else {
                    alloc.restore_pending(parked);
                }
            },
        )
    }

    /// Syncs when a change was made since the last sync, or when the array's write-intent
    /// bitmap holds bits a flush would now clear (once after a burst of writes); returns
    /// whether it synced. For a periodic flusher: an idle target costs nothing.
    pub fn sync_if_changed(&self) -> Result<bool, EngineError> {
        // Parked blocks count as a change: a change parks the blocks it replaced after it is
        // staged, so a sync in between covers the change but leaves its blocks parked.
        if !self.committer.has_changes_to_sync()
            && lock(&self.alloc).pending_blocks() == 0
            && !self.array.write_intent_idle()
        {
            return Ok(false);
        }
        self.sync()?;
        Ok(true)
    }

    /// Whether a write of `len` bytes at `offset` of a chunk is packed into the open stripe:
    /// it then copies into memory and stages its chunk-map change, with no array I/O unless it
    /// completes a stripe. The storage service runs such writes on its async worker.
    pub fn write_is_buffered(&self, offset: u32, len: u32) -> bool {
        self.packer.as_ref().is_some_and(|p| p.takes(offset as u64, len as u64))
    }

    /// Space in the data area and the number of chunks.
    pub fn space(&self) -> SpaceStats {
        // The packer's lock before the allocator's, as a stripe write-out takes them.
        let read = |open_tail: u64| {
            let alloc = lock(&self.alloc);
            (alloc.free_blocks() + open_tail, alloc.pending_blocks())
        };
        let (free, reclaimable) = match &self.packer {
            Some(packer) => packer.with_reserved_free_blocks(read),
            None => read(0),
        };
        let total = (self.sb.block_count - self.sb.data_start_block) * BLOCK as u64;
        let free = free * BLOCK as u64;
        let reclaimable = reclaimable * BLOCK as u64;
        SpaceStats {
            total_bytes: total,
            used_bytes: total - free - reclaimable,
            free_bytes: free,
            reclaimable_bytes: reclaimable,
            chunks: self.chunks.load(Ordering::Relaxed),
        }
    }

    /// Allocates `n` blocks; when short, syncs once so blocks pending a durable commit (and the
    /// open stripe's unused tail) free up, then tries again.
    fn allocate(&self, n: u64) -> Result<Vec<Run>, EngineError> {
        if let Some(runs) = lock(&self.alloc).allocate(n) {
            return Ok(runs);
        }
        // Short: a sync frees the parked blocks and the open stripe's unused tail. It runs even
        // when none are parked now, because another writer's sync may hold them half way; this
        // sync waits for that one to finish handing them back.
        self.sync()?;
        let mut alloc = lock(&self.alloc);
        alloc.allocate(n).ok_or(EngineError::NoSpace {
            needed_bytes: n * BLOCK as u64,
            free_bytes: alloc.free_blocks() * BLOCK as u64,
        })
    }

    /// Writes `segments` to fresh blocks, unmaps `unmap` (a logical block range), sets the
    /// length, commits the record, and parks every replaced block until the next durable
    /// commit. Called with the chunk's lock held exclusively. Returns the stripe of packed
    /// writes this retired, for the caller to write out (best once it let go of the lock).
    fn apply(
        &self,
        chunk: ChunkId,
        rec: ChunkRecord,
        existed: bool,
        segments: Vec<Segment>,
        unmap: Option<(u32, u32)>,
        new_len: u32,
    ) -> Result<Option<Retired>, EngineError> {
        // Where each segment goes: (first logical block, block count).
        let places: Vec<(u32, usize)> =
            segments.iter().map(|s| (s.first_block, s.bytes.len() / BLOCK)).collect();
        let data: Vec<u8> = if segments.len() == 1 {
            segments.into_iter().map(|s| s.bytes).next().unwrap_or_default()
        } else {
            segments.into_iter().flat_map(|s| s.bytes).collect()
        };
        // The checksums are of exactly the bytes handed to the array.
        let crcs: Vec<u32> = data.chunks_exact(BLOCK).map(stria_proto::crc32c).collect();
        self.apply_blocks(chunk, rec, existed, &places, &data, crcs, unmap, new_len)
    }

    /// [`Engine::apply`] of whole blocks already laid end to end in `data` (`places`: first
    /// logical block and count of each run, in `data`'s order), with their CRCs.
    #[allow(clippy::too_many_arguments)]
    fn apply_blocks(
        &self,
        chunk: ChunkId,
        mut rec: ChunkRecord,
        existed: bool,
        places: &[(u32, usize)],
        data: &[u8],
        crcs: Vec<u32>,
        unmap: Option<(u32, u32)>,
        new_len: u32,
    ) -> Result<Option<Retired>, EngineError> {
        let packed = match &self.packer {
            Some(p) => p.write(&self.array, &self.alloc, &self.cache, data)?,
            None => None,
        };
        let (runs, retired) = match packed {
            Some(packed) => packed,
            None => {
                let runs = self.allocate(crcs.len() as u64)?;
                if let Err(e) = self.write_runs(&runs, data) {
                    lock(&self.alloc).release(&runs);
                    return Err(e);
                }
                (runs, None)
            }
        };
        // Block j of the concatenated segments goes to the j-th allocated block.
        let physical: Vec<u64> = runs.iter().flat_map(|&(s, n)| s..s + n).collect();
        let slots = places
            .iter()
            .map(|&(first, count)| first as usize + count)
            .max()
            .unwrap_or(0)
            .max(blocks_for(new_len as u64) as usize);
        if rec.blocks.len() < slots {
            rec.blocks.resize(slots, None);
        }
        let mut replaced = Vec::new();
        if let Some((lo, hi)) = unmap {
            for slot in rec.blocks.iter_mut().take(hi as usize).skip(lo as usize) {
                replaced.extend(slot.take().map(|b| b.physical));
            }
        }
        let mut j = 0usize;
        for &(first, count) in places {
            for slot in &mut rec.blocks[first as usize..first as usize + count] {
                let new = BlockRef { physical: physical[j], crc: crcs[j] };
                replaced.extend(slot.replace(new).map(|b| b.physical));
                j += 1;
            }
        }
        let keep = blocks_for(new_len as u64) as usize;
        for slot in rec.blocks.drain(keep.min(rec.blocks.len())..) {
            replaced.extend(slot.map(|b| b.physical));
        }
        rec.len_bytes = new_len;
        // On failure (a poisoned target, or a batch commit that failed and poisoned it) the new
        // blocks stay allocated: a reopen rebuilds the free map from the map itself.
        let rec = Arc::new(rec);
        self.committer.commit(&self.db, (key(chunk), Some(rec.clone())))?;
        self.records.put(Self::lock_index(chunk), chunk, rec);
        if !existed {
            self.chunks.fetch_add(1, Ordering::Relaxed);
        }
        replaced.sort_unstable();
        self.release_later(&runs_of(&replaced));
        Ok(retired)
    }

    /// Drops a reference to each block of `runs`; those no committed record names any more
    /// are parked until the next durable commit, and their read-cache entries dropped (no
    /// read can ask for them again).
    fn release_later(&self, runs: &[Run]) {
        let parked = lock(&self.alloc).defer(runs);
        for (start, n) in parked {
            self.cache.invalidate(start, n);
        }
    }

    fn write_runs(&self, runs: &[Run], data: &[u8]) -> Result<(), EngineError> {
        let small = (data.len() / BLOCK) as u64 <= SMALL_IO_BLOCKS;
        let mut at = 0usize;
        for &(start, n) in runs {
            // The cache follows every write: small ones are kept, large ones only drop what they
            // overwrite (freed blocks may still have entries). Copying large writes in halved
            // 1 MiB sequential writes through the mount (cache memory is allocated as it
            // fills); large reads fill free room instead.
            if small {
                self.cache.put(start, &data[at..at + n as usize * BLOCK]);
            } else {
                self.cache.invalidate(start, n);
            }
            let len = n as usize * BLOCK;
            let mut done = 0usize;
            while done < len {
                let step = (len - done).min(ARRAY_IO_BYTES_MAX);
                self.array.write(
                    start * BLOCK as u64 + done as u64,
                    &data[at + done..at + done + step],
                )?;
                done += step;
            }
            at += len;
        }
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // redb makes pending non-durable commits durable when it closes; that is only safe once
        // the array data they point at is flushed, which sync does first. If sync fails the
        // database is leaked instead: the next open recovers the last durable map.
        match self.sync() {
            Ok(()) => {
                // SAFETY: `db` is not used after this point; Drop runs once.
                unsafe { ManuallyDrop::drop(&mut self.db) }
            }
            Err(e) => {
                tracing::error!(target = %self.sb.target, "closing without a final sync: {e}");
            }
        }
    }
}

fn read_identity(db: &Database) -> Result<Option<Identity>, EngineError> {
    let tx = db.begin_read()?;
    let meta = match tx.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Some(bytes) = meta.get("identity")? else { return Ok(None) };
    postcard::from_bytes(bytes.value())
        .map(Some)
        .map_err(|e| EngineError::MapCorrupt(format!("identity record: {e}")))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Zeros handed out for holes, shared by every read.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Appends `len` zero bytes to `parts`, as slices of [`ZEROS`].
fn push_zeros(parts: &mut Vec<Bytes>, mut len: usize) {
    while len > 0 {
        let n = len.min(ZEROS.len());
        parts.push(Bytes::from_static(&ZEROS[..n]));
        len -= n;
    }
}

/// The `len` bytes of `parts` after the first `skip`, as slices of the same buffers.
fn trim(parts: Vec<Bytes>, mut skip: usize, mut len: usize) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(parts.len());
    for mut part in parts {
        if len == 0 {
            break;
        }
        if skip >= part.len() {
            skip -= part.len();
            continue;
        }
        let _ = part.split_to(skip);
        skip = 0;
        part.truncate(len);
        len -= part.len();
        out.push(part);
    }
    out
}
