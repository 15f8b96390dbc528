//! Property test: random writes, reads, truncates, punches, removes, syncs and reopens on a few
//! chunks through a real RAID 5 array, compared with an in-memory model after every step. Each
//! run prints its seed; `STRIA_ENGINE_SEED=<n>` replays one.

mod common;

use std::collections::BTreeMap;

use common::*;
use stria_engine::{Engine, EngineError};
use stria_proto::fs::{CHUNK_BYTES_MAX, ChunkId, ObjectId, TargetId};

const CHUNK_SPAN: u64 = 512 * 1024;

fn random_chunk(rng: &mut Rng) -> ChunkId {
    chunk(1 + rng.below(2), rng.below(3))
}

fn random_range(rng: &mut Rng) -> (u32, u32) {
    let offset = match rng.below(4) {
        0 => rng.below(CHUNK_SPAN / 4096) * 4096,
        _ => rng.below(CHUNK_SPAN),
    };
    let len = match rng.below(6) {
        0 => rng.below(16),
        1 => 4096 * (1 + rng.below(4)),
        2 => rng.below(256 * 1024),
        _ => rng.below(20 * 1024),
    };
    (offset as u32, len as u32)
}

fn check_all(engine: &Engine, model: &BTreeMap<ChunkId, Vec<u8>>, seed: u64, step: usize) {
    for object in 1..=2u64 {
        let listed = engine.list_chunks(ObjectId(object)).expect("list");
        let expected: Vec<(u64, u32)> = model
            .iter()
            .filter(|(c, _)| c.object.0 == object)
            .map(|(c, d)| (c.index, d.len() as u32))
            .collect();
        assert_eq!(listed, expected, "seed {seed} step {step}: list_chunks({object})");
    }
    for (c, data) in model {
        let got = engine.read(*c, 0, CHUNK_BYTES_MAX).expect("read whole chunk");
        assert!(got == *data, "seed {seed} step {step}: chunk {c} differs from the model");
    }
    assert_eq!(engine.space().chunks, model.len() as u64, "seed {seed} step {step}: chunk count");
}

fn run(seed: u64, steps: usize) {
    println!("model seed {seed}");
    let mut rng = Rng::new(seed);
    let (_drives, array) = raid5(24);
    let dir = temp_dir("model");
    let mut engine = Some(Engine::create(array.clone(), &dir, TargetId(1)).expect("create"));
    let mut model: BTreeMap<ChunkId, Vec<u8>> = BTreeMap::new();
    for step in 0..steps {
        let e = engine.as_ref().expect("open");
        let c = random_chunk(&mut rng);
        match rng.below(100) {
            0..=39 => {
                let (offset, len) = random_range(&mut rng);
                let data = rng.bytes(len as usize);
                let crc = rng.chance(50).then(|| crc32c::crc32c(&data));
                let done = e.write(c, offset, &data, crc).expect("write");
                if !data.is_empty() || model.contains_key(&c) {
                    let m = model.entry(c).or_default();
                    model_write(m, offset as usize, &data);
                    assert_eq!(done.chunk_len as usize, m.len(), "seed {seed} step {step}");
                }
            }
            40..=64 => {
                let (offset, len) = random_range(&mut rng);
                let got = e.read(c, offset, len).expect("read");
                let want = model.get(&c).map(|m| model_read(m, offset as usize, len as usize));
                assert!(
                    got == want.unwrap_or_default(),
                    "seed {seed} step {step}: read {c} at {offset}+{len}"
                );
            }
            65..=72 => {
                let len = match rng.below(3) {
                    0 => 0,
                    1 => rng.below(CHUNK_SPAN / 4096) * 4096,
                    _ => rng.below(CHUNK_SPAN),
                } as u32;
                e.truncate(c, len).expect("truncate");
                model.entry(c).or_default().resize(len as usize, 0);
            }
            73..=82 => {
                let (offset, len) = random_range(&mut rng);
                e.punch(c, offset, len).expect("punch");
                if let Some(m) = model.get_mut(&c) {
                    model_punch(m, offset as usize, len as usize);
                }
            }
            83..=87 => {
                let existed = e.remove(c).expect("remove");
                assert_eq!(existed, model.remove(&c).is_some(), "seed {seed} step {step}");
            }
            88 => {
                let object = c.object;
                let count = e.remove_object(object).expect("remove object");
                let before = model.len();
                model.retain(|k, _| k.object != object);
                assert_eq!(count as usize, before - model.len(), "seed {seed} step {step}");
            }
            89..=92 => {
                e.sync().expect("sync");
                let space = e.space();
                assert_eq!(space.reclaimable_bytes, 0);
                let bound: u64 =
                    model.values().map(|m| (m.len() as u64).div_ceil(4096) * 4096).sum();
                assert!(
                    space.used_bytes <= bound,
                    "seed {seed} step {step}: {} bytes used for {bound} bytes of chunks",
                    space.used_bytes
                );
            }
            93..=94 => {
                let len = e.chunk_len(c).expect("chunk_len");
                assert_eq!(len, model.get(&c).map(|m| m.len() as u32), "seed {seed} step {step}");
            }
            95..=96 => {
                // Past the chunk limit: refused, nothing changes.
                let err = e.write(c, CHUNK_BYTES_MAX - 10, &[1; 20], None).expect_err("too big");
                assert!(matches!(err, EngineError::TooBig { .. }));
            }
            _ => {
                // Clean close and reopen: everything must come back.
                drop(engine.take());
                engine = Some(Engine::open(array.clone(), &dir).expect("reopen"));
            }
        }
        if step % 50 == 49 {
            check_all(engine.as_ref().expect("open"), &model, seed, step);
        }
    }
    let e = engine.as_ref().expect("open");
    check_all(e, &model, seed, steps);
    // Removing everything gives all the space back.
    for object in 1..=2 {
        e.remove_object(ObjectId(object)).expect("remove object");
    }
    e.sync().expect("sync");
    let space = e.space();
    assert_eq!(space.used_bytes, 0, "seed {seed}: space leaked");
    assert_eq!(space.free_bytes, space.total_bytes);
    drop(engine);
}

#[test]
fn random_operations_match_the_model() {
    for seed in seeds(6) {
        run(seed, 400);
    }
}
