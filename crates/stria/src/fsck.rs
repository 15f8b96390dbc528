//! `stria fsck`: checks a stopped node end to end. The namespace (every name leads to an
//! inode, link counts match the names, the usage counters match a recount of the files), the chunks (each belongs to a live file, sits on the
//! target its layout names, lies inside the file's size and reads back with valid checksums),
//! and every target's RAID redundancy (a read-only check). Chunks of block volumes are checked
//! against the volume registry the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use clap::Args;
use stria_meta::{Caller, FileKind, Meta};
use stria_proto::fs::{FileLayout, Ino, ObjectId, ROOT_INO, TargetId};

use crate::up::{NodeRecord, RunRecord, open_target};

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// The data directory of the node (it must be stopped).
    #[arg(long, default_value = "stria-data")]
    pub data: PathBuf,
    /// Skip the RAID redundancy check (reads every drive in full).
    #[arg(long)]
    pub skip_raid: bool,
    /// Free stray chunks and chunk tails past a file's end (left by writes and truncates a
    /// crash interrupted), and rewrite usage counters that do not match the files; without it
    /// strays are only counted and counters reported.
    #[arg(long)]
    pub repair: bool,
}

/// What fsck knows of one inode from the namespace walk.
struct Seen {
    kind: FileKind,
    nlink: u32,
    names: u32,
    subdirs: u32,
    size: u64,
    layout: Option<FileLayout>,
}

pub fn run(args: FsckArgs) -> Result<()> {
    if let Ok(run) = RunRecord::load(&args.data) {
        // SAFETY: kill with signal 0 only checks that the process exists.
        if unsafe { libc::kill(run.pid as i32, 0) } == 0 {
            bail!(
                "the node is running (pid {}): stop it first, fsck checks a stopped node",
                run.pid
            );
        }
    }
    let node = NodeRecord::load(&args.data)?;
    let mut problems: Vec<String> = Vec::new();
    let targets: Vec<_> =
        node.targets.iter().map(|record| open_target(&args.data, record)).collect::<Result<_>>()?;
    let ids: Vec<TargetId> = targets.iter().map(|t| t.id).collect();
    let meta = crate::node::open_meta(&args.data.join("meta/namespace.redb"), &ids)?;

    let seen = walk_namespace(&meta, &mut problems)?;
    let counters = meta.check_usage_counters(args.repair).context("checking the usage counters")?;
    if !args.repair {
        problems.extend(counters.iter().map(|c| format!("{c} (rewrite with --repair)")));
    } else if !counters.is_empty() {
        println!(
            "note: {} usage counters did not match the files; rewritten from a recount",
            counters.len()
        );
    }
    let registry_path = args.data.join("mgmt/registry.redb");
    let volumes: BTreeMap<u64, stria_mgmt::VolumeRecord> = if registry_path.exists() {
        let registry = stria_mgmt::Registry::open(&registry_path)?;
        registry.data_owners()?.into_iter().map(|v| (v.object.0, v)).collect()
    } else {
        BTreeMap::new()
    };
    let orphans: BTreeSet<Ino> = meta.orphans().context("listing orphans")?.into_iter().collect();
    let files = seen.values().filter(|s| s.kind == FileKind::File).count();
    for (ino, s) in &seen {
        let want = if s.kind == FileKind::Dir { 2 + s.subdirs } else { s.names };
        if s.nlink != want {
            problems.push(format!("inode {ino}: link count {} but {want} found", s.nlink));
        }
    }

    let none = BTreeMap::new();
    let owners = Owners { seen: &seen, volumes: &volumes, orphans: &orphans, live: &none };
    let mut chunks = 0u64;
    let mut strays = 0u64;
    let mut chunk_bytes = 0u64;
    for target in &targets {
        let all = target
            .engine
            .all_chunks()
            .with_context(|| format!("listing {}'s chunks", target.id))?;
        for (chunk, len) in all {
            chunks += 1;
            chunk_bytes += len as u64;
            if let Some(fix) = owners.stray(chunk, len) {
                strays += 1;
                if args.repair {
                    fix.apply(&target.engine, chunk)?;
                }
                if matches!(fix, Stray::Remove) {
                    continue;
                }
            }
            let Some((_, layout)) = owners.owner(chunk.object.0) else {
                continue;
            };
            if layout.target_of(chunk.index) != target.id {
                problems.push(format!(
                    "{}: chunk {chunk} is on the wrong target (layout says {})",
                    target.id,
                    layout.target_of(chunk.index)
                ));
            }
            if let Err(e) = target.engine.read(chunk, 0, len) {
                problems.push(format!("{}: chunk {chunk} does not read back: {e}", target.id));
            }
        }
    }
    // Only volumes share blocks (snapshots and clones); a file's blocks are its own.
    let mut shared_blocks = 0u64;
    for target in &targets {
        let volume = |o: ObjectId| o.0 & ObjectId::VOLUME_BIT != 0;
        let check = target
            .engine
            .check_sharing(volume)
            .with_context(|| format!("checking {}'s shared blocks", target.id))?;
        shared_blocks += check.shared_blocks;
        if check.wrongly_shared_blocks > 0 {
            problems.push(format!(
                "{}: {} blocks of files are also named by other chunks (a damaged chunk map: \
                 writes to one would change the other)",
                target.id, check.wrongly_shared_blocks
            ));
        }
    }
    if !args.skip_raid {
        let stop = AtomicBool::new(false);
        for target in &targets {
            let report = target
                .array
                .scrub(false, None, &stop, &mut |_, _| {})
                .with_context(|| format!("checking {}'s RAID redundancy", target.id))?;
            if report.checksum_errors + report.parity_mismatches + report.unrecoverable_blocks > 0 {
                problems.push(format!(
                    "{}: RAID check found {} checksum errors, {} parity mismatches, {} unrecoverable blocks",
                    target.id, report.checksum_errors, report.parity_mismatches, report.unrecoverable_blocks
                ));
            }
        }
    }
    println!(
        "checked {} inodes ({files} files), {chunks} chunks ({} bytes) on {} targets",
        seen.len(),
        chunk_bytes,
        node.targets.len()
    );
    if shared_blocks > 0 {
        println!("{shared_blocks} blocks are shared by volumes and their snapshots or clones");
    }
    if strays > 0 {
        let what = if args.repair { "freed" } else { "found (free them with --repair)" };
        println!(
            "note: {strays} stray chunks or chunk tails past a file's end, from writes a crash \
             interrupted, {what}; `stria up` frees them when it starts after a crash"
        );
    }
    if args.repair {
        for target in &targets {
            target.engine.sync().context("syncing the repaired targets")?;
        }
    }
    drop(targets);
    if problems.is_empty() {
        println!("fsck: clean");
        return Ok(());
    }
    for p in &problems {
        println!("problem: {p}");
    }
    bail!("fsck found {} problems", problems.len())
}

