//! Safe wrappers over the few functions of Debian's libisal (ISA-L 2.30) that `stria-parity` is
//! checked and measured against: `xor_gen`, `pq_gen`, and the Reed-Solomon pieces
//! (`gf_gen_cauchy1_matrix`, `ec_init_tables`, `ec_encode_data`).
//!
//! Test and benchmark code only: nothing that ships may depend on this crate. The wrappers check
//! ISA-L's rules (alignment, length multiples, source counts) themselves, because ISA-L answers a
//! broken rule with a bare failure code or silently wrong output. Each raid function comes twice:
//! `*_aligned`, which asserts the rules and calls straight through (for timed loops), and a
//! convenience form that copies into aligned, padded scratch when the caller's buffers do not
//! qualify (for tests; never inside a timed region).

use std::alloc::{self, Layout};
use std::ffi::{c_int, c_uchar, c_void};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

mod ffi {
    use std::ffi::{c_int, c_uchar, c_void};

    unsafe extern "C" {
        pub fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        pub fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        pub fn gf_gen_cauchy1_matrix(a: *mut c_uchar, m: c_int, k: c_int);
        pub fn ec_init_tables(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);
        pub fn ec_encode_data(
            len: c_int,
            k: c_int,
            rows: c_int,
            gftbls: *mut c_uchar,
            data: *mut *mut c_uchar,
            coding: *mut *mut c_uchar,
        );
    }
}

/// `raid.h`: "Src and dest pointers must be aligned to 32B" for `xor_gen` and `pq_gen`.
pub const RAID_ALIGN_BYTES: usize = 32;
/// `raid.h`: `pq_gen`'s length "Must be 32B aligned"; the library returns failure otherwise.
pub const PQ_GEN_LEN_MULTIPLE: usize = 32;
/// `pq_gen` returns failure for fewer than 4 vectors, i.e. fewer than 2 data sources.
pub const PQ_GEN_DATA_COUNT_MIN: usize = 2;
/// `xor_gen` returns failure for fewer than 3 vectors, i.e. fewer than 2 sources.
pub const XOR_GEN_SOURCE_COUNT_MIN: usize = 2;
/// Bounds the pointer arrays, which live on the stack so that calls allocate nothing.
pub const VECTS_MAX: usize = 64;
/// Alignment of [`AlignedBuf`]: a cache line, which satisfies every ISA-L rule.
pub const BUF_ALIGN_BYTES: usize = 64;

/// A zeroed heap buffer aligned to [`BUF_ALIGN_BYTES`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len == 0 {
            return AlignedBuf { ptr: NonNull::<[u8; BUF_ALIGN_BYTES]>::dangling().cast(), len };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    pub fn from_slice(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.copy_from_slice(bytes);
        buf
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, BUF_ALIGN_BYTES).expect("buffer length overflows a Layout")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes (or dangling and aligned when len is 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish_non_exhaustive()
    }
}

fn is_aligned(bytes: &[u8]) -> bool {
    (bytes.as_ptr() as usize).is_multiple_of(RAID_ALIGN_BYTES)
}

fn c_len(len: usize) -> c_int {
    c_int::try_from(len).expect("ISA-L lengths are C ints; buffer too long")
}

/// Copies `bytes` into a fresh aligned buffer of `padded_len` bytes (zero padding).
fn aligned_copy(bytes: &[u8], padded_len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(padded_len);
    buf[..bytes.len()].copy_from_slice(bytes);
    buf
}

fn assert_same_lengths(operation: &str, sources: &[&[u8]], len: usize) {
    for (index, source) in sources.iter().enumerate() {
        assert_eq!(
            source.len(),
            len,
            "{operation}: source {index} length differs from the output's"
        );
    }
}

/// ISA-L `xor_gen` on buffers that already meet its rules; for timed loops.
///
/// # Panics
/// If a buffer is not 32-byte aligned, lengths differ, or there are fewer than
/// [`XOR_GEN_SOURCE_COUNT_MIN`] sources.
pub fn xor_gen_aligned(sources: &[&[u8]], dest: &mut [u8]) {
    let vects = sources.len() + 1;
    assert!(
        (XOR_GEN_SOURCE_COUNT_MIN + 1..=VECTS_MAX).contains(&vects),
        "ISA-L xor_gen takes {XOR_GEN_SOURCE_COUNT_MIN}..{VECTS_MAX} sources, got {}",
        sources.len()
    );
    assert_same_lengths("xor_gen", sources, dest.len());
    assert!(
        sources.iter().all(|s| is_aligned(s)) && is_aligned(dest),
        "ISA-L xor_gen needs {RAID_ALIGN_BYTES}-byte aligned buffers"
    );
    let mut array = [std::ptr::null_mut::<c_void>(); VECTS_MAX];
    for (slot, source) in array.iter_mut().zip(sources) {
        // ISA-L only reads the sources; the array type is mutable because dest shares it.
        *slot = source.as_ptr().cast_mut().cast();
    }
    array[sources.len()] = dest.as_mut_ptr().cast();
    // SAFETY: vects valid pointers, each to len bytes, 32-byte aligned; dest is exclusively ours.
    let status = unsafe { ffi::xor_gen(vects as c_int, c_len(dest.len()), array.as_mut_ptr()) };
    assert_eq!(status, 0, "ISA-L xor_gen failed");
}

