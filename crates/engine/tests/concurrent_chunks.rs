//! Many threads at once: each writes and reads back its own chunks, several share one chunk
//! (disjoint unaligned ranges, so edge blocks are read-modify-written concurrently), and one
//! thread syncs now and then. Every read must match what its thread wrote. The read cache is
//! on and small, so cached blocks are evicted, freed and reused under the readers.

mod common;

use std::sync::Arc;
use std::thread;

use common::*;
use stria_engine::Engine;
use stria_proto::fs::TargetId;

const THREADS: u64 = 8;
const SHARED_PIECE: usize = 3001;

#[test]
fn threads_writing_their_own_chunks_read_back_their_data() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("concurrency");
    let engine = Arc::new(Engine::create(array.clone(), &dir, TargetId(1)).expect("create"));
    engine.set_read_cache_bytes(512 * 1024);
    let shared = chunk(100, 0);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let engine = engine.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(1000 + t);
                let mut mine: Vec<Vec<u8>> = vec![Vec::new(); 3];
                for round in 0..120u64 {
                    let i = rng.below(3);
                    let c = chunk(t + 1, i);
                    let offset = rng.below(128 * 1024) as usize;
                    let len = rng.below(40 * 1024) as usize + 1;
                    let data = rng.bytes(len);
                    engine
                        .write(c, offset as u32, &data, Some(crc32c::crc32c(&data)))
                        .expect("write");
                    model_write(&mut mine[i as usize], offset, &data);
                    let got = engine.read(c, 0, 1 << 20).expect("read");
                    assert!(got == mine[i as usize], "thread {t} round {round}: chunk {c}");
                    // Piece `round` of this thread in the shared chunk.
                    let at = ((round * THREADS + t) as usize) * SHARED_PIECE;
                    let piece = vec![(t as u8) << 4 | (round % 16) as u8; SHARED_PIECE];
                    engine.write(shared, at as u32, &piece, None).expect("shared write");
                    if t == 0 && round % 20 == 0 {
                        engine.sync().expect("sync");
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let got = engine.read(shared, 0, 16 << 20).expect("read shared");
    assert_eq!(got.len(), (120 * THREADS as usize) * SHARED_PIECE);
    for (k, piece) in got.chunks(SHARED_PIECE).enumerate() {
        let (round, t) = (k as u64 / THREADS, k as u64 % THREADS);
        let want = (t as u8) << 4 | (round % 16) as u8;
        assert!(piece.iter().all(|&b| b == want), "shared piece {k} (thread {t} round {round})");
    }
    assert_eq!(engine.space().chunks, THREADS * 3 + 1);
    drop(engine);
}
