//! Requests against the registry, with their data work and the gateway kept in step.

use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use stria_client::{Client, DriveChangeError};
use stria_proto::fs::{CHUNK_BYTES_DEFAULT, FileLayout, FsStatus, ObjectId, TargetId};
use stria_proto::mgmt::{
    ACL_RULES_MAX, AclRuleInfo, ExportInfo, MgmtError, MgmtReply, MgmtRequest, MgmtResult,
    MgmtStatus, VOLUME_ALIGN_BYTES, VOLUME_BYTES_MAX, VolumeInfo, VolumeIoCounts, check_name,
    mgmt_method,
};
use stria_proto::net::IpNet;
use stria_proto::wire::DriveField;
use stria_rpc::{BoxFuture, Request, Response, Service};

use crate::events::{EventKind, EventLog, Severity};
use crate::registry::{AclRule, ExportRecord, Registry, Rollback, VolumeRecord, VolumeState};

/// The targets of a pool, by name; empty when there is no such pool.
pub type PoolResolver = Arc<dyn Fn(&str) -> Vec<TargetId> + Send + Sync>;

/// Live figures of one export.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub connections: u64,
    pub refused: u64,
}

/// One NBD client in transmission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayClient {
    pub peer: std::net::SocketAddr,
    pub export: String,
    pub tls: bool,
    pub since_unix_s: u64,
}

/// What serves the exports (the NBD gateway). `apply` gets the whole current set after every
/// change, each export with its volume.
pub trait Gateway: Send + Sync {
    fn apply(&self, exports: Vec<(ExportRecord, VolumeRecord)>);
    fn stats(&self, export: &str) -> ExportStats;
    /// Reads and writes the gateway served for the volume since it started.
    fn volume_io(&self, _object: ObjectId) -> VolumeIoCounts {
        VolumeIoCounts::default()
    }
    /// The NBD clients connected now.
    fn clients(&self) -> Vec<GatewayClient> {
        Vec::new()
    }
    /// Holds back new writes to the volume `object` and waits for those in progress; writes
    /// go on when the returned hold drops. A snapshot taken meanwhile is of one instant on
    /// every target. None when the gateway serves no such volume (nothing writes to it).
    fn hold_writes(&self, _object: ObjectId) -> Option<WriteHold> {
        None
    }
    /// Whether anything of the gateway still holds the volume `object`'s backend: an export of
    /// it, or a connection (also one whose export was removed, until it has answered what it
    /// had in flight and closed).
    fn in_use(&self, _object: ObjectId) -> bool {
        false
    }
}

/// Writes held back by [`Gateway::hold_writes`] until this drops.
pub type WriteHold = Box<dyn std::any::Any + Send>;

/// How long a rollback or a delete waits for the connections to a volume to close after its
/// exports stopped (they finish the requests they have in flight first).
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn now_unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn fs_error(what: &str, status: FsStatus) -> MgmtError {
    let kind = if status == FsStatus::NoSpace { MgmtStatus::NoSpace } else { MgmtStatus::Internal };
    MgmtError::new(kind, format!("{what}: {status}"))
}

fn invalid(message: String) -> MgmtError {
    MgmtError::new(MgmtStatus::Invalid, message)
}

pub(crate) fn check_size(size: u64) -> Result<(), MgmtError> {
    if size == 0 || !size.is_multiple_of(VOLUME_ALIGN_BYTES) || size > VOLUME_BYTES_MAX {
        return Err(invalid(format!(
            "volume size {size} must be a non-zero multiple of {VOLUME_ALIGN_BYTES} bytes, at \
             most {} TiB",
            VOLUME_BYTES_MAX >> 40
        )));
    }
    Ok(())
}

pub(crate) fn parse_rule(net: &str, tls_identity: Option<String>) -> Result<AclRule, MgmtError> {
    let net: IpNet =
        net.parse().map_err(|e: stria_proto::net::IpNetError| invalid(e.to_string()))?;
    if let Some(id) = &tls_identity
        && (id.is_empty() || id.len() > 255 || id.chars().any(char::is_control))
    {
        return Err(invalid(format!("TLS identity '{id}' must be 1 to 255 printable characters")));
    }
    Ok(AclRule { net: net.to_string(), tls_identity })
}

/// A refused drive change: the error and the request field at fault (`id`, `slot`, `path`,
/// `create_bytes`), if the storage service named one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveChangeRefusal {
    pub error: MgmtError,
    pub field: Option<&'static str>,
}

