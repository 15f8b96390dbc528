//! Regression (found by `stria chaos kill`, seed 0x4b11: files read back with bytes they were
//! never given): with lazy commits, a crash undid creates together with the inode counter,
//! but not the chunks the client had already written under those numbers, since a target syncs
//! all of its chunks at once. After the restart a new file got a number again and, with it,
//! the chunks of the lost file: its holes and its unwritten tails read another file's bytes.
//! Inode numbers are now reserved in durable batches, and a reopened namespace starts past the
//! reservation.

mod common;

use common::*;
use stria_meta::*;
use stria_proto::fs::ROOT_INO;

#[test]
fn a_create_undone_by_a_crash_does_not_hand_its_number_out_again() {
    let path = tmp_path("ino-reuse");
    let lazy = || MetaOptions { commit: Commit::Lazy, ..options() };
    let m = Meta::open(&path, lazy()).expect("open");
    let kept = m.create(ROOT_INO, b"kept", 0o644, &alice()).expect("create");
    m.sync().expect("sync");
    let lost: Vec<u64> = (0..20)
        .map(|i| m.create(ROOT_INO, format!("lost{i}").as_bytes(), 0o644, &alice()))
        .map(|created| created.expect("create").ino)
        .collect();
    let image = crash_image(&path, "ino-reuse-image");
    let after = Meta::open(&image, lazy()).expect("open the crash image");
    assert!(after.lookup(ROOT_INO, b"kept", &alice()).is_ok(), "the synced create stays");
    for i in 0..20 {
        let fresh = after.create(ROOT_INO, format!("new{i}").as_bytes(), 0o644, &alice());
        let fresh = fresh.expect("create after the crash").ino;
        assert!(fresh > kept.ino);
        assert!(!lost.contains(&fresh), "inode {fresh} was handed out before the crash");
    }
    drop(after);
    drop(m);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&image);
}
