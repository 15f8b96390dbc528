//! POSIX byte-range locks (fcntl F_GETLK / F_SETLK / F_SETLKW) shared by every client of the
//! namespace, so processes on different mounts exclude each other as processes on one
//! machine do.
//!
//! Locks live in memory only: they are advisory and belong to running processes. A restarted
//! metadata service starts with none and gives the clients of its last run a grace period to
//! take back what they held ([`LockTable::reclaim`], as NFS's grace period); new locks wait
//! for its end, so none is granted over a lock that is yet to be reclaimed.
//! Each lock belongs to an owner within a client ([`LockOwnerId`]); a client whose lease
//! ([`LOCK_LEASE`]) runs out without a renewal, because it crashed or lost the network, loses
//! all its locks, so a dead client cannot block the others for ever. A client renews its
//! lease with every lock request and, while it holds locks, every `LOCK_RENEW`.
//!
//! Semantics are POSIX's: a read lock conflicts with another owner's write lock, a write lock
//! with any lock of another owner; an owner's new lock replaces its own locks over the range
//! (upgrading or downgrading them), unlocking a middle part splits a lock in two, and the
//! owner's adjacent locks of one kind merge.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use stria_proto::fs::{FsStatus, Ino};
use stria_proto::wire::{LOCK_LEASE, LockHolder, LockKind, LockOwnerId, LockRange, ReclaimedLock};

/// Most locks held at once, over every file and client; past it a new lock is refused
/// (ENOLCK).
pub const LOCKS_MAX: usize = 1 << 20;
/// Most clients with a lease at once; past it a new client's first lock is refused (ENOLCK).
pub const LEASES_MAX: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    owner: LockOwnerId,
    pid: u32,
    start: u64,
    end: u64,
    write: bool,
}

impl Held {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn holder(&self) -> LockHolder {
        LockHolder {
            range: LockRange { start: self.start, end: self.end },
            kind: if self.write { LockKind::Write } else { LockKind::Read },
            pid: self.pid,
        }
    }
}

#[derive(Debug, Default)]
struct Locks {
    by_ino: HashMap<Ino, Vec<Held>>,
    /// When each client holding locks was last heard from.
    leases: HashMap<u64, Instant>,
    count: usize,
    /// Owners waiting for a lock (F_SETLKW): the owner whose lock was in the way at their
    /// last try, and when that was. A waiting client tries again at least every 100 ms, so an
    /// entry older than [`WAITING_FRESH`] is one that gave up.
    waiting: HashMap<LockOwnerId, (LockOwnerId, Instant)>,
}

/// How long a waiting owner's last try counts as waiting (see `Locks::waiting`).
const WAITING_FRESH: Duration = Duration::from_secs(1);
/// Most waiting owners noted; past it the stale entries go, then the new one is not noted.
const WAITING_MAX: usize = 1 << 16;

/// Every byte-range lock of the namespace.
#[derive(Debug)]
pub struct LockTable {
    locks: Mutex<Locks>,
    lease: Duration,
}

impl Default for LockTable {
    fn default() -> Self {
        LockTable::with_lease(LOCK_LEASE)
    }
}

