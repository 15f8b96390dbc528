//! Every kernel this CPU can run produces, byte for byte, what the scalar kernel and ISA-L's
//! `xor_gen` / `pq_gen` produce: the parity on disk does not depend on which machine wrote it.

mod common;

use common::XorShift;
use isal_ref::AlignedBuf;
use stria_parity::{DATA_COUNT_MAX, Kernel, gf};

/// Lengths ISA-L accepts: one vector, a page, and 64 KiB plus an odd number of 64-byte vectors
/// (so the SIMD loops end part-way through their unrolled block).
const LENGTHS: [usize; 4] = [64, 4096, 65536 + 64, 65536 + 5 * 64];
/// Lengths no SIMD loop divides evenly; checked against ISA-L through its padding wrapper.
const ODD_LENGTHS: [usize; 5] = [1, 63, 100, 1000 + 7, 4096 + 255];
const DATA_COUNT_TESTED_MAX: usize = 24;

fn random_chunks(rng: &mut XorShift, count: usize, len: usize) -> Vec<AlignedBuf> {
    (0..count)
        .map(|_| {
            let mut chunk = AlignedBuf::zeroed(len);
            rng.fill(&mut chunk);
            chunk
        })
        .collect()
}

fn check_pq_gen(rng: &mut XorShift, data_count: usize, len: usize) {
    let data = random_chunks(rng, data_count, len);
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let mut p_scalar = vec![0u8; len];
    let mut q_scalar = vec![0u8; len];
    Kernel::Scalar.pq_gen(&refs, &mut p_scalar, &mut q_scalar);
    if data_count >= isal_ref::PQ_GEN_DATA_COUNT_MIN {
        let mut p_isal = AlignedBuf::zeroed(len);
        let mut q_isal = AlignedBuf::zeroed(len);
        isal_ref::pq_gen(&refs, &mut p_isal, &mut q_isal);
        assert!(p_scalar == p_isal[..], "scalar P differs from ISA-L: k={data_count} len={len}");
        assert!(q_scalar == q_isal[..], "scalar Q differs from ISA-L: k={data_count} len={len}");
    } else {
        // ISA-L refuses a single data chunk; there P and Q are both copies of it.
        assert!(p_scalar == refs[0] && q_scalar == refs[0]);
    }
    for kernel in Kernel::available() {
        // Garbage in the outputs proves the kernel overwrites rather than accumulates.
        let mut p = rng.bytes(len);
        let mut q = rng.bytes(len);
        kernel.pq_gen(&refs, &mut p, &mut q);
        assert!(p == p_scalar, "{kernel} P differs from scalar: k={data_count} len={len}");
        assert!(q == q_scalar, "{kernel} Q differs from scalar: k={data_count} len={len}");
    }
}

fn check_xor_gen(rng: &mut XorShift, source_count: usize, len: usize) {
    let sources = random_chunks(rng, source_count, len);
    let refs: Vec<&[u8]> = sources.iter().map(|s| &s[..]).collect();
    let mut scalar = vec![0u8; len];
    Kernel::Scalar.xor_gen(&refs, &mut scalar);
    if source_count >= isal_ref::XOR_GEN_SOURCE_COUNT_MIN {
        let mut isal = AlignedBuf::zeroed(len);
        isal_ref::xor_gen(&refs, &mut isal);
        assert!(scalar == isal[..], "scalar XOR differs from ISA-L: n={source_count} len={len}");
    } else {
        assert!(scalar == refs[0]);
    }
    for kernel in Kernel::available() {
        let mut dest = rng.bytes(len);
        kernel.xor_gen(&refs, &mut dest);
        assert!(dest == scalar, "{kernel} XOR differs from scalar: n={source_count} len={len}");
    }
}

#[test]
fn pq_gen_matches_scalar_and_isal_for_1_to_24_data_chunks() {
    let mut rng = XorShift::new(1);
    for len in LENGTHS.into_iter().chain(ODD_LENGTHS) {
        for data_count in 1..=DATA_COUNT_TESTED_MAX {
            check_pq_gen(&mut rng, data_count, len);
        }
    }
}

#[test]
fn xor_gen_matches_scalar_and_isal_for_1_to_24_sources() {
    let mut rng = XorShift::new(2);
    for len in LENGTHS.into_iter().chain(ODD_LENGTHS) {
        for source_count in 1..=DATA_COUNT_TESTED_MAX {
            check_xor_gen(&mut rng, source_count, len);
        }
    }
}

