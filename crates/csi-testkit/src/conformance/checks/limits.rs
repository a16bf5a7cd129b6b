//! Size limits (spec §3.4): the plugin accepts strings up to 128 bytes and stays within the
//! limits in what it returns.

use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_structs::limits::{MAX_MAP_BYTES, MAX_STRING_BYTES, map_size};

use crate::conformance::caps::Gate;
use crate::conformance::ctx::{Ctx, Step, Undo, verdict};

pub(crate) async fn string_sizes(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::Controller(CtrlCap::CreateDeleteVolume))?;
    let mut name = ctx.unique_name("max");
    let padding = MAX_STRING_BYTES.saturating_sub(name.len() + 1);
    name.push('-');
    name.push_str(&"x".repeat(padding));
    let created = ctx.create_volume(ctx.create_request(name.clone())).await;
    let volume = match created {
        Ok(answer) => answer.volume,
        Err(err) => {
            return verdict(vec![format!(
                "CreateVolume with a {}-byte name (the spec's limit): {err}",
                name.len()
            )]);
        }
    };
    let mut problems = Vec::new();
    let Some(volume) = volume else {
        return verdict(vec!["CreateVolume answered OK without a volume".into()]);
    };
    ctx.undo(Undo::DeleteVolume(volume.volume_id.clone()));
    if volume.volume_id.is_empty() || volume.volume_id.len() > MAX_STRING_BYTES {
        problems.push(format!(
            "CreateVolume returned a volume_id of {} bytes (1 to {MAX_STRING_BYTES} allowed)",
            volume.volume_id.len()
        ));
    }
    if map_size(&volume.volume_context) > MAX_MAP_BYTES {
        problems.push(format!(
            "CreateVolume returned a volume_context of {} bytes ({MAX_MAP_BYTES} allowed)",
            map_size(&volume.volume_context)
        ));
    }
    if volume.capacity_bytes < 0 {
        problems.push(format!(
            "CreateVolume returned negative capacity_bytes {}",
            volume.capacity_bytes
        ));
    }
    if ctx.caps.has_controller(CtrlCap::CreateDeleteSnapshot) {
        match ctx.new_snapshot(&volume.volume_id).await {
            Ok(snapshot) if snapshot.snapshot_id.len() > MAX_STRING_BYTES => problems.push(format!(
                "CreateSnapshot returned a snapshot_id of {} bytes ({MAX_STRING_BYTES} allowed)",
                snapshot.snapshot_id.len()
            )),
            Ok(snapshot) if snapshot.size_bytes < 0 => {
                problems.push(format!("CreateSnapshot returned negative size_bytes {}", snapshot.size_bytes))
            }
            Ok(_) => {}
            Err(stop) => return Err(stop),
        }
    }
    // The delete is part of the check: a volume with a maximal name must also go away.
    ctx.delete_volume(v1::DeleteVolumeRequest {
        volume_id: volume.volume_id.clone(),
        secrets: ctx.secrets(),
    })
    .await
    .map_or_else(|err| problems.push(err.to_string()), drop);
    verdict(problems)
}
