//! The attach path: the counterpart of csi-claims' release pipeline, for a claim that was just
//! made on this node.
//!
//! The release pipeline knows "the last user of the volume on this node": it unpublishes,
//! unstages with the last user, then controller-unpublishes. [`Attacher::attach`] does the
//! other half for one claim:
//!
//! 1. `ControllerPublishVolume` once per volume and node, when the plugin needs it
//!    ([`ControllerRequirement::of`] its capabilities): a later claim on the same node reuses
//!    the `publish_context` the volume manager recorded (it survives a restart);
//! 2. `NodeStageVolume` once per volume on this node, and
//! 3. `NodePublishVolume` for the claim's workload (both by the
//!    [`VolumeManager`]), read-only when the claim reads or the access mode allows no writer.
//!
//! Nothing is attached through a plugin whose health is not known to be good (its last probe
//! did not answer ready): the attach is refused before any call, with a retryable
//! [`VolumeError::NotHealthy`] naming the plugin and its health.
//!
//! Attaches of one volume take turns; different volumes attach at once. The controller
//! publish of a volume shared by several claims on the node is read-only only when the access
//! mode is (a read claim is read-only at its own `NodePublishVolume`), and only sent as such to
//! a plugin with `PUBLISH_READONLY`, as the spec asks.

use std::path::PathBuf;
use std::sync::Arc;

use csi_claims::{Claim, ClaimMode, ControllerRequirement};
use csi_client::ControllerClient;
use csi_structs::{
    ErrorClass, NodeId, PluginId, PublishContext, RegisteredVolume, VolumeCapability, VolumeId,
};

use crate::plugins::{ControllerClients, PluginManager};
use crate::volumes::ops::Ops;
use crate::volumes::{MountRequest, VolumeError, VolumeManager};

/// Why a claim could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The claim does not fit the volume or this node; `field` names what differs.
    #[error("claim of workload {workload} cannot be attached here: {field}: {reason}")]
    Mismatch {
        /// The workload.
        workload: String,
        /// `volume`, `node`, `external_id` or `access_mode`.
        field: &'static str,
        /// What differs.
        reason: String,
    },
    /// The plugin needs `ControllerPublishVolume` and no controller of it is reachable here.
    #[error("plugin {plugin} needs ControllerPublishVolume and has no controller here")]
    NoController {
        /// The plugin.
        plugin: PluginId,
    },
    /// `ControllerPublishVolume` failed.
    #[error("ControllerPublishVolume of volume {volume}: {source}")]
    ControllerPublish {
        /// The volume.
        volume: VolumeId,
        /// The client's error.
        #[source]
        source: csi_client::Error,
    },
    /// Staging or publishing failed (the usage record keeps what may have happened).
    #[error(transparent)]
    Mount(#[from] VolumeError),
}

impl AttachError {
    /// What to do about it: a call's error keeps its class; a missing controller is
    /// [`RetryElsewhere`](ErrorClass::RetryElsewhere); a mismatch is
    /// [`Fatal`](ErrorClass::Fatal).
    pub fn class(&self) -> ErrorClass {
        match self {
            AttachError::Mismatch { .. } => ErrorClass::Fatal,
            AttachError::NoController { .. } => ErrorClass::RetryElsewhere,
            AttachError::ControllerPublish { source, .. } => source.class(),
            AttachError::Mount(e) => e.class(),
        }
    }
}

/// A claim attached on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    /// The workload's target (host path).
    pub target: PathBuf,
    /// The `publish_context` given to the node calls.
    pub publish_context: PublishContext,
    /// Whether this attach called `ControllerPublishVolume` (false: not needed, or done
    /// already for this node).
    pub controller_published: bool,
    /// Whether the workload's publication is read-only.
    pub read_only: bool,
}

/// Whether a claim's publication is read-only: the claim only reads, or nobody may write.
pub fn read_only(claim: &Claim) -> bool {
    claim.mode() == ClaimMode::Read || claim.access_mode().is_read_only()
}

/// Attaches claims on this node. Cheap to clone.
#[derive(Clone)]
pub struct Attacher {
    node: NodeId,
    turns: Arc<Ops>,
    controllers: Arc<dyn ControllerClients>,
    volumes: VolumeManager,
}

impl std::fmt::Debug for Attacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attacher")
            .field("node", &self.node)
            .field("volumes", &self.volumes)
            .finish_non_exhaustive()
    }
}

