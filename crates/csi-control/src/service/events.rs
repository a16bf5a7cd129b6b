//! What the volume service did, as typed events: [`ServiceEvent`].

use std::path::PathBuf;

use csi_structs::{ExternalVolumeId, NodeId, PluginId, SnapshotId, VolumeId, WorkloadId};

/// One thing the [`VolumeService`](super::VolumeService) did, sent to every subscriber
/// ([`VolumeService::subscribe`](super::VolumeService::subscribe)) once it is durable.
///
/// The release pipeline's own progress (a step failed, retried, recovered) is csi-claims'
/// [`Event`](csi_claims::Event), from the claim driver.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceEvent {
    /// A volume entered the catalog: registered, or created in its plugin.
    Registered {
        /// The volume.
        volume: VolumeId,
        /// Its plugin.
        plugin: PluginId,
        /// Whether the service created it.
        created: bool,
    },
    /// A volume a `CreateVolume` with an uncertain outcome may have made was found by name
    /// and deleted.
    CreateUndone {
        /// The id it was created under.
        volume: VolumeId,
        /// The plugin.
        plugin: PluginId,
        /// The plugin's id of the deleted volume.
        external_id: ExternalVolumeId,
    },
    /// An uncertain `CreateVolume` could not be undone: the catalog keeps that a volume may
    /// exist under the id until a create of it resolves it or a deregistration clears it.
    MayExist {
        /// The id.
        volume: VolumeId,
        /// The plugin.
        plugin: PluginId,
        /// Why, for people.
        why: &'static str,
    },
    /// A claim is durable and the volume published on this node.
    Claimed {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// Where it is published.
        target_path: PathBuf,
    },
    /// Publishing failed after the claim; the claim was released to undo it.
    PublishFailed {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// Whether the release finished within the call timeout.
        undone: bool,
    },
    /// A node expansion left for the volume's next claim ran.
    PendingNodeExpansion {
        /// The volume.
        volume: VolumeId,
        /// The size asked for.
        capacity_bytes: u64,
        /// Whether it succeeded (otherwise it stays pending).
        done: bool,
    },
    /// A volume grew.
    Expanded {
        /// The volume.
        volume: VolumeId,
        /// Its capacity now.
        capacity_bytes: u64,
        /// Whether the controller expanded it.
        controller_expanded: bool,
        /// The nodes that expanded it.
        nodes_expanded: Vec<NodeId>,
        /// Whether a node expansion waits for its next claim.
        node_expansion_pending: bool,
    },
    /// A claim's release is durable.
    Released {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
    /// A node's claims on a volume are releasing.
    Detached {
        /// The volume.
        volume: VolumeId,
        /// The node.
        node: NodeId,
        /// Whether the node was reported gone for good.
        node_gone: bool,
        /// The workloads whose claims are releasing.
        releasing: Vec<WorkloadId>,
    },
    /// A volume left the catalog without its plugin being called.
    Deregistered {
        /// The volume.
        volume: VolumeId,
        /// The claims forgotten, not released.
        dropped_claims: usize,
    },
    /// A snapshot was cut.
    SnapshotCut {
        /// The source volume.
        volume: VolumeId,
        /// The snapshot.
        snapshot: SnapshotId,
        /// Whether it is ready to use.
        ready_to_use: bool,
    },
    /// A snapshot was deleted.
    SnapshotDeleted {
        /// Its plugin.
        plugin: PluginId,
        /// The snapshot.
        snapshot: SnapshotId,
    },
    /// A volume was deleted.
    Deleted {
        /// The volume.
        volume: VolumeId,
        /// Whether it was deleted in its plugin too (the service had created it).
        in_plugin: bool,
    },
    /// The node's usage records restored at start were confirmed with their plugins.
    NodeReconciled {
        /// How many records.
        records: usize,
        /// How many publications were published again.
        republished: usize,
        /// How many could not be confirmed (kept).
        not_confirmed: usize,
    },
}
