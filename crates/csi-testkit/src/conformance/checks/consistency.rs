//! Capability consistency: advertised RPCs answer; the others answer UNIMPLEMENTED.

use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupCap;
use csi_proto::{Rpc, Service};
use csi_structs::capability_set::requirement_for;
use tonic::Code;

use super::required::path_string;
use crate::conformance::calls::{Call, CallError, code_name};
use crate::conformance::caps::{Gate, gate_of};
use crate::conformance::ctx::{Ctx, Step, Stop, Undo, member_ids, verdict};

/// A well-formed request to `rpc` about objects that do not exist: a plugin that does not
/// implement the RPC has no reason to answer anything but UNIMPLEMENTED.
fn well_formed(ctx: &mut Ctx, rpc: Rpc) -> Result<Call, Stop> {
    let secrets = ctx.secrets();
    let cap = ctx.capability();
    let volume_id = ctx.absent_id("volume");
    let node_id = ctx
        .node_id
        .clone()
        .unwrap_or_else(|| "csi-conformance-node".into());
    let size = ctx.capacity(ctx.options.volume_size);
    Ok(match rpc {
        Rpc::CreateVolume => Call::CreateVolume(ctx.create_request(ctx.unique_name("unimpl"))),
        Rpc::DeleteVolume => Call::DeleteVolume(v1::DeleteVolumeRequest { volume_id, secrets }),
        Rpc::ControllerPublishVolume => {
            Call::ControllerPublishVolume(v1::ControllerPublishVolumeRequest {
                volume_id,
                node_id,
                volume_capability: Some(cap),
                readonly: false,
                secrets,
                volume_context: Default::default(),
            })
        }
        Rpc::ControllerUnpublishVolume => {
            Call::ControllerUnpublishVolume(v1::ControllerUnpublishVolumeRequest {
                volume_id,
                node_id,
                secrets,
            })
        }
        Rpc::ListVolumes => Call::ListVolumes(v1::ListVolumesRequest::default()),
        Rpc::GetCapacity => Call::GetCapacity(v1::GetCapacityRequest {
            volume_capabilities: vec![cap],
            parameters: ctx.options.parameters.clone(),
            accessible_topology: None,
        }),
        Rpc::CreateSnapshot => Call::CreateSnapshot(v1::CreateSnapshotRequest {
            source_volume_id: volume_id,
            name: ctx.unique_name("unimpl"),
            secrets,
            ..Default::default()
        }),
        Rpc::DeleteSnapshot => Call::DeleteSnapshot(v1::DeleteSnapshotRequest {
            snapshot_id: ctx.absent_id("snapshot"),
            secrets,
        }),
        Rpc::ListSnapshots => Call::ListSnapshots(v1::ListSnapshotsRequest {
            secrets,
            ..Default::default()
        }),
        Rpc::ControllerExpandVolume => {
            Call::ControllerExpandVolume(v1::ControllerExpandVolumeRequest {
                volume_id,
                capacity_range: size,
                secrets,
                volume_capability: Some(cap),
            })
        }
        Rpc::ControllerGetVolume => {
            Call::ControllerGetVolume(v1::ControllerGetVolumeRequest { volume_id })
        }
        Rpc::ControllerModifyVolume => {
            Call::ControllerModifyVolume(v1::ControllerModifyVolumeRequest {
                volume_id,
                secrets,
                mutable_parameters: [("csi-conformance".to_owned(), "probe".to_owned())].into(),
            })
        }
        Rpc::GetSnapshot => Call::GetSnapshot(v1::GetSnapshotRequest {
            snapshot_id: ctx.absent_id("snapshot"),
            secrets,
        }),
        Rpc::ControllerGetVolumeHealth => {
            Call::ControllerGetVolumeHealth(v1::ControllerGetVolumeHealthRequest {
                volume_id,
                secrets,
            })
        }
        Rpc::ControllerListVolumeHealth => {
            Call::ControllerListVolumeHealth(v1::ControllerListVolumeHealthRequest {
                secrets,
                ..Default::default()
            })
        }
        Rpc::NodeStageVolume => Call::NodeStageVolume(v1::NodeStageVolumeRequest {
            volume_id,
            staging_target_path: path_string(ctx.new_dir("staging")?),
            volume_capability: Some(cap),
            secrets,
            ..Default::default()
        }),
        Rpc::NodeUnstageVolume => Call::NodeUnstageVolume(v1::NodeUnstageVolumeRequest {
            volume_id,
            staging_target_path: path_string(ctx.new_dir("staging")?),
        }),
        Rpc::NodeGetVolumeStats => Call::NodeGetVolumeStats(v1::NodeGetVolumeStatsRequest {
            volume_id,
            volume_path: path_string(ctx.new_dir("volume-path")?),
            staging_target_path: String::new(),
        }),
        Rpc::NodeExpandVolume => Call::NodeExpandVolume(v1::NodeExpandVolumeRequest {
            volume_id,
            volume_path: path_string(ctx.new_dir("volume-path")?),
            capacity_range: size,
            volume_capability: Some(cap),
            secrets,
            ..Default::default()
        }),
        Rpc::NodeGetVolumeHealth => Call::NodeGetVolumeHealth(v1::NodeGetVolumeHealthRequest {
            volume_id,
            volume_publish_path: path_string(ctx.new_dir("volume-path")?),
            staging_target_path: String::new(),
        }),
        Rpc::NodeGetStorageHealth => {
            Call::NodeGetStorageHealth(v1::NodeGetStorageHealthRequest { secrets })
        }
        other => {
            return Err(Stop::fail(format!(
                "internal: no well-formed request for {}",
                other.name()
            )));
        }
    })
}

