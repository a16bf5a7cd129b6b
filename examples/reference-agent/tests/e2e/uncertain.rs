//! Uncertain outcomes are undone before a failed claim is answered (issue 20, point 1): a
//! `ControllerPublishVolume` or `NodeStageVolume` that may have happened is recorded (the
//! claim, the usage record) before it is sent, and undone before the agent says the claim
//! failed.

use csi_agent::ops::api::VolumeView;
use csi_client::{Code, Rpc};
use csi_testkit::MockPlugin;

use crate::serve::{cli, json, ok_count, one_agent};

/// What `volume claim` says when `rpc` ends uncertain (INTERNAL on a mutation: it may have
/// happened), with the mock and the volume's plugin id.
async fn failed_claim(rpc: Rpc) -> (String, MockPlugin, String) {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let created: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    mock.faults()
        .on(rpc)
        .fail(Code::Internal, "scripted: lost track");
    let err = cli(&data, &["volume", "claim", "v1", "--workload", "w1"])
        .await
        .expect_err("the claim fails");
    let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
    assert!(
        v.claims.is_empty(),
        "the claim is freed before the answer: {v:?}"
    );
    (err, mock, created.external_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_controller_publish_is_undone_before_the_claim_fails() {
    let (err, mock, external) = failed_claim(Rpc::ControllerPublishVolume).await;
    assert!(
        err.contains("ControllerPublishVolume")
            && err.contains("uncertain")
            && err.contains("whatever the publish may have done is undone"),
        "{err}"
    );
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);
    assert!(mock.published_nodes(&external).is_empty());
    assert_eq!(mock.calls().count(Rpc::NodeStageVolume), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_stage_is_undone_before_the_claim_fails() {
    let (err, mock, external) = failed_claim(Rpc::NodeStageVolume).await;
    assert!(
        err.contains("NodeStageVolume") && err.contains("is undone"),
        "{err}"
    );
    assert_eq!(ok_count(&mock, Rpc::NodeUnstageVolume), 1);
    assert_eq!(mock.calls().count(Rpc::NodePublishVolume), 0);
    assert!(mock.staged().is_empty() && mock.published().is_empty());
    // The controller publish before it is undone by the claim's release.
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);
    assert!(mock.published_nodes(&external).is_empty());
}
