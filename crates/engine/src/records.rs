//! Decoded chunk records of recently used chunks, so that a small read neither opens a redb
//! read transaction nor decodes its chunk's record each time.
//!
//! The cache is split into the same shards as the chunk locks, and its coherence rests on them:
//! a record enters the cache only while its chunk's lock is held (shared or exclusive), and the
//! chunk map changes a record only with that lock held exclusively, by a path that first takes
//! the cached copy out ([`RecordCache::take`]) and puts the new record back once it is staged
//! for commit (`commit.rs`). A cached record is therefore always the current one; a change that
//! fails before it is staged leaves nothing behind, and the next read loads the record again.
//!
//! Each shard holds its share of the target's record budget (their block vectors), and at
//! least room for one record of the largest chunk; past that, other entries of the shard are
//! dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use stria_proto::fs::{CHUNK_BYTES_MAX, ChunkId};

use crate::hash::WordHash;
use crate::record::{BlockRef, ChunkRecord};

/// Record bytes one target's cache holds, about: 24 bytes per 4 KiB block, so 64 MiB describes
/// some 10 GiB of chunk data. Each shard may also hold one record of the largest chunk, so
/// the most it can hold is 1024 shards of 96 KiB, 96 MiB.
const RECORD_CACHE_BYTES: usize = 64 << 20;

#[derive(Default)]
struct Shard {
    records: HashMap<ChunkId, Arc<ChunkRecord>, WordHash>,
    bytes: usize,
}

pub(crate) struct RecordCache {
    shards: Box<[Mutex<Shard>]>,
    shard_bytes_max: usize,
}

/// What a record costs the cache: its block vector and a fixed overhead for the entry.
fn cost(rec: &ChunkRecord) -> usize {
    block_cost(rec.blocks.capacity())
}

const fn block_cost(blocks: usize) -> usize {
    blocks * std::mem::size_of::<Option<BlockRef>>() + 64
}

/// The cost of a record of a chunk of the largest size.
const LARGEST_RECORD_COST: usize = block_cost(CHUNK_BYTES_MAX as usize / crate::BLOCK);

impl RecordCache {
    /// The cache of one target, in `shards` shards: [`RECORD_CACHE_BYTES`] split over them,
    /// and room in each for a record of the largest chunk.
    pub(crate) fn for_target(shards: usize) -> RecordCache {
        let share = (RECORD_CACHE_BYTES / shards.max(1)).max(LARGEST_RECORD_COST);
        RecordCache::new(shards, share)
    }

    fn new(shards: usize, shard_bytes_max: usize) -> RecordCache {
        RecordCache { shards: (0..shards).map(|_| Mutex::default()).collect(), shard_bytes_max }
    }

    fn shard(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached record of `chunk`, which lives in `shard`; the chunk's lock is held.
    pub(crate) fn get(&self, shard: usize, chunk: ChunkId) -> Option<Arc<ChunkRecord>> {
        self.shard(shard).records.get(&chunk).cloned()
    }

    /// Takes the cached record of `chunk` out, before a change to it; the chunk's lock is held
    /// exclusively.
    pub(crate) fn take(&self, shard: usize, chunk: ChunkId) -> Option<Arc<ChunkRecord>> {
        let mut s = self.shard(shard);
        let rec = s.records.remove(&chunk)?;
        s.bytes -= cost(&rec);
        Some(rec)
    }

    /// Keeps `rec` as the current record of `chunk`; the chunk's lock is held.
    pub(crate) fn put(&self, shard: usize, chunk: ChunkId, rec: Arc<ChunkRecord>) {
        let size = cost(&rec);
        if size > self.shard_bytes_max {
            self.take(shard, chunk);
            return;
        }
        let mut s = self.shard(shard);
        if let Some(old) = s.records.insert(chunk, rec) {
            s.bytes -= cost(&old);
        }
        s.bytes += size;
        while s.bytes > self.shard_bytes_max {
            let Some(&victim) = s.records.keys().find(|&&c| c != chunk) else { break };
            if let Some(old) = s.records.remove(&victim) {
                s.bytes -= cost(&old);
            }
        }
    }

    /// Records held and the bytes they are charged, over all shards.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(n, b), s| {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            (n + s.records.len(), b + s.bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use stria_proto::fs::ObjectId;

    use super::*;

    fn chunk(index: u64) -> ChunkId {
        ChunkId { object: ObjectId(7), index }
    }

    fn record(blocks: usize) -> Arc<ChunkRecord> {
        let blocks = (0..blocks).map(|i| Some(BlockRef { physical: i as u64, crc: 1 })).collect();
        Arc::new(ChunkRecord { len_bytes: 4096, blocks })
    }

    #[test]
    fn a_shard_keeps_to_its_share_and_keeps_the_newest() {
        let cache = RecordCache::new(1, 4 * cost(&record(16)));
        for i in 0..10 {
            cache.put(0, chunk(i), record(16));
            assert!(cache.get(0, chunk(i)).is_some(), "the record just put is kept");
        }
        let (n, bytes) = cache.held();
        assert_eq!(n, 4, "the shard holds as many records as its share allows");
        assert_eq!(bytes, 4 * cost(&record(16)));
    }

    #[test]
    fn take_removes_and_replacing_recharges() {
        let cache = RecordCache::new(4, 1 << 18);
        cache.put(2, chunk(1), record(8));
        cache.put(2, chunk(1), record(32));
        assert_eq!(cache.held(), (1, cost(&record(32))), "a replaced record is no longer charged");
        assert_eq!(cache.take(2, chunk(1)).map(|r| r.blocks.len()), Some(32));
        assert!(cache.get(2, chunk(1)).is_none());
        assert_eq!(cache.held(), (0, 0));
    }

    #[test]
    fn a_record_past_the_share_is_not_kept_and_drops_its_stale_copy() {
        let cache = RecordCache::new(2, cost(&record(4)));
        cache.put(1, chunk(3), record(4));
        cache.put(1, chunk(3), record(1024));
        assert!(cache.get(1, chunk(3)).is_none(), "no stale record is left behind");
        assert_eq!(cache.held(), (0, 0));
    }
}
