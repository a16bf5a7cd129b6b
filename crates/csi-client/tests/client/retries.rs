//! The retry and deadline policy against the mock plugin: attempts, fatal codes, Probe,
//! hung plugins, budgets, and the class of every outcome.

use std::sync::Arc;
use std::time::Duration;

use csi_client::{Code, DeadlineScope, ErrorClass, ErrorKind, RetryBudget, Rpc, proto};

use crate::support::{Mock, guard, mount_capability};

fn publish_request() -> proto::NodePublishVolumeRequest {
    proto::NodePublishVolumeRequest {
        volume_id: "vol-1".into(),
        staging_target_path: "/staging/vol-1".into(),
        target_path: "/pods/p1/vol-1".into(),
        volume_capability: Some(mount_capability()),
        ..Default::default()
    }
}

#[tokio::test]
async fn transient_failures_are_retried_until_success() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetCapabilities)
        .fail_times(2, Code::Unavailable, "busy")
        .install();
    let client = mock.client(|_| {});
    let caps = guard(client.node().node_get_capabilities()).await.unwrap();
    assert!(!caps.is_empty());
    assert_eq!(mock.count(Rpc::NodeGetCapabilities), 3);
}

#[tokio::test]
async fn retries_stop_at_the_configured_attempts() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetCapabilities)
        .fail_times(20, Code::Unavailable, "busy")
        .install();
    let client = mock.client(|t| t.update(Rpc::NodeGetCapabilities, |p| p.max_attempts = 4));
    let err = guard(client.node().node_get_capabilities())
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 4);
    assert_eq!(err.code(), Some(Code::Unavailable));
    assert_eq!(err.class(), ErrorClass::Retry);
    assert_eq!(mock.count(Rpc::NodeGetCapabilities), 4);

    // A per-call override wins over the table.
    let err = guard(
        client
            .node()
            .with_options(csi_client::CallOptions::new().max_attempts(2))
            .node_get_capabilities(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.attempts(), 2);
    assert_eq!(mock.count(Rpc::NodeGetCapabilities), 6);
}

#[tokio::test]
async fn fatal_codes_are_never_retried() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    for (code, class) in [
        (Code::InvalidArgument, ErrorClass::Fatal),
        (Code::Unimplemented, ErrorClass::Fatal),
        (Code::AlreadyExists, ErrorClass::Fatal),
    ] {
        let before = mock.count(Rpc::NodePublishVolume);
        mock.faults()
            .on(Rpc::NodePublishVolume)
            .fail_times(5, code, "no")
            .install();
        let err = guard(client.node().node_publish_volume(publish_request()))
            .await
            .unwrap_err();
        assert_eq!(
            (err.code(), err.class(), err.attempts()),
            (Some(code), class, 1),
            "{err}"
        );
        assert_eq!(
            mock.count(Rpc::NodePublishVolume),
            before + 1,
            "{code:?} was retried"
        );
        assert_eq!(err.volume_id().map(|v| v.as_str()), Some("vol-1"));
        mock.faults().clear();
    }
}

#[tokio::test]
async fn probe_is_never_retried() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::Probe)
        .fail_times(5, Code::Unavailable, "starting")
        .install();
    let client = mock.client(|_| {});
    let err = guard(client.identity().probe()).await.unwrap_err();
    assert_eq!(err.attempts(), 1);
    assert_eq!(mock.count(Rpc::Probe), 1);

    // Not even when the table and the call ask for more attempts.
    let eager = mock.client(|t| {
        t.update(Rpc::Probe, |p| {
            p.max_attempts = 5;
            p.retry_codes = csi_client::CodeSet::of(&[Code::Unavailable]);
            p.retry_uncertain = true;
        })
    });
    let err = guard(
        eager
            .identity()
            .with_options(csi_client::CallOptions::new().max_attempts(5))
            .probe(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.attempts(), 1);
    assert_eq!(mock.count(Rpc::Probe), 2);

    mock.faults().clear();
    mock.faults()
        .on(Rpc::Probe)
        .fail(Code::FailedPrecondition, "dependency missing")
        .install();
    let err = guard(client.identity().probe()).await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::RetryElsewhere);
}

