//! Which steps the plugin's capabilities call for.

use csi_client::Fingerprint;
use csi_structs::{ExternalVolumeId, PluginNodeId, Topology};

/// Where the demo's volume comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// `CreateVolume` at the start, `DeleteVolume` at the end.
    Create,
    /// A volume that already exists (`--volume-id`); it is used and kept.
    Existing(ExternalVolumeId),
}

/// The lifecycle adapted to one plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Create a volume or use an existing one.
    pub volume: VolumeSource,
    /// `ValidateVolumeCapabilities` (the plugin has a Controller service).
    pub validate: bool,
    /// `ControllerPublishVolume`/`ControllerUnpublishVolume` (`PUBLISH_UNPUBLISH_VOLUME`).
    pub controller_publish: bool,
    /// `NodeStageVolume`/`NodeUnstageVolume` (`STAGE_UNSTAGE_VOLUME`).
    pub stage: bool,
    /// The plugin's id for this node (from `NodeGetInfo`).
    pub plugin_node: PluginNodeId,
    /// Where this node sits (from `NodeGetInfo`); `None` for no topology.
    pub node_topology: Option<Topology>,
    /// How the published volume is grown, or why it is not.
    pub expand: Result<Expansion, &'static str>,
    /// `CreateSnapshot`/`DeleteSnapshot` (`CREATE_DELETE_SNAPSHOT`), or why not.
    pub snapshot: Result<(), &'static str>,
}

/// How a published volume is grown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expansion {
    /// `ControllerExpandVolume` (controller `EXPAND_VOLUME`, with `VolumeExpansion` `ONLINE`).
    pub controller: bool,
    /// `NodeExpandVolume` may follow (node `EXPAND_VOLUME`): when the controller asks for it,
    /// or always without a controller step.
    pub node: bool,
}

impl Expansion {
    /// What the plugin's capabilities allow for a volume in use (spec §3.8: `ONLINE` for the
    /// controller to grow a published volume; node `EXPAND_VOLUME` grows it on the node).
    fn of(caps: &csi_structs::Capabilities) -> Result<Expansion, &'static str> {
        let controller = caps.may_call(csi_client::Rpc::ControllerExpandVolume);
        let node = caps.node.can_expand();
        let online = caps
            .plugin
            .has_expansion(csi_structs::VolumeExpansion::Online);
        match (controller, node) {
            (false, false) => Err("the plugin advertises no EXPAND_VOLUME"),
            (true, _) if !online => Err(
                "the plugin expands offline only (no VolumeExpansion ONLINE) and the volume is published",
            ),
            (controller, node) => Ok(Expansion { controller, node }),
        }
    }
}

/// Why the plugin cannot run the demo as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The plugin does not serve the Node service here, so nothing can be published.
    #[error(
        "plugin {plugin} serves no Node service here (NodeGetInfo unimplemented); the demo needs a node plugin"
    )]
    NoNodeService {
        /// The plugin's name.
        plugin: String,
    },
    /// The plugin cannot create volumes and no `--volume-id` was given.
    #[error(
        "plugin {plugin} cannot create volumes (no CREATE_DELETE_VOLUME); give an existing volume with --volume-id"
    )]
    CannotCreate {
        /// The plugin's name.
        plugin: String,
    },
}

impl Plan {
    /// The plan for the plugin `fingerprint` describes; `existing` is `--volume-id`.
    ///
    /// # Errors
    ///
    /// [`PlanError`] when the plugin has no node service, or cannot create and no volume
    /// was given.
    pub fn for_plugin(
        fingerprint: &Fingerprint,
        existing: Option<ExternalVolumeId>,
    ) -> Result<Plan, PlanError> {
        let caps = &fingerprint.capabilities;
        let plugin = fingerprint.plugin.name.to_string();
        let Some(node) = &fingerprint.node else {
            return Err(PlanError::NoNodeService { plugin });
        };
        let volume = match existing {
            Some(id) => VolumeSource::Existing(id),
            None if caps.may_call(csi_client::Rpc::CreateVolume) => VolumeSource::Create,
            None => return Err(PlanError::CannotCreate { plugin }),
        };
        Ok(Plan {
            volume,
            validate: caps.plugin.has_controller_service(),
            controller_publish: caps.lifecycle_requires(csi_client::Rpc::ControllerPublishVolume),
            stage: caps.node.requires_staging(),
            plugin_node: node.node_id.clone(),
            node_topology: node.topology.clone(),
            expand: Expansion::of(caps),
            snapshot: if caps.may_call(csi_client::Rpc::CreateSnapshot) {
                Ok(())
            } else {
                Err("the plugin lacks CREATE_DELETE_SNAPSHOT")
            },
        })
    }

    /// One line saying what was adapted, for the fingerprint row.
    pub fn describe(&self) -> String {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        format!(
            "node id {}; controller publish: {}, staging: {}, volume: {}",
            self.plugin_node,
            yes_no(self.controller_publish),
            yes_no(self.stage),
            match &self.volume {
                VolumeSource::Create => "create".to_owned(),
                VolumeSource::Existing(id) => format!("existing {id}"),
            }
        )
    }
}
