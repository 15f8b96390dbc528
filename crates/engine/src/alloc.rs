//! Free-space map of the data area, in 4 KiB blocks. Lives only in memory: it is rebuilt from
//! the chunk map at open, so blocks that were written but never committed are free again.
//!
//! Blocks freed by a commit that is not yet durable go to a pending list, not to the free map:
//! the durable chunk map may still point at them, and overwriting them before the next durable
//! commit could let a crash bring back a map that names overwritten data.
//!
//! A block may be named by several records (clones, `shares.rs`): releasing it drops one
//! reference, and only a block whose last reference went is parked.

use std::collections::BTreeMap;

use crate::shares::{Shares, overlay};

/// A run of physical blocks: `(first block, block count)`.
pub(crate) type Run = (u64, u64);

#[derive(Debug)]
pub(crate) struct Allocator {
    /// Free runs keyed by first block, never adjacent (always coalesced).
    free: BTreeMap<u64, u64>,
    free_blocks: u64,
    pending: Vec<Run>,
    pending_blocks: u64,
    /// Large allocations start on a multiple of this (one full RAID stripe of data).
    stripe_blocks: u64,
    /// Where the next search for stripe-aligned space starts (next fit): a free map that
    /// random overwrites fragmented would otherwise be walked from its start on every
    /// full-stripe allocation.
    stripe_cursor: u64,
    /// Set when a search found no wholly free stripe; cleared when blocks are freed.
    no_free_stripe: bool,
    /// Blocks named by more than one record, with their extra references.
    shares: Shares,
}

impl Allocator {
    /// Everything in `[start, end)` is free except the blocks the `used` runs name; a block
    /// named by `k` runs (records that share it) has `k - 1` extra references.
    pub(crate) fn with_used(
        start: u64,
        end: u64,
        stripe_blocks: u64,
        used: Vec<Run>,
    ) -> Result<Allocator, String> {
        let (used, shares) = overlay(&used);
        let mut a = Allocator {
            free: BTreeMap::new(),
            free_blocks: 0,
            pending: Vec::new(),
            pending_blocks: 0,
            stripe_blocks: stripe_blocks.max(1),
            stripe_cursor: 0,
            no_free_stripe: false,
            shares,
        };
        let mut at = start;
        for (s, n) in used {
            if s < start || s + n > end {
                return Err(format!(
                    "blocks {s}..{} lie outside the data area {start}..{end}",
                    s + n
                ));
            }
            if s > at {
                a.insert_free(at, s - at);
            }
            at = s + n;
        }
        if end > at {
            a.insert_free(at, end - at);
        }
        Ok(a)
    }

    pub(crate) fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    pub(crate) fn pending_blocks(&self) -> u64 {
        self.pending_blocks
    }

    /// Blocks named by more than one record.
    pub(crate) fn shared_blocks(&self) -> u64 {
        self.shares.shared_blocks()
    }

    /// One more reference to each block of `runs` (allocated blocks a new record names too).
    pub(crate) fn share(&mut self, runs: &[Run]) {
        for &run in runs {
            self.shares.add(run);
        }
    }

    /// Takes `n` blocks, as few runs as it can: a stripe-aligned run for writes of a stripe or
    /// more (so the array sees full-stripe writes; the search goes on from where the last one
    /// stopped), else the lowest-addressed run that fits
    /// (keeps small chunks packed at the bottom, large free areas intact), else several runs.
    /// None when fewer than `n` blocks are free; then nothing is taken.
    pub(crate) fn allocate(&mut self, n: u64) -> Option<Vec<Run>> {
        if n == 0 {
            return Some(Vec::new());
        }
        if n > self.free_blocks {
            return None;
        }
        let mut pick = None;
        if n >= self.stripe_blocks {
            pick = self.find_aligned(n);
        }
        if pick.is_none() {
            pick = self.free.iter().find(|&(_, &len)| len >= n).map(|(&s, _)| s);
        }
        if let Some(at) = pick {
            self.take(at, n);
            return Some(vec![(at, n)]);
        }
        // Fragmented: largest runs first, so the chunk gets as few pieces as possible.
        let mut by_size: Vec<Run> = self.free.iter().map(|(&s, &l)| (s, l)).collect();
        by_size.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut runs = Vec::new();
        let mut left = n;
        for (s, l) in by_size {
            let take = l.min(left);
            self.take(s, take);
            runs.push((s, take));
            left -= take;
            if left == 0 {
                break;
            }
        }
        runs.sort_unstable();
        Some(runs)
    }

