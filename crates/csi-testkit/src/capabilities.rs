//! Capability names (the wire enums), what the mock implements, and which capability each rpc
//! needs before the mock serves it instead of answering UNIMPLEMENTED (csi-spec §3.8).

use std::collections::BTreeSet;

use csi_proto::Rpc;

use crate::config::{Config, Role};

/// A controller capability (`ControllerServiceCapability.RPC.Type`).
pub use csi_proto::v1::controller_service_capability::rpc::Type as ControllerCapability;
/// A group controller capability (`GroupControllerServiceCapability.RPC.Type`).
pub use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupControllerCapability;
/// A node capability (`NodeServiceCapability.RPC.Type`).
pub use csi_proto::v1::node_service_capability::rpc::Type as NodeCapability;
/// A plugin-level service capability (`PluginCapability.Service.Type`).
pub use csi_proto::v1::plugin_capability::service::Type as PluginService;
/// A plugin-level volume expansion mode (`PluginCapability.VolumeExpansion.Type`).
pub use csi_proto::v1::plugin_capability::volume_expansion::Type as VolumeExpansion;

/// Every controller capability the mock implements. `VOLUME_CONDITION` (reserved in v1.13) is
/// not among them.
pub const CONTROLLER_IMPLEMENTED: &[ControllerCapability] = &[
    ControllerCapability::CreateDeleteVolume,
    ControllerCapability::PublishUnpublishVolume,
    ControllerCapability::ListVolumes,
    ControllerCapability::GetCapacity,
    ControllerCapability::CreateDeleteSnapshot,
    ControllerCapability::ListSnapshots,
    ControllerCapability::CloneVolume,
    ControllerCapability::PublishReadonly,
    ControllerCapability::ExpandVolume,
    ControllerCapability::ListVolumesPublishedNodes,
    ControllerCapability::GetVolume,
    ControllerCapability::SingleNodeMultiWriter,
    ControllerCapability::ModifyVolume,
    ControllerCapability::GetSnapshot,
    ControllerCapability::GetVolumeHealth,
    ControllerCapability::ListVolumeHealth,
];

/// Every node capability the mock implements. `VOLUME_CONDITION` is not among them.
pub const NODE_IMPLEMENTED: &[NodeCapability] = &[
    NodeCapability::StageUnstageVolume,
    NodeCapability::GetVolumeStats,
    NodeCapability::ExpandVolume,
    NodeCapability::SingleNodeMultiWriter,
    NodeCapability::VolumeMountGroup,
    NodeCapability::GetVolumeHealth,
    NodeCapability::GetStorageHealth,
];

/// Every group controller capability the mock implements.
pub const GROUP_CONTROLLER_IMPLEMENTED: &[GroupControllerCapability] =
    &[GroupControllerCapability::CreateDeleteGetVolumeGroupSnapshot];

/// The capabilities a plugin reports from `GetPluginCapabilities`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginCapabilities {
    /// The service capabilities.
    pub services: BTreeSet<PluginService>,
    /// The volume expansion mode, if the plugin reports one.
    pub expansion: Option<VolumeExpansion>,
}

/// What an rpc needs before the mock serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    Nothing,
    Controller(Option<ControllerCapability>),
    Node(Option<NodeCapability>),
    Group(Option<GroupControllerCapability>),
    SnapshotMetadata,
}

