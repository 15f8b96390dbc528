//! Small writes packed into one *open stripe* of the array.
//!
//! A write smaller than a RAID 5/6 stripe, sent to the array on its own, is a partial-stripe
//! update: the array reads the rows it needs, journals the new data and parity with FUA, then
//! writes in place (`docs/internals/raid.md`). Copy-on-write lets the engine avoid that: new
//! blocks can go anywhere, so small writes take consecutive blocks of a stripe the engine holds
//! open, and the engine keeps the stripe's whole content in memory (its *image*).
//!
//! - The stripe is taken wholly free from the allocator. Its first write is a full-stripe write
//!   of the image (the new blocks, zeros elsewhere); every later batch writes only its own blocks
//!   and the parity of the rows they touch, computed from the image
//!   ([`Array::write_in_open_stripe`]): no reads, no journal, no FUA.
//! - Writers that arrive while a batch is being written queue their blocks; the next batch
//!   carries all of them (group commit for data).
//! - No block of an open stripe is durable yet, so a crash that tears its parity can only hurt
//!   data that was never promised. [`Packer::close`] runs at the start of every sync, before the
//!   array flush: it waits for the batch in flight and hands the unused tail back to the
//!   allocator, and the packer never writes that stripe again.
//!
//! On levels without parity (0, 1, 10) there is no write hole to avoid, but batching still
//! turns many small writes into one array request, and the stripe's first batch writes only
//! its own blocks.
//!
//! Blocks of a batch whose write failed stay reserved until the target is reopened.

use std::sync::{Condvar, Mutex, MutexGuard};

use stria_io::AlignedBuf;
use stria_raid::Array;

use crate::BLOCK;
use crate::alloc::{Allocator, Run};
use crate::error::EngineError;

/// Largest stripe (data blocks) the packer keeps an image of: 4 MiB, the engine's largest
/// single array request.
const IMAGE_BLOCKS_MAX: u64 = 1024;

#[derive(Debug)]
pub(crate) struct Packer {
    state: Mutex<State>,
    wake: Condvar,
    stripe_blocks: u64,
    /// Writes longer than this take the ordinary path.
    job_blocks_max: u64,
    /// The array keeps parity: the stripe's first write must be a full-stripe write.
    parity: bool,
}

#[derive(Debug, Default)]
struct State {
    open: Option<OpenStripe>,
    /// One thread is writing a batch of the open stripe (it holds the image meanwhile).
    writing: bool,
    /// A sync is closing the open stripe: new writes wait.
    closing: bool,
    /// Sequence number of the next queued write; writes are written in this order.
    next_seq: u64,
    /// Every write numbered below this has been written (or has failed).
    done_seq: u64,
    /// Writes whose batch failed: `(first seq, end seq, message)`. Failures are rare and the
    /// list is trimmed when it grows.
    failed: Vec<(u64, u64, String)>,
}

