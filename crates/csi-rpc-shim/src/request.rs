//! The calls the shim routes, in domain terms: one request type per [`AgentRpc`], and the
//! answers.
//!
//! Every field is typed (`csi-structs` ids and capabilities); the wire form lives in
//! [`wire`](crate::wire). Controller calls carry a [`ControllerQuery`]; node calls carry the
//! orchestrator [`NodeId`] of the node that owns the volume and are served only there.
//!
//! [`AgentRpc`]: crate::AgentRpc

use csi_structs::{
    ContentSource, ExternalVolumeId, NodeId, Parameters, PluginId, PluginNodeId, PublishContext,
    Secrets, SnapshotId, Topology, TopologyRequirement, VolumeCapability, VolumeContext, VolumeId,
    WorkloadId,
};

/// Which plugin's controller a controller call needs, and where the caller would like it served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerQuery {
    /// The orchestrator's id of the plugin.
    pub plugin: PluginId,
    /// A controller node to try first, if it is healthy; the others follow in the shim's order.
    pub preferred_node: Option<NodeId>,
}

impl ControllerQuery {
    /// A query for `plugin` with no preferred node.
    pub fn new(plugin: PluginId) -> Self {
        Self {
            plugin,
            preferred_node: None,
        }
    }

    /// The same query, preferring `node`.
    #[must_use]
    pub fn prefer(mut self, node: NodeId) -> Self {
        self.preferred_node = Some(node);
        self
    }
}

/// Attach a volume to a node (`ControllerPublishVolume`). The acting node must be `node`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerAttach {
    /// Which controller.
    pub query: ControllerQuery,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// The orchestrator node the volume is attached to.
    pub node: NodeId,
    /// That node's id as the plugin knows it (from `NodeGetInfo`).
    pub plugin_node: PluginNodeId,
    /// How the volume will be used.
    pub capability: VolumeCapability,
    /// Attach read-only.
    pub read_only: bool,
    /// Secrets for the plugin.
    pub secrets: Secrets,
    /// The volume's context, from creation.
    pub volume_context: VolumeContext,
}

/// The answer to [`ControllerAttach`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerAttached {
    /// Passed on to the node's stage and publish calls.
    pub publish_context: PublishContext,
}

/// Detach a volume from a node (`ControllerUnpublishVolume`). The acting node must be `node`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerDetach {
    /// Which controller.
    pub query: ControllerQuery,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// The orchestrator node the volume is detached from.
    pub node: NodeId,
    /// That node's id as the plugin knows it.
    pub plugin_node: PluginNodeId,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// Check capabilities against an existing volume (`ValidateVolumeCapabilities`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerValidate {
    /// Which controller.
    pub query: ControllerQuery,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// The capabilities to confirm; at least one.
    pub capabilities: Vec<VolumeCapability>,
    /// The volume's context.
    pub volume_context: VolumeContext,
    /// The volume's creation parameters.
    pub parameters: Parameters,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// The answer to [`ControllerValidate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validated {
    /// The plugin confirmed every capability.
    Confirmed,
    /// The plugin did not confirm them.
    NotConfirmed {
        /// Why, for people: each field that differs and the plugin's message.
        message: String,
    },
}

/// Create a volume (`CreateVolume`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateVolume {
    /// Which controller.
    pub query: ControllerQuery,
    /// The orchestrator's volume id, sent to the plugin as the volume name.
    pub volume: VolumeId,
    /// Smallest acceptable size in bytes (0: the plugin chooses).
    pub required_bytes: i64,
    /// Largest acceptable size in bytes (0: no limit).
    pub limit_bytes: i64,
    /// The capabilities the volume must offer; at least one.
    pub capabilities: Vec<VolumeCapability>,
    /// Plugin-specific parameters.
    pub parameters: Parameters,
    /// Secrets for the plugin.
    pub secrets: Secrets,
    /// Where the volume must or should be reachable; only for a plugin with
    /// `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
    pub accessibility_requirements: Option<TopologyRequirement>,
    /// What the volume is made from: a snapshot (a plugin with `CREATE_DELETE_SNAPSHOT`) or
    /// a volume of the same plugin (`CLONE_VOLUME`); `None`: empty.
    pub content_source: Option<ContentSource>,
}

/// The answer to [`CreateVolume`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedVolume {
    /// The plugin's id for the new volume.
    pub external_volume: ExternalVolumeId,
    /// Its size in bytes (0: unknown).
    pub capacity_bytes: i64,
    /// Its context, to pass to later calls.
    pub volume_context: VolumeContext,
    /// Where it is reachable; empty: from everywhere.
    pub accessible_topology: Vec<Topology>,
}

