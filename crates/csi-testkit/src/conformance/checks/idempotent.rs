//! Each mutating controller call repeated gives OK and the same result.

use csi_proto::Rpc;
use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;

use crate::conformance::caps::{Gate, gate_of};
use crate::conformance::ctx::{Ctx, Step, Stop, Undo, member_ids};

pub(crate) async fn check(ctx: &mut Ctx, rpc: Rpc) -> Step {
    if let Some(gate) = gate_of(rpc) {
        ctx.require(gate)?;
    }
    match rpc {
        Rpc::CreateVolume => create_volume(ctx).await,
        Rpc::DeleteVolume => delete_volume(ctx).await,
        Rpc::ControllerPublishVolume => controller_publish(ctx).await,
        Rpc::ControllerUnpublishVolume => controller_unpublish(ctx).await,
        Rpc::ControllerExpandVolume => controller_expand(ctx).await,
        Rpc::ControllerModifyVolume => controller_modify(ctx).await,
        Rpc::CreateSnapshot => create_snapshot(ctx).await,
        Rpc::DeleteSnapshot => delete_snapshot(ctx).await,
        Rpc::CreateVolumeGroupSnapshot => create_group_snapshot(ctx).await,
        Rpc::DeleteVolumeGroupSnapshot => delete_group_snapshot(ctx).await,
        other => Err(Stop::skip(format!(
            "no idempotency case for {}",
            other.name()
        ))),
    }
}

async fn create_volume(ctx: &mut Ctx) -> Step {
    let name = ctx.unique_name("idem");
    let request = ctx.create_request(name.clone());
    let first = ctx.create_volume(request.clone()).await?.volume;
    if let Some(volume) = &first {
        ctx.undo(Undo::DeleteVolume(volume.volume_id.clone()));
    }
    let second = ctx.create_volume(request).await?.volume;
    if let Some(volume) = &second {
        ctx.undo(Undo::DeleteVolume(volume.volume_id.clone()));
    }
    let (Some(first), Some(second)) = (first, second) else {
        return Err(Stop::fail(format!(
            "CreateVolume {name:?} answered OK without a volume"
        )));
    };
    if first.volume_id != second.volume_id {
        return Err(Stop::fail(format!(
            "repeated CreateVolume {name:?} returned volume {} then {}",
            first.volume_id, second.volume_id
        )));
    }
    if first.capacity_bytes != second.capacity_bytes {
        return Err(Stop::fail(format!(
            "repeated CreateVolume {name:?} returned capacity {} then {}",
            first.capacity_bytes, second.capacity_bytes
        )));
    }
    if first.volume_context != second.volume_context {
        return Err(Stop::fail(format!(
            "repeated CreateVolume {name:?} returned a different volume_context"
        )));
    }
    Ok(())
}

fn delete_request(ctx: &Ctx, volume_id: &str) -> v1::DeleteVolumeRequest {
    v1::DeleteVolumeRequest {
        volume_id: volume_id.to_owned(),
        secrets: ctx.secrets(),
    }
}

async fn delete_volume(ctx: &mut Ctx) -> Step {
    let volume = ctx.new_volume().await?;
    ctx.delete_volume(delete_request(ctx, &volume.volume_id))
        .await
        .map_err(|err| Stop::fail(format!("first delete of {}: {err}", volume.volume_id)))?;
    ctx.delete_volume(delete_request(ctx, &volume.volume_id))
        .await
        .map_err(|err| Stop::fail(format!("repeated delete of {}: {err}", volume.volume_id)))?;
    let absent = ctx.absent_id("volume");
    ctx.delete_volume(delete_request(ctx, &absent))
        .await
        .map_err(|err| Stop::fail(format!("delete of never-created volume {absent}: {err}")))?;
    Ok(())
}

fn publish_request(
    ctx: &Ctx,
    volume: &v1::Volume,
    node_id: &str,
) -> v1::ControllerPublishVolumeRequest {
    v1::ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node_id.to_owned(),
        volume_capability: Some(ctx.capability()),
        readonly: false,
        secrets: ctx.secrets(),
        volume_context: volume.volume_context.clone(),
    }
}

fn unpublish_request(
    ctx: &Ctx,
    volume_id: &str,
    node_id: &str,
) -> v1::ControllerUnpublishVolumeRequest {
    v1::ControllerUnpublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        node_id: node_id.to_owned(),
        secrets: ctx.secrets(),
    }
}

