//! What the management role sees of a node's hardware: its targets (RAID arrays) with their
//! drives, counters and background jobs, and the few hardware actions it may take.
//!
//! mgmt must not depend on the RAID or storage crates (they are the layers it manages, and in a
//! cluster they run on other nodes), so the node supplies this view through the [`NodeView`]
//! trait: `stria up` implements it over its local storage service
//! (`crates/stria/src/rest_role.rs`); a cluster will feed it from heartbeats. The types here
//! are also the REST API's response bodies, so their field names are a stable interface.

use std::net::SocketAddr;

use serde::Serialize;
use stria_proto::fs::TargetId;
use stria_proto::mgmt::MgmtError;
use utoipa::ToSchema;

/// Number of power-of-two latency buckets the node reports per target (bucket `i` counts
/// requests that took under `2^i` microseconds; the last one also takes everything slower).
pub const LATENCY_BUCKETS: usize = 28;

/// A target's state, worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TargetState {
    Failed,
    Degraded,
    Rebuilding,
    Optimal,
}

impl TargetState {
    pub const ALL: [TargetState; 4] =
        [TargetState::Optimal, TargetState::Degraded, TargetState::Rebuilding, TargetState::Failed];

    pub fn name(self) -> &'static str {
        match self {
            TargetState::Optimal => "optimal",
            TargetState::Degraded => "degraded",
            TargetState::Rebuilding => "rebuilding",
            TargetState::Failed => "failed",
        }
    }
}

/// One drive: a member of a target's array (in a slot) or a hot spare.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct DriveStatus {
    /// The drive's id (its label's uuid); stable for the life of the drive.
    pub id: String,
    /// Where the drive is: a file path or a block device. Drive files have no serial number or
    /// model; the path stands in for both.
    pub device: String,
    /// How it is driven: `io_uring`, `threadpool`, `memory`.
    pub backend: String,
    #[schema(value_type = u32)]
    pub target: TargetId,
    /// Slot in the array; absent for a spare.
    pub slot: Option<u32>,
    /// `active`, `rebuilding`, `failed`, `missing`, `empty` or `spare`.
    pub state: String,
    /// Size of the device; absent when it cannot be read (a drive that is gone).
    pub capacity_bytes: Option<u64>,
    /// Counters since the node started.
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    /// I/O errors over the drive's life.
    pub errors: u64,
    pub lifetime_written_bytes: u64,
    /// Rated endurance (bytes written over its life); 0 when unknown.
    pub rated_endurance_bytes: u64,
    /// Share of the rated endurance used, in percent; absent when the rating is unknown.
    pub wear_percent: Option<f64>,
    /// Days until the rated endurance is used up at the write rate since the node started;
    /// absent when the rating is unknown or nothing was written.
    pub remaining_life_days: Option<f64>,
    /// 99th percentile latency since the node started (power-of-two bucket bound).
    pub read_latency_p99_us: u64,
    pub write_latency_p99_us: u64,
}

/// How a target's data is laid out over its drives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct Geometry {
    /// `raid0`, `raid1`, `raid10`, `raid5` or `raid6`.
    pub level: String,
    pub drives: u32,
    /// Drives' worth of data per stripe (the rest is redundancy).
    pub data_drives: u32,
    pub stripe_unit_bytes: u32,
    /// Drives that may fail without losing data.
    pub tolerated_failures: u32,
    /// Bytes the array offers to the chunk engine.
    pub array_capacity_bytes: u64,
}

/// Space as the target's chunk engine accounts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Space {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    /// Freed by changes not yet durable; free after the next sync.
    pub reclaimable_bytes: u64,
    pub chunks: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct RebuildStatus {
    pub slot: u32,
    /// 0 to 1.
    pub progress_ratio: f64,
    /// Whether the rebuild is walking the slot now (false: it stopped, see `error`).
    pub running: bool,
    pub error: Option<String>,
    /// Average rate since the rebuild started.
    pub rate_bytes_per_s: u64,
}

/// Where a scrub (read every block, check checksums and parity, repair) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScrubState {
    /// No scrub since the node started.
    Idle,
    Running,
    Finished,
    /// Stopped by the operator before the end.
    Stopped,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, ToSchema)]
pub struct ScrubFindings {
    pub stripes_checked: u64,
    pub bytes_checked: u64,
    pub checksum_errors: u64,
    pub repaired_blocks: u64,
    pub parity_mismatches: u64,
    pub unrecoverable_blocks: u64,
}

impl ScrubFindings {
    pub fn clean(&self) -> bool {
        self.checksum_errors == 0 && self.parity_mismatches == 0 && self.unrecoverable_blocks == 0
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct ScrubStatus {
    pub state: ScrubState,
    /// Scrubs finished (or stopped, or failed) since the node started.
    pub runs: u64,
    /// 0 to 1 for the running or last scrub.
    pub progress_ratio: f64,
    pub started_unix_s: Option<u64>,
    pub finished_unix_s: Option<u64>,
    /// Read rate limit of the running or last scrub; absent: unlimited.
    pub rate_limit_bytes_per_s: Option<u64>,
    /// What the last scrub found (partial while it runs).
    pub findings: Option<ScrubFindings>,
    pub error: Option<String>,
}

impl ScrubStatus {
    pub fn idle() -> ScrubStatus {
        ScrubStatus {
            state: ScrubState::Idle,
            runs: 0,
            progress_ratio: 0.0,
            started_unix_s: None,
            finished_unix_s: None,
            rate_limit_bytes_per_s: None,
            findings: None,
            error: None,
        }
    }
}

/// Chunk requests a target served (what clients asked for, before RAID adds parity and
/// mirror writes), with their latency inside the storage service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct TargetIo {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub written_bytes: u64,
    /// Sum of the latencies of all reads (and writes), for means over an interval.
    pub read_latency_us_total: u64,
    pub write_latency_us_total: u64,
    /// Latency histograms ([`LATENCY_BUCKETS`] power-of-two buckets); in the metrics, not JSON.
    #[serde(skip)]
    pub read_latency_buckets: Vec<u64>,
    #[serde(skip)]
    pub write_latency_buckets: Vec<u64>,
}

/// The target's read cache of small-I/O blocks (`stria up --read-cache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct ReadCache {
    pub capacity_bytes: u64,
    pub held_bytes: u64,
    /// Blocks served from the cache since the node started.
    pub hits: u64,
    /// Blocks looked up and read from the array instead.
    pub misses: u64,
}

