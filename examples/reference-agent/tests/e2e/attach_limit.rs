//! The plugin's attach limit (`max_volumes_per_node` of `NodeGetInfo`) through `serve`: a
//! claim that would attach one volume more than the plugin allows on the node is refused by
//! accounting, before any plugin call, naming the plugin, the node, the limit and the count.

use csi_agent::ops::api::{ClaimView, VolumeView};
use csi_client::Rpc;
use csi_testkit::MockPlugin;

use crate::serve::{cli, eventually, json, one_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_past_the_attach_limit_is_refused_until_a_volume_is_detached() {
    let mock = MockPlugin::builder()
        .max_volumes_per_node(1)
        .build()
        .expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    for id in ["v1", "v2"] {
        let _: VolumeView = json(&data, &["volume", "create", id, "--plugin", "mock"]).await;
    }
    let first: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(first.state, "taken");

    let publishes = mock.calls().count(Rpc::ControllerPublishVolume);
    let refused = cli(&data, &["volume", "claim", "v2", "--workload", "w2"])
        .await
        .expect_err("a second volume on a node that takes one");
    for part in [
        "plugin mock",
        "node",
        "allows 1 volume(s) per node",
        "1 of its volumes",
    ] {
        assert!(refused.contains(part), "{part:?} in: {refused}");
    }
    assert_eq!(
        mock.calls().count(Rpc::ControllerPublishVolume),
        publishes,
        "refused before any plugin call"
    );
    let v2: VolumeView = json(&data, &["volume", "status", "v2"]).await;
    assert!(v2.claims.is_empty(), "nothing recorded: {v2:?}");

    // Released and detached, v1 leaves its slot to v2.
    let _: VolumeView = json(&data, &["volume", "release", "v1", "--workload", "w1"]).await;
    eventually("v1's claim freed", async || {
        let v1: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v1.claims.is_empty().then_some(())
    })
    .await;
    let second: ClaimView = json(&data, &["volume", "claim", "v2", "--workload", "w2"]).await;
    assert_eq!(second.state, "taken");
}