/// ISA-L `xor_gen` on any buffers: copies into aligned scratch when needed.
pub fn xor_gen(sources: &[&[u8]], dest: &mut [u8]) {
    if sources.iter().all(|s| is_aligned(s)) && is_aligned(dest) {
        return xor_gen_aligned(sources, dest);
    }
    assert_same_lengths("xor_gen", sources, dest.len());
    let len = dest.len();
    let copies: Vec<AlignedBuf> = sources.iter().map(|s| aligned_copy(s, len)).collect();
    let copy_refs: Vec<&[u8]> = copies.iter().map(|c| &c[..]).collect();
    let mut out = AlignedBuf::zeroed(len);
    xor_gen_aligned(&copy_refs, &mut out);
    dest.copy_from_slice(&out);
}

/// ISA-L `pq_gen` on buffers that already meet its rules; for timed loops.
///
/// # Panics
/// If a buffer is not 32-byte aligned, the length is not a multiple of 32, lengths differ, or
/// there are fewer than [`PQ_GEN_DATA_COUNT_MIN`] data buffers.
pub fn pq_gen_aligned(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let vects = data.len() + 2;
    assert!(
        (PQ_GEN_DATA_COUNT_MIN + 2..=VECTS_MAX).contains(&vects),
        "ISA-L pq_gen takes {PQ_GEN_DATA_COUNT_MIN}..{} data buffers, got {}",
        VECTS_MAX - 2,
        data.len()
    );
    assert_same_lengths("pq_gen", data, p.len());
    assert_eq!(q.len(), p.len(), "pq_gen: p and q lengths differ");
    assert!(
        p.len().is_multiple_of(PQ_GEN_LEN_MULTIPLE),
        "ISA-L pq_gen needs a length that is a multiple of {PQ_GEN_LEN_MULTIPLE}"
    );
    assert!(
        data.iter().all(|d| is_aligned(d)) && is_aligned(p) && is_aligned(q),
        "ISA-L pq_gen needs {RAID_ALIGN_BYTES}-byte aligned buffers"
    );
    let mut array = [std::ptr::null_mut::<c_void>(); VECTS_MAX];
    for (slot, source) in array.iter_mut().zip(data) {
        *slot = source.as_ptr().cast_mut().cast();
    }
    array[data.len()] = p.as_mut_ptr().cast();
    array[data.len() + 1] = q.as_mut_ptr().cast();
    // SAFETY: vects valid aligned pointers to len bytes each; p and q are exclusively ours.
    let status = unsafe { ffi::pq_gen(vects as c_int, c_len(p.len()), array.as_mut_ptr()) };
    assert_eq!(status, 0, "ISA-L pq_gen failed");
}

/// ISA-L `pq_gen` on any buffers: copies into aligned scratch, padded to a multiple of 32 bytes
/// with zeros (which changes no output byte: P and Q are computed bytewise), when needed.
pub fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    let len = p.len();
    let qualifies = len.is_multiple_of(PQ_GEN_LEN_MULTIPLE)
        && data.iter().all(|d| is_aligned(d))
        && is_aligned(p)
        && is_aligned(q);
    if qualifies {
        return pq_gen_aligned(data, p, q);
    }
    assert_same_lengths("pq_gen", data, len);
    assert_eq!(q.len(), len, "pq_gen: p and q lengths differ");
    let padded_len = len.next_multiple_of(PQ_GEN_LEN_MULTIPLE);
    let copies: Vec<AlignedBuf> = data.iter().map(|d| aligned_copy(d, padded_len)).collect();
    let copy_refs: Vec<&[u8]> = copies.iter().map(|c| &c[..]).collect();
    let mut p_out = AlignedBuf::zeroed(padded_len);
    let mut q_out = AlignedBuf::zeroed(padded_len);
    pq_gen_aligned(&copy_refs, &mut p_out, &mut q_out);
    p.copy_from_slice(&p_out[..len]);
    q.copy_from_slice(&q_out[..len]);
}

/// ISA-L's Cauchy generator matrix: `total_count` rows by `data_count` columns, the identity on
/// top and 1 / (i ^ j) below it.
pub fn gf_gen_cauchy1_matrix(total_count: usize, data_count: usize) -> Vec<u8> {
    assert!(data_count >= 1 && total_count > data_count && total_count <= 256);
    let mut matrix = vec![0u8; total_count * data_count];
    // SAFETY: the buffer holds m * k bytes, which is all the function writes.
    unsafe {
        ffi::gf_gen_cauchy1_matrix(matrix.as_mut_ptr(), c_len(total_count), c_len(data_count));
    }
    matrix
}

/// The expanded multiplication tables `ec_encode_data` needs for one coefficient matrix of
/// `output_count` rows by `source_count` columns.
#[derive(Clone, Debug)]
pub struct EcTables {
    source_count: usize,
    output_count: usize,
    tables: Vec<u8>,
}

