//! One volume handle shared by four threads writing disjoint (unaligned, so neighbouring
//! threads share chunks and even blocks) ranges reads back every thread's data; and flush and
//! FUA writes are what survives a power loss of every target, while unflushed writes are lost.

mod common;

use std::sync::Barrier;

use common::*;

const KIB: u64 = 1024;
const CHUNK: u32 = 64 * 1024;

#[test]
fn four_threads_on_disjoint_ranges_read_back_their_data() {
    let node = Node::start(3, 16);
    let client = node.client();
    // Regions of 300 KiB + 1000 bytes: their borders fall inside chunks and inside blocks.
    let region = 300 * KIB as usize + 1000;
    let size = (4 * region) as u64;
    let volume = node.volume(&client, 1, CHUNK, size);
    let start = Barrier::new(4);
    let models: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let volume = volume.clone();
                let start = &start;
                scope.spawn(move || {
                    let mut rng = Rng::new(100 + t as u64);
                    let mut model = vec![0u8; region];
                    let base = t * region;
                    start.wait();
                    for step in 0..60 {
                        let offset = rng.below(region as u64) as usize;
                        let len = (rng.below(90 * KIB) as usize).min(region - offset);
                        let data = rng.bytes(len);
                        volume.write((base + offset) as u64, &data, step % 10 == 0).expect("write");
                        model[offset..offset + len].copy_from_slice(&data);
                        if step % 15 == 7 {
                            volume.flush().expect("flush");
                        }
                        if step % 4 == 3 {
                            let at = rng.below(region as u64) as usize;
                            let n = (rng.below(40 * KIB) as usize).min(region - at);
                            let got = volume.read((base + at) as u64, n).expect("read");
                            assert!(got == model[at..at + n], "thread {t} step {step}: read back");
                        }
                    }
                    model
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).collect()
    });
    let all = volume.read(0, size as usize).expect("read all");
    for (t, model) in models.iter().enumerate() {
        assert!(all[t * region..(t + 1) * region] == model[..], "thread {t}'s region differs");
    }
}

#[test]
fn flushed_and_fua_writes_survive_a_crash_and_unflushed_ones_do_not() {
    let mut node = Node::start(2, 16);
    let size = 1024 * KIB;
    let mut rng = Rng::new(31);
    let flushed = rng.bytes(200 * KIB as usize + 300);
    let lost = rng.bytes(100 * KIB as usize);
    {
        let client = node.client();
        let volume = node.volume(&client, 1, CHUNK, size);
        // Written (twice: the overwrite parks the first copy's blocks) from one handle,
        // flushed from another: a flush covers every completed write.
        volume.write(1000, &rng.bytes(flushed.len()), false).expect("first write");
        volume.write(1000, &flushed, false).expect("overwrite");
        assert!(node.reclaimable_bytes().iter().all(|&b| b > 0), "overwrites parked blocks");
        let other = node.volume(&client, 1, CHUNK, size);
        other.flush().expect("flush");
        assert_eq!(node.reclaimable_bytes(), vec![0, 0], "every target synced");
        volume.write(800 * KIB, &lost, false).expect("unflushed write");
    }
    node.crash_and_restart();
    {
        let client = node.client();
        let volume = node.volume(&client, 1, CHUNK, size);
        let got = volume.read(1000, flushed.len()).expect("read flushed");
        assert!(got == flushed, "flushed data survives");
        let got = volume.read(800 * KIB, lost.len()).expect("read unflushed");
        assert!(got.iter().all(|&b| b == 0), "an unflushed write is lost (the crash is real)");
    }
    // Each FUA request alone before a crash: two chunks on two targets (each write carries
    // its sync); three chunks, two of them on one target (written, then each target synced);
    // zeroes without trim; zeroes with trim.
    let fua = rng.bytes(72 * KIB as usize);
    let fua_wide = rng.bytes(136 * KIB as usize);
    type Step<'a> = Box<dyn Fn(&stria_client::VolumeIo) + 'a>;
    let steps: Vec<(&str, Step<'_>, Step<'_>)> = vec![
        (
            "fua write",
            Box::new(|v| v.write(600 * KIB, &fua, true).expect("fua write")),
            Box::new(|v| assert!(v.read(600 * KIB, fua.len()).expect("read") == fua)),
        ),
        (
            "wide fua write",
            Box::new(|v| v.write(300 * KIB, &fua_wide, true).expect("wide fua write")),
            Box::new(|v| assert!(v.read(300 * KIB, fua_wide.len()).expect("read") == fua_wide)),
        ),
        (
            "fua zeroes",
            Box::new(|v| v.write_zeroes(310 * KIB, 100 * KIB, false, true).expect("zeroes")),
            Box::new(|v| {
                assert!(
                    v.read(310 * KIB, 100 * KIB as usize).expect("read").iter().all(|&b| b == 0)
                );
                let map = v.block_status(300 * KIB, 136 * KIB).expect("map");
                assert_eq!(map, vec![(136 * KIB, true)], "zero blocks are allocated");
            }),
        ),
        (
            "fua zeroes with trim",
            Box::new(|v| v.write_zeroes(600 * KIB, 72 * KIB, true, true).expect("trim zeroes")),
            Box::new(|v| {
                assert!(
                    v.read(600 * KIB, 72 * KIB as usize).expect("read").iter().all(|&b| b == 0)
                );
                let map = v.block_status(600 * KIB, 72 * KIB).expect("map");
                assert_eq!(map, vec![(72 * KIB, false)], "trimmed blocks are holes");
            }),
        ),
    ];
    for (what, act, verify) in &steps {
        {
            let client = node.client();
            act(&node.volume(&client, 1, CHUNK, size));
        }
        node.crash_and_restart();
        let client = node.client();
        let volume = node.volume(&client, 1, CHUNK, size);
        println!("checking {what}");
        verify(&volume);
    }
    let client = node.client();
    let volume = node.volume(&client, 1, CHUNK, size);
    assert!(volume.read(1000, flushed.len()).expect("read flushed") == flushed);
    // 1000..206_100 covers blocks 0..=50; the wide FUA write is of whole blocks and the zeroes
    // fall inside it; the first FUA write was trimmed again.
    assert_eq!(volume.allocated_bytes().expect("allocated"), 51 * 4096 + 136 * KIB);
}
