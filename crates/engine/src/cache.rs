//! A read cache of small-I/O blocks, keyed by array block number.
//!
//! The target's page cache for small files and random 4 KiB I/O: blocks read by requests of
//! at most [`SMALL_IO_BLOCKS`] blocks, and blocks written the same way (packed stripes as they
//! reach the array, small ordinary writes), are kept so the next read of them costs no array
//! I/O. Large reads only fill room the cache has free ([`BlockCache::fill`]), and only with
//! blocks read a second time: they never evict, so streaming a big file does not flush the
//! small-file working set and a single pass pays no copy, while a cache larger than the data
//! (a volume's working set, say) ends up holding all of it. Large writes only drop the entries
//! of blocks they overwrite: copying them in cost half the speed of 1 MiB sequential writes
//! through the mount.
//!
//! Correctness rests on one rule: every array write of a data block goes through the engine,
//! which updates or drops the block's entry right after the write (`Engine::write_runs`, the
//! packer's stripe write). Blocks are copy-on-write, so a block named by a chunk record does
//! not change while a reader holds that chunk's lock; a reader that inserts what it read
//! therefore never inserts stale bytes. Hits are still checked against the chunk map's CRC32C
//! like array reads.
//!
//! A cached block is a reference-counted buffer that is never changed in place (a rewrite
//! replaces it), so a hit hands out the cache's own buffer rather than a copy, and a reader
//! that still holds it after an eviction or a rewrite keeps the bytes it read.
//!
//! Eviction is CLOCK (second chance) per shard; the capacity is set at run time
//! (`Engine::set_read_cache_bytes`, 0 = off, the default).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

use crate::BLOCK;
use crate::hash::WordHash;

/// Requests of at most this many blocks (64 KiB) fill the cache.
pub(crate) const SMALL_IO_BLOCKS: u64 = 16;

const SHARDS: usize = 16;

/// Consecutive blocks that share a shard (64 KiB): a small read or write takes one shard lock,
/// and a 1 MiB read takes sixteen in turn, never all of them at once (readers holding every
/// shard while they looked up a long run waited on each other on the futex).
const GROUP_BLOCKS: u64 = 16;

#[derive(Debug)]
pub(crate) struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    /// Blocks each shard may hold.
    per_shard: AtomicUsize,
    /// Block lookups answered, and missed, since the target was opened.
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Cache lookups of one read: blocks found, and runs not found whole.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Lookups {
    hits: u64,
    misses: u64,
}

/// What a target's read cache holds and how well it serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCacheStats {
    pub capacity_bytes: u64,
    pub held_bytes: u64,
    /// Blocks found in the cache since the target was opened.
    pub hits: u64,
    /// Blocks looked up and not found (then read from the array).
    pub misses: u64,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<u64, Slot, WordHash>,
    /// Keys in CLOCK order; may hold keys no longer in `map` (reused first).
    ring: Vec<u64>,
    hand: usize,
    /// Blocks a fill met once and did not cache: the next fill of one caches it. So a single
    /// streaming pass costs a set insert per block, not a copy into fresh memory.
    seen: HashSet<u64, WordHash>,
}

#[derive(Debug)]
struct Slot {
    /// Never changed in place: a reader may still hold it after it was replaced or dropped.
    data: Bytes,
    referenced: bool,
}