impl From<DriveChangeError> for DriveChangeRefusal {
    fn from(e: DriveChangeError) -> DriveChangeRefusal {
        let status = match e.status {
            FsStatus::Stale => MgmtStatus::NotFound,
            // A path that does not exist is a bad value in the request, not a missing resource.
            FsStatus::Invalid | FsStatus::NotFound | FsStatus::NameTooLong => MgmtStatus::Invalid,
            FsStatus::Exists => MgmtStatus::Exists,
            FsStatus::Busy => MgmtStatus::Conflict,
            FsStatus::NoSpace => MgmtStatus::NoSpace,
            _ => MgmtStatus::Internal,
        };
        let field = e.field.map(|f| match f {
            DriveField::Target => "id",
            DriveField::Slot => "slot",
            DriveField::Path => "path",
            DriveField::CreateBytes => "create_bytes",
        });
        DriveChangeRefusal { error: MgmtError::new(status, e.message), field }
    }
}

/// The management service. Cheap to clone.
#[derive(Clone)]
pub struct Mgmt {
    registry: Arc<Registry>,
    client: Client,
    pools: PoolResolver,
    gateway: Arc<RwLock<Option<Arc<dyn Gateway>>>>,
    events: Arc<EventLog>,
    /// Held by requests that change a volume's data (resize, delete, snapshot, clone) and by
    /// export adds: a delete or shrink of a volume being copied would leave the copy with part
    /// of its data, and a new export's writes would not be held back.
    data_changes: Arc<std::sync::Mutex<()>>,
}

impl std::fmt::Debug for Mgmt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mgmt").field("registry", &self.registry).finish_non_exhaustive()
    }
}