    /// Takes a whole free stripe (stripe-aligned, `stripe_blocks` long), the next one from
    /// where the last search stopped, and returns its first block; None when no stripe is
    /// wholly free.
    pub(crate) fn allocate_stripe(&mut self) -> Option<u64> {
        let at = self.find_aligned(self.stripe_blocks)?;
        self.take(at, self.stripe_blocks);
        Some(at)
    }

    /// The first stripe-aligned free space of `n` blocks (`n` at least a stripe) at or after
    /// the cursor, else from the start; moves the cursor past it.
    fn find_aligned(&mut self, n: u64) -> Option<u64> {
        if self.no_free_stripe {
            return None;
        }
        let stripe = self.stripe_blocks;
        let fits = |(&s, &len): (&u64, &u64)| {
            let aligned = s.div_ceil(stripe) * stripe;
            (aligned + n <= s + len).then_some(aligned)
        };
        let cursor = self.stripe_cursor;
        // A run starting before the cursor is searched on the way round.
        let found = self
            .free
            .range(cursor..)
            .find_map(fits)
            .or_else(|| self.free.range(..cursor).find_map(fits));
        match found {
            Some(at) => self.stripe_cursor = at + n,
            // No space of a stripe or more is free: no larger one either.
            None if n == stripe => self.no_free_stripe = true,
            None => {}
        }
        found
    }

    /// Returns blocks that no map (durable or not) ever referenced, e.g. after a failed write.
    pub(crate) fn release(&mut self, runs: &[Run]) {
        for &(s, n) in runs {
            self.insert_free(s, n);
        }
    }

    /// Drops a reference to each block of `runs`, which a non-durable commit stopped naming;
    /// those left unnamed are parked until the next durable commit. Returns the parked runs.
    pub(crate) fn defer(&mut self, runs: &[Run]) -> Vec<Run> {
        let mut unreferenced = Vec::new();
        for &run in runs {
            self.shares.remove(run, &mut unreferenced);
        }
        self.park(&unreferenced);
        unreferenced
    }

    fn park(&mut self, runs: &[Run]) {
        for &(s, n) in runs {
            self.pending.push((s, n));
            self.pending_blocks += n;
        }
    }

    /// The pending runs, for a sync to free once its durable commit is done.
    pub(crate) fn take_pending(&mut self) -> Vec<Run> {
        self.pending_blocks = 0;
        std::mem::take(&mut self.pending)
    }

    /// Puts back pending runs whose durable commit failed.
    pub(crate) fn restore_pending(&mut self, runs: Vec<Run>) {
        self.park(&runs);
    }

    /// Removes `[at, at+n)`, which must lie inside one free run.
    fn take(&mut self, at: u64, n: u64) {
        let Some((&s, &len)) = self.free.range(..=at).next_back() else {
            panic!("allocator: block {at} is not free");
        };
        assert!(at + n <= s + len, "allocator: blocks {at}+{n} are not free");
        self.free.remove(&s);
        if at > s {
            self.free.insert(s, at - s);
        }
        if s + len > at + n {
            self.free.insert(at + n, s + len - (at + n));
        }
        self.free_blocks -= n;
    }

