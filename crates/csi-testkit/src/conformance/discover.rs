//! Reading capabilities and the node id once, before any check runs.

use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupCap;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::plugin_capability::volume_expansion::Type as Expansion;
use tonic::Code;

use super::PluginIdentity;
use super::caps::NodeService;
use super::ctx::Ctx;

impl Ctx {
    /// Fills `plugin`, `caps` and `node_id`. Nothing here fails the run: problems are kept for the
    /// `CapabilitiesCoherent` and `NodeGetInfo` checks to report.
    pub(crate) async fn discover(&mut self) {
        let mut problems = Vec::new();
        if let Ok(info) = self.get_plugin_info(v1::GetPluginInfoRequest {}).await {
            self.plugin = Some(PluginIdentity {
                name: info.name,
                vendor_version: info.vendor_version,
            });
        }
        match self
            .get_plugin_capabilities(v1::GetPluginCapabilitiesRequest {})
            .await
        {
            Ok(response) => {
                for cap in response.capabilities {
                    use v1::plugin_capability::Type;
                    match cap.r#type {
                        Some(Type::Service(service)) => match PluginCap::try_from(service.r#type) {
                            Ok(PluginCap::Unknown) => problems.push(
                                "GetPluginCapabilities lists service type UNKNOWN (0)".into(),
                            ),
                            Ok(known) => {
                                self.caps.plugin.insert(known);
                            }
                            // A newer capability this schema does not know: ignore it.
                            Err(_) => {}
                        },
                        Some(Type::VolumeExpansion(expansion)) => {
                            match Expansion::try_from(expansion.r#type) {
                                Ok(Expansion::Unknown) => problems.push(
                                    "GetPluginCapabilities lists volume expansion UNKNOWN (0)"
                                        .into(),
                                ),
                                Ok(known) => {
                                    self.caps.expansion.insert(known);
                                }
                                Err(_) => {}
                            }
                        }
                        None => problems
                            .push("GetPluginCapabilities lists a capability with no type".into()),
                    }
                }
            }
            Err(err) => problems.push(err.to_string()),
        }

        if self.caps.plugin.contains(&PluginCap::ControllerService) {
            match self
                .controller_get_capabilities(v1::ControllerGetCapabilitiesRequest {})
                .await
            {
                Ok(response) => {
                    for cap in response.capabilities {
                        let Some(v1::controller_service_capability::Type::Rpc(rpc)) = cap.r#type
                        else {
                            problems.push(
                                "ControllerGetCapabilities lists a capability with no type".into(),
                            );
                            continue;
                        };
                        match CtrlCap::try_from(rpc.r#type) {
                            Ok(CtrlCap::Unknown) => {
                                problems.push("ControllerGetCapabilities lists UNKNOWN (0)".into())
                            }
                            Ok(known) => {
                                self.caps.controller.insert(known);
                            }
                            Err(_) => {}
                        }
                    }
                }
                Err(err) => problems.push(format!("CONTROLLER_SERVICE is advertised but {err}")),
            }
        }

        match self
            .node_get_capabilities(v1::NodeGetCapabilitiesRequest {})
            .await
        {
            Ok(response) => {
                self.caps.node_service = NodeService::Served;
                for cap in response.capabilities {
                    let Some(v1::node_service_capability::Type::Rpc(rpc)) = cap.r#type else {
                        problems.push("NodeGetCapabilities lists a capability with no type".into());
                        continue;
                    };
                    match NodeCap::try_from(rpc.r#type) {
                        Ok(NodeCap::Unknown) => {
                            problems.push("NodeGetCapabilities lists UNKNOWN (0)".into())
                        }
                        Ok(known) => {
                            self.caps.node.insert(known);
                        }
                        Err(_) => {}
                    }
                }
            }
            Err(err) if err.code() == Some(Code::Unimplemented) => {
                self.caps.node_service = NodeService::Absent
            }
            Err(err) => {
                problems.push(err.to_string());
                self.caps.node_service = NodeService::Broken(err.to_string());
            }
        }

        if self.caps.node_service == NodeService::Served
            && let Ok(info) = self.node_get_info(v1::NodeGetInfoRequest {}).await
            && !info.node_id.is_empty()
        {
            self.node_id = Some(info.node_id);
        }

        if self
            .caps
            .plugin
            .contains(&PluginCap::GroupControllerService)
        {
            match self
                .group_controller_get_capabilities(v1::GroupControllerGetCapabilitiesRequest {})
                .await
            {
                Ok(response) => {
                    for cap in response.capabilities {
                        let Some(v1::group_controller_service_capability::Type::Rpc(rpc)) =
                            cap.r#type
                        else {
                            problems.push(
                                "GroupControllerGetCapabilities lists a capability with no type"
                                    .into(),
                            );
                            continue;
                        };
                        if let Ok(known) = GroupCap::try_from(rpc.r#type)
                            && known != GroupCap::Unknown
                        {
                            self.caps.group.insert(known);
                        }
                    }
                }
                Err(err) => {
                    problems.push(format!("GROUP_CONTROLLER_SERVICE is advertised but {err}"))
                }
            }
        }
        self.caps.problems = problems;
    }
}
