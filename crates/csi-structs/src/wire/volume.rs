//! `Volume`, `VolumeContentSource` and `CreateVolumeResponse` on the wire.

use csi_proto::v1;
use csi_proto::v1::volume_content_source as vcs;

use super::{by_ref_and_value, collect, finish, optional_size, size_to_wire};
use crate::ids::{ExternalVolumeId, PluginNodeId, SnapshotId};
use crate::maps::{PublishContext, VolumeContext};
use crate::validation::{FieldPath, Problem, ValidationErrors};
use crate::volume::{
    ContentSource, Usage, Volume, VolumeCondition, VolumeStats, VolumeStatus, VolumeWithStatus,
};

impl From<&ContentSource> for v1::VolumeContentSource {
    fn from(s: &ContentSource) -> Self {
        let t = match s {
            ContentSource::Snapshot(id) => vcs::Type::Snapshot(vcs::SnapshotSource {
                snapshot_id: id.as_str().to_string(),
            }),
            ContentSource::Volume(id) => vcs::Type::Volume(vcs::VolumeSource {
                volume_id: id.as_str().to_string(),
            }),
        };
        v1::VolumeContentSource { r#type: Some(t) }
    }
}

pub(crate) fn content_source_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::VolumeContentSource,
) -> Option<ContentSource> {
    match &w.r#type {
        None => {
            errs.push(at.clone().field("type"), Problem::Missing);
            None
        }
        Some(vcs::Type::Snapshot(s)) => collect(
            errs,
            SnapshotId::new_at(
                s.snapshot_id.clone(),
                &at.clone().field("snapshot").field("snapshot_id"),
            ),
        )
        .map(ContentSource::Snapshot),
        Some(vcs::Type::Volume(v)) => collect(
            errs,
            ExternalVolumeId::new_at(
                v.volume_id.clone(),
                &at.clone().field("volume").field("volume_id"),
            ),
        )
        .map(ContentSource::Volume),
    }
}

impl TryFrom<&v1::VolumeContentSource> for ContentSource {
    type Error = super::WireError;
    fn try_from(w: &v1::VolumeContentSource) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = content_source_from_wire(&mut errs, &FieldPath::root(), w);
        finish("VolumeContentSource", errs, value)
    }
}
by_ref_and_value!(v1::VolumeContentSource => ContentSource);

impl From<&Volume> for v1::Volume {
    fn from(v: &Volume) -> Self {
        v1::Volume {
            capacity_bytes: size_to_wire(v.capacity_bytes),
            volume_id: v.volume_id.as_str().to_string(),
            volume_context: v.volume_context.to_wire(),
            content_source: v.content_source.as_ref().map(Into::into),
            accessible_topology: v.accessible_topology.iter().map(Into::into).collect(),
        }
    }
}

impl From<Volume> for v1::Volume {
    fn from(v: Volume) -> Self {
        (&v).into()
    }
}

pub(crate) fn volume_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::Volume,
) -> Option<Volume> {
    let volume_id = collect(
        errs,
        ExternalVolumeId::new_at(w.volume_id.clone(), &at.clone().field("volume_id")),
    );
    let capacity_bytes = optional_size(errs, at.clone().field("capacity_bytes"), w.capacity_bytes);
    let volume_context = collect(
        errs,
        VolumeContext::from_wire_at(
            w.volume_context.clone(),
            &at.clone().field("volume_context"),
        ),
    );
    let content_source = match &w.content_source {
        None => Some(None),
        Some(s) => content_source_from_wire(errs, &at.clone().field("content_source"), s).map(Some),
    };
    let accessible_topology = super::topology::topologies_from_wire(
        errs,
        &at.clone().field("accessible_topology"),
        &w.accessible_topology,
    );
    Some(Volume {
        volume_id: volume_id?,
        capacity_bytes: capacity_bytes?,
        volume_context: volume_context?,
        content_source: content_source?,
        accessible_topology: accessible_topology?,
    })
}

impl TryFrom<&v1::Volume> for Volume {
    type Error = super::WireError;
    fn try_from(w: &v1::Volume) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = volume_from_wire(&mut errs, &FieldPath::root(), w);
        finish("Volume", errs, value)
    }
}
by_ref_and_value!(v1::Volume => Volume);

