//! The log of namespace changes that mounts watch ([`MetaRequest::WatchChanges`]).
//!
//! Every successful change the service runs is recorded here with the connection it came
//! through ([`MetaRequest::namespace_changes`]). A client asks for what other connections
//! changed after its cursor and waits when there is nothing yet, so a mount hears of another
//! client's unlink, rename or chmod within milliseconds and drops what its kernel cached.
//! That lets mounts keep names and attributes cached for longer than a polling timeout would
//! allow; see `docs/internals/fs.md`, "Cache coherence between clients".
//!
//! The log lives in memory and keeps the last [`LOG_CHANGES_MAX`] changes. A client whose
//! cursor is older than that, or from an earlier run of the service, is told its view is not
//! complete (`ChangeBatch::complete` = false).
//!
//! [`MetaRequest::WatchChanges`]: stria_proto::wire::MetaRequest::WatchChanges
//! [`MetaRequest::namespace_changes`]: stria_proto::wire::MetaRequest::namespace_changes

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use stria_proto::wire::{CHANGES_PER_BATCH_MAX, Change, ChangeBatch, ChangeCursor};
use tokio::sync::Notify;

/// Changes the log keeps (about 64 bytes each plus the name).
pub const LOG_CHANGES_MAX: usize = 65_536;

/// The service's log of recent changes.
#[derive(Debug)]
pub struct ChangeLog {
    /// This log's id: a cursor of another run of the service names another log.
    id: u64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The sequence number of `entries[0]`.
    first: u64,
    entries: VecDeque<(SocketAddr, Change)>,
    /// Readers waiting for a change, by connection: only a change of another connection
    /// wakes one, so a busy client's own changes cost its watcher nothing.
    waiters: Vec<(SocketAddr, Arc<Notify>)>,
    /// The service is stopping: nobody waits any more.
    closed: bool,
}

impl Inner {
    fn end(&self) -> u64 {
        self.first + self.entries.len() as u64
    }
}

/// How long a woken reader waits for more changes to come with the first: a client making
/// thousands of changes a second then costs a watcher hundreds of answers, not thousands.
const GATHER: Duration = Duration::from_millis(2);

impl Default for ChangeLog {
    fn default() -> ChangeLog {
        ChangeLog { id: stria_proto::wire::new_epoch(), inner: Mutex::default() }
    }
}

impl ChangeLog {
    /// Records what a request from `origin` changed.
    pub fn record(&self, origin: SocketAddr, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        let mut inner = self.lock();
        for change in changes {
            inner.entries.push_back((origin, change));
        }
        while inner.entries.len() > LOG_CHANGES_MAX {
            inner.entries.pop_front();
            inner.first += 1;
        }
        for (reader, woken) in &inner.waiters {
            if *reader != origin {
                woken.notify_one();
            }
        }
    }

