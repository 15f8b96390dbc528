//! `Meta::analytics`: rankings by user, group, fileset and extension, the size histogram and
//! the total, kept current by unlink and truncate.

mod common;

use common::*;
use stria_meta::*;
use stria_proto::fs::{Ino, ROOT_INO};

/// Creates `name` in `dir` owned by `uid`:`uid` with `size` bytes (inline when it fits).
fn file(m: &Meta, dir: Ino, name: &str, uid: u32, size: u64) -> Ino {
    let f = m.create(dir, name.as_bytes(), 0o644, &root()).expect("create");
    if size <= 1024 {
        m.write_inline(f.ino, 0, &vec![b'x'; size as usize]).expect("write");
    } else {
        let plan = m.spill_begin(f.ino).expect("plan");
        m.spill_commit(&plan).expect("commit");
        m.extend_size(f.ino, size, Timestamp::new(1, 0)).expect("grow");
    }
    let owner = SetAttr { uid: Some(uid), gid: Some(uid), ..Default::default() };
    m.setattr(f.ino, &root(), &owner).expect("chown");
    f.ino
}

fn usage(files: u64, bytes: u64) -> Usage {
    Usage { files, bytes }
}

#[test]
fn analytics_ranks_users_groups_filesets_extensions_and_sizes() {
    let m = meta();
    let proj = m.mkdir(ROOT_INO, b"proj", 0o777, &root()).expect("proj");
    let home = m.mkdir(ROOT_INO, b"home", 0o777, &root()).expect("home");
    let deep = m.mkdir(proj.ino, b"deep", 0o777, &root()).expect("deep");
    file(&m, proj.ino, "a.dat", 1000, 2 << 20); // 2 MiB, class 3
    file(&m, deep.ino, "b.DAT", 1000, 100 << 20); // 100 MiB, class 4
    let notes = file(&m, home.ino, "notes.txt", 1001, 100); // class 0
    file(&m, home.ino, "photo.jpg", 1001, 300 << 10); // class 2
    file(&m, home.ino, "README", 0, 10 << 10); // class 1
    file(&m, ROOT_INO, "top.txt", 0, 7); // in the root's own fileset

    let a = m.analytics(10).expect("analytics");
    let total_bytes = (2 << 20) + (100 << 20) + 100 + (300 << 10) + (10 << 10) + 7;
    assert_eq!(a.total, usage(6, total_bytes));
    assert_eq!(
        a.users,
        vec![
            (1000, usage(2, (2 << 20) + (100 << 20))),
            (1001, usage(2, (300 << 10) + 100)),
            (0, usage(2, (10 << 10) + 7)),
        ]
    );
    assert_eq!(a.groups, a.users, "every file's gid equals its uid here");
    let filesets: Vec<_> = a.filesets.iter().map(|f| (f.name.as_str(), f.ino, f.usage)).collect();
    assert_eq!(
        filesets,
        vec![
            ("proj", proj.ino, usage(2, (2 << 20) + (100 << 20))),
            ("home", home.ino, usage(3, (300 << 10) + (10 << 10) + 100)),
            ("/", ROOT_INO, usage(1, 7)),
        ]
    );
    assert_eq!(
        a.extensions,
        vec![
            ("dat".to_string(), usage(2, (2 << 20) + (100 << 20))),
            ("jpg".to_string(), usage(1, 300 << 10)),
            (String::new(), usage(1, 10 << 10)),
            ("txt".to_string(), usage(2, 107)),
        ]
    );
    assert_eq!(
        a.size_histogram,
        [
            usage(2, 107),
            usage(1, 10 << 10),
            usage(1, 300 << 10),
            usage(1, 2 << 20),
            usage(1, 100 << 20)
        ]
    );

    // top cuts every ranking but not the histogram or the total.
    let one = m.analytics(1).expect("analytics");
    assert_eq!(one.users, vec![(1000, usage(2, (2 << 20) + (100 << 20)))]);
    assert_eq!(one.filesets.len(), 1);
    assert_eq!(one.filesets[0].name, "proj");
    assert_eq!(one.extensions.len(), 1);
    assert_eq!((one.total, one.size_histogram), (a.total, a.size_histogram));
    let none = m.analytics(0).expect("analytics");
    assert!(none.users.is_empty() && none.filesets.is_empty() && none.extensions.is_empty());

    // Truncating the 100 MiB file moves it to the smallest class and drops its bytes everywhere.
    let b = m.lookup(deep.ino, b"b.DAT", &root()).expect("b").ino;
    m.setattr(b, &root(), &SetAttr { size: Some(1000), ..Default::default() }).expect("trunc");
    let a = m.analytics(10).expect("analytics");
    assert_eq!(a.total, usage(6, total_bytes - (100 << 20) + 1000));
    assert_eq!(a.users[0], (1000, usage(2, (2 << 20) + 1000)));
    assert_eq!(a.size_histogram[0], usage(3, 1107));
    assert_eq!(a.size_histogram[4], usage(0, 0));
    assert_eq!(a.extensions[0], ("dat".to_string(), usage(2, (2 << 20) + 1000)));

    // Unlinking takes files off every ranking; a user or fileset left empty disappears.
    m.unlink(home.ino, b"notes.txt", &root()).expect("unlink");
    m.unlink(home.ino, b"photo.jpg", &root()).expect("unlink");
    assert!(m.getattr(notes).is_err());
    let a = m.analytics(10).expect("analytics");
    assert!(a.users.iter().all(|(uid, _)| *uid != 1001), "{:?}", a.users);
    assert!(a.extensions.iter().all(|(e, _)| e != "jpg"), "{:?}", a.extensions);
    assert_eq!(a.extensions.iter().find(|(e, _)| e == "txt").map(|e| e.1), Some(usage(1, 7)));
    let home_usage = a.filesets.iter().find(|f| f.name == "home").map(|f| f.usage);
    assert_eq!(home_usage, Some(usage(1, 10 << 10)));
    assert_eq!(a.size_histogram[2], usage(0, 0));
    assert_eq!(a.total.files, 4);
}
