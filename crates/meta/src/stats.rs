//! Usage counters (per uid, gid, fileset, size class, extension) and statfs.

use std::collections::HashMap;

use redb::ReadableTable;
use stria_proto::fs::{Ino, NAME_BYTES_MAX, ROOT_INO};

use crate::Meta;
use crate::error::Result;
use crate::store::{self, Rx, load_usage};
use crate::types::*;

impl Meta {
    /// Regular files and their bytes owned by `uid`.
    pub fn usage_by_uid(&self, uid: u32) -> Result<Usage> {
        self.read_counters(|rx| load_usage(rx.usage()?, store::CLASS_UID, uid as u64))
    }

    pub fn usage_by_gid(&self, gid: u32) -> Result<Usage> {
        self.read_counters(|rx| load_usage(rx.usage()?, store::CLASS_GID, gid as u64))
    }

    /// Usage of the fileset rooted at the top-level directory `fileset` (a child of root);
    /// `ROOT_INO` gives the files directly in the root.
    pub fn usage_by_fileset(&self, fileset: Ino) -> Result<Usage> {
        self.read_counters(|rx| load_usage(rx.usage()?, store::CLASS_FILESET, fileset))
    }

    /// All regular files.
    pub fn usage_total(&self) -> Result<Usage> {
        self.read_counters(|rx| load_usage(rx.usage()?, store::CLASS_TOTAL, 0))
    }

    /// Files per size class: < 4 KiB, < 64 KiB, < 1 MiB, < 64 MiB, >= 64 MiB.
    pub fn size_histogram(&self) -> Result<[Usage; SIZE_CLASSES]> {
        self.read_counters(|rx| {
            let mut out = [Usage::default(); SIZE_CLASSES];
            for (class, slot) in out.iter_mut().enumerate() {
                *slot = load_usage(rx.usage()?, store::CLASS_SIZE, class as u64)?;
            }
            Ok(out)
        })
    }

    /// The `n` extensions with the most bytes ("" is files without one).
    pub fn top_extensions(&self, n: usize) -> Result<Vec<(String, Usage)>> {
        self.read_counters(|rx| {
            let mut all = Vec::new();
            for item in rx.usage_ext()?.range::<&str>(..)? {
                let (key, value) = item?;
                let (files, bytes) = value.value();
                all.push((key.value().to_string(), Usage { files, bytes }));
            }
            all.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then_with(|| a.0.cmp(&b.0)));
            all.truncate(n);
            Ok(all)
        })
    }

    /// The top `top` (at most [`ANALYTICS_TOP_MAX`]) users, groups, filesets and extensions
    /// by bytes, the size histogram and the total, all from one snapshot of the counters.
    /// Costs a scan of the uid, gid, fileset and extension counters and of the root's
    /// entries (to name the filesets), never of the tree.
    pub fn analytics(&self, top: usize) -> Result<Analytics> {
        let top = top.min(ANALYTICS_TOP_MAX);
        self.read_counters(|rx| {
            let users = top_ids(rx, store::CLASS_UID, top)?;
            let groups = top_ids(rx, store::CLASS_GID, top)?;
            let fileset_ids = top_ids(rx, store::CLASS_FILESET, top)?;
            let mut names: HashMap<Ino, String> =
                fileset_ids.iter().map(|&(ino, _)| (ino, String::new())).collect();
            if let Some(name) = names.get_mut(&ROOT_INO) {
                *name = "/".into();
            }
            let mut unnamed = names.len() - usize::from(names.contains_key(&ROOT_INO));
            if unnamed > 0 {
                for item in rx.dir_seq()?.range((ROOT_INO, 0)..=(ROOT_INO, u64::MAX))? {
                    let (_, value) = item?;
                    let (ino, _, name) = value.value();
                    if let Some(slot) = names.get_mut(&ino)
                        && slot.is_empty()
                    {
                        *slot = String::from_utf8_lossy(name).into_owned();
                        unnamed -= 1;
                        if unnamed == 0 {
                            break;
                        }
                    }
                }
            }
            let filesets = fileset_ids
                .into_iter()
                .map(|(ino, usage)| {
                    // A fileset's directory is in the root in the same snapshot; the inode
                    // number stands in should the counters ever outlive it.
                    let name = names.remove(&ino).filter(|n| !n.is_empty());
                    FilesetUsage { ino, name: name.unwrap_or_else(|| format!("#{ino}")), usage }
                })
                .collect();
            let mut extensions = Vec::new();
            for item in rx.usage_ext()?.range::<&str>(..)? {
                let (key, value) = item?;
                let (files, bytes) = value.value();
                push_bounded(
                    &mut extensions,
                    (key.value().to_string(), Usage { files, bytes }),
                    top,
                );
            }
            finish_ranking(&mut extensions, top);
            let mut size_histogram = [Usage::default(); SIZE_CLASSES];
            for (class, slot) in size_histogram.iter_mut().enumerate() {
                *slot = load_usage(rx.usage()?, store::CLASS_SIZE, class as u64)?;
            }
            Ok(Analytics {
                total: load_usage(rx.usage()?, store::CLASS_TOTAL, 0)?,
                users: users.into_iter().map(|(id, u)| (id as u32, u)).collect(),
                groups: groups.into_iter().map(|(id, u)| (id as u32, u)).collect(),
                filesets,
                extensions,
                size_histogram,
            })
        })
    }

    /// `statfs`: bytes as the storage reports them, inodes from the namespace.
    pub fn statfs(&self, bytes_total: u64, bytes_free: u64) -> Result<StatFs> {
        self.read_counters(|rx| {
            let used = rx.system(store::KEY_INODES_USED)?;
            let total = load_usage(rx.usage()?, store::CLASS_TOTAL, 0)?;
            Ok(StatFs {
                bytes_total,
                bytes_free,
                bytes_used_logical: total.bytes,
                inodes_total: self.options.inodes_max,
                inodes_used: used,
                inodes_free: self.options.inodes_max.saturating_sub(used),
                files: total.files,
                name_bytes_max: NAME_BYTES_MAX as u32,
            })
        })
    }
}

/// The `top` ids of one counter class with the most bytes.
fn top_ids(rx: &Rx, class: u8, top: usize) -> Result<Vec<(u64, Usage)>> {
    let mut out = Vec::new();
    for item in rx.usage()?.range((class, 0)..=(class, u64::MAX))? {
        let (key, value) = item?;
        let (files, bytes) = value.value();
        push_bounded(&mut out, (key.value().1, Usage { files, bytes }), top);
    }
    finish_ranking(&mut out, top);
    Ok(out)
}

/// Most bytes first, then most files, then the smaller key.
fn ranking<K: Ord>(a: &(K, Usage), b: &(K, Usage)) -> std::cmp::Ordering {
    b.1.bytes.cmp(&a.1.bytes).then(b.1.files.cmp(&a.1.files)).then_with(|| a.0.cmp(&b.0))
}

/// Adds one candidate, keeping memory at O(top) however many ids the class holds.
fn push_bounded<K: Ord>(out: &mut Vec<(K, Usage)>, item: (K, Usage), top: usize) {
    out.push(item);
    if out.len() >= 2 * top.max(1) {
        finish_ranking(out, top);
    }
}

fn finish_ranking<K: Ord>(out: &mut Vec<(K, Usage)>, top: usize) {
    out.sort_by(ranking);
    out.truncate(top);
}
