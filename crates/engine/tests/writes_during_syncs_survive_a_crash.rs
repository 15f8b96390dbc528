//! Writers go on while a sync runs (it holds the commit lock only to take its batch of staged
//! changes). Two writer threads change their own chunks while a third thread syncs over and
//! over; then the writers stop and power is lost with the syncs still going. After a reopen
//! every chunk reads as a state it had, no older than the last state acknowledged before the
//! last sync that completed before the crash; never garbage, never a checksum error.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use stria_engine::testing::MemMapStore;
use stria_engine::{Engine, EngineError};
use stria_proto::fs::{CHUNK_BYTES_MAX, ChunkId, TargetId};

const WRITERS: u64 = 2;
const CHUNKS_PER_WRITER: u64 = 3;

/// Every state each chunk went through, in order (None = absent); a state is recorded once
/// the call that made it returned.
type States = Vec<Option<Vec<u8>>>;

struct Shared {
    chunks: Vec<(ChunkId, Mutex<States>)>,
    stop_writers: AtomicBool,
    stop_syncs: AtomicBool,
}

fn writer(shared: &Shared, engine: &Engine, index: u64, seed: u64) {
    let mut rng = Rng::new(seed ^ ((index + 1) * 0x9e37));
    let mine: Vec<usize> =
        (0..CHUNKS_PER_WRITER).map(|k| (index * CHUNKS_PER_WRITER + k) as usize).collect();
    while !shared.stop_writers.load(Ordering::Relaxed) {
        let (c, states) = &shared.chunks[mine[rng.below(mine.len() as u64) as usize]];
        let mut states = states.lock().expect("states");
        let now = states.last().cloned().flatten();
        match rng.below(10) {
            0..=7 => {
                let offset = rng.below(64 * 1024) as usize;
                let len = rng.below(24 * 1024) as usize + 1;
                let data = rng.bytes(len);
                match engine.write(*c, offset as u32, &data, None) {
                    Ok(_) => {
                        let mut m = now.unwrap_or_default();
                        model_write(&mut m, offset, &data);
                        states.push(Some(m));
                    }
                    // After the power loss the map store may refuse; the run is ending.
                    Err(EngineError::NoSpace { .. } | EngineError::Poisoned(_)) => {}
                    Err(e) => panic!("write: {e}"),
                }
            }
            _ => {
                if engine.remove(*c).is_ok() && now.is_some() {
                    states.push(None);
                }
            }
        }
    }
}

fn run(seed: u64) {
    let mut rng = Rng::new(seed);
    let (_drives, array) = raid5(8);
    let store = MemMapStore::new();
    let engine = Arc::new(
        Engine::create_with_backend(array.clone(), store.backend(), TargetId(3)).expect("create"),
    );
    engine.sync().expect("first sync");
    let shared = Arc::new(Shared {
        chunks: (0..WRITERS * CHUNKS_PER_WRITER)
            .map(|i| {
                (chunk(1 + i / CHUNKS_PER_WRITER, i % CHUNKS_PER_WRITER), Mutex::new(vec![None]))
            })
            .collect(),
        stop_writers: AtomicBool::new(false),
        stop_syncs: AtomicBool::new(false),
    });
    // For each chunk, how many of its states existed when the last sync that completed before
    // the crash was called: the states before the last of those are history.
    let floors = Arc::new(Mutex::new(vec![1usize; shared.chunks.len()]));
    let crashed = Arc::new(Mutex::new(false));
    let mut writers = Vec::new();
    for index in 0..WRITERS {
        let (shared, engine) = (shared.clone(), engine.clone());
        writers.push(std::thread::spawn(move || writer(&shared, &engine, index, seed)));
    }
    let syncer = {
        let (shared, engine) = (shared.clone(), engine.clone());
        let (floors, crashed) = (floors.clone(), crashed.clone());
        std::thread::spawn(move || {
            while !shared.stop_syncs.load(Ordering::Relaxed) {
                let before: Vec<usize> =
                    shared.chunks.iter().map(|(_, s)| s.lock().expect("states").len()).collect();
                if engine.sync().is_ok() && !*crashed.lock().expect("crashed") {
                    // Returned before the power loss: everything acknowledged before the call
                    // is durable.
                    *floors.lock().expect("floors") = before;
                }
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(20 + rng.below(200)));
    // Power is lost with the syncs still going (perhaps in the middle of one), but with the
    // writers stopped: the array here outlives the map store, and a write after the crash
    // could reuse blocks that a doomed sync freed, which no real power loss allows.
    shared.stop_writers.store(true, Ordering::Relaxed);
    for t in writers {
        t.join().expect("writer");
    }
    {
        let mut crashed = crashed.lock().expect("crashed");
        store.crash(rng.chance(30));
        *crashed = true;
    }
    shared.stop_syncs.store(true, Ordering::Relaxed);
    syncer.join().expect("syncer");
    let engine = Arc::into_inner(engine).expect("threads are done");
    // Drop runs its final sync into the dead boot: nothing of it survives.
    drop(engine);
    let engine = Engine::open_with_backend(array, store.backend())
        .unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
    let floors = floors.lock().expect("floors").clone();
    let mut live = 0;
    for ((c, states), floor) in shared.chunks.iter().zip(floors) {
        let states = states.lock().expect("states");
        let got = engine
            .read(*c, 0, CHUNK_BYTES_MAX)
            .unwrap_or_else(|e| panic!("seed {seed}: chunk {c} unreadable after the crash: {e}"));
        let got = engine.chunk_len(*c).expect("chunk_len").map(|_| got);
        live += u64::from(got.is_some());
        assert!(
            states[floor - 1..].contains(&got),
            "seed {seed}: chunk {c} came back as a state older than its last synced one, or one \
             it never had ({} states, {} synced; length {:?})",
            states.len(),
            floor,
            got.as_ref().map(Vec::len)
        );
    }
    assert_eq!(engine.space().chunks, live, "seed {seed}: chunk count");
}

#[test]
fn writes_during_syncs_keep_every_synced_state_across_a_crash() {
    for seed in seeds(40) {
        run(seed);
    }
}
