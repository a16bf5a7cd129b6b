//! The full lifecycle with real directories, and idempotent repeats.

use csi_proto::Rpc;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_testkit::{MockPlugin, NodeCapability, Quirk};
use tonic::Code;

use crate::support::*;

#[tokio::test]
async fn lifecycle_creates_and_removes_directories() {
    let h = start_default().await;
    let volume = h.create("pvc-1").await;
    let context = h
        .controller()
        .controller_publish_volume(publish_req(
            &volume,
            "node-1",
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .expect("ControllerPublishVolume")
        .into_inner()
        .publish_context;
    assert_eq!(
        h.plugin().published_nodes(&volume.volume_id),
        vec!["node-1"]
    );

    let staging = h.co_dir("staging/pvc-1");
    h.node()
        .node_stage_volume(stage_req(&volume, &staging, context.clone()))
        .await
        .expect("NodeStageVolume");
    assert_eq!(h.plugin().staged()[0].path, staging);

    let pod = h.co_dir("pods/pod-a");
    let target = pod.join("mount");
    assert!(!target.exists());
    h.node()
        .node_publish_volume(node_publish_req(&volume, &staging, &target, context))
        .await
        .expect("NodePublishVolume");
    assert!(target.is_dir(), "the plugin creates the target directory");

    h.node()
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            target_path: path_str(&target),
        })
        .await
        .expect("NodeUnpublishVolume");
    assert!(!target.exists(), "unpublish removes the target");
    assert!(pod.is_dir(), "the CO's parent directory stays");

    h.node()
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: path_str(&staging),
        })
        .await
        .expect("NodeUnstageVolume");
    assert!(staging.is_dir(), "the CO owns the staging directory");
    assert!(h.plugin().staged().is_empty());

    h.controller()
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: "node-1".into(),
            ..Default::default()
        })
        .await
        .expect("ControllerUnpublishVolume");
    h.controller()
        .delete_volume(DeleteVolumeRequest {
            volume_id: volume.volume_id.clone(),
            ..Default::default()
        })
        .await
        .expect("DeleteVolume");
    assert!(h.plugin().volumes().is_empty());

    h.server
        .calls()
        .assert_runs(&[
            (Rpc::CreateVolume, 1),
            (Rpc::ControllerPublishVolume, 1),
            (Rpc::NodeStageVolume, 1),
            (Rpc::NodePublishVolume, 1),
            (Rpc::NodeUnpublishVolume, 1),
            (Rpc::NodeUnstageVolume, 1),
            (Rpc::ControllerUnpublishVolume, 1),
            (Rpc::DeleteVolume, 1),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    let calls = h.server.calls().for_volume(&volume.volume_id);
    assert_eq!(
        calls.len(),
        8,
        "CreateVolume is logged under the id it created"
    );
}

#[tokio::test]
async fn block_publish_creates_a_file_and_removes_it() {
    let h = start(MockPlugin::builder().node_capabilities([NodeCapability::GetVolumeStats])).await;
    let volume = h
        .controller()
        .create_volume(create_with("blk", block(Mode::SingleNodeWriter)))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let mut publish = publish_req(&volume, "node-1", block(Mode::SingleNodeWriter));
    publish.volume_context.clear();
    let context = h
        .controller()
        .controller_publish_volume(publish)
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    let target = h.co_dir("dev").join("vol");
    let mut req = node_publish_req(&volume, std::path::Path::new("/"), &target, context);
    req.staging_target_path.clear(); // no STAGE_UNSTAGE_VOLUME
    req.volume_capability = Some(block(Mode::SingleNodeWriter));
    h.node()
        .node_publish_volume(req)
        .await
        .expect("NodePublishVolume");
    assert!(target.is_file(), "block access gets a device file stand-in");
    let stats = h
        .node()
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: volume.volume_id.clone(),
            volume_path: path_str(&target),
            staging_target_path: String::new(),
        })
        .await
        .expect("stats of a published volume")
        .into_inner();
    assert_eq!(stats.usage[0].total, 1 << 30);
    h.node()
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            target_path: path_str(&target),
        })
        .await
        .unwrap();
    assert!(!target.exists());
}

