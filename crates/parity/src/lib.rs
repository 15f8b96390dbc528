//! RAID math: XOR parity (RAID 5) and P/Q parity (RAID 6) over GF(2^8), and rebuilding missing
//! chunks from the survivors.
//!
//! This crate owns the parity format: P is the XOR of the data chunks and Q = sum of g^i * D_i in
//! GF(2^8) with polynomial 0x11d and g = 2, byte for byte what Linux md and ISA-L's `pq_gen`
//! write, so arrays and tools agree on every parity block. Kernels (portable, AVX2, AVX-512 +
//! GFNI) are chosen at run time and must all produce identical bytes.
//!
//! It must never do I/O, allocate in proportion to the data, or know about drives, stripes on
//! disk or checksums: it turns equal-length byte slices into other byte slices, nothing more.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod error;
pub mod gf;
mod reconstruct;
mod scalar;

pub use error::ParityError;

/// The most data chunks a P/Q stripe may have: Q gives data chunk i the weight g^i, and g^255 =
/// g^0, so a 256th chunk would share chunk 0's weight and two-chunk recovery would fail.
pub const DATA_COUNT_MAX: usize = gf::ORDER;

/// One implementation of the parity primitives. All of them produce identical bytes; they differ
/// only in speed and in the CPU features they need. Every method panics when called on a kernel
/// this CPU cannot run (see [`Kernel::available`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Portable Rust on 64-bit words; runs everywhere.
    Scalar,
    /// AVX2 (x86-64 since Haswell).
    Avx2,
    /// AVX-512F + AVX-512BW + GFNI (x86-64 since Ice Lake).
    Avx512Gfni,
}

/// The kernels this CPU can run, fastest first; detected once.
fn detected() -> &'static [Kernel] {
    static DETECTED: OnceLock<Vec<Kernel>> = OnceLock::new();
    DETECTED.get_or_init(|| {
        let mut kernels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("gfni")
            {
                kernels.push(Kernel::Avx512Gfni);
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                kernels.push(Kernel::Avx2);
            }
        }
        kernels.push(Kernel::Scalar);
        kernels
    })
}

impl Kernel {
    /// The fastest kernel this CPU can run.
    pub fn best() -> Kernel {
        detected()[0]
    }

    /// Every kernel this CPU can run, fastest first; `Scalar` is always last.
    pub fn available() -> Vec<Kernel> {
        detected().to_vec()
    }