async fn controller_publish(ctx: &mut Ctx) -> Step {
    let node_id = ctx.require_node_id()?;
    let volume = ctx.new_volume().await?;
    let request = publish_request(ctx, &volume, &node_id);
    let first = ctx.controller_publish_volume(request.clone()).await?;
    ctx.undo(Undo::ControllerUnpublish {
        volume: volume.volume_id.clone(),
        node: node_id.clone(),
    });
    let second = ctx
        .controller_publish_volume(request)
        .await
        .map_err(|err| {
            Stop::fail(format!(
                "repeated publish of {} to {node_id}: {err}",
                volume.volume_id
            ))
        })?;
    if first.publish_context != second.publish_context {
        return Err(Stop::fail(format!(
            "repeated publish of {} to {node_id} returned a different publish_context",
            volume.volume_id
        )));
    }
    Ok(())
}

async fn controller_unpublish(ctx: &mut Ctx) -> Step {
    let node_id = ctx.require_node_id()?;
    let volume = ctx.new_volume().await?;
    ctx.controller_publish_volume(publish_request(ctx, &volume, &node_id))
        .await?;
    ctx.undo(Undo::ControllerUnpublish {
        volume: volume.volume_id.clone(),
        node: node_id.clone(),
    });
    for attempt in ["first", "repeated"] {
        ctx.controller_unpublish_volume(unpublish_request(ctx, &volume.volume_id, &node_id))
            .await
            .map_err(|err| {
                Stop::fail(format!(
                    "{attempt} unpublish of {} from {node_id}: {err}",
                    volume.volume_id
                ))
            })?;
    }
    Ok(())
}

async fn controller_expand(ctx: &mut Ctx) -> Step {
    let volume = ctx.new_volume().await?;
    let wanted = ctx.options.volume_size.saturating_mul(2);
    let request = v1::ControllerExpandVolumeRequest {
        volume_id: volume.volume_id.clone(),
        capacity_range: ctx.capacity(wanted),
        secrets: ctx.secrets(),
        volume_capability: Some(ctx.capability()),
    };
    for attempt in ["first", "repeated"] {
        let response = ctx
            .controller_expand_volume(request.clone())
            .await
            .map_err(|err| {
                Stop::fail(format!(
                    "{attempt} expansion of {} to {wanted} bytes: {err}",
                    volume.volume_id
                ))
            })?;
        if response.capacity_bytes < wanted {
            return Err(Stop::fail(format!(
                "{attempt} expansion of {} to {wanted} bytes answered capacity_bytes {}",
                volume.volume_id, response.capacity_bytes
            )));
        }
    }
    Ok(())
}

async fn controller_modify(ctx: &mut Ctx) -> Step {
    if ctx.options.mutable_parameters.is_empty() {
        return Err(Stop::skip(
            "no mutable parameters configured (Options::mutable_parameter); the plugin's valid keys are unknown",
        ));
    }
    let volume = ctx.new_volume().await?;
    let request = v1::ControllerModifyVolumeRequest {
        volume_id: volume.volume_id.clone(),
        secrets: ctx.secrets(),
        mutable_parameters: ctx.options.mutable_parameters.clone(),
    };
    for attempt in ["first", "repeated"] {
        ctx.controller_modify_volume(request.clone())
            .await
            .map_err(|err| {
                Stop::fail(format!(
                    "{attempt} modification of {}: {err}",
                    volume.volume_id
                ))
            })?;
    }
    Ok(())
}

async fn create_snapshot(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::Controller(CtrlCap::CreateDeleteVolume))?;
    let volume = ctx.new_volume().await?;
    let name = ctx.unique_name("idem-snap");
    let request = v1::CreateSnapshotRequest {
        source_volume_id: volume.volume_id.clone(),
        name: name.clone(),
        secrets: ctx.secrets(),
        ..Default::default()
    };
    let mut ids = Vec::new();
    for _ in 0..2 {
        let snapshot = ctx
            .create_snapshot(request.clone())
            .await?
            .snapshot
            .ok_or_else(|| {
                Stop::fail(format!(
                    "CreateSnapshot {name:?} answered OK without a snapshot"
                ))
            })?;
        ctx.undo(Undo::DeleteSnapshot(snapshot.snapshot_id.clone()));
        if snapshot.source_volume_id != volume.volume_id {
            return Err(Stop::fail(format!(
                "snapshot {name:?} reports source volume {:?}, expected {:?}",
                snapshot.source_volume_id, volume.volume_id
            )));
        }
        ids.push(snapshot.snapshot_id);
    }
    if ids[0] != ids[1] {
        return Err(Stop::fail(format!(
            "repeated CreateSnapshot {name:?} returned snapshot {} then {}",
            ids[0], ids[1]
        )));
    }
    Ok(())
}

