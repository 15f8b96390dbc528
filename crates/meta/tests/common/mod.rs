#![allow(dead_code)]
//! Shared helpers: a namespace in memory with a ticking clock and a 4-target pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use stria_meta::{Caller, Commit, Meta, MetaError, MetaOptions, Timestamp};
use stria_proto::fs::{FsStatus, TargetId};

pub fn options() -> MetaOptions {
    let tick = Arc::new(AtomicI64::new(1_000));
    MetaOptions {
        commit: Commit::Durable,
        root_mode: 0o777,
        resolver: Arc::new(|pool: &str| match pool {
            "default" => (1..=4).map(TargetId).collect(),
            "fast" => vec![TargetId(10), TargetId(11)],
            _ => Vec::new(),
        }),
        clock: Arc::new(move || Timestamp::new(tick.fetch_add(1, Ordering::Relaxed), 0)),
        ..MetaOptions::default()
    }
}

pub fn meta() -> Meta {
    Meta::open_in_memory(options()).expect("open in memory")
}

pub fn root() -> Caller {
    Caller::root()
}

pub fn alice() -> Caller {
    Caller::new(1000, 1000)
}

pub fn bob() -> Caller {
    Caller::new(1001, 1001)
}

/// The status of an error result, for table-driven checks.
pub fn status<T: std::fmt::Debug>(r: Result<T, MetaError>) -> FsStatus {
    r.expect_err("expected an error").status()
}

pub fn tmp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("stria-meta-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    dir
}

/// The bytes a crash now would leave on disk: a copy of the database file as it stands
/// (commits that are not durable yet are not in it).
pub fn crash_image(path: &std::path::Path, name: &str) -> std::path::PathBuf {
    let image = tmp_path(name);
    std::fs::copy(path, &image).expect("copy the database file");
    image
}
