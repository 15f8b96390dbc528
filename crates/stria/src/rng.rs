//! A small deterministic random generator (SplitMix64) for the torture writer, its verifier and
//! the benchmark's access patterns. Not for anything that needs unpredictability: the torture
//! verifier depends on the same seed giving the same numbers on every run and every machine.

#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// A generator for a tuple of values, so (seed, block, version) streams are independent.
    pub fn from_parts(parts: &[u64]) -> SplitMix64 {
        let mut mixed = 0x5354_5249_4120_524e_u64; // "STRIA RN"
        for &part in parts {
            mixed = SplitMix64::new(mixed ^ part).next_u64();
        }
        SplitMix64::new(mixed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound` > 0). The modulo bias is below 2^-40 for the bounds used
    /// here, which is irrelevant for test patterns.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "below(0) has no values");
        self.next_u64() % bound
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_known_first_value() {
        let mut a = SplitMix64::new(0);
        let mut b = SplitMix64::new(0);
        // The reference SplitMix64 output for seed 0; a change here breaks old torture runs.
        assert_eq!(a.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(b.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn parts_give_distinct_streams() {
        let x = SplitMix64::from_parts(&[1, 2, 3]).next_u64();
        let y = SplitMix64::from_parts(&[1, 3, 2]).next_u64();
        let z = SplitMix64::from_parts(&[1, 2, 3]).next_u64();
        assert_ne!(x, y);
        assert_eq!(x, z);
    }
}
