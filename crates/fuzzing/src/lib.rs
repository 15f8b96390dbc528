//! Fuzz targets for every decoder of outside input: RPC frames and their postcard messages, the
//! NBD handshake and transmission phases (driven against the real server over an in-memory
//! pipe), REST request bodies, and the on-disk records read back (drive superblocks, the RAID
//! journal, the engine's superblock and chunk records, the metadata inode records).
//!
//! Each target is one function taking arbitrary bytes. It panics when a property fails, and
//! only then: a decoder must return an error or a value that encodes and decodes back to
//! itself, must not allocate past its limits, and a server must answer or hang up, never
//! panic or stall. cargo-fuzz (`fuzz/`, nightly) and the stable replay test
//! (`tests/corpus_and_mutations.rs`) call the same functions; `docs/internals/fuzzing.md`
//! lists the properties target by target.
//!
//! This crate is test tooling: nothing in the product depends on it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

mod disk;
mod messages;
mod nbd;
mod rest;
mod rpc;
pub mod seeds;

pub use disk::{drive_superblock, engine_records, meta_records, raid_journal};
pub use messages::postcard_messages;
pub use nbd::{nbd_handshake, nbd_transmission};
pub use rest::rest_body;
pub use rpc::rpc_frame;

/// A fuzz target: arbitrary bytes in, a panic when a property fails.
pub type Target = fn(&[u8]);

/// Every target by name; the names are those of `fuzz/fuzz_targets/*.rs` and of the corpus
/// folders `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("rpc_frame", rpc_frame),
    ("postcard_messages", postcard_messages),
    ("nbd_handshake", nbd_handshake),
    ("nbd_transmission", nbd_transmission),
    ("rest_body", rest_body),
    ("drive_superblock", drive_superblock),
    ("raid_journal", raid_journal),
    ("engine_records", engine_records),
    ("meta_records", meta_records),
];

/// The system allocator, noting the largest single allocation the current thread asks for
/// while [`largest_allocation_during`] watches it. Fuzz binaries and the replay test install
/// it as their global allocator so the targets can check that a decoder allocates only what
/// its limits allow, before it has seen the bytes to fill it.
#[derive(Debug)]
pub struct TrackingAlloc;

static TRACKING_INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    // Const-initialised and without destructors: safe to touch from inside the allocator.
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation(size: usize) {
    let _ = WATCHING.try_with(|watching| {
        if watching.get() {
            let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator; the bookkeeping touches
// only two thread-local cells and never allocates.
unsafe impl GlobalAlloc for TrackingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !TRACKING_INSTALLED.load(Ordering::Relaxed) {
            TRACKING_INSTALLED.store(true, Ordering::Relaxed);
        }
        note_allocation(layout.size());
        // SAFETY: the caller's contract is the one `System::alloc` needs.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation(new_size);
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns the largest single allocation this thread made meanwhile, or `None`
/// when [`TrackingAlloc`] is not the global allocator (the check is then skipped).
pub fn largest_allocation_during<R>(f: impl FnOnce() -> R) -> (R, Option<usize>) {
    let _probe = Box::new(0u8);
    let installed = TRACKING_INSTALLED.load(Ordering::Relaxed);
    LARGEST.with(|l| l.set(0));
    WATCHING.with(|w| w.set(true));
    let result = f();
    WATCHING.with(|w| w.set(false));
    let largest = LARGEST.with(Cell::get);
    (result, installed.then_some(largest))
}

/// Splits off the first byte, which most targets use to pick a mode; empty input gives 0.
pub(crate) fn mode_and_rest(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((&mode, rest)) => (mode, rest),
        None => (0, &[]),
    }
}
