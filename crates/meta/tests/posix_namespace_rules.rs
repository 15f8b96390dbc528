//! Table-style checks of the POSIX rules: names, create/unlink/rmdir, rename matrix, links,
//! symlinks, permissions (owner/group/other, supplementary groups, root, sticky, setgid),
//! setattr and xattrs.

mod common;

use common::*;
use stria_meta::*;
use stria_proto::fs::{FsStatus, ROOT_INO};

#[test]
fn names_are_checked_with_the_right_errno() {
    let m = meta();
    let long = vec![b'a'; 256];
    let max = vec![b'a'; 255];
    let cases: Vec<(&[u8], FsStatus)> = vec![
        (b"", FsStatus::NotFound),
        (b"a/b", FsStatus::Invalid),
        (b"a\0b", FsStatus::Invalid),
        (b".", FsStatus::Exists),
        (b"..", FsStatus::Exists),
        (&long, FsStatus::NameTooLong),
    ];
    for (name, want) in cases {
        assert_eq!(status(m.create(ROOT_INO, name, 0o644, &root())), want, "{name:?}");
        assert_eq!(status(m.mkdir(ROOT_INO, name, 0o755, &root())), want, "{name:?}");
    }
    m.create(ROOT_INO, &max, 0o644, &root()).expect("255-byte name");
    assert_eq!(status(m.lookup(ROOT_INO, &long, &root())), FsStatus::NameTooLong);
    assert_eq!(status(m.unlink(ROOT_INO, b".", &root())), FsStatus::IsDir);
    assert_eq!(status(m.rmdir(ROOT_INO, b".", &root())), FsStatus::Invalid);
    assert_eq!(status(m.rmdir(ROOT_INO, b"..", &root())), FsStatus::NotEmpty);
}

#[test]
fn create_lookup_unlink_rmdir() {
    let m = meta();
    let d = m.mkdir(ROOT_INO, b"d", 0o755, &root()).expect("mkdir");
    assert_eq!(d.nlink, 2);
    assert_eq!(m.getattr(ROOT_INO).expect("root").nlink, 3);
    let f = m.create(d.ino, b"f", 0o644, &root()).expect("create");
    assert_eq!(f.kind, FileKind::File);
    assert_eq!(m.lookup(d.ino, b"f", &root()).expect("lookup").ino, f.ino);
    assert_eq!(m.lookup(d.ino, b"..", &root()).expect("..").ino, ROOT_INO);
    assert_eq!(m.lookup(d.ino, b".", &root()).expect(".").ino, d.ino);
    assert_eq!(status(m.create(d.ino, b"f", 0o644, &root())), FsStatus::Exists);
    assert_eq!(status(m.mkdir(d.ino, b"f", 0o755, &root())), FsStatus::Exists);
    assert_eq!(status(m.lookup(f.ino, b"x", &root())), FsStatus::NotDir);
    assert_eq!(status(m.create(f.ino, b"x", 0o644, &root())), FsStatus::NotDir);
    assert_eq!(status(m.rmdir(ROOT_INO, b"d", &root())), FsStatus::NotEmpty);
    assert_eq!(status(m.unlink(ROOT_INO, b"d", &root())), FsStatus::IsDir);
    assert_eq!(status(m.rmdir(d.ino, b"f", &root())), FsStatus::NotDir);
    assert_eq!(status(m.unlink(d.ino, b"nope", &root())), FsStatus::NotFound);
    let gone = m.unlink(d.ino, b"f", &root()).expect("unlink");
    assert_eq!(gone.nlink, 0);
    assert_eq!(gone.purge, Some(Purge { ino: f.ino, size: 0, layout: None }));
    assert_eq!(status(m.getattr(f.ino)), FsStatus::NotFound);
    m.rmdir(ROOT_INO, b"d", &root()).expect("rmdir");
    assert_eq!(m.getattr(ROOT_INO).expect("root").nlink, 2);
    assert_eq!(m.statfs(100, 50).expect("statfs").inodes_used, 1);
}

