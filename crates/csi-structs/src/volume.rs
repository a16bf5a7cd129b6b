//! [`Volume`]: a volume as the plugin describes it (`csi.v1.Volume`, e.g. in the
//! `CreateVolume` answer), and [`ContentSource`], what a new volume is made from.
//! [`VolumeWithStatus`] is the `ControllerGetVolume` answer: the volume with the nodes it is
//! published to and its [`VolumeCondition`].
//!
//! The orchestrator's record of a volume, with its user-set and orchestrator-owned fields, is
//! [`registration`](crate::registration).

use crate::ids::{ExternalVolumeId, PluginNodeId, SnapshotId};
use crate::maps::VolumeContext;
use crate::topology::Topology;

/// What a new volume is made from (`VolumeContentSource`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentSource {
    /// Restore from a snapshot (needs `CREATE_DELETE_SNAPSHOT`).
    Snapshot(SnapshotId),
    /// Clone an existing volume of the same plugin (needs `CLONE_VOLUME`).
    Volume(ExternalVolumeId),
}

/// A volume as the plugin describes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Volume {
    /// The plugin's id for the volume, used in every later call.
    pub volume_id: ExternalVolumeId,
    /// The provisioned size; `None` (wire 0) means unknown.
    pub capacity_bytes: Option<u64>,
    /// Opaque facts to pass back unchanged to validation and publishing calls.
    pub volume_context: VolumeContext,
    /// What the volume was made from, if anything.
    pub content_source: Option<ContentSource>,
    /// Where the volume is reachable; empty means from everywhere.
    pub accessible_topology: Vec<Topology>,
}

impl Volume {
    /// A volume with only an id: unknown size, no context, no source, reachable everywhere.
    pub fn new(volume_id: ExternalVolumeId) -> Self {
        Self {
            volume_id,
            capacity_bytes: None,
            volume_context: VolumeContext::new(),
            content_source: None,
            accessible_topology: Vec::new(),
        }
    }
}

/// How a volume is doing, as the plugin sees it (`VolumeCondition`, alpha).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct VolumeCondition {
    /// Whether the volume is not available for use or not operating optimally.
    pub abnormal: bool,
    /// The plugin's words about the condition, for people (possibly empty).
    pub message: String,
}

/// One kind of usage of a volume on a node (`VolumeUsage`): bytes or inodes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Usage {
    /// Available now.
    pub available: u64,
    /// In all.
    pub total: u64,
    /// In use.
    pub used: u64,
}

/// What `NodeGetVolumeStats` says of a published volume: its usage and its condition.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeStats {
    /// Bytes, when the plugin reported them.
    pub bytes: Option<Usage>,
    /// Inodes, when the plugin reported them.
    pub inodes: Option<Usage>,
    /// Its condition; `None` from a plugin without node `VOLUME_CONDITION`.
    pub condition: Option<VolumeCondition>,
}

/// What a plugin says about a volume besides the volume itself (`VolumeStatus` of
/// `ControllerGetVolume`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeStatus {
    /// The plugin's ids of the nodes the volume is published to (empty: none, or a plugin
    /// without `LIST_VOLUMES_PUBLISHED_NODES`).
    pub published_nodes: Vec<PluginNodeId>,
    /// Its condition; `None` from a plugin without `VOLUME_CONDITION`.
    pub condition: Option<VolumeCondition>,
}

/// A volume and its status: the answer to `ControllerGetVolume`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeWithStatus {
    /// The volume, checked by the same rules as `CreateVolume`'s answer.
    pub volume: Volume,
    /// Where it is published and its condition.
    pub status: VolumeStatus,
}
