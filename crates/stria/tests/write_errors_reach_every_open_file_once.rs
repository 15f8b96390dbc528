//! A queued write that fails is reported to every handle of the file open when it failed,
//! once each, at that handle's next flush (close) or fsync, as Linux reports a writeback
//! error to each open file description (errseq_t). The first handle to flush must not take
//! the error from the others: an `fsync` of a read-only handle (coreutils `sync FILE`) or the
//! close of a handle that never wrote would otherwise leave the writer's close returning 0
//! over a write that never landed. A handle opened after the failure does not see it.

#![allow(clippy::unwrap_used)]

mod support;

use stria_proto::fs::{FsStatus, ROOT_INO};
use stria_proto::wire::Caller;
use support::node::{Node, native_client, pattern, require_fuse, scratch};

/// Small drives, so the file system fills in seconds.
const ARGS: [&str; 8] =
    ["--drives", "3", "--raid", "5", "--drive-size", "48M", "--stripe-unit", "64K"];
const READ: u32 = libc::R_OK as u32;
const READ_WRITE: u32 = (libc::R_OK | libc::W_OK) as u32;

#[test]
fn a_write_error_reaches_every_open_file_once() {
    require_fuse();
    let dir = scratch("write-error-every-handle");
    let node = Node::start(&dir, &ARGS);
    let (client, _runtime) = native_client(&node);
    let root = Caller::root();
    let (writer, attr) =
        client.create_open(&root, ROOT_INO, b"full", 0o644, false, READ_WRITE).unwrap();
    let ino = attr.ino;
    let (reader, _) = client.open(&root, ino, READ).unwrap();
    let (idle, _) = client.open(&root, ino, READ_WRITE).unwrap();

    // Fill the file system through the writer: its writes are queued behind, so the first
    // one refused for space fails later, and the writer's next write says so.
    let piece = pattern(7, 0, 1 << 20);
    let mut offset = 0u64;
    let refused = loop {
        match client.write(writer, offset, &piece) {
            Ok(n) => offset += u64::from(n),
            Err(error) => break error,
        }
        assert!(offset < 1 << 30, "1 GiB written to 48 MiB drives without an error");
    };
    assert_eq!(refused, FsStatus::NoSpace, "after {offset} bytes");

    // A handle that has not seen the error yet refuses writes, so a writer notices early.
    assert_eq!(client.write(idle, 0, b"x"), Err(FsStatus::NoSpace));
    // The reader's fsync (`sync FILE`) and the close of the handle that never wrote see the
    // error, and leave it to the writer too.
    assert_eq!(client.fsync(reader), Err(FsStatus::NoSpace), "fsync of the read-only handle");
    assert_eq!(client.flush(idle), Err(FsStatus::NoSpace), "close of the idle handle");
    assert_eq!(
        client.flush(writer),
        Err(FsStatus::NoSpace),
        "the writer's close must report its own write error after other handles flushed"
    );
    // Each handle sees each error once.
    assert_eq!(client.flush(writer), Ok(()), "the writer's second flush");
    assert_eq!(client.flush(idle), Ok(()), "the idle handle's second flush");
    // A handle opened after the failure does not see it.
    let (late, _) = client.open(&root, ino, READ_WRITE).unwrap();
    assert_eq!(client.flush(late), Ok(()), "a handle opened after the error");

    for fh in [late, idle, reader, writer] {
        client.release(fh).unwrap();
    }
    client.unlink(&root, ROOT_INO, b"full").unwrap();
}
