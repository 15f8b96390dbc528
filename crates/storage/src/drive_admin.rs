//! Drive changes on a running target: a new drive into a failed slot, a new hot spare.
//!
//! The storage service owns the live arrays, so it makes the change; the node owns the record
//! of what each target is made of (`DATA/node.json` under `stria up`), so the service reports
//! every change through a [`MembershipRecorder`] the node gives it at start. This crate never
//! knows the record's format, and the node never touches an array behind the service's back.
//!
//! Order of work, so a crash at any point leaves a node that reassembles correctly: the new
//! drive's path is recorded first (as a pending spare: assembly sorts drives by their labels,
//! and an unlabelled file is only warned about), then the array takes the drive, then the
//! final membership is recorded. The rebuild runs on the array's own thread; nothing here
//! waits for it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use stria_io::BlockDevice;
use stria_io::file::{DriveOptions, create_drive_file, open_drive, read_header};
use stria_proto::fs::{FsStatus, TargetId};
use stria_proto::wire::{
    DRIVE_CREATE_BYTES_MAX, DriveChangeRefused, DriveField, DrivePath, TargetAddSpare,
    TargetReplaceDrive, check_drive_path,
};
use stria_raid::superblock::{SUPERBLOCK_BYTES, Superblock};
use stria_raid::{Array, Level, RaidError};

use crate::{Refusal, StorageService, Target};

/// The drives a target is made of now: per slot the attached drive (a failed one stays
/// attached until it is replaced; `None` for a slot whose drive was missing at assembly),
/// then the hot spares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    pub members: Vec<Option<PathBuf>>,
    pub spares: Vec<PathBuf>,
}

/// Where the node keeps the record of its targets' drives. Called with the service's drive
/// lock held, so calls never overlap.
pub trait MembershipRecorder: Send + Sync {
    /// Records durably that `target` is made of `membership`.
    fn record(&self, target: TargetId, membership: &Membership) -> Result<(), String>;
}

/// What the storage service needs to change drives: where bare file names go and who keeps
/// the record.
pub struct DriveAdmin {
    /// The directory a bare file name given as a drive path means (`DATA/drives` under
    /// `stria up`).
    pub drive_dir: PathBuf,
    /// Directories of the node's own files (its data directory): a drive path inside one but
    /// outside `drive_dir` is refused, so a typo cannot turn the namespace into a drive.
    pub reserved_dirs: Vec<PathBuf>,
    pub recorder: Arc<dyn MembershipRecorder>,
}

impl std::fmt::Debug for DriveAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriveAdmin")
            .field("drive_dir", &self.drive_dir)
            .field("reserved_dirs", &self.reserved_dirs)
            .finish_non_exhaustive()
    }
}

/// The admin settings and the lock that runs drive changes one at a time (the checks of one
/// change must not interleave with another's, and the record is rewritten whole).
#[derive(Debug)]
pub(crate) struct Admin {
    settings: DriveAdmin,
    changes: Mutex<()>,
}

impl Admin {
    pub(crate) fn new(settings: DriveAdmin) -> Admin {
        Admin { settings, changes: Mutex::new(()) }
    }
}

/// A refused drive change: its status and the explanation carried in the reply.
fn refuse(status: FsStatus, field: Option<DriveField>, message: impl Into<String>) -> Refusal {
    let message = message.into();
    tracing::warn!(?status, ?field, "drive change refused: {message}");
    let body = DriveChangeRefused { message, field };
    Refusal { status: status.rpc_code(), message: postcard::to_stdvec(&body).unwrap_or_default() }
}

/// The membership of `array` as its status reports it.
pub fn membership(array: &Array) -> Membership {
    let status = array.status();
    Membership {
        members: status
            .members
            .iter()
            .map(|m| (m.device != "-").then(|| PathBuf::from(&m.device)))
            .collect(),
        spares: status.spares.iter().map(|s| PathBuf::from(&s.device)).collect(),
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    a == b
        || match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
}

/// The canonical form of a path that may not exist yet (its parent's canonical form).
fn canonical_or_parent(path: &Path) -> PathBuf {
    if let Ok(c) = path.canonicalize() {
        return c;
    }
    match (path.parent().and_then(|p| p.canonicalize().ok()), path.file_name()) {
        (Some(parent), Some(name)) => parent.join(name),
        _ => path.to_path_buf(),
    }
}

/// A drive opened for a change, and whether this change created its file (removed again if
/// the change fails).
struct NewDrive {
    path: PathBuf,
    dev: Arc<dyn BlockDevice>,
    created: bool,
}

impl NewDrive {
    fn discard(self) {
        let NewDrive { path, dev, created } = self;
        drop(dev);
        if created && let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), %e, "cannot remove the drive file made for a refused change");
        }
    }
}

