//! Blocks named by more than one chunk record: the extra references of each, as runs.
//!
//! Writes are copy-on-write, so a block never changes while a record names it. A clone
//! ([`crate::Engine::clone_object`]) therefore copies records, not data: the copy names the
//! same blocks, and each of them gains a reference. A block returns to the allocator only when
//! its last reference goes. Like the free map, this lives only in memory and is rebuilt from
//! the chunk map at open (a block named by `k` records has `k - 1` extra references).
//!
//! Clones copy whole extents, so shared blocks come in long runs: the map is keyed by the
//! first block of a run of blocks with the same count, and a change splits runs only at its
//! own ends. Runs that come to meet with equal counts are joined in one pass now and then
//! (as many changes as there are runs apart), not at every change: a clone of a volume
//! rewritten at random adds a reference to some 250,000 one-block runs per GiB, and looking
//! at both neighbours of each took most of the copy's time.

use std::collections::BTreeMap;

use crate::alloc::Run;

#[derive(Debug, Default)]
pub(crate) struct Shares {
    /// First block -> (blocks, extra references), runs never overlapping.
    runs: BTreeMap<u64, (u64, u32)>,
    /// Blocks with at least one extra reference.
    blocks: u64,
    /// Changes since runs that meet with equal counts were last joined ([`Shares::compact`]).
    changes: usize,
}

impl Shares {
    /// Blocks named by more than one record.
    pub(crate) fn shared_blocks(&self) -> u64 {
        self.blocks
    }

    /// Blocks of `run` named more than once.
    pub(crate) fn shared_in(&self, (start, n): Run) -> u64 {
        let end = start + n;
        let from = self.runs.range(..start).next_back().map_or(start, |(&s, _)| s);
        self.runs
            .range(from..end)
            .map(|(&s, &(len, _))| (s + len).min(end).saturating_sub(s.max(start)))
            .sum()
    }

    /// Sets `run`, which lies past every run of the map, to `extra` references (at open); joins
    /// the last run when it meets it with the same count.
    pub(crate) fn push(&mut self, (start, n): Run, extra: u32) {
        if n == 0 || extra == 0 {
            return;
        }
        self.blocks += n;
        if let Some((&s, (len, e))) = self.runs.iter_mut().next_back()
            && s + *len == start
            && *e == extra
        {
            *len += n;
            return;
        }
        self.runs.insert(start, (n, extra));
    }

    /// One more reference to every block of `run`.
    pub(crate) fn add(&mut self, (start, n): Run) {
        if n == 0 {
            return;
        }
        let end = start + n;
        self.changed();
        // The last run starting before the end: it tells the two cases that need no split.
        let last = self.runs.range(..end).next_back().map(|(&s, &(len, extra))| (s, len, extra));
        if last.is_none_or(|(s, len, _)| s + len <= start) {
            // The common case (a first copy): no block of the run is shared yet.
            self.runs.insert(start, (n, 1));
            self.blocks += n;
        } else if let Some((s, len, extra)) = last
            && s <= start
            && s + len >= end
        {
            // Inside one run (a later copy; the run may be joined with its neighbours): cut
            // it in up to three.
            if s < start {
                self.runs.insert(s, (start - s, extra));
            }
            self.runs.insert(start, (n, extra + 1));
            if s + len > end {
                self.runs.insert(end, (s + len - end, extra));
            }
        } else {
            self.split_at(start);
            self.split_at(end);
            let mut at = start;
            let mut gaps = Vec::new();
            for (&s, (len, extra)) in self.runs.range_mut(start..end) {
                if s > at {
                    gaps.push((at, s - at));
                }
                *extra += 1;
                at = s + *len;
            }
            if at < end {
                gaps.push((at, end - at));
            }
            for (s, len) in gaps {
                self.runs.insert(s, (len, 1));
                self.blocks += len;
            }
        }
    }

