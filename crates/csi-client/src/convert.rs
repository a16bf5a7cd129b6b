//! Wire answers to `csi-structs` values. The rules live in `csi-structs`; this module only
//! turns its conversion errors into this crate's [`ErrorKind`].

use csi_proto::v1 as pb;
use csi_structs::{
    ControllerCapabilities, GroupControllerCapabilities, NodeCapabilities, NodeInfo,
    PluginCapabilities, PluginInfo,
};

use crate::error::{ErrorKind, ResponseError};

fn invalid(err: csi_structs::wire::WireError) -> ErrorKind {
    ErrorKind::InvalidResponse(ResponseError::Fields(err.errors))
}

/// `GetPluginInfoResponse` → [`PluginInfo`].
pub(crate) fn plugin_info(resp: pb::GetPluginInfoResponse) -> Result<PluginInfo, ErrorKind> {
    PluginInfo::try_from(resp).map_err(invalid)
}

/// `NodeGetInfoResponse` → [`NodeInfo`] (0 max volumes = no limit).
pub(crate) fn node_info(resp: pb::NodeGetInfoResponse) -> Result<NodeInfo, ErrorKind> {
    NodeInfo::try_from(resp).map_err(invalid)
}

/// `GetPluginCapabilitiesResponse` → [`PluginCapabilities`]; unknown numbers are kept aside.
pub(crate) fn plugin_capabilities(resp: &pb::GetPluginCapabilitiesResponse) -> PluginCapabilities {
    use pb::plugin_capability::Type;
    let mut caps = PluginCapabilities::new();
    for cap in &resp.capabilities {
        match &cap.r#type {
            Some(Type::Service(s)) => caps.insert_service_wire(s.r#type),
            Some(Type::VolumeExpansion(e)) => caps.insert_expansion_wire(e.r#type),
            None => {}
        }
    }
    caps
}

/// `ControllerGetCapabilitiesResponse` → [`ControllerCapabilities`].
pub(crate) fn controller_capabilities(
    resp: &pb::ControllerGetCapabilitiesResponse,
) -> ControllerCapabilities {
    use pb::controller_service_capability::Type;
    let mut caps = ControllerCapabilities::new();
    for cap in &resp.capabilities {
        if let Some(Type::Rpc(rpc)) = &cap.r#type {
            caps.insert_wire(rpc.r#type);
        }
    }
    caps
}

/// `NodeGetCapabilitiesResponse` → [`NodeCapabilities`].
pub(crate) fn node_capabilities(resp: &pb::NodeGetCapabilitiesResponse) -> NodeCapabilities {
    use pb::node_service_capability::Type;
    let mut caps = NodeCapabilities::new();
    for cap in &resp.capabilities {
        if let Some(Type::Rpc(rpc)) = &cap.r#type {
            caps.insert_wire(rpc.r#type);
        }
    }
    caps
}

/// `GroupControllerGetCapabilitiesResponse` → [`GroupControllerCapabilities`].
pub(crate) fn group_controller_capabilities(
    resp: &pb::GroupControllerGetCapabilitiesResponse,
) -> GroupControllerCapabilities {
    use pb::group_controller_service_capability::Type;
    let mut caps = GroupControllerCapabilities::new();
    for cap in &resp.capabilities {
        if let Some(Type::Rpc(rpc)) = &cap.r#type {
            caps.insert_wire(rpc.r#type);
        }
    }
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_capability_numbers_are_ignored_not_rejected() {
        use pb::node_service_capability::{Rpc, Type};
        let resp = pb::NodeGetCapabilitiesResponse {
            capabilities: vec![
                pb::NodeServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: 1 })),
                },
                pb::NodeServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: 999 })),
                },
            ],
        };
        let caps = node_capabilities(&resp);
        assert!(caps.requires_staging());
        assert_eq!(caps.unknown().collect::<Vec<_>>(), [999]);
    }
}
