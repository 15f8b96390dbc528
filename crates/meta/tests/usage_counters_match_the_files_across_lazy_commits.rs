//! With lazy commits the usage counters are written into their tables only at durable
//! commits (the changes in between are kept in memory). Whatever the moment, they must match
//! the files: when read while changes are pending, in the state a crash returns to, and
//! after a close and reopen.

mod common;

use std::collections::BTreeMap;

use common::*;
use stria_meta::record::{extension_of, size_class};
use stria_meta::*;
use stria_proto::fs::{Ino, ROOT_INO};

#[derive(Default, Debug, PartialEq)]
struct Counts {
    total: (u64, u64),
    uids: BTreeMap<u32, (u64, u64)>,
    gids: BTreeMap<u32, (u64, u64)>,
    exts: BTreeMap<String, (u64, u64)>,
    sizes: Vec<(u64, u64)>,
}

fn add(slot: &mut (u64, u64), size: u64) {
    slot.0 += 1;
    slot.1 += size;
}

/// The counts recomputed from the files themselves: every regular file under the root.
fn recount(m: &Meta) -> Counts {
    let mut counts = Counts { sizes: vec![(0, 0); SIZE_CLASSES], ..Counts::default() };
    let mut dirs = vec![ROOT_INO];
    while let Some(dir) = dirs.pop() {
        let mut cookie = 0;
        loop {
            let entries = m.readdir(dir, cookie, 1000, &root()).expect("readdir");
            let Some(last) = entries.last() else { break };
            cookie = last.next_cookie;
            for entry in &entries {
                let attr = m.getattr(entry.ino).expect("getattr");
                match attr.kind {
                    FileKind::Dir => dirs.push(entry.ino),
                    FileKind::File => {
                        add(&mut counts.total, attr.size);
                        add(counts.uids.entry(attr.uid).or_default(), attr.size);
                        add(counts.gids.entry(attr.gid).or_default(), attr.size);
                        add(counts.exts.entry(extension_of(&entry.name)).or_default(), attr.size);
                        add(&mut counts.sizes[size_class(attr.size) as usize], attr.size);
                    }
                    _ => {}
                }
            }
        }
    }
    counts
}

/// The counts as the counters report them, for the ids and extensions `like` has.
fn reported(m: &Meta, like: &Counts) -> Counts {
    let pair = |u: Usage| (u.files, u.bytes);
    let keep = |u: &Usage| u.files > 0 || u.bytes > 0;
    let uids = like.uids.keys().chain([&1000, &1001, &0]);
    let gids = like.gids.keys().chain([&1000, &1001, &0]);
    Counts {
        total: pair(m.usage_total().expect("total")),
        uids: uids
            .map(|&uid| (uid, m.usage_by_uid(uid).expect("uid")))
            .filter(|(_, u)| keep(u))
            .map(|(uid, u)| (uid, pair(u)))
            .collect(),
        gids: gids
            .map(|&gid| (gid, m.usage_by_gid(gid).expect("gid")))
            .filter(|(_, u)| keep(u))
            .map(|(gid, u)| (gid, pair(u)))
            .collect(),
        exts: m
            .top_extensions(1000)
            .expect("extensions")
            .into_iter()
            .filter(|(_, u)| keep(u))
            .map(|(ext, u)| (ext, pair(u)))
            .collect(),
        sizes: m.size_histogram().expect("histogram").into_iter().map(pair).collect(),
    }
}

fn assert_counters_match(m: &Meta, when: &str) {
    let truth = recount(m);
    assert_eq!(reported(m, &truth), truth, "{when}: counters against the files");
    let analytics = m.analytics(ANALYTICS_TOP_MAX).expect("analytics");
    assert_eq!((analytics.total.files, analytics.total.bytes), truth.total, "{when}: analytics");
    assert_eq!(m.statfs(0, 0).expect("statfs").files, truth.total.0, "{when}: statfs");
}

/// Creates, grows, chowns and removes files, `round` choosing which: every kind of change
/// the counters follow.
fn churn(m: &Meta, dir: Ino, round: u64) {
    let exts = ["txt", "BIN", "", "tar"];
    for i in 0..40u64 {
        let ext = exts[((i + round) % 4) as usize];
        let name = format!("r{round}-f{i}{}{ext}", if ext.is_empty() { "" } else { "." });
        let who = if i % 3 == 0 { alice() } else { bob() };
        let parent = if i % 2 == 0 { dir } else { ROOT_INO };
        let f = m.create(parent, name.as_bytes(), 0o666, &who).expect("create");
        if i % 4 != 0 {
            m.write_inline(f.ino, 0, &vec![1; (i * 50) as usize]).expect("inline write");
        }
        if i % 5 == 0 {
            let plan = m.spill_begin(f.ino).expect("plan");
            m.spill_commit(&plan).expect("spill");
            m.extend_size(f.ino, (i + 1) * 70_000, Timestamp::new(7, 0)).expect("grow");
        }
        if i % 7 == 0 {
            let chown = SetAttr { uid: Some(1001), gid: Some(1001), ..SetAttr::default() };
            m.setattr(f.ino, &root(), &chown).expect("chown");
        }
        if i % 6 == 1 {
            m.unlink(parent, name.as_bytes(), &root()).expect("unlink");
        }
    }
}

