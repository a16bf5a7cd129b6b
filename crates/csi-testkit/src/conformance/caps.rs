//! What the plugin advertises, read once before the checks run, and the gates derived from it.

use std::collections::BTreeSet;

use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupCap;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::plugin_capability::volume_expansion::Type as Expansion;

use csi_proto::Rpc;
use csi_structs::capability_set::requirement_for;
use csi_structs::{
    Capabilities, ControllerCapability, GroupControllerCapability, NodeCapability, PluginService,
    Requirement,
};

use super::ctx::Stop;

/// Whether the plugin serves the Node service at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NodeService {
    /// NodeGetCapabilities answered.
    Served,
    /// NodeGetCapabilities answered UNIMPLEMENTED: a controller-only deployment.
    Absent,
    /// NodeGetCapabilities failed otherwise; node checks cannot run.
    Broken(String),
}

/// The advertised capabilities. Unknown enum numbers (newer spec versions) are ignored.
#[derive(Clone, Debug)]
pub(crate) struct Caps {
    pub(crate) plugin: BTreeSet<PluginCap>,
    pub(crate) expansion: BTreeSet<Expansion>,
    pub(crate) controller: BTreeSet<CtrlCap>,
    pub(crate) node: BTreeSet<NodeCap>,
    pub(crate) group: BTreeSet<GroupCap>,
    pub(crate) node_service: NodeService,
    /// Problems met while reading capabilities; reported by `CapabilitiesCoherent`.
    pub(crate) problems: Vec<String>,
}

/// A condition a check needs before it can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// The plugin advertises CONTROLLER_SERVICE.
    ControllerService,
    /// The plugin advertises CONTROLLER_SERVICE and this controller capability.
    Controller(CtrlCap),
    /// The plugin serves the Node service.
    NodeService,
    /// The plugin advertises GROUP_CONTROLLER_SERVICE and this group capability.
    Group(GroupCap),
    /// What csi-structs says makes an RPC mandatory (spec §3.8), see [`gate_of`].
    Spec(Requirement),
}

impl Gate {
    /// The gate as a csi-structs requirement. The wire enums' `UNKNOWN` (0) names no
    /// capability; a gate on it asks only for the service.
    fn requirement(self) -> Requirement {
        match self {
            Gate::ControllerService => Requirement::Plugin(PluginService::ControllerService),
            Gate::Controller(cap) => ControllerCapability::from_wire(cap as i32)
                .map_or(Requirement::Plugin(PluginService::ControllerService), |c| {
                    Requirement::Controller(c)
                }),
            Gate::NodeService => Requirement::NodeService,
            Gate::Group(cap) => GroupControllerCapability::from_wire(cap as i32).map_or(
                Requirement::Plugin(PluginService::GroupControllerService),
                Requirement::GroupController,
            ),
            Gate::Spec(requirement) => requirement,
        }
    }
}

impl Caps {
    /// The advertised capabilities in csi-structs' terms, for its spec §3.8 rules.
    pub(crate) fn structs(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        for service in &self.plugin {
            caps.plugin.insert_service_wire(*service as i32);
        }
        for mode in &self.expansion {
            caps.plugin.insert_expansion_wire(*mode as i32);
        }
        for cap in &self.controller {
            caps.controller.insert_wire(*cap as i32);
        }
        if self.node_service == NodeService::Served {
            for cap in &self.node {
                caps.node.insert_wire(*cap as i32);
            }
        }
        for cap in &self.group {
            caps.group_controller.insert_wire(*cap as i32);
        }
        caps
    }

    pub(crate) fn has_controller(&self, cap: CtrlCap) -> bool {
        self.require(Gate::Controller(cap)).is_ok()
    }

    pub(crate) fn has_node(&self, cap: NodeCap) -> bool {
        NodeCapability::from_wire(cap as i32)
            .is_some_and(|c| self.require(Gate::Spec(Requirement::Node(c))).is_ok())
    }

    /// Whether the spec obliges the plugin to serve `rpc`, given what it advertised.
    pub(crate) fn serves(&self, rpc: Rpc) -> bool {
        gate_of(rpc).is_none_or(|gate| self.require(gate).is_ok())
    }

