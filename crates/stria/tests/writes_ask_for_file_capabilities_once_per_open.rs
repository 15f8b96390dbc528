//! The kernel asks for a file's `security.capability` before every write to it, so that a write
//! drops the file's capabilities. The mount asks the metadata service once per open file and
//! answers the rest itself, yet a capability set meanwhile is found, and the kernel's next
//! write still drops it.

#![allow(clippy::unwrap_used)]

mod support;

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use support::http::Api;
use support::node::{Node, require_fuse, scratch};

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
fn writes_ask_for_file_capabilities_once_per_open() {
    require_fuse();
    let dir = scratch("capability");
    let node = Node::start(&dir, &ARGS);
    let api = Api::of(&node);
    let path = node.mount.join("f");
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();

    // A file opened (not created) here: the service is asked once, the kernel every write.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let (kernel, service) = (mount_requests(&api, "getxattr"), metadata_ops(&api, "getxattr"));
    for i in 0..WRITES {
        file.write_all_at(&[i as u8; 4096], (i % 256) * 4096).unwrap();
    }
    let asked = mount_requests(&api, "getxattr") - kernel;
    let sent = metadata_ops(&api, "getxattr") - service;
    assert!(asked >= WRITES, "the kernel asked for the capability only {asked} times");
    assert!(sent <= 2, "{sent} of the kernel's {asked} capability lookups went to the service");

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
}