#[test]
fn mknod_special_files_and_symlinks() {
    let m = meta();
    let fifo = m.mknod(ROOT_INO, b"p", NodeKind::Fifo, 0o600, &alice()).expect("fifo");
    assert_eq!(fifo.kind, FileKind::Fifo);
    let sock = m.mknod(ROOT_INO, b"s", NodeKind::Socket, 0o600, &alice()).expect("socket");
    assert_eq!(sock.kind, FileKind::Socket);
    let dev = NodeKind::CharDevice { rdev: 0x0103 };
    assert_eq!(status(m.mknod(ROOT_INO, b"c", dev, 0o600, &alice())), FsStatus::Perm);
    assert_eq!(m.mknod(ROOT_INO, b"c", dev, 0o600, &root()).expect("dev").rdev, 0x0103);
    let l = m.symlink(ROOT_INO, b"l", b"/some/where", &alice()).expect("symlink");
    assert_eq!(l.kind, FileKind::Symlink);
    assert_eq!(l.size, 11);
    assert_eq!(m.readlink(l.ino).expect("readlink"), b"/some/where");
    assert_eq!(status(m.readlink(fifo.ino)), FsStatus::Invalid);
    assert_eq!(status(m.symlink(ROOT_INO, b"e", b"", &alice())), FsStatus::NotFound);
    let long = vec![b'x'; 4096];
    assert_eq!(status(m.symlink(ROOT_INO, b"e", &long, &alice())), FsStatus::NameTooLong);
}

#[test]
fn hard_links_count_and_survive_unlink() {
    let m = meta();
    let d = m.mkdir(ROOT_INO, b"d", 0o755, &root()).expect("mkdir");
    let f = m.create(ROOT_INO, b"f", 0o644, &root()).expect("create");
    assert_eq!(m.link(f.ino, d.ino, b"g", &root()).expect("link").nlink, 2);
    assert_eq!(m.link(f.ino, ROOT_INO, b"h", &root()).expect("link").nlink, 3);
    assert_eq!(status(m.link(f.ino, d.ino, b"g", &root())), FsStatus::Exists);
    assert_eq!(status(m.link(d.ino, ROOT_INO, b"dd", &root())), FsStatus::Perm);
    let u = m.unlink(ROOT_INO, b"f", &root()).expect("unlink");
    assert_eq!((u.nlink, u.purge.is_none()), (2, true));
    assert_eq!(m.getattr(f.ino).expect("still there").nlink, 2);
    // Counted once however many names it has.
    assert_eq!(m.usage_total().expect("usage").files, 1);
    m.unlink(d.ino, b"g", &root()).expect("unlink g");
    let last = m.unlink(ROOT_INO, b"h", &root()).expect("unlink h");
    assert_eq!(last.nlink, 0);
    assert!(last.purge.is_some());
    assert_eq!(m.usage_total().expect("usage").files, 0);
}