impl Default for BlockCache {
    fn default() -> BlockCache {
        BlockCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

impl BlockCache {
    /// Sets the capacity; shrinking drops everything (rare: an operator's change).
    pub(crate) fn set_capacity_bytes(&self, bytes: u64) {
        let per_shard = (bytes / BLOCK as u64 / SHARDS as u64) as usize;
        let old = self.per_shard.swap(per_shard, Ordering::Relaxed);
        if per_shard < old {
            for shard in &self.shards {
                *lock(shard) = Shard::default();
            }
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.per_shard.load(Ordering::Relaxed) > 0
    }

    /// Bytes held now.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).map.len() as u64 * BLOCK as u64).sum()
    }

    pub(crate) fn stats(&self) -> ReadCacheStats {
        ReadCacheStats {
            capacity_bytes: (self.per_shard.load(Ordering::Relaxed) * SHARDS * BLOCK) as u64,
            held_bytes: self.held_bytes(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Appends the `count` blocks from `first` on to `out`, one buffer each (shared with the
    /// cache, not copied), if every one is cached; `out` is left as it was otherwise. A long
    /// run takes the lock of each group of blocks it touches, one at a time. The lookup counts in the
    /// cache's statistics, or in `tally` when given (a read that may be tried again counts
    /// once, when it is served: [`BlockCache::count`]).
    pub(crate) fn get_run(
        &self,
        first: u64,
        count: usize,
        out: &mut Vec<Bytes>,
        tally: Option<&mut Lookups>,
    ) -> bool {
        let start = out.len();
        out.reserve(count);
        let mut found = 0;
        for (shard, blocks) in segments(first, count as u64) {
            let mut shard = lock(&self.shards[shard]);
            let here = blocks.clone().take_while(|&b| shard.copy_out(b, out)).count();
            found += here;
            if here < (blocks.end - blocks.start) as usize {
                break;
            }
        }
        let missed = u64::from(found < count);
        match tally {
            Some(tally) => {
                tally.hits += found as u64;
                tally.misses += missed;
            }
            None => self.count(Lookups { hits: found as u64, misses: missed }),
        }
        if found < count {
            out.truncate(start);
            return false;
        }
        true
    }

    /// Adds lookups tallied apart to the statistics.
    pub(crate) fn count(&self, lookups: Lookups) {
        self.hits.fetch_add(lookups.hits, Ordering::Relaxed);
        self.misses.fetch_add(lookups.misses, Ordering::Relaxed);
    }

    /// Copies block `block` into `out` (one block) if cached.
    #[cfg(test)]
    pub(crate) fn get(&self, block: u64, out: &mut [u8]) -> bool {
        let mut shard = lock(&self.shards[shard_of(block)]);
        match shard.map.get_mut(&block) {
            Some(slot) => {
                slot.referenced = true;
                out.copy_from_slice(&slot.data[..]);
                self.hits.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Caches the blocks of `data` (whole blocks) from array block `first` on.
    pub(crate) fn put(&self, first: u64, data: &[u8]) {
        self.store(first, data, Shard::insert);
    }

    /// As [`BlockCache::put`], but only into free room: blocks already cached are replaced,
    /// new ones are added from their second fill on while their shard has room, and nothing is
    /// evicted. For large reads.
    pub(crate) fn fill(&self, first: u64, data: &[u8]) {
        self.store(first, data, Shard::admit);
    }

    /// Replaces the cached blocks among those of `data`; hands each other one to `new`.
    fn store(&self, first: u64, data: &[u8], new: fn(&mut Shard, u64, &[u8], usize)) {
        let capacity = self.per_shard.load(Ordering::Relaxed);
        if capacity == 0 {
            return;
        }
        for (shard, blocks) in segments(first, (data.len() / BLOCK) as u64) {
            let mut shard = lock(&self.shards[shard]);
            for block in blocks {
                let at = (block - first) as usize * BLOCK;
                let bytes = &data[at..at + BLOCK];
                match shard.map.get_mut(&block) {
                    Some(slot) => slot.data = Bytes::copy_from_slice(bytes),
                    None => new(&mut shard, block, bytes, capacity),
                }
            }
        }
    }

    /// Drops `count` blocks from `first` on.
    pub(crate) fn invalidate(&self, first: u64, count: u64) {
        if !self.enabled() {
            return;
        }
        for (shard, blocks) in segments(first, count) {
            let mut shard = lock(&self.shards[shard]);
            for block in blocks {
                shard.map.remove(&block);
            }
        }
    }
}

/// How many blocks per block of capacity a shard's `seen` set remembers before it starts over.
const SEEN_PER_CAPACITY: usize = 4;

/// Ring slots [`Shard::insert_into_room`] looks at for one whose block left the cache.
const ROOM_PROBES: usize = 32;

impl Shard {
    /// Appends `block`'s buffer to `out` and marks it referenced, if cached.
    fn copy_out(&mut self, block: u64, out: &mut Vec<Bytes>) -> bool {
        let Some(slot) = self.map.get_mut(&block) else { return false };
        slot.referenced = true;
        out.push(slot.data.clone());
        true
    }

    /// A block a fill met: cached at its second fill (into free room), noted at its first.
    fn admit(&mut self, block: u64, bytes: &[u8], capacity: usize) {
        if self.seen.remove(&block) {
            self.insert_into_room(block, bytes, capacity);
            return;
        }
        // A few bytes per block: it may remember several times what the cache holds.
        if self.seen.len() >= SEEN_PER_CAPACITY * capacity {
            self.seen.clear();
        }
        self.seen.insert(block);
    }

    /// Adds `block` if the shard holds fewer than `capacity` blocks, in a ring slot never used
    /// or one whose block was dropped (invalidated blocks leave their key in the ring); never
    /// evicts a cached block.
    fn insert_into_room(&mut self, block: u64, bytes: &[u8], capacity: usize) {
        if self.map.len() >= capacity {
            return;
        }
        if self.ring.len() < capacity {
            self.insert(block, bytes, capacity);
            return;
        }
        for _ in 0..ROOM_PROBES.min(self.ring.len()) {
            let at = self.hand % self.ring.len();
            self.hand = at + 1;
            if !self.map.contains_key(&self.ring[at]) {
                self.ring[at] = block;
                self.map.insert(block, Slot::new(bytes));
                return;
            }
        }
    }

    fn insert(&mut self, block: u64, bytes: &[u8], capacity: usize) {
        let slot = Slot::new(bytes);
        if self.ring.len() < capacity {
            self.ring.push(block);
            self.map.insert(block, slot);
            return;
        }
        // CLOCK: skip (and clear) referenced entries; take the first unreferenced or stale one.
        loop {
            self.hand %= self.ring.len();
            let key = self.ring[self.hand];
            match self.map.get_mut(&key) {
                Some(s) if s.referenced => {
                    s.referenced = false;
                    self.hand += 1;
                }
                _ => {
                    self.map.remove(&key);
                    self.ring[self.hand] = block;
                    self.hand += 1;
                    self.map.insert(block, slot);
                    return;
                }
            }
        }
    }
}

impl Slot {
    fn new(bytes: &[u8]) -> Slot {
        Slot { data: Bytes::copy_from_slice(bytes), referenced: false }
    }
}

/// Blocks of one group share a shard; consecutive groups land in different shards.
fn shard_of(block: u64) -> usize {
    ((block / GROUP_BLOCKS).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % SHARDS
}

/// The blocks `first..first + count` split where the group changes, each piece with its shard:
/// a run takes one lock per group it touches, one at a time.
fn segments(first: u64, count: u64) -> impl Iterator<Item = (usize, std::ops::Range<u64>)> {
    let end = first + count;
    let mut at = first;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let piece = at..end.min((at / GROUP_BLOCKS + 1) * GROUP_BLOCKS);
        at = piece.end;
        Some((shard_of(piece.start), piece))
    })
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_splits_where_its_group_changes() {
        let pieces: Vec<_> = segments(30, 40).map(|(_, blocks)| blocks).collect();
        assert_eq!(pieces, [30..32, 32..48, 48..64, 64..70]);
        for (shard, blocks) in segments(30, 40) {
            assert!(blocks.clone().all(|b| shard_of(b) == shard), "{blocks:?} in one shard");
        }
        assert_eq!(segments(32, 16).count(), 1, "a whole group is one piece");
        assert_eq!(segments(5, 0).count(), 0);
        let shards: HashSet<usize> = (0..64).map(|g| shard_of(g * GROUP_BLOCKS)).collect();
        assert!(shards.len() > SHARDS / 2, "groups spread over the shards: {shards:?}");
    }

    #[test]
    fn a_run_is_found_only_when_every_block_is_cached() {
        let cache = BlockCache::default();
        cache.set_capacity_bytes(1 << 20);
        let run: Vec<u8> = (0..40u8).flat_map(block).collect();
        cache.put(100, &run);
        let before = Bytes::from_static(&[7, 7, 7]);
        let mut out = vec![before.clone()];
        assert!(cache.get_run(100, 40, &mut out, None));
        assert_eq!(out.len(), 41, "one buffer per block");
        assert!(out[0] == before && out[1..].concat() == run, "appended after what was there");
        let mut short = Vec::new();
        assert!(cache.get_run(136, 4, &mut short, None) && short.concat() == run[36 * BLOCK..]);
        // A run within one group and one across three groups alike.
        for count in [4, 40] {
            let first = 140 - count as u64;
            let mut partial = vec![before.clone()];
            cache.invalidate(138, 1);
            assert!(!cache.get_run(first, count, &mut partial, None), "a run with a missing block");
            assert_eq!(partial.len(), 1);
            assert_eq!(partial[0], before, "a miss leaves the buffers as they were");
            cache.put(138, &run[38 * BLOCK..39 * BLOCK]);
        }
        assert!(
            !cache.get_run(138, 4, &mut short, None),
            "so is one running past the cached blocks"
        );
    }

    #[test]
    fn fill_uses_free_room_only_and_never_evicts() {
        let cache = BlockCache::default();
        let capacity_blocks = 8 * SHARDS as u64;
        cache.set_capacity_bytes(capacity_blocks * BLOCK as u64);
        let mut out = block(0);
        cache.put(1_000_000, &block(9));
        cache.fill(0, &vec![5u8; 2 * capacity_blocks as usize * BLOCK]);
        assert_eq!(cache.held_bytes(), BLOCK as u64, "a block's first fill only notes it");
        cache.fill(0, &vec![5u8; 2 * capacity_blocks as usize * BLOCK]);
        assert!(cache.get(1_000_000, &mut out), "a block put earlier is not evicted by a fill");
        assert_eq!(out, block(9));
        assert!(cache.held_bytes() <= capacity_blocks * BLOCK as u64);
        let filled = (0..2 * capacity_blocks).filter(|&b| cache.get(b, &mut out)).count() as u64;
        assert!(filled > capacity_blocks / 2, "a fill takes the free room ({filled} blocks)");
        cache.fill(1_000_000, &block(4));
        assert!(cache.get(1_000_000, &mut out));
        assert_eq!(out, block(4), "a fill replaces what it overwrites");
    }

    /// Blocks dropped from the cache (freed by overwrites) make room for fills again, though
    /// their keys stay in the CLOCK ring.
    #[test]
    fn fill_reuses_the_room_of_dropped_blocks() {
        let cache = BlockCache::default();
        let capacity_blocks = 8 * SHARDS as u64;
        cache.set_capacity_bytes(capacity_blocks * BLOCK as u64);
        let mut out = block(0);
        for round in 0..4u64 {
            let first = round * 10_000;
            for _ in 0..2 {
                cache.fill(first, &vec![round as u8; 2 * capacity_blocks as usize * BLOCK]);
            }
            let held = (first..first + 2 * capacity_blocks)
                .filter(|&b| cache.get(b, &mut out))
                .count() as u64;
            assert!(held > capacity_blocks / 2, "round {round}: a fill held {held} blocks");
            cache.invalidate(first, 2 * capacity_blocks);
            assert_eq!(cache.held_bytes(), 0);
        }
    }

    fn block(byte: u8) -> Vec<u8> {
        vec![byte; BLOCK]
    }

    #[test]
    fn a_disabled_cache_holds_nothing() {
        let cache = BlockCache::default();
        cache.put(7, &block(1));
        let mut out = block(0);
        assert!(!cache.get(7, &mut out));
        assert_eq!(cache.held_bytes(), 0);
    }

    #[test]
    fn puts_replace_and_invalidate_drops() {
        let cache = BlockCache::default();
        cache.set_capacity_bytes(1 << 20);
        let mut two = block(1);
        two.extend(block(2));
        cache.put(10, &two);
        let mut out = block(0);
        assert!(cache.get(11, &mut out));
        assert_eq!(out, block(2));
        let mut held = Vec::new();
        assert!(cache.get_run(11, 1, &mut held, None));
        cache.put(11, &block(3));
        assert!(cache.get(11, &mut out));
        assert_eq!(out, block(3), "a rewritten block is replaced");
        assert_eq!(held[0][..], block(2), "a reader's buffer does not change under it");
        cache.invalidate(10, 2);
        assert!(!cache.get(10, &mut out) && !cache.get(11, &mut out));
    }

    #[test]
    fn capacity_is_kept_and_referenced_blocks_get_a_second_chance() {
        let cache = BlockCache::default();
        let capacity_blocks = 64 * SHARDS as u64;
        cache.set_capacity_bytes(capacity_blocks * BLOCK as u64);
        for b in 0..capacity_blocks * 4 {
            cache.put(b, &block(b as u8));
            // Block 0 is read after every insert: it stays.
            let mut out = block(0);
            if b > 0 {
                assert!(cache.get(0, &mut out), "hot block evicted after {b} inserts");
            }
        }
        assert!(cache.held_bytes() <= capacity_blocks * BLOCK as u64);
        let mut out = block(0);
        let kept = (0..capacity_blocks * 4).filter(|&b| cache.get(b, &mut out)).count() as u64;
        assert!(kept <= capacity_blocks && kept > capacity_blocks / 2, "kept {kept}");
    }
}