impl LockTable {
    /// A table whose clients lose their locks after `lease` without a word.
    pub fn with_lease(lease: Duration) -> LockTable {
        LockTable { locks: Mutex::default(), lease }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Locks> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock that keeps `owner` from taking `kind` over `range`, if any (F_GETLK).
    pub fn test(
        &self,
        ino: Ino,
        owner: LockOwnerId,
        range: LockRange,
        kind: LockKind,
    ) -> Result<Option<LockHolder>, FsStatus> {
        check_range(range)?;
        let mut locks = self.lock();
        locks.heard_from(owner.client, self.lease, false);
        if kind == LockKind::Unlock {
            return Ok(None);
        }
        let write = kind == LockKind::Write;
        Ok(locks.conflict(ino, owner, range, write).map(|h| h.holder()))
    }

    /// Takes `kind` over `range` for `owner`, or drops the owner's locks there (`Unlock`)
    /// (F_SETLK). `LockConflict` while another owner holds a conflicting lock.
    pub fn set(
        &self,
        ino: Ino,
        owner: LockOwnerId,
        pid: u32,
        range: LockRange,
        kind: LockKind,
    ) -> Result<(), FsStatus> {
        self.set_or_wait(ino, owner, pid, range, kind, false)
    }

    /// [`LockTable::set`] for a caller that waits for the lock while it conflicts (F_SETLKW,
    /// `wait`): the owner is noted as waiting for the holder in its way, and a conflict that
    /// closes a cycle of owners waiting for each other is answered `Deadlock` (EDEADLK, as
    /// Linux answers its own F_SETLKW), since none of them would ever get its lock.
    pub fn set_or_wait(
        &self,
        ino: Ino,
        owner: LockOwnerId,
        pid: u32,
        range: LockRange,
        kind: LockKind,
        wait: bool,
    ) -> Result<(), FsStatus> {
        check_range(range)?;
        let mut locks = self.lock();
        let leased = locks.heard_from(owner.client, self.lease, kind != LockKind::Unlock);
        let write = match kind {
            LockKind::Unlock => {
                locks.cut(ino, owner, range);
                return Ok(());
            }
            LockKind::Read => false,
            LockKind::Write => true,
        };
        if let Some(holder) = locks.conflict(ino, owner, range, write).map(|h| h.owner) {
            if !wait {
                return Err(FsStatus::LockConflict);
            }
            let now = Instant::now();
            if locks.waits_for(holder, owner, now) {
                locks.waiting.remove(&owner);
                return Err(FsStatus::Deadlock);
            }
            locks.note_waiting(owner, holder, now);
            return Err(FsStatus::LockConflict);
        }
        locks.waiting.remove(&owner);
        // An owner's lock may split one of its own in two: at most two more.
        if !leased || locks.count + 2 > LOCKS_MAX {
            return Err(FsStatus::NoLocks);
        }
        locks.cut(ino, owner, range);
        locks.insert(ino, Held { owner, pid, start: range.start, end: range.end, write });
        Ok(())
    }

    /// Drops every lock `owner` holds on `ino` (its process closed the file).
    pub fn release_owner(&self, ino: Ino, owner: LockOwnerId) {
        let mut locks = self.lock();
        locks.heard_from(owner.client, self.lease, false);
        locks.waiting.remove(&owner);
        locks.cut(ino, owner, LockRange { start: 0, end: u64::MAX });
    }

    /// Keeps `client`'s locks for another lease. False when its lease had run out (its locks
    /// were dropped, as it is told): from now on it has a lease again, and no locks.
    pub fn renew(&self, client: u64) -> bool {
        let mut locks = self.lock();
        let had_lease = locks.leases.contains_key(&client);
        locks.heard_from(client, self.lease, true);
        had_lease
    }

    /// Takes back locks `client` held before the service restarted: one the owner still
    /// holds is kept; during the grace period (`in_grace`) others are granted where no other
    /// owner holds a conflicting lock. The locks that could not be taken back.
    pub fn reclaim(
        &self,
        client: u64,
        held: &[ReclaimedLock],
        in_grace: bool,
    ) -> Vec<ReclaimedLock> {
        let mut locks = self.lock();
        if !locks.heard_from(client, self.lease, true) {
            return held.to_vec();
        }
        let mut lost = Vec::new();
        for lock in held {
            let owner = LockOwnerId { client, owner: lock.owner };
            let write = match lock.kind {
                LockKind::Read => false,
                LockKind::Write => true,
                LockKind::Unlock => continue,
            };
            if locks.holds(lock.ino, owner, lock.range, write) {
                continue;
            }
            if !in_grace
                || check_range(lock.range).is_err()
                || locks.conflict(lock.ino, owner, lock.range, write).is_some()
                || locks.count + 2 > LOCKS_MAX
            {
                lost.push(*lock);
                continue;
            }
            locks.cut(lock.ino, owner, lock.range);
            let range = lock.range;
            let new = Held { owner, pid: lock.pid, start: range.start, end: range.end, write };
            locks.insert(lock.ino, new);
        }
        lost
    }

    /// Drops every lock of `client` (it said goodbye).
    pub fn drop_client(&self, client: u64) {
        let mut locks = self.lock();
        locks.leases.remove(&client);
        locks.drop_locks_of(client);
    }

    /// The clients that hold locks now.
    pub fn holders(&self) -> Vec<u64> {
        let locks = self.lock();
        let mut clients: Vec<u64> =
            locks.by_ino.values().flatten().map(|h| h.owner.client).collect();
        clients.sort_unstable();
        clients.dedup();
        clients
    }

    /// Locks held now, over every file.
    pub fn count(&self) -> usize {
        self.lock().count
    }
}

fn check_range(range: LockRange) -> Result<(), FsStatus> {
    if range.start > range.end {
        return Err(FsStatus::Invalid);
    }
    Ok(())
}

impl Locks {
    /// Drops the locks of every other client whose lease ran out, and renews `client`'s
    /// lease; a client without one gets one when `start` (taking a lock, renewing) and fewer
    /// than [`LEASES_MAX`] clients have one. Whether `client` has a lease now.
    fn heard_from(&mut self, client: u64, lease: Duration, start: bool) -> bool {
        let now = Instant::now();
        let expired: Vec<u64> = self
            .leases
            .iter()
            .filter(|&(&c, &at)| c != client && now.duration_since(at) > lease)
            .map(|(&c, _)| c)
            .collect();
        for gone in expired {
            self.leases.remove(&gone);
            let dropped = self.drop_locks_of(gone);
            if dropped > 0 {
                tracing::warn!(
                    client = gone,
                    dropped,
                    "a client's lock lease ran out: its locks are dropped"
                );
            }
        }
        if let Some(at) = self.leases.get_mut(&client) {
            *at = now;
            return true;
        }
        if start && self.leases.len() < LEASES_MAX {
            self.leases.insert(client, now);
            return true;
        }
        false
    }

