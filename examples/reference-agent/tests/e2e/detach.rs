//! The ways out of a release that cannot finish, on one agent: `volume detach` of a node's
//! claims, and `volume deregister --force` with its confirmation, saying what the plugin keeps.
//! (A node gone for good, in cluster mode, is in `cluster.rs`.)

use csi_agent::ops::api::{DeregisterView, DetachView, StatusView, VolumeView};
use csi_client::{Code, Rpc};
use csi_testkit::MockPlugin;

use crate::serve::{cli, eventually, json, metrics, ok_count, one_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_releases_every_claim_of_the_volume_on_the_node() {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let me = json::<StatusView>(&data, &["status"]).await.node;
    let _: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--access-mode",
            "single-node-multi-writer",
        ],
    )
    .await;
    for w in ["w1", "w2"] {
        cli(&data, &["volume", "claim", "v1", "--workload", w])
            .await
            .expect("claimed");
    }

    let gone_here = cli(
        &data,
        &["volume", "detach", "v1", "--node", &me, "--node-gone"],
    )
    .await
    .expect_err("this agent's node is not gone");
    assert!(
        gone_here.contains("node_gone") && gone_here.contains("own node"),
        "{gone_here}"
    );
    let elsewhere = cli(&data, &["volume", "detach", "v1", "--node", "other-node"])
        .await
        .expect_err("no claim there");
    assert!(
        elsewhere.contains("no claim on node other-node") && elsewhere.contains("its own node"),
        "{elsewhere}"
    );

    let out = cli(
        &data,
        &["volume", "detach", "v1", "--node", &me, "--wait", "--json"],
    )
    .await
    .expect("detached");
    let detached: DetachView = serde_json::from_str(&out).expect("a detach view");
    assert_eq!(detached.releasing, ["w1", "w2"]);
    assert!(detached.volume.claims.is_empty(), "{detached:?}");
    assert!(!detached.node_gone && detached.note.is_none());
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 2);
    assert_eq!(ok_count(&mock, Rpc::NodeUnstageVolume), 1);
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_volume_is_deregistered_by_force_only_when_confirmed() {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let created: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    cli(&data, &["volume", "claim", "v1", "--workload", "w1"])
        .await
        .expect("claimed");
    // The node plugin never unpublishes again: the release is stuck in its node step.
    mock.faults()
        .on(Rpc::NodeUnpublishVolume)
        .fail_times(100_000, Code::Unavailable, "node plugin gone")
        .install();
    let _: VolumeView = json(&data, &["volume", "release", "v1", "--workload", "w1"]).await;
    eventually("the release is stuck", async || {
        let s: StatusView = json(&data, &["status"]).await;
        s.stuck.iter().any(|r| r.volume == "v1").then_some(())
    })
    .await;

    let claimed = cli(&data, &["volume", "deregister", "v1"])
        .await
        .expect_err("claims remain");
    assert!(claimed.contains("--force"), "{claimed}");
    let unconfirmed = cli(&data, &["volume", "deregister", "v1", "--force"])
        .await
        .expect_err("not confirmed");
    assert!(
        unconfirmed.contains("--yes")
            && unconfirmed.contains("NodeUnpublishVolume")
            && unconfirmed.contains("ControllerUnpublishVolume")
            && unconfirmed.contains(&created.external_id),
        "lists what would be left: {unconfirmed}"
    );
    let no_force = cli(&data, &["volume", "deregister", "v1", "--yes"])
        .await
        .expect_err("--yes needs --force");
    assert!(no_force.contains("--force"), "{no_force}");

    let out = cli(
        &data,
        &["volume", "deregister", "v1", "--force", "--yes", "--json"],
    )
    .await
    .expect("deregistered by force");
    let dropped: DeregisterView = serde_json::from_str(&out).expect("a deregister view");
    assert_eq!(dropped.dropped_claims, 1);
    let left = dropped.left_in_plugin.join("\n");
    assert!(
        left.contains(&format!(
            "volume {} in plugin mock (created by this agent)",
            created.external_id
        )) && left.contains("publication for workload w1")
            && left.contains("attachment to node")
            && left.contains("usage record"),
        "{left}"
    );

    // Gone from the agent, stuck release included; the plugin was not called.
    let missing = cli(&data, &["volume", "status", "v1"])
        .await
        .expect_err("deregistered");
    assert!(missing.contains("no volume"), "{missing}");
    let s: StatusView = json(&data, &["status"]).await;
    assert!(s.stuck.is_empty(), "{s:?}");
    assert!(metrics(&data).contains("csi_agent_stuck_releases 0"));
    assert_eq!(mock.calls().count(Rpc::DeleteVolume), 0);
    assert_eq!(mock.calls().count(Rpc::ControllerUnpublishVolume), 0);

    // The id is free again: the volume can be registered and holds no claim.
    let again: VolumeView = json(
        &data,
        &[
            "volume",
            "register",
            "v1",
            "--external-id",
            &created.external_id,
            "--plugin",
            "mock",
        ],
    )
    .await;
    assert!(again.claims.is_empty(), "{again:?}");
    // Without claims, a plain deregistration needs no force.
    let plain = cli(&data, &["volume", "deregister", "v1"])
        .await
        .expect("deregistered");
    assert!(
        plain.contains("deregistered volume v1 (0 claim(s) forgotten)"),
        "{plain}"
    );
}
