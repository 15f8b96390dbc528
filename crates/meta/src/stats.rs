//! Usage counters (per uid, gid, fileset, size class, extension) and statfs.

use stria_proto::fs::{Ino, NAME_BYTES_MAX};

use crate::Meta;
use crate::error::Result;
use crate::store::{self, load_usage};
use crate::types::*;

impl Meta {
    /// Regular files and their bytes owned by `uid`.
    pub fn usage_by_uid(&self, uid: u32) -> Result<Usage> {
        self.read(|rx| load_usage(&rx.usage, store::CLASS_UID, uid as u64))
    }

    pub fn usage_by_gid(&self, gid: u32) -> Result<Usage> {
        self.read(|rx| load_usage(&rx.usage, store::CLASS_GID, gid as u64))
    }

    /// Usage of the fileset rooted at the top-level directory `fileset` (a child of root);
    /// `ROOT_INO` gives the files directly in the root.
    pub fn usage_by_fileset(&self, fileset: Ino) -> Result<Usage> {
        self.read(|rx| load_usage(&rx.usage, store::CLASS_FILESET, fileset))
    }

    /// All regular files.
    pub fn usage_total(&self) -> Result<Usage> {
        self.read(|rx| load_usage(&rx.usage, store::CLASS_TOTAL, 0))
    }

    /// Files per size class: < 4 KiB, < 64 KiB, < 1 MiB, < 64 MiB, >= 64 MiB.
    pub fn size_histogram(&self) -> Result<[Usage; SIZE_CLASSES]> {
        self.read(|rx| {
            let mut out = [Usage::default(); SIZE_CLASSES];
            for (class, slot) in out.iter_mut().enumerate() {
                *slot = load_usage(&rx.usage, store::CLASS_SIZE, class as u64)?;
            }
            Ok(out)
        })
    }

    /// The `n` extensions with the most bytes ("" is files without one).
    pub fn top_extensions(&self, n: usize) -> Result<Vec<(String, Usage)>> {
        self.read(|rx| {
            let mut all = Vec::new();
            for item in rx.usage_ext.range::<&str>(..)? {
                let (key, value) = item?;
                let (files, bytes) = value.value();
                all.push((key.value().to_string(), Usage { files, bytes }));
            }
            all.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then_with(|| a.0.cmp(&b.0)));
            all.truncate(n);
            Ok(all)
        })
    }

    /// `statfs`: bytes as the storage reports them, inodes from the namespace.
    pub fn statfs(&self, bytes_total: u64, bytes_free: u64) -> Result<StatFs> {
        self.read(|rx| {
            let used = rx.system(store::KEY_INODES_USED)?;
            let total = load_usage(&rx.usage, store::CLASS_TOTAL, 0)?;
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
