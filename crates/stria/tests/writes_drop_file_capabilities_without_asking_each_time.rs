//! A write drops the file's capabilities (`security.capability`), as on a local file system.
//! The mount takes that on (FUSE_HANDLE_KILLPRIV_V2), so the kernel no longer asks for the
//! capability before every write: a write is one request, not two, and the metadata service
//! is asked at most once per open. A capability set meanwhile, through this mount or
//! another client, is still dropped by the next write.

#![allow(clippy::unwrap_used)]

mod support;

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use support::http::Api;
use support::node::{Node, SecondMount, require_fuse, scratch};

const ARGS: [&str; 6] = ["--drives", "3", "--drive-size", "256M", "--raid", "5"];
const WRITES: u64 = 300;
const CAPABILITY: &str = "security.capability";
/// CAP_NET_RAW's number in <linux/capability.h>.
const CAP_NET_RAW: u32 = 13;

fn metadata_ops(api: &Api, op: &str) -> u64 {
    api.counter("stria_metadata_ops_total", "op", op)
}

fn mount_requests(api: &Api, op: &str) -> u64 {
    api.counter("stria_mount_requests_total", "op", op)
}

/// The file's capability, or None when it has none.
fn capability(path: &Path) -> Option<Vec<u8>> {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = CString::new(CAPABILITY).unwrap();
    let mut value = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated and `value` holds `value.len()` bytes.
    let n = unsafe {
        libc::getxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len())
    };
    if n < 0 {
        let error = std::io::Error::last_os_error();
        assert_eq!(error.raw_os_error(), Some(libc::ENODATA), "getxattr: {error}");
        return None;
    }
    value.truncate(n as usize);
    Some(value)
}

fn set_capability(path: &Path, value: &[u8]) {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = CString::new(CAPABILITY).unwrap();
    // SAFETY: both strings are NUL-terminated and `value` holds `value.len()` bytes.
    let rc = unsafe {
        libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0)
    };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
}

#[test]
fn writes_drop_file_capabilities_without_asking_each_time() {
    require_fuse();
    let dir = scratch("capability");
    let node = Node::start(&dir, &ARGS);
    let api = Api::of(&node);
    let path = node.mount.join("f");
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
    let service_ops = || metadata_ops(&api, "getxattr") + metadata_ops(&api, "drop_privileges");

    // A file opened (not created) here: the kernel asks at most once (it then marks the
    // inode as having nothing to drop), the service at most twice (that lookup, and the
    // mount's own check before the first write).
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let (kernel, service) = (mount_requests(&api, "getxattr"), service_ops());
    let writes = mount_requests(&api, "write");
    for i in 0..WRITES {
        file.write_all_at(&[i as u8; 4096], (i % 256) * 4096).unwrap();
    }
    assert_eq!(mount_requests(&api, "write") - writes, WRITES, "one request per write");
    let asked = mount_requests(&api, "getxattr") - kernel;
    let sent = service_ops() - service;
    assert!(asked <= 1, "the kernel asked for the capability {asked} times in {WRITES} writes");
    assert!(sent <= 2, "{sent} capability checks in {WRITES} writes went to the service");

    // A capability set while the file is open is found (VFS_CAP_REVISION_2, effective,
    // permitted CAP_NET_RAW), and the next write drops it, as on a local file system.
    let value: Vec<u8> = [0x0200_0001u32, 1 << CAP_NET_RAW, 0, 0, 0]
        .iter()
        .flat_map(|word| word.to_le_bytes())
        .collect();
    set_capability(&path, &value);
    assert_eq!(capability(&path).as_deref(), Some(&value[..]), "set while open");
    (&file).write_all(b"drops it").unwrap();
    assert_eq!(capability(&path), None, "a write drops the file's capability");
    drop(file);
    assert_eq!(capability(&path), None, "and it stays dropped");

    // Set again while closed, it survives until the next write through a new open.
    set_capability(&path, &value);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    assert_eq!(capability(&path).as_deref(), Some(&value[..]), "found at the next open");
    file.write_all_at(b"x", 0).unwrap();
    assert_eq!(capability(&path), None, "dropped by the first write after that open");
    drop(file);

    // Set by another client. This mount's kernel may not look again (it marks an inode it
    // found nothing to drop on, and does not hear of the other client's change), so the
    // mount asks the service at the first write of the new open.
    let other = SecondMount::start(&node, &dir.join("other"));
    let there = other.path.join("f");
    set_capability(&there, &value);
    assert_eq!(capability(&there).as_deref(), Some(&value[..]), "set through the other mount");
    let drops = metadata_ops(&api, "drop_privileges");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(b"y", 0).unwrap();
    drop(file);
    assert_eq!(metadata_ops(&api, "drop_privileges") - drops, 1, "the mount asked the service");
    assert_eq!(capability(&there), None, "the write through this mount dropped it");

    // chown and truncate drop it too, in the metadata service.
    set_capability(&path, &value);
    std::os::unix::fs::chown(&path, Some(1000), None).unwrap();
    assert_eq!(capability(&path), None, "chown drops the capability");
    set_capability(&path, &value);
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(3).unwrap();
    assert_eq!(capability(&path), None, "truncate drops the capability");
    assert_eq!(capability(&there), None, "as the other client sees it");
}
