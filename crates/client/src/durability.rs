//! Which changes a sync really made durable, across restarts of the services.
//!
//! A service acknowledges a change before it is durable and makes it durable at its next sync.
//! If the service crashes in between and comes back, the change is gone, yet a later sync on
//! the new process succeeds. Every changing reply and every sync reply therefore carries the
//! service's [`Epoch`], which is new after such a loss. This watch remembers, per service and
//! inode, the epochs of the changes not yet covered by a sync; a sync answered under a
//! different epoch than a change it should cover marks that inode's changes lost, and the
//! `fsync` (or `fsyncdir`, or volume flush) that asks for the inode fails with an I/O error
//! instead of claiming durability, as Linux reports a writeback error. Each loss is reported
//! once, to the first sync of that inode that follows it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use stria_proto::fs::{Ino, TargetId};
use stria_proto::wire::Epoch;

/// Most inodes whose loss waits to be reported; past it the oldest reports are dropped (and
/// logged), so a client that never syncs cannot grow this without bound.
const LOST_MAX: usize = 65_536;

/// A service whose changes are tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Service {
    Meta,
    Target(TargetId),
}

/// The position of a sync in the order of changes: it covers the changes noted before it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncMark(u64);

#[derive(Debug, Default)]
struct State {
    /// Sequence number of the next change noted.
    next: u64,
    /// Unsynced changes: (service, inode, epoch) and the sequence number of the latest.
    pending: HashMap<(Service, Ino, Epoch), u64>,
    /// Inodes with a change a sync found lost, not yet reported.
    lost: HashSet<Ino>,
}

#[derive(Debug, Default)]
pub(crate) struct DurabilityWatch {
    state: Mutex<State>,
}

impl DurabilityWatch {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change to `inodes` on `service`, acknowledged under `epoch`.
    pub fn changed(&self, service: Service, epoch: Epoch, inodes: &[Ino]) {
        if inodes.is_empty() {
            return;
        }
        let mut state = self.state();
        let seq = state.next;
        state.next += 1;
        for &ino in inodes {
            state.pending.insert((service, ino, epoch), seq);
        }
    }

    /// Taken just before a sync is sent: the changes it covers.
    pub fn mark(&self) -> SyncMark {
        SyncMark(self.state().next)
    }

    /// A sync of `service`, sent at `mark`, answered under `epoch`: the changes before the
    /// mark are durable if they were made under the same epoch, and lost if not.
    pub fn synced(&self, service: Service, mark: SyncMark, epoch: Epoch) {
        let mut state = self.state();
        let mut lost = Vec::new();
        state.pending.retain(|&(s, ino, changed_under), &mut seq| {
            if s != service || seq >= mark.0 {
                return true;
            }
            if changed_under != epoch {
                lost.push(ino);
            }
            false
        });
        for ino in lost {
            tracing::error!(
                ?service,
                ino,
                "changes acknowledged before the service restarted are lost; the next sync of \
                 this inode fails"
            );
            if state.lost.len() >= LOST_MAX {
                tracing::warn!("too many unreported losses; dropping the record of some");
                state.lost.clear();
            }
            state.lost.insert(ino);
        }
    }

    /// Whether a change to `ino` was found lost since the last time this was asked; the loss
    /// is reported once.
    pub fn take_lost(&self, ino: Ino) -> bool {
        self.state().lost.remove(&ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Service = Service::Target(TargetId(1));

    #[test]
    fn a_sync_under_the_same_epoch_makes_changes_durable() {
        let watch = DurabilityWatch::default();
        watch.changed(T, 7, &[10, 11]);
        let mark = watch.mark();
        watch.synced(T, mark, 7);
        assert!(!watch.take_lost(10) && !watch.take_lost(11));
        assert!(watch.state().pending.is_empty());
    }

    #[test]
    fn a_sync_under_a_new_epoch_reports_each_lost_inode_once() {
        let watch = DurabilityWatch::default();
        watch.changed(T, 7, &[10]);
        watch.changed(Service::Meta, 3, &[12]);
        let mark = watch.mark();
        watch.synced(T, mark, 8);
        assert!(watch.take_lost(10));
        assert!(!watch.take_lost(10), "reported once");
        // Another service's changes wait for its own sync.
        assert!(!watch.take_lost(12));
        watch.synced(Service::Meta, watch.mark(), 3);
        assert!(!watch.take_lost(12));
    }

    #[test]
    fn changes_after_the_mark_wait_for_the_next_sync() {
        let watch = DurabilityWatch::default();
        let mark = watch.mark();
        watch.changed(T, 7, &[10]);
        // This sync was sent before the change: it says nothing about it.
        watch.synced(T, mark, 9);
        assert!(!watch.take_lost(10));
        watch.synced(T, watch.mark(), 9);
        assert!(watch.take_lost(10), "the change was made under epoch 7");
    }
}
