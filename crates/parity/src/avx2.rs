//! The AVX2 kernel: 32-byte vectors, four per loop iteration so independent chains hide the
//! latency of each step. Q is built by Horner's rule with a four-instruction multiply-by-2 (as md's
//! raid6 AVX2 code does); multiplication by any other constant uses the two 16-entry nibble tables
//! and `vpshufb`.
//!
//! # Safety
//! Every function requires a CPU with AVX2 and slices that all have the destination's length;
//! `Kernel` in lib.rs checks both before calling.

use core::arch::x86_64::{
    __m256i, _mm_loadu_si128, _mm256_add_epi8, _mm256_and_si256, _mm256_broadcastsi128_si256,
    _mm256_cmpgt_epi8, _mm256_loadu_si256, _mm256_set1_epi8, _mm256_setzero_si256,
    _mm256_shuffle_epi8, _mm256_srli_epi16, _mm256_storeu_si256, _mm256_xor_si256,
};

use crate::gf::NIBBLE_PRODUCTS;
use crate::scalar;

const VECTOR_BYTES: usize = 32;
const UNROLL: usize = 4;
const BLOCK_BYTES: usize = VECTOR_BYTES * UNROLL;

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load(source: &[u8], offset: usize) -> __m256i {
    debug_assert!(offset + VECTOR_BYTES <= source.len());
    // SAFETY: the caller keeps offset + 32 within the slice.
    unsafe { _mm256_loadu_si256(source.as_ptr().add(offset).cast()) }
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store(dest: &mut [u8], offset: usize, value: __m256i) {
    debug_assert!(offset + VECTOR_BYTES <= dest.len());
    // SAFETY: the caller keeps offset + 32 within the slice.
    unsafe { _mm256_storeu_si256(dest.as_mut_ptr().add(offset).cast(), value) }
}

/// Doubles every byte: add to itself, and fold 0x1d into the bytes whose top bit was set (the
/// signed compare against zero turns exactly those bytes into 0xff).
#[target_feature(enable = "avx2")]
#[inline]
fn mul2(value: __m256i) -> __m256i {
    let overflow = _mm256_cmpgt_epi8(_mm256_setzero_si256(), value);
    let reduction = _mm256_and_si256(overflow, _mm256_set1_epi8(0x1d));
    _mm256_xor_si256(_mm256_add_epi8(value, value), reduction)
}

/// The low- and high-nibble product tables for `c`, each repeated in both 128-bit lanes
/// (`vpshufb` looks up within a lane).
#[target_feature(enable = "avx2")]
#[inline]
fn nibble_tables(c: u8) -> (__m256i, __m256i) {
    let table = &NIBBLE_PRODUCTS[c as usize];
    // SAFETY: the table is 32 bytes long; both 16-byte reads lie within it.
    unsafe {
        let low = _mm_loadu_si128(table.as_ptr().cast());
        let high = _mm_loadu_si128(table.as_ptr().add(16).cast());
        (_mm256_broadcastsi128_si256(low), _mm256_broadcastsi128_si256(high))
    }
}

#[target_feature(enable = "avx2")]
#[inline]
fn mul_by_tables(tables: (__m256i, __m256i), value: __m256i) -> __m256i {
    let mask = _mm256_set1_epi8(0x0f);
    let low = _mm256_and_si256(value, mask);
    let high = _mm256_and_si256(_mm256_srli_epi16::<4>(value), mask);
    _mm256_xor_si256(_mm256_shuffle_epi8(tables.0, low), _mm256_shuffle_epi8(tables.1, high))
}

#[target_feature(enable = "avx2")]
pub(crate) unsafe fn xor_gen(sources: &[&[u8]], dest: &mut [u8]) {
    let len = dest.len();
    let mut offset = 0;
    while offset + BLOCK_BYTES <= len {
        // SAFETY (all loads and stores here): offset + BLOCK_BYTES <= len, the length of every
        // slice.
        unsafe {
            let mut acc: [__m256i; UNROLL] =
                core::array::from_fn(|u| load(sources[0], offset + u * VECTOR_BYTES));
            for source in &sources[1..] {
                for (u, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_xor_si256(*a, load(source, offset + u * VECTOR_BYTES));
                }
            }
            for (u, a) in acc.iter().enumerate() {
                store(dest, offset + u * VECTOR_BYTES, *a);
            }
        }
        offset += BLOCK_BYTES;
    }
    scalar::xor_gen(sources, dest, offset);
}

#[target_feature(enable = "avx2")]
pub(crate) unsafe fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let len = p.len();
    let (last, rest) = data.split_last().expect("pq_gen needs at least one data chunk");
    let mut offset = 0;
    while offset + BLOCK_BYTES <= len {
        // SAFETY (all loads and stores here): offset + BLOCK_BYTES <= len, the length of every
        // slice.
        unsafe {
            let mut p_acc: [__m256i; UNROLL] =
                core::array::from_fn(|u| load(last, offset + u * VECTOR_BYTES));
            let mut q_acc = p_acc;
            for chunk in rest.iter().rev() {
                for u in 0..UNROLL {
                    let d = load(chunk, offset + u * VECTOR_BYTES);
                    p_acc[u] = _mm256_xor_si256(p_acc[u], d);
                    q_acc[u] = _mm256_xor_si256(mul2(q_acc[u]), d);
                }
            }
            for u in 0..UNROLL {
                store(p, offset + u * VECTOR_BYTES, p_acc[u]);
                store(q, offset + u * VECTOR_BYTES, q_acc[u]);
            }
        }
        offset += BLOCK_BYTES;
    }
    scalar::pq_gen(data, p, q, offset);
}

/// Two vectors per iteration rather than four: with two outputs the four tables, the
/// accumulators and the temporaries already fill the 16 registers.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dot<const R: usize>(
    coefs: &[[u8; R]],
    sources: &[&[u8]],
    dests: &mut [&mut [u8]; R],
    accumulate: bool,
) {
    const DOT_UNROLL: usize = 2;
    const DOT_BLOCK_BYTES: usize = VECTOR_BYTES * DOT_UNROLL;
    let len = dests.first().map_or(0, |d| d.len());
    let mut offset = 0;
    while offset + DOT_BLOCK_BYTES <= len {
        // SAFETY (all loads and stores here): offset + DOT_BLOCK_BYTES <= len, the length of
        // every slice.
        unsafe {
            let mut acc: [[__m256i; DOT_UNROLL]; R] = core::array::from_fn(|r| {
                core::array::from_fn(|u| {
                    if accumulate {
                        load(&*dests[r], offset + u * VECTOR_BYTES)
                    } else {
                        _mm256_setzero_si256()
                    }
                })
            });
            for (row, source) in coefs.iter().zip(sources) {
                let tables: [(__m256i, __m256i); R] =
                    core::array::from_fn(|r| nibble_tables(row[r]));
                let xs: [__m256i; DOT_UNROLL] =
                    core::array::from_fn(|u| load(source, offset + u * VECTOR_BYTES));
                for (acc, &tables) in acc.iter_mut().zip(&tables) {
                    for (acc, &x) in acc.iter_mut().zip(&xs) {
                        *acc = _mm256_xor_si256(*acc, mul_by_tables(tables, x));
                    }
                }
            }
            for (acc, dest) in acc.iter().zip(dests.iter_mut()) {
                for (u, &value) in acc.iter().enumerate() {
                    store(dest, offset + u * VECTOR_BYTES, value);
                }
            }
        }
        offset += DOT_BLOCK_BYTES;
    }
    scalar::dot(coefs, sources, dests, accumulate, offset);
}
