//! Helpers shared by the integration tests: scratch directories and recognisable data.

#![allow(clippy::unwrap_used)]
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use stria_io::AlignedBuf;

/// A directory under the system temp dir (ext4 here, so O_DIRECT works), removed on drop.
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    pub fn new(label: &str) -> ScratchDir {
        ScratchDir::under(&std::env::temp_dir(), label)
    }

    pub fn under(parent: &Path, label: &str) -> ScratchDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let unique = format!(
            "stria-io-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = parent.join(unique);
        std::fs::create_dir_all(&path).unwrap();
        ScratchDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `len` bytes that differ for every (seed, position), so a block written to the wrong place or
/// read from a stale one does not compare equal by accident.
pub fn pattern(seed: u64, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        // xorshift64: cheap and never zero for a non-zero state.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    buf
}