impl StorageService {
    /// Connects the node's drive record: from now on drive changes are served.
    pub fn with_drive_admin(mut self, admin: DriveAdmin) -> StorageService {
        self.admin = Some(Arc::new(Admin::new(admin)));
        self
    }

    fn admin(&self) -> Result<&Admin, Refusal> {
        self.admin.as_deref().ok_or_else(|| {
            refuse(
                FsStatus::NotSupported,
                None,
                "this storage service has no drive record to keep changes in; drive changes \
                 are served by `stria up` nodes",
            )
        })
    }

    fn admin_target(&self, id: TargetId) -> Result<Arc<Target>, Refusal> {
        self.targets.get(&id).cloned().ok_or_else(|| {
            refuse(
                FsStatus::Stale,
                Some(DriveField::Target),
                format!("no target {} on this node", id.0),
            )
        })
    }

    /// Records the membership of `target` after a change the array made on its own (a hot
    /// spare taking a failed slot); failures are logged, since the array is right either way
    /// and assembly finds a spare listed among the spares.
    pub(crate) fn record_after_fail(&self, target: &Target) {
        let Some(admin) = self.admin.as_deref() else { return };
        let _changes = admin.changes.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = admin.settings.recorder.record(target.id, &membership(&target.array)) {
            tracing::error!(target = %target.id, "cannot record the drives after a failure: {e}");
        }
    }

    /// Serves [`TargetReplaceDrive`]: checks the slot and the drive, records the new path,
    /// puts the drive in and starts its rebuild.
    pub(crate) fn serve_replace(&self, r: &TargetReplaceDrive) -> Result<Arc<Target>, Refusal> {
        let admin = self.admin()?;
        let _changes = admin.changes.lock().unwrap_or_else(|e| e.into_inner());
        let target = self.admin_target(r.target)?;
        let status = target.array.status();
        let slot = r.slot as usize;
        let Some(member) = status.members.get(slot) else {
            return Err(refuse(
                FsStatus::Invalid,
                Some(DriveField::Slot),
                format!(
                    "slot {} does not exist: target {} has slots 0..{}",
                    r.slot,
                    r.target.0,
                    status.members.len().saturating_sub(1)
                ),
            ));
        };
        if target.array.geometry().level == Level::Raid0 {
            return Err(refuse(
                FsStatus::Busy,
                Some(DriveField::Slot),
                format!(
                    "target {} is raid0: a failed member's data is lost and cannot be rebuilt",
                    r.target.0
                ),
            ));
        }
        if matches!(member.state, "active" | "rebuilding") {
            return Err(refuse(
                FsStatus::Busy,
                Some(DriveField::Slot),
                format!(
                    "slot {} of target {} is {} ({}): fail it first (`stria target fail-drive` \
                     or POST /api/v1/drives/{}/fail)",
                    r.slot, r.target.0, member.state, member.device, member.drive_uuid
                ),
            ));
        }
        let path = admin.resolve(&r.path)?;
        // The slot's own failed drive, coming back: it is still attached (and locked), so the
        // array gets the same device again and resyncs only what changed while it was out.
        let own = Path::new(&member.device) == path
            || (member.device != "-" && same_path(Path::new(&member.device), &path));
        let drive = if own && r.create_bytes.is_none() {
            let dev = target.array.member_device(slot).ok_or_else(|| {
                refuse(FsStatus::Io, Some(DriveField::Path), "the slot's drive went away")
            })?;
            NewDrive { path: path.clone(), dev, created: false }
        } else {
            self.check_unused(&path)?;
            admin.open_new(&target, &path, r.create_bytes)?
        };
        if let Err(refusal) = self.record_pending(admin, &target, &drive) {
            drive.discard();
            return Err(refusal);
        }
        let dev = drive.dev.clone();
        if let Err(e) = target.array.replace(slot, dev) {
            let refusal = raid_refusal(e, Some(DriveField::Slot));
            drive.discard();
            self.record_now(admin, &target);
            return Err(refusal);
        }
        tracing::warn!(
            target = %r.target,
            slot = r.slot,
            drive = %path.display(),
            "drive replaced by operator request; rebuilding in the background"
        );
        self.record_now(admin, &target);
        Ok(target)
    }