#[test]
fn rename_matrix() {
    let m = meta();
    let r = root();
    let a = m.mkdir(ROOT_INO, b"a", 0o755, &r).expect("a");
    let b = m.mkdir(ROOT_INO, b"b", 0o755, &r).expect("b");
    let f1 = m.create(a.ino, b"f1", 0o644, &r).expect("f1");
    let f2 = m.create(b.ino, b"f2", 0o644, &r).expect("f2");
    let e = m.mkdir(b.ino, b"empty", 0o755, &r).expect("empty");
    let full = m.mkdir(b.ino, b"full", 0o755, &r).expect("full");
    m.create(full.ino, b"x", 0o644, &r).expect("x");
    let sub = m.mkdir(a.ino, b"sub", 0o755, &r).expect("sub");
    let deep = m.mkdir(sub.ino, b"deep", 0o755, &r).expect("deep");
    let none = RenameFlags::NONE;

    // Errors first: nothing may change.
    type Case<'a> = (u64, &'a [u8], u64, &'a [u8], RenameFlags, FsStatus);
    let cases: Vec<Case> = vec![
        (a.ino, b"missing", b.ino, b"z", none, FsStatus::NotFound),
        (a.ino, b"sub", b.ino, b"f2", none, FsStatus::NotDir),
        (a.ino, b"f1", b.ino, b"empty", none, FsStatus::IsDir),
        (a.ino, b"sub", b.ino, b"full", none, FsStatus::NotEmpty),
        (a.ino, b"f1", b.ino, b"f2", RenameFlags::NOREPLACE, FsStatus::Exists),
        (a.ino, b"f1", b.ino, b"nope", RenameFlags::EXCHANGE, FsStatus::NotFound),
        (ROOT_INO, b"a", sub.ino, b"a2", none, FsStatus::Invalid),
        (ROOT_INO, b"a", deep.ino, b"a2", none, FsStatus::Invalid),
        (ROOT_INO, b"a", a.ino, b"a2", none, FsStatus::Invalid),
        (
            a.ino,
            b"f1",
            b.ino,
            b"f2",
            RenameFlags { noreplace: true, exchange: true },
            FsStatus::Invalid,
        ),
        (a.ino, b".", b.ino, b"z", none, FsStatus::Busy),
        (f1.ino, b"x", b.ino, b"z", none, FsStatus::NotDir),
    ];
    for (p, n, np, nn, flags, want) in cases {
        let got = status(m.rename(p, n, np, nn, flags, &r));
        assert_eq!(
            got,
            want,
            "rename {:?} -> {:?}",
            String::from_utf8_lossy(n),
            String::from_utf8_lossy(nn)
        );
    }
    assert_eq!(m.lookup(a.ino, b"f1", &r).expect("f1 stays").ino, f1.ino);

    // File over file: the target's last link goes.
    let replaced = m.rename(a.ino, b"f1", b.ino, b"f2", none, &r).expect("file over file");
    let replaced = replaced.expect("a target was replaced");
    assert_eq!((replaced.ino, replaced.nlink), (f2.ino, 0));
    assert!(replaced.purge.is_some());
    assert_eq!(m.lookup(b.ino, b"f2", &r).expect("moved").ino, f1.ino);
    assert_eq!(status(m.lookup(a.ino, b"f1", &r)), FsStatus::NotFound);

    // Empty dir over dir, across parents: link counts follow.
    let (na, nb) = (m.getattr(a.ino).expect("a").nlink, m.getattr(b.ino).expect("b").nlink);
    m.rename(a.ino, b"sub", b.ino, b"empty", none, &r).expect("dir over empty dir");
    assert_eq!(status(m.getattr(e.ino)), FsStatus::NotFound);
    assert_eq!(m.getattr(a.ino).expect("a").nlink, na - 1);
    assert_eq!(m.getattr(b.ino).expect("b").nlink, nb);
    assert_eq!(m.lookup(sub.ino, b"..", &r).expect("..").ino, b.ino);
    assert_eq!(m.lookup(b.ino, b"empty", &r).expect("moved").ino, sub.ino);

    // Exchange a file and a directory across parents.
    let g = m.create(a.ino, b"g", 0o644, &r).expect("g");
    m.rename(a.ino, b"g", b.ino, b"empty", RenameFlags::EXCHANGE, &r).expect("exchange");
    assert_eq!(m.lookup(a.ino, b"g", &r).expect("dir now in a").ino, sub.ino);
    assert_eq!(m.lookup(b.ino, b"empty", &r).expect("file now in b").ino, g.ino);
    assert_eq!(m.lookup(sub.ino, b"..", &r).expect("..").ino, a.ino);
    assert_eq!(m.getattr(a.ino).expect("a").nlink, na);
    assert_eq!(m.getattr(b.ino).expect("b").nlink, nb - 1);

    // Same inode under both names: nothing happens.
    m.link(g.ino, b.ino, b"g2", &r).expect("link");
    assert_eq!(m.rename(b.ino, b"empty", b.ino, b"g2", none, &r).expect("same inode"), None);
    assert_eq!(m.getattr(g.ino).expect("g").nlink, 2);
    // Rename onto itself.
    assert_eq!(m.rename(b.ino, b"g2", b.ino, b"g2", none, &r).expect("self"), None);
    // Plain move with NOREPLACE.
    m.rename(b.ino, b"g2", a.ino, b"g3", RenameFlags::NOREPLACE, &r).expect("noreplace");
    assert_eq!(m.lookup(a.ino, b"g3", &r).expect("g3").ino, g.ino);
}

