//! Everything is there after close and reopen of the database file, durable and lazy commits.

mod common;

use common::*;
use stria_meta::*;
use stria_proto::fs::{LayoutPolicy, ROOT_INO};

fn populate(m: &Meta) -> (Attr, Attr, Attr, SpillPlan) {
    let d = m.mkdir(ROOT_INO, b"proj", 0o2775, &alice()).expect("mkdir");
    let policy = LayoutPolicy { pool: "fast".into(), chunk_bytes: 1 << 20, stripe_count: 2 };
    m.set_layout_policy(d.ino, &policy, &alice()).expect("policy");
    let small = m.create(d.ino, b"small.txt", 0o644, &alice()).expect("small");
    m.write_inline(small.ino, 0, b"inline bytes").expect("write");
    let big = m.create(d.ino, b"big.dat", 0o600, &alice()).expect("big");
    let plan = m.spill_begin(big.ino).expect("plan");
    m.spill_commit(&plan).expect("commit");
    m.extend_size(big.ino, 5 << 20, Timestamp::new(42, 7)).expect("grow");
    m.link(big.ino, ROOT_INO, b"big-link", &alice()).expect("link");
    m.symlink(d.ino, b"ln", b"small.txt", &alice()).expect("symlink");
    m.setxattr(small.ino, b"user.tag", b"blue", XattrFlags::Create, &alice()).expect("xattr");
    m.open_file(big.ino, 1).expect("open");
    m.unlink(ROOT_INO, b"big-link", &alice()).expect("unlink one link");
    (d, small, big, plan)
}

fn check(m: &Meta, d: &Attr, small: &Attr, big: &Attr, plan: &SpillPlan) {
    assert_eq!(m.lookup(ROOT_INO, b"proj", &alice()).expect("proj").ino, d.ino);
    assert_eq!(m.getattr(d.ino).expect("proj").mode, 0o2775);
    assert_eq!(m.layout_policy(d.ino).expect("policy").pool, "fast");
    assert_eq!(m.read_inline(small.ino, 0, 100).expect("read"), Some(b"inline bytes".to_vec()));
    let attr = m.getattr(big.ino).expect("big");
    assert_eq!((attr.size, attr.nlink, attr.mtime), (5 << 20, 1, Timestamp::new(42, 7)));
    assert_eq!(m.file_layout(big.ino).expect("layout"), Some(plan.layout.clone()));
    let ln = m.lookup(d.ino, b"ln", &alice()).expect("ln");
    assert_eq!(m.readlink(ln.ino).expect("readlink"), b"small.txt");
    assert_eq!(m.getxattr(small.ino, b"user.tag", &alice()).expect("xattr"), b"blue");
    let names: Vec<_> =
        m.readdir(d.ino, 0, 100, &alice()).expect("readdir").into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec![b"small.txt".to_vec(), b"big.dat".to_vec(), b"ln".to_vec()]);
    assert_eq!(m.usage_by_uid(1000).expect("usage"), Usage { files: 2, bytes: (5 << 20) + 12 });
    assert_eq!(m.usage_by_fileset(d.ino).expect("fileset").files, 2);
    assert_eq!(m.statfs(0, 0).expect("statfs").inodes_used, 5);
    // New inodes do not reuse old numbers.
    let fresh = m.create(ROOT_INO, b"fresh", 0o644, &alice()).expect("fresh");
    assert!(fresh.ino > big.ino);
}

#[test]
fn everything_survives_reopen() {
    for commit in [Commit::Durable, Commit::Lazy] {
        let path = tmp_path(&format!("reopen-{commit:?}"));
        let opts = || MetaOptions { commit, ..options() };
        let (d, small, big, plan) = {
            let m = Meta::open(&path, opts()).expect("create");
            let out = populate(&m);
            // The file is open and unlinked once: still linked from proj, so not an orphan.
            let f = m.create(ROOT_INO, b"doomed", 0o644, &alice()).expect("doomed");
            m.open_file(f.ino, 1).expect("open");
            m.unlink(ROOT_INO, b"doomed", &alice()).expect("unlink open file");
            assert_eq!(m.orphans().expect("orphans"), vec![f.ino]);
            m.sync().expect("sync");
            out
        };
        let m = Meta::open(&path, opts()).expect("reopen");
        // Open handles die with the process; the orphan waits for purge.
        let orphans = m.orphans().expect("orphans");
        assert_eq!(orphans.len(), 1);
        let purge = m.purge(orphans[0]).expect("purge");
        assert_eq!(purge.layout, None);
        check(&m, &d, &small, &big, &plan);
        drop(m);
        let _ = std::fs::remove_file(&path);
    }
}
