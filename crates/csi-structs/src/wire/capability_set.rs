//! Capability lists on the wire. Infallible: unknown numbers are kept aside (spec §3.15), and
//! entries whose oneof is unset carry nothing and are skipped.

use csi_proto::v1;
use csi_proto::v1::{
    controller_service_capability as csc, group_controller_service_capability as gsc,
    node_service_capability as nsc, plugin_capability as pc,
};

use crate::capability_set::{
    ControllerCapabilities, GroupControllerCapabilities, NodeCapabilities, PluginCapabilities,
};

impl From<&v1::GetPluginCapabilitiesResponse> for PluginCapabilities {
    fn from(w: &v1::GetPluginCapabilitiesResponse) -> Self {
        let mut caps = PluginCapabilities::new();
        for c in &w.capabilities {
            match c.r#type {
                Some(pc::Type::Service(s)) => caps.insert_service_wire(s.r#type),
                Some(pc::Type::VolumeExpansion(e)) => caps.insert_expansion_wire(e.r#type),
                None => {}
            }
        }
        caps
    }
}

impl From<v1::GetPluginCapabilitiesResponse> for PluginCapabilities {
    fn from(w: v1::GetPluginCapabilitiesResponse) -> Self {
        (&w).into()
    }
}

impl From<&PluginCapabilities> for v1::GetPluginCapabilitiesResponse {
    fn from(caps: &PluginCapabilities) -> Self {
        let services = caps
            .services()
            .map(|s| s.to_wire())
            .chain(caps.unknown_services())
            .map(|n| v1::PluginCapability {
                r#type: Some(pc::Type::Service(pc::Service { r#type: n })),
            });
        let expansion = caps
            .expansion()
            .map(|e| e.to_wire())
            .chain(caps.unknown_expansion())
            .map(|n| v1::PluginCapability {
                r#type: Some(pc::Type::VolumeExpansion(pc::VolumeExpansion { r#type: n })),
            });
        v1::GetPluginCapabilitiesResponse {
            capabilities: services.chain(expansion).collect(),
        }
    }
}

macro_rules! rpc_caps {
    ($set:ty, $resp:ident, $cap:ident, $module:ident) => {
        impl From<&v1::$resp> for $set {
            fn from(w: &v1::$resp) -> Self {
                let mut caps = <$set>::new();
                for c in &w.capabilities {
                    if let Some($module::Type::Rpc(rpc)) = c.r#type {
                        caps.insert_wire(rpc.r#type);
                    }
                }
                caps
            }
        }

        impl From<v1::$resp> for $set {
            fn from(w: v1::$resp) -> Self {
                (&w).into()
            }
        }

        impl From<&$set> for v1::$resp {
            fn from(caps: &$set) -> Self {
                v1::$resp {
                    capabilities: caps
                        .iter()
                        .map(|c| c.to_wire())
                        .chain(caps.unknown())
                        .map(|n| v1::$cap {
                            r#type: Some($module::Type::Rpc($module::Rpc { r#type: n })),
                        })
                        .collect(),
                }
            }
        }
    };
}

rpc_caps!(
    ControllerCapabilities,
    ControllerGetCapabilitiesResponse,
    ControllerServiceCapability,
    csc
);
rpc_caps!(
    NodeCapabilities,
    NodeGetCapabilitiesResponse,
    NodeServiceCapability,
    nsc
);
rpc_caps!(
    GroupControllerCapabilities,
    GroupControllerGetCapabilitiesResponse,
    GroupControllerServiceCapability,
    gsc
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability_set::{ControllerCapability, PluginService, VolumeExpansion};

    #[test]
    fn unknown_numbers_are_ignored_not_rejected() {
        let w = v1::ControllerGetCapabilitiesResponse {
            capabilities: vec![
                v1::ControllerServiceCapability {
                    r#type: Some(csc::Type::Rpc(csc::Rpc { r#type: 2 })),
                },
                v1::ControllerServiceCapability {
                    r#type: Some(csc::Type::Rpc(csc::Rpc { r#type: 999 })),
                },
                v1::ControllerServiceCapability { r#type: None },
            ],
        };
        let caps = ControllerCapabilities::from(&w);
        assert!(caps.requires_controller_publish());
        assert_eq!(caps.len(), 1);
        assert_eq!(caps.unknown().collect::<Vec<_>>(), vec![999]);
        let back = v1::ControllerGetCapabilitiesResponse::from(&caps);
        assert_eq!(ControllerCapabilities::from(back), caps);
        assert!(caps.contains(ControllerCapability::PublishUnpublishVolume));
    }

    #[test]
    fn plugin_capabilities_round_trip() {
        let w = v1::GetPluginCapabilitiesResponse {
            capabilities: vec![
                v1::PluginCapability {
                    r#type: Some(pc::Type::Service(pc::Service { r#type: 1 })),
                },
                v1::PluginCapability {
                    r#type: Some(pc::Type::VolumeExpansion(pc::VolumeExpansion { r#type: 1 })),
                },
                v1::PluginCapability {
                    r#type: Some(pc::Type::Service(pc::Service { r#type: 77 })),
                },
            ],
        };
        let caps = PluginCapabilities::from(&w);
        assert!(caps.has_controller_service());
        assert!(caps.has_expansion(VolumeExpansion::Online));
        assert!(!caps.has_service(PluginService::GroupControllerService));
        assert_eq!(caps.unknown_services().collect::<Vec<_>>(), vec![77]);
        assert_eq!(
            PluginCapabilities::from(v1::GetPluginCapabilitiesResponse::from(&caps)),
            caps
        );
    }
}
