//! Regression (found by `stria chaos kill`, seed 0x4b11, cycles 25 and 51): with lazy commits, a
//! truncate that shrank a file was committed without being made durable, and the client then
//! trimmed the file's chunks on the targets. A crash before the next sync brought back the old
//! size over trimmed chunks: the file read as its old length with zeros where its tail had been,
//! neither the file before the truncate nor after it. A shrinking size change must be durable
//! before the call returns, since the data past the new end is removed right after.

mod common;

use common::*;
use stria_meta::*;
use stria_proto::fs::ROOT_INO;

#[test]
fn a_shrinking_truncate_survives_a_crash_right_after_it() {
    let path = tmp_path("shrink-durable");
    let m = Meta::open(&path, MetaOptions { commit: Commit::Lazy, ..options() }).expect("open");
    let f = m.create(ROOT_INO, b"f", 0o644, &alice()).expect("create");
    let plan = m.spill_begin(f.ino).expect("plan");
    m.spill_commit(&plan).expect("commit");
    m.extend_size(f.ino, 5 << 20, Timestamp::new(1, 0)).expect("grow");
    m.sync().expect("sync");
    let shrink = SetAttr { size: Some(100_000), ..SetAttr::default() };
    m.setattr(f.ino, &alice(), &shrink).expect("truncate");
    let image = crash_image(&path, "shrink-durable-image");
    let after = Meta::open(&image, MetaOptions { commit: Commit::Lazy, ..options() })
        .expect("open the crash image");
    assert_eq!(after.getattr(f.ino).expect("getattr").size, 100_000);
    drop(after);
    // A growing size change may stay lazy: the data it exposes reads as zeros either way.
    drop(m);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&image);
}