    /// Serves [`TargetAddSpare`]: checks the drive, records it, labels it as a spare (which
    /// takes a slot that is out at once).
    pub(crate) fn serve_add_spare(&self, r: &TargetAddSpare) -> Result<Arc<Target>, Refusal> {
        let admin = self.admin()?;
        let _changes = admin.changes.lock().unwrap_or_else(|e| e.into_inner());
        let target = self.admin_target(r.target)?;
        if target.array.geometry().level == Level::Raid0 {
            return Err(refuse(
                FsStatus::Busy,
                Some(DriveField::Target),
                format!(
                    "target {} is raid0: it has no redundancy, so a spare could never rebuild \
                     a failed member",
                    r.target.0
                ),
            ));
        }
        let path = admin.resolve(&r.path)?;
        self.check_unused(&path)?;
        let drive = admin.open_new(&target, &path, r.create_bytes)?;
        if let Err(refusal) = self.record_pending(admin, &target, &drive) {
            drive.discard();
            return Err(refusal);
        }
        let dev = drive.dev.clone();
        if let Err(e) = target.array.add_spare(dev) {
            let refusal = raid_refusal(e, Some(DriveField::Path));
            drive.discard();
            self.record_now(admin, &target);
            return Err(refusal);
        }
        tracing::info!(target = %r.target, drive = %path.display(), "hot spare added by operator request");
        self.record_now(admin, &target);
        Ok(target)
    }

    /// Refuses a path that is a member or spare of any target of this node already.
    fn check_unused(&self, path: &Path) -> Result<(), Refusal> {
        for t in self.targets.values() {
            let status = t.array.status();
            for m in status.members.iter().filter(|m| m.device != "-") {
                if same_path(Path::new(&m.device), path) {
                    let slot = m.slot.map_or_else(String::new, |s| format!(" slot {s}"));
                    return Err(refuse(
                        FsStatus::Invalid,
                        Some(DriveField::Path),
                        format!(
                            "{} is already a drive of target {}{slot} ({}); give a new drive",
                            path.display(),
                            t.id.0,
                            m.state
                        ),
                    ));
                }
            }
            if status.spares.iter().any(|s| same_path(Path::new(&s.device), path)) {
                return Err(refuse(
                    FsStatus::Invalid,
                    Some(DriveField::Path),
                    format!("{} is already a hot spare of target {}", path.display(), t.id.0),
                ));
            }
        }
        Ok(())
    }

    /// Records the target's drives plus `drive` (as a spare) before the array takes it.
    fn record_pending(
        &self,
        admin: &Admin,
        target: &Target,
        drive: &NewDrive,
    ) -> Result<(), Refusal> {
        let mut pending = membership(&target.array);
        if !pending.members.iter().flatten().chain(&pending.spares).any(|p| p == &drive.path) {
            pending.spares.push(drive.path.clone());
        }
        admin.settings.recorder.record(target.id, &pending).map_err(|e| {
            refuse(
                FsStatus::Io,
                None,
                format!("cannot record the new drive, so nothing was changed: {e}"),
            )
        })
    }

    /// Records the target's drives as they are now. The pending record already lists the new
    /// drive, so a failure here only leaves the record less tidy: logged, not refused.
    fn record_now(&self, admin: &Admin, target: &Target) {
        if let Err(e) = admin.settings.recorder.record(target.id, &membership(&target.array)) {
            tracing::error!(target = %target.id, "cannot record the target's drives: {e}");
        }
    }
}

impl Admin {
    /// The drive path of a request, checked and made absolute.
    fn resolve(&self, path: &str) -> Result<PathBuf, Refusal> {
        let resolved = match check_drive_path(path) {
            Ok(DrivePath::Absolute(p)) => PathBuf::from(p),
            Ok(DrivePath::InDriveDir(name)) => self.settings.drive_dir.join(name),
            Err(message) => return Err(refuse(FsStatus::Invalid, Some(DriveField::Path), message)),
        };
        let canonical = canonical_or_parent(&resolved);
        let drive_dir = canonical_or_parent(&self.settings.drive_dir);
        let reserved = self
            .settings
            .reserved_dirs
            .iter()
            .map(|d| canonical_or_parent(d))
            .find(|d| canonical.starts_with(d));
        if let Some(dir) = reserved
            && !canonical.starts_with(&drive_dir)
        {
            return Err(refuse(
                FsStatus::Invalid,
                Some(DriveField::Path),
                format!(
                    "{} is inside the node's data directory {}, which holds the node's own \
                     files; drive files there go in {} (give a bare file name)",
                    resolved.display(),
                    dir.display(),
                    self.settings.drive_dir.display()
                ),
            ));
        }
        Ok(resolved)
    }

