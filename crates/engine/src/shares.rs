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
//! own ends.

use std::collections::BTreeMap;

use crate::alloc::Run;

#[derive(Debug, Default)]
pub(crate) struct Shares {
    /// First block -> (blocks, extra references), runs never overlapping.
    runs: BTreeMap<u64, (u64, u32)>,
    /// Blocks with at least one extra reference.
    blocks: u64,
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
        self.split_at(start);
        self.split_at(start + n);
        let mut at = start;
        let end = start + n;
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
        self.merge_around(start, end);
    }

    /// One reference fewer to every block of `run`: blocks that had extra references lose one,
    /// the others (their last reference gone) are appended to `unreferenced`.
    pub(crate) fn remove(&mut self, (start, n): Run, unreferenced: &mut Vec<Run>) {
        if n == 0 {
            return;
        }
        if self.runs.is_empty() {
            unreferenced.push((start, n));
            return;
        }
        self.split_at(start);
        self.split_at(start + n);
        let end = start + n;
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
        self.merge_around(start, end);
    }

    /// Splits the run holding `at` (if one holds it past its first block) into two at `at`.
    fn split_at(&mut self, at: u64) {
        let Some((&s, &(len, extra))) = self.runs.range(..at).next_back() else { return };
        if s + len > at {
            self.runs.insert(s, (at - s, extra));
            self.runs.insert(at, (s + len - at, extra));
        }
    }

    /// Joins runs with equal counts that meet, from the run before `start` to the one at `end`.
    fn merge_around(&mut self, start: u64, end: u64) {
        let from = self.runs.range(..start).next_back().map_or(start, |(&s, _)| s);
        let keys: Vec<u64> = self.runs.range(from..=end).map(|(&s, _)| s).collect();
        let mut keys = keys.into_iter();
        let Some(mut current) = keys.next() else { return };
        for next in keys {
            let (len, extra) = self.runs[&current];
            let (next_len, next_extra) = self.runs[&next];
            if current + len == next && extra == next_extra {
                self.runs.remove(&next);
                self.runs.insert(current, (len + next_len, extra));
            } else {
                current = next;
            }
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

    #[test]
    fn references_are_counted_per_block_and_runs_split_and_join() {
        let mut s = Shares::default();
        s.add((10, 10));
        s.add((15, 10));
        assert_eq!(runs(&s), vec![(10, 5, 1), (15, 5, 2), (20, 5, 1)]);
        assert_eq!(s.shared_blocks(), 15);
        let mut gone = Vec::new();
        s.remove((12, 10), &mut gone);
        assert_eq!(gone, vec![], "every block of the run had an extra reference");
        assert_eq!(runs(&s), vec![(10, 2, 1), (15, 5, 1), (22, 3, 1)]);
        s.remove((8, 20), &mut gone);
        assert_eq!(gone, vec![(8, 2), (12, 3), (20, 2), (25, 3)], "named by no record now");
        assert_eq!(runs(&s), vec![]);
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

    #[test]
    fn equal_neighbours_merge_back_into_one_run() {
        let mut s = Shares::default();
        s.add((0, 4));
        s.add((4, 4));
        assert_eq!(runs(&s), vec![(0, 8, 1)]);
        s.add((2, 2));
        let mut gone = Vec::new();
        s.remove((2, 2), &mut gone);
        assert!(gone.is_empty());
        assert_eq!(runs(&s), vec![(0, 8, 1)]);
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
