//! A restarted service takes back the opens and locks its clients held (`Meta::reclaim`):
//! until they have, in the grace period, a last unlink keeps the file and orphans wait; after
//! it the orphans nobody reclaimed go. A clean stop names the clients to wait for; after a
//! crash the grace period runs its whole length.

mod common;

use std::time::Duration;

use common::*;
use stria_meta::*;
use stria_proto::fs::ROOT_INO;
use stria_proto::wire::{LockKind, LockOwnerId, LockRange, ReclaimedLock};

const CLIENT: u64 = 7;
const LONG: Duration = Duration::from_secs(600);

fn write_lock(ino: u64) -> ReclaimedLock {
    ReclaimedLock {
        ino,
        owner: 1,
        pid: 42,
        range: LockRange { start: 0, end: 99 },
        kind: LockKind::Write,
    }
}

fn other_owner() -> LockOwnerId {
    LockOwnerId { client: 8, owner: 1 }
}

fn purged(m: &Meta) -> Vec<u64> {
    let mut inos: Vec<u64> = m.expire_clients().expect("expire").iter().map(|p| p.ino).collect();
    inos.sort_unstable();
    inos
}

#[test]
fn opens_and_locks_come_back_after_a_clean_stop_and_unclaimed_orphans_go() {
    let path = tmp_path("reclaim-clean");
    let (open_orphan, left_orphan, locked) = {
        let m = Meta::open(&path, options()).expect("create");
        m.begin_serving(LONG).expect("serve");
        assert!(!m.in_grace(), "a new namespace has nobody to wait for");
        let a = m.create(ROOT_INO, b"a", 0o644, &alice()).expect("a");
        let b = m.create(ROOT_INO, b"b", 0o644, &alice()).expect("b");
        let c = m.create(ROOT_INO, b"c", 0o644, &alice()).expect("c");
        m.open_file(a.ino, CLIENT).expect("open a");
        m.open_file(b.ino, 99).expect("open b");
        m.unlink(ROOT_INO, b"a", &alice()).expect("unlink a");
        m.unlink(ROOT_INO, b"b", &alice()).expect("unlink b");
        let owner = LockOwnerId { client: CLIENT, owner: 1 };
        let range = LockRange { start: 0, end: 99 };
        m.locks().set(c.ino, owner, 42, range, LockKind::Write).expect("lock");
        m.record_clean_stop().expect("stop");
        (a.ino, b.ino, c.ino)
    };
    let m = Meta::open(&path, options()).expect("reopen");
    m.begin_serving(LONG).expect("serve");
    assert!(m.in_grace(), "clients 7 and 99 held opens or locks");
    // A file nobody counts as open may be open at a client yet to reclaim: kept.
    let d = m.create(ROOT_INO, b"d", 0o644, &alice()).expect("d");
    let unlinked = m.unlink(ROOT_INO, b"d", &alice()).expect("unlink d");
    assert!(unlinked.purge.is_none(), "purged during the grace period");
    assert_eq!(purged(&m), Vec::<u64>::new(), "orphans wait for the end of the grace period");
    assert_eq!(m.locks().count(), 0, "locks are memory only");

    let loss = m.reclaim(CLIENT, true, &[(open_orphan, 1)], &[write_lock(locked)]).expect("7");
    assert_eq!(loss, reclaim::ReclaimLoss::default());
    assert!(m.in_grace(), "client 99 has not reclaimed yet");
    let loss = m.reclaim(99, true, &[], &[]).expect("99 closed b meanwhile");
    assert_eq!(loss, reclaim::ReclaimLoss::default());
    assert!(!m.in_grace(), "everyone awaited has reclaimed");

    // The lock is 7's again; the orphans only the last run had open go now.
    let conflict =
        m.locks().set(locked, other_owner(), 1, LockRange { start: 5, end: 5 }, LockKind::Read);
    assert_eq!(conflict, Err(stria_proto::fs::FsStatus::LockConflict));
    assert_eq!(purged(&m), {
        let mut gone = vec![left_orphan, d.ino];
        gone.sort_unstable();
        gone
    });
    assert_eq!(m.orphans().expect("orphans"), vec![open_orphan], "still open at client 7");
    let last = m.release(open_orphan, CLIENT).expect("release").expect("its purge");
    assert_eq!(last.ino, open_orphan);
    assert!(m.orphans().expect("orphans").is_empty());

    // Once the grace period is over a lock the owner no longer holds is not granted back.
    let late = ReclaimedLock { ino: d.ino, ..write_lock(locked) };
    let loss = m.reclaim(CLIENT, true, &[(d.ino, 1)], &[write_lock(locked), late]).expect("late");
    assert_eq!((loss.opens, loss.locks), (1, vec![late]), "d is gone; 7 still holds c's lock");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn after_a_crash_the_grace_period_runs_its_length_and_a_clean_stop_without_holders_has_none() {
    let path = tmp_path("reclaim-crash");
    let held = {
        let m = Meta::open(&path, options()).expect("create");
        m.begin_serving(LONG).expect("serve");
        let f = m.create(ROOT_INO, b"f", 0o644, &alice()).expect("f");
        m.open_file(f.ino, CLIENT).expect("open");
        m.unlink(ROOT_INO, b"f", &alice()).expect("unlink");
        f.ino
        // Dropped without record_clean_stop: a crash.
    };
    {
        let m = Meta::open(&path, options()).expect("reopen");
        m.begin_serving(Duration::from_millis(300)).expect("serve");
        m.reclaim(CLIENT, true, &[], &[]).expect("reclaim");
        assert!(m.in_grace(), "who held what is unknown: the whole grace period");
        assert_eq!(purged(&m), Vec::<u64>::new());
        std::thread::sleep(Duration::from_millis(400));
        assert!(!m.in_grace());
        assert_eq!(purged(&m), vec![held], "nobody reclaimed the orphan");
        m.record_clean_stop().expect("stop");
    }
    let m = Meta::open(&path, options()).expect("reopen");
    m.begin_serving(LONG).expect("serve");
    assert!(!m.in_grace(), "stopped cleanly with nothing open and no locks");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn nothing_is_purged_in_a_grace_period_and_a_stop_in_it_keeps_the_wait() {
    let path = tmp_path("reclaim-in-grace");
    let f = {
        let m = Meta::open(&path, options()).expect("create");
        m.begin_serving(LONG).expect("serve");
        let f = m.create(ROOT_INO, b"f", 0o644, &alice()).expect("f");
        m.open_file(f.ino, CLIENT).expect("open at 7");
        m.open_file(f.ino, 8).expect("open at 8");
        m.unlink(ROOT_INO, b"f", &alice()).expect("unlink");
        m.record_clean_stop().expect("stop");
        f.ino
    };
    {
        let m = Meta::open(&path, options()).expect("reopen");
        m.begin_serving(LONG).expect("serve");
        m.reclaim(CLIENT, true, &[(f, 1)], &[]).expect("7");
        // 7's last close: 8 may still have the file open, and has not said so yet.
        assert!(m.release(f, CLIENT).expect("release").is_none(), "purged under client 8");
        assert_eq!(m.orphans().expect("orphans"), vec![f]);
        assert_eq!(purged(&m), Vec::<u64>::new());
        // Stopped before 8 reclaimed: the next run waits for 8 again.
        m.record_clean_stop().expect("stop");
    }
    {
        let m = Meta::open(&path, options()).expect("reopen");
        m.begin_serving(LONG).expect("serve");
        assert!(m.in_grace(), "8 is still awaited");
        m.reclaim(8, true, &[(f, 1)], &[]).expect("8");
        assert!(!m.in_grace());
        assert_eq!(purged(&m), Vec::<u64>::new(), "open at 8");
        assert_eq!(m.release(f, 8).expect("release").map(|p| p.ino), Some(f));
        drop(m); // a crash
    }
    {
        let m = Meta::open(&path, options()).expect("reopen");
        m.begin_serving(LONG).expect("serve");
        // Stopped cleanly inside a grace period that followed a crash: still unknown.
        m.record_clean_stop().expect("stop");
    }
    let m = Meta::open(&path, options()).expect("reopen");
    m.begin_serving(LONG).expect("serve");
    m.reclaim(CLIENT, true, &[], &[]).expect("7");
    assert!(m.in_grace(), "who held what before the crash is still unknown");
    let _ = std::fs::remove_file(&path);
}