#[test]
fn permissions_owner_group_other_and_root() {
    let m = meta();
    let d = m.mkdir(ROOT_INO, b"d", 0o750, &alice()).expect("mkdir");
    let f = m.create(d.ino, b"f", 0o640, &alice()).expect("create");
    let staff = Caller::new(1002, 2000).with_groups(&[1000]);
    let (al, bo, ro) = (alice(), bob(), root());
    let cases: Vec<(&Caller, u64, u32, Option<FsStatus>)> = vec![
        (&al, f.ino, R_OK | W_OK, None),
        (&al, f.ino, X_OK, Some(FsStatus::Access)),
        (&staff, f.ino, R_OK, None),
        (&staff, f.ino, W_OK, Some(FsStatus::Access)),
        (&bo, f.ino, R_OK, Some(FsStatus::Access)),
        (&ro, f.ino, R_OK | W_OK, None),
        (&ro, f.ino, X_OK, Some(FsStatus::Access)),
        (&ro, d.ino, X_OK, None),
        (&bo, f.ino, 0, None),
    ];
    for (who, ino, mask, want) in cases {
        assert_eq!(m.access(ino, who, mask).err().map(|e| e.status()), want, "{who:?} {mask}");
    }
    // Search permission on the parent is checked per lookup.
    assert_eq!(status(m.lookup(d.ino, b"f", &bob())), FsStatus::Access);
    assert_eq!(m.lookup(d.ino, b"f", &staff).expect("group member").ino, f.ino);
    assert_eq!(status(m.create(d.ino, b"g", 0o644, &staff)), FsStatus::Access);
    assert_eq!(status(m.unlink(d.ino, b"f", &bob())), FsStatus::Access);
    assert_eq!(status(m.readdir(d.ino, 0, 10, &bob())), FsStatus::Access);
    // Root executes only what has some x bit.
    m.setattr(f.ino, &alice(), &SetAttr { mode: Some(0o701), ..Default::default() })
        .expect("chmod");
    assert_eq!(m.access(f.ino, &root(), X_OK).err().map(|e| e.status()), None);
}

#[test]
fn sticky_directory_protects_other_users_entries() {
    let m = meta();
    let tmp = m.mkdir(ROOT_INO, b"tmp", 0o1777, &root()).expect("tmp");
    m.create(tmp.ino, b"a", 0o666, &alice()).expect("alice's");
    m.create(tmp.ino, b"b", 0o666, &bob()).expect("bob's");
    assert_eq!(status(m.unlink(tmp.ino, b"a", &bob())), FsStatus::Perm);
    let none = RenameFlags::NONE;
    assert_eq!(status(m.rename(tmp.ino, b"a", tmp.ino, b"c", none, &bob())), FsStatus::Perm);
    // Replacing someone else's entry is refused as well.
    assert_eq!(status(m.rename(tmp.ino, b"b", tmp.ino, b"a", none, &bob())), FsStatus::Perm);
    m.rename(tmp.ino, b"a", tmp.ino, b"a2", none, &alice()).expect("owner renames");
    m.unlink(tmp.ino, b"a2", &alice()).expect("owner unlinks");
    m.unlink(tmp.ino, b"b", &root()).expect("root unlinks");
    let d = m.mkdir(tmp.ino, b"dir", 0o777, &alice()).expect("dir");
    let _ = d;
    assert_eq!(status(m.rmdir(tmp.ino, b"dir", &bob())), FsStatus::Perm);
    // The directory's owner may remove anything in it.
    let own = m.mkdir(ROOT_INO, b"own", 0o1777, &bob()).expect("own");
    m.create(own.ino, b"x", 0o600, &alice()).expect("x");
    m.unlink(own.ino, b"x", &bob()).expect("dir owner unlinks");
}

#[test]
fn setgid_directories_pass_on_their_group() {
    let m = meta();
    let shared = m.mkdir(ROOT_INO, b"shared", 0o777, &root()).expect("shared");
    m.setattr(
        shared.ino,
        &root(),
        &SetAttr { gid: Some(500), mode: Some(0o2777), ..Default::default() },
    )
    .expect("chgrp + setgid");
    let f = m.create(shared.ino, b"f", 0o644, &alice()).expect("file");
    assert_eq!(f.gid, 500);
    assert_eq!(f.mode & S_ISGID, 0);
    let sub = m.mkdir(shared.ino, b"sub", 0o777, &alice()).expect("subdir");
    assert_eq!(sub.gid, 500);
    assert_eq!(sub.mode & S_ISGID, S_ISGID);
    let deeper = m.create(sub.ino, b"g", 0o644, &bob()).expect("deeper");
    assert_eq!(deeper.gid, 500);
    let plain = m.create(ROOT_INO, b"plain", 0o644, &alice()).expect("plain");
    assert_eq!(plain.gid, 1000);
    // A writer who does not own the directory cannot clear its setgid bit (that exception is
    // for the kernel clearing a regular file's set-ID bits on write).
    let clear = SetAttr { mode: Some(0o777), ..Default::default() };
    assert_eq!(status(m.setattr(shared.ino, &bob(), &clear)), FsStatus::Perm);
    assert_eq!(m.getattr(shared.ino).expect("getattr").mode & S_ISGID, S_ISGID);
}