#[tokio::test]
async fn every_mutating_call_is_idempotent() {
    let h = start_default().await;
    let first = h.create("pvc-idem").await;
    let again = h.create("pvc-idem").await;
    assert_eq!(first, again, "the same name gives the same volume");
    let publish = publish_req(&first, "node-1", mount(Mode::SingleNodeWriter));
    let ctx1 = h
        .controller()
        .controller_publish_volume(publish.clone())
        .await
        .unwrap()
        .into_inner();
    let ctx2 = h
        .controller()
        .controller_publish_volume(publish)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ctx1, ctx2);
    let staging = h.co_dir("staging");
    let target = h.co_dir("pod").join("t");
    for _ in 0..2 {
        h.node()
            .node_stage_volume(stage_req(&first, &staging, ctx1.publish_context.clone()))
            .await
            .expect("repeated NodeStageVolume is OK");
    }
    for _ in 0..2 {
        h.node()
            .node_publish_volume(node_publish_req(
                &first,
                &staging,
                &target,
                ctx1.publish_context.clone(),
            ))
            .await
            .expect("repeated NodePublishVolume is OK");
    }
    for _ in 0..2 {
        h.node()
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: first.volume_id.clone(),
                target_path: path_str(&target),
            })
            .await
            .expect("repeated NodeUnpublishVolume is OK");
        h.node()
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: first.volume_id.clone(),
                staging_target_path: path_str(&staging),
            })
            .await
            .expect("repeated NodeUnstageVolume is OK");
    }
    for _ in 0..2 {
        h.controller()
            .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: first.volume_id.clone(),
                node_id: "node-1".into(),
                ..Default::default()
            })
            .await
            .expect("repeated ControllerUnpublishVolume is OK");
    }
    for _ in 0..2 {
        h.controller()
            .delete_volume(DeleteVolumeRequest {
                volume_id: first.volume_id.clone(),
                ..Default::default()
            })
            .await
            .expect("repeated DeleteVolume is OK");
    }
    let snap = CreateSnapshotRequest {
        source_volume_id: h.create("src").await.volume_id,
        name: "snap-a".into(),
        ..Default::default()
    };
    let s1 = h
        .controller()
        .create_snapshot(snap.clone())
        .await
        .unwrap()
        .into_inner();
    let s2 = h
        .controller()
        .create_snapshot(snap)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s1, s2);
}

#[tokio::test]
async fn repeated_unpublish_quirk_answers_not_found() {
    let h = start(MockPlugin::builder().quirk(Quirk::NotFoundOnRepeatedUnpublish)).await;
    let volume = h.create("q").await;
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        target_path: path_str(&h.dir.path().join("never-published")),
    };
    let status = code(h.node().node_unpublish_volume(unpublish).await);
    assert_eq!(status.code(), Code::NotFound);
    let status = code(
        h.controller()
            .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                node_id: "node-1".into(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn node_ordering_mistakes_are_refused() {
    let h = start_default().await;
    let volume = h.create("order").await;
    let staging = h.co_dir("staging");
    // Staging before ControllerPublishVolume.
    let status = code(
        h.node()
            .node_stage_volume(stage_req(&volume, &staging, Default::default()))
            .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
    let ctx = h
        .controller()
        .controller_publish_volume(publish_req(
            &volume,
            "node-1",
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    // Staging with the wrong publish_context.
    let status = code(
        h.node()
            .node_stage_volume(stage_req(&volume, &staging, Default::default()))
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("publish_context"));
    // Publishing before staging.
    let target = h.co_dir("pod").join("t");
    let status = code(
        h.node()
            .node_publish_volume(node_publish_req(&volume, &staging, &target, ctx.clone()))
            .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(!target.exists());
    h.node()
        .node_stage_volume(stage_req(&volume, &staging, ctx.clone()))
        .await
        .unwrap();
    // ControllerUnpublishVolume while still staged.
    let status = code(
        h.controller()
            .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: volume.volume_id.clone(),
                node_id: "node-1".into(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
    // DeleteVolume while published.
    let status = code(
        h.controller()
            .delete_volume(DeleteVolumeRequest {
                volume_id: volume.volume_id.clone(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
}
