//! Volume health through `serve`: a plugin with `VOLUME_CONDITION` reports a published volume
//! abnormal; `volume status`, `status` and `/metrics` show it, and its recovery.

use csi_agent::ops::api::{StatusView, VolumeView};
use csi_testkit::MockPlugin;

use crate::serve::{cli, eventually, json, metrics, one_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abnormal_volume_is_shown_in_status_and_metrics_until_it_recovers() {
    let mock = MockPlugin::builder()
        .volume_condition()
        .build()
        .expect("mock");
    let one = one_agent(&mock).await;
    let data = one.data.clone();
    let v1: VolumeView = json(&data, &["volume", "create", "v1", "--plugin", "mock"]).await;
    let _: serde_json::Value = json(&data, &["volume", "claim", "v1", "--workload", "w1"]).await;
    // Polled as often as plugin health (5 s by default): usage shows up first.
    eventually("the volume's usage is polled", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v.health.filter(|h| h.bytes.is_some() && h.node.is_some())
    })
    .await;

    mock.set_volume_condition(&v1.external_id, true, "disk detached");
    let status = eventually("the volume is reported abnormal", async || {
        let s: StatusView = json(&data, &["status"]).await;
        (s.abnormal.len() == 2).then_some(s)
    })
    .await;
    assert!(
        status
            .abnormal
            .iter()
            .all(|a| a.volume == "v1" && a.message == "disk detached"),
        "{status:?}"
    );
    let shown = cli(&data, &["volume", "status", "v1"])
        .await
        .expect("status");
    assert!(
        shown.contains("health (node): ABNORMAL: disk detached"),
        "{shown}"
    );
    let page = metrics(&data);
    assert!(
        page.contains(r#"csi_agent_volume_abnormal{volume="v1",source="node"} 1"#),
        "{page}"
    );
    assert!(
        page.contains(r#"csi_agent_volume_bytes{volume="v1",kind="total"}"#),
        "{page}"
    );

    mock.clear_volume_condition(&v1.external_id);
    eventually("the volume recovers", async || {
        let s: StatusView = json(&data, &["status"]).await;
        s.abnormal.is_empty().then_some(())
    })
    .await;
    assert!(
        metrics(&data).contains(r#"csi_agent_volume_abnormal{volume="v1",source="controller"} 0"#)
    );
    assert!(one.agent.log().contains("volume reported abnormal"));
}