#[test]
fn setattr_rules_and_ctime() {
    let m = meta();
    let f = m.create(ROOT_INO, b"f", 0o6755, &alice()).expect("create");
    assert_eq!(f.mode, 0o6755);
    let set = |mode| SetAttr { mode: Some(mode), ..Default::default() };
    assert_eq!(status(m.setattr(f.ino, &bob(), &set(0o777))), FsStatus::Perm);
    let chown = SetAttr { uid: Some(1001), ..Default::default() };
    assert_eq!(status(m.setattr(f.ino, &alice(), &chown)), FsStatus::Perm);
    let chgrp_other = SetAttr { gid: Some(4242), ..Default::default() };
    assert_eq!(status(m.setattr(f.ino, &alice(), &chgrp_other)), FsStatus::Perm);
    let member = Caller::new(1000, 1000).with_groups(&[4242]);
    let out = m.setattr(f.ino, &member, &chgrp_other).expect("chgrp to own group");
    // chown clears setuid, and setgid because group execute is set.
    assert_eq!(out.attr.mode, 0o755);
    assert_eq!(out.attr.gid, 4242);
    assert!(out.attr.ctime > f.ctime);
    let out = m.setattr(f.ino, &root(), &chown).expect("root chowns");
    assert_eq!(out.attr.uid, 1001);
    // chmod by a non-member drops setgid.
    let out = m.setattr(f.ino, &bob(), &set(0o2755)).expect("owner chmod");
    assert_eq!(out.attr.mode, 0o755);
    // Times: a given time needs the owner; "now" needs write permission.
    let at = SetAttr { mtime: Some(SetTime::At(Timestamp::new(5, 0))), ..Default::default() };
    assert_eq!(status(m.setattr(f.ino, &alice(), &at)), FsStatus::Perm);
    assert_eq!(m.setattr(f.ino, &bob(), &at).expect("owner").attr.mtime, Timestamp::new(5, 0));
    let now = SetAttr { atime: Some(SetTime::Now), ..Default::default() };
    assert_eq!(status(m.setattr(f.ino, &alice(), &now)), FsStatus::Access);
    // Truncate needs write permission and reports the old size.
    m.setattr(f.ino, &bob(), &set(0o666)).expect("chmod");
    m.write_inline(f.ino, 0, b"hello world").expect("write");
    let out = m
        .setattr(f.ino, &alice(), &SetAttr { size: Some(5), ..Default::default() })
        .expect("truncate");
    assert_eq!((out.old_size, out.attr.size), (11, 5));
    assert_eq!(m.read_inline(f.ino, 0, 100).expect("read"), Some(b"hello".to_vec()));
    // Through a handle open for writing (ftruncate) write permission was checked at the open,
    // so a file read-only since is still cut through it, and its mtime set to now; by name
    // it is not. Explicit times still need the owner.
    m.setattr(f.ino, &bob(), &set(0o444)).expect("chmod");
    let by_name = SetAttr { size: Some(2), mtime: Some(SetTime::Now), ..Default::default() };
    assert_eq!(status(m.setattr(f.ino, &alice(), &by_name)), FsStatus::Access);
    assert_eq!(status(m.setattr(f.ino, &bob(), &by_name)), FsStatus::Access);
    let through_handle = SetAttr { writable_handle: true, ..by_name };
    let out = m.setattr(f.ino, &alice(), &through_handle).expect("ftruncate");
    assert_eq!((out.old_size, out.attr.size), (5, 2));
    assert_eq!(m.read_inline(f.ino, 0, 100).expect("read"), Some(b"he".to_vec()));
    let at = SetAttr { writable_handle: true, ..at };
    assert_eq!(status(m.setattr(f.ino, &alice(), &at)), FsStatus::Perm);
    let d = m.mkdir(ROOT_INO, b"d", 0o777, &root()).expect("d");
    assert_eq!(
        status(m.setattr(d.ino, &root(), &SetAttr { size: Some(0), ..Default::default() })),
        FsStatus::IsDir
    );
}

