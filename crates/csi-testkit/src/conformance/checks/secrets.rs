//! Secrets: a lifecycle succeeds with the configured secrets in every request.

use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;

use crate::conformance::caps::Gate;
use crate::conformance::ctx::{Ctx, Step, Stop, Undo};

pub(crate) async fn passed_through(ctx: &mut Ctx) -> Step {
    if ctx.options.secrets.is_empty() {
        return Err(Stop::skip(
            "no secrets configured (Options::secret); nothing to pass through",
        ));
    }
    ctx.require(Gate::Controller(CtrlCap::CreateDeleteVolume))?;
    // Every request the suite builds carries the secrets; this walks the calls that take them.
    let volume = ctx.new_volume().await?;
    ctx.validate_volume_capabilities(v1::ValidateVolumeCapabilitiesRequest {
        volume_id: volume.volume_id.clone(),
        volume_context: volume.volume_context.clone(),
        volume_capabilities: vec![ctx.capability()],
        parameters: ctx.options.parameters.clone(),
        secrets: ctx.secrets(),
        ..Default::default()
    })
    .await?;
    if let (true, Some(node_id)) = (
        ctx.caps.has_controller(CtrlCap::PublishUnpublishVolume),
        ctx.node_id.clone(),
    ) {
        ctx.controller_publish_volume(v1::ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node_id.clone(),
            volume_capability: Some(ctx.capability()),
            readonly: false,
            secrets: ctx.secrets(),
            volume_context: volume.volume_context.clone(),
        })
        .await?;
        ctx.undo(Undo::ControllerUnpublish {
            volume: volume.volume_id.clone(),
            node: node_id.clone(),
        });
        ctx.controller_unpublish_volume(v1::ControllerUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id,
            secrets: ctx.secrets(),
        })
        .await?;
    }
    if ctx.caps.has_controller(CtrlCap::CreateDeleteSnapshot) {
        let snapshot = ctx.new_snapshot(&volume.volume_id).await?;
        ctx.delete_snapshot(v1::DeleteSnapshotRequest {
            snapshot_id: snapshot.snapshot_id,
            secrets: ctx.secrets(),
        })
        .await?;
    }
    ctx.delete_volume(v1::DeleteVolumeRequest {
        volume_id: volume.volume_id,
        secrets: ctx.secrets(),
    })
    .await?;
    Ok(())
}
