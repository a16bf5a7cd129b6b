//! `volume expand` through `serve`: controller then node expansion where the volume is
//! published, the offline order (release, expand, node expansion at the next claim), a node
//! step that fails and is finished by running it again, and clear refusals.

use csi_agent::ops::api::{ClaimView, ExpandView, VolumeView};
use csi_client::{Code, Rpc};
use csi_testkit::capabilities::{CONTROLLER_IMPLEMENTED, NODE_IMPLEMENTED};
use csi_testkit::{ControllerCapability, MockPlugin, NodeCapability, VolumeExpansion};

use crate::serve::{cli, json, one_agent};
use crate::support::file_with_mode;

const MI: i64 = 1 << 20;

/// `volume expand ID --capacity C --json`.
async fn expand(data: &std::path::Path, id: &str, capacity: &str) -> Result<ExpandView, String> {
    let out = cli(
        data,
        &["volume", "expand", id, "--capacity", capacity, "--json"],
    )
    .await?;
    Ok(serde_json::from_str(&out).expect("an expand view"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_plugin_grows_a_published_volume_on_the_controller_and_the_node() {
    let mock = MockPlugin::builder().build().expect("mock (ONLINE)");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let dir = tempfile::tempdir().expect("temp dir");
    let secrets = file_with_mode(
        dir.path(),
        "v1.secrets",
        "[controller-expand]\ngrow-key=g\n[node-expand]\nresize-key=r\n",
        0o600,
    );
    let _: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--capacity",
            "1Mi",
            "--secrets-file",
            &secrets,
        ],
    )
    .await;
    let claim: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;

    let smaller = expand(&data, "v1", "1K").await.expect_err("shrinking");
    assert!(smaller.contains("volumes only grow"), "{smaller}");

    // The node expansion fails once: the controller step is done, the error says so, and
    // running the command again finishes it.
    mock.faults()
        .on(Rpc::NodeExpandVolume)
        .fail(Code::FailedPrecondition, "resize2fs failed")
        .install();
    let failed = expand(&data, "v1", "2Mi")
        .await
        .expect_err("node step fails");
    assert!(
        failed.contains("NodeExpandVolume")
            && failed.contains("ControllerExpandVolume already grew it to 2097152 bytes")
            && failed.contains("again"),
        "{failed}"
    );
    let done = expand(&data, "v1", "2Mi").await.expect("expanded");
    assert!(done.controller_expanded, "{done:?}");
    assert_eq!(done.nodes_expanded, std::slice::from_ref(&claim.node));
    assert!(!done.node_expansion_pending);
    assert_eq!(done.volume.capacity_bytes, Some(2 * MI));

    let calls = mock.calls();
    let grow = calls.last(Rpc::ControllerExpandVolume).expect("called");
    assert!(grow.request.contains("\"grow-key\""), "{}", grow.request);
    let resize = calls.last(Rpc::NodeExpandVolume).expect("called");
    assert!(
        resize.request.contains("\"resize-key\""),
        "{}",
        resize.request
    );
    let target = claim.target_path.expect("published here");
    assert!(
        resize.request.contains(&target),
        "at the target: {}",
        resize.request
    );

    let shown = cli(&data, &["volume", "expand", "v1", "--capacity", "3Mi"])
        .await
        .expect("expanded again");
    assert!(
        shown.contains("capacity: 3145728 bytes")
            && shown.contains("ControllerExpandVolume: done")
            && shown.contains(&format!("NodeExpandVolume: done on {}", claim.node)),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_plugin_expands_only_what_is_not_published() {
    let mock = MockPlugin::builder()
        .volume_expansion(Some(VolumeExpansion::Offline))
        .build()
        .expect("offline mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let _: VolumeView = json(
        &data,
        &[
            "volume",
            "create",
            "v1",
            "--plugin",
            "mock",
            "--capacity",
            "1Mi",
        ],
    )
    .await;
    let _: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    let refused = expand(&data, "v1", "2Mi")
        .await
        .expect_err("published, and the plugin expands offline only");
    assert!(
        refused.contains("offline only")
            && refused.contains("ONLINE")
            && refused.contains("release"),
        "{refused}"
    );
    assert_eq!(mock.calls().count(Rpc::ControllerExpandVolume), 0);

    let _: VolumeView = json(
        &data,
        &["volume", "release", "v1", "--workload", "w1", "--wait"],
    )
    .await;
    let done = expand(&data, "v1", "2Mi").await.expect("expanded offline");
    assert!(done.controller_expanded && done.nodes_expanded.is_empty());
    assert!(done.node_expansion_pending, "{done:?}");
    assert_eq!(mock.calls().count(Rpc::NodeExpandVolume), 0);

    // The next claim stages and publishes, then expands on the node (the spec's order).
    let _: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w2"]).await;
    let order = mock.calls().snapshot().without_discovery().rpcs();
    let publish = order
        .iter()
        .rposition(|r| *r == Rpc::NodePublishVolume)
        .expect("published");
    assert_eq!(
        order.get(publish + 1),
        Some(&Rpc::NodeExpandVolume),
        "{order:?}"
    );
    let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
    assert!(!v.node_expansion_pending, "{v:?}");
    assert_eq!(v.capacity_bytes, Some(2 * MI));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_cannot_expand_is_refused_naming_the_capabilities() {
    let mock = MockPlugin::builder()
        .controller_capabilities(
            CONTROLLER_IMPLEMENTED
                .iter()
                .copied()
                .filter(|c| *c != ControllerCapability::ExpandVolume),
        )
        .node_capabilities(
            NODE_IMPLEMENTED
                .iter()
                .copied()
                .filter(|c| *c != NodeCapability::ExpandVolume),
        )
        .volume_expansion(None)
        .build()
        .expect("mock without expansion");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let refused = expand(&data, "v1", "2Gi").await.expect_err("cannot expand");
    assert!(
        refused.contains("cannot expand")
            && refused.contains("controller EXPAND_VOLUME")
            && refused.contains("node EXPAND_VOLUME"),
        "{refused}"
    );
    assert_eq!(mock.calls().count(Rpc::ControllerExpandVolume), 0);
    let bad = cli(&data, &["volume", "expand", "v1", "--capacity", "lots"])
        .await
        .expect_err("not a size");
    assert!(bad.contains("--capacity"), "{bad}");
}