async fn delete_snapshot(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::Controller(CtrlCap::CreateDeleteVolume))?;
    let volume = ctx.new_volume().await?;
    let snapshot = ctx.new_snapshot(&volume.volume_id).await?;
    for attempt in ["first", "repeated"] {
        ctx.delete_snapshot(v1::DeleteSnapshotRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            secrets: ctx.secrets(),
        })
        .await
        .map_err(|err| {
            Stop::fail(format!(
                "{attempt} delete of snapshot {}: {err}",
                snapshot.snapshot_id
            ))
        })?;
    }
    let absent = ctx.absent_id("snapshot");
    ctx.delete_snapshot(v1::DeleteSnapshotRequest {
        snapshot_id: absent.clone(),
        secrets: ctx.secrets(),
    })
    .await
    .map_err(|err| Stop::fail(format!("delete of never-created snapshot {absent}: {err}")))?;
    Ok(())
}

async fn create_group_snapshot(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::Controller(CtrlCap::CreateDeleteVolume))?;
    let sources = vec![
        ctx.new_volume().await?.volume_id,
        ctx.new_volume().await?.volume_id,
    ];
    let name = ctx.unique_name("idem-group");
    let request = v1::CreateVolumeGroupSnapshotRequest {
        name: name.clone(),
        source_volume_ids: sources.clone(),
        secrets: ctx.secrets(),
        parameters: Default::default(),
    };
    let mut seen = Vec::new();
    for attempt in ["first", "repeated"] {
        let group = ctx
            .create_volume_group_snapshot(request.clone())
            .await
            .map_err(|err| {
                Stop::fail(format!(
                    "{attempt} CreateVolumeGroupSnapshot {name:?}: {err}"
                ))
            })?
            .group_snapshot
            .ok_or_else(|| {
                Stop::fail(format!(
                    "CreateVolumeGroupSnapshot {name:?} answered OK without a group"
                ))
            })?;
        let mut members = member_ids(&group);
        ctx.undo(Undo::DeleteGroupSnapshot {
            group: group.group_snapshot_id.clone(),
            members: members.clone(),
        });
        let mut sources_seen: Vec<String> = group
            .snapshots
            .iter()
            .map(|s| s.source_volume_id.clone())
            .collect();
        sources_seen.sort();
        let mut wanted = sources.clone();
        wanted.sort();
        if sources_seen != wanted {
            return Err(Stop::fail(format!(
                "group snapshot {name:?} has members of volumes {sources_seen:?}, expected {wanted:?}"
            )));
        }
        if let Some(stray) = group
            .snapshots
            .iter()
            .find(|s| s.group_snapshot_id != group.group_snapshot_id)
        {
            return Err(Stop::fail(format!(
                "member snapshot {} carries group_snapshot_id {:?}, expected {:?}",
                stray.snapshot_id, stray.group_snapshot_id, group.group_snapshot_id
            )));
        }
        members.sort();
        seen.push((group.group_snapshot_id, members));
    }
    if seen[0] != seen[1] {
        return Err(Stop::fail(format!(
            "repeated CreateVolumeGroupSnapshot {name:?} returned {:?} then {:?}",
            seen[0], seen[1]
        )));
    }
    Ok(())
}

async fn delete_group_snapshot(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::Controller(CtrlCap::CreateDeleteVolume))?;
    let volume = ctx.new_volume().await?;
    let group = ctx.new_group_snapshot(vec![volume.volume_id]).await?;
    let request = v1::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        snapshot_ids: member_ids(&group),
        secrets: ctx.secrets(),
    };
    for attempt in ["first", "repeated"] {
        ctx.delete_volume_group_snapshot(request.clone())
            .await
            .map_err(|err| {
                Stop::fail(format!(
                    "{attempt} delete of group snapshot {}: {err}",
                    group.group_snapshot_id
                ))
            })?;
    }
    // A group that is gone is deleted, whatever the member list says: there is nothing to
    // check it against (csi-sanity sends none).
    let absent = ctx.absent_id("group");
    for (snapshot_ids, how) in [
        (vec![ctx.absent_id("snapshot")], "with snapshot_ids"),
        (Vec::new(), "without snapshot_ids"),
    ] {
        ctx.delete_volume_group_snapshot(v1::DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: absent.clone(),
            snapshot_ids,
            secrets: ctx.secrets(),
        })
        .await
        .map_err(|err| {
            Stop::fail(format!(
                "delete of never-created group snapshot {absent} {how}: {err}"
            ))
        })?;
    }
    Ok(())
}
