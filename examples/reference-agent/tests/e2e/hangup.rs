//! A client that hangs up does not cancel its operation: `volume claim` times out on the
//! client side while the plugin holds `NodeStageVolume` (a frozen driver), the plugin
//! resumes, and the claim ends taken and published, as if the client had waited; the agent's
//! log says the caller hung up and how the claim ended, and claiming again answers the same.

use std::path::Path;

use csi_agent::ops::api::{ClaimView, VolumeView};
use csi_client::Rpc;
use csi_testkit::{MockPlugin, RecordedOutcome};

use crate::serve::{cli_within, eventually, json, one_agent};

/// `csi-agent volume claim <volume> --workload w1` giving up after 2 s: `Err(stderr)` when it
/// did (it must: the plugin holds the stage until the test resumes it).
async fn claim_giving_up(data: &Path, volume: &str) -> Result<String, String> {
    cli_within(data, &["volume", "claim", volume, "--workload", "w1"], "2s").await
}

/// Claims `volume` (created here) for `w1` through the agent at `data` with a client that
/// hangs up while `node_plugin` holds the `NodeStageVolume`, resumes the plugin, and checks
/// the end: the hang-up logged (`log`) with how the claim ended, then the claim taken and
/// published at the plugin at its target path, and the same answer to the same claim again.
async fn hang_up_during_a_held_stage(
    data: &Path,
    log: impl Fn() -> String,
    node_plugin: &MockPlugin,
    volume: &str,
) {
    let _: VolumeView = json(data, &["volume", "create", volume, "--plugin", "mock"]).await;
    node_plugin.faults().on(Rpc::NodeStageVolume).hold();
    let client = {
        let (data, volume) = (data.to_owned(), volume.to_owned());
        tokio::spawn(async move { claim_giving_up(&data, &volume).await })
    };
    eventually("the plugin holds the stage", async || {
        node_plugin
            .calls()
            .of(Rpc::NodeStageVolume)
            .records()
            .iter()
            .any(|r| r.outcome == RecordedOutcome::InFlight)
            .then_some(())
    })
    .await;
    let gave_up = client
        .await
        .expect("the client task does not panic")
        .expect_err("the client gives up while the stage is held");
    assert!(
        gave_up.contains("did not answer within 2s") && gave_up.contains("runs on to its end"),
        "{gave_up}"
    );
    // The client is gone; the driver comes back.
    node_plugin.faults().resume_held();

    // The claim's end is logged once it has ended, with the hang-up.
    eventually("the hang-up is logged with how it ended", async || {
        log()
            .lines()
            .any(|l| {
                l.contains("the caller hung up")
                    && l.contains("operation=\"claim\"")
                    && l.contains(&format!("volume={volume}"))
                    && l.contains("outcome=\"done\"")
            })
            .then_some(())
    })
    .await;

    let v: VolumeView = json(data, &["volume", "status", volume]).await;
    let [claim] = v.claims.as_slice() else {
        panic!("one claim: {v:?}");
    };
    assert_eq!(
        (claim.workload.as_str(), claim.state.as_str()),
        ("w1", "taken")
    );
    let target = claim.target_path.clone().expect("published on this node");
    assert!(
        node_plugin
            .published()
            .iter()
            .any(|p| p.path == Path::new(&target)),
        "published at the plugin at {target}: {:?}",
        node_plugin.published()
    );
    assert!(
        node_plugin
            .calls()
            .of(Rpc::NodeStageVolume)
            .records()
            .iter()
            .all(|r| r.outcome == RecordedOutcome::Ok),
        "the held stage was served, not abandoned"
    );

    // Asking again: the same claim, the same target path.
    let again: ClaimView = json(data, &["volume", "claim", volume, "--workload", "w1"]).await;
    assert_eq!(
        (again.state.as_str(), again.target_path.as_deref()),
        ("taken", Some(target.as_str()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_client_hung_up_during_a_held_stage_ends_taken_and_published() {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    hang_up_during_a_held_stage(&one.data, || one.agent.log(), &mock, "v3").await;
}

/// The same in cluster mode (feature `etcd`): two agents on one etcd, the claim made on b,
/// whose node plugin holds the stage; a hosts the controller.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_claim_whose_client_hung_up_during_a_held_stage_ends_taken_and_published() {
    use crate::cluster::{converged, node, start_etcd};
    use csi_testkit::Role;

    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = start_etcd();
    let mock_a = MockPlugin::builder()
        .node_id("a-node")
        .other_node("b-node")
        .build()
        .expect("mock");
    let mock_b = MockPlugin::builder()
        .role(Role::Node)
        .node_id("b-node")
        .build()
        .expect("node mock");
    let a = node(dir.path(), "a", &etcd, &mock_a).await;
    let b = node(dir.path(), "b", &etcd, &mock_b).await;
    converged(&[&a, &b], 2).await;
    hang_up_during_a_held_stage(&b.data, || b.agent.log(), &mock_b, "v3").await;
    assert_eq!(
        mock_a.published_nodes(
            &json::<VolumeView>(&b.data, &["volume", "status", "v3"])
                .await
                .external_id
        ),
        vec!["b-node".to_owned()],
        "controller-published to b by a's controller"
    );
}