    /// Whether `from` waits, directly or through other waiting owners, for `target`.
    fn waits_for(&self, from: LockOwnerId, target: LockOwnerId, now: Instant) -> bool {
        let mut at = from;
        // Each owner waits for one other: a chain longer than the entries repeats itself.
        for _ in 0..=self.waiting.len() {
            if at == target {
                return true;
            }
            match self.waiting.get(&at) {
                Some(&(next, since)) if now.duration_since(since) <= WAITING_FRESH => at = next,
                _ => return false,
            }
        }
        false
    }

    fn note_waiting(&mut self, owner: LockOwnerId, holder: LockOwnerId, now: Instant) {
        if self.waiting.len() >= WAITING_MAX && !self.waiting.contains_key(&owner) {
            self.waiting.retain(|_, (_, since)| now.duration_since(*since) <= WAITING_FRESH);
            if self.waiting.len() >= WAITING_MAX {
                return;
            }
        }
        self.waiting.insert(owner, (holder, now));
    }

    /// Whether `owner` holds `range` of `ino` with a lock of that kind (an owner's adjacent
    /// locks of one kind are one, so one lock covers it if any do).
    fn holds(&self, ino: Ino, owner: LockOwnerId, range: LockRange, write: bool) -> bool {
        self.by_ino.get(&ino).is_some_and(|held| {
            held.iter().any(|h| {
                h.owner == owner && h.write == write && h.start <= range.start && range.end <= h.end
            })
        })
    }

    /// Drops every lock of `client`, and its waits; how many locks there were.
    fn drop_locks_of(&mut self, client: u64) -> usize {
        self.waiting.retain(|owner, _| owner.client != client);
        let mut dropped = 0;
        self.by_ino.retain(|_, held| {
            let before = held.len();
            held.retain(|h| h.owner.client != client);
            dropped += before - held.len();
            !held.is_empty()
        });
        self.count -= dropped;
        dropped
    }

