//! Small writes packed into one *open stripe* of the array, held in memory until it is full.
//!
//! A write smaller than a RAID 5/6 stripe, sent to the array on its own, is a partial-stripe
//! update: the array reads the rows it needs, journals the new data and parity with FUA, then
//! writes in place (`docs/internals/raid.md`). Copy-on-write lets the engine avoid that: new
//! blocks can go anywhere, so small writes take consecutive blocks of a stripe the engine holds
//! open, and the engine keeps the stripe's whole content in memory (its *image*).
//!
//! - The stripe is taken wholly free from the allocator. A small write only copies its blocks
//!   into the image and returns: no array I/O, no wait (write-back, as a page cache).
//! - A write that does not fit in what is left fills the stripe with its head and goes on in a
//!   fresh stripe: leaving the room unused would waste a fifth of the array's writes for 1 MiB
//!   writes into 2.5 MiB stripes. The stripe is *retired* when it is full (or when no fresh
//!   stripe is left): it is then written whole with one full-stripe write (an unused tail is
//!   zeroed first, then goes back to the allocator), so parity never needs a read or the
//!   journal. Images are reused: a fresh one costs a page fault per 4 KiB. The write that
//!   retired it gets a [`Retired`] handle and writes it out ([`Packer::write_retired`]),
//!   after it let go of its chunk's lock, or hands that to another thread (the storage service
//!   does, for writes it runs on its async worker); a writer that finds too many stripes
//!   retiring, or a sync, writes out any retired stripe nobody has started on. A stripe that a
//!   sync closes while less than a quarter full is written as an ordinary partial-stripe
//!   update instead, so a trickle of writes with periodic syncs does not write a whole stripe
//!   per sync. Meanwhile a fresh stripe takes new writes; at most [`RETIRING_MAX`] + 1
//!   stripes wait for their write, so memory stays bounded.
//! - Reads of blocks still in an image are served from it ([`Packer::cached`]); a stripe leaves
//!   the packer only after its write completed, so a block is always either in an image or on
//!   the array.
//! - No block of an open stripe is durable yet, and no promise was made for it: the chunk map
//!   naming it is not durable either. [`Packer::close`] runs at the start of every sync, before
//!   the array flush: it waits for retiring stripes and writes the open one, so everything
//!   written before the sync is on the array when it is flushed; the packer never writes that
//!   stripe again.
//!
//! On levels without parity (0, 1, 10) there is no write hole to avoid, but batching still
//! turns many small writes into one array request; only the filled blocks are written, and
//! only writes of at most 64 KiB are packed (a larger one is a fair array request already).
//!
//! A failed stripe write is kept: every later packed write and the next sync fail with it (an
//! array that refuses a full-stripe write has failed), and its blocks stay reserved until the
//! target is reopened.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use stria_io::AlignedBuf;
use stria_raid::Array;

use crate::BLOCK;
use crate::alloc::{Allocator, Run};
use crate::cache::{BlockCache, SMALL_IO_BLOCKS};
use crate::error::EngineError;

/// Largest stripe (data blocks) the packer keeps an image of: 4 MiB, the engine's largest
/// single array request.
const IMAGE_BLOCKS_MAX: u64 = 1024;

/// Retired stripes waiting for their write beyond which a write that needs a fresh stripe
/// waits. The write that fills a stripe retires it regardless, so at most `RETIRING_MAX + 1`
/// wait, and with the open stripe and the spares at most `RETIRING_MAX + 4` images exist per
/// target (48 MiB with 4 MiB stripes), besides any a reader still holds. These are
/// the stripe writes a target has in flight: 1 MiB writes into the 2.5 MiB stripes of a
/// 12-drive RAID 6 went from 1.27-1.29 GB/s with 2 to 1.35-1.52 with 4 and 1.49-1.56 with 8
/// (NBD, fio at depth 8, drive files on one virtio disk).
const RETIRING_MAX: usize = 8;

