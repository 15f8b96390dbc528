//! Small files inline, the spill to chunks, layouts and policies, usage counters, orphans.

mod common;

use common::*;
use stria_meta::*;
use stria_proto::fs::{FileLayout, FsStatus, INLINE_DATA_MAX, LayoutPolicy, ROOT_INO, TargetId};

#[test]
fn inline_writes_then_spill_to_chunks() {
    let m = meta();
    let f = m.create(ROOT_INO, b"small.txt", 0o644, &alice()).expect("create");
    assert_eq!(m.write_inline(f.ino, 0, b"abc").expect("write"), InlineWrite::Written { size: 3 });
    // A write past the end leaves a zero-filled hole.
    assert_eq!(m.write_inline(f.ino, 5, b"xy").expect("write"), InlineWrite::Written { size: 7 });
    assert_eq!(m.read_inline(f.ino, 0, 100).expect("read"), Some(b"abc\0\0xy".to_vec()));
    assert_eq!(m.read_inline(f.ino, 6, 100).expect("read"), Some(b"y".to_vec()));
    assert_eq!(m.read_inline(f.ino, 60, 100).expect("read"), Some(Vec::new()));
    let full = vec![7u8; INLINE_DATA_MAX];
    assert_eq!(
        m.write_inline(f.ino, 0, &full).expect("3 KiB fits"),
        InlineWrite::Written { size: INLINE_DATA_MAX as u64 }
    );
    assert_eq!(
        m.write_inline(f.ino, INLINE_DATA_MAX as u64, b"!").expect("over"),
        InlineWrite::MustSpill
    );
    assert_eq!(m.getattr(f.ino).expect("attr").size, INLINE_DATA_MAX as u64);
    let grow = SetAttr { size: Some(10_000), ..Default::default() };
    assert!(matches!(m.setattr(f.ino, &alice(), &grow), Err(MetaError::MustSpill)));
    assert_eq!(m.file_layout(f.ino).expect("layout"), None);
    assert_eq!(status(m.extend_size(f.ino, 5000, Timestamp::new(1, 0))), FsStatus::Invalid);

    // A plan outdated by a write is refused; a fresh one commits.
    let stale = m.spill_begin(f.ino).expect("plan");
    m.write_inline(f.ino, 0, b"Z").expect("write");
    assert_eq!(status(m.spill_commit(&stale)), FsStatus::Unavailable);
    let plan = m.spill_begin(f.ino).expect("plan");
    assert_eq!(plan.bytes.len(), INLINE_DATA_MAX);
    assert_eq!(plan.bytes[0], b'Z');
    assert_eq!(plan.layout.targets.len(), 4);
    m.spill_commit(&plan).expect("commit");
    assert_eq!(m.file_layout(f.ino).expect("layout"), Some(plan.layout.clone()));
    assert_eq!(m.read_inline(f.ino, 0, 10).expect("read"), None);
    assert_eq!(m.write_inline(f.ino, 0, b"x").expect("write"), InlineWrite::Chunked);
    assert_eq!(status(m.spill_begin(f.ino)), FsStatus::Invalid);
    assert_eq!(m.extend_size(f.ino, 1 << 20, Timestamp::new(9, 0)).expect("grow"), 1 << 20);
    assert_eq!(m.extend_size(f.ino, 10, Timestamp::new(10, 0)).expect("no shrink"), 1 << 20);
    let attr = m.getattr(f.ino).expect("attr");
    assert_eq!((attr.size, attr.mtime), (1 << 20, Timestamp::new(10, 0)));
    // Truncate of a chunked file returns the old size so the caller trims chunks.
    let out = m
        .setattr(f.ino, &alice(), &SetAttr { size: Some(100), ..Default::default() })
        .expect("truncate");
    assert_eq!((out.old_size, out.attr.size), (1 << 20, 100));
    // Its layout is fixed now.
    let other =
        FileLayout { pool: "fast".into(), chunk_bytes: 1 << 20, targets: vec![TargetId(10)] };
    assert_eq!(status(m.set_file_layout(f.ino, &other, &alice())), FsStatus::Busy);
    let u = m.unlink(ROOT_INO, b"small.txt", &alice()).expect("unlink");
    assert_eq!(u.purge, Some(Purge { ino: f.ino, size: 100, layout: Some(plan.layout) }));
}

