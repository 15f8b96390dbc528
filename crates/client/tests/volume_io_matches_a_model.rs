//! Property test: random reads, writes, trims, zeroings, block-status queries and flushes of
//! random unaligned sizes on a volume striped over three targets with 64 KiB chunks (so most
//! requests cross chunks and targets), compared with an in-memory model after every step.
//! Requests past the end are mixed in and must change nothing. Each run prints its seed;
//! `STRIA_CLIENT_SEED=<n>` replays one and `STRIA_CLIENT_SEEDS=<n>` runs more.

mod common;

use common::*;
use stria_proto::fs::FsStatus;

const CHUNK: u32 = 64 * 1024;
const SIZE: usize = 3 * 1024 * 1024 + 7 * 512;

fn random_range(rng: &mut Rng) -> (usize, usize) {
    let offset = match rng.below(4) {
        0 => rng.below((SIZE / 512) as u64) as usize * 512,
        1 => rng.below((SIZE / CHUNK as usize) as u64) as usize * CHUNK as usize,
        _ => rng.below(SIZE as u64) as usize,
    };
    let len = match rng.below(5) {
        0 => rng.below(600) as usize,
        1 => 4096 * (1 + rng.below(8) as usize),
        2 => rng.below(3 * CHUNK as u64) as usize,
        3 => rng.below(12 * CHUNK as u64) as usize,
        _ => rng.below(20 * 1024) as usize,
    };
    (offset, len.min(SIZE - offset))
}

fn run(seed: u64, steps: usize) {
    println!("volume model seed {seed}");
    let mut rng = Rng::new(seed);
    let node = Node::start(3, 16);
    let client = node.client();
    let volume = node.volume(&client, seed, CHUNK, SIZE as u64);
    let mut model = Model::new(SIZE, CHUNK);
    for step in 0..steps {
        let (offset, len) = random_range(&mut rng);
        let what = format!("seed {seed} step {step}: {offset}+{len}");
        match rng.below(100) {
            0..=34 => {
                let data = rng.bytes(len);
                volume.write(offset as u64, &data, rng.below(4) == 0).expect(&what);
                model.write(offset, &data);
            }
            35..=49 => {
                let got = volume.read(offset as u64, len).expect(&what);
                assert!(got == model.bytes[offset..offset + len], "{what}: read differs");
            }
            50..=54 => {
                // Into a dirty buffer: holes must be written as zeros, not left alone.
                let mut got = vec![0xa5; len];
                volume.read_into(offset as u64, &mut got).expect(&what);
                assert!(got == model.bytes[offset..offset + len], "{what}: read_into differs");
            }
            55..=64 => {
                volume.trim(offset as u64, len as u64).expect(&what);
                model.punch(offset, len);
            }
            65..=74 => {
                let may_trim = rng.below(2) == 0;
                let fua = rng.below(3) == 0;
                volume.write_zeroes(offset as u64, len as u64, may_trim, fua).expect(&what);
                if may_trim {
                    model.punch(offset, len);
                } else {
                    model.write(offset, &vec![0; len]);
                }
            }
            75..=86 => {
                let got = volume.block_status(offset as u64, len as u64).expect(&what);
                assert_eq!(got, model.block_status(offset, len), "{what}: block status");
                assert_eq!(got.iter().map(|e| e.0).sum::<u64>(), len as u64, "{what}: coverage");
            }
            87..=90 => {
                let got = volume.allocated_bytes().expect(&what);
                assert_eq!(got, model.allocated_bytes(), "{what}: allocated bytes");
            }
            91..=93 => volume.flush().expect(&what),
            _ => {
                // Past the end, by a little or by an overflowing amount: refused, no change.
                let offset = SIZE as u64 - rng.below(4096);
                let len = 4097 + rng.below(10_000);
                let refused = [
                    volume.write(offset, &vec![1; len as usize], false),
                    volume.read(offset, len as usize).map(|_| ()),
                    volume.trim(offset, len),
                    volume.write_zeroes(offset, len, false, false),
                    volume.write_zeroes(u64::MAX - 1, 4, true, false),
                    volume.block_status(offset, len).map(|_| ()),
                ];
                for result in refused {
                    assert_eq!(result, Err(FsStatus::Invalid), "{what}: past-end request");
                }
            }
        }
    }
    let whole = volume.read(0, SIZE).expect("read all");
    assert!(whole == model.bytes, "seed {seed}: final contents differ");
    assert_eq!(volume.block_status(0, SIZE as u64).expect("map"), model.block_status(0, SIZE));
    assert_eq!(volume.allocated_bytes().expect("allocated"), model.allocated_bytes());
}

#[test]
fn random_volume_io_matches_the_model() {
    for seed in seeds(3) {
        run(seed, 250);
    }
}
