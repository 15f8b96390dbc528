//! The portable kernel: 64-bit words for XOR and multiply-by-2, nibble tables for multiplication
//! by any other constant. It runs everywhere, is the model the SIMD kernels are tested against,
//! and finishes the bytes past the last whole vector for them (hence the `start` offsets).
//!
//! Every function here trusts its caller (`Kernel` in lib.rs) to have checked that all slices
//! have the same length; a violation panics on a slice index rather than misbehaving.

use crate::gf::NIBBLE_PRODUCTS;

/// Bytes handled per pass over the sources: small enough that the destination block stays in
/// L1 while every source is folded into it.
const BLOCK_BYTES: usize = 1024;

const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
const LOW_SEVEN_BITS: u64 = 0x7f7f_7f7f_7f7f_7f7f;
/// The low byte of the polynomial: what an overflowing doubling folds back in.
const REDUCTION: u64 = 0x1d;

/// Multiplies each of the 8 bytes of `word` by 2 in GF(2^8): shift each byte left, and where a
/// byte's top bit fell off, reduce by the polynomial.
#[inline]
pub(crate) fn mul2_word(word: u64) -> u64 {
    let overflow = (word & HIGH_BITS) >> 7;
    ((word & LOW_SEVEN_BITS) << 1) ^ (overflow * REDUCTION)
}

#[inline]
fn mul2_byte(byte: u8) -> u8 {
    (byte << 1) ^ if byte & 0x80 != 0 { REDUCTION as u8 } else { 0 }
}

/// `dest ^= src`, both the same length.
fn xor_into(dest: &mut [u8], src: &[u8]) {
    let (dest_words, dest_tail) = dest.as_chunks_mut::<8>();
    let (src_words, src_tail) = src.as_chunks::<8>();
    for (d, s) in dest_words.iter_mut().zip(src_words) {
        *d = (u64::from_ne_bytes(*d) ^ u64::from_ne_bytes(*s)).to_ne_bytes();
    }
    for (d, s) in dest_tail.iter_mut().zip(src_tail) {
        *d ^= s;
    }
}

/// `p ^= d; q = 2 * q ^ d`: one Horner step of P/Q generation.
fn pq_step(p: &mut [u8], q: &mut [u8], d: &[u8]) {
    let (p_words, p_tail) = p.as_chunks_mut::<8>();
    let (q_words, q_tail) = q.as_chunks_mut::<8>();
    let (d_words, d_tail) = d.as_chunks::<8>();
    for ((pw, qw), dw) in p_words.iter_mut().zip(q_words.iter_mut()).zip(d_words) {
        let data = u64::from_ne_bytes(*dw);
        *pw = (u64::from_ne_bytes(*pw) ^ data).to_ne_bytes();
        *qw = (mul2_word(u64::from_ne_bytes(*qw)) ^ data).to_ne_bytes();
    }
    for ((pb, qb), db) in p_tail.iter_mut().zip(q_tail.iter_mut()).zip(d_tail) {
        *pb ^= db;
        *qb = mul2_byte(*qb) ^ db;
    }
}

/// `dest ^= c * src`, both the same length.
fn mul_xor_into(c: u8, dest: &mut [u8], src: &[u8]) {
    let table = &NIBBLE_PRODUCTS[c as usize];
    let (low, high) = table.split_at(16);
    for (d, &s) in dest.iter_mut().zip(src) {
        *d ^= low[(s & 15) as usize] ^ high[(s >> 4) as usize];
    }
}

/// `dest[start..] = XOR of sources[..][start..]`.
pub(crate) fn xor_gen(sources: &[&[u8]], dest: &mut [u8], start: usize) {
    let len = dest.len();
    let mut offset = start;
    while offset < len {
        let end = len.min(offset + BLOCK_BYTES);
        let block = &mut dest[offset..end];
        block.copy_from_slice(&sources[0][offset..end]);
        for source in &sources[1..] {
            xor_into(block, &source[offset..end]);
        }
        offset = end;
    }
}

/// P and Q of `data` over `start..`, Q by Horner's rule from the last chunk down.
pub(crate) fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8], start: usize) {
    let len = p.len();
    let (last, rest) = data.split_last().expect("pq_gen needs at least one data chunk");
    let mut offset = start;
    while offset < len {
        let end = len.min(offset + BLOCK_BYTES);
        let p_block = &mut p[offset..end];
        let q_block = &mut q[offset..end];
        p_block.copy_from_slice(&last[offset..end]);
        q_block.copy_from_slice(&last[offset..end]);
        for chunk in rest.iter().rev() {
            pq_step(p_block, q_block, &chunk[offset..end]);
        }
        offset = end;
    }
}

/// For each output `r`: `dests[r][start..] (^)= XOR over j of coefs[j][r] * sources[j][start..]`,
/// overwriting unless `accumulate`.
pub(crate) fn dot<const R: usize>(
    coefs: &[[u8; R]],
    sources: &[&[u8]],
    dests: &mut [&mut [u8]; R],
    accumulate: bool,
    start: usize,
) {
    let len = dests.first().map_or(0, |d| d.len());
    let mut offset = start;
    while offset < len {
        let end = len.min(offset + BLOCK_BYTES);
        for dest in dests.iter_mut() {
            if !accumulate {
                dest[offset..end].fill(0);
            }
        }
        for (row, source) in coefs.iter().zip(sources) {
            for (dest, &c) in dests.iter_mut().zip(row) {
                mul_xor_into(c, &mut dest[offset..end], &source[offset..end]);
            }
        }
        offset = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gf;

    #[test]
    fn mul2_word_doubles_each_byte_independently() {
        for byte in 0..=255u8 {
            let word = u64::from_ne_bytes([byte, 0x80, byte ^ 0x55, 0xff, 0, byte, 1, 0x7f]);
            let doubled = mul2_word(word).to_ne_bytes();
            for (lane, &x) in word.to_ne_bytes().iter().enumerate() {
                assert_eq!(doubled[lane], gf::mul(2, x), "lane {lane} of {word:#x}");
            }
            assert_eq!(mul2_byte(byte), gf::mul(2, byte));
        }
    }
}