    /// Ok when `gate` holds, else a skip naming what is absent.
    ///
    /// The rule is csi-structs' [`Capabilities::unmet`] (which counts a controller or group
    /// controller capability only with its service's plugin capability); the suite adds only
    /// that a node requirement needs the Node service to answer.
    pub(crate) fn require(&self, gate: Gate) -> Result<(), Stop> {
        let requirement = gate.requirement();
        if let Requirement::NodeService | Requirement::Node(_) | Requirement::NodeEither(..) =
            requirement
        {
            match &self.node_service {
                NodeService::Served => {}
                NodeService::Absent => {
                    return Err(Stop::skip(
                        "Node service not served (NodeGetCapabilities is UNIMPLEMENTED)",
                    ));
                }
                NodeService::Broken(why) => {
                    return Err(Stop::fail(format!("NodeGetCapabilities failed: {why}")));
                }
            }
        }
        match self.structs().unmet(requirement) {
            None => Ok(()),
            Some(missing) if missing == requirement => {
                Err(Stop::skip(format!("{requirement} not advertised")))
            }
            Some(missing) => Err(Stop::skip(format!(
                "{missing} not advertised (needed for {requirement})"
            ))),
        }
    }
}

/// The condition under which the spec obliges a plugin to serve `rpc` (csi-structs'
/// [`requirement_for`]); `None` for the Identity RPCs (always).
pub(crate) fn gate_of(rpc: Rpc) -> Option<Gate> {
    match requirement_for(rpc) {
        Requirement::Always => None,
        requirement => Some(Gate::Spec(requirement)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(plugin: &[PluginCap], controller: &[CtrlCap], node: &[NodeCap]) -> Caps {
        Caps {
            plugin: plugin.iter().copied().collect(),
            expansion: BTreeSet::new(),
            controller: controller.iter().copied().collect(),
            node: node.iter().copied().collect(),
            group: BTreeSet::new(),
            node_service: NodeService::Served,
            problems: Vec::new(),
        }
    }

    #[test]
    fn gates_follow_csi_structs() {
        let caps = caps(
            &[PluginCap::ControllerService],
            &[CtrlCap::ListSnapshots],
            &[NodeCap::VolumeCondition],
        );
        assert!(caps.serves(Rpc::ListSnapshots));
        assert!(!caps.serves(Rpc::CreateVolume));
        // NodeGetVolumeStats is also mandatory with the v1.12 VOLUME_CONDITION.
        assert!(caps.serves(Rpc::NodeGetVolumeStats));
        // The SnapshotMetadata service is gated on its plugin capability.
        assert!(!caps.serves(Rpc::GetMetadataAllocated));
        assert!(!caps.serves(Rpc::GroupControllerGetCapabilities));
        assert!(caps.serves(Rpc::Probe));
    }

    #[test]
    fn controller_capabilities_count_only_with_controller_service() {
        let caps = caps(&[], &[CtrlCap::ListSnapshots], &[]);
        assert!(!caps.has_controller(CtrlCap::ListSnapshots));
        match caps.require(Gate::Controller(CtrlCap::ListSnapshots)) {
            Err(Stop::Skip(why)) => assert!(why.contains("CONTROLLER_SERVICE"), "{why}"),
            other => panic!("expected a skip, got {other:?}"),
        }
    }

    #[test]
    fn group_capabilities_count_only_with_group_controller_service() {
        let mut caps = caps(&[PluginCap::ControllerService], &[], &[]);
        caps.group
            .insert(GroupCap::CreateDeleteGetVolumeGroupSnapshot);
        assert!(!caps.serves(Rpc::CreateVolumeGroupSnapshot));
        match caps.require(Gate::Group(GroupCap::CreateDeleteGetVolumeGroupSnapshot)) {
            Err(Stop::Skip(why)) => assert!(
                why.contains("plugin capability GROUP_CONTROLLER_SERVICE not advertised"),
                "{why}"
            ),
            other => panic!("expected a skip, got {other:?}"),
        }
        caps.plugin.insert(PluginCap::GroupControllerService);
        assert!(caps.serves(Rpc::CreateVolumeGroupSnapshot));
    }

    #[test]
    fn node_gates_need_the_node_service() {
        let mut caps = caps(&[], &[], &[NodeCap::GetVolumeStats]);
        assert!(caps.has_node(NodeCap::GetVolumeStats));
        caps.node_service = NodeService::Absent;
        assert!(!caps.has_node(NodeCap::GetVolumeStats));
        caps.node_service = NodeService::Broken("boom".into());
        assert!(matches!(
            caps.require(Gate::NodeService),
            Err(Stop::Fail(why)) if why.contains("boom")
        ));
    }

    #[test]
    fn coherence_rules_are_csi_structs_rules() {
        let caps = caps(
            &[PluginCap::ControllerService],
            &[CtrlCap::CloneVolume, CtrlCap::ListVolumeHealth],
            &[],
        );
        assert_eq!(
            caps.structs().rule_violations(),
            [
                csi_structs::CapabilityRule::ListVolumeHealthNeedsGetVolumeHealth,
                csi_structs::CapabilityRule::CloneVolumeNeedsCreateDeleteVolume,
            ]
        );
    }
}
