//! Random sequences of namespace operations, checked step by step against a simple in-memory
//! model (outcome of every call) and at the end (every directory listing, every link count).

mod common;

use std::collections::{BTreeMap, HashMap};

use common::*;
use stria_meta::*;
use stria_proto::fs::{FsStatus, Ino, ROOT_INO};

/// xorshift64*: deterministic, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Default)]
struct Model {
    entries: HashMap<Ino, BTreeMap<Vec<u8>, Ino>>,
    is_dir: HashMap<Ino, bool>,
    nlink: HashMap<Ino, u32>,
    parent: HashMap<Ino, Ino>,
}

impl Model {
    fn new() -> Model {
        let mut m = Model::default();
        m.entries.insert(ROOT_INO, BTreeMap::new());
        m.is_dir.insert(ROOT_INO, true);
        m.nlink.insert(ROOT_INO, 2);
        m.parent.insert(ROOT_INO, ROOT_INO);
        m
    }
    fn get(&self, dir: Ino, name: &[u8]) -> Option<Ino> {
        self.entries[&dir].get(name).copied()
    }
    fn inside(&self, mut dir: Ino, top: Ino) -> bool {
        loop {
            if dir == top {
                return true;
            }
            if dir == ROOT_INO {
                return false;
            }
            dir = self.parent[&dir];
        }
    }
    fn add(&mut self, dir: Ino, name: &[u8], ino: Ino) {
        self.entries.get_mut(&dir).expect("dir").insert(name.to_vec(), ino);
        if self.is_dir[&ino] {
            *self.nlink.get_mut(&dir).expect("dir") += 1;
            self.parent.insert(ino, dir);
        }
    }
    fn remove(&mut self, dir: Ino, name: &[u8]) -> Ino {
        let ino = self.entries.get_mut(&dir).expect("dir").remove(name).expect("entry");
        if self.is_dir[&ino] {
            *self.nlink.get_mut(&dir).expect("dir") -= 1;
        }
        ino
    }
    fn drop_inode_link(&mut self, ino: Ino) {
        let n = self.nlink.get_mut(&ino).expect("ino");
        if self.is_dir[&ino] {
            *n = 0;
        } else {
            *n -= 1;
        }
        if *n == 0 {
            self.nlink.remove(&ino);
            self.entries.remove(&ino);
        }
    }
    fn dirs(&self) -> Vec<Ino> {
        let mut v: Vec<Ino> = self.entries.keys().copied().collect();
        v.sort();
        v
    }
    fn files(&self) -> Vec<Ino> {
        let mut v: Vec<Ino> = self.nlink.keys().copied().filter(|i| !self.is_dir[i]).collect();
        v.sort();
        v
    }
}

fn outcome<T>(r: Result<T, MetaError>) -> Result<T, FsStatus> {
    r.map_err(|e| e.status())
}