/// On parity levels, a stripe filled below `1 / SPARSE_CLOSE_FRACTION` is written block by
/// block (a partial-stripe update) rather than whole.
const SPARSE_CLOSE_FRACTION: u64 = 4;

/// Images kept for reuse by the next open stripes. A fresh image is zeroed memory the kernel
/// must fault in page by page: with 1 MiB writes packed into 2.5 MiB stripes, faulting and
/// zeroing fresh images took a third of the storage thread's time. While writes stream, each
/// stripe written frees an image as the next one opens, so two suffice, and an idle target
/// holds no more.
const SPARE_IMAGES_MAX: usize = 2;

#[derive(Debug)]
pub(crate) struct Packer {
    state: Mutex<State>,
    wake: Condvar,
    stripe_blocks: u64,
    /// Writes longer than this take the ordinary path: half a stripe on parity levels, where
    /// a shorter write on its own would be a journaled partial-stripe update; at most
    /// [`SMALL_IO_BLOCKS`] on the others, where packing only batches, and a larger write is a
    /// large enough array request already, which packing would copy twice (into the image,
    /// then into the read cache).
    job_blocks_max: u64,
    /// The array keeps parity: a stripe is written whole, so parity needs no reads.
    parity: bool,
}

#[derive(Debug, Default)]
struct State {
    /// The stripe taking new writes.
    open: Option<Stripe>,
    /// Full (or closed) stripes waiting for their write or being written.
    retiring: Vec<Stripe>,
    /// A sync is closing the open stripe: new writes wait.
    closing: bool,
    /// Why a stripe write failed; sticky until the target is reopened.
    failed: Option<String>,
    /// Images of written stripes no reader held, for the next open stripes.
    spare: Vec<AlignedBuf>,
}

#[derive(Clone, Debug)]
struct Stripe {
    /// Array block number of the stripe's first block.
    first_block: u64,
    /// Blocks `[0, filled)` hold data.
    filled: u64,
    /// Runs of blocks (index in the stripe, count) written by small writes (at most
    /// [`SMALL_IO_BLOCKS`]), which the read cache takes when the stripe is written. Larger
    /// writes' blocks stay out of it, as the engine's unpacked large writes do.
    small: Vec<(u64, u64)>,
    /// The stripe's content. Blocks past `filled` hold zeros or bytes of an earlier stripe
    /// (a reused image), zeroed before a whole-stripe write of a stripe not full. Shared with
    /// readers and with the thread writing it out; a write into the open stripe copies it only
    /// while somebody else holds it.
    image: Arc<AlignedBuf>,
    /// A retiring stripe whose write has started (a thread claimed it).
    writing: bool,
}

/// A stripe a write retired: the caller writes it out with [`Packer::write_retired`]. One never
/// written out is written by the next writer short of room, or the next sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a retired stripe waits in memory until it is written out"]
pub struct Retired {
    first_block: u64,
}

/// Part of a run of array blocks: `count` blocks from `at` (index into the run) are either in
/// an image (from block `offset` of it) or must be read from the array.
#[derive(Debug)]
pub(crate) struct Cached {
    pub(crate) at: u64,
    pub(crate) count: u64,
    pub(crate) image: Option<(Arc<AlignedBuf>, u64)>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks a retiring stripe whose write has not started as being written and returns it: the
/// one starting at `first_block`, or any.
fn claim(st: &mut State, first_block: Option<u64>) -> Option<Stripe> {
    let stripe = st
        .retiring
        .iter_mut()
        .find(|s| !s.writing && first_block.is_none_or(|first| s.first_block == first))?;
    stripe.writing = true;
    Some(stripe.clone())
}

/// Copies `data` (whole blocks, no more than the stripe's room) into the stripe's next blocks
/// and returns them. `small`: the blocks are a small write's, for the read cache.
fn place(stripe: &mut Stripe, data: &[u8], small: bool) -> Run {
    let n = (data.len() / BLOCK) as u64;
    let at = stripe.filled as usize * BLOCK;
    Arc::make_mut(&mut stripe.image)[at..at + data.len()].copy_from_slice(data);
    if small {
        match stripe.small.last_mut() {
            Some((at, count)) if *at + *count == stripe.filled => *count += n,
            _ => stripe.small.push((stripe.filled, n)),
        }
    }
    let run = (stripe.first_block + stripe.filled, n);
    stripe.filled += n;
    run
}

impl Packer {
    /// A packer for `array`, or None when its stripe is too large to keep in memory. On levels
    /// without parity the stripe is only a batching window: small writes from many callers
    /// still become one array request.
    pub(crate) fn for_array(array: &Array) -> Option<Packer> {
        let g = array.geometry();
        let stripe_blocks = g.stripe_data_bytes() / BLOCK as u64;
        if !(2..=IMAGE_BLOCKS_MAX).contains(&stripe_blocks) {
            return None;
        }
        Some(Packer {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            stripe_blocks,
            job_blocks_max: if g.level.is_parity() {
                stripe_blocks / 2
            } else {
                (stripe_blocks / 2).min(SMALL_IO_BLOCKS)
            },
            parity: g.level.is_parity(),
        })
    }

