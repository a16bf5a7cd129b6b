//! Volume condition (v1.12 `VOLUME_CONDITION`): what `ControllerGetVolume`, `ListVolumes` and
//! `NodeGetVolumeStats` report as a volume's condition, set with
//! `MockPlugin::set_volume_condition` and cleared with `clear_volume_condition`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_testkit::{ControllerCapability, MockPlugin, MockPluginBuilder, NodeCapability, Quirk};

use crate::support::*;

/// The default capabilities plus `VOLUME_CONDITION` on both sides.
fn with_volume_condition() -> MockPluginBuilder {
    MockPlugin::builder().volume_condition()
}

fn condition(abnormal: bool, message: &str) -> Option<VolumeCondition> {
    Some(VolumeCondition {
        abnormal,
        message: message.into(),
    })
}

/// What the volume is reported as now, by each of the three rpcs.
#[derive(Debug, PartialEq)]
struct Reported {
    get: Option<VolumeCondition>,
    listed: Option<VolumeCondition>,
    stats: Option<VolumeCondition>,
}

impl Reported {
    fn all(condition: Option<VolumeCondition>) -> Reported {
        Reported {
            get: condition.clone(),
            listed: condition.clone(),
            stats: condition,
        }
    }
}

/// A volume created, attached and published on the node, so that all three rpcs answer.
struct Published {
    volume: Volume,
    target: PathBuf,
    staging: PathBuf,
}

async fn published(h: &Harness, name: &str) -> Published {
    let volume = h.create(name).await;
    let target = h.attach(&volume).await;
    let staging = h.dir.path().join("staging").join(&volume.volume_id);
    Published {
        volume,
        target,
        staging,
    }
}

async fn get_status(h: &Harness, volume_id: &str) -> controller_get_volume_response::VolumeStatus {
    h.controller()
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: volume_id.into(),
        })
        .await
        .expect("ControllerGetVolume")
        .into_inner()
        .status
        .expect("the mock always answers a status")
}

/// Each listed volume's status.
async fn list_statuses(
    h: &Harness,
) -> BTreeMap<String, Option<list_volumes_response::VolumeStatus>> {
    h.controller()
        .list_volumes(ListVolumesRequest::default())
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries
        .into_iter()
        .map(|e| (e.volume.expect("a volume").volume_id, e.status))
        .collect()
}

async fn stats(
    h: &Harness,
    volume_id: &str,
    target: &Path,
    staging: &Path,
) -> Option<VolumeCondition> {
    h.node()
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: volume_id.into(),
            volume_path: path_str(target),
            staging_target_path: path_str(staging),
        })
        .await
        .expect("NodeGetVolumeStats")
        .into_inner()
        .volume_condition
}

async fn reported(h: &Harness, p: &Published) -> Reported {
    let id = p.volume.volume_id.as_str();
    let listed = list_statuses(h).await;
    let listed = listed
        .get(id)
        .expect("the volume is listed")
        .clone()
        .and_then(|s| s.volume_condition);
    Reported {
        get: get_status(h, id).await.volume_condition,
        listed,
        stats: stats(h, id, &p.target, &p.staging).await,
    }
}

#[tokio::test]
async fn a_condition_appears_changes_and_clears_on_each_rpc() {
    let h = start(with_volume_condition()).await;
    let sick = published(&h, "sick").await;
    let well = published(&h, "well").await;
    let normal = Reported::all(condition(false, ""));
    assert_eq!(reported(&h, &sick).await, normal, "none set: normal");

    h.plugin()
        .set_volume_condition(&sick.volume.volume_id, true, "disk detached");
    assert_eq!(
        reported(&h, &sick).await,
        Reported::all(condition(true, "disk detached"))
    );
    assert_eq!(reported(&h, &well).await, normal, "only the named volume");

    h.plugin()
        .set_volume_condition(&sick.volume.volume_id, false, "resynced");
    assert_eq!(
        reported(&h, &sick).await,
        Reported::all(condition(false, "resynced")),
        "setting again replaces"
    );

    h.plugin()
        .set_volume_condition(&sick.volume.volume_id, true, "degraded");
    h.plugin().clear_volume_condition(&sick.volume.volume_id);
    assert_eq!(reported(&h, &sick).await, normal, "cleared: normal again");
    // The published nodes are still reported beside the condition.
    assert_eq!(
        get_status(&h, &sick.volume.volume_id)
            .await
            .published_node_ids,
        ["node-1"]
    );
}

