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
//! A failed attach leaves nothing it may have done: an uncertain `ControllerPublishVolume`
//! (a deadline, a lost connection, an answer that could not be used) is undone with
//! `ControllerUnpublishVolume` before the error is returned, and so is one this attach made
//! when the mount after it failed (the volume manager undoes its own steps).
//!
//! Nothing is attached through a plugin whose health is not known to be good (its last probe
//! did not answer ready): the attach is refused before any call, with a retryable
//! [`VolumeError::NotHealthy`] naming the plugin and its health.
//!
//! Attaches of one volume take turns ([`VolumeManager::attach_turn`], shared with any other
//! attach path over the same volume manager); different volumes attach at once. The controller
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
    /// Staging or publishing failed (undone, unless the error says otherwise).
    #[error(transparent)]
    Mount(#[from] VolumeError),
    /// The attach failed, and undoing the `ControllerPublishVolume` it made (or may have
    /// made) failed too: the volume may still be attached to this node. Releasing the claim
    /// finishes it (its controller step sends `ControllerUnpublishVolume` again).
    #[error(
        "{failed}; undoing ControllerPublishVolume of volume {volume} failed too (releasing the claim retries it): {undo}"
    )]
    ControllerNotUndone {
        /// The volume.
        volume: VolumeId,
        /// Why the attach failed.
        failed: Box<AttachError>,
        /// Why `ControllerUnpublishVolume` failed.
        #[source]
        undo: csi_client::Error,
    },
}

impl AttachError {
    /// What to do about it: a call's error keeps its class (an attach not undone keeps its
    /// failure's); a missing controller is
    /// [`RetryElsewhere`](ErrorClass::RetryElsewhere); a mismatch is
    /// [`Fatal`](ErrorClass::Fatal).
    pub fn class(&self) -> ErrorClass {
        match self {
            AttachError::Mismatch { .. } => ErrorClass::Fatal,
            AttachError::NoController { .. } => ErrorClass::RetryElsewhere,
            AttachError::ControllerPublish { source, .. } => source.class(),
            AttachError::Mount(e) => e.class(),
            AttachError::ControllerNotUndone { failed, .. } => failed.class(),
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
            controllers,
            volumes,
        }
    }

    /// Attaches `claim` (made on this node) to `volume`: controller publish if the plugin needs
    /// it and this node has none yet, then stage and publish through the volume manager.
    /// Returns the workload's target. Attaching again is safe (every call is idempotent).
    ///
    /// A failed attach undoes what it may have done before it returns: the volume manager
    /// its stage and publish, the attacher the `ControllerPublishVolume` this attach made or
    /// may have made (when nothing of the volume is left on this node). Release the claim all
    /// the same: a claim nobody uses must go, and what could not be undone (the error says
    /// so: [`VolumeError::NotUndone`], [`AttachError::ControllerNotUndone`]) is the release
    /// pipeline's to finish.
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
        // One attach of the volume at a time (by this attacher or anyone else attaching over
        // the same volume manager), so the controller publish happens once.
        let _turn = self.volumes.attach_turn(plugin, volume.id()).await;
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
                let published = controller
                    .publish(
                        &external_id,
                        claim.plugin_node(),
                        &capability,
                        read_only,
                        &spec.volume_context,
                        &spec.secrets,
                    )
                    .await;
                match published {
                    Ok(context) => (context, true),
                    Err(source) => {
                        let uncertain = source.class() == ErrorClass::Uncertain;
                        let failed = AttachError::ControllerPublish {
                            volume: volume.id().clone(),
                            source,
                        };
                        // It may have attached the volume: undo it before saying so.
                        return Err(if uncertain {
                            self.undo_controller_publish(volume, claim, failed).await
                        } else {
                            failed
                        });
                    }
                }
            }
        };
        let read_only = read_only(claim);
        let mounted = self
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
                secrets: spec.secrets.clone().into(),
            })
            .await;
        let target = match mounted {
            Ok(target) => target,
            // The mount undid itself: the controller publish this attach made goes too,
            // unless the volume is still in use (or still recorded) on this node.
            Err(e)
                if controller_published && self.volumes.record(plugin, volume.id()).is_none() =>
            {
                return Err(self.undo_controller_publish(volume, claim, e.into()).await);
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Attached {
            target,
            publish_context,
            controller_published,
            read_only,
        })
    }

    /// `ControllerUnpublishVolume` of the volume from the claim's node, after an attach that
    /// made (or may have made) its controller publish failed. Returns the attach's error, or
    /// [`AttachError::ControllerNotUndone`] when the undo failed too.
    async fn undo_controller_publish(
        &self,
        volume: &RegisteredVolume,
        claim: &Claim,
        failed: AttachError,
    ) -> AttachError {
        let spec = volume.spec();
        let (Some(external_id), Ok(controller)) =
            (volume.external_id(), self.controller(&spec.plugin_id))
        else {
            // Checked before the publish; cannot be missing now.
            return failed;
        };
        match controller
            .unpublish(external_id, Some(claim.plugin_node()), &spec.secrets)
            .await
        {
            Err(undo) if undo.class() != ErrorClass::AlreadyDone => {
                tracing::warn!(volume = %volume.id(), error = %failed, undo = %undo, "failed attach: ControllerPublishVolume not undone");
                AttachError::ControllerNotUndone {
                    volume: volume.id().clone(),
                    failed: Box::new(failed),
                    undo,
                }
            }
            _ => {
                tracing::info!(volume = %volume.id(), error = %failed, "failed attach: ControllerPublishVolume undone");
                failed
            }
        }
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
