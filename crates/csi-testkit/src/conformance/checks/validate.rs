//! ValidateVolumeCapabilities confirms what the volume was created with.

use csi_proto::v1;

use crate::conformance::caps::Gate;
use crate::conformance::ctx::{Ctx, Step, Stop};

pub(crate) async fn confirms(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::ControllerService)?;
    let volume = ctx.new_volume().await?;
    let requested = vec![ctx.capability()];
    let response = ctx
        .validate_volume_capabilities(v1::ValidateVolumeCapabilitiesRequest {
            volume_id: volume.volume_id.clone(),
            volume_context: volume.volume_context.clone(),
            volume_capabilities: requested.clone(),
            parameters: ctx.options.parameters.clone(),
            secrets: ctx.secrets(),
            ..Default::default()
        })
        .await?;
    let Some(confirmed) = response.confirmed else {
        return Err(Stop::fail(format!(
            "volume {} was created with the requested capability but `confirmed` is unset (message: {:?})",
            volume.volume_id, response.message
        )));
    };
    if confirmed.volume_capabilities != requested {
        return Err(Stop::fail(format!(
            "volume {}: confirmed capabilities {:?} differ from the requested {:?}",
            volume.volume_id, confirmed.volume_capabilities, requested
        )));
    }
    if !confirmed.volume_context.is_empty() && confirmed.volume_context != volume.volume_context {
        return Err(Stop::fail(format!(
            "volume {}: confirmed volume_context differs from the one CreateVolume returned",
            volume.volume_id
        )));
    }
    if !confirmed.parameters.is_empty() && confirmed.parameters != ctx.options.parameters {
        return Err(Stop::fail(format!(
            "volume {}: confirmed parameters differ from the requested ones",
            volume.volume_id
        )));
    }
    Ok(())
}
