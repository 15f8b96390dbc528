//! `stria fsck` recounts the usage counters (per uid, gid, fileset, size class, extension) from
//! the files and reports a counter that disagrees; `--repair` rewrites it. With lazy commits
//! the counters reach their tables only at durable commits, so this is also what tells a
//! crash test that they stayed consistent.

#![allow(clippy::unwrap_used)]

mod support;

use support::node::{Node, pattern, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];

fn fsck(node: &Node, args: &[&str]) -> (bool, String) {
    let out = node.cli(&[&["fsck", "--skip-raid"], args].concat());
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn fsck_reports_a_wrong_usage_counter_and_repair_rewrites_it() {
    require_fuse();
    let dir = scratch("fsck-counters");
    let mut node = Node::start(&dir, &ARGS);
    for (i, len) in [100usize, 5000, 300_000].into_iter().enumerate() {
        std::fs::write(node.mount.join(format!("f{i}.dat")), pattern(i as u64, 0, len)).unwrap();
    }
    node.stop();
    let (clean, out) = fsck(&node, &[]);
    assert!(clean && out.contains("fsck: clean"), "{out}");

    // The total of all files, wrong behind the store's back.
    {
        let db = redb::Database::create(node.data.join("meta/namespace.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let usage: redb::TableDefinition<(u8, u64), (u64, u64)> =
                redb::TableDefinition::new("usage");
            txn.open_table(usage).unwrap().insert((4, 0), (99, 99)).unwrap();
        }
        txn.commit().unwrap();
    }
    let (clean, out) = fsck(&node, &[]);
    assert!(!clean, "a wrong counter is a problem: {out}");
    assert!(
        out.contains("problem: usage counter of all files: (99, 99) stored, (3, 305100) counted"),
        "{out}"
    );
    let (clean, out) = fsck(&node, &["--repair"]);
    assert!(clean && out.contains("1 usage counters did not match the files; rewritten"), "{out}");
    let (clean, out) = fsck(&node, &[]);
    assert!(clean && out.contains("fsck: clean"), "{out}");
}
