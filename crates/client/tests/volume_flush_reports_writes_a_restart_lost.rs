//! A storage service that crashes and comes back loses the writes it had acknowledged but not
//! yet made durable. The client must not then claim durability: the next flush of the volume
//! fails with an I/O error, once, and the volume goes on working. A clean restart (everything
//! synced, the epoch handed over) loses nothing, and the flush succeeds.

mod common;

use common::Node;
use stria_proto::fs::FsStatus;

const CHUNK: u32 = 1 << 20;
const MIB: u64 = 1 << 20;

fn pattern(byte: u8) -> Vec<u8> {
    vec![byte; 64 * 1024]
}

fn read(volume: &stria_client::VolumeIo, offset: u64) -> Vec<u8> {
    volume.read(offset, 64 * 1024).expect("read")
}

#[test]
fn a_flush_after_a_crash_that_lost_writes_fails_once() {
    let mut node = Node::start(2, 64);
    let client = node.client();
    let volume = node.volume(&client, 1, CHUNK, 16 * MIB);

    volume.write(0, &pattern(0xaa), false).expect("write A");
    volume.flush().expect("flush A");
    // B, on the other target, is acknowledged but never synced.
    volume.write(MIB, &pattern(0xbb), false).expect("write B");
    assert_eq!(read(&volume, MIB), pattern(0xbb));

    node.restart_in_place(true);

    assert_eq!(volume.flush(), Err(FsStatus::Io), "B was lost: the flush must say so");
    assert_eq!(read(&volume, MIB), vec![0u8; 64 * 1024], "B really is gone");
    assert_eq!(read(&volume, 0), pattern(0xaa), "A was flushed and stays");
    // The loss is reported once; later writes and flushes work again.
    volume.flush().expect("the loss was already reported");
    volume.write(2 * MIB, &pattern(0xcc), false).expect("write C");
    volume.flush().expect("flush C");
    assert_eq!(read(&volume, 2 * MIB), pattern(0xcc));
}

#[test]
fn a_flush_after_a_clean_restart_succeeds() {
    let mut node = Node::start(2, 64);
    let client = node.client();
    let volume = node.volume(&client, 2, CHUNK, 16 * MIB);

    volume.write(MIB, &pattern(0xdd), false).expect("write D");
    node.restart_in_place(false);
    volume.flush().expect("a clean stop synced D and handed its epoch over");
    assert_eq!(read(&volume, MIB), pattern(0xdd));
}
