//! Creating a small file past the inline limit costs the metadata service one commit less:
//! the first write moves the empty file to chunks and publishes its size in the same request
//! (`SpillSized`), so the publish at its close finds nothing to change and commits nothing. A
//! truncate from elsewhere in between is repaired by that publish, as before (the written bytes
//! are the file's, not stale bytes past its end). A file that already holds inline bytes takes
//! the two-step spill and publishes its size at close, as before.
//! Both read back whole after a restart, and a second reader's reads of them come from the
//! storage role's read cache (its figures in /metrics).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;

use stria_meta::Caller;
use stria_proto::fs::ROOT_INO;
use stria_proto::wire::SetAttr;
use support::http::Api;
use support::node::{Node, native_client, pattern, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];
const FILES: usize = 20;

/// The sum of a metric's samples (every target's, for a per-target one).
fn metric(api: &Api, name: &str) -> f64 {
    let text = api.call("GET", "/metrics", None).body;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn metadata_ops(api: &Api, op: &str) -> u64 {
    api.counter("stria_metadata_ops_total", "op", op)
}

#[test]
fn a_new_files_first_write_publishes_its_size() {
    require_fuse();
    let dir = scratch("spill-sized");
    let mut node = Node::start(&dir, &ARGS);
    let api = Api::of(&node);
    let (sized, extends) = (metadata_ops(&api, "spill_sized"), metadata_ops(&api, "extend_size"));
    for i in 0..FILES {
        std::fs::write(node.mount.join(format!("f{i}")), pattern(i as u64, 0, 4096)).unwrap();
    }
    assert_eq!(metadata_ops(&api, "spill_sized") - sized, FILES as u64, "one per new file");
    // Each close still publishes; the service finds the size there and commits nothing.
    assert_eq!(metadata_ops(&api, "extend_size") - extends, FILES as u64, "one per close");
    let extends = metadata_ops(&api, "extend_size");

    // Inline bytes first, then a write past the limit: the size is published at close.
    let mixed = node.mount.join("mixed");
    let mut file = std::fs::File::create(&mixed).unwrap();
    file.write_all(&pattern(99, 0, 100)).unwrap();
    file.write_all(&pattern(99, 100, 5000)).unwrap();
    drop(file);
    assert_eq!(metadata_ops(&api, "extend_size"), extends + 1, "the mixed file's close");

    // Another client truncates a new file after its first write published the size and
    // before its close: the close publishes again, so the size covers the written bytes.
    let raced = node.mount.join("raced");
    let mut file = std::fs::File::create(&raced).unwrap();
    file.write_all(&pattern(7, 0, 8192)).unwrap();
    {
        let (other, _runtime) = native_client(&node);
        let attr = other.lookup(&Caller::root(), ROOT_INO, b"raced").unwrap();
        assert_eq!(attr.size, 8192, "the first write published the size");
        let cut = SetAttr { size: Some(0), ..SetAttr::default() };
        other.setattr(&Caller::root(), attr.ino, cut).unwrap();
    }
    drop(file);
    let (other, _runtime) = native_client(&node);
    let attr = other.lookup(&Caller::root(), ROOT_INO, b"raced").unwrap();
    assert_eq!(attr.size, 8192, "the close published the write's size again");
    drop(other);

    node.stop();
    node.restart();
    for i in 0..FILES {
        let back = std::fs::read(node.mount.join(format!("f{i}"))).unwrap();
        assert!(back == pattern(i as u64, 0, 4096), "f{i} reads back after a restart");
    }
    assert_eq!(std::fs::read(&mixed).unwrap(), pattern(99, 0, 5100));

    // The mount's reads filled the read cache; a second client's reads of the same blocks
    // (no kernel page cache in between) are answered from it.
    let api = Api::of(&node);
    assert_eq!(metric(&api, "stria_target_read_cache_capacity_bytes"), (1u64 << 30) as f64);
    assert!(metric(&api, "stria_target_read_cache_held_bytes") >= (FILES * 4096) as f64);
    let hits = metric(&api, "stria_target_read_cache_hits_total");
    let (client, _runtime) = native_client(&node);
    for i in 0..FILES {
        let attr = client.lookup(&Caller::root(), ROOT_INO, format!("f{i}").as_bytes()).unwrap();
        let (fh, _) = client.open(&Caller::root(), attr.ino, 4).unwrap();
        assert!(client.read(fh, 0, 4096).unwrap() == pattern(i as u64, 0, 4096));
        client.release(fh).unwrap();
    }
    let hits = metric(&api, "stria_target_read_cache_hits_total") - hits;
    assert!(hits >= FILES as f64, "{hits} blocks came from the cache");
    drop(client);
    node.stop();
    let out = node.cli(&["fsck"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}