    /// Zeroes the unused tail of a stripe retired before it is full, when it will be written
    /// whole: a reused image holds an earlier stripe's bytes there, which would otherwise be
    /// copied into free blocks (deleted data spread over the drives). Copies the image only if
    /// a reader holds it.
    fn zero_tail(&self, stripe: &mut Stripe) {
        if self.writes_whole(stripe) && stripe.filled < self.stripe_blocks {
            Arc::make_mut(&mut stripe.image)[stripe.filled as usize * BLOCK..].fill(0);
        }
    }

    /// Whether `stripe` goes to the array as one full-stripe write (see `write_out`).
    fn writes_whole(&self, stripe: &Stripe) -> bool {
        self.parity && stripe.filled * SPARSE_CLOSE_FRACTION >= self.stripe_blocks
    }

    /// Whether a write of `bytes` at `offset` of a chunk would be packed: whole blocks, no
    /// more than `job_blocks_max`. Such a write does no array I/O unless it retires a stripe.
    pub(crate) fn takes(&self, offset: u64, bytes: u64) -> bool {
        offset.is_multiple_of(BLOCK as u64)
            && bytes.is_multiple_of(BLOCK as u64)
            && (1..=self.job_blocks_max).contains(&(bytes / BLOCK as u64))
    }

    /// Calls `f` with the free blocks held in the unused tails of the open and retiring stripes,
    /// while no tail can go back to the allocator: a caller that reads the allocator inside `f`
    /// counts each tail once (`write_out` releases a tail under the same lock).
    pub(crate) fn with_reserved_free_blocks<T>(&self, f: impl FnOnce(u64) -> T) -> T {
        let st = lock(&self.state);
        f(st.open.iter().chain(&st.retiring).map(|s| self.stripe_blocks - s.filled).sum())
    }

