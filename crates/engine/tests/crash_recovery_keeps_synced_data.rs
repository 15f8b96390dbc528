//! Crash recovery: the engine is dropped at random points after its chunk map store has lost
//! power (everything not synced lost, or by chance kept), and reopened. Synced data must be
//! intact, every chunk must read as one of the states it went through since the last sync (never
//! garbage, never a checksum error), and the space map must add up. Objects are cloned now and
//! then (the clones share blocks with their source until either writes them), so blocks named
//! by several records go through overwrites, removals, crashes and reuse too.

mod common;

use std::collections::BTreeMap;

use common::*;
use stria_engine::testing::MemMapStore;
use stria_engine::{Engine, EngineError};
use stria_proto::fs::{CHUNK_BYTES_MAX, ChunkId, ObjectId, TargetId};

/// Each chunk's states since the last sync; the first is the synced one (None = absent).
type History = BTreeMap<ChunkId, Vec<Option<Vec<u8>>>>;

fn current(history: &History, c: ChunkId) -> Option<Vec<u8>> {
    history.get(&c).and_then(|h| h.last().cloned()).flatten()
}

fn record(history: &mut History, c: ChunkId, state: Option<Vec<u8>>) {
    history.entry(c).or_insert_with(|| vec![None]).push(state);
}

/// After a durable commit: each chunk's last state is its synced one.
fn synced(history: &mut History) {
    for h in history.values_mut() {
        let last = h.pop().flatten();
        *h = vec![last];
    }
}

fn run(seed: u64, steps: usize) {
    println!("crash seed {seed}");
    let mut rng = Rng::new(seed);
    // A small array so that freed blocks are reused soon: reuse before a durable commit is the
    // bug this test exists to catch.
    let (_drives, array) = raid5(6);
    let store = MemMapStore::new();
    let mut engine =
        Engine::create_with_backend(array.clone(), store.backend(), TargetId(3)).expect("create");
    engine.sync().expect("first sync");
    let mut history: History = BTreeMap::new();
    let mut crashes = 0;
    // Object 9 and its clones (and clones of clones).
    let mut objects = vec![9u64];
    for step in 0..steps {
        let c = chunk(objects[rng.below(objects.len() as u64) as usize], rng.below(4));
        match rng.below(100) {
            0..=49 => {
                let offset = rng.below(256 * 1024) as u32;
                let len = rng.below(96 * 1024) as usize + 1;
                let data = rng.bytes(len);
                match engine.write(c, offset, &data, None) {
                    Ok(_) => {
                        let mut m = current(&history, c).unwrap_or_default();
                        model_write(&mut m, offset as usize, &data);
                        record(&mut history, c, Some(m));
                    }
                    Err(EngineError::NoSpace { .. }) => {}
                    Err(e) => panic!("seed {seed} step {step}: write: {e}"),
                }
            }
            50..=59 => {
                let len = rng.below(256 * 1024) as u32;
                engine.truncate(c, len).expect("truncate");
                let mut m = current(&history, c).unwrap_or_default();
                m.resize(len as usize, 0);
                record(&mut history, c, Some(m));
            }
            60..=67 => {
                let (offset, len) = (rng.below(256 * 1024) as u32, rng.below(128 * 1024) as u32);
                engine.punch(c, offset, len).expect("punch");
                if let Some(mut m) = current(&history, c) {
                    model_punch(&mut m, offset as usize, len as usize);
                    record(&mut history, c, Some(m));
                }
            }
            68..=75 => {
                engine.remove(c).expect("remove");
                if current(&history, c).is_some() {
                    record(&mut history, c, None);
                }
            }
            76..=82 => {
                engine.sync().expect("sync");
                synced(&mut history);
            }
            83..=87 if objects.len() < 6 => {
                // Each copy is a change like a write: it is in the map at once and durable
                // at the next sync.
                let source = c.object.0;
                let dest = 100 + objects.len() as u64;
                engine.clone_object(ObjectId(source), ObjectId(dest)).expect("clone");
                objects.push(dest);
                let copies: Vec<(ChunkId, Vec<u8>)> = history
                    .keys()
                    .filter(|k| k.object.0 == source)
                    .filter_map(|&k| Some((chunk(dest, k.index), current(&history, k)?)))
                    .collect();
                for (k, state) in copies {
                    record(&mut history, k, Some(state));
                }
            }
            _ => {
                crashes += 1;
                store.crash(rng.chance(30));
                // Drop runs its final sync into the dead boot: nothing of it survives.
                drop(engine);
                engine = Engine::open_with_backend(array.clone(), store.backend())
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: reopen: {e}"));
                for (c, h) in history.iter_mut() {
                    let got = engine.read(*c, 0, CHUNK_BYTES_MAX).unwrap_or_else(|e| {
                        panic!("seed {seed} step {step}: chunk {c} unreadable after crash: {e}")
                    });
                    let got = engine.chunk_len(*c).expect("chunk_len").map(|_| got);
                    let at = h.iter().position(|s| *s == got).unwrap_or_else(|| {
                        panic!(
                            "seed {seed} step {step}: chunk {c} came back in a state it never had \
                             (len {:?}, synced len {:?})",
                            got.as_ref().map(|g| g.len()),
                            h[0].as_ref().map(|g| g.len())
                        )
                    });
                    // Whatever came back is now the state to compare with.
                    *h = vec![h[at].clone()];
                }
                let live = history.values().filter(|h| h[0].is_some()).count() as u64;
                assert_eq!(engine.space().chunks, live, "seed {seed} step {step}: chunk count");
            }
        }
    }
    println!("crash seed {seed}: {crashes} crashes survived, {} clones", objects.len() - 1);
}

