//! The registry: volumes and exports with their access lists, in one redb file. Every change is
//! one durable transaction; the registry is small and changes rarely.

use std::path::Path;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use stria_proto::fs::{FileLayout, ObjectId};
use stria_proto::mgmt::{MgmtError, MgmtStatus};

const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("volumes");
const EXPORTS: TableDefinition<&str, &[u8]> = TableDefinition::new("exports");
/// Volume name -> [`VolumeOrigin`], for volumes made by copying another.
const ORIGINS: TableDefinition<&str, &[u8]> = TableDefinition::new("volume_origins");
/// Volume name -> [`Rollback`], for volumes being rolled back to a snapshot.
const ROLLBACKS: TableDefinition<&str, &[u8]> = TableDefinition::new("volume_rollbacks");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NEXT_VOLUME_ID: &str = "next_volume_id";
const FORMAT_VERSION: &str = "format_version";
const FORMAT: u64 = 1;

/// A volume's lifecycle state.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum VolumeState {
    Online,
    /// Delete started: the data is being removed; the record goes when it is gone. A node that
    /// restarts finishes the job.
    Deleting,
    /// A snapshot or clone whose data the targets are copying; a node that restarts before it
    /// is online deletes it (an unfinished copy is of no use).
    Copying,
    /// Being given a snapshot's data ([`Rollback`] says how far it got); not exported
    /// meanwhile. A node that restarts finishes the switch if it was made, else drops the
    /// partial copy and leaves the volume as it was.
    RollingBack,
}

impl VolumeState {
    pub fn name(self) -> &'static str {
        match self {
            VolumeState::Online => "online",
            VolumeState::Deleting => "deleting",
            VolumeState::Copying => "copying",
            VolumeState::RollingBack => "rolling-back",
        }
    }
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub name: String,
    pub object: ObjectId,
    pub size_bytes: u64,
    pub layout: FileLayout,
    pub state: VolumeState,
    pub created_unix_s: u64,
}

/// Where a volume made by copying another came from (kept beside its record, which older
/// registries store without it).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct VolumeOrigin {
    /// The source volume's name at the time of the copy.
    pub source: String,
    /// Read-only: exported only read-only and never resized.
    pub snapshot: bool,
}