#[derive(Debug)]
struct OpenStripe {
    /// Array block number of the stripe's first block.
    first_block: u64,
    /// Blocks `[0, filled)` are taken; `[0, written)` are on the array.
    filled: u64,
    written: u64,
    /// Queued blocks not yet written, in order: `(block in stripe, bytes)`.
    queued: Vec<(u64, Vec<u8>)>,
    /// The stripe's content; `None` while a writer holds it.
    image: Option<AlignedBuf>,
    /// A batch write failed: the stripe takes no more blocks.
    broken: bool,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Packer {
    /// A packer for `array`, or None when its stripe is too large to keep in memory. On levels
    /// without parity the stripe is only a batching window: small writes from many callers
    /// still become one array request per batch.
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
            job_blocks_max: stripe_blocks / 2,
            parity: g.level.is_parity(),
        })
    }

    /// Free blocks held in the open stripe's unused tail.
    pub(crate) fn reserved_free_blocks(&self) -> u64 {
        let st = lock(&self.state);
        match &st.open {
            Some(o) if !o.broken => self.stripe_blocks - o.filled,
            _ => 0,
        }
    }

    /// Writes `data` (whole blocks) to consecutive blocks of the open stripe and returns them,
    /// once they are on the array. `Ok(None)`: not a packable write, or no wholly free stripe
    /// left; the caller allocates and writes it the ordinary way.
    pub(crate) fn write(
        &self,
        array: &Array,
        alloc: &Mutex<Allocator>,
        data: &[u8],
    ) -> Result<Option<Vec<Run>>, EngineError> {
        let n = (data.len() / BLOCK) as u64;
        if n == 0 || n > self.job_blocks_max {
            return Ok(None);
        }
        let mut st = lock(&self.state);
        loop {
            if !st.closing
                && let Some(o) = &st.open
                && !o.broken
                && o.filled + n <= self.stripe_blocks
            {
                break;
            }
            if st.writing || st.closing {
                st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            self.close_locked(&mut st, alloc);
            let Some(first_block) =
                alloc.lock().unwrap_or_else(|e| e.into_inner()).allocate_stripe()
            else {
                return Ok(None);
            };
            st.open = Some(OpenStripe {
                first_block,
                filled: 0,
                written: 0,
                queued: Vec::new(),
                image: Some(AlignedBuf::zeroed((self.stripe_blocks as usize) * BLOCK)),
                broken: false,
            });
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let o = st.open.as_mut().expect("checked above");
        let at = o.filled;
        o.filled += n;
        o.queued.push((at, data.to_vec()));
        let runs = vec![(o.first_block + at, n)];
        if st.writing {
            while st.done_seq <= seq {
                st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            return match st.failed.iter().find(|(a, b, _)| (*a..*b).contains(&seq)) {
                Some((_, _, msg)) => Err(EngineError::PackedWrite(msg.clone())),
                None => Ok(Some(runs)),
            };
        }
        st.writing = true;
        let mut own = Ok(());
        while let Some(o) = st.open.as_mut().filter(|o| !o.queued.is_empty()) {
            let queued = std::mem::take(&mut o.queued);
            let mut image = o.image.take().expect("only the writer takes the image");
            let (first_block, from, fresh) = (o.first_block, o.written, o.written == 0);
            let (seq_from, seq_to) = (st.done_seq, st.next_seq);
            drop(st);
            let mut to = from;
            for (at, bytes) in &queued {
                let start = *at as usize * BLOCK;
                image[start..start + bytes.len()].copy_from_slice(bytes);
                to = at + (bytes.len() / BLOCK) as u64;
            }
            let stripe = first_block / self.stripe_blocks;
            let result = if fresh && self.parity {
                array.write(first_block * BLOCK as u64, &image)
            } else {
                array.write_in_open_stripe(stripe, &image, from, to)
            };
            st = lock(&self.state);
            let o = st.open.as_mut().expect("a stripe is not closed while it is written");
            o.image = Some(image);
            match result {
                Ok(()) => o.written = to,
                Err(e) => {
                    o.broken = true;
                    if (seq_from..seq_to).contains(&seq) {
                        own = Err(e.to_string());
                    }
                    if st.failed.len() >= 64 {
                        st.failed.drain(..32);
                    }
                    st.failed.push((seq_from, seq_to, e.to_string()));
                    // Writes queued behind the failed batch fail too: the stripe's image no
                    // longer matches the drives.
                    let later = std::mem::take(&mut st.open.as_mut().expect("open").queued);
                    if !later.is_empty() {
                        let end = st.next_seq;
                        st.failed.push((seq_to, end, e.to_string()));
                        st.done_seq = end;
                    }
                }
            }
            st.done_seq = st.done_seq.max(seq_to);
            self.wake.notify_all();
        }
        st.writing = false;
        self.wake.notify_all();
        drop(st);
        own.map(|()| Some(runs)).map_err(EngineError::PackedWrite)
    }

    /// Closes the open stripe: waits for the batch being written, then hands the unused tail
    /// back to the allocator. After this no block written so far is written again.
    pub(crate) fn close(&self, alloc: &Mutex<Allocator>) {
        let mut st = lock(&self.state);
        st.closing = true;
        while st.writing {
            st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        self.close_locked(&mut st, alloc);
        st.closing = false;
        self.wake.notify_all();
    }

    fn close_locked(&self, st: &mut State, alloc: &Mutex<Allocator>) {
        debug_assert!(!st.writing);
        if let Some(o) = st.open.take()
            && !o.broken
            && o.filled < self.stripe_blocks
        {
            let tail = (o.first_block + o.filled, self.stripe_blocks - o.filled);
            alloc.lock().unwrap_or_else(|e| e.into_inner()).release(&[tail]);
        }
    }
}