impl Attacher {
    /// An attacher for node `node`, with its plugins and volume manager; controller calls go
    /// to the plugins' own controllers ([`PluginManager`] is a [`ControllerClients`]).
    pub fn new(node: NodeId, plugins: PluginManager, volumes: VolumeManager) -> Self {
        Self::with_controllers(node, Arc::new(plugins), volumes)
    }

    /// The same, with controller calls going where `controllers` says (a controller on
    /// another node, say); the node's plugins are the volume manager's.
    pub fn with_controllers(
        node: NodeId,
        controllers: Arc<dyn ControllerClients>,
        volumes: VolumeManager,
    ) -> Self {
        Self {
            node,
            turns: Arc::new(Ops::default()),
            controllers,
            volumes,
        }
    }

    /// Attaches `claim` (made on this node) to `volume`: controller publish if the plugin needs
    /// it and this node has none yet, then stage and publish through the volume manager.
    /// Returns the workload's target. Attaching again is safe (every call is idempotent).
    ///
    /// When it fails after the claim was made, release the claim: the release pipeline
    /// undoes whatever may have happened, uncertain outcomes included.
    ///
    /// # Errors
    ///
    /// An [`AttachError`] naming the step.
    pub async fn attach(
        &self,
        volume: &RegisteredVolume,
        claim: &Claim,
    ) -> Result<Attached, AttachError> {
        let mismatch = |field, reason: String| AttachError::Mismatch {
            workload: claim.workload().to_string(),
            field,
            reason,
        };
        if claim.volume() != volume.id() {
            return Err(mismatch(
                "volume",
                format!("the claim is on {}, not {}", claim.volume(), volume.id()),
            ));
        }
        if claim.node() != &self.node {
            return Err(mismatch(
                "node",
                format!(
                    "the claim is on node {}, this is {}",
                    claim.node(),
                    self.node
                ),
            ));
        }
        let external_id = volume
            .external_id()
            .ok_or_else(|| mismatch("external_id", "the volume has no plugin id yet".into()))?
            .clone();
        let capability = capability_for(volume, claim).ok_or_else(|| {
            mismatch(
                "access_mode",
                format!(
                    "the volume offers no {} {} capability",
                    claim.access_mode().wire_name(),
                    claim.attachment()
                ),
            )
        })?;
        let spec = volume.spec();
        let plugin = &spec.plugin_id;
        // Nothing is published, by the controller or on the node, through a plugin whose
        // health is not known to be good.
        let ready = self.volumes.publishable(plugin)?;
        let capabilities = &ready.fingerprint.capabilities;
        // One attach of the volume at a time, so the controller publish happens once.
        let _turn = self.turns.turn(&format!("{plugin}/{}", volume.id())).await;
        let needs_controller =
            ControllerRequirement::of(capabilities) == ControllerRequirement::Required;
        let known = self.volumes.publish_context(plugin, volume.id());
        let (publish_context, controller_published) = match known {
            Some(context) if needs_controller => (context, false),
            _ if !needs_controller => (PublishContext::default(), false),
            _ => {
                let controller = self.controller(plugin)?;
                // Shared by every claim on this node: read-only only when nobody may write.
                let read_only = claim.access_mode().is_read_only()
                    && capabilities.controller.allows_readonly_publish();
                let context = controller
                    .publish(
                        &external_id,
                        claim.plugin_node(),
                        &capability,
                        read_only,
                        &spec.volume_context,
                        &spec.secrets,
                    )
                    .await
                    .map_err(|source| AttachError::ControllerPublish {
                        volume: volume.id().clone(),
                        source,
                    })?;
                (context, true)
            }
        };
        let read_only = read_only(claim);
        let target = self
            .volumes
            .mount(&MountRequest {
                plugin: plugin.clone(),
                volume: volume.id().clone(),
                external_id,
                capability,
                read_only,
                workload: claim.workload().clone(),
                publish_context: publish_context.clone(),
                volume_context: spec.volume_context.clone(),
                secrets: spec.secrets.clone(),
            })
            .await?;
        Ok(Attached {
            target,
            publish_context,
            controller_published,
            read_only,
        })
    }

    fn controller(&self, plugin: &PluginId) -> Result<ControllerClient, AttachError> {
        self.controllers
            .controller(plugin)
            .ok_or_else(|| AttachError::NoController {
                plugin: plugin.clone(),
            })
    }
}

/// The volume's requested capability with the claim's access mode and attachment.
fn capability_for(volume: &RegisteredVolume, claim: &Claim) -> Option<VolumeCapability> {
    volume
        .spec()
        .requested_capabilities
        .iter()
        .find(|c| {
            c.access_mode == claim.access_mode() && c.access_type.kind() == claim.attachment()
        })
        .cloned()
}
