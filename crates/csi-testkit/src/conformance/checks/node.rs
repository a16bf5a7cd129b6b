//! The node lifecycle on real directories: stage, publish, unpublish, unstage.

use std::path::{Path, PathBuf};

use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;

use super::required::path_string;
use crate::conformance::caps::Gate;
use crate::conformance::ctx::{Ctx, Step, Stop, Undo};

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// A volume to use: a new one when the plugin can create volumes, else the configured
/// existing volume; a skip naming both when neither is possible.
pub(super) async fn test_volume(ctx: &mut Ctx) -> Result<v1::Volume, Stop> {
    if ctx.caps.has_controller(CtrlCap::CreateDeleteVolume) {
        ctx.new_volume().await
    } else if let Some(volume_id) = ctx.options.existing_volume.clone() {
        Ok(v1::Volume {
            volume_id,
            ..Default::default()
        })
    } else {
        Err(Stop::skip(
            "controller capability CREATE_DELETE_VOLUME not advertised and no existing volume configured (Options::existing_volume)",
        ))
    }
}

/// A volume published on this node by [`publish`].
pub(super) struct Published {
    /// The node it was controller-published to (`None`: the plugin has no controller
    /// publish).
    pub(super) published_to: Option<String>,
    /// The staging path (empty: the plugin does not stage).
    pub(super) staging: String,
    /// The target path.
    pub(super) target: PathBuf,
}

/// Publishes `volume` on this node as a CO does: controller publish and stage where
/// advertised (the CO makes the staging directory), then publish (the CO makes the target's
/// parent; the plugin the target). Every step is undone after the check. With `repeat`, each
/// node call is sent twice and the second must succeed too (idempotency); a failure names the
/// call, the attempt and the path.
pub(super) async fn publish(
    ctx: &mut Ctx,
    volume: &v1::Volume,
    repeat: bool,
) -> Result<Published, Stop> {
    let attempts: &[&str] = if repeat {
        &["first", "repeated"]
    } else {
        &["first"]
    };
    let volume_id = volume.volume_id.clone();
    let cap = ctx.capability();

    // Controller side first, when the plugin attaches volumes to nodes.
    let mut published_to = None;
    let mut publish_context = Default::default();
    if ctx.caps.has_controller(CtrlCap::PublishUnpublishVolume) {
        let node_id = ctx.require_node_id()?;
        let response = ctx
            .controller_publish_volume(v1::ControllerPublishVolumeRequest {
                volume_id: volume_id.clone(),
                node_id: node_id.clone(),
                volume_capability: Some(cap.clone()),
                readonly: false,
                secrets: ctx.secrets(),
                volume_context: volume.volume_context.clone(),
            })
            .await?;
        ctx.undo(Undo::ControllerUnpublish {
            volume: volume_id.clone(),
            node: node_id.clone(),
        });
        publish_context = response.publish_context;
        published_to = Some(node_id);
    }

    let mut staging = String::new();
    if ctx.caps.has_node(NodeCap::StageUnstageVolume) {
        staging = path_string(ctx.new_dir("staging")?);
        let request = v1::NodeStageVolumeRequest {
            volume_id: volume_id.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: staging.clone(),
            volume_capability: Some(cap.clone()),
            secrets: ctx.secrets(),
            volume_context: volume.volume_context.clone(),
        };
        for attempt in attempts {
            ctx.node_stage_volume(request.clone())
                .await
                .map_err(|err| {
                    Stop::fail(format!("{attempt} NodeStageVolume at {staging}: {err}"))
                })?;
            if *attempt == "first" {
                ctx.undo(Undo::NodeUnstage {
                    volume: volume_id.clone(),
                    path: staging.clone(),
                });
            }
        }
    }

    let target = ctx.new_dir("target-parent")?.join("target");
    let target_str = path_string(target.clone());
    let request = v1::NodePublishVolumeRequest {
        volume_id: volume_id.clone(),
        publish_context,
        staging_target_path: staging.clone(),
        target_path: target_str.clone(),
        volume_capability: Some(cap),
        readonly: false,
        secrets: ctx.secrets(),
        volume_context: volume.volume_context.clone(),
    };
    for attempt in attempts {
        ctx.node_publish_volume(request.clone())
            .await
            .map_err(|err| {
                Stop::fail(format!(
                    "{attempt} NodePublishVolume at {target_str}: {err}"
                ))
            })?;
        if *attempt == "first" {
            ctx.undo(Undo::NodeUnpublish {
                volume: volume_id.clone(),
                path: target_str.clone(),
            });
        }
    }
    Ok(Published {
        published_to,
        staging,
        target,
    })
}

pub(crate) async fn lifecycle(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::NodeService)?;
    let volume = test_volume(ctx).await?;
    let volume_id = volume.volume_id.clone();
    let cap = ctx.capability();
    let Published {
        published_to,
        staging,
        target,
    } = publish(ctx, &volume, true).await?;
    let target_str = path_string(target.clone());
    if !exists(&target) {
        return Err(Stop::fail(format!(
            "NodePublishVolume answered OK but {target_str} does not exist"
        )));
    }

    if ctx.caps.has_node(NodeCap::GetVolumeStats) {
        let stats = ctx
            .node_get_volume_stats(v1::NodeGetVolumeStatsRequest {
                volume_id: volume_id.clone(),
                volume_path: target_str.clone(),
                staging_target_path: staging.clone(),
            })
            .await?;
        if let Some(bad) = stats
            .usage
            .iter()
            .find(|u| u.total < 0 || u.used < 0 || u.available < 0)
        {
            return Err(Stop::fail(format!(
                "NodeGetVolumeStats reported negative usage {bad:?}"
            )));
        }
    }
    if ctx.caps.has_node(NodeCap::ExpandVolume) {
        ctx.node_expand_volume(v1::NodeExpandVolumeRequest {
            volume_id: volume_id.clone(),
            volume_path: target_str.clone(),
            capacity_range: ctx.capacity(ctx.options.volume_size),
            staging_target_path: staging.clone(),
            volume_capability: Some(cap.clone()),
            secrets: ctx.secrets(),
        })
        .await?;
    }
    if ctx.caps.has_node(NodeCap::GetVolumeHealth) {
        ctx.node_get_volume_health(v1::NodeGetVolumeHealthRequest {
            volume_id: volume_id.clone(),
            volume_publish_path: target_str.clone(),
            staging_target_path: staging.clone(),
        })
        .await?;
    }

    for attempt in ["first", "repeated"] {
        ctx.node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
            volume_id: volume_id.clone(),
            target_path: target_str.clone(),
        })
        .await
        .map_err(|err| {
            Stop::fail(format!(
                "{attempt} NodeUnpublishVolume at {target_str}: {err}"
            ))
        })?;
        if attempt == "first" && exists(&target) {
            return Err(Stop::fail(format!(
                "NodeUnpublishVolume answered OK but {target_str} still exists (the plugin must remove what it created)"
            )));
        }
    }

    if !staging.is_empty() {
        for attempt in ["first", "repeated"] {
            ctx.node_unstage_volume(v1::NodeUnstageVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: staging.clone(),
            })
            .await
            .map_err(|err| {
                Stop::fail(format!("{attempt} NodeUnstageVolume at {staging}: {err}"))
            })?;
        }
    }

    if let Some(node_id) = published_to {
        ctx.controller_unpublish_volume(v1::ControllerUnpublishVolumeRequest {
            volume_id: volume_id.clone(),
            node_id,
            secrets: ctx.secrets(),
        })
        .await?;
    }
    Ok(())
}