/// A rollback of a volume to one of its snapshots. The snapshot's data is copied into a fresh
/// object; then the volume's record switches to that object in one transaction; then the old
/// object's data is removed. Until the switch the volume's own data is untouched.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Rollback {
    pub snapshot: String,
    /// The object the snapshot's data is copied into.
    pub object: ObjectId,
    /// The volume's object before the switch; set by the switch (its data is then removed).
    pub replaced: Option<ObjectId>,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct AclRule {
    /// Normalised CIDR text (`IpNet`'s display form).
    pub net: String,
    pub tls_identity: Option<String>,
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ExportRecord {
    pub name: String,
    pub volume: String,
    pub read_only: bool,
    pub description: String,
    pub acl: Vec<AclRule>,
}

/// Inserts a volume record with the next free object id; refused if the name is taken.
fn new_volume(
    tx: &redb::WriteTransaction,
    name: &str,
    size_bytes: u64,
    layout: FileLayout,
    state: VolumeState,
    now_unix_s: u64,
) -> Result<VolumeRecord, MgmtError> {
    let mut volumes = tx.open_table(VOLUMES).map_err(|e| internal("volumes table", e))?;
    if volumes.get(name).map_err(|e| internal("reading a volume", e))?.is_some() {
        return Err(MgmtError::new(
            MgmtStatus::Exists,
            format!("a volume named '{name}' exists already"),
        ));
    }
    let record = VolumeRecord {
        name: name.to_string(),
        object: next_object(tx)?,
        size_bytes,
        layout,
        state,
        created_unix_s: now_unix_s,
    };
    volumes.insert(name, encode(&record)?.as_slice()).map_err(|e| internal("insert", e))?;
    Ok(record)
}

/// A volume object id never used before.
fn next_object(tx: &redb::WriteTransaction) -> Result<ObjectId, MgmtError> {
    let mut meta = tx.open_table(META).map_err(|e| internal("meta table", e))?;
    let id = meta.get(NEXT_VOLUME_ID).map_err(|e| internal("id", e))?.map_or(1, |v| v.value());
    meta.insert(NEXT_VOLUME_ID, id + 1).map_err(|e| internal("id", e))?;
    Ok(ObjectId(ObjectId::VOLUME_BIT | id))
}

fn get<T: for<'de> Deserialize<'de>>(
    tx: &redb::WriteTransaction,
    table: TableDefinition<&str, &[u8]>,
    kind: &str,
    name: &str,
) -> Result<Option<T>, MgmtError> {
    let table = tx.open_table(table).map_err(|e| internal(&format!("{kind} table"), e))?;
    let value = table.get(name).map_err(|e| internal(&format!("reading a {kind}"), e))?;
    value.map(|v| decode(kind, name, v.value())).transpose()
}

fn put<T: Serialize>(
    tx: &redb::WriteTransaction,
    table: TableDefinition<&str, &[u8]>,
    name: &str,
    value: &T,
) -> Result<(), MgmtError> {
    let mut table = tx.open_table(table).map_err(|e| internal("table", e))?;
    table.insert(name, encode(value)?.as_slice()).map_err(|e| internal("insert", e))?;
    Ok(())
}

/// Removes the row `name` of `table`, if there is one.
fn delete(
    tx: &redb::WriteTransaction,
    table: TableDefinition<&str, &[u8]>,
    name: &str,
) -> Result<(), MgmtError> {
    let mut table = tx.open_table(table).map_err(|e| internal("table", e))?;
    table.remove(name).map_err(|e| internal("remove", e))?;
    Ok(())
}

fn internal(what: &str, e: impl std::fmt::Display) -> MgmtError {
    MgmtError::new(MgmtStatus::Internal, format!("registry: {what}: {e}"))
}

fn not_found(kind: &str, name: &str) -> MgmtError {
    MgmtError::new(MgmtStatus::NotFound, format!("no {kind} named '{name}'"))
}

fn decode<T: for<'de> Deserialize<'de>>(
    kind: &str,
    name: &str,
    bytes: &[u8],
) -> Result<T, MgmtError> {
    postcard::from_bytes(bytes).map_err(|e| internal(&format!("{kind} '{name}' is damaged"), e))
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, MgmtError> {
    postcard::to_allocvec(value).map_err(|e| internal("encoding a record", e))
}

/// The registry file. All methods take `&self`; redb serialises writers.
#[derive(Debug)]
pub struct Registry {
    db: Database,
}

impl Registry {
    /// Opens (or creates) the registry at `path`.
    pub fn open(path: &Path) -> Result<Registry, MgmtError> {
        let db = Database::create(path)
            .map_err(|e| internal(&format!("cannot open {}", path.display()), e))?;
        let registry = Registry { db };
        registry.write(|tx| {
            tx.open_table(VOLUMES).map_err(|e| internal("volumes table", e))?;
            tx.open_table(EXPORTS).map_err(|e| internal("exports table", e))?;
            tx.open_table(ORIGINS).map_err(|e| internal("origins table", e))?;
            tx.open_table(ROLLBACKS).map_err(|e| internal("rollbacks table", e))?;
            let mut meta = tx.open_table(META).map_err(|e| internal("meta table", e))?;
            let format =
                meta.get(FORMAT_VERSION).map_err(|e| internal("format", e))?.map(|v| v.value());
            match format {
                None => {
                    meta.insert(FORMAT_VERSION, FORMAT).map_err(|e| internal("format", e))?;
                }
                Some(FORMAT) => {}
                Some(other) => {
                    return Err(MgmtError::new(
                        MgmtStatus::Internal,
                        format!(
                            "{} has registry format {other}; this stria reads format {FORMAT}",
                            path.display()
                        ),
                    ));
                }
            }
            Ok(())
        })?;
        Ok(registry)
    }

    fn write<T>(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, MgmtError>,
    ) -> Result<T, MgmtError> {
        let mut tx = self.db.begin_write().map_err(|e| internal("begin", e))?;
        tx.set_durability(Durability::Immediate).map_err(|e| internal("durability", e))?;
        let out = f(&tx)?;
        tx.commit().map_err(|e| internal("commit", e))?;
        Ok(out)
    }

    /// The row `name` of `table` (a `kind` record), in a read transaction of its own.
    fn row<T: for<'de> Deserialize<'de>>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        kind: &str,
        name: &str,
    ) -> Result<Option<T>, MgmtError> {
        let tx = self.db.begin_read().map_err(|e| internal("begin", e))?;
        let table = tx.open_table(table).map_err(|e| internal(&format!("{kind} table"), e))?;
        let value = table.get(name).map_err(|e| internal(&format!("reading a {kind}"), e))?;
        value.map(|v| decode(kind, name, v.value())).transpose()
    }

    /// Every row of `table` (`kind` records) with its name.
    fn rows<T: for<'de> Deserialize<'de>>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        kind: &str,
    ) -> Result<Vec<(String, T)>, MgmtError> {
        let tx = self.db.begin_read().map_err(|e| internal("begin", e))?;
        let table = tx.open_table(table).map_err(|e| internal(&format!("{kind} table"), e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| internal(&format!("listing {kind}s"), e))? {
            let (k, v) = entry.map_err(|e| internal(&format!("listing {kind}s"), e))?;
            out.push((k.value().to_string(), decode(kind, k.value(), v.value())?));
        }
        Ok(out)
    }

    pub fn volumes(&self) -> Result<Vec<VolumeRecord>, MgmtError> {
        Ok(self.rows(VOLUMES, "volume")?.into_iter().map(|(_, v)| v).collect())
    }

    pub fn volume(&self, name: &str) -> Result<VolumeRecord, MgmtError> {
        self.row(VOLUMES, "volume", name)?.ok_or_else(|| not_found("volume", name))
    }

    /// Records a new volume with the next free object id; `layout` says where its chunks go.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        layout: FileLayout,
        now_unix_s: u64,
    ) -> Result<VolumeRecord, MgmtError> {
        self.write(|tx| new_volume(tx, name, size_bytes, layout, VolumeState::Online, now_unix_s))
    }

    /// Records `name` as a copy of the volume `source` (same size and layout), in state
    /// [`VolumeState::Copying`] until the data is copied, with its origin. Returns the
    /// source's record and the copy's.
    pub fn create_copy(
        &self,
        source: &str,
        name: &str,
        snapshot: bool,
        now_unix_s: u64,
    ) -> Result<(VolumeRecord, VolumeRecord), MgmtError> {
        self.write(|tx| {
            let from: VolumeRecord = {
                let volumes = tx.open_table(VOLUMES).map_err(|e| internal("volumes table", e))?;
                let from = volumes.get(source).map_err(|e| internal("reading a volume", e))?;
                match from {
                    Some(v) => decode("volume", source, v.value())?,
                    None => return Err(not_found("volume", source)),
                }
            };
            if from.state != VolumeState::Online {
                return Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!("volume '{source}' is {}", from.state.name()),
                ));
            }
            let record = new_volume(
                tx,
                name,
                from.size_bytes,
                from.layout.clone(),
                VolumeState::Copying,
                now_unix_s,
            )?;
            let origin = VolumeOrigin { source: source.to_string(), snapshot };
            let mut origins = tx.open_table(ORIGINS).map_err(|e| internal("origins table", e))?;
            origins.insert(name, encode(&origin)?.as_slice()).map_err(|e| internal("insert", e))?;
            Ok((from, record))
        })
    }

    /// Where the volume `name` was copied from; None for a volume created empty.
    pub fn origin(&self, name: &str) -> Result<Option<VolumeOrigin>, MgmtError> {
        self.row(ORIGINS, "origin", name)
    }

    /// Starts the rollback of volume `name` to `snapshot`, one of its snapshots: the volume goes
    /// [`VolumeState::RollingBack`] and a fresh object is set aside for the copy. Returns the
    /// volume's record, the snapshot's and the rollback.
    pub fn begin_rollback(
        &self,
        name: &str,
        snapshot: &str,
    ) -> Result<(VolumeRecord, VolumeRecord, Rollback), MgmtError> {
        self.write(|tx| {
            let online = |record: Option<VolumeRecord>, name: &str| match record {
                None => Err(not_found("volume", name)),
                Some(v) if v.state != VolumeState::Online => Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!("volume '{name}' is {}", v.state.name()),
                )),
                Some(v) => Ok(v),
            };
            let mut volume = online(get(tx, VOLUMES, "volume", name)?, name)?;
            let own: Option<VolumeOrigin> = get(tx, ORIGINS, "origin", name)?;
            if own.is_some_and(|o| o.snapshot) {
                return Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!("volume '{name}' is a snapshot and does not change"),
                ));
            }
            if get::<Rollback>(tx, ROLLBACKS, "rollback", name)?.is_some() {
                return Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!(
                        "the data the last rollback of '{name}' replaced is still being removed; \
                         try again in a moment"
                    ),
                ));
            }
            let from = online(get(tx, VOLUMES, "volume", snapshot)?, snapshot)?;
            let origin: Option<VolumeOrigin> = get(tx, ORIGINS, "origin", snapshot)?;
            if !origin.as_ref().is_some_and(|o| o.snapshot && o.source == name) {
                return Err(MgmtError::new(
                    MgmtStatus::Invalid,
                    format!(
                        "volume '{snapshot}' is not a snapshot of '{name}'; a volume rolls back \
                         only to its own snapshots (stria volume list shows each one's origin)"
                    ),
                ));
            }
            if from.layout != volume.layout {
                return Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!("snapshot '{snapshot}' is laid out over other targets than '{name}'"),
                ));
            }
            let rollback = Rollback {
                snapshot: snapshot.to_string(),
                object: next_object(tx)?,
                replaced: None,
            };
            volume.state = VolumeState::RollingBack;
            put(tx, VOLUMES, name, &volume)?;
            put(tx, ROLLBACKS, name, &rollback)?;
            Ok((volume, from, rollback))
        })
    }

    /// The rollback of volume `name` under way, if any.
    pub fn rollback(&self, name: &str) -> Result<Option<Rollback>, MgmtError> {
        self.row(ROLLBACKS, "rollback", name)
    }

    /// Points volume `name` at its rollback's copy, with size `size_bytes` (the snapshot's),
    /// and brings it online: from this transaction on the volume holds the snapshot's data.
    /// The rollback's record stays, with the replaced object noted, until that object's data
    /// is removed ([`Registry::forget_rollback`]). Returns the volume and the rollback.
    pub fn switch_rollback(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<(VolumeRecord, Rollback), MgmtError> {
        self.write(|tx| {
            let mut rollback: Rollback = get(tx, ROLLBACKS, "rollback", name)?
                .ok_or_else(|| not_found("rollback of volume", name))?;
            let mut volume: VolumeRecord =
                get(tx, VOLUMES, "volume", name)?.ok_or_else(|| not_found("volume", name))?;
            if rollback.replaced.is_none() {
                rollback.replaced = Some(volume.object);
                volume.object = rollback.object;
                volume.size_bytes = size_bytes;
                volume.state = VolumeState::Online;
                put(tx, VOLUMES, name, &volume)?;
                put(tx, ROLLBACKS, name, &rollback)?;
            }
            Ok((volume, rollback))
        })
    }

    /// Ends the rollback of volume `name` that had not switched: the volume is online again
    /// with its own data and the rollback's record goes. Refused after the switch (the
    /// record's object is then the volume's data).
    pub fn abandon_rollback(&self, name: &str) -> Result<VolumeRecord, MgmtError> {
        self.write(|tx| {
            let rollback: Option<Rollback> = get(tx, ROLLBACKS, "rollback", name)?;
            if rollback.is_some_and(|r| r.replaced.is_some()) {
                return Err(internal(
                    &format!("rollback of '{name}'"),
                    "it switched already and cannot be abandoned",
                ));
            }
            delete(tx, ROLLBACKS, name)?;
            let mut volume: VolumeRecord =
                get(tx, VOLUMES, "volume", name)?.ok_or_else(|| not_found("volume", name))?;
            volume.state = VolumeState::Online;
            put(tx, VOLUMES, name, &volume)?;
            Ok(volume)
        })
    }

    /// Drops the record of a finished rollback of volume `name` (its replaced data is gone).
    pub fn forget_rollback(&self, name: &str) -> Result<(), MgmtError> {
        self.write(|tx| delete(tx, ROLLBACKS, name))
    }

    /// Every rollback record: those under way and those whose replaced data is still to go.
    pub fn rollbacks(&self) -> Result<Vec<(String, Rollback)>, MgmtError> {
        self.rows(ROLLBACKS, "rollback")
    }

    /// Everything that owns volume data on the targets: every volume, and the objects of
    /// rollbacks (a copy not switched to yet, a replaced object not yet removed) under their
    /// volume's layout with no size limit. What owns nothing here is a stray to `stria fsck`
    /// and to the recovery after a crash, so these must be listed while they exist.
    pub fn data_owners(&self) -> Result<Vec<VolumeRecord>, MgmtError> {
        let volumes = self.volumes()?;
        let mut owners = volumes.clone();
        for (name, rollback) in self.rollbacks()? {
            let Some(volume) = volumes.iter().find(|v| v.name == name) else { continue };
            for (object, what) in [(Some(rollback.object), "copy"), (rollback.replaced, "replaced")]
            {
                if let Some(object) = object.filter(|&o| o != volume.object) {
                    owners.push(VolumeRecord {
                        name: format!("{name} (rollback {what})"),
                        object,
                        size_bytes: u64::MAX,
                        ..volume.clone()
                    });
                }
            }
        }
        Ok(owners)
    }

    /// Changes a volume record in one transaction.
    pub fn update_volume(
        &self,
        name: &str,
        change: impl FnOnce(&mut VolumeRecord) -> Result<(), MgmtError>,
    ) -> Result<VolumeRecord, MgmtError> {
        self.write(|tx| {
            let mut volumes = tx.open_table(VOLUMES).map_err(|e| internal("volumes table", e))?;
            let mut record: VolumeRecord =
                match volumes.get(name).map_err(|e| internal("read", e))? {
                    Some(v) => decode("volume", name, v.value())?,
                    None => return Err(not_found("volume", name)),
                };
            change(&mut record)?;
            volumes.insert(name, encode(&record)?.as_slice()).map_err(|e| internal("update", e))?;
            Ok(record)
        })
    }

    /// Deletes the volume record (its data must be gone already). Copies made of it name
    /// their origin `NAME (deleted)` from then on, so a later volume of the same name is not
    /// taken for it (a rollback only takes the volume's own snapshots).
    pub fn remove_volume(&self, name: &str) -> Result<(), MgmtError> {
        self.write(|tx| {
            let mut origins = tx.open_table(ORIGINS).map_err(|e| internal("origins table", e))?;
            origins.remove(name).map_err(|e| internal("remove", e))?;
            let mut copies = Vec::new();
            for entry in origins.iter().map_err(|e| internal("listing origins", e))? {
                let (k, v) = entry.map_err(|e| internal("listing origins", e))?;
                let origin: VolumeOrigin = decode("origin", k.value(), v.value())?;
                if origin.source == name {
                    copies.push((k.value().to_string(), origin));
                }
            }
            for (copy, mut origin) in copies {
                origin.source = format!("{name} (deleted)");
                origins
                    .insert(copy.as_str(), encode(&origin)?.as_slice())
                    .map_err(|e| internal("update", e))?;
            }
            drop(origins);
            delete(tx, ROLLBACKS, name)?;
            let mut volumes = tx.open_table(VOLUMES).map_err(|e| internal("volumes table", e))?;
            let removed = volumes.remove(name).map_err(|e| internal("remove", e))?.is_some();
            if removed { Ok(()) } else { Err(not_found("volume", name)) }
        })
    }

    pub fn exports(&self) -> Result<Vec<ExportRecord>, MgmtError> {
        Ok(self.rows(EXPORTS, "export")?.into_iter().map(|(_, e)| e).collect())
    }

    /// Adds an export of an existing, online volume.
    pub fn add_export(&self, export: ExportRecord) -> Result<ExportRecord, MgmtError> {
        self.write(|tx| {
            let volumes = tx.open_table(VOLUMES).map_err(|e| internal("volumes table", e))?;
            let volume: VolumeRecord =
                match volumes.get(export.volume.as_str()).map_err(|e| internal("read", e))? {
                    Some(v) => decode("volume", &export.volume, v.value())?,
                    None => return Err(not_found("volume", &export.volume)),
                };
            if volume.state != VolumeState::Online {
                return Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!("volume '{}' is {}", volume.name, volume.state.name()),
                ));
            }
            let origins = tx.open_table(ORIGINS).map_err(|e| internal("origins table", e))?;
            let origin = origins.get(volume.name.as_str()).map_err(|e| internal("read", e))?;
            let origin: Option<VolumeOrigin> =
                origin.map(|v| decode("origin", &volume.name, v.value())).transpose()?;
            if origin.is_some_and(|o| o.snapshot) && !export.read_only {
                return Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!(
                        "volume '{}' is a snapshot: export it with --read-only, or clone it \
                         into a writable volume (stria volume clone)",
                        volume.name
                    ),
                ));
            }
            let mut exports = tx.open_table(EXPORTS).map_err(|e| internal("exports table", e))?;
            if exports.get(export.name.as_str()).map_err(|e| internal("read", e))?.is_some() {
                return Err(MgmtError::new(
                    MgmtStatus::Exists,
                    format!("an export named '{}' exists already", export.name),
                ));
            }
            exports
                .insert(export.name.as_str(), encode(&export)?.as_slice())
                .map_err(|e| internal("insert", e))?;
            Ok(export)
        })
    }

    pub fn remove_export(&self, name: &str) -> Result<ExportRecord, MgmtError> {
        self.write(|tx| {
            let mut exports = tx.open_table(EXPORTS).map_err(|e| internal("exports table", e))?;
            let removed = exports.remove(name).map_err(|e| internal("remove", e))?;
            match removed {
                Some(v) => decode("export", name, v.value()),
                None => Err(not_found("export", name)),
            }
        })
    }

    /// Changes an export's record (its access list) in one transaction.
    pub fn update_export(
        &self,
        name: &str,
        change: impl FnOnce(&mut ExportRecord) -> Result<(), MgmtError>,
    ) -> Result<ExportRecord, MgmtError> {
        self.write(|tx| {
            let mut exports = tx.open_table(EXPORTS).map_err(|e| internal("exports table", e))?;
            let mut record: ExportRecord =
                match exports.get(name).map_err(|e| internal("read", e))? {
                    Some(v) => decode("export", name, v.value())?,
                    None => return Err(not_found("export", name)),
                };
            change(&mut record)?;
            exports.insert(name, encode(&record)?.as_slice()).map_err(|e| internal("update", e))?;
            Ok(record)
        })
    }
}

