//! Open handles, counted per inode and per client: an unlinked file keeps its data while any
//! client has it open. A client whose session ends without its closes (its process was
//! killed, its machine went away) has its opens dropped, as its closes would have; the files
//! that leaves unopened wait in `pending` for [`crate::Meta::expire_clients`] to purge the
//! unlinked ones among them.
//!
//! Memory only: a restarted service starts from no opens, and its clients tell it again what
//! they have open (`Meta::reclaim`). Until they have (the grace period, see [`Grace`]) an
//! unopened file may still be open somewhere: its last unlink keeps it as an orphan, and
//! orphans are purged only once the grace period is over.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use stria_proto::fs::Ino;

#[derive(Debug, Default)]
pub(crate) struct Opens {
    total: HashMap<Ino, u32>,
    by_client: HashMap<u64, HashMap<Ino, u32>>,
    /// Inodes whose last opens went with a client's session, to be purged if unlinked.
    pending: Vec<Ino>,
    grace: Grace,
}

/// After a restart, the time the clients of the last run have to tell what they held.
#[derive(Debug, Default)]
pub(crate) struct Grace {
    /// When it ends at the latest; `None`: no grace period (or not serving yet).
    until: Option<Instant>,
    /// The clients that held opens or locks at the last clean stop: the grace period ends as
    /// soon as all of them have reclaimed. `None` after a crash (who held what is unknown).
    waiting: Option<HashSet<u64>>,
    /// The orphans left by the last run are still to be purged (once the grace period ends).
    sweep_due: bool,
}

impl Grace {
    pub fn new(until: Option<Instant>, waiting: Option<HashSet<u64>>) -> Grace {
        Grace { until, waiting, sweep_due: true }
    }

    fn active(&self, now: Instant) -> bool {
        let waiting = self.waiting.as_ref().is_none_or(|w| !w.is_empty());
        self.until.is_some_and(|until| now < until) && waiting
    }
}

/// What a release left.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Other handles of the inode are still open.
    StillOpen,
    /// That was its last open handle.
    Last,
    /// The client had no handle of it open (its opens went with its session): nothing changed.
    NotOpen,
}

impl Opens {
    /// Open handles of `ino`, every client's together.
    pub fn count(&self, ino: Ino) -> u32 {
        self.total.get(&ino).copied().unwrap_or(0)
    }

    pub fn open(&mut self, ino: Ino, client: u64) {
        *self.total.entry(ino).or_insert(0) += 1;
        *self.by_client.entry(client).or_default().entry(ino).or_insert(0) += 1;
    }

    pub fn release(&mut self, ino: Ino, client: u64) -> Release {
        let Some(mine) = self.by_client.get_mut(&client) else { return Release::NotOpen };
        match mine.get_mut(&ino) {
            None => return Release::NotOpen,
            Some(count) if *count > 1 => *count -= 1,
            Some(_) => {
                mine.remove(&ino);
                if mine.is_empty() {
                    self.by_client.remove(&client);
                }
            }
        }
        match self.total.get_mut(&ino) {
            Some(count) if *count > 1 => {
                *count -= 1;
                Release::StillOpen
            }
            _ => {
                self.total.remove(&ino);
                Release::Last
            }
        }
    }

    /// Drops every open of `client`; the inodes left with none go to `pending`.
    pub fn drop_client(&mut self, client: u64) {
        let Some(mine) = self.by_client.remove(&client) else { return };
        for (ino, count) in mine {
            let total = self.total.entry(ino).or_insert(0);
            *total = total.saturating_sub(count);
            if *total == 0 {
                self.total.remove(&ino);
                self.pending.push(ino);
            }
        }
    }

    /// Starts serving with `grace` (see [`Grace`]).
    pub fn begin(&mut self, grace: Grace) {
        self.grace = grace;
    }

    /// Whether the clients of the last run may still reclaim: locks wait, and an unopened
    /// file may yet be open.
    pub fn in_grace(&self) -> bool {
        self.grace.active(Instant::now())
    }

    /// Whether `ino` may be open: counted open, or the grace period still runs.
    pub fn may_be_open(&self, ino: Ino) -> bool {
        self.count(ino) > 0 || self.in_grace()
    }

    /// Once, when the grace period is over: true, and the orphans left by the last run are
    /// then to be purged (those nobody reclaimed).
    pub fn take_sweep(&mut self) -> bool {
        if !self.grace.sweep_due || self.in_grace() {
            return false;
        }
        self.grace.sweep_due = false;
        true
    }

    /// Queues `inos` for purging if unlinked and still unopened (see [`Opens::take_pending`]).
    pub fn queue_purge(&mut self, inos: impl IntoIterator<Item = Ino>) {
        self.pending.extend(inos);
    }

