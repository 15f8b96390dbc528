//! Not a benchmark: a smoke check that creating many entries stays fast (and prints the rate).

mod common;

use std::time::Instant;

use common::*;
use stria_meta::*;
use stria_proto::fs::ROOT_INO;

#[test]
fn ten_thousand_creates_in_one_directory() {
    for commit in [Commit::Durable, Commit::Lazy] {
        let m = Meta::open_in_memory(MetaOptions { commit, ..options() }).expect("open");
        let d = m.mkdir(ROOT_INO, b"d", 0o755, &root()).expect("mkdir");
        let start = Instant::now();
        let n: usize = std::env::var("CREATES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
        for i in 0..n {
            m.create(d.ino, format!("f{i:06}").as_bytes(), 0o644, &root()).expect("create");
        }
        let secs = start.elapsed().as_secs_f64();
        println!("{commit:?}: {n} creates, {:.0} creates/s in memory", n as f64 / secs);
        assert_eq!(m.statfs(0, 0).expect("statfs").inodes_used, n as u64 + 2);
    }
}