/// Bytes of expanded table per coefficient (`erasure_code.h`: "32bytes is generated for each
/// input coefficient").
const EC_TABLE_BYTES_PER_COEF: usize = 32;

/// Runs `ec_init_tables` on a row-major `output_count` x `source_count` coefficient matrix.
pub fn ec_init_tables(source_count: usize, output_count: usize, coefs: &[u8]) -> EcTables {
    assert!((1..=VECTS_MAX).contains(&source_count) && (1..=VECTS_MAX).contains(&output_count));
    assert_eq!(coefs.len(), source_count * output_count, "coefficient matrix size");
    let mut coefs = coefs.to_vec();
    let mut tables = vec![0u8; EC_TABLE_BYTES_PER_COEF * source_count * output_count];
    // SAFETY: coefs holds k * rows bytes (only read); tables holds 32 * k * rows bytes.
    unsafe {
        ffi::ec_init_tables(
            c_len(source_count),
            c_len(output_count),
            coefs.as_mut_ptr(),
            tables.as_mut_ptr(),
        );
    }
    EcTables { source_count, output_count, tables }
}

impl EcTables {
    /// Tables for encoding `parity_count` Cauchy parity chunks over `data_count` data chunks.
    pub fn cauchy(data_count: usize, parity_count: usize) -> EcTables {
        let matrix = gf_gen_cauchy1_matrix(data_count + parity_count, data_count);
        ec_init_tables(data_count, parity_count, &matrix[data_count * data_count..])
    }

    /// `ec_encode_data`: `outputs[r]` = sum over j of `coef[r][j] * sources[j]`. Any alignment
    /// and length is accepted by ISA-L here, and nothing is allocated.
    pub fn encode(&self, sources: &[&[u8]], outputs: &mut [&mut [u8]]) {
        assert_eq!(sources.len(), self.source_count, "ec_encode_data: source count");
        assert_eq!(outputs.len(), self.output_count, "ec_encode_data: output count");
        let len = outputs.first().map_or(0, |o| o.len());
        assert_same_lengths("ec_encode_data", sources, len);
        assert!(outputs.iter().all(|o| o.len() == len), "ec_encode_data: output lengths differ");
        let mut source_ptrs = [std::ptr::null_mut::<c_uchar>(); VECTS_MAX];
        for (slot, source) in source_ptrs.iter_mut().zip(sources) {
            *slot = source.as_ptr().cast_mut();
        }
        let mut output_ptrs = [std::ptr::null_mut::<c_uchar>(); VECTS_MAX];
        for (slot, output) in output_ptrs.iter_mut().zip(outputs.iter_mut()) {
            *slot = output.as_mut_ptr();
        }
        // SAFETY: k source pointers and rows output pointers, each to len bytes; the tables were
        // built for this k and rows and are only read.
        unsafe {
            ffi::ec_encode_data(
                c_len(len),
                c_len(self.source_count),
                c_len(self.output_count),
                self.tables.as_ptr().cast_mut(),
                source_ptrs.as_mut_ptr(),
                output_ptrs.as_mut_ptr(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pq_gen_of_two_sources_matches_the_md_field() {
        // Q = D0 + 2 * D1; 2 * 0x80 reduces by 0x11d to 0x1d.
        let d0 = AlignedBuf::from_slice(&[0x01; 64]);
        let d1 = AlignedBuf::from_slice(&[0x80; 64]);
        let mut p = AlignedBuf::zeroed(64);
        let mut q = AlignedBuf::zeroed(64);
        pq_gen_aligned(&[&d0, &d1], &mut p, &mut q);
        assert!(p.iter().all(|&b| b == 0x81));
        assert!(q.iter().all(|&b| b == 0x1c));
    }

    #[test]
    fn copying_wrappers_agree_with_aligned_calls_on_odd_buffers() {
        let backing: Vec<u8> = (0..400u32).map(|i| (i * 7 + 3) as u8).collect();
        // Offsets of 1 and 3 make every slice misaligned; 99 is no multiple of 32.
        let (a, b, c) = (&backing[1..100], &backing[103..202], &backing[205..304]);
        let mut p = vec![0u8; 99];
        let mut q = vec![0u8; 99];
        pq_gen(&[a, b, c], &mut p, &mut q);
        let mut x = vec![0u8; 99];
        xor_gen(&[a, b, c], &mut x);
        for i in 0..99 {
            assert_eq!(p[i], a[i] ^ b[i] ^ c[i]);
            assert_eq!(x[i], p[i]);
        }
    }

    #[test]
    fn cauchy_encode_of_zero_data_is_zero_and_tables_have_isal_size() {
        let tables = EcTables::cauchy(8, 2);
        assert_eq!(tables.tables.len(), 32 * 8 * 2);
        let data = vec![vec![0u8; 128]; 8];
        let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        let mut out0 = vec![0xffu8; 128];
        let mut out1 = vec![0xffu8; 128];
        tables.encode(&refs, &mut [&mut out0, &mut out1]);
        assert!(out0.iter().chain(&out1).all(|&b| b == 0));
    }
}
