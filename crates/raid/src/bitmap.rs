//! The write-intent bitmap: one bit per region of the drives' data areas, set on every member
//! before any write lands in that region and cleared by a flush of the optimal array that finds
//! the region idle since the flush before (a busy region keeps its bit, so its next write pays
//! no bitmap write).
//!
//! After an unclean stop only marked regions need their parity and checksums resynced; while the
//! array is degraded bits are never cleared, so a drive that comes back after a short absence is
//! resynced only where the array was written meanwhile.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use stria_io::AlignedBuf;

#[derive(Debug)]
pub struct WriteIntent {
    words: Vec<AtomicU64>,
    /// The bits of `words` known to be on the drives: a write may skip the bitmap only for
    /// these, not for a bit another write set and is still persisting.
    persisted: Vec<AtomicU64>,
    /// Regions marked since the last [`WriteIntent::clear_idle`]: their bits survive it.
    recent: Vec<AtomicU64>,
    region_bytes: u64,
    regions: u64,
    /// Serialises updates of the on-disk copy.
    pub persist_lock: Mutex<()>,
}

impl WriteIntent {
    pub fn new(region_bytes: u64, data_bytes: u64, bytes: u64) -> WriteIntent {
        let regions = data_bytes.div_ceil(region_bytes);
        assert!(regions <= bytes * 8, "layout guarantees the bitmap covers the data area");
        WriteIntent {
            words: (0..(bytes / 8)).map(|_| AtomicU64::new(0)).collect(),
            persisted: (0..(bytes / 8)).map(|_| AtomicU64::new(0)).collect(),
            recent: (0..(bytes / 8)).map(|_| AtomicU64::new(0)).collect(),
            region_bytes,
            regions,
            persist_lock: Mutex::new(()),
        }
    }

    /// Takes the bits read from the drives (so already persisted).
    pub fn load(&self, bytes: &[u8]) {
        for ((word, persisted), raw) in
            self.words.iter().zip(&self.persisted).zip(bytes.chunks_exact(8))
        {
            let mut a = [0u8; 8];
            a.copy_from_slice(raw);
            word.store(u64::from_le_bytes(a), Relaxed);
            persisted.store(u64::from_le_bytes(a), Relaxed);
        }
    }

