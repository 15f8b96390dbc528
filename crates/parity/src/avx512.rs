//! The AVX-512BW + GFNI kernel: 64-byte vectors, four per loop iteration. Multiplication by any
//! constant is one `vgf2p8affineqb` with that constant's bit matrix (`gf::AFFINE_MATRIX`), so Q is
//! the direct sum of g^i * D_i: no Horner chain, hence no dependency between sources except
//! through the XOR accumulators. Sources are taken in pairs and folded with a three-way XOR
//! (`vpternlogq`), which halves the XOR instructions on ports 0 and 5, the only ones that run
//! 512-bit integer work (and `vgf2p8affineqb` runs on port 0 alone).
//!
//! Once a stripe no longer fits in L1 the loops are bound by cache bandwidth, not arithmetic: on
//! the development machine (AMD family 26, Zen 5: 48 KiB L1d and 1 MiB L2 per core, so a 1 MiB
//! 8+2 stripe and its parity stream from L2 and L3), an 8+2 P/Q pass over 1 MiB with the
//! multiplies replaced by plain XORs ran no faster than the real one. Non-temporal stores of P and
//! Q (no read for ownership) were tried there too: 75 GB/s against 99, as the parity then goes
//! to DRAM. That is why `pq_gen` prefetches, and why
//! further unrolling (tried: 8 vectors per iteration, and sources unrolled per data count) did not
//! pay.
//!
//! # Safety
//! Every function requires a CPU with AVX-512F, AVX-512BW and GFNI, and slices that all have the
//! destination's length; `Kernel` in lib.rs checks both before calling.

use core::arch::x86_64::{
    __m512i, _MM_HINT_ET0, _MM_HINT_T0, _mm_prefetch, _mm512_gf2p8affine_epi64_epi8,
    _mm512_loadu_si512, _mm512_set1_epi64, _mm512_setzero_si512, _mm512_storeu_si512,
    _mm512_ternarylogic_epi64, _mm512_xor_si512,
};

use crate::gf::{AFFINE_MATRIX, POWER_MATRIX};
use crate::scalar;

const VECTOR_BYTES: usize = 64;
const UNROLL: usize = 4;
const BLOCK_BYTES: usize = VECTOR_BYTES * UNROLL;
/// `xor_gen` takes two vectors (128 bytes) of each source per step, not four: on a Zen 5 core
/// with a 1 MiB stripe of 8+1 (coming from L3), 125-135 GB/s against 108-116 with four, level
/// with ISA-L's `xor_gen` in the same runs; eight and one were slower too. `pq_gen` keeps four
/// (two cost it 5-10%).
const XOR_UNROLL: usize = 2;
const XOR_BLOCK_BYTES: usize = VECTOR_BYTES * XOR_UNROLL;
/// `vpternlogq` truth table for `a ^ b ^ c`.
const XOR3: i32 = 0x96;

#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
unsafe fn load(source: &[u8], offset: usize) -> __m512i {
    debug_assert!(offset + VECTOR_BYTES <= source.len());
    // SAFETY: the caller keeps offset + 64 within the slice.
    unsafe { _mm512_loadu_si512(source.as_ptr().add(offset).cast()) }
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
unsafe fn store(dest: &mut [u8], offset: usize, value: __m512i) {
    debug_assert!(offset + VECTOR_BYTES <= dest.len());
    // SAFETY: the caller keeps offset + 64 within the slice.
    unsafe { _mm512_storeu_si512(dest.as_mut_ptr().add(offset).cast(), value) }
}

/// How far ahead of the loads `pq_gen` prefetches its sources into L1 (and its outputs for
/// writing). With a stripe in L2, eight blocks ahead measured about 10% faster than no prefetch on
/// a 1 MiB 8+2 stripe (512 B to 2 KiB ahead were all close); it costs some speed when the stripe
/// already sits in L1. `xor_gen` does not prefetch: there it measured slower.
const PREFETCH_DISTANCE_BYTES: usize = 8 * BLOCK_BYTES;

/// Hints that the block `PREFETCH_DISTANCE_BYTES` past `offset` of `source` will be read soon.
/// A prefetch reads nothing architecturally and never faults, so aiming past the end of the slice
/// near its end is harmless; `wrapping_add` keeps the address computation itself defined.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
fn prefetch_block(source: &[u8], offset: usize) {
    let ahead = source.as_ptr().wrapping_add(offset + PREFETCH_DISTANCE_BYTES);
    for line in 0..UNROLL {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * VECTOR_BYTES).cast());
    }
}