    fn insert_free(&mut self, mut s: u64, mut n: u64) {
        if n == 0 {
            return;
        }
        self.no_free_stripe = false;
        let added = n;
        if let Some((&ps, &pl)) = self.free.range(..=s).next_back() {
            assert!(ps + pl <= s, "allocator: blocks {s}+{n} freed twice");
            if ps + pl == s {
                self.free.remove(&ps);
                s = ps;
                n += pl;
            }
        }
        if let Some((&ns, &nl)) = self.free.range(s..).next() {
            assert!(s + n <= ns, "allocator: blocks {s}+{n} freed twice");
            if s + n == ns {
                self.free.remove(&ns);
                n += nl;
            }
        }
        self.free.insert(s, n);
        self.free_blocks += added;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_allocations_are_stripe_aligned_and_small_ones_packed_low() {
        let mut a = Allocator::with_used(1, 1000, 16, vec![(20, 3)]).expect("valid");
        assert_eq!(a.free_blocks(), 999 - 3);
        assert_eq!(a.allocate(2), Some(vec![(1, 2)]));
        assert_eq!(a.allocate(32), Some(vec![(32, 32)]));
        assert_eq!(a.allocate(1), Some(vec![(3, 1)]));
        assert_eq!(a.free_blocks(), 999 - 3 - 35);
    }

    #[test]
    fn fragments_when_no_run_fits_and_refuses_past_free() {
        let mut a = Allocator::with_used(0, 10, 4, vec![(2, 2), (6, 2)]).expect("valid");
        assert_eq!(a.allocate(7), None);
        assert_eq!(a.free_blocks(), 6);
        let runs = a.allocate(5).expect("fits fragmented");
        assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), 5);
        assert_eq!(a.free_blocks(), 1);
    }

    #[test]
    fn deferred_blocks_are_not_reused_until_released() {
        let mut a = Allocator::with_used(0, 4, 1, vec![]).expect("valid");
        let runs = a.allocate(4).expect("fits");
        a.defer(&runs);
        assert_eq!(a.allocate(1), None);
        assert_eq!(a.pending_blocks(), 4);
        let pending = a.take_pending();
        a.release(&pending);
        assert_eq!(a.free_blocks(), 4);
        assert_eq!(a.allocate(4), Some(vec![(0, 4)]));
    }

    #[test]
    fn stripe_searches_go_on_from_the_last_one_and_wrap_around() {
        let mut a = Allocator::with_used(0, 64, 8, vec![]).expect("valid");
        assert_eq!(a.allocate_stripe(), Some(0));
        assert_eq!(a.allocate_stripe(), Some(8));
        a.release(&[(0, 8)]);
        assert_eq!(a.allocate_stripe(), Some(16), "the search goes on past the last stripe");
        assert_eq!(a.allocate(16), Some(vec![(24, 16)]), "large allocations too");
        assert_eq!(a.allocate_stripe(), Some(40));
        assert_eq!(a.allocate_stripe(), Some(48));
        assert_eq!(a.allocate_stripe(), Some(56));
        assert_eq!(a.allocate_stripe(), Some(0), "then it wraps around");
        assert_eq!(a.allocate_stripe(), None);
        a.release(&[(8, 8)]);
        assert_eq!(a.allocate_stripe(), Some(8), "freed blocks end a fruitless search");
    }

    #[test]
    fn whole_stripes_come_from_free_runs_only() {
        let mut a = Allocator::with_used(1, 39, 8, vec![(9, 1)]).expect("valid");
        assert_eq!(a.allocate_stripe(), Some(16));
        assert_eq!(a.allocate_stripe(), Some(24));
        assert_eq!(a.allocate_stripe(), None, "32..39 is one block short, 0..8 starts at 1");
        assert_eq!(a.free_blocks(), 38 - 1 - 16);
    }

    #[test]
    fn rejects_used_runs_outside_the_data_area() {
        assert!(Allocator::with_used(0, 10, 1, vec![(8, 3)]).is_err());
        assert!(Allocator::with_used(2, 10, 1, vec![(1, 2)]).is_err());
    }

    #[test]
    fn shared_blocks_are_parked_only_when_their_last_reference_goes() {
        // Blocks 2..4 are named by two records.
        let mut a = Allocator::with_used(0, 8, 1, vec![(0, 4), (2, 2)]).expect("valid");
        assert_eq!((a.free_blocks(), a.shared_blocks()), (4, 2));
        assert_eq!(a.defer(&[(0, 4)]), vec![(0, 2)], "2..4 keep a reference");
        assert_eq!((a.pending_blocks(), a.shared_blocks()), (2, 0));
        a.share(&[(2, 2)]);
        assert!(a.defer(&[(2, 2)]).is_empty(), "the reference share added goes first");
        assert_eq!(a.defer(&[(2, 2)]), vec![(2, 2)], "the last reference");
        let pending = a.take_pending();
        a.release(&pending);
        assert_eq!(a.free_blocks(), 8);
    }
}
