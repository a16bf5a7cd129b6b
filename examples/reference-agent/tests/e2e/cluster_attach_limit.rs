//! The plugin's attach limit in cluster mode (feature `etcd`): each node's count covers every
//! volume of the shared store with claims on that node, and holds across the agent's restart
//! (read back from etcd), while another node's attachments do not count against it.

use csi_agent::ops::api::{ClaimView, VolumeView};
use csi_client::Rpc;
use csi_testkit::{MockPlugin, Role};

use super::cluster::{args, converged, node, start_etcd};
use super::serve::{Serve, cli, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_attach_limit_each_node_counts_its_own_attachments_across_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd();
    // One plugin on two nodes, each attaching at most one volume: a hosts the controller.
    let mock = MockPlugin::builder()
        .node_id("a-node")
        .other_node("b-node")
        .max_volumes_per_node(1)
        .build()
        .expect("mock");
    let mock_b = MockPlugin::builder()
        .role(Role::Node)
        .node_id("b-node")
        .max_volumes_per_node(1)
        .build()
        .expect("node mock");
    let a = node(dir.path(), "a", &etcd, &mock).await;
    let mut b = node(dir.path(), "b", &etcd, &mock_b).await;
    converged(&[&a, &b], 2).await;
    for id in ["v1", "v2", "v3"] {
        let _: VolumeView = json(&a.data, &["volume", "create", id, "--plugin", "mock"]).await;
    }

    let on_b: ClaimView = json(&b.data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(on_b.node, "b");
    let refused = cli(&b.data, &["volume", "claim", "v2", "--workload", "w2"])
        .await
        .expect_err("b attaches one volume");
    assert!(
        refused.contains("node b") && refused.contains("allows 1"),
        "{refused}"
    );
    // b's attachment does not count on a.
    let on_a: ClaimView = json(&a.data, &["volume", "claim", "v2", "--workload", "w2"]).await;
    assert_eq!(on_a.node, "a");

    // b restarts on its data directory: its count is read back from the shared store.
    assert_eq!(b.agent.terminate(), Some(0));
    let plugins = dir.path().join("b-plugins");
    b.agent = Serve::start(
        dir.path(),
        "b-again",
        &b.data,
        &args(dir.path(), "b", &etcd, &plugins),
    );
    b.agent.ready().await;
    converged(&[&a, &b], 2).await;
    let publishes = mock.calls().count(Rpc::ControllerPublishVolume);
    let refused = cli(&b.data, &["volume", "claim", "v3", "--workload", "w3"])
        .await
        .expect_err("v1 is still attached on b");
    assert!(
        refused.contains("plugin mock") && refused.contains("1 of its volumes"),
        "{refused}"
    );
    assert_eq!(mock.calls().count(Rpc::ControllerPublishVolume), publishes);
}