/// Delete a volume (`DeleteVolume`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteVolume {
    /// Which controller.
    pub query: ControllerQuery,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// Grow a volume on the storage side (`ControllerExpandVolume`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerExpand {
    /// Which controller.
    pub query: ControllerQuery,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// Smallest acceptable size in bytes.
    pub required_bytes: i64,
    /// Largest acceptable size in bytes (0: no limit).
    pub limit_bytes: i64,
    /// How the volume is used, when known.
    pub capability: Option<VolumeCapability>,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// The answer to [`ControllerExpand`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerExpanded {
    /// The new size in bytes.
    pub capacity_bytes: i64,
    /// Whether a node expansion must follow.
    pub node_expansion_required: bool,
}

/// List the plugin's volumes (`ListVolumes`), one page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListVolumes {
    /// Which controller.
    pub query: ControllerQuery,
    /// Most entries in the page (0: the plugin chooses).
    pub max_entries: i32,
    /// Where to continue, from a previous page's `next_token` (empty: from the start).
    pub starting_token: String,
}

/// One volume in a [`VolumePage`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedVolume {
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// Its size in bytes (0: unknown).
    pub capacity_bytes: i64,
    /// The plugin node ids it is published to, when the plugin reports them.
    pub published_nodes: Vec<PluginNodeId>,
}

/// The answer to [`ListVolumes`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumePage {
    /// The volumes.
    pub entries: Vec<ListedVolume>,
    /// The token for the next page (empty: this was the last).
    pub next_token: String,
}

/// Snapshot a volume (`CreateSnapshot`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateSnapshot {
    /// Which controller.
    pub query: ControllerQuery,
    /// The orchestrator's id of the source volume.
    pub volume: VolumeId,
    /// The plugin's id of the source volume.
    pub source: ExternalVolumeId,
    /// The snapshot's name (idempotency key), at most 128 bytes.
    pub name: String,
    /// Plugin-specific parameters.
    pub parameters: Parameters,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// A snapshot, as [`CreateSnapshot`] and [`ListSnapshots`] return it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The plugin's snapshot id.
    pub snapshot: SnapshotId,
    /// The plugin's id of the source volume.
    pub source: ExternalVolumeId,
    /// Its size in bytes (0: unknown).
    pub size_bytes: i64,
    /// Whether it can be used as a volume source yet.
    pub ready_to_use: bool,
}

/// Delete a snapshot (`DeleteSnapshot`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeleteSnapshot {
    /// Which controller.
    pub query: ControllerQuery,
    /// The plugin's snapshot id.
    pub snapshot: SnapshotId,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// List snapshots (`ListSnapshots`), one page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListSnapshots {
    /// Which controller.
    pub query: ControllerQuery,
    /// Only snapshots of this volume.
    pub source: Option<ExternalVolumeId>,
    /// Only this snapshot.
    pub snapshot: Option<SnapshotId>,
    /// Most entries in the page (0: the plugin chooses).
    pub max_entries: i32,
    /// Where to continue (empty: from the start).
    pub starting_token: String,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// The answer to [`ListSnapshots`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotPage {
    /// The snapshots.
    pub entries: Vec<SnapshotInfo>,
    /// The token for the next page (empty: this was the last).
    pub next_token: String,
}

/// Unpublish a workload's publication of a volume, then unstage the volume, on the node that
/// owns them. Served on `node` only; the acting node must be `node`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDetach {
    /// The plugin.
    pub plugin: PluginId,
    /// The orchestrator's volume id (the node derives its paths from it).
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// The node that owns the publication.
    pub node: NodeId,
    /// The workload whose publication is removed.
    pub workload: WorkloadId,
    /// How the volume was used.
    pub capability: VolumeCapability,
    /// Whether it was published read-only.
    pub read_only: bool,
}

/// Grow the filesystem of a volume on the node that uses it (`NodeExpandVolume`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeExpand {
    /// The plugin.
    pub plugin: PluginId,
    /// The orchestrator's volume id (the node derives its paths from it).
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// The node that uses the volume.
    pub node: NodeId,
    /// The workload whose claim the expansion is for.
    pub workload: WorkloadId,
    /// Smallest acceptable size in bytes.
    pub required_bytes: i64,
    /// Largest acceptable size in bytes (0: no limit).
    pub limit_bytes: i64,
    /// How the volume is used.
    pub capability: VolumeCapability,
    /// Secrets for the plugin.
    pub secrets: Secrets,
}

/// The answer to [`NodeExpand`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeExpanded {
    /// The new size in bytes (0: unknown).
    pub capacity_bytes: i64,
}