fn needs(rpc: Rpc) -> Needs {
    use ControllerCapability as C;
    use NodeCapability as N;
    match rpc {
        Rpc::GetPluginInfo | Rpc::GetPluginCapabilities | Rpc::Probe => Needs::Nothing,
        Rpc::CreateVolume | Rpc::DeleteVolume => Needs::Controller(Some(C::CreateDeleteVolume)),
        Rpc::ControllerPublishVolume | Rpc::ControllerUnpublishVolume => {
            Needs::Controller(Some(C::PublishUnpublishVolume))
        }
        Rpc::ValidateVolumeCapabilities | Rpc::ControllerGetCapabilities => Needs::Controller(None),
        Rpc::ListVolumes => Needs::Controller(Some(C::ListVolumes)),
        Rpc::ControllerListVolumeHealth => Needs::Controller(Some(C::ListVolumeHealth)),
        Rpc::ControllerGetVolumeHealth => Needs::Controller(Some(C::GetVolumeHealth)),
        Rpc::GetCapacity => Needs::Controller(Some(C::GetCapacity)),
        Rpc::CreateSnapshot | Rpc::DeleteSnapshot => {
            Needs::Controller(Some(C::CreateDeleteSnapshot))
        }
        Rpc::ListSnapshots => Needs::Controller(Some(C::ListSnapshots)),
        Rpc::GetSnapshot => Needs::Controller(Some(C::GetSnapshot)),
        Rpc::ControllerExpandVolume => Needs::Controller(Some(C::ExpandVolume)),
        Rpc::ControllerGetVolume => Needs::Controller(Some(C::GetVolume)),
        Rpc::ControllerModifyVolume => Needs::Controller(Some(C::ModifyVolume)),
        Rpc::GroupControllerGetCapabilities => Needs::Group(None),
        Rpc::CreateVolumeGroupSnapshot
        | Rpc::DeleteVolumeGroupSnapshot
        | Rpc::GetVolumeGroupSnapshot => Needs::Group(Some(
            GroupControllerCapability::CreateDeleteGetVolumeGroupSnapshot,
        )),
        Rpc::GetMetadataAllocated | Rpc::GetMetadataDelta => Needs::SnapshotMetadata,
        Rpc::NodeStageVolume | Rpc::NodeUnstageVolume => Needs::Node(Some(N::StageUnstageVolume)),
        Rpc::NodePublishVolume
        | Rpc::NodeUnpublishVolume
        | Rpc::NodeGetCapabilities
        | Rpc::NodeGetInfo => Needs::Node(None),
        Rpc::NodeGetVolumeStats => Needs::Node(Some(N::GetVolumeStats)),
        Rpc::NodeGetVolumeHealth => Needs::Node(Some(N::GetVolumeHealth)),
        Rpc::NodeGetStorageHealth => Needs::Node(Some(N::GetStorageHealth)),
        Rpc::NodeExpandVolume => Needs::Node(Some(N::ExpandVolume)),
    }
}

/// Why the mock answers UNIMPLEMENTED to `rpc`, or `None` when it serves it.
pub(crate) fn unimplemented_reason(config: &Config, rpc: Rpc) -> Option<String> {
    let name = rpc.name();
    match needs(rpc) {
        Needs::Nothing => None,
        Needs::Controller(cap) => {
            if !config.role.has_controller() {
                return Some(format!(
                    "{name}: this mock plugin runs as {}; the Controller service is not offered",
                    config.role
                ));
            }
            let cap = cap?;
            (!config.controller_caps.contains(&cap)).then(|| {
                format!(
                    "{name}: controller capability {} is not advertised by this mock plugin",
                    cap.as_str_name()
                )
            })
        }
        Needs::Node(cap) => {
            if !config.role.has_node() {
                return Some(format!(
                    "{name}: this mock plugin runs as {}; the Node service is not offered",
                    config.role
                ));
            }
            let cap = cap?;
            (!config.node_caps.contains(&cap)).then(|| {
                format!(
                    "{name}: node capability {} is not advertised by this mock plugin",
                    cap.as_str_name()
                )
            })
        }
        Needs::Group(cap) => {
            if !config.role.has_controller()
                || !config
                    .plugin_caps
                    .services
                    .contains(&PluginService::GroupControllerService)
            {
                return Some(format!(
                    "{name}: the GroupController service is not offered (plugin capability \
                     GROUP_CONTROLLER_SERVICE absent or role {})",
                    config.role
                ));
            }
            let cap = cap?;
            (!config.group_caps.contains(&cap)).then(|| {
                format!(
                    "{name}: group controller capability {} is not advertised by this mock plugin",
                    cap.as_str_name()
                )
            })
        }
        Needs::SnapshotMetadata => (!config
            .plugin_caps
            .services
            .contains(&PluginService::SnapshotMetadataService))
        .then(|| {
            format!(
                "{name}: the SnapshotMetadata service is not offered (plugin capability \
                 SNAPSHOT_METADATA_SERVICE absent)"
            )
        }),
    }
}

/// The plugin capabilities the mock reports by default for a role: the controller service
/// when it has one, group controller and snapshot metadata services, accessibility
/// constraints when a topology is configured, and online expansion.
pub(crate) fn default_plugin_caps(role: Role, has_topology: bool) -> PluginCapabilities {
    let mut services = BTreeSet::new();
    if role.has_controller() {
        services.insert(PluginService::ControllerService);
        services.insert(PluginService::GroupControllerService);
    }
    services.insert(PluginService::SnapshotMetadataService);
    if has_topology {
        services.insert(PluginService::VolumeAccessibilityConstraints);
    }
    PluginCapabilities {
        services,
        expansion: Some(VolumeExpansion::Online),
    }
}
