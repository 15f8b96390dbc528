//! A cheap hasher for the engine's in-memory maps, keyed by numbers the engine picks itself
//! (array block numbers, chunk ids). SipHash's resistance to chosen keys buys nothing there
//! and costs a lookup more than the rest of it on a cached 4 KiB read.

use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-and-fold over 64-bit words (the odd golden-ratio constant makes each step a
/// bijection); `finish` folds the well-mixed high half into the low bits the table indexes by.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WordHasher(u64);

const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(K);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

pub(crate) type WordHash = BuildHasherDefault<WordHasher>;

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hash};

    use super::*;

    fn hash(value: impl Hash) -> u64 {
        WordHash::default().hash_one(value)
    }

    #[test]
    fn consecutive_keys_spread_over_the_low_bits() {
        let mut buckets = [0u32; 64];
        for block in 0..64_000u64 {
            buckets[(hash(block) % 64) as usize] += 1;
        }
        assert!(buckets.iter().all(|&n| (800..1200).contains(&n)), "{buckets:?}");
    }

    #[test]
    fn order_of_words_matters() {
        assert_ne!(hash((1u64, 2u64)), hash((2u64, 1u64)));
    }
}