/// Whose chunks are whose: the files of the namespace walk, the volumes of the registry, and
/// the unlinked files still open when the node stopped.
struct Owners<'a> {
    seen: &'a BTreeMap<Ino, Seen>,
    volumes: &'a BTreeMap<u64, stria_mgmt::VolumeRecord>,
    orphans: &'a BTreeSet<Ino>,
    /// Sizes a live client knows and may not have published yet: bytes below them are its
    /// data, not strays.
    live: &'a BTreeMap<Ino, u64>,
}

/// What to do with a chunk holding bytes no file or volume owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stray {
    /// No owner, or it lies wholly past its file's end.
    Remove,
    /// It holds bytes past its file's end: cut it there.
    CutAt(u32),
}

impl Stray {
    fn apply(self, engine: &stria_engine::Engine, chunk: stria_proto::fs::ChunkId) -> Result<()> {
        match self {
            Stray::Remove => engine.remove(chunk).map(drop),
            Stray::CutAt(len) => engine.truncate(chunk, len),
        }
        .with_context(|| format!("freeing stray data of chunk {chunk}"))
    }
}

impl Owners<'_> {
    /// The size and layout of the file or volume object `ino` belongs to.
    fn owner(&self, ino: u64) -> Option<(u64, &FileLayout)> {
        if ino & ObjectId::VOLUME_BIT != 0 {
            self.volumes.get(&ino).map(|v| (v.size_bytes, &v.layout))
        } else {
            self.seen.get(&ino).and_then(|f| f.layout.as_ref().map(|l| (f.size, l)))
        }
    }

    /// Strays: a crash can leave chunks whose metadata never became durable (a create, a
    /// spill, a size) and chunk bytes past a file's end whose trim never became durable
    /// (a truncate). Nothing reads them while the file stays as it is, but a file that grows
    /// later would show them in its holes, so they must go before it can.
    fn stray(&self, chunk: stria_proto::fs::ChunkId, len: u32) -> Option<Stray> {
        let ino = chunk.object.0;
        let Some((size, layout)) = self.owner(ino) else {
            return (!self.orphans.contains(&ino)).then_some(Stray::Remove);
        };
        let size = size.max(self.live.get(&ino).copied().unwrap_or(0));
        let start = chunk.index * layout.chunk_bytes as u64;
        if start >= size {
            return Some(Stray::Remove);
        }
        let keep = size - start;
        (u64::from(len) > keep).then(|| Stray::CutAt(keep as u32))
    }
}

