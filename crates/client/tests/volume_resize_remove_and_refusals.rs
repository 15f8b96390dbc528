//! Volume size changes and the requests a volume refuses: shrinking drops the data past the new
//! end so growing back reads zeros there, removing a volume frees everything, requests past the
//! end fail with `Invalid` and change nothing, a full target reports `NoSpace`, and a handle
//! is refused for a file's object id or a broken layout.

mod common;

use common::*;
use stria_proto::fs::{FileLayout, FsStatus, ObjectId};

const KIB: u64 = 1024;
const CHUNK: u32 = 64 * 1024;

#[test]
fn shrink_then_grow_reads_zeros_past_the_old_end() {
    let node = Node::start(3, 16);
    let client = node.client();
    let size = 1024 * KIB;
    let volume = node.volume(&client, 1, CHUNK, size);
    let data = Rng::new(21).bytes(size as usize);
    volume.write(0, &data, false).expect("write");
    assert_eq!(volume.allocated_bytes().expect("allocated"), size);

    // Mid-chunk and mid-block: the boundary chunk keeps its head, its tail is freed.
    let small = 300 * KIB + 512;
    volume.shrink_to(small).expect("shrink");
    assert_eq!(volume.size(), small);
    assert_eq!(volume.read(small - 512, 1024), Err(FsStatus::Invalid), "past the new end");
    // Blocks up to the one holding the new end stay; block 75 is partial, so it is kept.
    assert_eq!(volume.allocated_bytes().expect("allocated"), 304 * KIB);

    volume.set_size(size);
    let got = volume.read(0, size as usize).expect("read");
    assert!(got[..small as usize] == data[..small as usize], "data before the cut survives");
    assert!(got[small as usize..].iter().all(|&b| b == 0), "the grown part reads zeros");
    assert_eq!(
        volume.block_status(0, size).expect("map"),
        vec![(304 * KIB, true), (size - 304 * KIB, false)]
    );
    // Writing past the old end works again, into fresh blocks.
    volume.write(900 * KIB, &[7; 5000], true).expect("write past old end");
    assert_eq!(volume.read(900 * KIB, 5000).expect("read"), vec![7; 5000]);

    // Shrinking on a chunk boundary removes whole chunks only.
    volume.shrink_to(128 * KIB).expect("shrink to a chunk boundary");
    volume.set_size(size);
    assert_eq!(volume.allocated_bytes().expect("allocated"), 128 * KIB);
    assert!(
        volume.read(128 * KIB, (size - 128 * KIB) as usize).expect("read").iter().all(|&b| b == 0)
    );
    // A handle made before the shrink shares the size.
    let clone = volume.clone();
    clone.shrink_to(64 * KIB).expect("shrink through a clone");
    assert_eq!(volume.size(), 64 * KIB);
}

#[test]
fn remove_all_leaves_nothing_allocated() {
    let node = Node::start(3, 16);
    let client = node.client();
    let size = 2048 * KIB;
    let volume = node.volume(&client, 2, CHUNK, size);
    let mut rng = Rng::new(22);
    for i in 0..20u64 {
        volume.write(i * 97 * KIB + 1536, &rng.bytes(30_000), false).expect("write");
    }
    // Another volume on the same targets must not be touched.
    let other = node.volume(&client, 3, CHUNK, size);
    other.write(0, &[9; 70_000], false).expect("write other");

    volume.remove_all().expect("remove");
    assert_eq!(volume.allocated_bytes().expect("allocated"), 0);
    assert_eq!(volume.block_status(0, size).expect("map"), vec![(size, false)]);
    assert!(volume.read(0, size as usize).expect("read").iter().all(|&b| b == 0));
    assert_eq!(other.read(0, 70_000).expect("read other"), vec![9; 70_000]);
    assert_eq!(other.allocated_bytes().expect("allocated other"), 72 * KIB);
    let chunks: u64 =
        node.storage.as_ref().expect("serving").targets().map(|t| t.engine.space().chunks).sum();
    assert_eq!(chunks, 2, "only the other volume's two chunks are left");
}