    pub fn encode(&self, bytes: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes);
        for (word, raw) in self.words.iter().zip(buf.chunks_exact_mut(8)) {
            raw.copy_from_slice(&word.load(Relaxed).to_le_bytes());
        }
        buf
    }

    pub fn region_bytes(&self) -> u64 {
        self.region_bytes
    }

    pub fn region_of(&self, drive_offset: u64) -> u64 {
        drive_offset / self.region_bytes
    }

    pub fn is_set(&self, region: u64) -> bool {
        self.words[(region / 64) as usize].load(Relaxed) & (1 << (region % 64)) != 0
    }

    /// Notes `regions` as written since the last flush; returns whether all their bits are
    /// set and on the drives already (then the write need not wait for the bitmap).
    pub fn touch(&self, regions: &[u64]) -> bool {
        let mut all_set = true;
        for &region in regions {
            let (word, bit) = ((region / 64) as usize, 1u64 << (region % 64));
            self.recent[word].fetch_or(bit, Relaxed);
            all_set &= self.persisted[word].load(Relaxed) & bit != 0;
        }
        all_set
    }

    /// Notes the bits of `regions` as on the drives (after the bitmap holding them was
    /// written, under `persist_lock`).
    pub fn mark_persisted(&self, regions: &[u64]) {
        for &region in regions {
            let (word, bit) = ((region / 64) as usize, 1u64 << (region % 64));
            self.persisted[word].fetch_or(bit, Relaxed);
        }
    }

    /// Sets the bits of `regions` and notes them as written; returns true if any bit was newly
    /// set (the caller persists).
    pub fn set(&self, regions: impl IntoIterator<Item = u64>) -> bool {
        let mut changed = false;
        for region in regions {
            let (word, bit) = ((region / 64) as usize, 1u64 << (region % 64));
            self.recent[word].fetch_or(bit, Relaxed);
            let old = self.words[word].fetch_or(bit, Relaxed);
            changed |= old & bit == 0;
        }
        changed
    }

    /// Clears the bits of the regions not written since the last call, and starts noting
    /// afresh; returns true if any bit was cleared (the caller persists). Only for a flushed
    /// array with no write in flight: a kept bit is always safe, a cleared one is safe only
    /// because every write to its region is durable.
    pub fn clear_idle(&self) -> bool {
        let mut changed = false;
        for ((word, recent), persisted) in self.words.iter().zip(&self.recent).zip(&self.persisted)
        {
            let keep = recent.swap(0, Relaxed);
            persisted.fetch_and(keep, Relaxed);
            changed |= word.fetch_and(keep, Relaxed) & !keep != 0;
        }
        changed
    }

    /// Clears every bit, written lately or not (as [`WriteIntent::clear_idle`], for a flushed
    /// array with no write in flight).
    pub fn clear_all(&self) -> bool {
        let mut changed = false;
        for ((word, recent), persisted) in self.words.iter().zip(&self.recent).zip(&self.persisted)
        {
            recent.store(0, Relaxed);
            persisted.store(0, Relaxed);
            changed |= word.swap(0, Relaxed) != 0;
        }
        changed
    }

    pub fn dirty_regions(&self) -> Vec<u64> {
        (0..self.regions).filter(|&r| self.is_set(r)).collect()
    }

    /// Whether [`WriteIntent::clear_idle`] would clear a bit now: a set bit whose region was
    /// not written since the last clear.
    pub fn any_idle(&self) -> bool {
        self.words
            .iter()
            .zip(&self.recent)
            .any(|(word, recent)| word.load(Relaxed) & !recent.load(Relaxed) != 0)
    }

    pub fn any_set(&self) -> bool {
        self.words.iter().any(|w| w.load(Relaxed) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_round_trip_through_their_encoding() {
        let bm = WriteIntent::new(1 << 20, 100 << 20, 4096);
        assert!(bm.set([0, 5, 99]));
        assert!(!bm.set([5]));
        let other = WriteIntent::new(1 << 20, 100 << 20, 4096);
        other.load(&bm.encode(4096));
        assert_eq!(other.dirty_regions(), vec![0, 5, 99]);
        assert!(other.clear_all());
        assert!(!other.any_set());
    }

    /// A bit set by one write and not yet on the drives does not let another write skip the
    /// bitmap: it must wait for that bitmap write.
    #[test]
    fn only_persisted_bits_let_a_write_skip_the_bitmap() {
        let bm = WriteIntent::new(1 << 20, 100 << 20, 4096);
        assert!(bm.set([3]));
        assert!(!bm.touch(&[3]), "set, but still being written");
        bm.mark_persisted(&[3]);
        assert!(bm.touch(&[3]));
        assert!(bm.clear_all());
        assert!(!bm.touch(&[3]), "cleared");
        let loaded = WriteIntent::new(1 << 20, 100 << 20, 4096);
        assert!(bm.set([8]));
        loaded.load(&bm.encode(4096));
        assert!(loaded.touch(&[8]), "read from the drives");
    }

    #[test]
    fn a_flush_clears_only_the_regions_idle_since_the_flush_before() {
        let bm = WriteIntent::new(1 << 20, 100 << 20, 4096);
        assert!(bm.set([1, 2, 70]));
        bm.mark_persisted(&[1, 2, 70]);
        // Written in this interval: kept.
        assert!(!bm.any_idle());
        assert!(!bm.clear_idle());
        assert_eq!(bm.dirty_regions(), vec![1, 2, 70]);
        assert!(bm.any_idle(), "nothing written since that flush");
        // Region 2 is written again (its bit is set: nothing to persist), 1 and 70 stay idle.
        assert!(bm.touch(&[2]));
        assert!(!bm.touch(&[2, 3]), "region 3 has no bit yet");
        assert!(bm.clear_idle());
        assert_eq!(bm.dirty_regions(), vec![2]);
        // Idle for a whole interval: cleared.
        assert!(bm.clear_idle());
        assert!(!bm.any_set());
        assert!(!bm.clear_idle());
        // A loaded bitmap's bits count as idle: the first flush clears them.
        let loaded = WriteIntent::new(1 << 20, 100 << 20, 4096);
        loaded.load(&bm.encode(4096));
        bm.set([9]);
        loaded.load(&bm.encode(4096));
        assert_eq!(loaded.dirty_regions(), vec![9]);
        assert!(loaded.clear_idle());
        assert!(!loaded.any_set());
        // clear_all forgets the marks too.
        bm.set([4]);
        assert!(bm.clear_all());
        bm.set([5]);
        assert!(!bm.clear_idle());
        assert_eq!(bm.dirty_regions(), vec![5]);
    }
}