/// One target: a RAID array of drives with a chunk engine on it.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
pub struct TargetStatus {
    #[schema(value_type = u32)]
    pub id: TargetId,
    pub pool: String,
    pub state: TargetState,
    pub geometry: Geometry,
    pub space: Space,
    /// The rebuild under way (or stopped on an error); absent when none.
    pub rebuild: Option<RebuildStatus>,
    /// What a rebuild may read and write per second.
    pub rebuild_rate_limit_bytes_per_s: u64,
    pub scrub: ScrubStatus,
    /// Blocks that failed their CRC32C on read since the node started.
    pub checksum_errors: u64,
    /// Blocks rewritten from redundancy since the node started.
    pub repaired_blocks: u64,
    pub unrecoverable_blocks: u64,
    pub io: TargetIo,
    pub read_cache: ReadCache,
    pub warnings: Vec<String>,
    /// Members in slot order, then spares.
    pub drives: Vec<DriveStatus>,
}

/// Where the roles of a node listen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct NodeAddresses {
    #[schema(value_type = Option<String>)]
    pub api: Option<SocketAddr>,
    #[schema(value_type = Option<String>)]
    pub mgmt: Option<SocketAddr>,
    #[schema(value_type = String)]
    pub meta: SocketAddr,
    #[schema(value_type = String)]
    pub storage: SocketAddr,
    #[schema(value_type = Option<String>)]
    pub nbd: Option<SocketAddr>,
    /// The FUSE mount point, when mounted.
    pub mount: Option<String>,
}

/// Who a node is; fixed while it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct NodeIdentity {
    /// Generated at the node's first start and kept in its data directory.
    pub id: String,
    pub hostname: String,
    pub version: String,
    pub data_dir: String,
    pub started_unix_s: u64,
    pub addresses: NodeAddresses,
}

/// The node's hardware as mgmt sees it. Calls may block briefly (locks, a statfs): call them
/// off the async runtime.
pub trait NodeView: Send + Sync {
    /// Every target with its drives, now.
    fn targets(&self) -> Vec<TargetStatus>;
    /// Sets what a rebuild of `target` may move per second (takes effect at once, also on a
    /// running rebuild).
    fn set_rebuild_rate(&self, target: TargetId, bytes_per_s: u64) -> Result<(), MgmtError>;
    /// Starts a scrub of `target` in the background (`repair`: rewrite bad blocks from
    /// redundancy); refused while one runs.
    fn start_scrub(
        &self,
        target: TargetId,
        repair: bool,
        rate_bytes_per_s: Option<u64>,
    ) -> Result<(), MgmtError>;
    /// Asks the running scrub of `target` to stop; it ends after the stripe in hand.
    fn stop_scrub(&self, target: TargetId) -> Result<(), MgmtError>;
    /// Metadata requests served since the node started, by operation name.
    fn metadata_ops(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
    /// Kernel requests the node's FUSE mount answered since it was mounted, by operation name
    /// (empty without a mount).
    fn mount_requests(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// Days until `rated` bytes are written, at the rate `session_written` bytes per
/// `session_s` seconds, counting from `lifetime_written`. None when unknown.
pub fn remaining_life_days(
    rated: u64,
    lifetime_written: u64,
    session_written: u64,
    session_s: f64,
) -> Option<f64> {
    if rated == 0 || session_written == 0 || session_s <= 0.0 {
        return None;
    }
    let rate_bytes_s = session_written as f64 / session_s;
    Some(rated.saturating_sub(lifetime_written) as f64 / rate_bytes_s / 86_400.0)
}

/// Drives' worth of data per stripe and drives that may fail, for a RAID level name.
pub fn level_shape(level: &str, drives: u32) -> (u32, u32) {
    match level {
        "raid0" => (drives, 0),
        "raid1" => (1, drives.saturating_sub(1)),
        "raid10" => (drives / 2, 1),
        "raid5" => (drives.saturating_sub(1), 1),
        "raid6" => (drives.saturating_sub(2), 2),
        _ => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_life_follows_the_write_rate() {
        // 1 TB rated, 0.5 TB written, 1 GB/day lately: 500 days left.
        let day = 86_400.0;
        let left = remaining_life_days(1_000_000_000_000, 500_000_000_000, 1_000_000_000, day);
        assert!((left.expect("known") - 500.0).abs() < 1e-6);
        assert_eq!(remaining_life_days(0, 5, 5, day), None, "no rating, no estimate");
        assert_eq!(remaining_life_days(10, 5, 0, day), None, "no writes, no estimate");
        assert_eq!(remaining_life_days(10, 20, 5, day), Some(0.0), "worn out");
    }

    #[test]
    fn level_shapes_match_the_raid_levels() {
        assert_eq!(level_shape("raid5", 5), (4, 1));
        assert_eq!(level_shape("raid6", 6), (4, 2));
        assert_eq!(level_shape("raid10", 4), (2, 1));
        assert_eq!(level_shape("raid1", 2), (1, 1));
        assert_eq!(level_shape("raid0", 3), (3, 0));
    }
}
