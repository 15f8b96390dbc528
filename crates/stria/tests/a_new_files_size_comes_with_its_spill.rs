//! Creating a small file past the inline limit costs the metadata service one commit less:
//! the first write moves the empty file to chunks and publishes its size in the same request
//! (`SpillSized`), so its close has no size to publish (`ExtendSize`). A file that already
//! holds inline bytes takes the two-step spill and publishes its size at close, as before.
//! Both read back whole after a restart.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;

use support::http::Api;
use support::node::{Node, pattern, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];
const FILES: usize = 20;

fn metadata_ops(api: &Api, op: &str) -> u64 {
    let text = api.call("GET", "/metrics", None).body;
    let prefix = format!("stria_metadata_ops_total{{op=\"{op}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |v| v.parse::<f64>().unwrap() as u64)
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
    assert_eq!(metadata_ops(&api, "extend_size"), extends, "no size left to publish at close");

    // Inline bytes first, then a write past the limit: the size is published at close.
    let mixed = node.mount.join("mixed");
    let mut file = std::fs::File::create(&mixed).unwrap();
    file.write_all(&pattern(99, 0, 100)).unwrap();
    file.write_all(&pattern(99, 100, 5000)).unwrap();
    drop(file);
    assert_eq!(metadata_ops(&api, "extend_size"), extends + 1, "the mixed file's close");

    node.stop();
    node.restart();
    for i in 0..FILES {
        let back = std::fs::read(node.mount.join(format!("f{i}"))).unwrap();
        assert!(back == pattern(i as u64, 0, 4096), "f{i} reads back after a restart");
    }
    assert_eq!(std::fs::read(&mixed).unwrap(), pattern(99, 0, 5100));
    node.stop();
    let out = node.cli(&["fsck"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}
