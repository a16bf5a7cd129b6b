//! `GetPluginInfoResponse` and `NodeGetInfoResponse` on the wire.

use std::num::NonZeroU64;

use csi_proto::v1;

use super::{by_ref_and_value, collect, finish};
use crate::ids::PluginNodeId;
use crate::info::{NodeInfo, PluginInfo, PluginName};
use crate::limits::{MAX_STRING_BYTES, check_required};
use crate::maps::Manifest;
use crate::validation::{FieldPath, Problem, ValidationErrors};

impl From<&PluginInfo> for v1::GetPluginInfoResponse {
    fn from(p: &PluginInfo) -> Self {
        v1::GetPluginInfoResponse {
            name: p.name.as_str().to_string(),
            vendor_version: p.vendor_version.clone(),
            manifest: p.manifest.to_wire(),
        }
    }
}

impl From<PluginInfo> for v1::GetPluginInfoResponse {
    fn from(p: PluginInfo) -> Self {
        (&p).into()
    }
}

impl TryFrom<&v1::GetPluginInfoResponse> for PluginInfo {
    type Error = super::WireError;
    fn try_from(w: &v1::GetPluginInfoResponse) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let name = collect(
            &mut errs,
            PluginName::new_at(w.name.clone(), &FieldPath::named("name")),
        );
        let vv = FieldPath::named("vendor_version");
        let before = errs.len();
        check_required(&mut errs, &vv, &w.vendor_version, MAX_STRING_BYTES);
        let version_ok = errs.len() == before;
        let manifest = collect(
            &mut errs,
            Manifest::from_wire_at(w.manifest.clone(), &FieldPath::named("manifest")),
        );
        let value = match (name, manifest, version_ok) {
            (Some(name), Some(manifest), true) => Some(PluginInfo {
                name,
                vendor_version: w.vendor_version.clone(),
                manifest,
            }),
            _ => None,
        };
        finish("GetPluginInfoResponse", errs, value)
    }
}
by_ref_and_value!(v1::GetPluginInfoResponse => PluginInfo);

impl From<&NodeInfo> for v1::NodeGetInfoResponse {
    fn from(n: &NodeInfo) -> Self {
        v1::NodeGetInfoResponse {
            node_id: n.node_id.as_str().to_string(),
            max_volumes_per_node: n
                .max_volumes
                .map_or(0, |m| i64::try_from(m.get()).unwrap_or(i64::MAX)),
            accessible_topology: n.topology.as_ref().map(Into::into),
        }
    }
}

impl From<NodeInfo> for v1::NodeGetInfoResponse {
    fn from(n: NodeInfo) -> Self {
        (&n).into()
    }
}

impl TryFrom<&v1::NodeGetInfoResponse> for NodeInfo {
    type Error = super::WireError;
    /// An `accessible_topology` with no segments is read as absent (no constraints).
    fn try_from(w: &v1::NodeGetInfoResponse) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let node_id = collect(
            &mut errs,
            PluginNodeId::new_at(w.node_id.clone(), &FieldPath::named("node_id")),
        );
        let max_volumes = match u64::try_from(w.max_volumes_per_node) {
            Ok(n) => Some(NonZeroU64::new(n)),
            Err(_) => {
                errs.push(
                    FieldPath::named("max_volumes_per_node"),
                    Problem::Negative {
                        value: w.max_volumes_per_node,
                    },
                );
                None
            }
        };
        let topology = match &w.accessible_topology {
            Some(t) if !t.segments.is_empty() => super::topology::topology_from_wire(
                &mut errs,
                &FieldPath::named("accessible_topology"),
                t,
            )
            .map(Some),
            _ => Some(None),
        };
        let value = match (node_id, max_volumes, topology) {
            (Some(node_id), Some(max_volumes), Some(topology)) => Some(NodeInfo {
                node_id,
                max_volumes,
                topology,
            }),
            _ => None,
        };
        finish("NodeGetInfoResponse", errs, value)
    }
}
by_ref_and_value!(v1::NodeGetInfoResponse => NodeInfo);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::{SizeUnit, Syntax};

    #[test]
    fn node_info_rules() {
        let ok = v1::NodeGetInfoResponse {
            node_id: "n".repeat(256),
            max_volumes_per_node: 0,
            accessible_topology: Some(v1::Topology::default()),
        };
        let info = NodeInfo::try_from(&ok).unwrap();
        assert_eq!(info.max_volumes, None);
        assert_eq!(info.topology, None);
        let long = v1::NodeGetInfoResponse {
            node_id: "n".repeat(257),
            ..Default::default()
        };
        let err = NodeInfo::try_from(long).unwrap_err();
        assert_eq!(
            err.errors.violations()[0].problem,
            Problem::TooLong {
                size: 257,
                limit: 256,
                unit: SizeUnit::Bytes
            }
        );
        let bad_topo = v1::NodeGetInfoResponse {
            node_id: "n".into(),
            max_volumes_per_node: 3,
            accessible_topology: Some(v1::Topology {
                segments: [("zone".to_string(), "-x".to_string())].into(),
            }),
        };
        let err = NodeInfo::try_from(bad_topo).unwrap_err();
        assert_eq!(
            err.errors.violations()[0].field.to_string(),
            "accessible_topology.segments[\"zone\"].value"
        );
    }

    #[test]
    fn plugin_info_rules() {
        let ok = v1::GetPluginInfoResponse {
            name: "csi.example.com".into(),
            vendor_version: "1.2.3".into(),
            manifest: [("commit".to_string(), "abc".to_string())].into(),
        };
        let info = PluginInfo::try_from(&ok).unwrap();
        assert_eq!(info.name.as_str(), "csi.example.com");
        assert_eq!(v1::GetPluginInfoResponse::from(&info), ok);
        let bad = v1::GetPluginInfoResponse {
            name: "csi_example".into(),
            vendor_version: String::new(),
            manifest: Default::default(),
        };
        let err = PluginInfo::try_from(bad).unwrap_err();
        let got: Vec<(String, Problem)> = err
            .errors
            .into_iter()
            .map(|v| (v.field.to_string(), v.problem))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "name".into(),
                    Problem::InvalidCharacter {
                        character: '_',
                        position: 3,
                        syntax: Syntax::PluginName
                    }
                ),
                ("vendor_version".into(), Problem::Missing),
            ]
        );
        let long = v1::GetPluginInfoResponse {
            name: "a".repeat(64),
            vendor_version: "1".into(),
            manifest: Default::default(),
        };
        assert_eq!(
            PluginInfo::try_from(long).unwrap_err().errors.violations()[0].problem,
            Problem::TooLong {
                size: 64,
                limit: 63,
                unit: SizeUnit::Chars
            }
        );
    }
}