    /// Ends every wait, now and from now on: a stopping service answers its watchers rather
    /// than keep its stop waiting for their requests.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        for (_, woken) in &inner.waiters {
            woken.notify_one();
        }
    }

    /// The changes after `after` made through connections other than `reader`, at most
    /// [`CHANGES_PER_BATCH_MAX`]; `None` starts at the end (nothing yet).
    pub fn since(&self, after: Option<ChangeCursor>, reader: SocketAddr) -> ChangeBatch {
        self.since_in(&self.lock(), after, reader)
    }

    fn since_in(
        &self,
        inner: &Inner,
        after: Option<ChangeCursor>,
        reader: SocketAddr,
    ) -> ChangeBatch {
        let (start, complete) = match after {
            None => (inner.end(), true),
            Some(c) if c.log == self.id && c.next >= inner.first && c.next <= inner.end() => {
                (c.next, true)
            }
            // A cursor of an earlier run, or one the log has moved past: start at what the
            // log still has, and say that something was missed.
            Some(_) => (inner.first, false),
        };
        let mut changes = Vec::new();
        let mut next = start;
        for (origin, change) in inner.entries.iter().skip((start - inner.first) as usize) {
            if changes.len() == CHANGES_PER_BATCH_MAX {
                break;
            }
            next += 1;
            if *origin != reader {
                changes.push(change.clone());
            }
        }
        ChangeBatch { changes, cursor: ChangeCursor { log: self.id, next }, complete }
    }

    /// As [`ChangeLog::since`], but waits up to `wait` while there is nothing to tell (a
    /// first call, `after` None, is answered at once: it only learns where the log ends).
    pub async fn wait(
        &self,
        after: Option<ChangeCursor>,
        reader: SocketAddr,
        wait: Duration,
    ) -> ChangeBatch {
        let give_up = tokio::time::Instant::now() + wait;
        let woken = Arc::new(Notify::new());
        let batch = {
            let mut inner = self.lock();
            let batch = self.since_in(&inner, after, reader);
            if after.is_none() || !batch.changes.is_empty() || !batch.complete || inner.closed {
                return batch;
            }
            // Registered under the lock that `record` takes: no change is missed between.
            inner.waiters.push((reader, woken.clone()));
            batch
        };
        // Unregistered however the wait ends, also when the caller drops it.
        let _registered = Registered { log: self, woken: &woken };
        let heard = tokio::time::timeout_at(give_up, woken.notified()).await.is_ok();
        if heard && !self.lock().closed {
            let left = give_up.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(GATHER.min(left)).await;
        }
        self.since(Some(batch.cursor), reader)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A waiter's place in [`Inner::waiters`], given up on drop.
struct Registered<'a> {
    log: &'a ChangeLog,
    woken: &'a Arc<Notify>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.log.lock().waiters.retain(|(_, w)| !Arc::ptr_eq(w, self.woken));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn attr(ino: u64) -> Change {
        Change::Attr { ino }
    }

    #[test]
    fn readers_see_the_changes_of_others_only_and_in_order() {
        let log = ChangeLog::default();
        let start = log.since(None, addr(1));
        assert!(start.changes.is_empty() && start.complete);
        log.record(addr(1), vec![attr(10)]);
        log.record(addr(2), vec![attr(20), Change::Entry { parent: 1, name: b"x".to_vec() }]);
        let mine = log.since(Some(start.cursor), addr(1));
        assert_eq!(mine.changes, vec![attr(20), Change::Entry { parent: 1, name: b"x".to_vec() }]);
        assert!(mine.complete);
        let theirs = log.since(Some(start.cursor), addr(2));
        assert_eq!(theirs.changes, vec![attr(10)]);
        // Read to the end: nothing more until the next change.
        assert!(log.since(Some(mine.cursor), addr(1)).changes.is_empty());
        log.record(addr(3), vec![attr(30)]);
        assert_eq!(log.since(Some(mine.cursor), addr(1)).changes, vec![attr(30)]);
    }

    #[test]
    fn a_cursor_the_log_moved_past_or_of_another_run_is_incomplete() {
        let log = ChangeLog::default();
        let start = log.since(None, addr(1)).cursor;
        for i in 0..LOG_CHANGES_MAX as u64 + 5 {
            log.record(addr(2), vec![attr(i)]);
        }
        let late = log.since(Some(start), addr(1));
        assert!(!late.complete, "5 changes were dropped before this reader saw them");
        assert_eq!(late.changes.len(), CHANGES_PER_BATCH_MAX);
        assert_eq!(late.changes[0], attr(5), "starts at the oldest change kept");
        let other_run = ChangeLog::default();
        let foreign = other_run.since(Some(start), addr(1));
        assert!(!foreign.complete);
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_at_another_connections_change_only() {
        let log = Arc::new(ChangeLog::default());
        let start = log.wait(None, addr(1), Duration::from_secs(30)).await.cursor;
        let writer = log.clone();
        let changes = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            writer.record(addr(1), vec![attr(1)]);
            tokio::time::sleep(Duration::from_millis(20)).await;
            writer.record(addr(2), vec![attr(2)]);
        });
        let batch = log.wait(Some(start), addr(1), Duration::from_secs(30)).await;
        assert_eq!(batch.changes, vec![attr(2)], "its own change did not end the wait");
        changes.await.expect("the writer task ran");
        let idle = log.wait(Some(batch.cursor), addr(1), Duration::from_millis(30)).await;
        assert!(idle.changes.is_empty() && idle.complete && idle.cursor == batch.cursor);
        assert!(log.lock().waiters.is_empty(), "ended waits leave no waiter behind");
    }

    #[tokio::test]
    async fn closing_ends_every_wait_and_dropped_waits_leave_nothing() {
        let log = Arc::new(ChangeLog::default());
        let start = log.since(None, addr(1)).cursor;
        // A wait its caller gave up on.
        let dropped = tokio::time::timeout(
            Duration::from_millis(20),
            log.wait(Some(start), addr(1), Duration::from_secs(30)),
        )
        .await;
        assert!(dropped.is_err());
        assert!(log.lock().waiters.is_empty(), "a dropped wait left its waiter");
        let waiting = log.clone();
        let wait = tokio::spawn(async move {
            waiting.wait(Some(start), addr(1), Duration::from_secs(60)).await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let closed_at = tokio::time::Instant::now();
        log.close();
        let batch = wait.await.expect("the wait ran");
        assert!(batch.changes.is_empty() && batch.complete);
        assert!(closed_at.elapsed() < Duration::from_secs(30), "the wait outlived the close");
        // And a wait that starts after the close does not wait.
        let after = log.wait(Some(start), addr(1), Duration::from_secs(60)).await;
        assert!(after.changes.is_empty());
    }
}