    /// One reference fewer to every block of `run`: blocks that had extra references lose one,
    /// the others (their last reference gone) are appended to `unreferenced`.
    pub(crate) fn remove(&mut self, (start, n): Run, unreferenced: &mut Vec<Run>) {
        if n == 0 {
            return;
        }
        let end = start + n;
        if !self.overlaps(start, end) {
            unreferenced.push((start, n));
            return;
        }
        self.changed();
        self.split_at(start);
        self.split_at(end);
        let mut at = start;
        let mut emptied = Vec::new();
        for (&s, (len, extra)) in self.runs.range_mut(start..end) {
            if s > at {
                unreferenced.push((at, s - at));
            }
            *extra -= 1;
            if *extra == 0 {
                emptied.push((s, *len));
            }
            at = s + *len;
        }
        if at < end {
            unreferenced.push((at, end - at));
        }
        for (s, len) in emptied {
            self.runs.remove(&s);
            self.blocks -= len;
        }
    }

    /// Counts a change; joins runs once there were as many changes as runs since the last
    /// time, so the work is a constant per change and the map at most about twice as long
    /// as it needs to be.
    fn changed(&mut self) {
        self.changes += 1;
        if self.changes > self.runs.len().max(1024) {
            self.compact();
        }
    }

    /// Joins every pair of runs that meet with equal counts.
    pub(crate) fn compact(&mut self) {
        self.changes = 0;
        let mut joined: Vec<(u64, (u64, u32))> = Vec::with_capacity(self.runs.len());
        for (s, (len, extra)) in std::mem::take(&mut self.runs) {
            match joined.last_mut() {
                Some((ps, (plen, pextra))) if *ps + *plen == s && *pextra == extra => {
                    *plen += len;
                }
                _ => joined.push((s, (len, extra))),
            }
        }
        self.runs = joined.into_iter().collect();
    }

    /// Whether some run holds a block of `[start, end)`.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.runs.range(..end).next_back().is_some_and(|(&s, &(len, _))| s + len > start)
    }

    /// Splits the run holding `at` (if one holds it past its first block) into two at `at`.
    fn split_at(&mut self, at: u64) {
        let Some((&s, &(len, extra))) = self.runs.range(..at).next_back() else { return };
        if s + len > at {
            self.runs.insert(s, (at - s, extra));
            self.runs.insert(at, (s + len - at, extra));
        }
    }
}

