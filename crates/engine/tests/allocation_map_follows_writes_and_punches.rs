//! Property test of the allocation queries volumes rely on: after random writes, punches,
//! discards, truncates and removes, `mapped_runs` names exactly the blocks a model says hold
//! data, `object_usage` adds them up per object, and reads still match the bytes. `discard`
//! removes a chunk once nothing in it is mapped. Each run prints its seed;
//! `STRIA_ENGINE_SEED=<n>` replays one.

mod common;

use std::collections::BTreeMap;

use common::*;
use stria_engine::{Engine, ObjectUsage};
use stria_proto::fs::{CHUNK_BYTES_MAX, ChunkId, ObjectId, TargetId};

const CHUNK_SPAN: u64 = 256 * 1024;
const B: usize = 4096;

/// A chunk in the model: its bytes and which logical blocks are mapped.
#[derive(Default, Clone)]
struct ModelChunk {
    bytes: Vec<u8>,
    mapped: Vec<bool>,
}

impl ModelChunk {
    fn write(&mut self, offset: usize, data: &[u8]) {
        model_write(&mut self.bytes, offset, data);
        let slots = self.bytes.len().div_ceil(B);
        self.mapped.resize(slots, false);
        for block in offset / B..=(offset + data.len() - 1) / B {
            self.mapped[block] = true;
        }
    }

    /// The engine's punch: blocks wholly inside the range (up to the chunk end) are unmapped,
    /// mapped edge blocks are rewritten and stay mapped.
    fn punch(&mut self, offset: usize, len: usize) {
        let end = (offset + len).min(self.bytes.len());
        if offset >= end {
            return;
        }
        model_punch(&mut self.bytes, offset, len);
        for block in offset / B..=(end - 1) / B {
            let whole = offset <= block * B && end >= ((block + 1) * B).min(self.bytes.len());
            if whole {
                self.mapped[block] = false;
            }
        }
    }

    fn truncate(&mut self, len: usize) {
        self.bytes.resize(len, 0);
        self.mapped.resize(len.div_ceil(B), false);
    }

    fn runs(&self) -> Vec<(u32, u32)> {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for (i, &m) in self.mapped.iter().enumerate() {
            if !m {
                continue;
            }
            match runs.last_mut() {
                Some((first, n)) if *first + *n == i as u32 => *n += 1,
                _ => runs.push((i as u32, 1)),
            }
        }
        runs
    }

    fn mapped_blocks(&self) -> u64 {
        self.mapped.iter().filter(|&&m| m).count() as u64
    }
}

fn random_range(rng: &mut Rng) -> (u32, u32) {
    let offset = match rng.below(3) {
        0 => rng.below(CHUNK_SPAN / B as u64) * B as u64,
        _ => rng.below(CHUNK_SPAN),
    };
    let len = match rng.below(5) {
        0 => rng.below(600),
        1 => B as u64 * (1 + rng.below(8)),
        2 => rng.below(CHUNK_SPAN),
        _ => rng.below(24 * 1024),
    };
    (offset as u32, len as u32)
}

fn check(engine: &Engine, model: &BTreeMap<ChunkId, ModelChunk>, seed: u64, step: usize) {
    for object in 1..=2u64 {
        let mut want = ObjectUsage::default();
        for (c, m) in model.iter().filter(|(c, _)| c.object.0 == object) {
            want.chunks += 1;
            want.mapped_blocks += m.mapped_blocks();
            let runs = engine.mapped_runs(*c).expect("mapped_runs");
            assert_eq!(runs, m.runs(), "seed {seed} step {step}: runs of {c}");
            let got = engine.read(*c, 0, CHUNK_BYTES_MAX).expect("read");
            assert!(got == m.bytes, "seed {seed} step {step}: bytes of {c}");
        }
        let usage = engine.object_usage(ObjectId(object)).expect("object_usage");
        assert_eq!(usage, want, "seed {seed} step {step}: usage of object {object}");
        assert_eq!(usage.allocated_bytes(), want.mapped_blocks * B as u64);
    }
}

