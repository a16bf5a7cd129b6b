//! Health is advice, not a gate, for clean-up (issue 20, point 5): a plugin whose `Probe`
//! hangs still gets its volumes released, and nothing is published through a plugin whose
//! health is not known to be good.

use std::path::Path;

use csi_agent::ops::api::{ClaimView, PluginView, VolumeView};
use csi_client::Rpc;
use csi_testkit::{FaultStep, MockPlugin};

use crate::serve::{Serve, cli, eventually, fast_backoff, json, ok_count, one_agent};

async fn mock_health(data: &Path) -> Option<String> {
    let list: Vec<PluginView> = json(data, &["plugin", "list"]).await;
    list.into_iter()
        .find(|p| p.id == "mock" && p.fingerprints >= 1)
        .map(|p| p.health)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_whose_probe_hangs_still_gets_its_volume_released() {
    let mock = MockPlugin::builder().build().expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let _: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let claim: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(claim.state, "taken");

    // From now on every Probe hangs: the agent's probe reaches its deadline and the plugin
    // turns unhealthy, on every attempt.
    mock.faults().on(Rpc::Probe).forever(FaultStep::Hang);
    eventually("the hung probe makes the plugin unhealthy", async || {
        mock_health(&data)
            .await
            .filter(|h| h == "unhealthy")
            .map(drop)
    })
    .await;

    let _: VolumeView = json(&data, &["volume", "release", "v1", "--workload", "w1"]).await;
    eventually(
        "the release finishes although the plugin is unhealthy",
        async || {
            let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
            v.claims.is_empty().then_some(())
        },
    )
    .await;
    assert_eq!(ok_count(&mock, Rpc::NodeUnpublishVolume), 1);
    assert_eq!(ok_count(&mock, Rpc::NodeUnstageVolume), 1);
    assert_eq!(ok_count(&mock, Rpc::ControllerUnpublishVolume), 1);
    assert!(mock.published().is_empty() && mock.staged().is_empty());
    assert_eq!(
        mock_health(&data).await.as_deref(),
        Some("unhealthy"),
        "the release did not wait for the plugin to recover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_while_the_plugin_s_health_is_not_known_to_be_good_is_refused() {
    let mock = MockPlugin::builder()
        .volume("ext-1", 1 << 20)
        .build()
        .expect("mock");
    let mut one = one_agent(&mock).await;
    let data = one.data.clone();
    let _: VolumeView = json(
        &data,
        &[
            "volume",
            "register",
            "v1",
            "--external-id",
            "ext-1",
            "--plugin",
            "mock",
        ],
    )
    .await;
    // The agent restarts while every Probe hangs: it fingerprints the plugin again, and its
    // health is unknown until the first probe's deadline, unhealthy after.
    one.agent.kill();
    mock.faults().on(Rpc::Probe).forever(FaultStep::Hang);
    let plugins = data.parent().expect("under the temp dir").join("plugins");
    one.agent = Serve::start(
        data.parent().expect("under the temp dir"),
        "restarted",
        &data,
        &fast_backoff(&plugins),
    );
    one.agent.ready().await;
    let health = eventually("fingerprinted again", async || mock_health(&data).await).await;
    assert_ne!(health, "healthy");

    let refused = cli(&data, &["volume", "claim", "v1", "--workload", "w1"])
        .await
        .expect_err("no claim while the plugin's health is not known to be good");
    assert!(
        refused.contains("plugin mock is not known to be healthy")
            && refused.contains("its health is ")
            && refused.contains("(class retry)"),
        "{refused}"
    );
    for rpc in [
        Rpc::ControllerPublishVolume,
        Rpc::NodeStageVolume,
        Rpc::NodePublishVolume,
    ] {
        assert_eq!(mock.calls().count(rpc), 0, "{rpc:?} was sent");
    }
    let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
    assert!(
        v.claims.is_empty(),
        "the refusal came before the claim: {v:?}"
    );

    // Once a probe answers ready, the same claim goes through.
    mock.faults().clear();
    mock.faults().release_hung();
    eventually("healthy once the probe answers", async || {
        mock_health(&data)
            .await
            .filter(|h| h == "healthy")
            .map(drop)
    })
    .await;
    let claim: ClaimView = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    assert_eq!(claim.state, "taken");
}