/// Overlays possibly overlapping runs (every run a record names): the union, as sorted runs
/// that do not touch each other's blocks, and the blocks named more than once with their extra
/// reference counts.
pub(crate) fn overlay(runs: &[Run]) -> (Vec<Run>, Shares) {
    let mut edges: Vec<(u64, i64)> = Vec::with_capacity(runs.len() * 2);
    for &(s, n) in runs.iter().filter(|r| r.1 > 0) {
        edges.push((s, 1));
        edges.push((s + n, -1));
    }
    edges.sort_unstable();
    let mut used: Vec<Run> = Vec::new();
    let mut shares = Shares::default();
    let mut depth = 0i64;
    let mut at = 0u64;
    for (pos, delta) in edges {
        if pos > at && depth > 0 {
            match used.last_mut() {
                Some((s, n)) if *s + *n == at => *n += pos - at,
                _ => used.push((at, pos - at)),
            }
            if depth > 1 {
                shares.push((at, pos - at), (depth - 1) as u32);
            }
        }
        depth += delta;
        at = pos;
    }
    (used, shares)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(s: &Shares) -> Vec<(u64, u64, u32)> {
        s.runs.iter().map(|(&s, &(n, e))| (s, n, e)).collect()
    }

    /// The runs once those that meet with equal counts are joined.
    fn joined(s: &mut Shares) -> Vec<(u64, u64, u32)> {
        s.compact();
        runs(s)
    }

    #[test]
    fn references_are_counted_per_block_and_runs_split_and_join() {
        let mut s = Shares::default();
        s.add((10, 10));
        s.add((15, 10));
        assert_eq!(joined(&mut s), vec![(10, 5, 1), (15, 5, 2), (20, 5, 1)]);
        assert_eq!(s.shared_blocks(), 15);
        let mut gone = Vec::new();
        s.remove((12, 10), &mut gone);
        assert_eq!(gone, vec![], "every block of the run had an extra reference");
        assert_eq!(joined(&mut s), vec![(10, 2, 1), (15, 5, 1), (22, 3, 1)]);
        s.remove((8, 20), &mut gone);
        assert_eq!(gone, vec![(8, 2), (12, 3), (20, 2), (25, 3)], "named by no record now");
        assert_eq!(joined(&mut s), vec![]);
        assert_eq!(s.shared_blocks(), 0);
    }

    #[test]
    fn shared_blocks_of_a_run_are_counted() {
        let mut s = Shares::default();
        s.add((10, 10));
        s.add((30, 5));
        assert_eq!(s.shared_in((0, 100)), 15);
        assert_eq!(s.shared_in((15, 20)), 10, "15..20 and 30..35");
        assert_eq!(s.shared_in((12, 2)), 2, "inside a run");
        assert_eq!(s.shared_in((20, 10)), 0, "between runs");
    }

    /// Random adds and removes against a count per block: the same counts, the same blocks
    /// reported unreferenced, and runs that meet always differ in count (the map stays compact).
    #[test]
    fn matches_a_count_per_block() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        let mut s = Shares::default();
        let mut model = vec![0u32; 256];
        for step in 0..20_000 {
            let start = next(240);
            let n = 1 + next(16);
            if next(2) == 0 {
                s.add((start, n));
                (start..start + n).for_each(|b| model[b as usize] += 1);
            } else {
                let mut gone = Vec::new();
                s.remove((start, n), &mut gone);
                let mut want = Vec::new();
                for b in start..start + n {
                    if model[b as usize] > 0 {
                        model[b as usize] -= 1;
                    } else {
                        want.push(b);
                    }
                }
                let got: Vec<u64> = gone.iter().flat_map(|&(b, n)| b..b + n).collect();
                assert_eq!(got, want, "step {step}: unreferenced blocks");
            }
            if step % 7 == 0 {
                s.compact();
            }
            let mut counts = vec![0u32; 256];
            let mut last: Option<(u64, u32)> = None;
            for (b, n, e) in runs(&s) {
                (b..b + n).for_each(|x| counts[x as usize] = e);
                let compacted = step % 7 == 0;
                assert!(!compacted || last != Some((b, e)), "step {step}: {b} not joined");
                last = Some((b + n, e));
            }
            assert_eq!(counts, model, "step {step}: counts");
            let shared = model.iter().filter(|&&c| c > 0).count() as u64;
            assert_eq!(s.shared_blocks(), shared, "step {step}: shared blocks");
        }
    }

    #[test]
    fn equal_neighbours_merge_back_into_one_run() {
        let mut s = Shares::default();
        s.add((0, 4));
        s.add((4, 4));
        assert_eq!(joined(&mut s), vec![(0, 8, 1)]);
        s.add((2, 2));
        let mut gone = Vec::new();
        s.remove((2, 2), &mut gone);
        assert!(gone.is_empty());
        assert_eq!(joined(&mut s), vec![(0, 8, 1)]);
    }

    #[test]
    fn an_overlay_finds_the_union_and_the_blocks_named_twice() {
        let (used, shares) = overlay(&[(0, 4), (10, 2), (2, 4), (3, 1), (6, 1)]);
        assert_eq!(used, vec![(0, 7), (10, 2)]);
        assert_eq!(runs(&shares), vec![(2, 1, 1), (3, 1, 2)]);
        // Runs that meet with the same count are one run, as `add` would leave them.
        let (_, shares) = overlay(&[(0, 8), (0, 4), (4, 4)]);
        assert_eq!(runs(&shares), vec![(0, 8, 1)]);
        let (used, shares) = overlay(&[]);
        assert!(used.is_empty() && shares.shared_blocks() == 0);
    }
}
