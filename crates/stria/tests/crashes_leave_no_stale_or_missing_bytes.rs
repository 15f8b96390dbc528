//! Regressions found by `stria chaos kill` (seed 0x4b11): what a crash leaves between the
//! metadata service's lazy commits and the chunks on the targets must never show in a file.
//!
//! A truncate's new size was durable but the trim of the chunks past it was not: after the
//! crash the chunks still held the old bytes past the end, and growing the file again showed
//! them where zeros belong. A node starting after a crash now frees chunk data past every
//! file's end (and chunks nobody owns) before it serves.
//!
//! A spill of an inline file whose chunk write landed but whose commit never did (the metadata
//! role killed, the client giving up after the recovery had run) left its bytes in chunk 0; a
//! later spill of fewer bytes kept them past its own, and growing the file showed them (seen
//! once in `stria chaos kill --role any`: a truncate up read "neither before nor after"). A
//! spill now makes chunk 0 exactly the inline bytes.

#![allow(clippy::unwrap_used)]

mod support;

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use stria_engine::Engine;
use stria_io::file::{DriveOptions, open_drive};
use stria_meta::{Caller, Commit, Meta, MetaOptions, SetAttr};
use stria_proto::fs::{ChunkId, ObjectId, ROOT_INO};
use stria_raid::Array;
use support::node::{Node, native_client, pattern, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];

#[test]
fn chunk_data_past_a_files_end_is_freed_after_a_crash() {
    require_fuse();
    let dir = scratch("crash-stale-tail");
    let mut node = Node::start(&dir, &ARGS);
    let path = node.mount.join("f");
    std::fs::write(&path, pattern(9, 0, 300_000)).unwrap();
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
    node.stop();

    // The state a crash can leave: the shrunk size durable, the trim of the chunks lost.
    {
        let options = MetaOptions { commit: Commit::Durable, ..MetaOptions::default() };
        let meta = Meta::open(node.data.join("meta/namespace.redb"), options).unwrap();
        let attr = meta.lookup(ROOT_INO, b"f", &Caller::root()).unwrap();
        assert_eq!(attr.ino, ino);
        let shrink = SetAttr { size: Some(1000), ..SetAttr::default() };
        meta.setattr(ino, &Caller::root(), &shrink).unwrap();
    }
    // ... and the run record of a node that did not stop.
    std::fs::write(
        node.data.join("run.json"),
        r#"{"pid":0,"meta":"127.0.0.1:1","storage":"127.0.0.1:1","mount":null}"#,
    )
    .unwrap();
    node.restart();

    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(200_000).unwrap();
    drop(file);
    let back = std::fs::read(&path).unwrap();
    assert_eq!(back.len(), 200_000);
    assert_eq!(back[..1000], pattern(9, 0, 1000)[..]);
    let stale = back[1000..].iter().filter(|&&b| b != 0).count();
    assert_eq!(stale, 0, "the grown part must read as zeros, not the bytes a trim dropped");
    node.stop();
    let out = node.cli(&["fsck"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

/// Removed files' chunks wait in the client for the removal to be durable; a short-lived
/// client (a CLI command, a benchmark) removes them before it goes, so a node that stops
/// cleanly keeps no chunks nobody owns.
#[test]
fn a_short_lived_client_leaves_no_chunks_of_removed_files() {
    require_fuse();
    let dir = scratch("purge-at-exit");
    let mut node = Node::start(&dir, &ARGS);
    {
        let (client, _runtime) = native_client(&node);
        let root = Caller::root();
        for i in 0..5 {
            let name = format!("gone{i}");
            let write = libc::W_OK as u32;
            let (fh, _) =
                client.create_open(&root, ROOT_INO, name.as_bytes(), 0o644, false, write).unwrap();
            client.write(fh, 0, &pattern(i, 0, 300_000)).unwrap();
            client.release(fh).unwrap();
            client.unlink(&root, ROOT_INO, name.as_bytes()).unwrap();
        }
        drop(client);
    }
    node.stop();
    let out = node.cli(&["fsck"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("stray"), "removed files left chunks behind: {text}");
}

/// Opens the stopped node's only target and writes `bytes` at the start of chunk 0 of `ino`:
/// what a spill leaves when its chunk write lands and its commit never does.
fn leave_spill_bytes(node: &Node, ino: u64, bytes: &[u8]) {
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.data.join("node.json")).unwrap()).unwrap();
    let target = &record["targets"][0];
    let drives = target["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| open_drive(&node.data.join(d.as_str().unwrap()), &DriveOptions::default()))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let array = Arc::new(Array::assemble(drives).unwrap());
    let dir = node.data.join(format!("targets/{}", target["id"]));
    let engine = Engine::open(array, &dir).unwrap();
    let chunk = ChunkId { object: ObjectId(ino), index: 0 };
    engine.write(chunk, 0, bytes, None).unwrap();
    engine.sync().unwrap();
}

#[test]
fn a_spill_does_not_keep_the_bytes_of_an_earlier_spill_that_never_committed() {
    require_fuse();
    let dir = scratch("spill-leftovers");
    let mut node = Node::start(&dir, &ARGS);
    let shrunk = node.mount.join("shrunk");
    let emptied = node.mount.join("emptied");
    std::fs::write(&shrunk, pattern(1, 0, 1842)).unwrap();
    std::fs::write(&emptied, b"").unwrap();
    let inos = [&shrunk, &emptied].map(|p| std::fs::metadata(p).unwrap().ino());
    node.stop();
    // Both files are still inline; each has a spill's 3000 bytes in chunk 0.
    for ino in inos {
        leave_spill_bytes(&node, ino, &[0xEE; 3000]);
    }
    node.restart();

    // A truncate up spills the 1842 inline bytes: the rest up to 4907 must read as zeros.
    let file = std::fs::OpenOptions::new().write(true).open(&shrunk).unwrap();
    file.set_len(4907).unwrap();
    drop(file);
    let back = std::fs::read(&shrunk).unwrap();
    assert_eq!(back.len(), 4907);
    assert!(back[..1842] == pattern(1, 0, 1842)[..], "the inline bytes moved to the chunk");
    let stale = back[1842..].iter().filter(|&&b| b != 0).count();
    assert_eq!(stale, 0, "the grown part must read as zeros, not an earlier spill's bytes");

    // An empty file's first write, past the inline limit and leaving a hole before it.
    let file = std::fs::OpenOptions::new().write(true).open(&emptied).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &pattern(2, 0, 4096), 8192).unwrap();
    drop(file);
    let back = std::fs::read(&emptied).unwrap();
    assert_eq!(back.len(), 12288);
    let stale = back[..8192].iter().filter(|&&b| b != 0).count();
    assert_eq!(stale, 0, "the hole must read as zeros, not an earlier spill's bytes");
    assert!(back[8192..] == pattern(2, 0, 4096)[..]);
    node.stop();
    let out = node.cli(&["fsck"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && !text.contains("stray"), "{text}");
}