fn lazy() -> MetaOptions {
    MetaOptions { commit: Commit::Lazy, ..options() }
}

/// A file-backed store with lazy commits and a fileset directory for `churn`.
fn lazy_store(name: &str) -> (std::path::PathBuf, Meta, Ino) {
    let path = tmp_path(name);
    let m = Meta::open(&path, lazy()).expect("open");
    let d = m.mkdir(ROOT_INO, b"set", 0o777, &root()).expect("mkdir");
    (path, m, d.ino)
}

#[test]
fn counters_read_between_durable_commits_match_the_files() {
    let (path, m, d) = lazy_store("counters-live");
    for round in 0..4 {
        churn(&m, d, round);
        assert_counters_match(&m, &format!("after round {round}"));
    }
    m.sync().expect("sync");
    assert_counters_match(&m, "after a sync");
    drop(m);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_crash_returns_counters_that_match_the_files_of_the_last_sync() {
    let (path, m, d) = lazy_store("counters-crash");
    churn(&m, d, 0);
    // A read of the counters writes the pending changes into the tables, lazily: the crash
    // below must not keep them without the files they count, nor the reverse.
    assert_counters_match(&m, "before the sync");
    churn(&m, d, 1);
    m.sync().expect("sync");
    let synced = recount(&m);
    churn(&m, d, 2);
    assert_counters_match(&m, "after the sync");
    churn(&m, d, 3);
    let image = crash_image(&path, "counters-crash-image");
    let after = Meta::open(&image, lazy()).expect("open the crash image");
    assert_eq!(recount(&after), synced, "the crash returns the files of the last sync");
    assert_counters_match(&after, "after the crash");
    drop(after);
    drop(m);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&image);
}

#[test]
fn a_close_without_a_sync_keeps_counters_that_match_the_files() {
    let (path, m, d) = lazy_store("counters-close");
    churn(&m, d, 0);
    m.sync().expect("sync");
    churn(&m, d, 1);
    let before = recount(&m);
    drop(m);
    let m = Meta::open(&path, lazy()).expect("reopen");
    assert_eq!(recount(&m), before, "a clean close keeps every lazy commit");
    assert_counters_match(&m, "after the reopen");
    drop(m);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_check_finds_counters_that_disagree_with_the_files_and_repair_rewrites_them() {
    let (path, m, d) = lazy_store("counters-check");
    churn(&m, d, 0);
    m.sync().expect("sync");
    churn(&m, d, 1);
    // Changes pending in memory are part of what is checked.
    assert_eq!(m.check_usage_counters(false).expect("check"), Vec::<String>::new());
    drop(m);

    // Damage two rows behind the store's back: the total, and an extension nobody has.
    {
        let db = redb::Database::create(&path).expect("open the file with redb");
        let txn = db.begin_write().expect("write");
        {
            let usage: redb::TableDefinition<(u8, u64), (u64, u64)> =
                redb::TableDefinition::new("usage");
            txn.open_table(usage).expect("usage").insert((4, 0), (1, 1)).expect("insert");
            let ext: redb::TableDefinition<&str, (u64, u64)> =
                redb::TableDefinition::new("usage_ext");
            txn.open_table(ext).expect("usage_ext").insert("zzz", (7, 7)).expect("insert");
        }
        txn.commit().expect("commit");
    }

    let m = Meta::open(&path, lazy()).expect("reopen");
    let found = m.check_usage_counters(false).expect("check");
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("of all files") && found[0].contains("(1, 1) stored"), "{found:?}");
    assert!(found[1].contains("\"zzz\""), "{found:?}");
    assert_eq!(
        m.check_usage_counters(false).expect("check again"),
        found,
        "a check changes nothing"
    );
    assert_eq!(m.check_usage_counters(true).expect("repair"), found);
    assert_eq!(m.check_usage_counters(false).expect("check after repair"), Vec::<String>::new());
    assert_counters_match(&m, "after the repair");
    drop(m);
    let m = Meta::open(&path, lazy()).expect("reopen after the repair");
    assert_eq!(m.check_usage_counters(false).expect("check"), Vec::<String>::new());
    drop(m);
    let _ = std::fs::remove_file(&path);
}