pub(crate) async fn unadvertised_unimplemented(ctx: &mut Ctx) -> Step {
    // The controller and node RPCs csi-structs says are not mandatory (spec §3.8), on the
    // services the plugin offers. NodeGetInfo is left out: without PUBLISH_UNPUBLISH_VOLUME a
    // plugin may still serve it.
    let absent: Vec<(String, Rpc)> = Rpc::ALL
        .iter()
        .filter(|rpc| match rpc.service() {
            Service::Controller => ctx.require(Gate::ControllerService).is_ok(),
            Service::Node => **rpc != Rpc::NodeGetInfo && ctx.require(Gate::NodeService).is_ok(),
            _ => false,
        })
        .filter_map(|&rpc| {
            let gate = gate_of(rpc)?;
            ctx.require(gate)
                .is_err()
                .then(|| (requirement_for(rpc).to_string(), rpc))
        })
        .collect();
    if absent.is_empty() {
        return Err(Stop::skip(
            "nothing to check: no controller or node capability is left unadvertised (or neither service is served)",
        ));
    }
    let mut problems = Vec::new();
    for (cap, rpc) in absent {
        let result = match well_formed(ctx, rpc)? {
            // Should it succeed after all, remember to delete what it made.
            Call::CreateVolume(request) => ctx.create_volume(request).await.map(|answer| {
                if let Some(volume) = answer.volume {
                    ctx.undo(Undo::DeleteVolume(volume.volume_id));
                }
            }),
            call => ctx.send(call).await,
        };
        problems.extend(unimplemented_problem(rpc, &cap, result));
    }
    verdict(problems)
}

/// What is wrong with the answer of `rpc` whose capability `cap` is not advertised, if anything.
fn unimplemented_problem(rpc: Rpc, cap: &str, result: Result<(), CallError>) -> Option<String> {
    match result {
        Err(err) if err.code() == Some(Code::Unimplemented) => None,
        Ok(()) => Some(format!(
            "{} answered OK although {cap} is not advertised",
            rpc.name()
        )),
        Err(err) => Some(format!(
            "{err}, expected UNIMPLEMENTED ({cap} is not advertised)"
        )),
    }
}

