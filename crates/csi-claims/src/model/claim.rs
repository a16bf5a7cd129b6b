//! A claim: one workload's hold on one volume, from one node.

use csi_structs::{AccessMode, AccessTypeKind, NodeId, PluginNodeId, VolumeId, WorkloadId};
use serde::{Deserialize, Serialize};

use crate::state::ClaimState;

/// Whether a claim reads or writes the volume.
///
/// There is no default and no zero value: a claim is a reader or a writer because someone
/// said so (Nomad's zero value silently meant "read").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimMode {
    /// The workload only reads; the volume is published read-only to it.
    Read,
    /// The workload writes.
    Write,
}

impl ClaimMode {
    /// `read` or `write`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ClaimMode::Read => "read",
            ClaimMode::Write => "write",
        }
    }
}

impl std::fmt::Display for ClaimMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a workload asks for when it claims a volume.
///
/// Every field is required; nothing is filled in later (Nomad left the plugin's node id out
/// of its stored claims and could then not detach once the node was gone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The orchestrator's id of the volume.
    pub volume: VolumeId,
    /// The workload that will use the volume.
    pub workload: WorkloadId,
    /// The orchestrator's node the workload runs on.
    pub node: NodeId,
    /// The plugin's id for that node (from `NodeGetInfo`), used later for
    /// `ControllerUnpublishVolume`.
    pub plugin_node: PluginNodeId,
    /// Read or write.
    pub mode: ClaimMode,
    /// The CSI access mode the volume is used with.
    pub access_mode: AccessMode,
    /// The attachment mode: raw block device or mounted file system. A claim cannot change
    /// the attachment mode of a volume that is already claimed.
    pub attachment: AccessTypeKind,
}

/// One workload's claim on one volume, with the whole of its release progress.
///
/// A claim is only created by the [`ReleaseMachine`](crate::ReleaseMachine) (or decoded from
/// a store) and only changes state through it; every change is checkpointed with the whole
/// claim, so a release resumes at the right step after a crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub(crate) volume: VolumeId,
    pub(crate) workload: WorkloadId,
    pub(crate) node: NodeId,
    pub(crate) plugin_node: PluginNodeId,
    pub(crate) mode: ClaimMode,
    pub(crate) access_mode: AccessMode,
    pub(crate) attachment: AccessTypeKind,
    pub(crate) state: ClaimState,
}

impl std::fmt::Display for Claim {
    /// `volume v1: w1 (write on n1, taken)`, as a denial names its holders.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "volume {}: {} ({} on {}, {})",
            self.volume, self.workload, self.mode, self.node, self.state
        )
    }
}

impl Claim {
    /// A fresh claim in state [`ClaimState::Taken`].
    pub(crate) fn taken(request: ClaimRequest) -> Self {
        Self {
            volume: request.volume,
            workload: request.workload,
            node: request.node,
            plugin_node: request.plugin_node,
            mode: request.mode,
            access_mode: request.access_mode,
            attachment: request.attachment,
            state: ClaimState::Taken,
        }
    }

    /// The orchestrator's volume id.
    pub fn volume(&self) -> &VolumeId {
        &self.volume
    }

    /// The workload holding the claim.
    pub fn workload(&self) -> &WorkloadId {
        &self.workload
    }

    /// The orchestrator's node the claim was made from.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// The plugin's id for that node.
    pub fn plugin_node(&self) -> &PluginNodeId {
        &self.plugin_node
    }

    /// Read or write.
    pub fn mode(&self) -> ClaimMode {
        self.mode
    }

    /// The CSI access mode.
    pub fn access_mode(&self) -> AccessMode {
        self.access_mode
    }

    /// The attachment mode: block device or file system.
    pub fn attachment(&self) -> AccessTypeKind {
        self.attachment
    }

    /// How far the claim's release has come.
    pub fn state(&self) -> &ClaimState {
        &self.state
    }

    /// Whether the workload still uses the volume on its node: the claim is taken, or its
    /// release has not yet finished the node step.
    pub fn uses_node(&self) -> bool {
        matches!(self.state, ClaimState::Taken | ClaimState::Releasing)
    }

    /// Whether `request` asks for exactly what this claim holds.
    pub(crate) fn same_terms(&self, request: &ClaimRequest) -> bool {
        self.node == request.node
            && self.plugin_node == request.plugin_node
            && self.mode == request.mode
            && self.access_mode == request.access_mode
            && self.attachment == request.attachment
    }
}
