//! Pieces every workload uses: its working directory, data patterns, aligned buffers, a small
//! random number generator and the run's consistency checks.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use crate::meter::PhaseResult;
use crate::target::{Target, join};

/// A splitmix64 step: the workloads' random numbers and data patterns.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A seeded generator, one per worker.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(mix64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// The content of file `file` at absolute byte `offset` onward: every byte depends on both,
/// so a read can be checked wherever it lands and whichever write put it there.
pub fn fill(buf: &mut [u8], file: u64, offset: u64) {
    let key = mix64(file ^ 0x5354_5249_4121);
    let mut i = 0;
    while i < buf.len() {
        let at = offset + i as u64;
        let word = mix64(key ^ (at / 8)).to_le_bytes();
        let from = (at % 8) as usize;
        let n = (8 - from).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[from..from + n]);
        i += n;
    }
}

/// Checks `buf` holds what [`fill`] writes; the error names the first differing byte.
pub fn verify(buf: &[u8], file: u64, offset: u64, what: &str) -> io::Result<()> {
    let mut expected = vec![0u8; buf.len().min(1 << 20)];
    for (k, piece) in buf.chunks(expected.len().max(1)).enumerate() {
        let at = offset + (k * expected.len()) as u64;
        let expected = &mut expected[..piece.len()];
        fill(expected, file, at);
        if let Some(i) = piece.iter().zip(expected.iter()).position(|(a, b)| a != b) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{what}: byte {} differs from what was written (read {:#04x}, wrote {:#04x})",
                    at + i as u64,
                    piece[i],
                    expected[i]
                ),
            ));
        }
    }
    Ok(())
}

/// A zeroed buffer whose start is 4 KiB aligned, as O_DIRECT needs.
#[derive(Debug)]
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

pub const ALIGN_BYTES: usize = 4096;

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + ALIGN_BYTES];
        let start = storage.as_ptr().align_offset(ALIGN_BYTES);
        AlignedBuf { storage, start, len }
    }

    pub fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

static RUN_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The directory one workload run works in, `stria-bench.PID.N` under the target's root.
/// It is removed at the end; what was left in it is counted first.
#[derive(Debug)]
pub struct WorkDir {
    pub root: String,
}

impl WorkDir {
    pub fn create(target: &dyn Target) -> io::Result<WorkDir> {
        let n = RUN_COUNTER.fetch_add(1, Relaxed);
        let root = format!("stria-bench.{}.{n}", std::process::id());
        target.mkdir(&root)?;
        Ok(WorkDir { root })
    }

    pub fn path(&self, rel: &str) -> String {
        join(&self.root, rel)
    }

    /// Counts what is still under the directory, removes it all, and returns the count of
    /// files that were left (a workload that cleaned up after itself leaves 0).
    pub fn remove(self, target: &dyn Target) -> io::Result<u64> {
        if !target.has_namespace() {
            return Ok(0);
        }
        let left = remove_tree(target, &self.root)?;
        Ok(left)
    }
}

/// Removes `dir` and everything below; returns how many files were in it.
pub fn remove_tree(target: &dyn Target, dir: &str) -> io::Result<u64> {
    let mut files = 0;
    for entry in target.list(dir)? {
        let path = join(dir, &entry.name);
        if entry.is_dir {
            files += remove_tree(target, &path)?;
        } else {
            target.unlink(&path)?;
            files += 1;
        }
    }
    target.rmdir(dir)?;
    Ok(files)
}

/// What a run did, for the consistency checks of the tests and the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Checks {
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub files_created: u64,
    pub files_removed: u64,
    /// Files found in the working directory at the end (the workload removes its own).
    pub files_left: u64,
    /// Whether every byte read was compared with what was written.
    pub verified: bool,
}

/// One run of a workload at one thread count on one target.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub workload: String,
    pub threads: usize,
    pub phases: Vec<PhaseResult>,
    pub checks: Checks,
    /// Workload-specific figures (frames dropped, IO500 scores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
    pub interrupted: bool,
}

impl RunResult {
    pub fn new(workload: &str, threads: usize) -> RunResult {
        RunResult {
            workload: workload.to_string(),
            threads,
            phases: Vec::new(),
            checks: Checks::default(),
            extra: None,
            interrupted: false,
        }
    }

    /// Adds a phase; its reads and writes count toward the checks.
    pub fn push(&mut self, phase: PhaseResult) {
        self.checks.bytes_written += phase.write.bytes;
        self.checks.bytes_read += phase.read.bytes;
        self.interrupted |= phase.interrupted;
        self.phases.push(phase);
    }

    pub fn phase(&self, name: &str) -> Option<&PhaseResult> {
        self.phases.iter().find(|p| p.phase == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_agree_wherever_a_read_lands() {
        let mut whole = vec![0u8; 100];
        fill(&mut whole, 7, 13);
        let mut part = vec![0u8; 37];
        fill(&mut part, 7, 13 + 21);
        assert_eq!(&whole[21..58], &part[..]);
        assert!(verify(&whole[21..58], 7, 34, "f").is_ok());
        let err = verify(&whole[21..58], 8, 34, "f").unwrap_err();
        assert!(err.to_string().contains("differs"), "{err}");
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [1, 4096, 12345] {
            let mut b = AlignedBuf::new(len);
            assert_eq!(b.as_mut().as_ptr() as usize % ALIGN_BYTES, 0);
            assert_eq!(b.as_mut().len(), len);
        }
    }

    #[test]
    fn below_stays_below() {
        let mut r = Rng::new(1);
        assert!((0..1000).all(|_| r.below(7) < 7));
    }
}
