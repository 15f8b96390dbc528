//! The read cache of small-I/O blocks: reads it answers are the bytes last written, through
//! overwrites, block reuse after removes and syncs, and large writes over cached blocks; a
//! cached block whose bytes no longer match the chunk map's CRC fails the read once and the
//! next read goes to the array.

mod common;

use std::collections::HashMap;

use common::*;
use stria_engine::Engine;
use stria_proto::fs::TargetId;

#[test]
fn cached_reads_always_return_the_last_write() {
    for seed in seeds(3) {
        let (_drives, array) = raid5(16);
        let dir = temp_dir("read-cache");
        let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
        // Small enough that blocks are evicted and freed blocks are reused while cached.
        engine.set_read_cache_bytes(256 * 1024);
        let mut rng = Rng::new(seed);
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        for step in 0..3000 {
            let object = rng.below(40) + 1;
            match rng.below(10) {
                // Small writes (packed or not) and large ones (bypass, invalidate).
                0..=4 => {
                    let blocks =
                        if rng.below(8) == 0 { 20 + rng.below(12) } else { 1 + rng.below(3) };
                    let offset = rng.below(4) as usize * 4096;
                    let data = rng.bytes(blocks as usize * 4096);
                    engine.write(chunk(object, 0), offset as u32, &data, None).expect("write");
                    model_write(model.entry(object).or_default(), offset, &data);
                }
                5 => {
                    engine.remove(chunk(object, 0)).expect("remove");
                    model.remove(&object);
                }
                6 => engine.sync().expect("sync"),
                7 => {
                    // Any range: the cache's buffers and array runs, trimmed to the bytes asked.
                    let offset = rng.below(40_000) as usize;
                    let len = rng.below(40_000) as usize;
                    let parts = engine.read_parts(chunk(object, 0), offset as u32, len as u32);
                    let parts = parts.expect("read");
                    assert!(parts.iter().all(|p| !p.is_empty()), "seed {seed} step {step}");
                    let want = model.get(&object).cloned().unwrap_or_default();
                    let want = &want[offset.min(want.len())..(offset + len).min(want.len())];
                    assert!(parts.concat() == want, "seed {seed} step {step}: {offset}+{len}");
                }
                _ => {
                    let got = engine.read(chunk(object, 0), 0, 1 << 20).expect("read");
                    let want = model.get(&object).cloned().unwrap_or_default();
                    assert!(got == want, "seed {seed} step {step}: object {object} reads back");
                }
            }
        }
        engine.sync().expect("sync");
        assert!(engine.read_cache_stats().held_bytes > 0, "the cache was used");
        for (object, want) in &model {
            assert!(engine.read(chunk(*object, 0), 0, 1 << 20).expect("read") == *want);
        }
    }
}

#[test]
fn a_read_from_memory_only_never_touches_the_array() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("read-cache-memory");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    let data = vec![9u8; 8192];
    engine.write(chunk(1, 0), 0, &data, None).expect("write");
    // In the open stripe's image: answered from memory even with the cache off.
    let in_memory = |chunk| engine.read_if_in_memory(chunk, 0, 8192).expect("read");
    assert_eq!(in_memory(chunk(1, 0)).map(|p| p.concat()), Some(data.clone()));
    engine.sync().expect("sync");
    assert_eq!(in_memory(chunk(1, 0)), None, "cache off");
    engine.set_read_cache_bytes(1 << 20);
    assert_eq!(engine.read(chunk(1, 0), 0, 8192).expect("read"), data, "fills the cache");
    let reads = array.status().members.iter().map(|m| m.read_ops).sum::<u64>();
    let cached = in_memory(chunk(1, 0)).expect("cached");
    assert_eq!(cached.concat(), data);
    assert_eq!(array.status().members.iter().map(|m| m.read_ops).sum::<u64>(), reads);
    // Cached blocks are handed out as the cache's buffers, not copies.
    let again = engine.read_parts(chunk(1, 0), 0, 8192).expect("read");
    assert_eq!(cached.len(), 2);
    assert!(cached.iter().zip(&again).all(|(a, b)| a.as_ptr() == b.as_ptr()), "a copy");
    assert_eq!(in_memory(chunk(2, 0)), Some(vec![]), "missing");
}