impl TryFrom<&v1::CreateVolumeResponse> for Volume {
    type Error = super::WireError;
    fn try_from(w: &v1::CreateVolumeResponse) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let at = FieldPath::named("volume");
        let value = match &w.volume {
            None => {
                errs.push(at, Problem::Missing);
                None
            }
            Some(v) => volume_from_wire(&mut errs, &at, v),
        };
        finish("CreateVolumeResponse", errs, value)
    }
}
by_ref_and_value!(v1::CreateVolumeResponse => Volume);

impl From<&Volume> for v1::CreateVolumeResponse {
    fn from(v: &Volume) -> Self {
        v1::CreateVolumeResponse {
            volume: Some(v.into()),
        }
    }
}

impl TryFrom<&v1::ControllerPublishVolumeResponse> for PublishContext {
    type Error = super::WireError;
    fn try_from(w: &v1::ControllerPublishVolumeResponse) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let value = collect(
            &mut errs,
            PublishContext::from_wire_at(
                w.publish_context.clone(),
                &FieldPath::named("publish_context"),
            ),
        );
        finish("ControllerPublishVolumeResponse", errs, value)
    }
}
by_ref_and_value!(v1::ControllerPublishVolumeResponse => PublishContext);

impl From<&PublishContext> for v1::ControllerPublishVolumeResponse {
    fn from(c: &PublishContext) -> Self {
        v1::ControllerPublishVolumeResponse {
            publish_context: c.to_wire(),
        }
    }
}

impl From<&VolumeCondition> for v1::VolumeCondition {
    fn from(c: &VolumeCondition) -> Self {
        v1::VolumeCondition {
            abnormal: c.abnormal,
            message: c.message.clone(),
        }
    }
}

impl TryFrom<&v1::NodeGetVolumeStatsResponse> for VolumeStats {
    type Error = super::WireError;
    /// Negative numbers are refused naming the entry; an entry of unit `UNKNOWN` is left out,
    /// and of two entries of one unit the first counts.
    fn try_from(w: &v1::NodeGetVolumeStatsResponse) -> Result<Self, Self::Error> {
        use v1::volume_usage::Unit;
        let mut errs = ValidationErrors::new();
        let mut stats = VolumeStats {
            condition: w.volume_condition.as_ref().map(VolumeCondition::from),
            ..VolumeStats::default()
        };
        for (i, u) in w.usage.iter().enumerate() {
            let at = FieldPath::named("usage").index(i);
            let mut number = |field: &'static str, value: i64| {
                u64::try_from(value).unwrap_or_else(|_| {
                    errs.push(at.clone().field(field), Problem::Negative { value });
                    0
                })
            };
            let usage = Usage {
                available: number("available", u.available),
                total: number("total", u.total),
                used: number("used", u.used),
            };
            match Unit::try_from(u.unit) {
                Ok(Unit::Bytes) => {
                    stats.bytes.get_or_insert(usage);
                }
                Ok(Unit::Inodes) => {
                    stats.inodes.get_or_insert(usage);
                }
                _ => {}
            }
        }
        finish("NodeGetVolumeStatsResponse", errs, Some(stats))
    }
}
by_ref_and_value!(v1::NodeGetVolumeStatsResponse => VolumeStats);

impl From<&v1::VolumeCondition> for VolumeCondition {
    fn from(w: &v1::VolumeCondition) -> Self {
        VolumeCondition {
            abnormal: w.abnormal,
            message: w.message.clone(),
        }
    }
}

pub(crate) fn status_from_wire(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    w: &v1::controller_get_volume_response::VolumeStatus,
) -> Option<VolumeStatus> {
    let nodes: Vec<Option<PluginNodeId>> = w
        .published_node_ids
        .iter()
        .enumerate()
        .map(|(i, n)| {
            collect(
                errs,
                PluginNodeId::new_at(n.clone(), &at.clone().field("published_node_ids").index(i)),
            )
        })
        .collect();
    Some(VolumeStatus {
        published_nodes: nodes.into_iter().collect::<Option<_>>()?,
        condition: w.volume_condition.as_ref().map(Into::into),
    })
}