#[test]
fn crashes_never_lose_synced_data_nor_expose_garbage() {
    for seed in seeds(8) {
        run(seed, 500);
    }
}

#[test]
fn a_crash_before_any_sync_loses_only_unsynced_writes() {
    let (_drives, array) = raid5(6);
    let store = MemMapStore::new();
    let engine =
        Engine::create_with_backend(array.clone(), store.backend(), TargetId(3)).expect("create");
    let a = chunk(1, 0);
    let b = chunk(1, 1);
    engine.write(a, 0, &[7u8; 10_000], None).expect("write a");
    engine.sync().expect("sync");
    // Overwrite a (its old blocks are parked, not reused) and create b, then lose power.
    engine.write(a, 0, &[8u8; 10_000], None).expect("overwrite a");
    engine.write(b, 100, &[9u8; 50_000], None).expect("write b");
    for i in 0..20 {
        engine.write(chunk(2, i), 0, &[i as u8; 8192], None).expect("fill");
    }
    store.crash(false);
    drop(engine);
    let engine = Engine::open_with_backend(array, store.backend()).expect("reopen");
    assert_eq!(engine.read(a, 0, 20_000).expect("read a"), vec![7u8; 10_000]);
    assert_eq!(engine.chunk_len(b).expect("len b"), None);
    assert_eq!(engine.space().chunks, 1);
    assert_eq!(engine.space().used_bytes, 3 * 4096);
}

#[test]
fn clean_close_keeps_everything_written() {
    let (_drives, array) = raid5(6);
    let dir = temp_dir("clean-close");
    let engine = Engine::create(array.clone(), &dir, TargetId(5)).expect("create");
    engine.write(chunk(4, 2), 5, b"hello, chunk", None).expect("write");
    drop(engine); // no explicit sync: drop flushes and commits durably
    let engine = Engine::open(array, &dir).expect("reopen");
    assert_eq!(engine.target(), TargetId(5));
    assert_eq!(engine.read(chunk(4, 2), 0, 100).expect("read"), b"\0\0\0\0\0hello, chunk");
    drop(engine);
}
