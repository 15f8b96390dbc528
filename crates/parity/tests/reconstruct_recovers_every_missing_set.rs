//! `reconstruct` rebuilds every chunk a RAID 5 or RAID 6 stripe can lose, on every kernel: for
//! each stripe width, each single missing chunk and each pair, garbage in the missing chunks comes
//! back as the original bytes and nothing else changes.

mod common;

use common::XorShift;
use stria_parity::{Kernel, ParityError};

/// Two whole 256-byte SIMD blocks and a 64-byte tail.
const LEN: usize = 576;
const DATA_COUNT_TESTED_MAX: usize = 22;

/// A consistent stripe: `data_count` random data chunks, then P (and Q when `parity_count` is 2).
fn stripe(rng: &mut XorShift, data_count: usize, parity_count: usize, len: usize) -> Vec<Vec<u8>> {
    let mut chunks: Vec<Vec<u8>> = (0..data_count).map(|_| rng.bytes(len)).collect();
    let refs: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
    let mut p = vec![0u8; len];
    let mut q = vec![0u8; len];
    Kernel::Scalar.pq_gen(&refs, &mut p, &mut q);
    chunks.push(p);
    if parity_count == 2 {
        chunks.push(q);
    }
    chunks
}

/// Every missing set of size 0, 1 and 2 (if there are two parity chunks).
fn missing_sets(chunk_count: usize, parity_count: usize) -> Vec<Vec<usize>> {
    let mut sets = vec![vec![]];
    sets.extend((0..chunk_count).map(|i| vec![i]));
    if parity_count == 2 {
        for i in 0..chunk_count {
            for j in i + 1..chunk_count {
                // Both orders: the caller need not sort.
                sets.push(if (i + j) % 2 == 0 { vec![i, j] } else { vec![j, i] });
            }
        }
    }
    sets
}

fn check_every_missing_set(kernel: Kernel, data_count: usize, parity_count: usize, len: usize) {
    let mut rng = XorShift::new((data_count * 3 + parity_count) as u64);
    let original = stripe(&mut rng, data_count, parity_count, len);
    for missing in missing_sets(original.len(), parity_count) {
        let mut damaged = original.clone();
        for &index in &missing {
            rng.fill(&mut damaged[index]);
        }
        let mut chunks: Vec<&mut [u8]> = damaged.iter_mut().map(|c| &mut c[..]).collect();
        kernel
            .reconstruct(&mut chunks, data_count, &missing)
            .unwrap_or_else(|e| panic!("{kernel} k={data_count} missing {missing:?}: {e}"));
        for (index, (got, want)) in damaged.iter().zip(&original).enumerate() {
            assert!(
                got == want,
                "{kernel} k={data_count}+{parity_count} missing {missing:?}: chunk {index} wrong"
            );
        }
    }
}

#[test]
fn raid5_recovers_any_one_chunk_on_every_kernel() {
    for kernel in Kernel::available() {
        for data_count in 1..=DATA_COUNT_TESTED_MAX {
            check_every_missing_set(kernel, data_count, 1, LEN);
        }
    }
}

#[test]
fn raid6_recovers_any_one_or_two_chunks_on_every_kernel() {
    for kernel in Kernel::available() {
        for data_count in 2..=DATA_COUNT_TESTED_MAX {
            check_every_missing_set(kernel, data_count, 2, LEN);
        }
    }
}

#[test]
fn raid6_recovery_works_at_large_and_odd_lengths() {
    for kernel in Kernel::available() {
        for len in [65536 + 3 * 64, 1000 + 3, 64] {
            check_every_missing_set(kernel, 8, 2, len);
        }
        check_every_missing_set(kernel, 1, 2, 4096);
    }
}

#[test]
fn empty_missing_list_leaves_even_an_inconsistent_stripe_alone() {
    let mut rng = XorShift::new(7);
    let mut chunks: Vec<Vec<u8>> = (0..6).map(|_| rng.bytes(128)).collect();
    let before = chunks.clone();
    let mut refs: Vec<&mut [u8]> = chunks.iter_mut().map(|c| &mut c[..]).collect();
    stria_parity::reconstruct(&mut refs, 4, &[]).expect("nothing to do is not an error");
    assert_eq!(chunks, before);
}

#[test]
fn impossible_requests_are_errors_and_touch_nothing() {
    let mut rng = XorShift::new(8);
    let mut chunks = stripe(&mut rng, 4, 2, 128);
    let before = chunks.clone();
    let mut refs: Vec<&mut [u8]> = chunks.iter_mut().map(|c| &mut c[..]).collect();
    let kernel = Kernel::best();
    assert_eq!(
        kernel.reconstruct(&mut refs, 4, &[0, 1, 2]),
        Err(ParityError::TooManyMissing { missing_count: 3, parity_count: 2 })
    );
    assert_eq!(
        kernel.reconstruct(&mut refs, 4, &[6]),
        Err(ParityError::BadIndex { index: 6, chunk_count: 6 })
    );
    assert_eq!(
        kernel.reconstruct(&mut refs, 4, &[3, 3]),
        Err(ParityError::DuplicateIndex { index: 3 })
    );
    assert_eq!(
        kernel.reconstruct(&mut refs, 3, &[0]),
        Err(ParityError::BadLayout { chunk_count: 6, data_count: 3 })
    );
    assert_eq!(
        kernel.reconstruct(&mut refs[..5], 4, &[0, 1]),
        Err(ParityError::TooManyMissing { missing_count: 2, parity_count: 1 })
    );
    drop(refs);
    assert_eq!(chunks, before);

    let mut short = vec![0u8; 127];
    let mut refs: Vec<&mut [u8]> = chunks.iter_mut().map(|c| &mut c[..]).collect();
    refs[2] = &mut short;
    assert_eq!(
        kernel.reconstruct(&mut refs, 4, &[0]),
        Err(ParityError::LengthMismatch { index: 2, len: 127, expected_len: 128 })
    );
    assert_eq!(
        ParityError::LengthMismatch { index: 2, len: 127, expected_len: 128 }.to_string(),
        "chunk 2 is 127 bytes long but chunk 0 is 128; all chunks of a stripe must have the same \
         length"
    );
}
