//! Capability names (the wire enums), what the mock implements, and whether it serves an rpc or
//! answers UNIMPLEMENTED. Which capability makes which rpc mandatory (csi-spec §3.8) is
//! csi-structs' table ([`csi_structs::capability_set::requirement_for`]), not restated here.

use std::collections::BTreeSet;

use csi_proto::{Rpc, Service};
use csi_structs::RpcSupport;

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

/// Every controller capability the mock advertises by default. The mock also implements
/// `VOLUME_CONDITION` (v1.12, reserved in v1.13), which is not among them so that the default
/// mock's capabilities do not change; a test opts into it with
/// [`controller_capabilities`](crate::MockPluginBuilder::controller_capabilities), and the mock
/// then reports the conditions set with
/// [`MockPlugin::set_volume_condition`](crate::MockPlugin::set_volume_condition).
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

/// Every node capability the mock advertises by default. `VOLUME_CONDITION`, also implemented,
/// is not among them; a test opts into it with
/// [`node_capabilities`](crate::MockPluginBuilder::node_capabilities), as the controller's.
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

/// What the mock advertises, in csi-structs' terms, so that spec §3.8 ("which capability makes
/// which RPC mandatory") is asked of [`csi_structs::Capabilities`] and not restated here.
pub(crate) fn advertised(config: &Config) -> csi_structs::Capabilities {
    let mut caps = csi_structs::Capabilities::default();
    for service in &config.plugin_caps.services {
        caps.plugin.insert_service_wire(*service as i32);
    }
    if let Some(expansion) = config.plugin_caps.expansion {
        caps.plugin.insert_expansion_wire(expansion as i32);
    }
    for cap in &config.controller_caps {
        caps.controller.insert_wire(*cap as i32);
    }
    for cap in &config.node_caps {
        caps.node.insert_wire(*cap as i32);
    }
    for cap in &config.group_caps {
        caps.group_controller.insert_wire(*cap as i32);
    }
    caps
}

/// Why the mock answers UNIMPLEMENTED to `rpc`, or `None` when it serves it.
///
/// First the service check (the role, and the plugin capability that announces the Controller
/// or GroupController service), then csi-structs' [`csi_structs::Capabilities::support`].
pub(crate) fn unimplemented_reason(config: &Config, rpc: Rpc) -> Option<String> {
    let name = rpc.name();
    let role = config.role;
    let has_service = |service| config.plugin_caps.services.contains(&service);
    let not_offered = match rpc.service() {
        Service::Identity | Service::SnapshotMetadata => None,
        Service::Controller if !role.has_controller() => Some(format!("it runs as {role}")),
        Service::Controller if !has_service(PluginService::ControllerService) => {
            Some("plugin capability CONTROLLER_SERVICE is not advertised".to_owned())
        }
        Service::GroupController if !role.has_controller() => Some(format!("it runs as {role}")),
        Service::GroupController if !has_service(PluginService::GroupControllerService) => {
            Some("plugin capability GROUP_CONTROLLER_SERVICE is not advertised".to_owned())
        }
        Service::Node if !role.has_node() => Some(format!("it runs as {role}")),
        Service::Controller | Service::GroupController | Service::Node => None,
    };
    if let Some(why) = not_offered {
        return Some(format!(
            "{name}: this mock plugin does not offer the {} service ({why})",
            rpc.service().name()
        ));
    }
    // The one deliberate difference from csi-structs: the mock serves NodeGetInfo on every node
    // role. The spec makes it mandatory only with controller PUBLISH_UNPUBLISH_VOLUME (csi-spec
    // §2.3 NodeGetInfo, §4.5; csi-structs' `requirement_for` says so), but a plugin may serve
    // it regardless (most do), and COs call it at registration.
    if rpc == Rpc::NodeGetInfo {
        return None;
    }
    match advertised(config).support(rpc) {
        RpcSupport::Required(_) => None,
        RpcSupport::NotAdvertised(requirement) => Some(format!(
            "{name}: {requirement} is not advertised by this mock plugin"
        )),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MockPlugin;

    fn config(builder: crate::config::MockPluginBuilder) -> Config {
        match builder.build() {
            Ok(plugin) => plugin.config().clone(),
            Err(err) => panic!("test configuration is valid: {err}"),
        }
    }

    #[test]
    fn node_get_info_is_served_on_a_node_role_without_publish_unpublish() {
        let config = config(
            MockPlugin::builder()
                .role(Role::Node)
                .controller_capabilities([]),
        );
        assert_eq!(unimplemented_reason(&config, Rpc::NodeGetInfo), None);
        // csi-structs alone would not oblige it: the override is what serves it.
        assert!(!advertised(&config).may_call(Rpc::NodeGetInfo));
        let controller = unimplemented_reason(&config, Rpc::CreateVolume).unwrap_or_default();
        assert!(controller.contains("Controller service"), "{controller}");
    }

    #[test]
    fn requirements_come_from_csi_structs() {
        let config = config(
            MockPlugin::builder()
                .plugin_capabilities([PluginService::ControllerService], None)
                .controller_capabilities([ControllerCapability::CreateDeleteVolume])
                .node_capabilities([NodeCapability::StageUnstageVolume]),
        );
        assert_eq!(unimplemented_reason(&config, Rpc::CreateVolume), None);
        assert_eq!(unimplemented_reason(&config, Rpc::NodeStageVolume), None);
        let list = unimplemented_reason(&config, Rpc::ListSnapshots).unwrap_or_default();
        assert!(
            list.contains("controller capability LIST_SNAPSHOTS is not advertised"),
            "{list}"
        );
        let stats = unimplemented_reason(&config, Rpc::NodeGetVolumeStats).unwrap_or_default();
        assert!(stats.contains("GET_VOLUME_STATS"), "{stats}");
        let metadata = unimplemented_reason(&config, Rpc::GetMetadataDelta).unwrap_or_default();
        assert!(metadata.contains("SNAPSHOT_METADATA_SERVICE"), "{metadata}");
        let group =
            unimplemented_reason(&config, Rpc::GroupControllerGetCapabilities).unwrap_or_default();
        assert!(group.contains("GROUP_CONTROLLER_SERVICE"), "{group}");
    }

    #[test]
    fn without_controller_service_no_controller_rpc_is_served() {
        let config = config(
            MockPlugin::builder()
                .plugin_capabilities([], None)
                .controller_capabilities([ControllerCapability::CreateDeleteVolume]),
        );
        for rpc in [Rpc::ControllerGetCapabilities, Rpc::CreateVolume] {
            let why = unimplemented_reason(&config, rpc).unwrap_or_default();
            assert!(why.contains("CONTROLLER_SERVICE"), "{why}");
        }
    }
}