impl From<&VolumeStatus> for v1::controller_get_volume_response::VolumeStatus {
    fn from(s: &VolumeStatus) -> Self {
        v1::controller_get_volume_response::VolumeStatus {
            published_node_ids: s
                .published_nodes
                .iter()
                .map(|n| n.as_str().to_string())
                .collect(),
            volume_condition: s.condition.as_ref().map(Into::into),
        }
    }
}

impl TryFrom<&v1::ControllerGetVolumeResponse> for VolumeWithStatus {
    type Error = super::WireError;
    fn try_from(w: &v1::ControllerGetVolumeResponse) -> Result<Self, Self::Error> {
        let mut errs = ValidationErrors::new();
        let at = FieldPath::named("volume");
        let volume = match &w.volume {
            None => {
                errs.push(at, Problem::Missing);
                None
            }
            Some(v) => volume_from_wire(&mut errs, &at, v),
        };
        // Required by the spec (and a message, so its absence is visible on the wire).
        let at = FieldPath::named("status");
        let status = match &w.status {
            None => {
                errs.push(at, Problem::Missing);
                None
            }
            Some(s) => status_from_wire(&mut errs, &at, s),
        };
        let value = match (volume, status) {
            (Some(volume), Some(status)) => Some(VolumeWithStatus { volume, status }),
            _ => None,
        };
        finish("ControllerGetVolumeResponse", errs, value)
    }
}
by_ref_and_value!(v1::ControllerGetVolumeResponse => VolumeWithStatus);

impl From<&VolumeWithStatus> for v1::ControllerGetVolumeResponse {
    fn from(v: &VolumeWithStatus) -> Self {
        v1::ControllerGetVolumeResponse {
            volume: Some((&v.volume).into()),
            status: Some((&v.status).into()),
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn volume_stats_keep_bytes_inodes_and_the_condition_and_refuse_negatives() {
        use v1::volume_usage::Unit;
        let usage = |unit: Unit, used: i64| v1::VolumeUsage {
            available: 10,
            total: 10 + used,
            used,
            unit: unit as i32,
        };
        let w = v1::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(Unit::Unknown, 99),
                usage(Unit::Bytes, 5),
                usage(Unit::Bytes, 7),
                usage(Unit::Inodes, 1),
            ],
            volume_condition: Some(v1::VolumeCondition {
                abnormal: true,
                message: "read-only file system".into(),
            }),
        };
        let stats = VolumeStats::try_from(&w).expect("valid");
        assert_eq!(
            stats.bytes,
            Some(Usage {
                available: 10,
                total: 15,
                used: 5
            }),
            "the first of a unit counts"
        );
        assert_eq!(stats.inodes.map(|u| u.used), Some(1));
        assert!(stats.condition.is_some_and(|c| c.abnormal));
        let bad = v1::NodeGetVolumeStatsResponse {
            usage: vec![usage(Unit::Bytes, -1)],
            volume_condition: None,
        };
        let err = VolumeStats::try_from(&bad).expect_err("negative");
        assert!(err.to_string().contains("usage[0].used"), "{err}");
    }

    use super::*;

