//! CI's short fuzz run, on stable Rust: every target replays every file of its corpus
//! (`fuzz/corpus/<target>/`) and every generated seed, then a deterministic mutation loop
//! (bit flips, byte inserts and deletes, splices, interesting values such as 0, 0xff and
//! `u32::MAX` lengths) feeds it a few thousand inputs. Any panic, including one that tokio
//! caught inside a task, or any property violation fails the test; the failing input is
//! written to a file whose path is printed.
//!
//! `STRIA_FUZZ_ITERS` sets the mutations per target, `STRIA_FUZZ_SEED` the seed (printed by
//! every run), and `STRIA_FUZZ_WRITE_SEEDS=1` rewrites the generated seeds into the corpus.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use stria_engine::testing::Rng;
use stria_fuzzing::{TARGETS, Target};

#[global_allocator]
static ALLOC: stria_fuzzing::TrackingAlloc = stria_fuzzing::TrackingAlloc;

/// Mutated inputs per target when `STRIA_FUZZ_ITERS` is not set.
const ITERS_DEFAULT: u64 = 4000;
/// The NBD targets run a whole server session per input; they get a fraction of the inputs.
const SESSION_TARGET_SHARE: u64 = 2;
/// Longest mutated input: enough for a few frames or requests with payloads.
const INPUT_BYTES_MAX: usize = 64 * 1024;

thread_local! {
    static PANICS_HERE: Cell<u64> = const { Cell::new(0) };
}
/// Panics on threads that are not test threads (tokio's blocking pool, spawned threads).
static PANICS_ELSEWHERE: AtomicU64 = AtomicU64::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS_HERE.with(|p| p.set(p.get() + 1));
            if std::thread::current().name().is_none_or(|n| n.starts_with("tokio")) {
                PANICS_ELSEWHERE.fetch_add(1, Ordering::Relaxed);
            }
            default(info);
        }));
    });
}

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs one input; on any panic (direct or swallowed by a runtime), saves it and fails.
fn run_one(name: &str, target: Target, input: &[u8], what: &str) {
    let before = (PANICS_HERE.with(Cell::get), PANICS_ELSEWHERE.load(Ordering::Relaxed));
    let outcome = catch_unwind(AssertUnwindSafe(|| target(input)));
    let after = (PANICS_HERE.with(Cell::get), PANICS_ELSEWHERE.load(Ordering::Relaxed));
    if outcome.is_err() || after != before {
        let path = std::env::temp_dir().join(format!("stria-fuzz-{name}-failure"));
        let saved = std::fs::write(&path, input).is_ok();
        panic!(
            "target {name} failed on {what} ({} bytes){}; replay with \
             `cargo +nightly fuzz run {name} {}`",
            input.len(),
            if saved { format!(", input saved to {}", path.display()) } else { String::new() },
            path.display()
        );
    }
}

/// A value in `0..n` from the engine's test generator (xorshift64*), reproducible from the
/// printed seed.
fn below(rng: &mut Rng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

const INTERESTING: &[u64] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x200,
    0x1000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    u64::MAX >> 1,
    u64::MAX,
];

fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + below(rng, 4) {
        match below(rng, 8) {
            0 if !v.is_empty() => {
                let at = below(rng, v.len());
                v[at] ^= 1 << below(rng, 8);
            }
            1 if !v.is_empty() => {
                let at = below(rng, v.len());
                v[at] = [0u8, 0xff, 0x7f, 0x80, 1][below(rng, 5)];
            }
            2 => {
                let at = below(rng, v.len() + 1);
                let n = 1 + below(rng, 16);
                let fill: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(at..at, fill);
            }
            3 if !v.is_empty() => {
                let at = below(rng, v.len());
                let n = (1 + below(rng, 32)).min(v.len() - at);
                v.drain(at..at + n);
            }
            4 if v.len() >= 8 => {
                // An interesting integer, 2, 4 or 8 bytes wide, either byte order.
                let width = [2usize, 4, 8][below(rng, 3)];
                let at = below(rng, v.len() - width + 1);
                let value = INTERESTING[below(rng, INTERESTING.len())];
                let bytes =
                    if below(rng, 2) == 0 { value.to_le_bytes() } else { value.to_be_bytes() };
                let bytes = if below(rng, 2) == 0 { &bytes[..width] } else { &bytes[8 - width..] };
                v[at..at + width].copy_from_slice(bytes);
            }
            5 if !other.is_empty() => {
                // Splice: our head, the other input's tail.
                let cut = below(rng, v.len() + 1);
                let from = below(rng, other.len());
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            6 if !v.is_empty() => {
                // Repeat a slice (a pipelined request or frame, twice).
                let at = below(rng, v.len());
                let n = (1 + below(rng, 256)).min(v.len() - at);
                let piece = v[at..at + n].to_vec();
                let to = below(rng, v.len() + 1);
                v.splice(to..to, piece);
            }
            7 => v.truncate(below(rng, v.len() + 1)),
            _ => {}
        }
    }
    v.truncate(INPUT_BYTES_MAX);
    v
}

fn run_target(name: &str) {
    count_panics();
    let target = TARGETS.iter().find(|(n, _)| *n == name).map(|&(_, t)| t).expect("target");
    let generated: Vec<Vec<u8>> = stria_fuzzing::seeds::all()
        .into_iter()
        .filter(|(t, _, _)| *t == name)
        .map(|(_, seed, bytes)| {
            if std::env::var("STRIA_FUZZ_WRITE_SEEDS").is_ok_and(|v| v == "1") {
                let dir = corpus_dir(name);
                std::fs::create_dir_all(&dir).expect("corpus dir");
                std::fs::write(dir.join(&seed), &bytes).expect("write seed");
            }
            bytes
        })
        .collect();
    let mut corpus = generated;
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(name))
        .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    assert!(!files.is_empty(), "no corpus files for {name} in {}", corpus_dir(name).display());
    for file in &files {
        let bytes = std::fs::read(file).expect("read corpus file");
        run_one(name, target, &bytes, &format!("corpus file {}", file.display()));
        corpus.push(bytes);
    }
    let seed = env_u64("STRIA_FUZZ_SEED").unwrap_or(0x5712_1a00_f022_0001);
    let mut iters = env_u64("STRIA_FUZZ_ITERS").unwrap_or(ITERS_DEFAULT);
    if name.starts_with("nbd_") && std::env::var("STRIA_FUZZ_ITERS").is_err() {
        iters /= SESSION_TARGET_SHARE;
    }
    println!(
        "{name}: {} corpus inputs, {iters} mutations, STRIA_FUZZ_SEED={seed:#x}",
        corpus.len()
    );
    // Each target gets its own stream, so adding a target does not change the others' inputs.
    let name_hash = name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let mut rng = Rng(seed ^ name_hash | 1);
    for i in 0..iters {
        let base = &corpus[below(&mut rng, corpus.len())];
        let other = &corpus[below(&mut rng, corpus.len())];
        let input = mutate(&mut rng, base, other);
        run_one(name, target, &input, &format!("mutation {i} of seed {seed:#x}"));
    }
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_target(stringify!($name));
            }
        )*

        #[test]
        fn every_target_is_tested() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in TARGETS {
                assert!(tested.contains(name), "target {name} has no test here");
            }
        }
    };
}

targets!(
    rpc_frame,
    postcard_messages,
    nbd_handshake,
    nbd_transmission,
    rest_body,
    drive_superblock,
    raid_journal,
    engine_records,
    meta_records,
);