#[test]
fn requests_past_the_end_are_refused_and_change_nothing() {
    let node = Node::start(2, 16);
    let client = node.client();
    let size = 256 * KIB + 512;
    let volume = node.volume(&client, 4, CHUNK, size);
    let data = Rng::new(23).bytes(size as usize);
    volume.write(0, &data, false).expect("write");
    let map = volume.block_status(0, size).expect("map");
    let allocated = volume.allocated_bytes().expect("allocated");

    let end = size;
    let cases: Vec<(&str, Result<(), FsStatus>)> = vec![
        ("write across the end", volume.write(end - 512, &[1; 1024], false)),
        ("write at the end", volume.write(end, &[1; 1], true)),
        ("read across the end", volume.read(end - 1, 2).map(|_| ())),
        ("trim across the end", volume.trim(0, end + 1)),
        ("zeroes across the end", volume.write_zeroes(4096, end, false, false)),
        ("zeroes with trim across the end", volume.write_zeroes(4096, end, true, true)),
        ("block status across the end", volume.block_status(end - 10, 11).map(|_| ())),
        ("overflowing offset", volume.write(u64::MAX - 2, &[1; 8], false)),
        ("overflowing trim", volume.trim(u64::MAX, u64::MAX)),
        ("oversized read", volume.read(0, stria_client::VOLUME_IO_BYTES_MAX + 1).map(|_| ())),
    ];
    for (what, result) in cases {
        assert_eq!(result, Err(FsStatus::Invalid), "{what}");
    }
    assert!(volume.read(0, size as usize).expect("read") == data, "contents unchanged");
    assert_eq!(volume.block_status(0, size).expect("map"), map);
    assert_eq!(volume.allocated_bytes().expect("allocated"), allocated);
    // Empty requests at the very end are fine.
    assert_eq!(volume.read(end, 0).expect("empty read"), Vec::<u8>::new());
    assert_eq!(volume.block_status(end, 0).expect("empty map"), vec![]);
    volume.write(end, &[], false).expect("empty write");
}

#[test]
fn a_full_target_reports_no_space_and_keeps_earlier_data() {
    // Four 4 MiB drives: about 12 MiB of data area, far less than the volume's size.
    let node = Node::start(1, 4);
    let client = node.client();
    let size = 64 * 1024 * KIB;
    let volume = node.volume(&client, 5, CHUNK, size);
    let mut rng = Rng::new(24);
    let first = rng.bytes(256 * KIB as usize);
    volume.write(0, &first, false).expect("first write fits");
    let mut error = None;
    for i in 1..64u64 {
        if let Err(e) = volume.write(i * 256 * KIB, &rng.bytes(256 * KIB as usize), false) {
            error = Some(e);
            break;
        }
    }
    assert_eq!(error, Some(FsStatus::NoSpace), "filling the target must end in NoSpace");
    assert!(volume.read(0, first.len()).expect("read") == first, "earlier data intact");
    // Trimming gives the space back for new writes (after a flush releases it).
    volume.trim(256 * KIB, size - 256 * KIB).expect("trim");
    volume.flush().expect("flush");
    volume.write(256 * KIB, &[3; 100_000], false).expect("write after trim");
}

#[test]
fn a_handle_on_a_file_id_or_a_bad_layout_refuses_everything() {
    let node = Node::start(2, 16);
    let client = node.client();
    let layout = node.layout(CHUNK);
    // A file's data sits on the same targets: a handle on its id must not touch it.
    let file = ObjectId(42);
    let file_chunks = node.volume(&client, 0, CHUNK, 1 << 20); // id VOLUME_BIT | 0
    file_chunks.write(0, &[1; 5000], false).expect("write through a valid handle");
    let volume_id = ObjectId(ObjectId::VOLUME_BIT | 42);
    let handles = [
        client.volume(file, layout.clone(), 1 << 20),
        client.volume(volume_id, FileLayout { chunk_bytes: 3000, ..layout.clone() }, 1 << 20),
        client.volume(volume_id, FileLayout { chunk_bytes: 0, ..layout.clone() }, 1 << 20),
        client.volume(volume_id, FileLayout { targets: vec![], ..layout.clone() }, 1 << 20),
    ];
    for (i, handle) in handles.iter().enumerate() {
        let results = [
            handle.write(0, &[7; 4096], true),
            handle.read(0, 4096).map(|_| ()),
            handle.trim(0, 4096),
            handle.write_zeroes(0, 4096, false, false),
            handle.block_status(0, 4096).map(|_| ()),
            handle.allocated_bytes().map(|_| ()),
            handle.flush(),
            handle.shrink_to(0),
            handle.remove_all(),
        ];
        for (j, result) in results.into_iter().enumerate() {
            assert_eq!(result, Err(FsStatus::Invalid), "handle {i} request {j}");
        }
    }
    let chunks: u64 =
        node.storage.as_ref().expect("serving").targets().map(|t| t.engine.space().chunks).sum();
    assert_eq!(chunks, 1, "only the valid handle's chunk exists");
    let valid = client.volume(volume_id, layout, 1 << 20);
    assert_eq!(valid.size(), 1 << 20);
    assert_eq!(valid.object(), volume_id);
    assert_eq!(valid.allocated_bytes(), Ok(0));
}