#[test]
fn spill_switches_an_empty_file_at_once_and_plans_one_with_bytes() {
    let m = meta();
    // Empty: chunked in one commit, with the first write's size and mtime.
    let empty = m.create(ROOT_INO, b"empty.bin", 0o644, &alice()).expect("create");
    let Spilled::Chunked(attr) =
        m.spill(empty.ino, Some((4096, Timestamp::new(5, 0)))).expect("spill empty")
    else {
        panic!("an empty file needs no plan");
    };
    assert_eq!((attr.size, attr.mtime), (4096, Timestamp::new(5, 0)));
    assert!(attr.layout.is_some());
    assert_eq!(m.getattr(empty.ino).expect("attr"), attr, "the reply is what was committed");
    assert_eq!(m.usage_total().expect("usage"), Usage { files: 1, bytes: 4096 });
    // Chunked already: its attributes, nothing changed.
    let again = m.spill(empty.ino, Some((1, Timestamp::new(6, 0)))).expect("spill again");
    assert_eq!(again, Spilled::Chunked(attr));
    // Inline bytes: a plan, and the file stays inline until the plan is committed.
    let small = m.create(ROOT_INO, b"small.txt", 0o644, &alice()).expect("create");
    m.write_inline(small.ino, 0, b"hello").expect("write");
    let Spilled::Plan(plan) = m.spill(small.ino, None).expect("spill small") else {
        panic!("a file with bytes gets a plan");
    };
    assert_eq!(plan.bytes, b"hello");
    assert_eq!(m.file_layout(small.ino).expect("layout"), None);
    m.spill_commit(&plan).expect("commit");
    assert_eq!(m.file_layout(small.ino).expect("layout"), Some(plan.layout));
    // Not a regular file: refused.
    let d = m.mkdir(ROOT_INO, b"d", 0o755, &alice()).expect("mkdir");
    assert_eq!(status(m.spill(d.ino, None)), FsStatus::IsDir);
}

#[test]
fn layouts_inherit_policies_and_rotate_targets() {
    let m = meta();
    assert_eq!(m.layout_policy(ROOT_INO).expect("root"), LayoutPolicy::default());
    let d = m.mkdir(ROOT_INO, b"d", 0o777, &alice()).expect("d");
    let fast = LayoutPolicy { pool: "fast".into(), chunk_bytes: 256 << 10, stripe_count: 1 };
    assert_eq!(status(m.set_layout_policy(d.ino, &fast, &bob())), FsStatus::Perm);
    let bad = LayoutPolicy { chunk_bytes: 1000, ..fast.clone() };
    assert_eq!(status(m.set_layout_policy(d.ino, &bad, &alice())), FsStatus::Invalid);
    m.set_layout_policy(d.ino, &fast, &alice()).expect("set policy");
    let sub = m.mkdir(d.ino, b"sub", 0o777, &alice()).expect("sub");
    assert_eq!(m.layout_policy(sub.ino).expect("inherited"), fast);
    let mut firsts = Vec::new();
    for i in 0..4 {
        let f = m.create(sub.ino, format!("f{i}").as_bytes(), 0o644, &alice()).expect("create");
        let plan = m.spill_begin(f.ino).expect("plan");
        assert_eq!(plan.layout.pool, "fast");
        assert_eq!(plan.layout.chunk_bytes, 256 << 10);
        assert_eq!(plan.layout.targets.len(), 1);
        firsts.push(plan.layout.targets[0]);
    }
    assert!(firsts.contains(&TargetId(10)) && firsts.contains(&TargetId(11)), "{firsts:?}");
    // Default pool, stripe count 0 = every target, start rotating.
    let a = m.spill_begin(m.create(ROOT_INO, b"a", 0o644, &alice()).expect("a").ino).expect("a");
    let b = m.spill_begin(m.create(ROOT_INO, b"b", 0o644, &alice()).expect("b").ino).expect("b");
    assert_eq!(a.layout.targets.len(), 4);
    assert_ne!(a.layout.targets[0], b.layout.targets[0]);
    // setstripe on an empty file makes it chunked with that layout.
    let e = m.create(ROOT_INO, b"e", 0o644, &alice()).expect("e");
    let layout =
        FileLayout { pool: "fast".into(), chunk_bytes: 1 << 20, targets: vec![TargetId(11)] };
    assert_eq!(status(m.set_file_layout(e.ino, &layout, &bob())), FsStatus::Perm);
    m.set_file_layout(e.ino, &layout, &alice()).expect("setstripe");
    assert_eq!(m.file_layout(e.ino).expect("layout"), Some(layout));
    // A pool with no targets cannot take data.
    m.set_layout_policy(d.ino, &LayoutPolicy { pool: "none".into(), ..fast }, &alice()).expect("p");
    let g = m.create(d.ino, b"g", 0o644, &alice()).expect("g");
    assert_eq!(status(m.spill_begin(g.ino)), FsStatus::NoSpace);
}