    /// `client`'s opens as it tells them after a restart: with `first` they replace what is
    /// counted for it (opens it made since the restart are among them), else they add.
    pub fn reclaim(&mut self, client: u64, first: bool, opens: &[(Ino, u32)]) {
        if first && let Some(mine) = self.by_client.remove(&client) {
            for (ino, count) in mine {
                let total = self.total.entry(ino).or_insert(0);
                *total = total.saturating_sub(count);
                if *total == 0 {
                    self.total.remove(&ino);
                }
            }
        }
        for &(ino, count) in opens.iter().filter(|(_, count)| *count > 0) {
            *self.total.entry(ino).or_insert(0) += count;
            *self.by_client.entry(client).or_default().entry(ino).or_insert(0) += count;
        }
        if let Some(waiting) = &mut self.grace.waiting {
            waiting.remove(&client);
        }
    }

    /// The clients with handles counted.
    pub fn clients(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_client.keys().copied()
    }

    /// While the grace period runs: the clients still awaited (`Some(None)`: unknown, after a
    /// crash). `None` once it is over.
    pub fn awaited(&self) -> Option<Option<Vec<u64>>> {
        if !self.in_grace() {
            return None;
        }
        Some(self.grace.waiting.as_ref().map(|w| w.iter().copied().collect()))
    }

    /// Up to `max` of the pending inodes that are still not open (one reopened meanwhile is
    /// left to its own release).
    pub fn take_pending(&mut self, max: usize) -> Vec<Ino> {
        let take = self.pending.len().min(max);
        let taken: Vec<Ino> = self.pending.drain(..take).collect();
        taken.into_iter().filter(|ino| !self.total.contains_key(ino)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_are_counted_per_client_and_in_total() {
        let mut o = Opens::default();
        o.open(7, 1);
        o.open(7, 1);
        o.open(7, 2);
        assert_eq!(o.count(7), 3);
        assert_eq!(o.release(7, 2), Release::StillOpen);
        assert_eq!(o.release(7, 2), Release::NotOpen, "client 2 had one");
        assert_eq!(o.count(7), 2);
        assert_eq!(o.release(7, 1), Release::StillOpen);
        assert_eq!(o.release(7, 1), Release::Last);
        assert_eq!(o.count(7), 0);
        assert_eq!(o.release(7, 1), Release::NotOpen);
    }

    #[test]
    fn a_dropped_client_releases_its_opens_and_leaves_the_others() {
        let mut o = Opens::default();
        o.open(7, 1);
        o.open(7, 2);
        o.open(8, 1);
        o.open(8, 1);
        o.drop_client(1);
        assert_eq!((o.count(7), o.count(8)), (1, 0));
        assert_eq!(o.take_pending(10), vec![8], "only 8 is left unopened");
        assert_eq!(o.release(8, 1), Release::NotOpen, "a late close of the dropped client");
        assert_eq!(o.release(7, 2), Release::Last);
        // Reopened between the drop and the purge: left to its own release.
        o.open(9, 3);
        o.drop_client(3);
        o.open(9, 4);
        assert_eq!(o.take_pending(10), Vec::<Ino>::new());
        assert_eq!(o.count(9), 1);
    }

    #[test]
    fn pending_inodes_come_out_at_most_max_at_a_time() {
        let mut o = Opens::default();
        for ino in 0..5 {
            o.open(ino, 1);
        }
        o.drop_client(1);
        let mut got = o.take_pending(3);
        assert_eq!(got.len(), 3);
        got.extend(o.take_pending(3));
        got.sort_unstable();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        assert!(o.take_pending(3).is_empty());
    }

    #[test]
    fn a_first_reclaim_replaces_a_client_s_opens_and_later_pieces_add() {
        let mut o = Opens::default();
        o.open(7, 1);
        o.open(7, 2);
        // Client 1's open of 7 since the restart is in what it tells.
        o.reclaim(1, true, &[(7, 2), (8, 1)]);
        assert_eq!((o.count(7), o.count(8)), (3, 1));
        o.reclaim(1, false, &[(9, 1), (10, 0)]);
        assert_eq!((o.count(9), o.count(10)), (1, 0));
        o.reclaim(1, true, &[]);
        assert_eq!((o.count(7), o.count(8), o.count(9)), (1, 0, 0));
        assert_eq!(o.clients().collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn the_grace_period_ends_when_every_awaited_client_reclaimed_or_at_its_time() {
        let soon = Some(Instant::now() + std::time::Duration::from_secs(60));
        let mut o = Opens::default();
        assert!(!o.in_grace(), "not serving yet: no grace");
        o.begin(Grace::new(soon, Some(HashSet::from([1, 2]))));
        assert!(o.in_grace() && o.may_be_open(5));
        assert!(!o.take_sweep(), "orphans wait for the end");
        o.reclaim(1, true, &[(5, 1)]);
        assert!(o.in_grace());
        o.reclaim(2, true, &[]);
        assert!(!o.in_grace(), "both reclaimed");
        assert!(o.may_be_open(5) && !o.may_be_open(6));
        assert!(o.take_sweep());
        assert!(!o.take_sweep(), "once");
        // After a crash nobody is known: the time decides.
        let mut o = Opens::default();
        o.begin(Grace::new(soon, None));
        o.reclaim(1, true, &[]);
        assert!(o.in_grace());
        o.begin(Grace::new(Some(Instant::now()), None));
        assert!(!o.in_grace());
        assert!(o.take_sweep());
    }
}