impl Mgmt {
    /// A service over `registry`, doing data work through `client`. Finishes deletes that a
    /// stop interrupted.
    pub fn new(registry: Registry, client: Client, pools: PoolResolver) -> Result<Mgmt, MgmtError> {
        let mgmt = Mgmt {
            registry: Arc::new(registry),
            client,
            pools,
            gateway: Arc::new(RwLock::new(None)),
            events: Arc::new(EventLog::new()),
            data_changes: Arc::default(),
        };
        for volume in mgmt.registry.volumes()? {
            match volume.state {
                VolumeState::Deleting => {
                    tracing::info!(volume = %volume.name, "finishing an interrupted volume delete");
                    mgmt.finish_delete(&volume)?;
                }
                VolumeState::Copying => {
                    tracing::warn!(volume = %volume.name,
                        "removing a snapshot or clone whose copy a stop interrupted");
                    mgmt.finish_delete(&volume)?;
                }
                VolumeState::RollingBack | VolumeState::Online => {}
            }
        }
        mgmt.recover_rollbacks()?;
        Ok(mgmt)
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The node's recent events: every change made here is recorded in it.
    pub fn events(&self) -> &EventLog {
        &self.events
    }

    /// The client the service does its data work through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Refused initiator attempts per export, as the gateway counts them.
    pub fn export_refusals(&self) -> Vec<(String, u64)> {
        let Some(gateway) = self.gateway() else { return Vec::new() };
        let exports = self.registry.exports().unwrap_or_default();
        exports.into_iter().map(|e| (e.name.clone(), gateway.stats(&e.name).refused)).collect()
    }

    /// Takes drive `slot` of `target` out of service, through the storage service as
    /// `stria target fail-drive` does. Blocking.
    pub fn fail_drive(&self, target: TargetId, slot: u32) -> Result<(), MgmtError> {
        match self.client.fail_drive(target, slot) {
            Ok(_) => Ok(()),
            Err(FsStatus::Stale) => Err(MgmtError::new(
                MgmtStatus::NotFound,
                format!("no target {target} on this node"),
            )),
            Err(FsStatus::Busy) => Err(MgmtError::new(
                MgmtStatus::Conflict,
                format!(
                    "target {target} refused to fail slot {slot}: it is out of service already, \
                     or failing it would lose data (see the log)"
                ),
            )),
            Err(status) => Err(fs_error("failing the drive", status)),
        }
    }

    /// Puts the drive at `path` into failed `slot` of `target` through the storage service, as
    /// `stria target replace-drive` does; the rebuild runs in the background. Blocking.
    pub fn replace_drive(
        &self,
        target: TargetId,
        slot: u32,
        path: &str,
        create_bytes: Option<u64>,
    ) -> Result<(), DriveChangeRefusal> {
        self.client
            .replace_drive(target, slot, path, create_bytes)
            .map_err(DriveChangeRefusal::from)?;
        self.events.record(
            EventKind::DriveReplaced,
            Severity::Info,
            format!("target/{}", target.0),
            format!("{path} replaces the drive in slot {slot} of target {}; rebuilding", target.0),
        );
        Ok(())
    }

    /// Labels the drive at `path` as a hot spare of `target`, as `stria target add-spare`
    /// does. Blocking.
    pub fn add_spare(
        &self,
        target: TargetId,
        path: &str,
        create_bytes: Option<u64>,
    ) -> Result<(), DriveChangeRefusal> {
        self.client.add_spare(target, path, create_bytes).map_err(DriveChangeRefusal::from)?;
        self.events.record(
            EventKind::SpareAdded,
            Severity::Info,
            format!("target/{}", target.0),
            format!("{path} is a hot spare of target {}", target.0),
        );
        Ok(())
    }

    /// Connects the gateway and gives it the current exports.
    pub fn set_gateway(&self, gateway: Arc<dyn Gateway>) -> Result<(), MgmtError> {
        *self.gateway.write().unwrap_or_else(|e| e.into_inner()) = Some(gateway);
        self.publish()
    }

    /// The NBD clients connected now (none without a gateway).
    pub fn gateway_clients(&self) -> Vec<GatewayClient> {
        self.gateway().map(|g| g.clients()).unwrap_or_default()
    }

    /// Each volume's gateway counters, for the performance series (none without a gateway).
    pub fn volume_counters(&self) -> Vec<(String, VolumeIoCounts)> {
        let Some(gateway) = self.gateway() else { return Vec::new() };
        match self.registry.volumes() {
            Ok(volumes) => {
                volumes.iter().map(|v| (v.name.clone(), gateway.volume_io(v.object))).collect()
            }
            Err(e) => {
                tracing::warn!("cannot read the volumes for their performance series: {e}");
                Vec::new()
            }
        }
    }

    fn gateway(&self) -> Option<Arc<dyn Gateway>> {
        self.gateway.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sends the current exports to the gateway.
    fn publish(&self) -> Result<(), MgmtError> {
        let Some(gateway) = self.gateway() else { return Ok(()) };
        let volumes = self.registry.volumes()?;
        let mut set = Vec::new();
        for export in self.registry.exports()? {
            // A volume rolling back is not served until it is whole again.
            let online = |v: &&VolumeRecord| v.state == VolumeState::Online;
            if let Some(v) = volumes.iter().filter(online).find(|v| v.name == export.volume) {
                set.push((export, v.clone()));
            }
        }
        gateway.apply(set);
        Ok(())
    }

    /// Carries out one request. Blocking: call it off the async runtime.
    pub fn handle(&self, request: MgmtRequest) -> MgmtResult {
        let op = request.op_name();
        let event = change_event(&request);
        let result = self.dispatch(request);
        match &result {
            Ok(_) => tracing::debug!(op, "management request done"),
            Err(e) => tracing::info!(op, status = ?e.status, "management request refused: {e}"),
        }
        if let (Ok(_), Some((kind, subject, message))) = (&result, event) {
            self.events.record(kind, Severity::Info, subject, message);
        }
        result
    }

    fn dispatch(&self, request: MgmtRequest) -> MgmtResult {
        // An export added during a copy would write to the source unheld.
        let _data_change = matches!(
            request,
            MgmtRequest::VolumeResize { .. }
                | MgmtRequest::VolumeDelete { .. }
                | MgmtRequest::VolumeCopy { .. }
                | MgmtRequest::VolumeRollback { .. }
                | MgmtRequest::ExportAdd { .. }
        )
        .then(|| self.data_changes.lock().unwrap_or_else(|e| e.into_inner()));
        match request {
            MgmtRequest::VolumeCreate { name, size_bytes, pool, stripe_count, stripe_bytes } => {
                self.create_volume(&name, size_bytes, &pool, stripe_count, stripe_bytes)
            }
            MgmtRequest::VolumeList => {
                let volumes = self.registry.volumes()?;
                let exports = self.registry.exports()?;
                let infos = volumes.iter().map(|v| self.volume_info_with(v, &exports)).collect();
                Ok(MgmtReply::Volumes(infos))
            }
            MgmtRequest::VolumeShow { name } => {
                Ok(MgmtReply::Volume(self.volume_info(&self.registry.volume(&name)?)))
            }
            MgmtRequest::VolumeResize { name, size_bytes, force } => {
                self.resize_volume(&name, size_bytes, force)
            }
            MgmtRequest::VolumeDelete { name } => self.delete_volume(&name),
            MgmtRequest::VolumeCopy { source, name, snapshot } => {
                self.copy_volume(&source, &name, snapshot)
            }
            MgmtRequest::VolumeRollback { name, snapshot } => {
                self.rollback_volume(&name, &snapshot)
            }
            MgmtRequest::ExportAdd { volume, name, read_only, description } => {
                let name = name.unwrap_or_else(|| volume.clone());
                check_name("export", &name)?;
                if description.len() > 1024 {
                    return Err(invalid("an export description is at most 1024 bytes".into()));
                }
                let export = self.registry.add_export(ExportRecord {
                    name,
                    volume,
                    read_only,
                    description,
                    acl: Vec::new(),
                })?;
                self.publish()?;
                Ok(MgmtReply::Export(self.export_info(&export)))
            }
            MgmtRequest::ExportList => {
                let exports = self.registry.exports()?;
                Ok(MgmtReply::Exports(exports.iter().map(|e| self.export_info(e)).collect()))
            }
            MgmtRequest::ExportRemove { name } => {
                let export = self.registry.remove_export(&name)?;
                self.publish()?;
                Ok(MgmtReply::Export(self.export_info(&export)))
            }
            MgmtRequest::InitiatorAllow { export, net, tls_identity } => {
                let rule = parse_rule(&net, tls_identity)?;
                let record = self.registry.update_export(&export, |e| {
                    if !e.acl.contains(&rule) {
                        if e.acl.len() >= ACL_RULES_MAX {
                            return Err(invalid(format!(
                                "export '{export}' has {ACL_RULES_MAX} rules already"
                            )));
                        }
                        e.acl.push(rule.clone());
                    }
                    Ok(())
                })?;
                self.publish()?;
                Ok(MgmtReply::Export(self.export_info(&record)))
            }
            MgmtRequest::InitiatorDeny { export, net, tls_identity } => {
                let rule = parse_rule(&net, tls_identity)?;
                let record = self.registry.update_export(&export, |e| {
                    let before = e.acl.len();
                    e.acl.retain(|r| *r != rule);
                    if e.acl.len() == before {
                        return Err(MgmtError::new(
                            MgmtStatus::NotFound,
                            format!("export '{export}' has no rule for {}", describe(&rule)),
                        ));
                    }
                    Ok(())
                })?;
                self.publish()?;
                Ok(MgmtReply::Export(self.export_info(&record)))
            }
        }
    }

    fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        pool: &str,
        stripe_count: u32,
        stripe_bytes: u32,
    ) -> MgmtResult {
        check_name("volume", name)?;
        check_size(size_bytes)?;
        let pool = if pool.is_empty() { "default" } else { pool };
        let targets = (self.pools)(pool);
        if targets.is_empty() {
            return Err(MgmtError::new(MgmtStatus::NotFound, format!("no pool named '{pool}'")));
        }
        let count = match stripe_count {
            0 => targets.len(),
            n if n as usize <= targets.len() => n as usize,
            n => {
                return Err(invalid(format!(
                    "stripe count {n} is more than the {} targets of pool '{pool}'",
                    targets.len()
                )));
            }
        };
        // Volumes start on different targets so narrow ones spread over the pool.
        let start = self.registry.volumes()?.len() % targets.len();
        let layout = FileLayout {
            pool: pool.to_string(),
            chunk_bytes: if stripe_bytes == 0 { CHUNK_BYTES_DEFAULT } else { stripe_bytes },
            targets: (0..count).map(|i| targets[(start + i) % targets.len()]).collect(),
        };
        layout.validate().map_err(invalid)?;
        let record = self.registry.create_volume(name, size_bytes, layout, now_unix_s())?;
        tracing::info!(volume = name, size_bytes, object = %record.object, "volume created");
        Ok(MgmtReply::Volume(self.volume_info(&record)))
    }

    /// A snapshot (read-only) or clone of `source` named `name`: the registry records it as
    /// copying, the targets begin the copy, then copy their chunk records (sharing the
    /// blocks), then it goes online. The gateway holds the source's writes back while the
    /// copy begins on every target, so the copy is of one instant; once begun, a write to the
    /// source copies its chunk first, so writes need not wait for the rest.
    fn copy_volume(&self, source: &str, name: &str, snapshot: bool) -> MgmtResult {
        check_name("volume", name)?;
        let (from, record) = self.registry.create_copy(source, name, snapshot, now_unix_s())?;
        let io = self.client.volume(from.object, from.layout.clone(), from.size_bytes);
        let started = std::time::Instant::now();
        let begun = {
            let _hold = self.gateway().and_then(|g| g.hold_writes(from.object));
            io.begin_clone_to(record.object)
        };
        let held = started.elapsed();
        // Made durable after the copy is made: a stop before this sync leaves the record
        // `copying`.
        let copy = self.client.volume(record.object, record.layout.clone(), record.size_bytes);
        let copied =
            begun.and_then(|()| io.finish_clone_to(record.object)).and_then(|()| copy.flush());
        tracing::info!(
            volume = name,
            writes_held_ms = held.as_secs_f64() * 1e3,
            copy_ms = started.elapsed().as_secs_f64() * 1e3,
            ok = copied.is_ok(),
            "volume copy made"
        );
        if let Err(status) = copied {
            // What some targets copied goes with the record; if that fails too, the record
            // stays `copying` and the next start removes it.
            if let Err(e) = self.finish_delete(&record) {
                tracing::warn!(volume = name, "removing a failed copy: {e}");
            }
            return Err(fs_error("copying the volume's data", status));
        }
        let record = self.registry.update_volume(name, |v| {
            v.state = VolumeState::Online;
            Ok(())
        })?;
        let kind = if snapshot { "snapshot" } else { "clone" };
        tracing::info!(volume = name, source, object = %record.object, "volume {kind} created");
        Ok(MgmtReply::Volume(self.volume_info(&record)))
    }

    /// Gives volume `name` the data and size of its snapshot `snapshot` (see [`Rollback`]).
    /// Refused while an NBD client is connected to the volume: that client's cached blocks
    /// would no longer be the volume's. The volume's exports stop while it runs.
    fn rollback_volume(&self, name: &str, snapshot: &str) -> MgmtResult {
        let connected = self.connected_clients(name)?;
        if !connected.is_empty() {
            return Err(MgmtError::new(
                MgmtStatus::Conflict,
                format!(
                    "volume '{name}' has NBD clients connected ({}); disconnect them before \
                     rolling it back",
                    connected.join(", ")
                ),
            ));
        }
        let (volume, from, rollback) = self.registry.begin_rollback(name, snapshot)?;
        let started = std::time::Instant::now();
        let copied = self.copy_for_rollback(&volume, &from, &rollback);
        if let Err(e) = copied {
            self.abandon_rollback(&volume);
            return Err(e);
        }
        crash_point("rollback-copied");
        let (record, rollback) = match self.registry.switch_rollback(name, from.size_bytes) {
            Ok(switched) => switched,
            Err(e) => {
                self.abandon_rollback(&volume);
                return Err(e);
            }
        };
        crash_point("rollback-switched");
        if let Err(e) = self.publish() {
            tracing::warn!(volume = name, "serving the rolled-back volume: {e}");
        }
        self.remove_replaced(&record, &rollback);
        tracing::info!(
            volume = name,
            snapshot,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "volume rolled back"
        );
        Ok(MgmtReply::Volume(self.volume_info(&record)))
    }

    /// The names of the exports of volume `name`.
    fn exports_of(&self, name: &str) -> Result<Vec<String>, MgmtError> {
        let exports = self.registry.exports()?.into_iter();
        Ok(exports.filter(|e| e.volume == name).map(|e| e.name).collect())
    }

    /// Waits until no connection of the gateway holds `volume`'s data any more (those of
    /// exports just removed finish their requests in flight first), at most [`DRAIN_WAIT`].
    fn wait_unused(&self, volume: &VolumeRecord) -> Result<(), MgmtError> {
        let Some(gateway) = self.gateway() else { return Ok(()) };
        let deadline = std::time::Instant::now() + DRAIN_WAIT;
        while gateway.in_use(volume.object) {
            if std::time::Instant::now() > deadline {
                let left = self.connected_clients(&volume.name)?;
                return Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!(
                        "NBD connections to volume '{}' are still open {} s after its exports \
                         stopped{}",
                        volume.name,
                        DRAIN_WAIT.as_secs(),
                        if left.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", left.join(", "))
                        }
                    ),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
    }

    /// The NBD clients connected to the exports of volume `name`, as `PEER on export 'X'`.
    fn connected_clients(&self, name: &str) -> Result<Vec<String>, MgmtError> {
        let exports = self.exports_of(name)?;
        let clients = self.gateway().map(|g| g.clients()).unwrap_or_default();
        Ok(clients
            .into_iter()
            .filter(|c| exports.contains(&c.export))
            .map(|c| format!("{} on export '{}'", c.peer, c.export))
            .collect())
    }

    /// The rollback's steps before its switch: the volume's exports stop (a client that
    /// connected since the check is closed by the gateway, after its requests in flight, and
    /// waited for), then the snapshot's records are copied into the rollback's object and made
    /// durable.
    fn copy_for_rollback(
        &self,
        volume: &VolumeRecord,
        from: &VolumeRecord,
        rollback: &Rollback,
    ) -> Result<(), MgmtError> {
        self.publish()?;
        self.wait_unused(volume)?;
        let source = self.client.volume(from.object, from.layout.clone(), from.size_bytes);
        let copy = self.client.volume(rollback.object, volume.layout.clone(), from.size_bytes);
        source
            .clone_to(rollback.object)
            .and_then(|()| copy.flush())
            .map_err(|status| fs_error("copying the snapshot's data", status))
    }

    /// After the switch: removes the data the rollback replaced, then its record. A failure
    /// is logged and left for the next start (the record keeps the replaced object owned, so
    /// nothing takes it for a stray meanwhile).
    fn remove_replaced(&self, volume: &VolumeRecord, rollback: &Rollback) {
        let Some(replaced) = rollback.replaced.filter(|&o| o != volume.object) else { return };
        let removed = self
            .remove_data(replaced, volume, "removing the data a rollback replaced")
            .and_then(|()| self.registry.forget_rollback(&volume.name));
        if let Err(e) = removed {
            tracing::warn!(volume = %volume.name, "{e}; the next start tries again");
        }
    }

    /// Removes every chunk of `object`, laid out as `volume`, durably; `what` names it in an
    /// error.
    fn remove_data(
        &self,
        object: ObjectId,
        volume: &VolumeRecord,
        what: &str,
    ) -> Result<(), MgmtError> {
        let io = self.client.volume(object, volume.layout.clone(), volume.size_bytes);
        io.remove_all().and_then(|()| io.flush()).map_err(|e| fs_error(what, e))
    }

    /// Before the switch: drops the partial copy and leaves the volume as it was, served
    /// again. Never touches the volume's own object.
    fn abandon_rollback(&self, volume: &VolumeRecord) {
        let ended = match self.registry.rollback(&volume.name) {
            Ok(Some(now)) if now.replaced.is_none() && now.object != volume.object => self
                .remove_data(now.object, volume, "removing a rollback's partial copy")
                .and_then(|()| self.registry.abandon_rollback(&volume.name))
                .and_then(|_| self.publish()),
            Ok(now) => Err(MgmtError::new(
                MgmtStatus::Internal,
                format!("rollback of '{}' is not abandonable: {now:?}", volume.name),
            )),
            Err(e) => Err(e),
        };
        if let Err(e) = ended {
            // The volume stays `rolling-back`; the next start ends the rollback.
            tracing::warn!(volume = %volume.name, "ending a failed rollback: {e}");
        }
    }

    /// At start: rollbacks a stop interrupted before their switch are abandoned (the volume
    /// keeps its data from before), and the data replaced by finished ones is removed.
    fn recover_rollbacks(&self) -> Result<(), MgmtError> {
        for (name, rollback) in self.registry.rollbacks()? {
            let volume = self.registry.volume(&name)?;
            if rollback.replaced.is_some() {
                tracing::info!(volume = %name, "removing the data a rollback replaced");
                self.remove_replaced(&volume, &rollback);
            } else {
                tracing::warn!(volume = %name, snapshot = %rollback.snapshot,
                    "a stop interrupted the rollback before it took effect: the volume keeps \
                     its data; roll it back again");
                self.abandon_rollback(&volume);
            }
        }
        Ok(())
    }

    fn resize_volume(&self, name: &str, size_bytes: u64, force: bool) -> MgmtResult {
        check_size(size_bytes)?;
        let volume = self.registry.volume(name)?;
        if volume.state != VolumeState::Online {
            return Err(MgmtError::new(
                MgmtStatus::Conflict,
                format!("volume '{name}' is {}", volume.state.name()),
            ));
        }
        if self.registry.origin(name)?.is_some_and(|o| o.snapshot) {
            return Err(MgmtError::new(
                MgmtStatus::Conflict,
                format!(
                    "volume '{name}' is a snapshot and keeps its size; clone it into a \
                     writable volume (stria volume clone) to resize"
                ),
            ));
        }
        if size_bytes < volume.size_bytes {
            if !force {
                return Err(MgmtError::new(
                    MgmtStatus::Conflict,
                    format!(
                        "shrinking volume '{name}' from {} to {size_bytes} bytes destroys the data \
                         past the new end; repeat with --force to do it",
                        volume.size_bytes
                    ),
                ));
            }
            // Data past the new end goes first: a stop half way leaves the old size with zeros
            // there, never a later grow that brings old data back.
            let io = self.client.volume(volume.object, volume.layout.clone(), volume.size_bytes);
            io.shrink_to(size_bytes).map_err(|e| fs_error("trimming the volume's data", e))?;
        }
        let record = self.registry.update_volume(name, |v| {
            v.size_bytes = size_bytes;
            Ok(())
        })?;
        tracing::info!(volume = name, size_bytes, "volume resized");
        self.publish()?;
        Ok(MgmtReply::Volume(self.volume_info(&record)))
    }

    fn delete_volume(&self, name: &str) -> MgmtResult {
        let exports = self.exports_of(name)?;
        if !exports.is_empty() {
            return Err(MgmtError::new(
                MgmtStatus::Conflict,
                format!(
                    "volume '{name}' is exported as {}; remove the export first",
                    exports.join(", ")
                ),
            ));
        }
        // Connections of an export removed just before may still be answering requests.
        self.wait_unused(&self.registry.volume(name)?)?;
        let record = self.registry.update_volume(name, |v| match v.state {
            VolumeState::Online | VolumeState::Deleting => {
                v.state = VolumeState::Deleting;
                Ok(())
            }
            other => Err(MgmtError::new(
                MgmtStatus::Conflict,
                format!("volume '{name}' is {}; delete it once that is over", other.name()),
            )),
        })?;
        self.finish_delete(&record)?;
        tracing::info!(volume = name, "volume deleted");
        Ok(MgmtReply::Volume(VolumeInfo { state: "deleted".into(), ..self.volume_info(&record) }))
    }

    fn finish_delete(&self, volume: &VolumeRecord) -> Result<(), MgmtError> {
        // The data a finished rollback replaced and that could not be removed then.
        if let Some(replaced) = self.registry.rollback(&volume.name)?.and_then(|r| r.replaced) {
            self.remove_data(replaced, volume, "removing the data a rollback replaced")?;
        }
        let io = self.client.volume(volume.object, volume.layout.clone(), volume.size_bytes);
        io.remove_all().map_err(|e| fs_error("removing the volume's data", e))?;
        self.registry.remove_volume(&volume.name)
    }

    fn volume_info(&self, v: &VolumeRecord) -> VolumeInfo {
        let exports = self.registry.exports().unwrap_or_default();
        self.volume_info_with(v, &exports)
    }

    /// As [`Mgmt::volume_info`], with the export table already read (a listing reads it once,
    /// not once per volume).
    fn volume_info_with(&self, v: &VolumeRecord, all_exports: &[ExportRecord]) -> VolumeInfo {
        let allocated =
            self.client.volume(v.object, v.layout.clone(), v.size_bytes).allocated_bytes().ok();
        let exports =
            all_exports.iter().filter(|e| e.volume == v.name).map(|e| e.name.clone()).collect();
        let origin = self.registry.origin(&v.name).unwrap_or_default();
        VolumeInfo {
            name: v.name.clone(),
            object: v.object.0,
            size_bytes: v.size_bytes,
            pool: v.layout.pool.clone(),
            chunk_bytes: v.layout.chunk_bytes,
            targets: v.layout.targets.clone(),
            allocated_bytes: allocated,
            state: v.state.name().into(),
            exports,
            created_unix_s: v.created_unix_s,
            io: self.gateway().map(|g| g.volume_io(v.object)).unwrap_or_default(),
            snapshot: origin.as_ref().is_some_and(|o| o.snapshot),
            origin: origin.map(|o| o.source),
        }
    }

    fn export_info(&self, e: &ExportRecord) -> ExportInfo {
        let stats = self.gateway().map(|g| g.stats(&e.name)).unwrap_or_default();
        ExportInfo {
            name: e.name.clone(),
            volume: e.volume.clone(),
            read_only: e.read_only,
            description: e.description.clone(),
            acl: e
                .acl
                .iter()
                .map(|r| AclRuleInfo { net: r.net.clone(), tls_identity: r.tls_identity.clone() })
                .collect(),
            connections: stats.connections,
            refused: stats.refused,
        }
    }
}

/// Test hook: with `STRIA_CRASH_POINT` set to `point`, the process aborts there, as a power cut
/// would stop it (`tests/volumes.rs` restarts the node after each point of a rollback).
fn crash_point(point: &str) {
    if std::env::var_os("STRIA_CRASH_POINT").is_some_and(|p| p == point) {
        tracing::error!(point, "STRIA_CRASH_POINT reached: aborting");
        std::process::abort();
    }
}

/// The event a successful change records: kind, subject and sentence.
fn change_event(request: &MgmtRequest) -> Option<(EventKind, String, String)> {
    let rule = |net: &str, id: &Option<String>| match id {
        Some(id) => format!("{net} with TLS identity '{id}'"),
        None => net.to_string(),
    };
    Some(match request {
        MgmtRequest::VolumeCreate { name, size_bytes, .. } => (
            EventKind::VolumeCreated,
            format!("volume/{name}"),
            format!("volume '{name}' created, {size_bytes} bytes"),
        ),
        MgmtRequest::VolumeResize { name, size_bytes, .. } => (
            EventKind::VolumeResized,
            format!("volume/{name}"),
            format!("volume '{name}' resized to {size_bytes} bytes"),
        ),
        MgmtRequest::VolumeDelete { name } => {
            (EventKind::VolumeDeleted, format!("volume/{name}"), format!("volume '{name}' deleted"))
        }
        MgmtRequest::VolumeCopy { source, name, snapshot: true } => (
            EventKind::SnapshotCreated,
            format!("volume/{name}"),
            format!("volume '{name}' created as a snapshot of '{source}'"),
        ),
        MgmtRequest::VolumeCopy { source, name, snapshot: false } => (
            EventKind::VolumeCloned,
            format!("volume/{name}"),
            format!("volume '{name}' created as a clone of '{source}'"),
        ),
        MgmtRequest::VolumeRollback { name, snapshot } => (
            EventKind::VolumeRolledBack,
            format!("volume/{name}"),
            format!("volume '{name}' rolled back to its snapshot '{snapshot}'"),
        ),
        MgmtRequest::ExportAdd { volume, name, read_only, .. } => {
            let name = name.as_deref().unwrap_or(volume);
            let mode = if *read_only { " read-only" } else { "" };
            (
                EventKind::ExportAdded,
                format!("export/{name}"),
                format!("volume '{volume}' exported{mode} as '{name}'"),
            )
        }
        MgmtRequest::ExportRemove { name } => {
            (EventKind::ExportRemoved, format!("export/{name}"), format!("export '{name}' removed"))
        }
        MgmtRequest::InitiatorAllow { export, net, tls_identity } => (
            EventKind::InitiatorAllowed,
            format!("export/{export}"),
            format!("export '{export}' now allows {}", rule(net, tls_identity)),
        ),
        MgmtRequest::InitiatorDeny { export, net, tls_identity } => (
            EventKind::InitiatorDenied,
            format!("export/{export}"),
            format!("export '{export}' no longer allows {}", rule(net, tls_identity)),
        ),
        MgmtRequest::VolumeList | MgmtRequest::VolumeShow { .. } | MgmtRequest::ExportList => {
            return None;
        }
    })
}

fn describe(rule: &AclRule) -> String {
    match &rule.tls_identity {
        Some(id) => format!("{} with TLS identity '{id}'", rule.net),
        None => rule.net.clone(),
    }
}

/// [`Mgmt`] on the internal RPC.
#[derive(Clone, Debug)]
pub struct MgmtRpc(pub Mgmt);

impl Service for MgmtRpc {
    fn call(&self, request: Request) -> BoxFuture<'static, Response> {
        let mgmt = self.0.clone();
        Box::pin(async move {
            if request.method != mgmt_method::CALL {
                return Response::error(stria_rpc::status::UNKNOWN_METHOD, "not a mgmt method");
            }
            let decoded: MgmtRequest = match request.decode() {
                Ok(decoded) => decoded,
                Err(response) => return response,
            };
            match tokio::task::spawn_blocking(move || mgmt.handle(decoded)).await {
                Ok(result) => Response::encode(&result, Bytes::new()),
                Err(_) => Response::error(stria_rpc::status::INTERNAL, "mgmt handler panicked"),
            }
        })
    }
}