#[test]
fn counters_follow_create_size_chown_rename_unlink() {
    let m = meta();
    let proj = m.mkdir(ROOT_INO, b"proj", 0o777, &root()).expect("proj");
    let home = m.mkdir(ROOT_INO, b"home", 0o777, &root()).expect("home");
    let deep = m.mkdir(proj.ino, b"deep", 0o777, &root()).expect("deep");
    let f = m.create(deep.ino, b"data.BIN", 0o644, &alice()).expect("f");
    let plan = m.spill_begin(f.ino).expect("plan");
    m.spill_commit(&plan).expect("commit");
    m.extend_size(f.ino, 100 << 10, Timestamp::new(1, 0)).expect("grow");
    let g = m.create(home.ino, b"notes.txt", 0o644, &bob()).expect("g");
    m.write_inline(g.ino, 0, b"hello").expect("write");
    let usage = |files, bytes| Usage { files, bytes };
    assert_eq!(m.usage_by_uid(1000).expect("uid"), usage(1, 100 << 10));
    assert_eq!(m.usage_by_gid(1001).expect("gid"), usage(1, 5));
    assert_eq!(m.usage_by_fileset(proj.ino).expect("proj"), usage(1, 100 << 10));
    assert_eq!(m.usage_by_fileset(home.ino).expect("home"), usage(1, 5));
    assert_eq!(m.usage_total().expect("total"), usage(2, (100 << 10) + 5));
    let hist = m.size_histogram().expect("hist");
    assert_eq!(hist[0], usage(1, 5));
    assert_eq!(hist[2], usage(1, 100 << 10));
    assert_eq!(
        m.top_extensions(10).expect("ext"),
        vec![("bin".to_string(), usage(1, 100 << 10)), ("txt".to_string(), usage(1, 5))]
    );
    // chown moves the file between uids and gids.
    m.setattr(f.ino, &root(), &SetAttr { uid: Some(7), gid: Some(8), ..Default::default() })
        .expect("chown");
    assert_eq!(m.usage_by_uid(1000).expect("uid"), usage(0, 0));
    assert_eq!(m.usage_by_uid(7).expect("uid"), usage(1, 100 << 10));
    assert_eq!(m.usage_by_gid(8).expect("gid"), usage(1, 100 << 10));
    // Renaming a directory into another fileset moves everything below it.
    m.rename(proj.ino, b"deep", home.ino, b"deep", RenameFlags::NONE, &root()).expect("mv");
    assert_eq!(m.usage_by_fileset(proj.ino).expect("proj"), usage(0, 0));
    assert_eq!(m.usage_by_fileset(home.ino).expect("home"), usage(2, (100 << 10) + 5));
    // A directory moved to the root becomes a fileset of its own.
    m.rename(home.ino, b"deep", ROOT_INO, b"top", RenameFlags::NONE, &root()).expect("mv");
    assert_eq!(m.usage_by_fileset(deep.ino).expect("deep"), usage(1, 100 << 10));
    // A file renamed across filesets, with a new extension.
    m.rename(home.ino, b"notes.txt", deep.ino, b"notes.md", RenameFlags::NONE, &root())
        .expect("mv");
    assert_eq!(m.usage_by_fileset(home.ino).expect("home"), usage(0, 0));
    assert_eq!(m.usage_by_fileset(deep.ino).expect("deep"), usage(2, (100 << 10) + 5));
    assert_eq!(m.top_extensions(1).expect("ext")[0].0, "bin");
    assert!(m.top_extensions(10).expect("ext").iter().any(|(e, u)| e == "md" && u.files == 1));
    // Truncate changes bytes and size class.
    m.setattr(f.ino, &root(), &SetAttr { size: Some(10), ..Default::default() }).expect("trunc");
    let hist = m.size_histogram().expect("hist");
    assert_eq!(hist[0], usage(2, 15));
    assert_eq!(hist[2], usage(0, 0));
    // Hard links count once; the last unlink takes the file off every counter.
    m.link(f.ino, ROOT_INO, b"alias", &root()).expect("link");
    assert_eq!(m.usage_total().expect("total").files, 2);
    m.unlink(ROOT_INO, b"alias", &root()).expect("unlink");
    m.unlink(deep.ino, b"data.BIN", &root()).expect("unlink");
    m.unlink(deep.ino, b"notes.md", &root()).expect("unlink");
    assert_eq!(m.usage_total().expect("total"), usage(0, 0));
    assert_eq!(m.usage_by_uid(7).expect("uid"), usage(0, 0));
    assert!(m.top_extensions(10).expect("ext").is_empty());
    let st = m.statfs(1 << 40, 1 << 39).expect("statfs");
    assert_eq!((st.inodes_used, st.files, st.bytes_total), (4, 0, 1 << 40));
}