/// Frees every stray chunk and chunk tail of a node's targets (see [`Owners::stray`]) and
/// makes that durable: `stria up` runs it when it starts after a crash, before anything can
/// grow a file over them, and so does its supervisor after a role process died. `live`: the
/// sizes a client that outlived the crash knows (its files' unpublished writes are not
/// strays). Returns how many chunks it changed.
pub fn free_strays(
    meta: &Meta,
    volumes: &[stria_mgmt::VolumeRecord],
    targets: &[&stria_storage::Target],
    live: &BTreeMap<Ino, u64>,
) -> Result<u64> {
    let mut problems = Vec::new();
    let seen = walk_namespace(meta, &mut problems)?;
    for problem in &problems {
        tracing::warn!(%problem, "namespace problem found while freeing strays");
    }
    let volumes: BTreeMap<u64, stria_mgmt::VolumeRecord> =
        volumes.iter().map(|v| (v.object.0, v.clone())).collect();
    let orphans: BTreeSet<Ino> = meta.orphans().context("listing orphans")?.into_iter().collect();
    let owners = Owners { seen: &seen, volumes: &volumes, orphans: &orphans, live };
    let mut freed = 0;
    for target in targets {
        for (chunk, len) in target.engine.all_chunks()? {
            if let Some(fix) = owners.stray(chunk, len) {
                fix.apply(&target.engine, chunk)?;
                freed += 1;
            }
        }
        target.engine.sync().with_context(|| format!("syncing {}", target.id))?;
    }
    Ok(freed)
}

fn walk_namespace(meta: &Meta, problems: &mut Vec<String>) -> Result<BTreeMap<Ino, Seen>> {
    let root = Caller::root();
    let mut seen: BTreeMap<Ino, Seen> = BTreeMap::new();
    let mut stack = vec![ROOT_INO];
    let attr = meta.getattr(ROOT_INO).context("reading the root directory")?;
    seen.insert(
        ROOT_INO,
        Seen { kind: attr.kind, nlink: attr.nlink, names: 1, subdirs: 0, size: 0, layout: None },
    );
    while let Some(dir) = stack.pop() {
        let mut cookie = 0;
        loop {
            let entries = meta
                .readdir(dir, cookie, 4096, &root)
                .with_context(|| format!("listing directory {dir}"))?;
            let Some(last) = entries.last() else { break };
            cookie = last.next_cookie;
            for entry in entries {
                if let Some(s) = seen.get_mut(&entry.ino) {
                    s.names += 1;
                    if s.kind == FileKind::Dir {
                        problems.push(format!("directory {} has more than one name", entry.ino));
                    }
                    continue;
                }
                let attr = match meta.getattr(entry.ino) {
                    Ok(attr) => attr,
                    Err(e) => {
                        problems.push(format!(
                            "entry {:?} in directory {dir} leads nowhere: {e}",
                            String::from_utf8_lossy(&entry.name)
                        ));
                        continue;
                    }
                };
                if attr.kind != entry.kind {
                    problems.push(format!(
                        "entry {:?} in directory {dir}: kind differs from its inode",
                        String::from_utf8_lossy(&entry.name)
                    ));
                }
                let layout =
                    if attr.kind == FileKind::File { meta.file_layout(entry.ino)? } else { None };
                if attr.kind == FileKind::Dir {
                    stack.push(entry.ino);
                    if let Some(parent) = seen.get_mut(&dir) {
                        parent.subdirs += 1;
                    }
                }
                seen.insert(
                    entry.ino,
                    Seen {
                        kind: attr.kind,
                        nlink: attr.nlink,
                        names: 1,
                        subdirs: 0,
                        size: attr.size,
                        layout,
                    },
                );
            }
        }
    }
    Ok(seen)
}