#[tokio::test]
async fn list_volumes_has_a_status_for_the_condition_alone() {
    // VOLUME_CONDITION without LIST_VOLUMES_PUBLISHED_NODES: the status carries only it.
    let h = start(MockPlugin::builder().controller_capabilities([
        ControllerCapability::CreateDeleteVolume,
        ControllerCapability::PublishUnpublishVolume,
        ControllerCapability::ListVolumes,
        ControllerCapability::GetVolume,
        ControllerCapability::VolumeCondition,
    ]))
    .await;
    let volume = h.create("data").await;
    h.controller()
        .controller_publish_volume(publish_req(
            &volume,
            "node-1",
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .expect("ControllerPublishVolume");
    h.plugin()
        .set_volume_condition(&volume.volume_id, true, "slow");
    let listed = list_statuses(&h).await;
    let status = listed[&volume.volume_id]
        .clone()
        .expect("a status, for the condition");
    assert_eq!(status.volume_condition, condition(true, "slow"));
    assert!(
        status.published_node_ids.is_empty(),
        "LIST_VOLUMES_PUBLISHED_NODES is not advertised: {status:?}"
    );
    let status = get_status(&h, &volume.volume_id).await;
    assert_eq!(status.volume_condition, condition(true, "slow"));
    assert!(status.published_node_ids.is_empty(), "{status:?}");
}

#[tokio::test]
async fn nothing_is_reported_without_volume_condition() {
    let h = start_default().await;
    let controller_caps = controller_rpcs(&mut h.controller()).await;
    assert!(
        !controller_caps.contains(&(ControllerCapability::VolumeCondition as i32)),
        "the default mock does not advertise it: {controller_caps:?}"
    );
    let node_caps = node_rpcs(&mut h.node()).await;
    assert!(
        !node_caps.contains(&(NodeCapability::VolumeCondition as i32)),
        "{node_caps:?}"
    );

    let sick = published(&h, "sick").await;
    h.plugin()
        .set_volume_condition(&sick.volume.volume_id, true, "never reported");
    assert_eq!(reported(&h, &sick).await, Reported::all(None));
    // The status is still there, for the published nodes.
    assert!(list_statuses(&h).await[&sick.volume.volume_id].is_some());

    // Without LIST_VOLUMES_PUBLISHED_NODES either, ListVolumes has no status at all.
    let h = start(MockPlugin::builder().controller_capabilities([
        ControllerCapability::CreateDeleteVolume,
        ControllerCapability::ListVolumes,
    ]))
    .await;
    let volume = h.create("data").await;
    h.plugin()
        .set_volume_condition(&volume.volume_id, true, "never reported");
    assert_eq!(list_statuses(&h).await[&volume.volume_id], None);
}

#[tokio::test]
async fn the_no_volume_condition_quirk_omits_it_until_cleared() {
    let h = start(with_volume_condition().quirk(Quirk::NoVolumeCondition)).await;
    let sick = published(&h, "sick").await;
    h.plugin()
        .set_volume_condition(&sick.volume.volume_id, true, "disk detached");
    assert_eq!(reported(&h, &sick).await, Reported::all(None));
    assert!(
        list_statuses(&h).await[&sick.volume.volume_id].is_some(),
        "the status is kept, only the condition is left out"
    );
    h.plugin().clear_quirks();
    assert_eq!(
        reported(&h, &sick).await,
        Reported::all(condition(true, "disk detached")),
        "the condition set meanwhile is reported"
    );
    h.plugin().set_quirk(Quirk::NoVolumeCondition);
    assert_eq!(
        reported(&h, &sick).await,
        Reported::all(None),
        "at run time"
    );
}