pub(crate) async fn advertised_answer(ctx: &mut Ctx) -> Step {
    if ctx.require(Gate::ControllerService).is_err() && ctx.require(Gate::NodeService).is_err() {
        return Err(Stop::skip(
            "neither the Controller nor the Node service is served",
        ));
    }
    let mut problems = Vec::new();
    // RPCs that need no object: one valid request each.
    for rpc in [
        Rpc::GetCapacity,
        Rpc::ListVolumes,
        Rpc::ListSnapshots,
        Rpc::ControllerListVolumeHealth,
        Rpc::NodeGetStorageHealth,
    ] {
        if !ctx.caps.serves(rpc) {
            continue;
        }
        if rpc == Rpc::GetCapacity {
            let request = v1::GetCapacityRequest {
                volume_capabilities: vec![ctx.capability()],
                parameters: ctx.options.parameters.clone(),
                accessible_topology: None,
            };
            match ctx.get_capacity(request).await {
                Ok(answer) if answer.available_capacity < 0 => problems.push(format!(
                    "GetCapacity reported negative available_capacity {}",
                    answer.available_capacity
                )),
                Ok(_) => {}
                Err(err) => problems.push(advertised_problem(&err.to_string(), err.code())),
            }
            continue;
        }
        let call = well_formed(ctx, rpc)?;
        if let Err(err) = ctx.send(call).await {
            problems.push(advertised_problem(&err.to_string(), err.code()));
        }
    }

    // RPCs about one volume: create it (skipped silently when the plugin cannot).
    if ctx.caps.has_controller(CtrlCap::CreateDeleteVolume) {
        match ctx.new_volume().await {
            Ok(volume) => problems.extend(per_volume(ctx, &volume).await),
            Err(Stop::Fail(why) | Stop::Skip(why)) => problems.push(advertised_problem(&why, None)),
        }
    }
    verdict(problems)
}

fn advertised_problem(err: &str, code: Option<Code>) -> String {
    match code {
        Some(Code::Unimplemented) => format!("{err} although its capability is advertised"),
        Some(code) => format!(
            "{err} to a valid request (expected OK, got {})",
            code_name(code)
        ),
        None => err.to_owned(),
    }
}

async fn per_volume(ctx: &mut Ctx, volume: &v1::Volume) -> Vec<String> {
    let mut problems = Vec::new();
    let id = volume.volume_id.clone();
    if ctx.caps.has_controller(CtrlCap::GetVolume) {
        match ctx
            .controller_get_volume(v1::ControllerGetVolumeRequest {
                volume_id: id.clone(),
            })
            .await
        {
            Ok(answer) => {
                let listed = answer.volume.map(|v| v.volume_id).unwrap_or_default();
                if listed != id {
                    problems.push(format!(
                        "ControllerGetVolume {id} returned volume {listed:?}"
                    ));
                }
            }
            Err(err) => note(&mut problems, Err(err)),
        }
    }
    if ctx.caps.has_controller(CtrlCap::GetVolumeHealth) {
        let result = ctx
            .controller_get_volume_health(v1::ControllerGetVolumeHealthRequest {
                volume_id: id.clone(),
                secrets: ctx.secrets(),
            })
            .await;
        note(&mut problems, result.map(drop));
    }
    if ctx.caps.has_controller(CtrlCap::ExpandVolume) {
        let result = ctx
            .controller_expand_volume(v1::ControllerExpandVolumeRequest {
                volume_id: id.clone(),
                capacity_range: ctx.capacity(ctx.options.volume_size.saturating_mul(2)),
                secrets: ctx.secrets(),
                volume_capability: Some(ctx.capability()),
            })
            .await;
        note(&mut problems, result.map(drop));
    }
    if ctx.caps.has_controller(CtrlCap::ModifyVolume) && !ctx.options.mutable_parameters.is_empty()
    {
        let result = ctx
            .controller_modify_volume(v1::ControllerModifyVolumeRequest {
                volume_id: id.clone(),
                secrets: ctx.secrets(),
                mutable_parameters: ctx.options.mutable_parameters.clone(),
            })
            .await;
        note(&mut problems, result.map(drop));
    }
    if let (true, Some(node_id)) = (
        ctx.caps.has_controller(CtrlCap::PublishUnpublishVolume),
        ctx.node_id.clone(),
    ) {
        let result = ctx
            .controller_publish_volume(v1::ControllerPublishVolumeRequest {
                volume_id: id.clone(),
                node_id: node_id.clone(),
                volume_capability: Some(ctx.capability()),
                readonly: false,
                secrets: ctx.secrets(),
                volume_context: volume.volume_context.clone(),
            })
            .await;
        if result.is_ok() {
            ctx.undo(Undo::ControllerUnpublish {
                volume: id.clone(),
                node: node_id.clone(),
            });
        }
        note(&mut problems, result.map(drop));
        let result = ctx
            .controller_unpublish_volume(v1::ControllerUnpublishVolumeRequest {
                volume_id: id.clone(),
                node_id,
                secrets: ctx.secrets(),
            })
            .await;
        note(&mut problems, result.map(drop));
    }
    if ctx.caps.has_controller(CtrlCap::CreateDeleteSnapshot) {
        match ctx.new_snapshot(&id).await {
            Ok(snapshot) if ctx.caps.has_controller(CtrlCap::GetSnapshot) => {
                match ctx
                    .get_snapshot(v1::GetSnapshotRequest {
                        snapshot_id: snapshot.snapshot_id.clone(),
                        secrets: ctx.secrets(),
                    })
                    .await
                {
                    Ok(answer) => {
                        let got = answer.snapshot.map(|s| s.snapshot_id).unwrap_or_default();
                        if got != snapshot.snapshot_id {
                            problems.push(format!(
                                "GetSnapshot {} returned snapshot {got:?}",
                                snapshot.snapshot_id
                            ));
                        }
                    }
                    Err(err) => note(&mut problems, Err(err)),
                }
            }
            Ok(_) => {}
            Err(Stop::Fail(why)) | Err(Stop::Skip(why)) => {
                problems.push(advertised_problem(&why, None))
            }
        }
    }
    if ctx
        .require(Gate::Group(GroupCap::CreateDeleteGetVolumeGroupSnapshot))
        .is_ok()
    {
        match ctx.new_group_snapshot(vec![id.clone()]).await {
            Ok(group) => {
                let members = member_ids(&group);
                let result = ctx
                    .get_volume_group_snapshot(v1::GetVolumeGroupSnapshotRequest {
                        group_snapshot_id: group.group_snapshot_id.clone(),
                        snapshot_ids: members.clone(),
                        secrets: ctx.secrets(),
                    })
                    .await;
                note(&mut problems, result.map(drop));
                let result = ctx
                    .delete_volume_group_snapshot(v1::DeleteVolumeGroupSnapshotRequest {
                        group_snapshot_id: group.group_snapshot_id.clone(),
                        snapshot_ids: members,
                        secrets: ctx.secrets(),
                    })
                    .await;
                note(&mut problems, result.map(drop));
            }
            Err(Stop::Fail(why) | Stop::Skip(why)) => problems.push(advertised_problem(&why, None)),
        }
    }
    problems
}

