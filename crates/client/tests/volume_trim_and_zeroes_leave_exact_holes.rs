//! Trim and write-zeroes on a volume over two targets: the ranges read as zeros afterwards,
//! block status shows holes exactly at the freed 4 KiB blocks, allocated bytes go down by
//! exactly those blocks, zero writes without trim stay allocated, and trimming everything
//! removes every chunk.

mod common;

use common::*;

const KIB: u64 = 1024;
const CHUNK: u32 = 64 * 1024;
const SIZE: u64 = 1024 * KIB;

fn chunks_on_targets(node: &Node) -> u64 {
    node.storage.as_ref().expect("serving").targets().map(|t| t.engine.space().chunks).sum()
}

#[test]
fn trim_frees_whole_blocks_and_reads_zeros() {
    let node = Node::start(2, 16);
    let client = node.client();
    let volume = node.volume(&client, 1, CHUNK, SIZE);
    let mut rng = Rng::new(11);
    let data = rng.bytes(512 * KIB as usize);
    volume.write(0, &data, false).expect("write");
    assert_eq!(volume.allocated_bytes().expect("allocated"), 512 * KIB);
    assert_eq!(
        volume.block_status(0, SIZE).expect("map"),
        vec![(512 * KIB, true), (512 * KIB, false)]
    );
    assert_eq!(chunks_on_targets(&node), 8, "eight 64 KiB chunks over two targets");

    // 512-byte aligned but not 4 KiB aligned: blocks 25 and 75 are only partly trimmed.
    let (start, len) = (100 * KIB + 512, 200 * KIB);
    volume.trim(start, len).expect("trim");
    let got = volume.read(0, 512 * KIB as usize).expect("read");
    let (s, e) = (start as usize, (start + len) as usize);
    assert!(got[..s] == data[..s], "bytes before the trim survive");
    assert!(got[s..e].iter().all(|&b| b == 0), "the trimmed range reads zeros");
    assert!(got[e..] == data[e..], "bytes after the trim survive");
    // Whole blocks 26..=74 are holes now; the edge blocks 25 and 75 keep data.
    assert_eq!(
        volume.block_status(0, SIZE).expect("map"),
        vec![(104 * KIB, true), (196 * KIB, false), (212 * KIB, true), (512 * KIB, false)]
    );
    assert_eq!(volume.allocated_bytes().expect("allocated"), 512 * KIB - 196 * KIB);
    // An unaligned query starts and ends exactly where asked.
    assert_eq!(
        volume.block_status(104 * KIB - 100, 1000).expect("map"),
        vec![(100, true), (900, false)]
    );
}

#[test]
fn write_zeroes_with_and_without_trim() {
    let node = Node::start(2, 16);
    let client = node.client();
    let volume = node.volume(&client, 2, CHUNK, SIZE);
    let mut rng = Rng::new(12);
    let data = rng.bytes(256 * KIB as usize);
    volume.write(0, &data, false).expect("write");

    // Without trim: real zero blocks, allocated even where there was a hole before.
    volume.write_zeroes(200 * KIB, 200 * KIB, false, false).expect("zeroes");
    let got = volume.read(0, 400 * KIB as usize).expect("read");
    assert!(got[..200 * KIB as usize] == data[..200 * KIB as usize]);
    assert!(got[200 * KIB as usize..].iter().all(|&b| b == 0));
    assert_eq!(
        volume.block_status(0, SIZE).expect("map"),
        vec![(400 * KIB, true), (624 * KIB, false)]
    );
    assert_eq!(volume.allocated_bytes().expect("allocated"), 400 * KIB);

    // With trim and FUA: freed, and durable at once (nothing left parked on any target).
    volume.write_zeroes(64 * KIB, 128 * KIB, true, true).expect("zeroes with trim");
    let got = volume.read(0, 400 * KIB as usize).expect("read");
    let k = KIB as usize;
    assert!(got[..64 * k] == data[..64 * k]);
    assert!(got[64 * k..192 * k].iter().all(|&b| b == 0));
    assert!(got[192 * k..200 * k] == data[192 * k..200 * k]);
    assert!(got[200 * k..].iter().all(|&b| b == 0));
    assert_eq!(
        volume.block_status(0, SIZE).expect("map"),
        vec![(64 * KIB, true), (128 * KIB, false), (208 * KIB, true), (624 * KIB, false)]
    );
    assert_eq!(volume.allocated_bytes().expect("allocated"), 272 * KIB);
    assert_eq!(node.reclaimable_bytes(), vec![0, 0], "the FUA zeroing was synced");
}

#[test]
fn trimming_everything_removes_every_chunk() {
    let node = Node::start(2, 16);
    let client = node.client();
    let volume = node.volume(&client, 3, CHUNK, SIZE);
    let mut rng = Rng::new(13);
    // Scattered writes touch most chunks, some only partly.
    for i in 0..24u64 {
        let offset = i * 41 * KIB + 512;
        volume.write(offset, &rng.bytes(9000), false).expect("write");
    }
    assert!(volume.allocated_bytes().expect("allocated") > 0);
    assert!(chunks_on_targets(&node) >= 12);
    volume.trim(0, SIZE).expect("trim all");
    assert_eq!(volume.allocated_bytes().expect("allocated"), 0);
    assert_eq!(volume.block_status(0, SIZE).expect("map"), vec![(SIZE, false)]);
    assert_eq!(chunks_on_targets(&node), 0, "emptied chunks are removed");
    assert!(volume.read(0, SIZE as usize).expect("read").iter().all(|&b| b == 0));
    // The space comes back once a flush makes the trim durable.
    volume.flush().expect("flush");
    let used: u64 = node
        .storage
        .as_ref()
        .expect("serving")
        .targets()
        .map(|t| t.engine.space().used_bytes)
        .sum();
    assert_eq!(used, 0);
}
