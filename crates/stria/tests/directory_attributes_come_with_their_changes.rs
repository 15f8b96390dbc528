//! A create or a remove in a directory answers with the directory's attributes too, and the
//! mount answers the kernel's next GETATTR of the directory from them (it asks before every
//! change in it): one metadata request less per create and per remove. What `stat` shows of
//! the directory stays right after every kind of change through the mount, and a change
//! through another client shows once the attribute timeout has passed, as before.

#![allow(clippy::unwrap_used)]

mod support;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use stria_meta::Caller;
use support::http::Api;
use support::node::{Node, native_client, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];
const FILES: u64 = 200;

fn metadata_ops(api: &Api, op: &str) -> u64 {
    api.counter("stria_metadata_ops_total", "op", op)
}

fn mount_requests(api: &Api, op: &str) -> u64 {
    api.counter("stria_mount_requests_total", "op", op)
}

#[test]
fn directory_attributes_come_with_their_changes() {
    require_fuse();
    let dir = scratch("dir-attrs");
    let node = Node::start(&dir, &ARGS);
    let api = Api::of(&node);
    let d = node.mount.join("d");
    std::fs::create_dir(&d).unwrap();

    let (kernel, service) = (mount_requests(&api, "getattr"), metadata_ops(&api, "getattr"));
    for i in 0..FILES {
        std::fs::write(d.join(format!("f{i}")), b"x").unwrap();
    }
    for i in 0..FILES {
        std::fs::remove_file(d.join(format!("f{i}"))).unwrap();
    }
    let asked = mount_requests(&api, "getattr") - kernel;
    let sent = metadata_ops(&api, "getattr") - service;
    assert!(asked >= FILES, "the kernel asked for the directory only {asked} times");
    assert!(sent * 10 < asked, "{sent} of the kernel's {asked} getattrs went to the service");

    // What stat shows after each kind of change is what the service holds.
    let (client, _runtime) = native_client(&node);
    let ino = std::fs::metadata(&d).unwrap().ino();
    let check = |what: &str| {
        let seen = std::fs::metadata(&d).unwrap();
        let held = client.getattr(ino).unwrap();
        assert_eq!(
            (seen.nlink(), seen.mtime(), seen.mtime_nsec(), seen.ctime(), seen.mode()),
            (
                u64::from(held.nlink),
                held.mtime.secs,
                i64::from(held.mtime.nanos),
                held.ctime.secs,
                u32::from(held.perm) | libc::S_IFDIR
            ),
            "after {what}"
        );
    };
    std::fs::write(d.join("a"), b"a").unwrap();
    check("a create");
    std::fs::create_dir(d.join("sub")).unwrap();
    check("a mkdir");
    std::fs::rename(d.join("a"), d.join("b")).unwrap();
    check("a rename");
    std::fs::hard_link(d.join("b"), d.join("c")).unwrap();
    check("a link");
    std::os::unix::fs::symlink("b", d.join("s")).unwrap();
    check("a symlink");
    std::fs::remove_dir(d.join("sub")).unwrap();
    check("an rmdir");
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
    check("a chmod");
    std::fs::remove_file(d.join("c")).unwrap();
    check("an unlink");

    // Another client's change shows after the attribute timeout (1 s), as without the cache.
    std::fs::write(d.join("mine"), b"m").unwrap();
    let before = std::fs::metadata(&d).unwrap().nlink();
    client.mkdir(&Caller::root(), ino, b"theirs", 0o755).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(std::fs::metadata(&d).unwrap().nlink(), before + 1, "another client's mkdir");
}