    fn conflict(
        &self,
        ino: Ino,
        owner: LockOwnerId,
        range: LockRange,
        write: bool,
    ) -> Option<&Held> {
        self.by_ino
            .get(&ino)?
            .iter()
            .find(|h| h.owner != owner && h.overlaps(range.start, range.end) && (write || h.write))
    }

    /// Removes `owner`'s coverage of `range` on `ino`, keeping the parts of its locks outside.
    fn cut(&mut self, ino: Ino, owner: LockOwnerId, range: LockRange) {
        let Some(held) = self.by_ino.get_mut(&ino) else { return };
        let before = held.len();
        let mut kept = Vec::with_capacity(held.len() + 1);
        for h in held.drain(..) {
            if h.owner != owner || !h.overlaps(range.start, range.end) {
                kept.push(h);
                continue;
            }
            if h.start < range.start {
                kept.push(Held { end: range.start - 1, ..h });
            }
            if h.end > range.end {
                kept.push(Held { start: range.end + 1, ..h });
            }
        }
        *held = kept;
        let after = held.len();
        if held.is_empty() {
            self.by_ino.remove(&ino);
        }
        self.count = self.count + after - before;
    }

    /// Adds `new` (whose range the owner holds nothing of), merged with the owner's adjacent
    /// locks of the same kind.
    fn insert(&mut self, ino: Ino, mut new: Held) {
        let held = self.by_ino.entry(ino).or_default();
        let before = held.len();
        held.retain(|h| {
            let adjacent = h.owner == new.owner
                && h.write == new.write
                && (h.end.checked_add(1) == Some(new.start)
                    || new.end.checked_add(1) == Some(h.start));
            if adjacent {
                new.start = new.start.min(h.start);
                new.end = new.end.max(h.end);
            }
            !adjacent
        });
        held.push(new);
        self.count = self.count + held.len() - before;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const A: LockOwnerId = LockOwnerId { client: 1, owner: 10 };
    const B: LockOwnerId = LockOwnerId { client: 2, owner: 10 };
    /// Same client as A, another process.
    const A2: LockOwnerId = LockOwnerId { client: 1, owner: 11 };

    fn r(start: u64, end: u64) -> LockRange {
        LockRange { start, end }
    }

    #[test]
    fn reads_share_writes_exclude_and_owners_never_block_themselves() {
        let t = LockTable::default();
        t.set(1, A, 100, r(0, 99), LockKind::Read).unwrap();
        t.set(1, B, 200, r(50, 149), LockKind::Read).unwrap();
        assert_eq!(t.set(1, B, 200, r(90, 95), LockKind::Write), Err(FsStatus::LockConflict));
        assert_eq!(t.set(1, A2, 300, r(0, 0), LockKind::Write), Err(FsStatus::LockConflict));
        // A upgrades over its own read lock where nobody else reads.
        t.set(1, A, 100, r(0, 49), LockKind::Write).unwrap();
        let seen = t.test(1, B, r(0, 10), LockKind::Read).unwrap().unwrap();
        assert_eq!((seen.range, seen.kind, seen.pid), (r(0, 49), LockKind::Write, 100));
        assert_eq!(t.test(1, B, r(150, 200), LockKind::Write).unwrap(), None);
        // Other files are independent.
        t.set(2, B, 200, r(0, u64::MAX), LockKind::Write).unwrap();
        assert_eq!(t.count(), 4);
    }

    #[test]
    fn unlocking_the_middle_splits_and_neighbours_merge() {
        let t = LockTable::default();
        t.set(1, A, 1, r(0, 99), LockKind::Write).unwrap();
        t.set(1, A, 1, r(40, 59), LockKind::Unlock).unwrap();
        assert_eq!(t.count(), 2);
        t.set(1, B, 2, r(40, 59), LockKind::Write).unwrap();
        assert_eq!(t.set(1, B, 2, r(39, 39), LockKind::Read), Err(FsStatus::LockConflict));
        assert_eq!(t.set(1, B, 2, r(60, 60), LockKind::Read), Err(FsStatus::LockConflict));
        t.set(1, B, 2, r(40, 59), LockKind::Unlock).unwrap();
        // Filling the hole merges A's three pieces into one.
        t.set(1, A, 1, r(40, 59), LockKind::Write).unwrap();
        assert_eq!(t.count(), 1);
        let seen = t.test(1, B, r(0, u64::MAX), LockKind::Read).unwrap().unwrap();
        assert_eq!(seen.range, r(0, 99));
        // A lock to the end of every file, then a downgrade of its tail.
        t.set(1, A, 1, r(100, u64::MAX), LockKind::Write).unwrap();
        t.set(1, A, 1, r(1000, u64::MAX), LockKind::Read).unwrap();
        t.set(1, B, 2, r(5000, 6000), LockKind::Read).unwrap();
        assert_eq!(t.set(1, B, 2, r(999, 999), LockKind::Read), Err(FsStatus::LockConflict));
    }

    #[test]
    fn a_closing_owner_drops_its_locks_only() {
        let t = LockTable::default();
        t.set(1, A, 1, r(0, 9), LockKind::Write).unwrap();
        t.set(1, A2, 2, r(10, 19), LockKind::Write).unwrap();
        t.set(3, A, 1, r(0, 9), LockKind::Write).unwrap();
        t.release_owner(1, A);
        assert_eq!(t.count(), 2);
        t.set(1, B, 3, r(0, 9), LockKind::Write).unwrap();
        assert_eq!(t.set(1, B, 3, r(10, 10), LockKind::Read), Err(FsStatus::LockConflict));
        assert_eq!(t.set(3, B, 3, r(0, 0), LockKind::Read), Err(FsStatus::LockConflict));
    }

    #[test]
    fn a_silent_client_loses_its_locks_when_its_lease_runs_out() {
        let t = LockTable::default();
        t.set(1, A, 1, r(0, 9), LockKind::Write).unwrap();
        let ago = |secs| Instant::now().checked_sub(Duration::from_secs(secs)).unwrap();
        // Last heard from 20 s ago: still within its 30 s lease.
        t.lock().leases.insert(A.client, ago(20));
        assert_eq!(t.set(1, B, 2, r(0, 9), LockKind::Read), Err(FsStatus::LockConflict));
        // A renewal keeps the locks however long ago the last word was.
        t.lock().leases.insert(A.client, ago(40));
        assert!(t.renew(A.client), "nobody asked since: still A's");
        assert_eq!(t.set(1, B, 2, r(0, 9), LockKind::Read), Err(FsStatus::LockConflict));
        // Silent past the lease: the next request of anyone drops A's locks.
        t.lock().leases.insert(A.client, ago(31));
        t.set(1, B, 2, r(0, 9), LockKind::Read).unwrap();
        assert_eq!(t.count(), 1, "A's lock is gone");
        assert!(!t.renew(A.client), "A learns that its lease ran out");
    }

    #[test]
    fn leases_are_given_to_lockers_only_and_capped() {
        let t = LockTable::default();
        t.test(1, A, r(0, 9), LockKind::Write).unwrap();
        t.set(1, A, 1, r(0, 9), LockKind::Unlock).unwrap();
        assert!(t.lock().leases.is_empty(), "asking and unlocking start no lease");
        for client in 0..LEASES_MAX as u64 {
            t.lock().leases.insert(1000 + client, Instant::now());
        }
        assert_eq!(t.set(1, A, 1, r(0, 9), LockKind::Write), Err(FsStatus::NoLocks));
        assert_eq!(t.count(), 0);
        t.lock().leases.remove(&1000);
        t.set(1, A, 1, r(0, 9), LockKind::Write).unwrap();
    }

    #[test]
    fn reclaimed_locks_come_back_unless_another_owner_holds_the_range() {
        let t = LockTable::default();
        t.set(1, B, 2, r(100, 199), LockKind::Read).unwrap();
        let held = |ino, owner, start, end, kind| ReclaimedLock {
            ino,
            owner,
            pid: 7,
            range: r(start, end),
            kind,
        };
        let told = [
            held(1, A.owner, 0, 99, LockKind::Write),
            held(1, A2.owner, 150, 160, LockKind::Read),
            held(1, A.owner, 190, 200, LockKind::Write),
            held(2, A.owner, 5, 4, LockKind::Write),
        ];
        let lost = t.reclaim(A.client, &told, true);
        assert_eq!(lost, vec![told[2], told[3]], "the write over B's read lock, the bad range");
        // Told again once the grace period is over: what A holds stays, the rest is lost.
        assert_eq!(t.reclaim(A.client, &told, false), vec![told[2], told[3]]);
        let later = held(3, A.owner, 0, 0, LockKind::Read);
        assert_eq!(t.reclaim(A.client, &[later], false), vec![later]);
        assert_eq!(t.set(1, B, 2, r(50, 50), LockKind::Read), Err(FsStatus::LockConflict));
        assert_eq!(t.test(1, B, r(155, 155), LockKind::Write).unwrap().unwrap().pid, 7);
        assert_eq!(t.holders(), vec![A.client, B.client]);
        assert!(t.renew(A.client), "a reclaim starts the lease");
        t.drop_client(A.client);
        assert_eq!(t.holders(), vec![B.client]);
        t.set(1, B, 2, r(0, 99), LockKind::Write).unwrap();
    }

    #[test]
    fn a_wait_that_closes_a_cycle_is_a_deadlock() {
        let t = LockTable::default();
        const C: LockOwnerId = LockOwnerId { client: 3, owner: 10 };
        t.set(1, A, 1, r(0, 9), LockKind::Write).unwrap();
        t.set(1, B, 2, r(10, 19), LockKind::Write).unwrap();
        t.set(1, C, 3, r(20, 29), LockKind::Write).unwrap();
        // A waits for B, B for C: no cycle yet.
        let wait = |owner, at| t.set_or_wait(1, owner, 9, r(at, at), LockKind::Write, true);
        assert_eq!(wait(A, 10), Err(FsStatus::LockConflict));
        assert_eq!(wait(B, 20), Err(FsStatus::LockConflict));
        // A try without waiting is never a deadlock.
        assert_eq!(t.set(1, C, 3, r(0, 0), LockKind::Read), Err(FsStatus::LockConflict));
        // C waiting for A would close A -> B -> C -> A.
        assert_eq!(wait(C, 5), Err(FsStatus::Deadlock));
        // A gives up (its wait goes stale): C may wait for A then.
        let stale = Instant::now().checked_sub(WAITING_FRESH * 2).unwrap();
        t.lock().waiting.insert(A, (B, stale));
        assert_eq!(wait(C, 5), Err(FsStatus::LockConflict));
        // B gets C's range once C unlocks it, and stops waiting.
        t.set(1, C, 3, r(20, 29), LockKind::Unlock).unwrap();
        assert_eq!(wait(B, 20), Ok(()));
        assert!(!t.lock().waiting.contains_key(&B));
        // A closing its file drops its waits with its locks.
        assert_eq!(wait(A, 10), Err(FsStatus::LockConflict));
        t.release_owner(1, A);
        assert!(!t.lock().waiting.contains_key(&A));
    }

    #[test]
    fn bad_ranges_are_refused() {
        let t = LockTable::default();
        assert_eq!(t.set(1, A, 1, r(10, 9), LockKind::Write), Err(FsStatus::Invalid));
        assert_eq!(t.test(1, A, r(10, 9), LockKind::Read), Err(FsStatus::Invalid));
    }
}
