//! Volume condition (CSI v1.3 to v1.12): where a plugin advertises `VOLUME_CONDITION`, the
//! answers that carry a `VolumeCondition` must carry one.
//!
//! Only its presence is checked: the spec leaves what is normal to the plugin, and a fresh
//! test volume may be either.

use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_structs::{NodeCapability, Requirement};

use super::node::{publish, test_volume};
use super::required::path_string;
use crate::conformance::caps::Gate;
use crate::conformance::ctx::{Ctx, Step, Stop, verdict};

/// ListVolumes pages followed before the listing is called endless.
const MAX_PAGES: usize = 1000;
/// Entries named in a failure, at most.
const NAMED: usize = 5;

/// Controller `VOLUME_CONDITION`: `ControllerGetVolume` (with `GET_VOLUME`) answers
/// `status.volume_condition`, and every `ListVolumes` entry (with `LIST_VOLUMES`) carries
/// `status.volume_condition`.
pub(crate) async fn controller(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::Controller(CtrlCap::VolumeCondition))?;
    let get = ctx.caps.has_controller(CtrlCap::GetVolume);
    let list = ctx.caps.has_controller(CtrlCap::ListVolumes);
    if !get && !list {
        return Err(Stop::skip(
            "controller capabilities GET_VOLUME and LIST_VOLUMES not advertised \
             (controller VOLUME_CONDITION is reported only by ControllerGetVolume and ListVolumes)",
        ));
    }
    let volume_id = test_volume(ctx).await?.volume_id;
    let mut problems = Vec::new();
    if get {
        let answer = ctx
            .controller_get_volume(v1::ControllerGetVolumeRequest {
                volume_id: volume_id.clone(),
            })
            .await?;
        match answer.status {
            None => problems.push(format!(
                "ControllerGetVolume of volume {volume_id} answered without status, \
                 so without status.volume_condition (controller VOLUME_CONDITION is advertised)"
            )),
            Some(status) if status.volume_condition.is_none() => problems.push(format!(
                "ControllerGetVolume of volume {volume_id} answered without \
                 status.volume_condition (controller VOLUME_CONDITION is advertised)"
            )),
            Some(_) => {}
        }
    }
    if list {
        problems.extend(list_volumes(ctx).await?);
    }
    verdict(problems)
}

/// Walks every ListVolumes page; one problem naming the entries without a condition.
async fn list_volumes(ctx: &Ctx) -> Result<Option<String>, Stop> {
    let mut token = String::new();
    let mut seen_tokens = std::collections::BTreeSet::new();
    let mut listed = 0_usize;
    let mut without = Vec::new();
    for _ in 0..MAX_PAGES {
        let page = ctx
            .list_volumes(v1::ListVolumesRequest {
                max_entries: 0,
                starting_token: token.clone(),
            })
            .await?;
        for entry in page.entries {
            listed += 1;
            let has_condition = entry
                .status
                .as_ref()
                .is_some_and(|status| status.volume_condition.is_some());
            if !has_condition {
                without.push(entry.volume.map(|v| v.volume_id).unwrap_or_default());
            }
        }
        // A token that repeats or never ends is the pagination check's business.
        if page.next_token.is_empty() || !seen_tokens.insert(page.next_token.clone()) {
            break;
        }
        token = page.next_token;
    }
    if without.is_empty() {
        return Ok(None);
    }
    let mut named: Vec<String> = without
        .iter()
        .take(NAMED)
        .map(|id| format!("{id:?}"))
        .collect();
    if without.len() > NAMED {
        named.push("…".into());
    }
    Ok(Some(format!(
        "ListVolumes listed {} of {listed} entries without status.volume_condition \
         (controller VOLUME_CONDITION is advertised): {}",
        without.len(),
        named.join(", ")
    )))
}

/// Node `VOLUME_CONDITION`: `NodeGetVolumeStats` of a volume published on the node answers
/// `volume_condition`. The volume is published as the node lifecycle does it (controller
/// publish, stage, publish, as advertised), and everything is undone after the check.
pub(crate) async fn node(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::Spec(Requirement::Node(
        NodeCapability::VolumeCondition,
    )))?;
    let volume = test_volume(ctx).await?;
    let volume_id = volume.volume_id.clone();
    let published = publish(ctx, &volume, false).await?;
    let (staging, target) = (published.staging, path_string(published.target));

    let stats = ctx
        .node_get_volume_stats(v1::NodeGetVolumeStatsRequest {
            volume_id: volume_id.clone(),
            volume_path: target.clone(),
            staging_target_path: staging,
        })
        .await?;
    if stats.volume_condition.is_none() {
        return Err(Stop::fail(format!(
            "NodeGetVolumeStats of volume {volume_id} published at {target} answered without \
             volume_condition (node VOLUME_CONDITION is advertised)"
        )));
    }
    Ok(())
}
