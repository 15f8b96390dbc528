//! Open handles, counted per inode and per client: an unlinked file keeps its data while any
//! client has it open. A client whose session ends without its closes (its process was
//! killed, its machine went away) has its opens dropped, as its closes would have; the files
//! that leaves unopened wait in `pending` for [`crate::Meta::expire_clients`] to purge the
//! unlinked ones among them. Memory only: a restart of the service starts from no opens.

use std::collections::HashMap;

use stria_proto::fs::Ino;

#[derive(Debug, Default)]
pub(crate) struct Opens {
    total: HashMap<Ino, u32>,
    by_client: HashMap<u64, HashMap<Ino, u32>>,
    /// Inodes whose last opens went with a client's session, to be purged if unlinked.
    pending: Vec<Ino>,
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
}
