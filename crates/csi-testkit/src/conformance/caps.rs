//! What the plugin advertises, read once before the checks run, and the gates derived from it.

use std::collections::BTreeSet;

use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupCap;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::plugin_capability::volume_expansion::Type as Expansion;

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
    /// The plugin serves the Node service with this capability.
    Node(NodeCap),
    /// The plugin advertises GROUP_CONTROLLER_SERVICE and this group capability.
    Group(GroupCap),
}

impl Caps {
    pub(crate) fn has_controller(&self, cap: CtrlCap) -> bool {
        self.plugin.contains(&PluginCap::ControllerService) && self.controller.contains(&cap)
    }

    pub(crate) fn has_node(&self, cap: NodeCap) -> bool {
        self.node_service == NodeService::Served && self.node.contains(&cap)
    }

    /// Ok when `gate` holds, else a skip naming what is absent.
    pub(crate) fn require(&self, gate: Gate) -> Result<(), Stop> {
        let controller = self.plugin.contains(&PluginCap::ControllerService);
        match gate {
            Gate::ControllerService if controller => Ok(()),
            Gate::ControllerService => Err(Stop::skip(
                "plugin capability CONTROLLER_SERVICE not advertised",
            )),
            Gate::Controller(cap) if !controller => Err(Stop::skip(format!(
                "plugin capability CONTROLLER_SERVICE not advertised (needed for {})",
                cap.as_str_name()
            ))),
            Gate::Controller(cap) if self.controller.contains(&cap) => Ok(()),
            Gate::Controller(cap) => Err(Stop::skip(format!(
                "controller capability {} not advertised",
                cap.as_str_name()
            ))),
            Gate::NodeService | Gate::Node(_) => match &self.node_service {
                NodeService::Absent => Err(Stop::skip(
                    "Node service not served (NodeGetCapabilities is UNIMPLEMENTED)",
                )),
                NodeService::Broken(why) => {
                    Err(Stop::fail(format!("NodeGetCapabilities failed: {why}")))
                }
                NodeService::Served => match gate {
                    Gate::Node(cap) if !self.node.contains(&cap) => Err(Stop::skip(format!(
                        "node capability {} not advertised",
                        cap.as_str_name()
                    ))),
                    _ => Ok(()),
                },
            },
            Gate::Group(cap) if !self.plugin.contains(&PluginCap::GroupControllerService) => {
                Err(Stop::skip(format!(
                    "plugin capability GROUP_CONTROLLER_SERVICE not advertised (needed for {})",
                    cap.as_str_name()
                )))
            }
            Gate::Group(cap) if self.group.contains(&cap) => Ok(()),
            Gate::Group(cap) => Err(Stop::skip(format!(
                "group controller capability {} not advertised",
                cap.as_str_name()
            ))),
        }
    }
}

/// The condition under which the spec obliges a plugin to serve `rpc`; `None` for the
/// Identity RPCs (always) and those the suite does not gate (SnapshotMetadata,
/// GroupControllerGetCapabilities).
pub(crate) fn gate_of(rpc: csi_proto::Rpc) -> Option<Gate> {
    use csi_proto::Rpc;
    Some(match rpc {
        Rpc::CreateVolume | Rpc::DeleteVolume => Gate::Controller(CtrlCap::CreateDeleteVolume),
        Rpc::ControllerPublishVolume | Rpc::ControllerUnpublishVolume => {
            Gate::Controller(CtrlCap::PublishUnpublishVolume)
        }
        Rpc::ValidateVolumeCapabilities | Rpc::ControllerGetCapabilities => Gate::ControllerService,
        Rpc::ListVolumes => Gate::Controller(CtrlCap::ListVolumes),
        Rpc::GetCapacity => Gate::Controller(CtrlCap::GetCapacity),
        Rpc::CreateSnapshot | Rpc::DeleteSnapshot => {
            Gate::Controller(CtrlCap::CreateDeleteSnapshot)
        }
        Rpc::ListSnapshots => Gate::Controller(CtrlCap::ListSnapshots),
        Rpc::GetSnapshot => Gate::Controller(CtrlCap::GetSnapshot),
        Rpc::ControllerExpandVolume => Gate::Controller(CtrlCap::ExpandVolume),
        Rpc::ControllerGetVolume => Gate::Controller(CtrlCap::GetVolume),
        Rpc::ControllerModifyVolume => Gate::Controller(CtrlCap::ModifyVolume),
        Rpc::ControllerGetVolumeHealth => Gate::Controller(CtrlCap::GetVolumeHealth),
        Rpc::ControllerListVolumeHealth => Gate::Controller(CtrlCap::ListVolumeHealth),
        Rpc::CreateVolumeGroupSnapshot
        | Rpc::DeleteVolumeGroupSnapshot
        | Rpc::GetVolumeGroupSnapshot => Gate::Group(GroupCap::CreateDeleteGetVolumeGroupSnapshot),
        Rpc::NodeStageVolume | Rpc::NodeUnstageVolume => Gate::Node(NodeCap::StageUnstageVolume),
        Rpc::NodePublishVolume
        | Rpc::NodeUnpublishVolume
        | Rpc::NodeGetCapabilities
        | Rpc::NodeGetInfo => Gate::NodeService,
        Rpc::NodeGetVolumeStats => Gate::Node(NodeCap::GetVolumeStats),
        Rpc::NodeExpandVolume => Gate::Node(NodeCap::ExpandVolume),
        Rpc::NodeGetVolumeHealth => Gate::Node(NodeCap::GetVolumeHealth),
        Rpc::NodeGetStorageHealth => Gate::Node(NodeCap::GetStorageHealth),
        Rpc::GetPluginInfo
        | Rpc::GetPluginCapabilities
        | Rpc::Probe
        | Rpc::GroupControllerGetCapabilities
        | Rpc::GetMetadataAllocated
        | Rpc::GetMetadataDelta => return None,
    })
}
