//! The order of checks where the spec leaves it open: the mock answers as real plugins and
//! csi-sanity expect (NOT_FOUND before argument checks), and mutable parameters are limited to
//! the configured keys. `Quirk::ArgumentChecksFirst` and `Quirk::AnyMutableParameterKey` bring
//! the old behaviour back, for the conformance suite's tests.

use std::collections::HashMap;

use csi_proto::v1::*;
use csi_testkit::{MockPlugin, Quirk};
use tonic::Code;

use crate::support::{Harness, code, create_req, path_str, start};

fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn modify(volume_id: &str, pairs: &[(&str, &str)]) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: volume_id.into(),
        mutable_parameters: params(pairs),
        ..Default::default()
    }
}

async fn stats(h: &Harness, volume_id: &str, path: &str) -> Code {
    h.node()
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: volume_id.into(),
            volume_path: path.into(),
            staging_target_path: String::new(),
        })
        .await
        .map_or_else(|s| s.code(), |_| Code::Ok)
}

async fn node_expand(h: &Harness, volume_id: &str, path: &str) -> Code {
    h.node()
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: volume_id.into(),
            volume_path: path.into(),
            ..Default::default()
        })
        .await
        .map_or_else(|s| s.code(), |_| Code::Ok)
}

async fn get_group(h: &Harness, group: &str, members: Vec<String>) -> Code {
    h.group()
        .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
            group_snapshot_id: group.into(),
            snapshot_ids: members,
            secrets: HashMap::new(),
        })
        .await
        .map_or_else(|s| s.code(), |_| Code::Ok)
}

async fn delete_group(h: &Harness, group: &str, members: Vec<String>) -> Code {
    h.group()
        .delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: group.into(),
            snapshot_ids: members,
            secrets: HashMap::new(),
        })
        .await
        .map_or_else(|s| s.code(), |_| Code::Ok)
}

#[tokio::test]
async fn unknown_objects_are_not_found_before_argument_checks() {
    let h = start(MockPlugin::builder()).await;
    let modify_code = |req| {
        let mut controller = h.controller();
        async move {
            controller
                .controller_modify_volume(req)
                .await
                .map_or_else(|s| s.code(), |_| Code::Ok)
        }
    };
    assert_eq!(modify_code(modify("vol-ghost", &[])).await, Code::NotFound);
    assert_eq!(
        modify_code(modify("", &[])).await,
        Code::InvalidArgument,
        "a missing volume_id is still refused first"
    );
    assert_eq!(stats(&h, "vol-ghost", "some/path").await, Code::NotFound);
    assert_eq!(stats(&h, "", "some/path").await, Code::InvalidArgument);
    assert_eq!(stats(&h, "vol-ghost", "").await, Code::InvalidArgument);
    assert_eq!(
        node_expand(&h, "vol-ghost", "some/path").await,
        Code::NotFound
    );
    assert_eq!(get_group(&h, "group-ghost", vec![]).await, Code::NotFound);
    assert_eq!(delete_group(&h, "group-ghost", vec![]).await, Code::Ok);
    assert_eq!(get_group(&h, "", vec![]).await, Code::InvalidArgument);
    assert_eq!(delete_group(&h, "", vec![]).await, Code::InvalidArgument);
}

#[tokio::test]
async fn a_volume_not_at_the_path_is_not_found_even_for_a_relative_path() {
    let h = start(MockPlugin::builder()).await;
    let volume = h.create("stats").await;
    let target = h.attach(&volume).await;
    assert_eq!(
        stats(&h, &volume.volume_id, "some/path").await,
        Code::NotFound
    );
    assert_eq!(
        stats(&h, &volume.volume_id, &path_str(&target)).await,
        Code::Ok
    );
}

#[tokio::test]
async fn an_existing_group_still_needs_its_member_list() {
    let h = start(MockPlugin::builder()).await;
    let volume = h.create("grouped").await;
    let group = h
        .group()
        .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest {
            name: "group".into(),
            source_volume_ids: vec![volume.volume_id.clone()],
            ..Default::default()
        })
        .await
        .expect("create group")
        .into_inner()
        .group_snapshot
        .expect("a group snapshot");
    let members: Vec<String> = group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect();
    let id = &group.group_snapshot_id;
    assert_eq!(get_group(&h, id, vec![]).await, Code::InvalidArgument);
    assert_eq!(delete_group(&h, id, vec![]).await, Code::InvalidArgument);
    assert_eq!(get_group(&h, id, members.clone()).await, Code::Ok);
    assert_eq!(delete_group(&h, id, members).await, Code::Ok);
}

#[tokio::test]
async fn only_configured_mutable_parameter_keys_are_accepted() {
    let h = start(MockPlugin::builder().mutable_parameter_key("iops")).await;
    let volume = h.create("modify").await;
    let mut controller = h.controller();
    controller
        .controller_modify_volume(modify(&volume.volume_id, &[("iops", "3000")]))
        .await
        .expect("a configured key is accepted");
    controller
        .controller_modify_volume(modify(&volume.volume_id, &[]))
        .await
        .expect("an empty map changes nothing and answers OK");
    let status = code(
        controller
            .controller_modify_volume(modify(
                &volume.volume_id,
                &[("iops", "1"), ("XXX_FakeKey", "x")],
            ))
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("\"XXX_FakeKey\"") && status.message().contains("iops"),
        "names the refused key and the supported ones: {}",
        status.message()
    );

    let mut create = create_req("with-vac");
    create.mutable_parameters = params(&[("throughput", "9")]);
    let status = code(controller.create_volume(create.clone()).await);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("\"throughput\""),
        "{}",
        status.message()
    );
    create.mutable_parameters = params(&[("iops", "9")]);
    controller
        .create_volume(create)
        .await
        .expect("a configured key is accepted at creation");
}

#[tokio::test]
async fn the_old_behaviour_comes_back_with_quirks() {
    let h = start(
        MockPlugin::builder()
            .quirk(Quirk::ArgumentChecksFirst)
            .quirk(Quirk::AnyMutableParameterKey),
    )
    .await;
    let volume = h.create("old").await;
    let mut controller = h.controller();
    let status = code(
        controller
            .controller_modify_volume(modify("vol-ghost", &[]))
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
    controller
        .controller_modify_volume(modify(&volume.volume_id, &[("XXX_FakeKey", "x")]))
        .await
        .expect("any key is accepted");
    assert_eq!(
        stats(&h, "vol-ghost", "some/path").await,
        Code::InvalidArgument
    );
    assert_eq!(
        node_expand(&h, "vol-ghost", "some/path").await,
        Code::InvalidArgument
    );
    assert_eq!(
        get_group(&h, "group-ghost", vec![]).await,
        Code::InvalidArgument
    );
    assert_eq!(
        delete_group(&h, "group-ghost", vec![]).await,
        Code::InvalidArgument
    );
}
