//! One call in flight per volume: callers of one volume queue behind each other, within
//! their budgets, across every client sharing the turns; other volumes go meanwhile.

use std::sync::Arc;
use std::time::Duration;

use csi_client::{CallOptions, Code, CsiClient, ErrorClass, ErrorKind, Rpc, VolumeTurns, proto};

use crate::support::{Mock, fast_policies, guard};

fn publish(volume: &str, target: usize) -> proto::NodePublishVolumeRequest {
    proto::NodePublishVolumeRequest {
        volume_id: volume.into(),
        target_path: format!("/pods/p{target}/{volume}"),
        volume_capability: Some(proto::VolumeCapability {
            access_mode: Some(proto::volume_capability::AccessMode { mode: 5 }),
            access_type: Some(proto::volume_capability::AccessType::Mount(
                Default::default(),
            )),
        }),
        ..Default::default()
    }
}

/// A client that never retries NodePublishVolume, so an ABORTED answer shows in the result.
fn client(mock: &Mock, turns: Option<Arc<VolumeTurns>>) -> CsiClient {
    let mut table = fast_policies();
    table.update(Rpc::NodePublishVolume, |p| p.max_attempts = 1);
    let builder = CsiClient::builder(mock.endpoint())
        .policies(table)
        .retry_budget(Arc::new(csi_client::RetryBudget::unlimited()));
    match turns {
        Some(turns) => builder.volume_turns(turns),
        None => builder,
    }
    .build()
}

/// Runs `calls` NodePublishVolume calls of `vol-1` at once, alternating between `clients`,
/// with every call held 30 ms by the mock; returns how many the mock answered ABORTED.
async fn concurrent_publishes(mock: &Mock, clients: &[CsiClient], calls: usize) -> usize {
    mock.faults().clear();
    let mut script = mock.faults().on(Rpc::NodePublishVolume);
    for _ in 0..calls {
        script = script.then_delay(Duration::from_millis(30));
    }
    script.install();
    mock.plugin.calls().clear();
    let tasks: Vec<_> = (0..calls)
        .map(|i| {
            let node = clients[i % clients.len()].node();
            tokio::spawn(async move { node.node_publish_volume(publish("vol-1", i)).await })
        })
        .collect();
    let mut aborted = 0;
    for task in tasks {
        if let Err(e) = guard(task).await.expect("task")
            && e.code() == Some(Code::Aborted)
        {
            aborted += 1;
        }
    }
    assert_eq!(mock.count(Rpc::NodePublishVolume), calls, "each sent once");
    aborted
}

#[tokio::test]
async fn calls_about_one_volume_never_overlap_across_clients_sharing_turns() {
    let mock = Mock::default().await;
    let turns = Arc::new(VolumeTurns::new());
    let shared = [
        client(&mock, Some(turns.clone())),
        client(&mock, Some(turns.clone())),
    ];
    assert_eq!(concurrent_publishes(&mock, &shared, 6).await, 0);
    assert_eq!(turns.busy(), 0, "no turn is kept once the calls are done");
    // Clones share their client's turns too.
    let one = client(&mock, None);
    assert_eq!(concurrent_publishes(&mock, &[one.clone(), one], 6).await, 0);

    // Separate turns: the mock sees the calls overlap and refuses all but the first.
    let separate = [client(&mock, None), client(&mock, None)];
    assert!(concurrent_publishes(&mock, &separate, 6).await > 0);
}

#[tokio::test]
async fn waiting_for_a_busy_volume_ends_with_the_budget_and_sends_nothing() {
    let mock = Mock::default().await;
    mock.faults().on(Rpc::NodePublishVolume).hang().install();
    let client = client(&mock, None);
    let node = client.node();
    let hung = tokio::spawn(async move { node.node_publish_volume(publish("vol-1", 0)).await });
    assert!(
        crate::support::eventually(|| mock.count(Rpc::NodePublishVolume) == 1).await,
        "the first call reached the mock"
    );

    let short = CallOptions::new().total_budget(Duration::from_millis(100));
    let err = guard(
        client
            .node()
            .with_options(short)
            .node_publish_volume(publish("vol-1", 1)),
    )
    .await
    .expect_err("the volume stays busy");
    assert!(
        matches!(err.kind(), ErrorKind::VolumeBusy { budget } if *budget == Duration::from_millis(100)),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Retry);
    assert_eq!(err.attempts(), 0);
    assert!(err.to_string().contains("nothing was sent"), "{err}");
    assert_eq!(mock.count(Rpc::NodePublishVolume), 1, "nothing was sent");

    // Another volume does not wait for it.
    let other = guard(client.node().node_publish_volume(publish("vol-2", 2))).await;
    assert!(
        !matches!(&other, Err(e) if matches!(e.kind(), ErrorKind::VolumeBusy { .. })),
        "{other:?}"
    );
    assert_eq!(mock.count(Rpc::NodePublishVolume), 2);
    hung.abort();
}