fn run(seed: u64, steps: usize) {
    println!("allocation map seed {seed}");
    let mut rng = Rng::new(seed);
    let (_drives, array) = raid5(24);
    let dir = temp_dir("allocmap");
    let engine = Engine::create(array, &dir, TargetId(1)).expect("create");
    let mut model: BTreeMap<ChunkId, ModelChunk> = BTreeMap::new();
    for step in 0..steps {
        let c = chunk(1 + rng.below(2), rng.below(3));
        match rng.below(100) {
            0..=44 => {
                let (offset, len) = random_range(&mut rng);
                let data = rng.bytes(len as usize);
                engine.write(c, offset, &data, None).expect("write");
                if !data.is_empty() {
                    model.entry(c).or_default().write(offset as usize, &data);
                }
            }
            45..=59 => {
                let (offset, len) = random_range(&mut rng);
                engine.punch(c, offset, len).expect("punch");
                if let Some(m) = model.get_mut(&c) {
                    m.punch(offset as usize, len as usize);
                }
            }
            60..=79 => {
                let (offset, len) = random_range(&mut rng);
                let removed = engine.discard(c, offset, len).expect("discard");
                let mut emptied = false;
                if let Some(m) = model.get_mut(&c) {
                    m.punch(offset as usize, len as usize);
                    emptied = m.mapped_blocks() == 0;
                }
                if emptied {
                    model.remove(&c);
                }
                assert_eq!(removed, emptied, "seed {seed} step {step}: discard {c}");
            }
            80..=87 => {
                let len = rng.below(CHUNK_SPAN) as usize;
                engine.truncate(c, len as u32).expect("truncate");
                model.entry(c).or_default().truncate(len);
            }
            88..=91 => {
                engine.remove(c).expect("remove");
                model.remove(&c);
            }
            92..=94 => engine.sync().expect("sync"),
            _ => {
                // A whole-chunk discard always removes the chunk.
                let removed = engine.discard(c, 0, CHUNK_BYTES_MAX).expect("discard all");
                assert_eq!(removed, model.remove(&c).is_some(), "seed {seed} step {step}");
                assert_eq!(engine.chunk_len(c).expect("chunk_len"), None);
            }
        }
        if step % 20 == 19 {
            check(&engine, &model, seed, step);
        }
    }
    check(&engine, &model, seed, steps);
    assert_eq!(engine.space().chunks, model.len() as u64, "seed {seed}: chunk count");
    drop(engine);
}

#[test]
fn mapped_runs_and_usage_match_the_model() {
    for seed in seeds(4) {
        run(seed, 300);
    }
}

#[test]
fn discard_frees_the_blocks_of_an_emptied_chunk() {
    let (_drives, array) = raid5(24);
    let dir = temp_dir("discard");
    let engine = Engine::create(array, &dir, TargetId(1)).expect("create");
    let c = chunk(7, 0);
    engine.write(c, 0, &vec![5u8; 64 * 1024], None).expect("write");
    engine.sync().expect("sync");
    let used = engine.space().used_bytes;
    assert!(used >= 64 * 1024);
    assert_eq!(engine.mapped_runs(c).expect("runs"), vec![(0, 16)]);

    // Unaligned: the edge blocks are rewritten with zeros and stay mapped, the chunk stays.
    assert!(!engine.discard(c, 100, 20_000).expect("discard part"));
    assert_eq!(engine.mapped_runs(c).expect("runs"), vec![(0, 1), (4, 12)]);
    let bytes = engine.read(c, 0, 64 * 1024).expect("read");
    assert!(bytes[..100].iter().all(|&b| b == 5));
    assert!(bytes[100..20_100].iter().all(|&b| b == 0));
    assert!(bytes[20_100..].iter().all(|&b| b == 5));

    // The rest, in two pieces: the second one leaves nothing mapped and removes the chunk.
    assert!(!engine.discard(c, 0, 4096).expect("discard head"));
    assert!(engine.discard(c, 16 * 1024, 48 * 1024).expect("discard tail"));
    assert_eq!(engine.chunk_len(c).expect("len"), None);
    assert_eq!(engine.read(c, 0, 4096).expect("read"), Vec::<u8>::new());
    assert_eq!(engine.object_usage(c.object).expect("usage"), ObjectUsage::default());
    engine.sync().expect("sync");
    assert_eq!(engine.space().used_bytes, 0, "every block is free again");
    assert_eq!(engine.space().chunks, 0);
    // A missing chunk stays missing.
    assert!(!engine.discard(c, 0, 4096).expect("discard missing"));
    assert_eq!(engine.mapped_runs(c).expect("runs"), Vec::new());
    drop(engine);
}