    #[test]
    fn create_volume_response_rules() {
        let err = Volume::try_from(v1::CreateVolumeResponse { volume: None }).unwrap_err();
        assert_eq!(err.message, "CreateVolumeResponse");
        assert_eq!(err.errors.violations()[0].field.to_string(), "volume");

        let w = v1::CreateVolumeResponse {
            volume: Some(v1::Volume {
                capacity_bytes: -5,
                volume_id: String::new(),
                content_source: Some(v1::VolumeContentSource { r#type: None }),
                ..Default::default()
            }),
        };
        let err = Volume::try_from(&w).unwrap_err();
        let got: Vec<(String, Problem)> = err
            .errors
            .into_iter()
            .map(|v| (v.field.to_string(), v.problem))
            .collect();
        assert_eq!(
            got,
            vec![
                ("volume.volume_id".into(), Problem::Missing),
                (
                    "volume.capacity_bytes".into(),
                    Problem::Negative { value: -5 }
                ),
                ("volume.content_source.type".into(), Problem::Missing),
            ]
        );
    }

    #[test]
    fn publish_context_rules() {
        let ok = v1::ControllerPublishVolumeResponse {
            publish_context: [("device".to_string(), "/dev/xvdb".to_string())].into(),
        };
        let ctx = PublishContext::try_from(&ok).unwrap();
        assert_eq!(ctx.get("device"), Some("/dev/xvdb"));
        assert_eq!(v1::ControllerPublishVolumeResponse::from(&ctx), ok);
        let big = v1::ControllerPublishVolumeResponse {
            publish_context: [("k".to_string(), "v".repeat(5000))].into(),
        };
        let err = PublishContext::try_from(big).unwrap_err();
        assert_eq!(err.message, "ControllerPublishVolumeResponse");
        assert_eq!(
            err.errors.violations()[0].field.to_string(),
            "publish_context"
        );
    }

    #[test]
    fn volume_round_trip() {
        let w = v1::Volume {
            capacity_bytes: 0,
            volume_id: "vol-1".into(),
            volume_context: [("k".to_string(), "v".to_string())].into(),
            content_source: Some(v1::VolumeContentSource {
                r#type: Some(vcs::Type::Snapshot(vcs::SnapshotSource {
                    snapshot_id: "snap-1".into(),
                })),
            }),
            accessible_topology: vec![],
        };
        let v = Volume::try_from(&w).unwrap();
        assert_eq!(v.capacity_bytes, None);
        assert_eq!(v1::Volume::from(&v), w);
    }

    #[test]
    fn get_volume_response_rules() {
        let err =
            VolumeWithStatus::try_from(v1::ControllerGetVolumeResponse::default()).unwrap_err();
        assert_eq!(err.message, "ControllerGetVolumeResponse");
        let fields: Vec<String> = err
            .errors
            .violations()
            .iter()
            .map(|v| v.field.to_string())
            .collect();
        assert_eq!(fields, ["volume", "status"]);

        let w = v1::ControllerGetVolumeResponse {
            volume: Some(v1::Volume {
                volume_id: "vol-1".into(),
                capacity_bytes: -1,
                ..Default::default()
            }),
            status: Some(v1::controller_get_volume_response::VolumeStatus {
                published_node_ids: vec!["node-a".into(), String::new(), "n".repeat(257)],
                volume_condition: None,
            }),
        };
        let err = VolumeWithStatus::try_from(&w).unwrap_err();
        let got: Vec<(String, Problem)> = err
            .errors
            .into_iter()
            .map(|v| (v.field.to_string(), v.problem))
            .collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            got[0],
            (
                "volume.capacity_bytes".to_owned(),
                Problem::Negative { value: -1 }
            )
        );
        assert_eq!(
            got[1],
            ("status.published_node_ids[1]".to_owned(), Problem::Missing)
        );
        assert_eq!(got[2].0, "status.published_node_ids[2]");
    }

    #[test]
    fn get_volume_round_trip() {
        let w = v1::ControllerGetVolumeResponse {
            volume: Some(v1::Volume {
                volume_id: "vol-1".into(),
                capacity_bytes: 1 << 30,
                ..Default::default()
            }),
            status: Some(v1::controller_get_volume_response::VolumeStatus {
                published_node_ids: vec!["node-a".into(), "node-b".into()],
                volume_condition: Some(v1::VolumeCondition {
                    abnormal: true,
                    message: "degraded".into(),
                }),
            }),
        };
        let v = VolumeWithStatus::try_from(&w).unwrap();
        assert_eq!(v.volume.capacity_bytes, Some(1 << 30));
        let nodes: Vec<&str> = v
            .status
            .published_nodes
            .iter()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(nodes, ["node-a", "node-b"]);
        assert_eq!(
            v.status.condition,
            Some(VolumeCondition {
                abnormal: true,
                message: "degraded".into()
            })
        );
        assert_eq!(v1::ControllerGetVolumeResponse::from(&v), w);
    }
}