/// Records a failed call to an advertised RPC.
fn note(problems: &mut Vec<String>, result: Result<(), CallError>) {
    if let Err(err) = result {
        problems.push(advertised_problem(&err.to_string(), err.code()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code) -> Result<(), CallError> {
        Err(CallError::Status {
            rpc: Rpc::ListSnapshots,
            code,
            message: "m".into(),
            has_details: false,
        })
    }

    #[test]
    fn only_unimplemented_is_right_for_an_unadvertised_rpc() {
        let cap = "controller LIST_SNAPSHOTS";
        assert_eq!(
            unimplemented_problem(Rpc::ListSnapshots, cap, status(Code::Unimplemented)),
            None
        );
        let ok = unimplemented_problem(Rpc::ListSnapshots, cap, Ok(())).unwrap_or_default();
        assert!(
            ok.contains("answered OK although controller LIST_SNAPSHOTS is not advertised"),
            "{ok}"
        );
        let internal = unimplemented_problem(Rpc::ListSnapshots, cap, status(Code::Internal))
            .unwrap_or_default();
        assert!(
            internal.starts_with("ListSnapshots answered INTERNAL"),
            "{internal}"
        );
        let timed_out = CallError::TimedOut {
            rpc: Rpc::ListSnapshots,
            after: std::time::Duration::from_secs(1),
        };
        assert!(unimplemented_problem(Rpc::ListSnapshots, cap, Err(timed_out)).is_some());
    }

    #[test]
    fn an_advertised_rpc_answering_unimplemented_is_named_as_such() {
        let text = advertised_problem(
            "GetCapacity answered UNIMPLEMENTED",
            Some(Code::Unimplemented),
        );
        assert!(
            text.ends_with("although its capability is advertised"),
            "{text}"
        );
        let text = advertised_problem("GetCapacity answered INTERNAL", Some(Code::Internal));
        assert!(text.contains("expected OK, got INTERNAL"), "{text}");
    }
}