#[test]
fn open_files_outlive_their_last_unlink() {
    let m = meta();
    let f = m.create(ROOT_INO, b"f", 0o644, &alice()).expect("create");
    let plan = m.spill_begin(f.ino).expect("plan");
    m.spill_commit(&plan).expect("commit");
    m.extend_size(f.ino, 4096, Timestamp::new(1, 0)).expect("grow");
    m.open_file(f.ino, 1).expect("open");
    m.open_file(f.ino, 1).expect("open twice");
    let u = m.unlink(ROOT_INO, b"f", &alice()).expect("unlink");
    assert_eq!((u.nlink, u.purge.clone()), (0, None));
    assert_eq!(m.orphans().expect("orphans"), vec![f.ino]);
    assert_eq!(m.getattr(f.ino).expect("still readable").nlink, 0);
    assert_eq!(status(m.purge(f.ino)), FsStatus::Busy);
    assert_eq!(m.usage_total().expect("usage").files, 0);
    assert_eq!(m.release(f.ino, 1).expect("release"), None);
    let purge = m.release(f.ino, 1).expect("last release").expect("purge now");
    assert_eq!(purge, Purge { ino: f.ino, size: 4096, layout: Some(plan.layout) });
    assert_eq!(status(m.getattr(f.ino)), FsStatus::NotFound);
    assert!(m.orphans().expect("orphans").is_empty());
    assert_eq!(m.release(f.ino, 1).expect("a release with nothing open"), None, "no change");
    // A rename that replaces an open file leaves an orphan too.
    let a = m.create(ROOT_INO, b"a", 0o644, &alice()).expect("a");
    m.create(ROOT_INO, b"b", 0o644, &alice()).expect("b");
    m.open_file(a.ino, 1).expect("open");
    let replaced =
        m.rename(ROOT_INO, b"b", ROOT_INO, b"a", RenameFlags::NONE, &alice()).expect("mv");
    assert_eq!(replaced.map(|u| (u.ino, u.purge)), Some((a.ino, None)));
    assert_eq!(m.orphans().expect("orphans"), vec![a.ino]);
    assert!(m.release(a.ino, 1).expect("release").is_some());
}

/// A client whose session ends with files still open (killed, or gone with its machine) has
/// its opens dropped: an unlinked file only it held is purged by `expire_clients`, one that
/// another client still holds waits for that client's release, and the late releases of the
/// ended client change nothing.
#[test]
fn an_ended_client_s_opens_no_longer_keep_unlinked_files() {
    let m = meta();
    let spilled = |name: &[u8]| {
        let f = m.create(ROOT_INO, name, 0o644, &alice()).expect("create");
        let plan = m.spill_begin(f.ino).expect("plan");
        m.spill_commit(&plan).expect("commit");
        (f.ino, plan.layout)
    };
    let (only, only_layout) = spilled(b"only");
    let (shared, shared_layout) = spilled(b"shared");
    let kept = m.create(ROOT_INO, b"kept", 0o644, &alice()).expect("kept").ino;
    let (dead, alive) = (7, 8);
    m.open_file(only, dead).expect("open");
    m.open_file(only, dead).expect("open twice");
    m.open_file(shared, dead).expect("open");
    m.open_file(shared, alive).expect("open");
    m.open_file(kept, dead).expect("open a file that keeps its name");
    m.unlink(ROOT_INO, b"only", &alice()).expect("unlink");
    m.unlink(ROOT_INO, b"shared", &alice()).expect("unlink");
    assert_eq!(m.expire_clients().expect("nothing ended yet"), Vec::new());

    m.drop_client_opens(dead);
    let purged = m.expire_clients().expect("expire");
    assert_eq!(purged, vec![Purge { ino: only, size: 0, layout: Some(only_layout) }]);
    assert_eq!(status(m.getattr(only)), FsStatus::NotFound);
    assert_eq!(m.getattr(kept).expect("a named file stays").nlink, 1);
    assert_eq!(m.orphans().expect("orphans"), vec![shared]);
    assert_eq!(m.expire_clients().expect("again"), Vec::new(), "purged once");

    assert_eq!(m.release(shared, dead).expect("late release"), None, "changes nothing");
    assert_eq!(m.getattr(shared).expect("the live client's file").nlink, 0);
    let purge = m.release(shared, alive).expect("release").expect("its last release purges");
    assert_eq!(purge, Purge { ino: shared, size: 0, layout: Some(shared_layout) });
    assert!(m.orphans().expect("orphans").is_empty());
}
