//! The calls in flight: a call that hangs is listed with its RPC, volume, attempt and
//! deadline while it waits, in the list the embedder gave the client, and leaves the list
//! when it ends or is dropped.

use std::sync::Arc;
use std::time::Duration;

use csi_client::{CallsInFlight, CsiClient, Rpc, Waiting, proto};
use csi_structs::ExternalVolumeId;

use crate::support::{Mock, eventually, fast_policies, guard, mount_capability};

fn stage(volume: &str) -> proto::NodeStageVolumeRequest {
    proto::NodeStageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: format!("/staging/{volume}"),
        volume_capability: Some(mount_capability()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_hanging_call_is_listed_with_its_rpc_volume_attempt_and_deadline() {
    let mock = Mock::default().await;
    mock.faults().on(Rpc::NodeStageVolume).hang().install();
    let calls = Arc::new(CallsInFlight::new());
    let mut table = fast_policies();
    table.update(Rpc::NodeStageVolume, |p| {
        p.attempt_deadline = Duration::from_secs(90);
        p.total_budget = Duration::from_secs(300);
    });
    let client = CsiClient::builder(mock.endpoint())
        .policies(table)
        .calls_in_flight(Arc::clone(&calls))
        .build();
    assert!(Arc::ptr_eq(client.calls_in_flight(), &calls));

    let node = client.node();
    let call = tokio::spawn(async move { node.node_stage_volume(stage("vol-1")).await });
    assert!(
        eventually(|| calls
            .list()
            .first()
            .is_some_and(|c| c.waiting == Waiting::Answer))
        .await,
        "the hanging call was never listed as waiting for the answer"
    );
    let listed = calls.list();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let hanging = &listed[0];
    assert_eq!(hanging.rpc, Rpc::NodeStageVolume);
    assert_eq!(hanging.volume.as_ref().map(|v| v.as_str()), Some("vol-1"));
    assert_eq!(hanging.attempt, 1);
    assert!(hanging.max_attempts >= 1);
    assert_eq!(hanging.attempt_deadline, Duration::from_secs(90));
    let text = hanging.to_string();
    assert!(
        text.starts_with(
            "NodeStageVolume volume vol-1: waiting for the plugin's answer, attempt 1 of "
        ) && text.contains("(deadline 1m30s)")
            && text.ends_with(" so far"),
        "{text}"
    );
    let volume = ExternalVolumeId::new("vol-1").unwrap();
    assert_eq!(calls.for_volume(&volume).len(), 1);

    // A dropped call leaves the list.
    call.abort();
    let _ = call.await;
    assert!(guard(async { eventually(|| calls.is_empty()).await }).await);
    mock.faults().release_hung();

    // An ended one too.
    mock.faults().clear();
    let ended = guard(client.identity().get_plugin_info()).await;
    assert!(ended.is_ok(), "{ended:?}");
    assert!(calls.is_empty(), "{:?}", calls.list());
}
