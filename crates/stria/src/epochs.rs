//! The epochs of a node's roles (see `stria_proto::wire::Epoch`): a clean stop leaves its
//! role's epoch in `DATA/epochs/ROLE`, after everything the role acknowledged is durable; the
//! next start takes it and removes the file before serving. A start that finds no file (the
//! first start, or one after a crash) serves under a fresh epoch, so clients learn that
//! unsynced changes may be gone.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use stria_proto::wire::{Epoch, new_epoch};

/// The roles with durable state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Meta,
    Storage,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Meta => "meta",
            Role::Storage => "storage",
        }
    }
}

fn path(data: &Path, role: Role) -> PathBuf {
    data.join("epochs").join(role.name())
}

/// The epoch `role` serves under from now on: the one its last clean stop left, or a fresh
/// one. The file is gone (durably) before this returns, so a crash from here on changes it.
pub fn take(data: &Path, role: Role) -> Result<Epoch> {
    let file = path(data, role);
    let left = std::fs::read_to_string(&file).ok().and_then(|text| text.trim().parse().ok());
    if file.exists() {
        std::fs::remove_file(&file).with_context(|| format!("cannot remove {}", file.display()))?;
        sync_dir(file.parent().expect("in a directory"))?;
    }
    Ok(left.unwrap_or_else(new_epoch))
}

/// Leaves `epoch` for the next start of `role`: only once its state is durable.
pub fn hand_over(data: &Path, role: Role, epoch: Epoch) -> Result<()> {
    let file = path(data, role);
    let dir = file.parent().expect("in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let partial = file.with_extension("new");
    std::fs::write(&partial, format!("{epoch}\n"))
        .and_then(|()| std::fs::File::open(&partial)?.sync_all())
        .and_then(|()| std::fs::rename(&partial, &file))
        .with_context(|| format!("cannot write {}", file.display()))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_stop_hands_its_epoch_to_the_next_start_only() {
        let dir = std::env::temp_dir().join(format!("stria-epochs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch");
        let first = take(&dir, Role::Meta).expect("first start");
        hand_over(&dir, Role::Meta, first).expect("clean stop");
        assert_eq!(take(&dir, Role::Meta).expect("after a clean stop"), first);
        // No clean stop since: as after a crash, a new epoch.
        assert_ne!(take(&dir, Role::Meta).expect("after a crash"), first);
        // The roles keep separate files.
        hand_over(&dir, Role::Storage, 7).expect("storage stop");
        assert_ne!(take(&dir, Role::Meta).expect("meta"), 7);
        assert_eq!(take(&dir, Role::Storage).expect("storage"), 7);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