#[test]
fn a_read_tried_from_memory_then_the_array_counts_its_lookups_once() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("read-cache-counts");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    engine.set_read_cache_bytes(1 << 20);
    // 20 blocks written at once (a large write: not cached), then the first 4 read (cached).
    let data = vec![5u8; 20 * 4096];
    engine.write(chunk(1, 0), 0, &data, None).expect("write");
    engine.sync().expect("sync");
    assert_eq!(engine.read(chunk(1, 0), 0, 4 * 4096).expect("read"), data[..4 * 4096]);
    let before = engine.read_cache_stats();
    // A read from memory only (16 blocks) finds the first 4 and gives up: nothing counts yet.
    assert_eq!(engine.read_if_in_memory(chunk(1, 0), 0, 16 * 4096).expect("read"), None);
    let tried = engine.read_cache_stats();
    assert_eq!((tried.hits, tried.misses), (before.hits, before.misses), "counted a retried read");
    // The same read served from the array counts once: 4 hits, 1 run missed.
    assert_eq!(engine.read(chunk(1, 0), 0, 16 * 4096).expect("read"), data[..16 * 4096]);
    let served = engine.read_cache_stats();
    assert_eq!((served.hits - before.hits, served.misses - before.misses), (4, 1));
    // A read served from memory counts too.
    assert!(engine.read_if_in_memory(chunk(1, 0), 0, 4 * 4096).expect("read").is_some());
    let from_memory = engine.read_cache_stats();
    assert_eq!((from_memory.hits - served.hits, from_memory.misses - served.misses), (4, 0));
}

/// A large read is answered from memory when all of it is cached; after one misses, the next
/// 16 large reads are not tried (streams of uncached reads pay for few tries), small reads
/// still are, and a read over 1 MiB never is.
#[test]
fn large_reads_from_memory_back_off_after_a_miss() {
    let (_drives, array) = raid5(16);
    let dir = temp_dir("read-cache-large");
    let engine = Engine::create(array.clone(), &dir, TargetId(1)).expect("create");
    engine.set_read_cache_bytes(16 << 20);
    let cached = Rng::new(7).bytes(64 * 4096);
    let uncached = Rng::new(8).bytes(64 * 4096);
    let huge = Rng::new(9).bytes(300 * 4096);
    engine.write(chunk(1, 0), 0, &cached, None).expect("write");
    engine.write(chunk(2, 0), 0, &uncached, None).expect("write");
    engine.write(chunk(3, 0), 0, &huge, None).expect("write");
    engine.sync().expect("sync");
    // Large reads fill the cache from their second read on.
    for _ in 0..2 {
        assert_eq!(engine.read(chunk(1, 0), 0, cached.len() as u32).expect("read"), cached);
        assert_eq!(engine.read(chunk(3, 0), 0, huge.len() as u32).expect("read"), huge);
    }
    let large = |c| engine.read_if_in_memory(c, 0, 64 * 4096).expect("read").map(|p| p.concat());
    assert_eq!(large(chunk(1, 0)), Some(cached.clone()), "a cached large read");
    let reads = array.status().members.iter().map(|m| m.read_ops).sum::<u64>();
    assert_eq!(large(chunk(2, 0)), None, "an uncached one");
    for i in 0..16 {
        assert_eq!(large(chunk(1, 0)), None, "large read {i} after the miss is not tried");
        let small = engine.read_if_in_memory(chunk(1, 0), 0, 4 * 4096).expect("read");
        assert_eq!(small.map(|p| p.concat()), Some(cached[..4 * 4096].to_vec()), "small {i}");
    }
    assert_eq!(large(chunk(1, 0)), Some(cached.clone()), "tried again after 16");
    assert_eq!(array.status().members.iter().map(|m| m.read_ops).sum::<u64>(), reads);
    let over = engine.read_if_in_memory(chunk(3, 0), 0, huge.len() as u32).expect("read");
    assert_eq!(over, None, "a read over 1 MiB is left to the blocking path");
    assert_eq!(engine.read_parts(chunk(3, 0), 0, huge.len() as u32).expect("read").concat(), huge);
}
