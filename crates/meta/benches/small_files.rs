//! The metadata work of creating and removing small files, on a store in a real file with
//! lazy commits (as `stria up` runs it), without FUSE or storage in the way.
//!
//! Per file, the calls the mount makes for `open(O_CREAT|O_EXCL)`, a 4 KiB write and
//! `close`: a lookup that misses, the create, the open, the spill to chunks with its size,
//! the size check at close, the release. Then one unlink per file. Threads work in their own
//! directories, as `mdbench.py` processes do.
//!
//! ```text
//! cargo bench -p stria-meta --bench small_files            # 2 threads x 20,000 files
//! THREADS=4 FILES=50000 cargo bench -p stria-meta --bench small_files
//! ```

use std::sync::Arc;
use std::time::Instant;

use stria_meta::{Caller, Commit, Meta, MetaOptions, Spilled, Timestamp};
use stria_proto::fs::{ROOT_INO, TargetId};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let threads = env("THREADS", 2).max(1);
    let files = env("FILES", 20_000).max(1);
    let dir = std::env::temp_dir().join(format!("stria-meta-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench directory");
    let options = MetaOptions {
        commit: Commit::Lazy,
        resolver: Arc::new(|_: &str| (1..=4).map(TargetId).collect()),
        ..MetaOptions::default()
    };
    let meta = Arc::new(Meta::open(dir.join("namespace.redb"), options).expect("open"));
    let caller = Caller::root();
    let dirs: Vec<_> = (0..threads)
        .map(|t| {
            meta.mkdir(ROOT_INO, format!("p{t}").as_bytes(), 0o755, &caller).expect("mkdir").ino
        })
        .collect();

    let phase = |name: &str, work: &(dyn Fn(u64, usize) + Sync)| {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for &parent in &dirs {
                scope.spawn(move || (0..files).for_each(|i| work(parent, i)));
            }
        });
        let secs = start.elapsed().as_secs_f64();
        let ops = threads * files;
        println!(
            "phase={name} threads={threads} files={ops} secs={secs:.3} ops_per_s={:.0}",
            ops as f64 / secs
        );
    };

    phase("create", &|parent, i| {
        let name = format!("f{i}");
        assert!(meta.lookup(parent, name.as_bytes(), &caller).is_err(), "{name} exists");
        let attr = meta.create(parent, name.as_bytes(), 0o644, &caller).expect("create");
        meta.open_file(attr.ino, 1).expect("open");
        // The first write: an empty file moves to chunks with its new size in one commit
        // (`SpillSized`); the close then finds the size published (a read).
        let mtime = Timestamp::now();
        let spilled = meta.spill(attr.ino, Some((4096, mtime))).expect("spill");
        assert!(matches!(spilled, Spilled::Chunked(_)), "{spilled:?}");
        meta.extend_size(attr.ino, 4096, mtime).expect("size");
        meta.release(attr.ino, 1).expect("release");
    });
    assert_eq!(meta.usage_total().expect("usage").files, (threads * files) as u64);
    phase("remove", &|parent, i| {
        meta.unlink(parent, format!("f{i}").as_bytes(), &caller).expect("unlink");
    });
    assert_eq!(meta.usage_total().expect("usage").files, 0);
    drop(meta);
    std::fs::remove_dir_all(&dir).expect("remove bench directory");
}
