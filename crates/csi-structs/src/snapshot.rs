//! [`Snapshot`] and [`VolumeGroupSnapshot`]: snapshots as the plugin describes them.

use std::time::SystemTime;

use crate::ids::{ExternalVolumeId, GroupSnapshotId, SnapshotId};
use crate::topology::Topology;

/// A snapshot (`csi.v1.Snapshot`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// The plugin's id for the snapshot.
    pub snapshot_id: SnapshotId,
    /// The plugin's id for the volume it was cut from.
    pub source_volume_id: ExternalVolumeId,
    /// Its size; `None` (wire 0) means unknown. A volume restored from it must not be smaller.
    pub size_bytes: Option<u64>,
    /// When the snapshot was cut.
    pub creation_time: SystemTime,
    /// Whether post-processing is done and it can be used as a volume source.
    pub ready_to_use: bool,
    /// The group it belongs to; such a snapshot can only be deleted with its group.
    pub group_snapshot_id: Option<GroupSnapshotId>,
    /// Where volumes restored from it are reachable (alpha, v1.13); empty means everywhere.
    pub accessible_topology: Vec<Topology>,
}

impl Snapshot {
    /// Whether it belongs to a group, so `DeleteSnapshot` must not be called for it.
    pub fn is_group_member(&self) -> bool {
        self.group_snapshot_id.is_some()
    }
}

/// A group snapshot (`csi.v1.VolumeGroupSnapshot`): snapshots of several volumes cut at one
/// point in their write streams.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeGroupSnapshot {
    /// The plugin's id for the group.
    pub group_snapshot_id: GroupSnapshotId,
    /// The member snapshots (at least one).
    pub snapshots: Vec<Snapshot>,
    /// When the group was cut.
    pub creation_time: SystemTime,
    /// Whether every member is ready.
    pub ready_to_use: bool,
}
