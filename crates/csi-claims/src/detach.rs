//! The detach calls the release pipeline asks for, and how they fail.
//!
//! The machine emits a [`NodeDetachRequest`] or a [`ControllerDetachRequest`]; whoever
//! performs it (the [driver](crate::driver) through its detacher traits, or a test) answers
//! with `Ok(())` or a [`DetachError`] carrying the [`ErrorClass`] the client layer assigned.
//! The class decides what happens next; the detail text is only shown to people.

use std::fmt;

use csi_structs::untrusted::escaped;
use csi_structs::{
    AccessMode, AccessTypeKind, ErrorClass, ExternalVolumeId, NodeId, PluginId, PluginNodeId,
    VolumeId, WorkloadId,
};

use crate::machine::Ticket;
use crate::store::Version;

/// Which CSI call of the release pipeline failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DetachRpc {
    /// `NodeUnpublishVolume`.
    NodeUnpublish,
    /// `NodeUnstageVolume`.
    NodeUnstage,
    /// `ControllerUnpublishVolume`.
    ControllerUnpublish,
}

impl DetachRpc {
    /// The CSI name, e.g. `NodeUnpublishVolume`.
    pub const fn name(self) -> &'static str {
        match self {
            DetachRpc::NodeUnpublish => "NodeUnpublishVolume",
            DetachRpc::NodeUnstage => "NodeUnstageVolume",
            DetachRpc::ControllerUnpublish => "ControllerUnpublishVolume",
        }
    }
}

impl fmt::Display for DetachRpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed detach call: which call, its class, and a human-readable detail.
///
/// Only [`class`](Self::class) drives behaviour:
/// - [`ErrorClass::AlreadyDone`] counts as success (`NOT_FOUND` on an unpublish or unstage).
/// - [`ErrorClass::Retry`], [`ErrorClass::Uncertain`]: retry the same step after a backoff
///   (detach calls are idempotent, so retrying to completion is safe).
/// - [`ErrorClass::RetryElsewhere`]: the plugin is missing or unhealthy where the call had to
///   go. The step fails and the volume is requeued with backoff (never skipped); an event
///   saying the plugin is back wakes it early.
/// - [`ErrorClass::Fatal`]: the request cannot succeed as it is. The step is retried at the
///   backoff cap, and the volume shows the error until someone fixes the cause.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{rpc} failed ({class}): {detail}", class = class.as_str(), detail = escaped(detail))]
pub struct DetachError {
    /// The call.
    pub rpc: DetachRpc,
    /// What to do about it.
    pub class: ErrorClass,
    /// What went wrong, for people (never parsed, never a secret; `Display` escapes it).
    pub detail: String,
}

impl DetachError {
    /// A detach error.
    pub fn new(rpc: DetachRpc, class: ErrorClass, detail: impl Into<String>) -> Self {
        Self {
            rpc,
            class,
            detail: detail.into(),
        }
    }
}

/// "Run the node step for this claim": `NodeUnpublishVolume`, then `NodeUnstageVolume` if
/// [`unstage`](Self::unstage) (the claim was the last user of the volume on its node).
///
/// The node-side paths (target and staging) are the composing layer's to derive from these
/// ids; the claim layer does not invent them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDetachRequest {
    /// Answer with [`ReleaseMachine::node_detached`](crate::ReleaseMachine::node_detached).
    pub ticket: Ticket,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_volume: ExternalVolumeId,
    /// The plugin.
    pub plugin: PluginId,
    /// The node whose node plugin must be called.
    pub node: NodeId,
    /// The workload whose publication goes away.
    pub workload: WorkloadId,
    /// The claim's access mode.
    pub access_mode: AccessMode,
    /// The claim's attachment mode.
    pub attachment: AccessTypeKind,
    /// Whether the publication was read-only (a read claim).
    pub read_only: bool,
    /// Whether to unstage after unpublishing (no other live claim on this node).
    pub unstage: bool,
}

/// "Run the controller step for this claim": `ControllerUnpublishVolume` with the plugin's
/// volume id and the plugin's node id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerDetachRequest {
    /// Answer with
    /// [`ReleaseMachine::controller_detached`](crate::ReleaseMachine::controller_detached).
    pub ticket: Ticket,
    /// The orchestrator's volume id (for logs and secrets lookup).
    pub volume: VolumeId,
    /// The plugin's volume id: the `volume_id` of the call.
    pub external_volume: ExternalVolumeId,
    /// The plugin, whose controller serves the call.
    pub plugin: PluginId,
    /// The orchestrator's node (for logs).
    pub node: NodeId,
    /// The plugin's node id: the `node_id` of the call.
    pub plugin_node: PluginNodeId,
    /// The workload whose claim is being released.
    pub workload: WorkloadId,
    /// The version of the volume's record this step was decided on. A driver that fences its
    /// controller steps ([`crate::duty`]) has the store confirm that it still holds this
    /// version before the call leaves.
    pub decided_on: Option<Version>,
    /// Under a fenced duty: the holder's local deadline when the call started (the driver sets
    /// it; `None` without a fence). The driver abandons the call, retries included, when the
    /// duty lapses; a detacher that hands the call to another process (another agent, which
    /// would retry on its own) must bound it by this instant, since a paused holder cannot
    /// cancel what it handed over. A step cut short is answered uncertain and taken again,
    /// under the duty, by whoever holds it (`ControllerUnpublishVolume` is idempotent).
    pub duty_deadline: Option<tokio::time::Instant>,
}