#[test]
fn writes_chowns_and_truncates_drop_privileges() {
    let m = meta();
    let cap = b"security.capability";
    let f = m.create(ROOT_INO, b"f", 0o6775, &root()).expect("create");
    m.setxattr(f.ino, cap, b"caps", XattrFlags::Any, &root()).expect("set capability");
    m.setxattr(f.ino, b"user.k", b"v", XattrFlags::Any, &root()).expect("set user xattr");
    // A writer with CAP_FSETID: the capability goes, set-ID bits stay.
    let (kept, dropped) = m.drop_privileges(f.ino, false).expect("drop");
    assert!(dropped);
    assert_eq!(kept.mode, 0o6775);
    assert_eq!(status(m.getxattr(f.ino, cap, &root())), FsStatus::NoData);
    assert_eq!(m.getxattr(f.ino, b"user.k", &root()).expect("other xattrs stay"), b"v");
    assert!(kept.ctime > f.ctime, "a drop is a change");
    // Nothing left to drop for such a writer: nothing changes, not even ctime.
    let (again, dropped) = m.drop_privileges(f.ino, false).expect("again");
    assert_eq!((again.ctime, dropped), (kept.ctime, false));
    // A writer without it: setuid, and setgid (group execute is set), go too.
    assert_eq!(m.drop_privileges(f.ino, true).expect("drop"), (m.getattr(f.ino).unwrap(), true));
    assert_eq!(m.getattr(f.ino).expect("f").mode, 0o775);
    // Without group execute, setgid marks mandatory locking and stays.
    let g = m.create(ROOT_INO, b"g", 0o2764, &root()).expect("create");
    assert_eq!(m.drop_privileges(g.ino, true).expect("drop").0.mode, 0o2764);
    // Directories keep theirs.
    let d = m.mkdir(ROOT_INO, b"d", 0o2775, &root()).expect("mkdir");
    m.setxattr(d.ino, cap, b"caps", XattrFlags::Any, &root()).expect("set capability");
    assert_eq!(m.drop_privileges(d.ino, true).expect("drop"), (m.getattr(d.ino).unwrap(), false));
    assert_eq!(m.getattr(d.ino).expect("d").mode, 0o2775);
    assert_eq!(m.getxattr(d.ino, cap, &root()).expect("a directory keeps it"), b"caps");
    // chown and truncate drop the capability whoever asks; a truncate by someone other than
    // root drops set-ID bits even when the size stays.
    let size = |size| SetAttr { size: Some(size), ..Default::default() };
    m.setattr(f.ino, &root(), &SetAttr { mode: Some(0o6777), ..Default::default() })
        .expect("chmod");
    m.setxattr(f.ino, cap, b"caps", XattrFlags::Any, &root()).expect("set capability");
    let out = m.setattr(f.ino, &root(), &size(0)).expect("root truncates");
    assert_eq!(out.attr.mode, 0o6777);
    assert_eq!(status(m.getxattr(f.ino, cap, &root())), FsStatus::NoData);
    assert_eq!(m.setattr(f.ino, &alice(), &size(0)).expect("truncate").attr.mode, 0o777);
    m.setxattr(f.ino, cap, b"caps", XattrFlags::Any, &root()).expect("set capability");
    m.setattr(f.ino, &root(), &SetAttr { gid: Some(7), ..Default::default() }).expect("chgrp");
    assert_eq!(status(m.getxattr(f.ino, cap, &root())), FsStatus::NoData);
}

#[test]
fn parent_times_follow_posix() {
    let m = meta();
    let d = m.mkdir(ROOT_INO, b"d", 0o755, &root()).expect("d");
    let before = m.getattr(d.ino).expect("d");
    let f = m.create(d.ino, b"f", 0o644, &root()).expect("f");
    let after = m.getattr(d.ino).expect("d");
    assert!(after.mtime > before.mtime && after.ctime > before.ctime);
    m.link(f.ino, d.ino, b"g", &root()).expect("link");
    let linked = m.getattr(f.ino).expect("f");
    assert!(linked.ctime > f.ctime);
    assert_eq!(linked.mtime, f.mtime);
    m.setxattr(f.ino, b"user.k", b"v", XattrFlags::Any, &root()).expect("setxattr");
    assert!(m.getattr(f.ino).expect("f").ctime > linked.ctime);
}

