//! Required-field rejections: each request is complete except for one required field.

use csi_proto::Rpc;
use csi_proto::v1;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use tonic::Code;

use crate::conformance::calls::{Call, expect_code};
use crate::conformance::caps::gate_of;
use crate::conformance::ctx::{Ctx, Step, Stop, verdict};

pub(crate) async fn check(ctx: &mut Ctx, rpc: Rpc) -> Step {
    if let Some(gate) = gate_of(rpc) {
        ctx.require(gate)?;
    }
    let cases = cases(ctx, rpc).await?;
    let mut problems = Vec::new();
    for (field, call) in cases {
        let result = ctx.send(call).await;
        if let Err(problem) = expect_code(
            result,
            rpc,
            Code::InvalidArgument,
            &format!("without {field}"),
        ) {
            problems.push(problem);
        }
    }
    verdict(problems)
}

/// The requests to send, each named by the field it leaves out.
async fn cases(ctx: &mut Ctx, rpc: Rpc) -> Result<Vec<(&'static str, Call)>, Stop> {
    let secrets = ctx.secrets();
    let cap = ctx.capability();
    Ok(match rpc {
        Rpc::CreateVolume => {
            let full = ctx.create_request(ctx.unique_name("required"));
            vec![
                (
                    "name",
                    Call::CreateVolume(v1::CreateVolumeRequest {
                        name: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "volume_capabilities",
                    Call::CreateVolume(v1::CreateVolumeRequest {
                        volume_capabilities: vec![],
                        ..full
                    }),
                ),
            ]
        }
        Rpc::DeleteVolume => vec![(
            "volume_id",
            Call::DeleteVolume(v1::DeleteVolumeRequest {
                volume_id: String::new(),
                secrets,
            }),
        )],
        Rpc::ControllerPublishVolume => {
            let node_id = match ctx.node_id.clone() {
                Some(id) => id,
                None => ctx.absent_id("node"),
            };
            let full = v1::ControllerPublishVolumeRequest {
                volume_id: ctx.some_volume_id().await?,
                node_id,
                volume_capability: Some(cap),
                readonly: false,
                secrets,
                volume_context: Default::default(),
            };
            vec![
                (
                    "volume_id",
                    Call::ControllerPublishVolume(v1::ControllerPublishVolumeRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "node_id",
                    Call::ControllerPublishVolume(v1::ControllerPublishVolumeRequest {
                        node_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "volume_capability",
                    Call::ControllerPublishVolume(v1::ControllerPublishVolumeRequest {
                        volume_capability: None,
                        ..full
                    }),
                ),
            ]
        }
        Rpc::ControllerUnpublishVolume => vec![(
            "volume_id",
            Call::ControllerUnpublishVolume(v1::ControllerUnpublishVolumeRequest {
                volume_id: String::new(),
                node_id: ctx.node_id.clone().unwrap_or_default(),
                secrets,
            }),
        )],
        Rpc::ValidateVolumeCapabilities => {
            let full = v1::ValidateVolumeCapabilitiesRequest {
                volume_id: ctx.some_volume_id().await?,
                volume_capabilities: vec![cap],
                parameters: ctx.options.parameters.clone(),
                secrets,
                ..Default::default()
            };
            vec![
                (
                    "volume_id",
                    Call::ValidateVolumeCapabilities(v1::ValidateVolumeCapabilitiesRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "volume_capabilities",
                    Call::ValidateVolumeCapabilities(v1::ValidateVolumeCapabilitiesRequest {
                        volume_capabilities: vec![],
                        ..full
                    }),
                ),
            ]
        }
        Rpc::ControllerGetVolume => vec![(
            "volume_id",
            Call::ControllerGetVolume(v1::ControllerGetVolumeRequest {
                volume_id: String::new(),
            }),
        )],
        Rpc::ControllerExpandVolume => {
            let full = v1::ControllerExpandVolumeRequest {
                volume_id: ctx.some_volume_id().await?,
                capacity_range: ctx.capacity(ctx.options.volume_size.saturating_mul(2)),
                secrets,
                volume_capability: Some(cap),
            };
            vec![
                (
                    "volume_id",
                    Call::ControllerExpandVolume(v1::ControllerExpandVolumeRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "capacity_range",
                    Call::ControllerExpandVolume(v1::ControllerExpandVolumeRequest {
                        capacity_range: None,
                        ..full
                    }),
                ),
            ]
        }
        // Only `volume_id`: an empty `mutable_parameters` on an existing volume is a request
        // to change nothing, which csi-sanity expects to succeed and some plugins refuse; the
        // suite demands neither.
        Rpc::ControllerModifyVolume => vec![(
            "volume_id",
            Call::ControllerModifyVolume(v1::ControllerModifyVolumeRequest {
                volume_id: String::new(),
                secrets,
                mutable_parameters: ctx.options.mutable_parameters.clone(),
            }),
        )],
        Rpc::CreateSnapshot => {
            let full = v1::CreateSnapshotRequest {
                source_volume_id: ctx.some_volume_id().await?,
                name: ctx.unique_name("required"),
                secrets,
                ..Default::default()
            };
            vec![
                (
                    "name",
                    Call::CreateSnapshot(v1::CreateSnapshotRequest {
                        name: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "source_volume_id",
                    Call::CreateSnapshot(v1::CreateSnapshotRequest {
                        source_volume_id: String::new(),
                        ..full
                    }),
                ),
            ]
        }
        Rpc::DeleteSnapshot => vec![(
            "snapshot_id",
            Call::DeleteSnapshot(v1::DeleteSnapshotRequest {
                snapshot_id: String::new(),
                secrets,
            }),
        )],
        Rpc::GetSnapshot => vec![(
            "snapshot_id",
            Call::GetSnapshot(v1::GetSnapshotRequest {
                snapshot_id: String::new(),
                secrets,
            }),
        )],
        Rpc::CreateVolumeGroupSnapshot => {
            let full = v1::CreateVolumeGroupSnapshotRequest {
                name: ctx.unique_name("required"),
                source_volume_ids: vec![ctx.some_volume_id().await?],
                secrets,
                parameters: Default::default(),
            };
            vec![
                (
                    "name",
                    Call::CreateVolumeGroupSnapshot(v1::CreateVolumeGroupSnapshotRequest {
                        name: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "source_volume_ids",
                    Call::CreateVolumeGroupSnapshot(v1::CreateVolumeGroupSnapshotRequest {
                        source_volume_ids: vec![],
                        ..full
                    }),
                ),
            ]
        }
        Rpc::GetVolumeGroupSnapshot => vec![(
            "group_snapshot_id",
            Call::GetVolumeGroupSnapshot(v1::GetVolumeGroupSnapshotRequest {
                group_snapshot_id: String::new(),
                snapshot_ids: vec![ctx.absent_id("snapshot")],
                secrets,
            }),
        )],
        Rpc::DeleteVolumeGroupSnapshot => vec![(
            "group_snapshot_id",
            Call::DeleteVolumeGroupSnapshot(v1::DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: String::new(),
                snapshot_ids: vec![ctx.absent_id("snapshot")],
                secrets,
            }),
        )],
        Rpc::NodeStageVolume => {
            let staging = path_string(ctx.new_dir("staging")?);
            let full = v1::NodeStageVolumeRequest {
                volume_id: ctx.some_volume_id().await?,
                staging_target_path: staging,
                volume_capability: Some(cap),
                secrets,
                ..Default::default()
            };
            vec![
                (
                    "volume_id",
                    Call::NodeStageVolume(v1::NodeStageVolumeRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "staging_target_path",
                    Call::NodeStageVolume(v1::NodeStageVolumeRequest {
                        staging_target_path: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "volume_capability",
                    Call::NodeStageVolume(v1::NodeStageVolumeRequest {
                        volume_capability: None,
                        ..full
                    }),
                ),
            ]
        }
        Rpc::NodeUnstageVolume => {
            let full = v1::NodeUnstageVolumeRequest {
                volume_id: ctx.some_volume_id().await?,
                staging_target_path: path_string(ctx.new_dir("staging")?),
            };
            vec![
                (
                    "volume_id",
                    Call::NodeUnstageVolume(v1::NodeUnstageVolumeRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "staging_target_path",
                    Call::NodeUnstageVolume(v1::NodeUnstageVolumeRequest {
                        staging_target_path: String::new(),
                        ..full
                    }),
                ),
            ]
        }
        Rpc::NodePublishVolume => {
            let staging_target_path = if ctx.caps.has_node(NodeCap::StageUnstageVolume) {
                path_string(ctx.new_dir("staging")?)
            } else {
                String::new()
            };
            let full = v1::NodePublishVolumeRequest {
                volume_id: ctx.some_volume_id().await?,
                staging_target_path,
                target_path: path_string(ctx.new_dir("target-parent")?.join("target")),
                volume_capability: Some(cap),
                readonly: false,
                secrets,
                ..Default::default()
            };
            vec![
                (
                    "volume_id",
                    Call::NodePublishVolume(v1::NodePublishVolumeRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "target_path",
                    Call::NodePublishVolume(v1::NodePublishVolumeRequest {
                        target_path: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "volume_capability",
                    Call::NodePublishVolume(v1::NodePublishVolumeRequest {
                        volume_capability: None,
                        ..full
                    }),
                ),
            ]
        }
        Rpc::NodeUnpublishVolume => {
            let full = v1::NodeUnpublishVolumeRequest {
                volume_id: ctx.some_volume_id().await?,
                target_path: path_string(ctx.new_dir("target-parent")?.join("target")),
            };
            vec![
                (
                    "volume_id",
                    Call::NodeUnpublishVolume(v1::NodeUnpublishVolumeRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "target_path",
                    Call::NodeUnpublishVolume(v1::NodeUnpublishVolumeRequest {
                        target_path: String::new(),
                        ..full
                    }),
                ),
            ]
        }
        Rpc::NodeGetVolumeStats => {
            let full = v1::NodeGetVolumeStatsRequest {
                volume_id: ctx.some_volume_id().await?,
                volume_path: path_string(ctx.new_dir("volume-path")?),
                staging_target_path: String::new(),
            };
            vec![
                (
                    "volume_id",
                    Call::NodeGetVolumeStats(v1::NodeGetVolumeStatsRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "volume_path",
                    Call::NodeGetVolumeStats(v1::NodeGetVolumeStatsRequest {
                        volume_path: String::new(),
                        ..full
                    }),
                ),
            ]
        }
        Rpc::NodeExpandVolume => {
            let full = v1::NodeExpandVolumeRequest {
                volume_id: ctx.some_volume_id().await?,
                volume_path: path_string(ctx.new_dir("volume-path")?),
                capacity_range: ctx.capacity(ctx.options.volume_size.saturating_mul(2)),
                volume_capability: Some(cap),
                secrets,
                ..Default::default()
            };
            vec![
                (
                    "volume_id",
                    Call::NodeExpandVolume(v1::NodeExpandVolumeRequest {
                        volume_id: String::new(),
                        ..full.clone()
                    }),
                ),
                (
                    "volume_path",
                    Call::NodeExpandVolume(v1::NodeExpandVolumeRequest {
                        volume_path: String::new(),
                        ..full
                    }),
                ),
            ]
        }
        other => {
            return Err(Stop::skip(format!(
                "no required-field cases for {}",
                other.name()
            )));
        }
    })
}

/// A path as the string the wire wants. Scratch paths are built by the suite from the
/// user's directory; a non-UTF-8 one is reported lossily rather than refused.
pub(crate) fn path_string(path: std::path::PathBuf) -> String {
    path.to_string_lossy().into_owned()
}