#[tokio::test]
async fn a_hung_plugin_hits_the_attempt_deadline() {
    let mock = Mock::default().await;
    mock.faults().on(Rpc::NodeGetInfo).hang().hang().install();
    let client = mock.client(|t| {
        t.update(Rpc::NodeGetInfo, |p| {
            p.attempt_deadline = Duration::from_millis(200);
            p.max_attempts = 2;
        })
    });
    // Connect first, so a slow dial on a busy machine cannot eat the short deadline.
    guard(client.identity().get_plugin_info()).await.unwrap();
    let err = guard(client.node().node_get_info()).await.unwrap_err();
    let elapsed = err.timeout().expect("our own deadline, not a status code");
    assert_eq!(elapsed.scope(), DeadlineScope::Attempt);
    assert_eq!(elapsed.limit(), Duration::from_millis(200));
    assert_eq!(err.attempts(), 2);
    // NodeGetInfo changes nothing: a timeout is a plain retry.
    assert_eq!(err.class(), ErrorClass::Retry);
    assert_eq!(err.code(), None);
}

#[tokio::test]
async fn a_deadline_on_node_publish_is_uncertain() {
    let mock = Mock::default().await;
    mock.faults().on(Rpc::NodePublishVolume).hang().install();
    let client = mock.client(|_| {});
    let opts = csi_client::CallOptions::new()
        .attempt_deadline(Duration::from_millis(200))
        .max_attempts(1);
    // Connect first, so a slow dial on a busy machine cannot eat the short deadline.
    guard(client.identity().get_plugin_info()).await.unwrap();
    let err = guard(
        client
            .node()
            .with_options(opts)
            .node_publish_volume(publish_request()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Timeout(_)), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Uncertain);
    assert_eq!(err.volume_id().map(|v| v.as_str()), Some("vol-1"));
    assert!(err.to_string().contains("NodePublishVolume"), "{err}");
}

#[tokio::test]
async fn the_total_budget_bounds_all_attempts() {
    let mock = Mock::default().await;
    let mut script = mock.faults().on(Rpc::NodeGetInfo);
    for _ in 0..50 {
        script = script.hang();
    }
    script.install();
    let client = mock.client(|t| {
        t.update(Rpc::NodeGetInfo, |p| {
            p.attempt_deadline = Duration::from_millis(100);
            p.total_budget = Duration::from_millis(250);
            p.max_attempts = 50;
        })
    });
    // Connect first, so a slow dial on a busy machine cannot eat the short deadline.
    guard(client.identity().get_plugin_info()).await.unwrap();
    let err = guard(client.node().node_get_info()).await.unwrap_err();
    assert!(err.timeout().is_some(), "{err:?}");
    assert!(
        err.attempts() < 50,
        "the total budget did not stop the retries: {err}"
    );
}

#[tokio::test]
async fn not_found_on_node_unpublish_is_already_done() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeUnpublishVolume)
        .fail(Code::NotFound, "no such volume")
        .install();
    let client = mock.client(|_| {});
    let req = proto::NodeUnpublishVolumeRequest {
        volume_id: "vol-1".into(),
        target_path: "/pods/p1/vol-1".into(),
    };
    let err = guard(client.node().node_unpublish_volume(req))
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::AlreadyDone);
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.message(), Some("no such volume"));
}

#[tokio::test]
async fn a_shared_budget_stops_a_retry_storm() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetCapabilities)
        .fail_times(100, Code::Unavailable, "down")
        .install();
    let mut table = crate::support::fast_policies();
    table.update(Rpc::NodeGetCapabilities, |p| p.max_attempts = 10);
    let client = csi_client::CsiClient::builder(mock.endpoint())
        .policies(table)
        .retry_budget(Arc::new(RetryBudget::new(2, 0.0, 0.0)))
        .build();
    let first = guard(client.node().node_get_capabilities())
        .await
        .unwrap_err();
    assert_eq!(first.attempts(), 3, "two retries from the budget");
    assert!(first.retry_budget_exhausted());
    let second = guard(client.node().node_get_capabilities())
        .await
        .unwrap_err();
    assert_eq!(second.attempts(), 1, "the budget is empty: no retry");
    assert!(second.retry_budget_exhausted());
    assert_eq!(mock.count(Rpc::NodeGetCapabilities), 4);
}

#[tokio::test]
async fn a_dropped_connection_on_a_mutation_is_uncertain_and_on_a_read_is_retried() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    mock.faults()
        .on(Rpc::NodePublishVolume)
        .drop_connection()
        .install();
    let opts = csi_client::CallOptions::new().max_attempts(1);
    let err = guard(
        client
            .node()
            .with_options(opts)
            .node_publish_volume(publish_request()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Uncertain, "{err:?}");
    assert!(
        matches!(err.kind(), ErrorKind::ConnectionLost { .. }),
        "{err:?}"
    );

    mock.faults()
        .on(Rpc::NodeGetCapabilities)
        .drop_connection()
        .install();
    guard(client.node().node_get_capabilities()).await.unwrap();
    assert_eq!(mock.count(Rpc::NodeGetCapabilities), 2);
}