    pub fn is_available(self) -> bool {
        detected().contains(&self)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512Gfni => "avx512-gfni",
        }
    }

    /// Calling a SIMD kernel on a CPU without its instructions would be undefined behaviour, so
    /// every entry point checks; the answer is cached, so this is one load and a short scan.
    fn assert_available(self) {
        assert!(self.is_available(), "parity kernel {} is not available on this CPU", self.name());
    }

    /// `dest = sources[0] ^ sources[1] ^ ...`: RAID 5 parity, or rebuilding one chunk from the
    /// others.
    ///
    /// # Panics
    /// If `sources` is empty or any source's length differs from `dest`'s.
    pub fn xor_gen(self, sources: &[&[u8]], dest: &mut [u8]) {
        self.run_xor_gen(sources, dest);
    }

    /// RAID 6 parity: `p` = XOR of `data`, `q` = sum of g^i * `data[i]`, as md and ISA-L compute.
    ///
    /// # Panics
    /// If `data` is empty or longer than [`DATA_COUNT_MAX`], or any slice's length differs from
    /// `p`'s.
    pub fn pq_gen(self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        self.run_pq_gen(data, p, q);
    }

    /// `dest ^= c * src` in GF(2^8), bytewise.
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn mul_xor(self, c: u8, src: &[u8], dest: &mut [u8]) {
        self.run_dot(&[[c]], &[src], &mut [dest], true);
    }

    /// Recomputes, in place, the chunks of one stripe listed in `missing` from the others.
    ///
    /// `chunks` holds `data_count` data chunks followed by the parity: P alone (RAID 5) or P then
    /// Q (RAID 6). Up to as many chunks as there are parity chunks may be missing; their
    /// contents on entry are ignored. An empty `missing` changes nothing.
    pub fn reconstruct(
        self,
        chunks: &mut [&mut [u8]],
        data_count: usize,
        missing: &[usize],
    ) -> Result<(), ParityError> {
        self.assert_available();
        reconstruct::reconstruct(self, chunks, data_count, missing)
    }

    // The run_* functions are the only callers of the SIMD kernels, so the checks that keep those
    // in bounds (one length for every slice) live here, next to the unsafe calls, and stay
    // `assert!`s in release builds: they cost a few compares per call.

    fn run_xor_gen(self, sources: &[&[u8]], dest: &mut [u8]) {
        self.assert_available();
        assert!(!sources.is_empty(), "xor_gen needs at least one source");
        assert_lengths("xor_gen", sources, dest.len());
        match self {
            Kernel::Scalar => scalar::xor_gen(sources, dest, 0),
            // SAFETY: the CPU has the kernel's features and every source has dest's length
            // (both checked above).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::xor_gen(sources, dest) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => unsafe { avx512::xor_gen(sources, dest) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only the scalar kernel exists off x86-64"),
        }
    }

    fn run_pq_gen(self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        self.assert_available();
        assert!(
            (1..=DATA_COUNT_MAX).contains(&data.len()),
            "pq_gen needs 1..={DATA_COUNT_MAX} data chunks, got {}",
            data.len()
        );
        assert_lengths("pq_gen", data, p.len());
        assert_eq!(q.len(), p.len(), "pq_gen: q is {} bytes but p is {}", q.len(), p.len());
        match self {
            Kernel::Scalar => scalar::pq_gen(data, p, q, 0),
            // SAFETY: as in run_xor_gen; p, q and every data chunk have one length.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::pq_gen(data, p, q) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => unsafe { avx512::pq_gen(data, p, q) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only the scalar kernel exists off x86-64"),
        }
    }

    /// For each output r: `dests[r] (^)= sum over j of coefs[j][r] * sources[j]`.
    fn run_dot<const R: usize>(
        self,
        coefs: &[[u8; R]],
        sources: &[&[u8]],
        dests: &mut [&mut [u8]; R],
        accumulate: bool,
    ) {
        self.assert_available();
        assert_eq!(coefs.len(), sources.len(), "dot: one coefficient row per source");
        let len = dests.first().map_or(0, |d| d.len());
        assert!(dests.iter().all(|d| d.len() == len), "dot: outputs differ in length");
        assert_lengths("dot", sources, len);
        match self {
            Kernel::Scalar => scalar::dot(coefs, sources, dests, accumulate, 0),
            // SAFETY: as in run_xor_gen; dests and sources have one length.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::dot(coefs, sources, dests, accumulate) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Gfni => unsafe { avx512::dot(coefs, sources, dests, accumulate) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only the scalar kernel exists off x86-64"),
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Panics unless every source is `len` bytes long.
fn assert_lengths(operation: &str, sources: &[&[u8]], len: usize) {
    for (index, source) in sources.iter().enumerate() {
        assert_eq!(
            source.len(),
            len,
            "{operation}: source {index} is {} bytes but the destination is {len}",
            source.len()
        );
    }
}

/// [`Kernel::xor_gen`] with [`Kernel::best`].
pub fn xor_gen(sources: &[&[u8]], dest: &mut [u8]) {
    Kernel::best().xor_gen(sources, dest);
}

/// [`Kernel::pq_gen`] with [`Kernel::best`].
pub fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    Kernel::best().pq_gen(data, p, q);
}

/// [`Kernel::mul_xor`] with [`Kernel::best`].
pub fn mul_xor(c: u8, src: &[u8], dest: &mut [u8]) {
    Kernel::best().mul_xor(c, src, dest);
}

/// [`Kernel::reconstruct`] with [`Kernel::best`].
pub fn reconstruct(
    chunks: &mut [&mut [u8]],
    data_count: usize,
    missing: &[usize],
) -> Result<(), ParityError> {
    Kernel::best().reconstruct(chunks, data_count, missing)
}