#[test]
fn kernels_accept_misaligned_slices() {
    let mut rng = XorShift::new(3);
    let len = 4096 + 64;
    let backing: Vec<Vec<u8>> = (0..6).map(|_| rng.bytes(len + 3)).collect();
    // Start every slice 1..=3 bytes past an allocation boundary.
    let refs: Vec<&[u8]> =
        backing.iter().enumerate().map(|(i, b)| &b[1 + i % 3..][..len]).collect();
    let mut p_isal = vec![0u8; len];
    let mut q_isal = vec![0u8; len];
    isal_ref::pq_gen(&refs, &mut p_isal, &mut q_isal);
    for kernel in Kernel::available() {
        let mut out = vec![0u8; len + 2];
        let mut q = vec![0u8; len + 1];
        kernel.pq_gen(&refs, &mut out[2..], &mut q[1..]);
        assert!(out[2..] == p_isal[..] && q[1..] == q_isal[..], "{kernel}");
        kernel.xor_gen(&refs, &mut out[1..len + 1]);
        assert!(out[1..len + 1] == p_isal[..], "{kernel}");
    }
}

#[test]
fn pq_gen_handles_the_largest_data_count() {
    let mut rng = XorShift::new(4);
    let len = 512;
    let data = random_chunks(&mut rng, DATA_COUNT_MAX, len);
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let mut p_isal = AlignedBuf::zeroed(len);
    let mut q_isal = AlignedBuf::zeroed(len);
    // ISA-L's own limit on vectors is far below 255, so the model here is gf::mul directly.
    for (i, (p_byte, q_byte)) in p_isal.iter_mut().zip(q_isal.iter_mut()).enumerate() {
        for (j, chunk) in refs.iter().enumerate() {
            *p_byte ^= chunk[i];
            *q_byte ^= gf::mul(gf::exp(j), chunk[i]);
        }
    }
    for kernel in Kernel::available() {
        let mut p = vec![0u8; len];
        let mut q = vec![0u8; len];
        kernel.pq_gen(&refs, &mut p, &mut q);
        assert!(p == p_isal[..] && q == q_isal[..], "{kernel}");
    }
}

#[test]
fn mul_xor_multiplies_by_every_constant() {
    let mut rng = XorShift::new(5);
    let len = 4096 + 77;
    let src = rng.bytes(len);
    let before = rng.bytes(len);
    for kernel in Kernel::available() {
        for c in 0..=255u8 {
            let mut dest = before.clone();
            kernel.mul_xor(c, &src, &mut dest);
            for i in 0..len {
                assert_eq!(dest[i], before[i] ^ gf::mul(c, src[i]), "{kernel} c={c} byte {i}");
            }
        }
    }
}

#[test]
fn q_fixture_pins_the_on_disk_format() {
    // Bytes any md or ISA-L array holds for this stripe: P = D0 ^ D1 ^ D2,
    // Q = D0 ^ 2*D1 ^ 4*D2 with 2*0x80 = 0x1d and 4*0x40 = 0x1d in the 0x11d field.
    let d0 = [0x01u8; 300];
    let d1 = [0x80u8; 300];
    let d2 = [0x40u8; 300];
    for kernel in Kernel::available() {
        let mut p = [0u8; 300];
        let mut q = [0u8; 300];
        kernel.pq_gen(&[&d0, &d1, &d2], &mut p, &mut q);
        assert!(p.iter().all(|&b| b == 0xc1), "{kernel} P");
        assert!(q.iter().all(|&b| b == 0x01 ^ 0x1d ^ 0x1d), "{kernel} Q");
    }
}

#[test]
fn best_kernel_is_available_and_scalar_always_is() {
    let available = Kernel::available();
    assert_eq!(available.first(), Some(&Kernel::best()));
    assert_eq!(available.last(), Some(&Kernel::Scalar));
    #[cfg(target_arch = "x86_64")]
    {
        let has = |feature: bool, kernel: Kernel| assert_eq!(feature, available.contains(&kernel));
        has(std::arch::is_x86_feature_detected!("avx2"), Kernel::Avx2);
        has(
            std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("gfni"),
            Kernel::Avx512Gfni,
        );
    }
    assert_eq!(Kernel::Avx512Gfni.name(), "avx512-gfni");
    assert_eq!(Kernel::Avx2.name(), "avx2");
    assert_eq!(Kernel::Scalar.name(), "scalar");
}

#[test]
fn free_functions_use_the_best_kernel() {
    let mut rng = XorShift::new(6);
    let data: Vec<Vec<u8>> = (0..5).map(|_| rng.bytes(1024)).collect();
    let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let (mut p, mut q, mut x) = (vec![0u8; 1024], vec![0u8; 1024], vec![0u8; 1024]);
    let (mut p_scalar, mut q_scalar) = (vec![0u8; 1024], vec![0u8; 1024]);
    stria_parity::pq_gen(&refs, &mut p, &mut q);
    stria_parity::xor_gen(&refs, &mut x);
    Kernel::Scalar.pq_gen(&refs, &mut p_scalar, &mut q_scalar);
    assert!(p == p_scalar && q == q_scalar && x == p_scalar);
}

#[test]
#[should_panic(expected = "source 1 is 63 bytes but the destination is 64")]
fn mismatched_lengths_panic_before_any_kernel_runs() {
    let (a, b) = ([0u8; 64], [0u8; 63]);
    let (mut p, mut q) = ([0u8; 64], [0u8; 64]);
    Kernel::best().pq_gen(&[&a, &b], &mut p, &mut q);
}