    /// Creates (with `create_bytes`) or checks an existing drive at `path` and opens it.
    fn open_new(
        &self,
        target: &Target,
        path: &Path,
        create_bytes: Option<u64>,
    ) -> Result<NewDrive, Refusal> {
        let needed = target.array.layout().min_capacity();
        let path_error = |status, message: String| refuse(status, Some(DriveField::Path), message);
        let created = match create_bytes {
            Some(bytes) => {
                if bytes < needed || bytes > DRIVE_CREATE_BYTES_MAX {
                    return Err(refuse(
                        FsStatus::Invalid,
                        Some(DriveField::CreateBytes),
                        format!(
                            "create_bytes {bytes} is outside what target {} can use: at least \
                             {needed} bytes (its drives' layout), at most {DRIVE_CREATE_BYTES_MAX}",
                            target.id.0
                        ),
                    ));
                }
                if path.symlink_metadata().is_ok() {
                    return Err(path_error(
                        FsStatus::Exists,
                        format!(
                            "{} exists already: leave out create_bytes to use it as the drive, \
                             or give a new file name",
                            path.display()
                        ),
                    ));
                }
                if path.starts_with(&self.settings.drive_dir) {
                    let _ = std::fs::create_dir_all(&self.settings.drive_dir);
                }
                create_drive_file(path, bytes)
                    .map_err(|e| path_error(FsStatus::Invalid, e.to_string()))?;
                true
            }
            None => {
                let meta = std::fs::metadata(path).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        path_error(
                            FsStatus::NotFound,
                            format!(
                                "{} does not exist: give create_bytes (the CLI's --size) to \
                                 create it as a sparse drive file",
                                path.display()
                            ),
                        )
                    } else {
                        path_error(
                            FsStatus::Invalid,
                            format!("cannot stat {}: {e}", path.display()),
                        )
                    }
                })?;
                use std::os::unix::fs::FileTypeExt;
                if !meta.is_file() && !meta.file_type().is_block_device() {
                    return Err(path_error(
                        FsStatus::Invalid,
                        format!("{} is neither a regular file nor a block device", path.display()),
                    ));
                }
                check_label(target, path)?;
                false
            }
        };
        let opened = open_drive(path, &DriveOptions::default()).map_err(|e| {
            let text = e.to_string();
            let status =
                if text.contains("in use by another") { FsStatus::Busy } else { FsStatus::Invalid };
            path_error(status, text)
        });
        let drive = match opened {
            Ok(dev) => NewDrive { path: path.to_path_buf(), dev, created },
            Err(refusal) => {
                if created {
                    let _ = std::fs::remove_file(path);
                }
                return Err(refusal);
            }
        };
        if drive.dev.capacity_bytes() < needed {
            let held = drive.dev.capacity_bytes();
            drive.discard();
            return Err(path_error(
                FsStatus::Invalid,
                format!(
                    "{} holds {held} bytes; target {} needs at least {needed} bytes per drive",
                    path.display(),
                    target.id.0
                ),
            ));
        }
        Ok(drive)
    }
}

/// Refuses a drive that carries the label of another Stria array: it may be a live array's
/// member (a label of this array is fine: an old member coming back).
fn check_label(target: &Target, path: &Path) -> Result<(), Refusal> {
    let Ok(raw) = read_header(path, SUPERBLOCK_BYTES) else { return Ok(()) };
    let Ok(label) = Superblock::decode(&raw) else { return Ok(()) };
    if label.array_uuid == target.array.uuid() {
        return Ok(());
    }
    Err(refuse(
        FsStatus::Busy,
        Some(DriveField::Path),
        format!(
            "{} carries the label of another Stria array ({}, {} slot {}); it may hold live \
             data. If it is free, clear its first 4 KiB before using it",
            path.display(),
            label.array_uuid,
            label.level,
            label.slot
        ),
    ))
}

/// The refusal for an error of the array itself.
fn raid_refusal(error: RaidError, field: Option<DriveField>) -> Refusal {
    match error {
        RaidError::Refused(message) => refuse(FsStatus::Busy, field, message),
        RaidError::InvalidConfig(message) => refuse(FsStatus::Invalid, field, message),
        other => refuse(FsStatus::Io, None, format!("the array failed to take the drive: {other}")),
    }
}
