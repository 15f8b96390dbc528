//! The CRC32C of whole blocks laid end to end, from the blocks' own CRCs: a write of whole
//! blocks checks its payload CRC against the per-block CRCs it computes anyway, instead of
//! reading the payload a second time.
//!
//! CRC32C is linear over GF(2): for finished CRCs, `crc(A ‖ B) = Z(crc(A)) ⊕ crc(B)`, where `Z`
//! runs the bare shift register over `len(B)` zero bytes (the initial and final inversions
//! cancel). For one block length `Z` is a fixed 32×32 bit matrix, built once by running the
//! register over a block of zeros from each of the 32 unit states.

use std::sync::OnceLock;

use crate::BLOCK;

/// CRC32C's polynomial, bit-reversed (the register shifts right).
const POLY: u32 = 0x82F6_3B78;

/// Column `i`: the register after one block of zero bytes, started from bit `i` alone.
fn block_shift() -> &'static [u32; 32] {
    static SHIFT: OnceLock<[u32; 32]> = OnceLock::new();
    SHIFT.get_or_init(|| {
        std::array::from_fn(|i| {
            let mut reg = 1u32 << i;
            for _ in 0..BLOCK * 8 {
                reg = if reg & 1 == 1 { (reg >> 1) ^ POLY } else { reg >> 1 };
            }
            reg
        })
    })
}

/// The CRC32C of the blocks whose CRCs are `crcs`, in order, each [`BLOCK`] bytes long.
pub(crate) fn of_blocks(crcs: &[u32]) -> u32 {
    let shift = block_shift();
    crcs.iter().fold(stria_proto::crc32c(&[]), |total, &block| {
        let mut shifted = 0;
        let mut bits = total;
        while bits != 0 {
            shifted ^= shift[bits.trailing_zeros() as usize];
            bits &= bits - 1;
        }
        // The empty prefix's CRC is 0, so the first block's CRC comes out unchanged.
        shifted ^ block
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_crcs_combine_to_the_crc_of_their_concatenation() {
        let mut rng = crate::testing::Rng::new(7);
        for blocks in [0usize, 1, 2, 3, 17, 256] {
            let data = rng.bytes(blocks * BLOCK);
            let crcs: Vec<u32> = data.chunks_exact(BLOCK).map(stria_proto::crc32c).collect();
            assert_eq!(of_blocks(&crcs), stria_proto::crc32c(&data), "{blocks} blocks");
        }
    }
}
