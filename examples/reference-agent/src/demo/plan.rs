//! Which steps the plugin's fingerprint calls for, decided before any of them is called.

use csi_client::{Fingerprint, Rpc};
use csi_structs::VolumeExpansion;

/// The lifecycle adapted to one plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `ControllerPublishVolume`/`ControllerUnpublishVolume` (`PUBLISH_UNPUBLISH_VOLUME`).
    pub(crate) controller_publish: bool,
    /// `NodeStageVolume`/`NodeUnstageVolume` (`STAGE_UNSTAGE_VOLUME`).
    pub(crate) stage: bool,
    /// Whether the published volume can grow, or why not.
    pub(crate) expand: Result<(), &'static str>,
    /// `CreateSnapshot`/`DeleteSnapshot` (`CREATE_DELETE_SNAPSHOT`), or why not.
    pub(crate) snapshot: Result<(), &'static str>,
    /// One line saying what the plugin is and what was adapted.
    pub(crate) describe: String,
}

/// Why the plugin cannot run the demo as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlanError {
    /// The plugin does not serve the Node service here, so nothing can be published.
    #[error(
        "plugin {0} serves no Node service here (NodeGetInfo unimplemented); the demo needs a node plugin"
    )]
    NoNodeService(String),
    /// The plugin cannot create volumes and no `--volume-id` was given.
    #[error(
        "plugin {0} cannot create volumes (no CREATE_DELETE_VOLUME); give an existing volume with --volume-id"
    )]
    CannotCreate(String),
}

impl Plan {
    /// The plan for the plugin `fingerprint` describes; `existing` when `--volume-id` was
    /// given.
    ///
    /// # Errors
    ///
    /// [`PlanError`] when the plugin has no node service, or cannot create and no volume
    /// was given.
    pub(crate) fn for_plugin(fingerprint: &Fingerprint, existing: bool) -> Result<Plan, PlanError> {
        let caps = &fingerprint.capabilities;
        let plugin = fingerprint.plugin.name.to_string();
        let Some(node) = &fingerprint.node else {
            return Err(PlanError::NoNodeService(plugin));
        };
        if !existing && !caps.may_call(Rpc::CreateVolume) {
            return Err(PlanError::CannotCreate(plugin));
        }
        // Spec §3.8: the controller grows a published volume only with `ONLINE`; node
        // `EXPAND_VOLUME` alone grows it where it is published.
        let controller = caps.may_call(Rpc::ControllerExpandVolume);
        let expand = match (controller, caps.node.can_expand()) {
            (false, false) => Err("the plugin advertises no EXPAND_VOLUME"),
            (true, _) if !caps.plugin.has_expansion(VolumeExpansion::Online) => Err(
                "the plugin expands offline only (no VolumeExpansion ONLINE) and the volume is published",
            ),
            _ => Ok(()),
        };
        let snapshot = match caps.may_call(Rpc::CreateSnapshot) {
            true => Ok(()),
            false => Err("the plugin lacks CREATE_DELETE_SNAPSHOT"),
        };
        let controller_publish = caps.lifecycle_requires(Rpc::ControllerPublishVolume);
        let stage = caps.node.requires_staging();
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let describe = format!(
            "{} {}: node id {}; controller publish: {}, staging: {}, expansion: {}, snapshots: {}",
            fingerprint.plugin.name,
            fingerprint.plugin.vendor_version,
            node.node_id,
            yes_no(controller_publish),
            yes_no(stage),
            yes_no(expand.is_ok()),
            yes_no(snapshot.is_ok()),
        );
        Ok(Plan {
            controller_publish,
            stage,
            expand,
            snapshot,
            describe,
        })
    }

    /// The calls of a claim (`release`: of its release) the plugin does not need, with why.
    pub(crate) fn skipped_calls(&self, release: bool) -> Vec<(&'static str, &'static str)> {
        let mut skipped = Vec::new();
        if !self.controller_publish {
            let rpc = match release {
                false => Rpc::ControllerPublishVolume,
                true => Rpc::ControllerUnpublishVolume,
            };
            skipped.push((rpc.name(), "the plugin lacks PUBLISH_UNPUBLISH_VOLUME"));
        }
        if !self.stage {
            let rpc = match release {
                false => Rpc::NodeStageVolume,
                true => Rpc::NodeUnstageVolume,
            };
            skipped.push((rpc.name(), "the plugin lacks STAGE_UNSTAGE_VOLUME"));
        }
        skipped
    }
}
