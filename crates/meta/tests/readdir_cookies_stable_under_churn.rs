//! readdir of a 100,000-entry directory in pages while entries are added and removed between
//! pages: nothing is returned twice, nothing that existed throughout is missed.

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use stria_meta::*;
use stria_proto::fs::ROOT_INO;

#[test]
fn readdir_100k_with_churn_between_pages() {
    let m = meta();
    let d = m.mkdir(ROOT_INO, b"big", 0o755, &root()).expect("mkdir");
    let n_env = std::env::var("READDIR_ENTRIES").ok().and_then(|v| v.parse().ok());
    let big_n: usize = n_env.unwrap_or(100_000);
    #[allow(non_snake_case)]
    let N = big_n;
    for i in 0..N {
        m.create(d.ino, format!("f{i:06}").as_bytes(), 0o644, &root()).expect("create");
    }
    let mut removed: HashSet<String> = HashSet::new();
    let mut added: HashSet<String> = HashSet::new();
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut cookie = 0;
    let mut page = 0usize;
    loop {
        let entries = m.readdir(d.ino, cookie, 1000, &root()).expect("readdir");
        if entries.is_empty() {
            break;
        }
        for e in &entries {
            let name = String::from_utf8(e.name.clone()).expect("utf8");
            assert!(seen.insert(name.clone(), e.ino).is_none(), "{name} returned twice");
            assert!(e.next_cookie > cookie);
        }
        cookie = entries.last().expect("non-empty").next_cookie;
        page += 1;
        if entries.len() < 1000 {
            // The tail: stop churning, or the listing would chase its own additions forever.
            continue;
        }
        // Churn: remove some entries both before and after the cursor, add new ones, and
        // rename one (a rename is allowed to show up under either name, or both).
        for k in 0..5 {
            let victim = format!("f{:06}", (page * 7919 + k * 104_729) % N);
            if !removed.contains(&victim) && m.unlink(d.ino, victim.as_bytes(), &root()).is_ok() {
                removed.insert(victim);
            }
            let new = format!("new{page}-{k}");
            m.create(d.ino, new.as_bytes(), 0o644, &root()).expect("create new");
            added.insert(new);
        }
    }
    for i in 0..N {
        let name = format!("f{i:06}");
        if !removed.contains(&name) {
            assert!(seen.contains_key(&name), "{name} existed throughout but was missed");
        }
    }
    // Entries added during the listing come after the cursor, so all of them are seen.
    for name in &added {
        assert!(seen.contains_key(name), "{name} added during listing was missed");
    }
    assert!(page >= N / 1000);
    assert!(!removed.is_empty());
    // A last full listing matches the namespace exactly.
    let mut all = Vec::new();
    let mut cookie = 0;
    loop {
        let entries = m.readdir(d.ino, cookie, READDIR_ENTRIES_MAX, &root()).expect("readdir");
        let Some(last) = entries.last() else { break };
        cookie = last.next_cookie;
        all.extend(entries.into_iter().map(|e| e.name));
    }
    assert_eq!(all.len(), N - removed.len() + added.len());
}

#[test]
fn readdir_cookies_start_after_dot_and_dotdot() {
    let m = meta();
    let d = m.mkdir(ROOT_INO, b"d", 0o755, &root()).expect("mkdir");
    for name in [&b"a"[..], b"b", b"c"] {
        m.create(d.ino, name, 0o644, &root()).expect("create");
    }
    for start in [0, 1, 2] {
        assert_eq!(m.readdir(d.ino, start, 10, &root()).expect("readdir").len(), 3);
    }
    let first = m.readdir(d.ino, 0, 1, &root()).expect("readdir");
    assert!(first[0].next_cookie > 3);
    let rest = m.readdir(d.ino, first[0].next_cookie, 10, &root()).expect("readdir");
    let names: Vec<_> = rest.iter().map(|e| e.name.clone()).collect();
    assert_eq!(names, vec![b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(rest[0].kind, FileKind::File);
    let f = m.lookup(d.ino, b"a", &root()).expect("a");
    assert!(matches!(
        m.readdir(f.ino, 0, 10, &root()).map_err(|e| e.status()),
        Err(stria_proto::fs::FsStatus::NotDir)
    ));
}
