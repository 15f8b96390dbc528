//! CRC32C (Castagnoli), the checksum of every stored block, chunk, journal record, superblock
//! and RPC frame.
//!
//! Computed by `crc-fast`, which picks the fastest kernel the CPU has at run time (AVX-512
//! VPCLMULQDQ, else SSE4.2 with PCLMULQDQ, else a table) and gives the same values as any
//! other CRC32C. On an AVX-512 machine it checksums a 4 KiB block about 2.2 times as fast as
//! the `crc32c` crate used before (`docs/internals/raid.md`, "Checksums"): every byte read or
//! written through Stria is checksummed several times on its way (RAID block, chunk, frame),
//! so this is on the path of all large I/O.

use crc_fast::{CrcAlgorithm, Digest};

/// The CRC32C of `bytes`.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// The CRC32C of the bytes `crc` covers followed by `bytes`: `crc32c_append(crc32c(a), b)`
/// equals the CRC32C of `a` and `b` laid end to end.
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    // The register holds the CRC before its final inversion.
    let mut digest = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(bytes);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that are not a repeating pattern, from a fixed seed.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn the_catalogue_check_value() {
        // CRC-32C's check value over the ASCII digits 1 to 9 (the CRC catalogue's "check").
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn agrees_with_the_crc32c_crate_at_every_length_and_alignment() {
        let data = noise(3 * 4096 + 77, 7);
        for len in (0..200).chain([4095, 4096, 4097, 8192, 3 * 4096 + 13]) {
            for start in [0, 1, 3, 8, 63] {
                let slice = &data[start..start + len];
                assert_eq!(crc32c(slice), ::crc32c::crc32c(slice), "len {len} at {start}");
            }
        }
    }

    #[test]
    fn appending_equals_checksumming_the_whole() {
        let data = noise(9000, 11);
        for split in [0, 1, 17, 4096, 5000, 9000] {
            let (a, b) = data.split_at(split);
            assert_eq!(crc32c_append(crc32c(a), b), crc32c(&data), "split at {split}");
            assert_eq!(crc32c_append(crc32c(a), b), ::crc32c::crc32c_append(crc32c(a), b));
        }
    }
}
