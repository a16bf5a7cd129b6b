//! NOT_FOUND for unknown volumes, snapshots and nodes.

use csi_proto::Rpc;
use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use tonic::Code;

use super::required::path_string;
use crate::conformance::calls::{Call, expect_code};
use crate::conformance::caps::{Gate, gate_of};
use crate::conformance::ctx::{Ctx, Step, Stop, verdict};

pub(crate) async fn check(ctx: &mut Ctx, rpc: Rpc) -> Step {
    if let Some(gate) = gate_of(rpc) {
        ctx.require(gate)?;
    }
    let cases = cases(ctx, rpc).await?;
    let mut problems = Vec::new();
    for (case, call) in cases {
        let result = ctx.send(call).await;
        if let Err(problem) = expect_code(result, rpc, Code::NotFound, &case) {
            problems.push(problem);
        }
    }
    verdict(problems)
}

async fn cases(ctx: &mut Ctx, rpc: Rpc) -> Result<Vec<(String, Call)>, Stop> {
    let secrets = ctx.secrets();
    let cap = ctx.capability();
    let absent_volume = ctx.absent_id("volume");
    Ok(match rpc {
        Rpc::CreateVolume => {
            let mut cases = Vec::new();
            if ctx.caps.has_controller(CtrlCap::CreateDeleteSnapshot) {
                let mut request = ctx.create_request(ctx.unique_name("from-snapshot"));
                let snapshot_id = ctx.absent_id("snapshot");
                request.volume_content_source = Some(v1::VolumeContentSource {
                    r#type: Some(Source::Snapshot(SnapshotSource {
                        snapshot_id: snapshot_id.clone(),
                    })),
                });
                cases.push((
                    format!("source snapshot {snapshot_id}"),
                    Call::CreateVolume(request),
                ));
            }
            if ctx.caps.has_controller(CtrlCap::CloneVolume) {
                let mut request = ctx.create_request(ctx.unique_name("from-volume"));
                request.volume_content_source = Some(v1::VolumeContentSource {
                    r#type: Some(Source::Volume(VolumeSource {
                        volume_id: absent_volume.clone(),
                    })),
                });
                cases.push((
                    format!("source volume {absent_volume}"),
                    Call::CreateVolume(request),
                ));
            }
            if cases.is_empty() {
                return Err(Stop::skip(
                    "controller capabilities CREATE_DELETE_SNAPSHOT and CLONE_VOLUME not advertised (no content source to miss)",
                ));
            }
            cases
        }
        Rpc::ControllerPublishVolume => {
            let node_id = match ctx.node_id.clone() {
                Some(id) => id,
                None => ctx.absent_id("node"),
            };
            let request = v1::ControllerPublishVolumeRequest {
                volume_id: absent_volume.clone(),
                node_id,
                volume_capability: Some(cap),
                readonly: false,
                secrets,
                volume_context: Default::default(),
            };
            let mut cases = vec![(
                format!("unknown volume {absent_volume}"),
                Call::ControllerPublishVolume(request.clone()),
            )];
            if ctx
                .require(Gate::Controller(CtrlCap::CreateDeleteVolume))
                .is_ok()
            {
                let absent_node = ctx.absent_id("node");
                let volume_id = ctx.new_volume().await?.volume_id;
                cases.push((
                    format!("unknown node {absent_node}"),
                    Call::ControllerPublishVolume(v1::ControllerPublishVolumeRequest {
                        volume_id,
                        node_id: absent_node,
                        ..request
                    }),
                ));
            }
            cases
        }
        Rpc::ValidateVolumeCapabilities => vec![(
            format!("unknown volume {absent_volume}"),
            Call::ValidateVolumeCapabilities(v1::ValidateVolumeCapabilitiesRequest {
                volume_id: absent_volume.clone(),
                volume_capabilities: vec![cap],
                parameters: ctx.options.parameters.clone(),
                secrets,
                ..Default::default()
            }),
        )],
        Rpc::ControllerGetVolume => vec![(
            format!("unknown volume {absent_volume}"),
            Call::ControllerGetVolume(v1::ControllerGetVolumeRequest {
                volume_id: absent_volume.clone(),
            }),
        )],
        Rpc::ControllerExpandVolume => vec![(
            format!("unknown volume {absent_volume}"),
            Call::ControllerExpandVolume(v1::ControllerExpandVolumeRequest {
                volume_id: absent_volume.clone(),
                capacity_range: ctx.capacity(ctx.options.volume_size.saturating_mul(2)),
                secrets,
                volume_capability: Some(cap),
            }),
        )],
        // Real plugins and csi-sanity look the volume up before they judge the parameters, so
        // an unknown volume is NOT_FOUND even with no (or unsupported) mutable parameters.
        Rpc::ControllerModifyVolume => {
            let mut mutable_parameters = ctx.options.mutable_parameters.clone();
            if mutable_parameters.is_empty() {
                mutable_parameters.insert("csi-conformance".into(), "probe".into());
            }
            let request = v1::ControllerModifyVolumeRequest {
                volume_id: absent_volume.clone(),
                secrets,
                mutable_parameters,
            };
            vec![
                (
                    format!("unknown volume {absent_volume}"),
                    Call::ControllerModifyVolume(request.clone()),
                ),
                (
                    format!("unknown volume {absent_volume} without mutable_parameters"),
                    Call::ControllerModifyVolume(v1::ControllerModifyVolumeRequest {
                        mutable_parameters: Default::default(),
                        ..request
                    }),
                ),
            ]
        }
        Rpc::GetSnapshot => {
            let snapshot_id = ctx.absent_id("snapshot");
            vec![(
                format!("unknown snapshot {snapshot_id}"),
                Call::GetSnapshot(v1::GetSnapshotRequest {
                    snapshot_id: snapshot_id.clone(),
                    secrets,
                }),
            )]
        }
        Rpc::GetVolumeGroupSnapshot => {
            let group = ctx.absent_id("group");
            let request = v1::GetVolumeGroupSnapshotRequest {
                group_snapshot_id: group.clone(),
                snapshot_ids: vec![ctx.absent_id("snapshot")],
                secrets,
            };
            vec![
                (
                    format!("unknown group snapshot {group}"),
                    Call::GetVolumeGroupSnapshot(request.clone()),
                ),
                // The member list can only be checked against a group that exists.
                (
                    format!("unknown group snapshot {group} without snapshot_ids"),
                    Call::GetVolumeGroupSnapshot(v1::GetVolumeGroupSnapshotRequest {
                        snapshot_ids: Vec::new(),
                        ..request
                    }),
                ),
            ]
        }
        Rpc::NodeGetVolumeStats => {
            let mut cases = Vec::new();
            for (what, path) in volume_paths(ctx)? {
                cases.push((
                    format!("unknown volume {absent_volume} at {what}"),
                    Call::NodeGetVolumeStats(v1::NodeGetVolumeStatsRequest {
                        volume_id: absent_volume.clone(),
                        volume_path: path,
                        staging_target_path: String::new(),
                    }),
                ));
            }
            if let Some(volume_id) = known_volume(ctx).await? {
                for (what, path) in volume_paths(ctx)? {
                    cases.push((
                        format!("volume {volume_id}, neither staged nor published at {what}"),
                        Call::NodeGetVolumeStats(v1::NodeGetVolumeStatsRequest {
                            volume_id: volume_id.clone(),
                            volume_path: path,
                            staging_target_path: String::new(),
                        }),
                    ));
                }
            }
            cases
        }
        Rpc::NodeExpandVolume => volume_paths(ctx)?
            .into_iter()
            .map(|(what, path)| {
                (
                    format!("unknown volume {absent_volume} at {what}"),
                    Call::NodeExpandVolume(v1::NodeExpandVolumeRequest {
                        volume_id: absent_volume.clone(),
                        volume_path: path,
                        capacity_range: ctx.capacity(ctx.options.volume_size.saturating_mul(2)),
                        secrets: secrets.clone(),
                        ..Default::default()
                    }),
                )
            })
            .collect(),
        other => {
            return Err(Stop::skip(format!(
                "no NOT_FOUND cases for {}",
                other.name()
            )));
        }
    })
}

/// The `volume_path`s a node call about a volume that is not there is sent with: a scratch
/// directory, and a relative path (which cannot be where a volume is, so real plugins and
/// csi-sanity answer NOT_FOUND rather than judge the path first).
fn volume_paths(ctx: &Ctx) -> Result<Vec<(&'static str, String)>, Stop> {
    Ok(vec![
        (
            "an empty directory",
            path_string(ctx.new_dir("volume-path")?),
        ),
        ("a relative path", "csi-conformance/some/path".to_owned()),
    ])
}

/// A volume the plugin knows but has not staged or published: one the suite creates, or the
/// configured existing volume; `None` when there is neither.
async fn known_volume(ctx: &mut Ctx) -> Result<Option<String>, Stop> {
    if ctx.caps.has_controller(CtrlCap::CreateDeleteVolume) {
        return Ok(Some(ctx.new_volume().await?.volume_id));
    }
    Ok(ctx.options.existing_volume.clone())
}