#[cfg(test)]
mod tests {
    use stria_proto::fs::TargetId;

    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("stria-registry-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    fn layout() -> FileLayout {
        FileLayout { pool: "default".into(), chunk_bytes: 1 << 20, targets: vec![TargetId(1)] }
    }

    fn set(registry: &Registry, name: &str, change: impl FnOnce(&mut VolumeRecord)) {
        registry
            .update_volume(name, |v| {
                change(v);
                Ok(())
            })
            .expect("update");
    }

    fn state(registry: &Registry, name: &str) -> VolumeState {
        registry.volume(name).expect("volume").state
    }

    #[test]
    fn a_rollback_switches_once_and_its_objects_stay_owned_until_forgotten() {
        let dir = scratch("rollback");
        let registry = Registry::open(&dir.join("registry.redb")).expect("open");
        let vm = registry.create_volume("vm", 16 << 20, layout(), 1).expect("vm");
        let (_, snap) = registry.create_copy("vm", "snap", true, 2).expect("snapshot");
        set(&registry, "snap", |v| v.state = VolumeState::Online);
        set(&registry, "vm", |v| v.size_bytes = 32 << 20);
        let (_, clone) = registry.create_copy("vm", "clone", false, 3).expect("clone");
        set(&registry, "clone", |v| v.state = VolumeState::Online);

        let refused = registry.begin_rollback("vm", "clone").expect_err("a clone");
        assert_eq!(refused.status, MgmtStatus::Invalid, "{refused}");
        let refused = registry.begin_rollback("snap", "snap").expect_err("a snapshot itself");
        assert_eq!(refused.status, MgmtStatus::Conflict, "{refused}");

        let (_, from, rollback) = registry.begin_rollback("vm", "snap").expect("begin");
        assert_eq!(from.object, snap.object);
        assert!(![vm.object, snap.object, clone.object].contains(&rollback.object), "a fresh id");
        assert_eq!(state(&registry, "vm"), VolumeState::RollingBack);
        let owned: Vec<ObjectId> =
            registry.data_owners().expect("owners").iter().map(|v| v.object).collect();
        assert!(owned.contains(&rollback.object), "the copy is owned before the switch");
        let again = registry.begin_rollback("vm", "snap").expect_err("one at a time");
        assert_eq!(again.status, MgmtStatus::Conflict, "{again}");

        let (switched, done) = registry.switch_rollback("vm", 16 << 20).expect("switch");
        assert_eq!((switched.object, switched.size_bytes), (rollback.object, 16 << 20));
        assert_eq!((switched.state, done.replaced), (VolumeState::Online, Some(vm.object)));
        let (twice, _) = registry.switch_rollback("vm", 16 << 20).expect("switch again");
        assert_eq!(twice.object, rollback.object, "a second switch changes nothing");
        assert!(registry.abandon_rollback("vm").is_err(), "no abandon after the switch");
        assert_eq!(registry.volume("vm").expect("vm").object, rollback.object);
        let owned: Vec<ObjectId> =
            registry.data_owners().expect("owners").iter().map(|v| v.object).collect();
        assert!(owned.contains(&vm.object), "the replaced object is owned until it is removed");
        let refused = registry.begin_rollback("vm", "snap").expect_err("replaced data left");
        assert!(refused.message.contains("still being removed"), "{refused}");

        registry.forget_rollback("vm").expect("forget");
        assert!(registry.rollbacks().expect("rollbacks").is_empty());
        let owned: Vec<ObjectId> =
            registry.data_owners().expect("owners").iter().map(|v| v.object).collect();
        assert!(!owned.contains(&vm.object), "{owned:?}");

        // A rollback abandoned before its switch leaves the volume as it was.
        let (_, _, second) = registry.begin_rollback("vm", "snap").expect("begin");
        let back = registry.abandon_rollback("vm").expect("abandon");
        assert_eq!((back.object, back.state), (rollback.object, VolumeState::Online));
        assert_ne!(second.object, back.object);

        // Deleting the volume renames its copies' origin.
        registry.remove_volume("vm").expect("remove");
        assert_eq!(registry.origin("snap").expect("origin").expect("some").source, "vm (deleted)");
        registry.create_volume("vm", 16 << 20, layout(), 4).expect("a new vm");
        let refused = registry.begin_rollback("vm", "snap").expect_err("not its snapshot");
        assert_eq!(refused.status, MgmtStatus::Invalid, "{refused}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
