//! How a volume manager operation fails.

use std::path::PathBuf;
use std::sync::Arc;

use csi_client::{Code, ErrorClass};
use csi_structs::{PluginId, VolumeId, WorkloadId};

use crate::layout::LayoutError;
use crate::plugins::Health;
use crate::state::StateFileError;

/// A failed mount, unmount or expansion. The usage record keeps whatever is still to do.
///
/// Cheap to clone (causes are shared), so the same error goes to the caller and into the
/// operation's [`VolumeEvent`](super::VolumeEvent).
#[derive(Clone, Debug, thiserror::Error)]
pub enum VolumeError {
    /// The plugin's node service is not here (not registered, not fingerprinted yet, or
    /// without a Node service).
    #[error("plugin {plugin} has no node service on this node (yet)")]
    PluginMissing {
        /// The plugin.
        plugin: PluginId,
    },
    /// The plugin's health is not known to be good (not probed since its fingerprint, or
    /// its last probe failed): nothing is published through it until a probe answers ready.
    #[error(
        "plugin {plugin} is not known to be healthy, so nothing is published through it yet: its health is {health}"
    )]
    NotHealthy {
        /// The plugin.
        plugin: PluginId,
        /// Its health when the mount was asked for.
        health: Health,
    },
    /// The plugin does not offer what the operation needs.
    #[error("plugin {plugin} cannot {what}: it lacks the node capability {capability}")]
    Unsupported {
        /// The plugin.
        plugin: PluginId,
        /// What was asked, e.g. `expand volumes on the node`.
        what: &'static str,
        /// The missing capability, e.g. `EXPAND_VOLUME`.
        capability: &'static str,
    },
    /// The operation needs a publication or staging of the volume on this node, and there is
    /// none.
    #[error("volume {volume} is neither staged nor published on this node")]
    NotHere {
        /// The volume.
        volume: VolumeId,
    },
    /// A CSI call failed.
    #[error("{step} of volume {volume}{}: {source}", for_workload(workload.as_ref()))]
    Call {
        /// `NodeStageVolume`, `NodePublishVolume`, …
        step: &'static str,
        /// The volume.
        volume: VolumeId,
        /// The workload (`None` for a call that is not one workload's, like an expansion).
        workload: Option<WorkloadId>,
        /// The client's error.
        #[source]
        source: Arc<csi_client::Error>,
    },
    /// An id cannot be used as a path segment.
    #[error(transparent)]
    Path(#[from] LayoutError),
    /// A directory could not be created or removed.
    #[error("volume {volume}: cannot {action} {}: {source}", path.display())]
    Dir {
        /// The volume.
        volume: VolumeId,
        /// `create` or `remove`.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A mount failed, and undoing what it may have done (unpublish, then unstage when no
    /// other publication is left) failed too: the usage record keeps what is left
    /// ([`VolumeManager::uncertain`](super::VolumeManager::uncertain)) until an unmount of the
    /// workload cleans it up.
    #[error(
        "{failed}; undoing it failed too, so the usage record keeps it until an unmount cleans it up: {undo}"
    )]
    NotUndone {
        /// Why the mount failed.
        failed: Box<VolumeError>,
        /// Why the undo failed.
        #[source]
        undo: Box<VolumeError>,
    },
    /// A usage record restored from the file could not be confirmed against its plugin (not
    /// here, or not known to be healthy): nothing was called and the record is kept, for a
    /// later [`reconcile`](super::VolumeManager::reconcile), mount or unmount.
    #[error(
        "the usage record of volume {volume}{} could not be confirmed and is kept: {source}",
        for_workload(workload.as_ref())
    )]
    NotConfirmed {
        /// The plugin.
        plugin: PluginId,
        /// The volume.
        volume: VolumeId,
        /// The workload whose publication it is (`None`: the volume's staging).
        workload: Option<WorkloadId>,
        /// Why: [`PluginMissing`](Self::PluginMissing) or [`NotHealthy`](Self::NotHealthy).
        #[source]
        source: Box<VolumeError>,
    },
    /// The usage records could not be written (their file, or the database they are kept in).
    #[error("volume {volume}: {source}")]
    Usage {
        /// The volume.
        volume: VolumeId,
        /// Why.
        #[source]
        source: Arc<StateFileError>,
    },
}

fn for_workload(workload: Option<&WorkloadId>) -> String {
    workload
        .map(|w| format!(" for workload {w}"))
        .unwrap_or_default()
}

impl VolumeError {
    /// What to do about it: a plugin call keeps the class csi-client gave it (a mount not
    /// undone keeps its failure's, a record not confirmed its cause's); a missing
    /// plugin is [`RetryElsewhere`](ErrorClass::RetryElsewhere); a plugin not known to be
    /// healthy and local failures are [`Retry`](ErrorClass::Retry); a bad id or a missing
    /// capability is [`Fatal`](ErrorClass::Fatal).
    pub fn class(&self) -> ErrorClass {
        match self {
            VolumeError::NotUndone { failed, .. } => failed.class(),
            VolumeError::NotConfirmed { source, .. } => source.class(),
            VolumeError::PluginMissing { .. } => ErrorClass::RetryElsewhere,
            VolumeError::Call { source, .. } => source.class(),
            VolumeError::NotHealthy { .. }
            | VolumeError::Dir { .. }
            | VolumeError::Usage { .. } => ErrorClass::Retry,
            VolumeError::Path(_)
            | VolumeError::Unsupported { .. }
            | VolumeError::NotHere { .. } => ErrorClass::Fatal,
        }
    }

    /// The gRPC code, when a plugin answered one.
    pub fn code(&self) -> Option<Code> {
        match self {
            VolumeError::Call { source, .. } => source.code(),
            VolumeError::NotUndone { failed, .. } => failed.code(),
            _ => None,
        }
    }
}