/// As `prefetch_block`, but for lines about to be written: fetching them for ownership early
/// takes the read-for-ownership off the critical path of the stores.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
fn prefetch_block_for_write(dest: &[u8], offset: usize) {
    let ahead = dest.as_ptr().wrapping_add(offset + PREFETCH_DISTANCE_BYTES);
    for line in 0..UNROLL {
        _mm_prefetch::<_MM_HINT_ET0>(ahead.wrapping_add(line * VECTOR_BYTES).cast());
    }
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64::<XOR3>(a, b, c)
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
fn matrix(c: u8) -> __m512i {
    _mm512_set1_epi64(AFFINE_MATRIX[c as usize] as i64)
}

/// The matrix multiplying by g^i; `i` is below 255 (pq_gen's caller checks the data count).
#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
fn power_matrix(i: usize) -> __m512i {
    _mm512_set1_epi64(POWER_MATRIX[i] as i64)
}

/// `c * value` bytewise, `matrix` being `matrix(c)`.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
#[inline]
fn mul(matrix: __m512i, value: __m512i) -> __m512i {
    _mm512_gf2p8affine_epi64_epi8::<0>(value, matrix)
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(crate) unsafe fn xor_gen(sources: &[&[u8]], dest: &mut [u8]) {
    let len = dest.len();
    let (first, rest) = sources.split_first().expect("xor_gen needs at least one source");
    let (pairs, odd) = rest.as_chunks::<2>();
    let mut offset = 0;
    while offset + XOR_BLOCK_BYTES <= len {
        // SAFETY (all loads and stores here): offset + XOR_BLOCK_BYTES <= len, the length of every
        // slice.
        unsafe {
            let mut acc: [__m512i; XOR_UNROLL] =
                core::array::from_fn(|u| load(first, offset + u * VECTOR_BYTES));
            for [a, b] in pairs {
                for (u, acc) in acc.iter_mut().enumerate() {
                    let at = offset + u * VECTOR_BYTES;
                    *acc = xor3(*acc, load(a, at), load(b, at));
                }
            }
            for source in odd {
                for (u, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_xor_si512(*acc, load(source, offset + u * VECTOR_BYTES));
                }
            }
            for (u, acc) in acc.iter().enumerate() {
                store(dest, offset + u * VECTOR_BYTES, *acc);
            }
        }
        offset += XOR_BLOCK_BYTES;
    }
    scalar::xor_gen(sources, dest, offset);
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(crate) unsafe fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let len = p.len();
    // D0's Q coefficient is g^0 = 1, so it starts both sums without a multiply.
    let (first, rest) = data.split_first().expect("pq_gen needs at least one data chunk");
    let (pairs, odd) = rest.as_chunks::<2>();
    let mut offset = 0;
    while offset + BLOCK_BYTES <= len {
        // SAFETY (all loads and stores here): offset + BLOCK_BYTES <= len, the length of every
        // slice.
        unsafe {
            prefetch_block(first, offset);
            let mut p_acc: [__m512i; UNROLL] =
                core::array::from_fn(|u| load(first, offset + u * VECTOR_BYTES));
            let mut q_acc = p_acc;
            for (pair_index, [a, b]) in pairs.iter().enumerate() {
                let index = 1 + 2 * pair_index;
                let matrix_a = power_matrix(index);
                let matrix_b = power_matrix(index + 1);
                prefetch_block(a, offset);
                prefetch_block(b, offset);
                for u in 0..UNROLL {
                    let at = offset + u * VECTOR_BYTES;
                    let (x, y) = (load(a, at), load(b, at));
                    p_acc[u] = xor3(p_acc[u], x, y);
                    q_acc[u] = xor3(q_acc[u], mul(matrix_a, x), mul(matrix_b, y));
                }
            }
            if let [last] = odd {
                let matrix_last = power_matrix(data.len() - 1);
                prefetch_block(last, offset);
                for u in 0..UNROLL {
                    let x = load(last, offset + u * VECTOR_BYTES);
                    p_acc[u] = _mm512_xor_si512(p_acc[u], x);
                    q_acc[u] = _mm512_xor_si512(q_acc[u], mul(matrix_last, x));
                }
            }
            prefetch_block_for_write(p, offset);
            prefetch_block_for_write(q, offset);
            for u in 0..UNROLL {
                store(p, offset + u * VECTOR_BYTES, p_acc[u]);
                store(q, offset + u * VECTOR_BYTES, q_acc[u]);
            }
        }
        offset += BLOCK_BYTES;
    }
    scalar::pq_gen(data, p, q, offset);
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(crate) unsafe fn dot<const R: usize>(
    coefs: &[[u8; R]],
    sources: &[&[u8]],
    dests: &mut [&mut [u8]; R],
    accumulate: bool,
) {
    let len = dests.first().map_or(0, |d| d.len());
    let (coef_pairs, coef_odd) = coefs.as_chunks::<2>();
    let (source_pairs, source_odd) = sources.as_chunks::<2>();
    let mut offset = 0;
    while offset + BLOCK_BYTES <= len {
        // SAFETY (all loads and stores here): offset + BLOCK_BYTES <= len, the length of every
        // slice.
        unsafe {
            let mut acc: [[__m512i; UNROLL]; R] = core::array::from_fn(|r| {
                core::array::from_fn(|u| {
                    if accumulate {
                        load(&*dests[r], offset + u * VECTOR_BYTES)
                    } else {
                        _mm512_setzero_si512()
                    }
                })
            });
            for ([row_a, row_b], [a, b]) in coef_pairs.iter().zip(source_pairs) {
                let matrix_a: [__m512i; R] = core::array::from_fn(|r| matrix(row_a[r]));
                let matrix_b: [__m512i; R] = core::array::from_fn(|r| matrix(row_b[r]));
                let xs: [__m512i; UNROLL] =
                    core::array::from_fn(|u| load(a, offset + u * VECTOR_BYTES));
                let ys: [__m512i; UNROLL] =
                    core::array::from_fn(|u| load(b, offset + u * VECTOR_BYTES));
                for ((acc, &m_a), &m_b) in acc.iter_mut().zip(&matrix_a).zip(&matrix_b) {
                    for ((acc, &x), &y) in acc.iter_mut().zip(&xs).zip(&ys) {
                        *acc = xor3(*acc, mul(m_a, x), mul(m_b, y));
                    }
                }
            }
            for (row, source) in coef_odd.iter().zip(source_odd) {
                let matrices: [__m512i; R] = core::array::from_fn(|r| matrix(row[r]));
                let xs: [__m512i; UNROLL] =
                    core::array::from_fn(|u| load(source, offset + u * VECTOR_BYTES));
                for (acc, &m) in acc.iter_mut().zip(&matrices) {
                    for (acc, &x) in acc.iter_mut().zip(&xs) {
                        *acc = _mm512_xor_si512(*acc, mul(m, x));
                    }
                }
            }
            for (acc, dest) in acc.iter().zip(dests.iter_mut()) {
                for (u, &value) in acc.iter().enumerate() {
                    store(dest, offset + u * VECTOR_BYTES, value);
                }
            }
        }
        offset += BLOCK_BYTES;
    }
    scalar::dot(coefs, sources, dests, accumulate, offset);
}