fn run(seed: u64, steps: usize, commit: Commit) {
    let m = Meta::open_in_memory(MetaOptions { commit, ..options() }).expect("open in memory");
    let mut model = Model::new();
    let mut rng = Rng(seed);
    let names: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];
    let r = root();
    for step in 0..steps {
        let dirs = model.dirs();
        let p = dirs[rng.below(dirs.len())];
        let n = names[rng.below(names.len())];
        let ctx = format!("seed {seed} step {step}");
        match rng.below(7) {
            0 | 1 => {
                let mkdir = rng.below(2) == 0;
                let want = model.get(p, n).map(|_| FsStatus::Exists);
                let got = if mkdir { m.mkdir(p, n, 0o755, &r) } else { m.create(p, n, 0o644, &r) };
                match (outcome(got), want) {
                    (Ok(attr), None) => {
                        model.is_dir.insert(attr.ino, mkdir);
                        model.nlink.insert(attr.ino, if mkdir { 2 } else { 1 });
                        if mkdir {
                            model.entries.insert(attr.ino, BTreeMap::new());
                        }
                        model.add(p, n, attr.ino);
                    }
                    (Err(s), Some(w)) => assert_eq!(s, w, "{ctx}"),
                    (got, want) => panic!("{ctx}: create got {got:?}, want {want:?}"),
                }
            }
            2 => {
                let want = match model.get(p, n) {
                    None => Err(FsStatus::NotFound),
                    Some(i) if model.is_dir[&i] => Err(FsStatus::IsDir),
                    Some(i) => Ok(i),
                };
                let got = outcome(m.unlink(p, n, &r));
                assert_eq!(got.map(|u| u.ino), want, "{ctx} unlink");
                if let Ok(i) = want {
                    model.remove(p, n);
                    model.drop_inode_link(i);
                }
            }
            3 => {
                let want = match model.get(p, n) {
                    None => Err(FsStatus::NotFound),
                    Some(i) if !model.is_dir[&i] => Err(FsStatus::NotDir),
                    Some(i) if !model.entries[&i].is_empty() => Err(FsStatus::NotEmpty),
                    Some(i) => Ok(i),
                };
                assert_eq!(outcome(m.rmdir(p, n, &r)), want.map(|_| ()), "{ctx} rmdir");
                if let Ok(i) = want {
                    model.remove(p, n);
                    model.drop_inode_link(i);
                }
            }
            4 => {
                let files = model.files();
                if files.is_empty() {
                    continue;
                }
                let f = files[rng.below(files.len())];
                let want = match model.get(p, n) {
                    Some(_) => Err(FsStatus::Exists),
                    None => Ok(()),
                };
                assert_eq!(outcome(m.link(f, p, n, &r)).map(|_| ()), want, "{ctx} link");
                if want.is_ok() {
                    model.add(p, n, f);
                    *model.nlink.get_mut(&f).expect("f") += 1;
                }
            }
            _ => {
                let np = dirs[rng.below(dirs.len())];
                let nn = names[rng.below(names.len())];
                let flags = match rng.below(4) {
                    0 => RenameFlags::NOREPLACE,
                    1 => RenameFlags::EXCHANGE,
                    _ => RenameFlags::NONE,
                };
                let want = rename_outcome(&model, p, n, np, nn, flags);
                let got = outcome(m.rename(p, n, np, nn, flags, &r)).map(|_| ());
                assert_eq!(
                    got,
                    want.map(|_| ()),
                    "{ctx} rename {p}/{n:?} -> {np}/{nn:?} {flags:?}"
                );
                if let Ok(action) = want {
                    apply_rename(&mut model, p, n, np, nn, action);
                }
            }
        }
    }
    // Final state: every listing and every link count.
    for dir in model.dirs() {
        let mut listed = BTreeMap::new();
        let mut cookie = 0;
        loop {
            let page = m.readdir(dir, cookie, 3, &r).expect("readdir");
            let Some(last) = page.last() else { break };
            cookie = last.next_cookie;
            for e in page {
                assert!(listed.insert(e.name, e.ino).is_none());
            }
        }
        assert_eq!(listed, model.entries[&dir], "seed {seed}: listing of {dir}");
        assert_eq!(m.getattr(dir).expect("dir").nlink, model.nlink[&dir], "seed {seed}: dir {dir}");
    }
    for f in model.files() {
        assert_eq!(m.getattr(f).expect("file").nlink, model.nlink[&f], "seed {seed}: file {f}");
    }
    let used = m.statfs(0, 0).expect("statfs").inodes_used;
    assert_eq!(used, model.nlink.len() as u64, "seed {seed}: inode count");
    assert_eq!(m.usage_total().expect("usage").files, model.files().len() as u64);
}

#[derive(Debug, Clone, Copy)]
enum RenameAction {
    Nothing,
    Move,
    Replace(Ino),
    Exchange(Ino),
}

fn rename_outcome(
    model: &Model,
    p: Ino,
    n: &[u8],
    np: Ino,
    nn: &[u8],
    flags: RenameFlags,
) -> Result<RenameAction, FsStatus> {
    let src = model.get(p, n).ok_or(FsStatus::NotFound)?;
    let target = model.get(np, nn);
    if flags.exchange && target.is_none() {
        return Err(FsStatus::NotFound);
    }
    if p == np && n == nn {
        return Ok(RenameAction::Nothing);
    }
    if model.is_dir[&src] && p != np && model.inside(np, src) {
        return Err(FsStatus::Invalid);
    }
    let Some(t) = target else { return Ok(RenameAction::Move) };
    if flags.noreplace {
        return Err(FsStatus::Exists);
    }
    if flags.exchange {
        if model.is_dir[&t] && p != np && model.inside(p, t) {
            return Err(FsStatus::Invalid);
        }
        return Ok(RenameAction::Exchange(t));
    }
    if t == src {
        return Ok(RenameAction::Nothing);
    }
    match (model.is_dir[&src], model.is_dir[&t]) {
        (true, false) => Err(FsStatus::NotDir),
        (false, true) => Err(FsStatus::IsDir),
        (true, true) if !model.entries[&t].is_empty() => Err(FsStatus::NotEmpty),
        _ => Ok(RenameAction::Replace(t)),
    }
}

fn apply_rename(model: &mut Model, p: Ino, n: &[u8], np: Ino, nn: &[u8], action: RenameAction) {
    match action {
        RenameAction::Nothing => {}
        RenameAction::Move => {
            let src = model.remove(p, n);
            model.add(np, nn, src);
        }
        RenameAction::Replace(t) => {
            model.remove(np, nn);
            model.drop_inode_link(t);
            let src = model.remove(p, n);
            model.add(np, nn, src);
        }
        RenameAction::Exchange(t) => {
            let src = model.remove(p, n);
            model.remove(np, nn);
            model.add(np, nn, src);
            model.add(p, n, t);
        }
    }
}

#[test]
fn random_namespace_operations_match_the_model() {
    for seed in 1..=12u64 {
        run(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1, 1500, Commit::Durable);
    }
}

/// The same with lazy commits, as `stria up` runs: mutations share batched transactions, and
/// the failed ones among them (most steps fail) must take back only their own changes.
#[test]
fn random_namespace_operations_in_batches_match_the_model() {
    for seed in 1..=12u64 {
        run(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1, 1500, Commit::Lazy);
    }
}