#[test]
fn xattr_flags_limits_and_namespaces() {
    let m = meta();
    let f = m.create(ROOT_INO, b"f", 0o644, &alice()).expect("create");
    let a = alice();
    assert_eq!(status(m.getxattr(f.ino, b"user.k", &a)), FsStatus::NoData);
    assert_eq!(
        status(m.setxattr(f.ino, b"user.k", b"v", XattrFlags::Replace, &a)),
        FsStatus::NoData
    );
    m.setxattr(f.ino, b"user.k", b"v1", XattrFlags::Create, &a).expect("create");
    assert_eq!(
        status(m.setxattr(f.ino, b"user.k", b"v", XattrFlags::Create, &a)),
        FsStatus::Exists
    );
    m.setxattr(f.ino, b"user.k", b"v2", XattrFlags::Replace, &a).expect("replace");
    assert_eq!(m.getxattr(f.ino, b"user.k", &a).expect("get"), b"v2");
    m.setxattr(f.ino, b"user.a", b"", XattrFlags::Any, &a).expect("empty value");
    assert_eq!(
        status(m.setxattr(f.ino, b"user.k", b"v", XattrFlags::Any, &bob())),
        FsStatus::Access
    );
    assert_eq!(m.getxattr(f.ino, b"user.k", &bob()).expect("others read"), b"v2");
    assert_eq!(status(m.setxattr(f.ino, b"trusted.t", b"v", XattrFlags::Any, &a)), FsStatus::Perm);
    m.setxattr(f.ino, b"trusted.t", b"v", XattrFlags::Any, &root()).expect("root trusted");
    // security.* is root's to set, even on one's own file: no file capabilities from a writer.
    for name in [&b"security.capability"[..], b"security.other"] {
        assert_eq!(status(m.setxattr(f.ino, name, b"v", XattrFlags::Any, &a)), FsStatus::Perm);
        m.setxattr(f.ino, name, b"v", XattrFlags::Any, &root()).expect("root sets security");
        assert_eq!(m.getxattr(f.ino, name, &bob()).expect("anyone reads it"), b"v");
    }
    // Removing security.capability only takes privilege away (the kernel does it as the writer
    // when a write drops it); other security.* removals are root's.
    assert_eq!(status(m.removexattr(f.ino, b"security.capability", &bob())), FsStatus::Access);
    m.removexattr(f.ino, b"security.capability", &a).expect("a writer drops the capability");
    assert_eq!(status(m.removexattr(f.ino, b"security.other", &a)), FsStatus::Perm);
    m.removexattr(f.ino, b"security.other", &root()).expect("root removes security");
    assert_eq!(m.listxattr(f.ino, &a).expect("list"), vec![b"user.a".to_vec(), b"user.k".to_vec()]);
    assert_eq!(m.listxattr(f.ino, &root()).expect("list").len(), 3);
    let long_name = vec![b'n'; 256];
    assert_eq!(status(m.setxattr(f.ino, &long_name, b"v", XattrFlags::Any, &a)), FsStatus::Range);
    assert_eq!(status(m.getxattr(f.ino, b"", &a)), FsStatus::Range);
    let big = vec![0u8; 64 * 1024 + 1];
    assert_eq!(status(m.setxattr(f.ino, b"user.big", &big, XattrFlags::Any, &a)), FsStatus::TooBig);
    m.setxattr(f.ino, b"user.big", &big[1..], XattrFlags::Any, &a).expect("64 KiB value");
    m.removexattr(f.ino, b"user.k", &a).expect("remove");
    assert_eq!(status(m.removexattr(f.ino, b"user.k", &a)), FsStatus::NoData);
    // An unlinked inode takes its xattrs with it.
    m.unlink(ROOT_INO, b"f", &a).expect("unlink");
    let g = m.create(ROOT_INO, b"g", 0o644, &a).expect("g");
    assert!(m.listxattr(g.ino, &root()).expect("list").is_empty());
}