    /// Copies `data` (whole blocks) into consecutive blocks of the open stripe and returns
    /// them, with the stripe this write retired if it did (the caller writes it out). The
    /// bytes reach the array when the stripe is retired or closed. `Ok(None)`: not a packable
    /// write, or no wholly free stripe left; the caller allocates and writes it the ordinary
    /// way.
    pub(crate) fn write(
        &self,
        array: &Array,
        alloc: &Mutex<Allocator>,
        cache: &BlockCache,
        data: &[u8],
    ) -> Result<Option<(Vec<Run>, Option<Retired>)>, EngineError> {
        let n = (data.len() / BLOCK) as u64;
        if n == 0 || n > self.job_blocks_max {
            return Ok(None);
        }
        let small = n <= SMALL_IO_BLOCKS;
        let mut retired = None;
        // Runs placed so far, and how many blocks they hold: a write that does not fit in the
        // open stripe's room fills it and goes on in a fresh stripe.
        let mut runs = Vec::with_capacity(2);
        let mut placed = 0;
        let mut st = lock(&self.state);
        loop {
            if let Some(reason) = &st.failed {
                return Err(EngineError::PackedWrite(reason.clone()));
            }
            if !st.closing
                && let Some(o) = &st.open
                && o.filled + (n - placed) <= self.stripe_blocks
            {
                break;
            }
            if !st.closing
                && st.retiring.len() >= RETIRING_MAX
                && let Some(waiting) = claim(&mut st, None)
            {
                // Too many retired: write out one whose write nobody has started.
                drop(st);
                self.write_out(array, alloc, cache, waiting)?;
                st = lock(&self.state);
                continue;
            }
            if st.closing || st.retiring.len() >= RETIRING_MAX {
                st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // The open stripe has too little room for this write: fill it with the write's
            // head, retire it, and open a fresh one for the rest. Nothing is placed before
            // the fresh stripe is had, so without one the write takes the ordinary path.
            let fresh = alloc.lock().unwrap_or_else(|e| e.into_inner()).allocate_stripe();
            let Some(first_block) = fresh else {
                // Retired, the open stripe gives its free tail back to the allocator.
                if let Some(mut open) = st.open.take() {
                    self.zero_tail(&mut open);
                    retired = Some(Retired { first_block: open.first_block });
                    st.retiring.push(open);
                }
                drop(st);
                if let Some(full) = retired {
                    self.write_retired(array, alloc, cache, full)?;
                }
                return Ok(None);
            };
            // Reads try the cache before the images: entries left from the blocks' last use
            // must go before any of them is handed out.
            cache.invalidate(first_block, self.stripe_blocks);
            if let Some(mut open) = st.open.take() {
                // An open stripe always has room: a full one is retired at once.
                placed = self.stripe_blocks - open.filled;
                runs.push(place(&mut open, &data[..placed as usize * BLOCK], small));
                retired = Some(Retired { first_block: open.first_block });
                st.retiring.push(open);
            }
            let image = st
                .spare
                .pop()
                .unwrap_or_else(|| AlignedBuf::zeroed(self.stripe_blocks as usize * BLOCK));
            st.open = Some(Stripe {
                first_block,
                filled: 0,
                small: Vec::new(),
                image: Arc::new(image),
                writing: false,
            });
        }
        let o = st.open.as_mut().expect("checked above");
        runs.push(place(o, &data[placed as usize * BLOCK..], small));
        if o.filled == self.stripe_blocks {
            let full = st.open.take().expect("open");
            // At most one stripe is retired per write: a write that filled one above put less
            // than half a stripe into a fresh one.
            debug_assert!(retired.is_none());
            retired = Some(Retired { first_block: full.first_block });
            st.retiring.push(full);
        }
        Ok(Some((runs, retired)))
    }

    /// Writes out a stripe [`Packer::write`] retired, unless another thread has started on it
    /// (a writer short of room, or a sync). Fails when its write fails, or when a stripe
    /// write failed before (a failure is sticky until the target is reopened).
    pub(crate) fn write_retired(
        &self,
        array: &Array,
        alloc: &Mutex<Allocator>,
        cache: &BlockCache,
        retired: Retired,
    ) -> Result<(), EngineError> {
        let mut st = lock(&self.state);
        if let Some(reason) = &st.failed {
            return Err(EngineError::PackedWrite(reason.clone()));
        }
        match claim(&mut st, Some(retired.first_block)) {
            Some(stripe) => {
                drop(st);
                self.write_out(array, alloc, cache, stripe)
            }
            None => Ok(()),
        }
    }

    /// Writes a claimed retiring stripe to the array, then drops it from the packer and hands
    /// its unused tail back to the allocator.
    fn write_out(
        &self,
        array: &Array,
        alloc: &Mutex<Allocator>,
        cache: &BlockCache,
        stripe: Stripe,
    ) -> Result<(), EngineError> {
        let start = stripe.first_block * BLOCK as u64;
        // A stripe closed by a sync while nearly empty is written as an ordinary
        // partial-stripe update (journaled by the array), not as a whole stripe of zeros: a
        // trickle of small writes with periodic syncs would otherwise write a stripe per sync.
        let whole = self.writes_whole(&stripe);
        let result = if whole {
            array.write(start, &stripe.image)
        } else {
            array.write(start, &stripe.image[..stripe.filled as usize * BLOCK])
        };
        if result.is_ok() {
            // Small writes' blocks stay readable from memory once they leave the image.
            for &(at, count) in &stripe.small {
                let bytes = &stripe.image[at as usize * BLOCK..(at + count) as usize * BLOCK];
                cache.put(stripe.first_block + at, bytes);
            }
        }
        let mut st = lock(&self.state);
        st.retiring.retain(|s| s.first_block != stripe.first_block);
        // Unless a reader still holds it, the image serves the next open stripe.
        if let Ok(image) = Arc::try_unwrap(stripe.image)
            && st.spare.len() < SPARE_IMAGES_MAX
        {
            st.spare.push(image);
        }
        let result = match result {
            Ok(()) => {
                if stripe.filled < self.stripe_blocks {
                    let tail =
                        (stripe.first_block + stripe.filled, self.stripe_blocks - stripe.filled);
                    alloc.lock().unwrap_or_else(|e| e.into_inner()).release(&[tail]);
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(
                    first_block = stripe.first_block,
                    "packed stripe write failed: {e}"
                );
                let reason = st.failed.get_or_insert_with(|| e.to_string()).clone();
                Err(EngineError::PackedWrite(reason))
            }
        };
        self.wake.notify_all();
        result
    }

    /// Closes the open stripe: waits for the retiring ones, then writes it out. After this,
    /// every block packed so far is on the array and none is written again. Fails when any
    /// stripe write failed since the target was opened.
    pub(crate) fn close(
        &self,
        array: &Array,
        alloc: &Mutex<Allocator>,
        cache: &BlockCache,
    ) -> Result<(), EngineError> {
        let mut st = lock(&self.state);
        while st.closing {
            st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.closing = true;
        while !st.retiring.is_empty() {
            match claim(&mut st, None) {
                Some(waiting) => {
                    // A failure is sticky in `failed`, reported below.
                    drop(st);
                    let _ = self.write_out(array, alloc, cache, waiting);
                    st = lock(&self.state);
                }
                None => st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
            }
        }
        let open = st.open.take().map(|mut o| {
            self.zero_tail(&mut o);
            o.writing = true;
            st.retiring.push(o.clone());
            o
        });
        drop(st);
        let written = match open {
            Some(o) => self.write_out(array, alloc, cache, o),
            None => Ok(()),
        };
        let mut st = lock(&self.state);
        st.closing = false;
        self.wake.notify_all();
        match &st.failed {
            Some(reason) => Err(EngineError::PackedWrite(reason.clone())),
            None => written,
        }
    }

    /// Splits the run of `count` array blocks from `first` into parts held in an image and
    /// parts to read from the array.
    pub(crate) fn cached(&self, first: u64, count: u64) -> Vec<Cached> {
        let st = lock(&self.state);
        let mut held: Vec<(u64, u64, &Stripe)> = st
            .open
            .iter()
            .chain(&st.retiring)
            .filter_map(|s| {
                let lo = s.first_block.max(first);
                let hi = (s.first_block + s.filled).min(first + count);
                (lo < hi).then_some((lo, hi, s))
            })
            .collect();
        held.sort_by_key(|&(lo, _, _)| lo);
        let mut parts = Vec::with_capacity(2 * held.len() + 1);
        let mut at = first;
        for (lo, hi, s) in held {
            if at < lo {
                parts.push(Cached { at: at - first, count: lo - at, image: None });
            }
            let image = Some((s.image.clone(), lo - s.first_block));
            parts.push(Cached { at: lo - first, count: hi - lo, image });
            at = hi;
        }
        if at < first + count {
            parts.push(Cached { at: at - first, count: first + count - at, image: None });
        }
        parts
    }
}
