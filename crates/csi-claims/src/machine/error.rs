//! Errors of the machine's inputs.

use csi_structs::{NodeId, PluginId, VolumeId, WorkloadId};

use crate::accounting::ClaimDenied;

/// Why a claim was not recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The access mode, the attachment mode or the workload's earlier claim forbids it.
    #[error(transparent)]
    Denied(Box<ClaimDenied>),
    /// The request names another volume than the volume info given with it.
    #[error("claim request for volume {request} came with the info of volume {info}")]
    VolumeMismatch {
        /// The request's volume.
        request: VolumeId,
        /// The info's volume.
        info: VolumeId,
    },
    /// The volume is known with another value of `field` (external id, plugin or controller
    /// requirement); a claimed volume's identity does not change.
    #[error("volume {volume} is claimed with another {field}")]
    VolumeInfoMismatch {
        /// The volume.
        volume: VolumeId,
        /// `external_id`, `plugin` or `controller`.
        field: &'static str,
    },
    /// A new attachment would take the node past its plugin's limit (`max_volumes_per_node`
    /// of `NodeGetInfo`): as many of the plugin's volumes as it allows hold claims on the
    /// node (a claim keeps its attachment until it is freed). Refused before anything is
    /// recorded or called; a claim of a volume already attached on the node is not one.
    #[error(
        "volume {volume} cannot be attached on node {node}: plugin {plugin} allows {limit} \
         volume(s) per node and {count} of its volumes are attached there (claimed, or \
         releasing and not yet detached)"
    )]
    AttachLimit {
        /// The volume.
        volume: VolumeId,
        /// The node.
        node: NodeId,
        /// The plugin.
        plugin: PluginId,
        /// The plugin's limit.
        limit: u64,
        /// Its volumes attached on the node now.
        count: u64,
    },
    /// The node is gone for good; nothing can be published there.
    #[error("cannot claim volume {volume} on node {node}: the node is gone")]
    NodeGone {
        /// The volume.
        volume: VolumeId,
        /// The node.
        node: NodeId,
    },
    /// An unstage or a controller detach of this volume from this node is in flight; a claim
    /// now would race with it. Retry after it settles.
    #[error("volume {volume} is being detached from node {node}; retry the claim later")]
    DetachInFlight {
        /// The volume.
        volume: VolumeId,
        /// The node.
        node: NodeId,
    },
    /// The volume's record is being reloaded after a stale write; retry shortly.
    #[error("volume {volume} is being reloaded from the store; retry the claim")]
    Reloading {
        /// The volume.
        volume: VolumeId,
    },
    /// The claim store failed on the volume's last call and the volume waits to be read
    /// again; retry once the store works (the attempt itself makes it read again).
    #[error("cannot claim volume {volume} now: {reason}")]
    StoreUnavailable {
        /// The volume.
        volume: VolumeId,
        /// The store's error, as text (it names the store).
        reason: String,
    },
}

/// Why a release was not started.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// The workload holds no claim on the volume (it may already be freed).
    #[error("workload {workload} holds no claim on volume {volume}")]
    NoSuchClaim {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
    /// The volume's record is being reloaded after a stale write; retry shortly.
    #[error("volume {volume} is being reloaded from the store; retry the release")]
    Reloading {
        /// The volume.
        volume: VolumeId,
    },
    /// The claim store failed on the volume's last call and the volume waits to be read
    /// again; retry once the store works (the attempt itself makes it read again).
    #[error("cannot release a claim on volume {volume} now: {reason}")]
    StoreUnavailable {
        /// The volume.
        volume: VolumeId,
        /// The store's error, as text (it names the store).
        reason: String,
    },
}

/// Why a stored record was not loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The machine already manages this volume.
    #[error("volume {volume} is already loaded")]
    AlreadyLoaded {
        /// The volume.
        volume: VolumeId,
    },
}
