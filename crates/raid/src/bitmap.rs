//! The write-intent bitmap: one bit per region of the drives' data areas, set on every member
//! before any write lands in that region and cleared once the array is flushed and optimal.
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
            region_bytes,
            regions,
            persist_lock: Mutex::new(()),
        }
    }

    pub fn load(&self, bytes: &[u8]) {
        for (word, raw) in self.words.iter().zip(bytes.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(raw);
            word.store(u64::from_le_bytes(a), Relaxed);
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

    /// Sets the bits of `regions`; returns true if any was newly set (the caller persists).
    pub fn set(&self, regions: impl IntoIterator<Item = u64>) -> bool {
        let mut changed = false;
        for region in regions {
            let bit = 1u64 << (region % 64);
            let old = self.words[(region / 64) as usize].fetch_or(bit, Relaxed);
            changed |= old & bit == 0;
        }
        changed
    }

    pub fn clear_all(&self) -> bool {
        let mut changed = false;
        for word in &self.words {
            changed |= word.swap(0, Relaxed) != 0;
        }
        changed
    }

    pub fn dirty_regions(&self) -> Vec<u64> {
        (0..self.regions).filter(|&r| self.is_set(r)).collect()
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
}
