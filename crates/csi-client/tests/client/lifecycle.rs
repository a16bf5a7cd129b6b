//! Connection lifecycle against the mock: a socket that appears late, a plugin that restarts.

use csi_client::{Code, Rpc};

use crate::support::{Mock, eventually, guard};

#[tokio::test]
async fn a_socket_that_appears_late_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let client = csi_client::CsiClient::new(csi_client::Endpoint::unix(&path).unwrap());
    let identity = client.identity();
    let call = tokio::spawn(async move { identity.get_plugin_info().await });
    // The client is dialling a socket that does not exist yet.
    assert!(eventually(|| client.connection().dial_attempts() >= 2).await);
    assert!(!call.is_finished());
    let plugin = crate::support::plugin();
    let server = plugin.serve_unix(&path).await.unwrap();
    let info = guard(call).await.unwrap().unwrap();
    assert_eq!(info.name.as_str(), "mock.csi.example");
    assert_eq!(plugin.calls().count(Rpc::GetPluginInfo), 1);
    guard(server.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_restarted_plugin_is_reconnected_transparently() {
    let mut mock = Mock::default().await;
    let client = mock.client(|_| {});
    guard(client.identity().get_plugin_info()).await.unwrap();
    let dials = client.connection().dial_attempts();

    mock.restart().await;
    guard(client.identity().get_plugin_info()).await.unwrap();
    assert!(
        client.connection().dial_attempts() > dials,
        "a new connection was dialled"
    );
    assert_eq!(mock.count(Rpc::GetPluginInfo), 2);
}

#[tokio::test]
async fn a_request_the_closed_connection_never_took_is_sent_on_the_new_one() {
    let mut mock = Mock::default().await;
    // One attempt only: if the request after the restart were lost with the old connection,
    // this mutating call would fail (uncertain) instead of succeeding.
    let client = mock.client(|table| table.update(Rpc::CreateVolume, |p| p.max_attempts = 1));
    let request = |name: &str| csi_client::proto::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![
            (&csi_structs::VolumeCapability::block(csi_structs::AccessMode::SingleNodeWriter))
                .into(),
        ],
        ..Default::default()
    };
    guard(client.controller().create_volume(request("pvc-before")))
        .await
        .unwrap();
    let dials = client.connection().dial_attempts();
    for round in 0..3 {
        mock.restart().await;
        let volume = guard(
            client
                .controller()
                .create_volume(request(&format!("pvc-{round}"))),
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert!(!volume.volume_id.as_str().is_empty());
    }
    assert_eq!(
        mock.count(Rpc::CreateVolume),
        4,
        "each request reached a plugin once"
    );
    assert_eq!(
        client.connection().dial_attempts(),
        dials + 3,
        "one dial per restart"
    );
}

#[tokio::test]
async fn a_plugin_restarting_mid_call_is_retried_on_the_new_socket() {
    let mut mock = Mock::default().await;
    let client = mock.client(|_| {});
    mock.faults().on(Rpc::NodeGetCapabilities).hang().install();
    let node = client.node();
    let call = tokio::spawn(async move { node.node_get_capabilities().await });
    let plugin = mock.plugin.clone();
    assert!(eventually(|| plugin.calls().count(Rpc::NodeGetCapabilities) == 1).await);

    // Shutdown ends the hung call (UNAVAILABLE or a broken connection), the client retries,
    // and the retry reaches the restarted plugin.
    mock.restart().await;
    let caps = guard(call).await.unwrap().unwrap();
    assert!(!caps.is_empty());
    assert_eq!(mock.count(Rpc::NodeGetCapabilities), 2);
}

#[tokio::test]
async fn a_missing_plugin_is_retry_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let options = csi_client::ConnectOptions {
        socket_wait: std::time::Duration::from_millis(50),
        ..csi_client::ConnectOptions::DEFAULT
    };
    let client = csi_client::CsiClient::builder(
        csi_client::Endpoint::unix(dir.path().join("none.sock")).unwrap(),
    )
    .connect_options(options)
    .policies(crate::support::fast_policies())
    .build();
    let err = guard(client.node().node_get_capabilities())
        .await
        .unwrap_err();
    assert_eq!(
        err.class(),
        csi_client::ErrorClass::RetryElsewhere,
        "{err:?}"
    );
    assert!(
        matches!(err.kind(), csi_client::ErrorKind::NotConnected(_)),
        "{err:?}"
    );
    assert_eq!(err.code(), None::<Code>);
    // Nothing was sent, so the client retried as far as the policy allows.
    assert_eq!(
        err.attempts(),
        client.policies().get(Rpc::NodeGetCapabilities).max_attempts
    );
}

#[tokio::test]
async fn a_plugin_down_for_a_while_is_waited_for_on_reconnect() {
    let mut mock = Mock::default().await;
    let client = mock.client(|_| {});
    guard(client.identity().get_plugin_info()).await.unwrap();
    mock.stop().await;

    let identity = client.identity();
    let call = tokio::spawn(async move { identity.get_plugin_info().await });
    // The channel is redialling a socket that is gone.
    let dials = client.connection().dial_attempts();
    assert!(eventually(|| client.connection().dial_attempts() >= dials + 2).await);
    assert!(!call.is_finished());

    mock.restart().await;
    let info = guard(call).await.unwrap().unwrap();
    assert_eq!(info.name.as_str(), "mock.csi.example");
}

#[tokio::test]
async fn a_plugin_gone_for_good_is_retry_elsewhere_after_the_wait() {
    let mut mock = Mock::default().await;
    let options = csi_client::ConnectOptions {
        socket_wait: std::time::Duration::from_millis(50),
        ..csi_client::ConnectOptions::DEFAULT
    };
    let client = csi_client::CsiClient::builder(mock.endpoint())
        .connect_options(options)
        .policies(crate::support::fast_policies())
        .build();
    guard(client.node().node_get_capabilities()).await.unwrap();
    mock.stop().await;
    let err = guard(client.node().node_get_capabilities())
        .await
        .unwrap_err();
    // The first attempt may still find the old connection closing (a lost connection); the
    // last one could not dial at all.
    assert_eq!(
        err.class(),
        csi_client::ErrorClass::RetryElsewhere,
        "{err:?}"
    );
    assert!(
        matches!(err.kind(), csi_client::ErrorKind::NotConnected(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_deadline_spent_redialling_a_missing_plugin_is_not_uncertain() {
    let mut mock = Mock::default().await;
    let client = mock.client(|table| {
        table.update(Rpc::NodeUnpublishVolume, |p| {
            p.max_attempts = 1;
            p.attempt_deadline = std::time::Duration::from_millis(200);
        })
    });
    guard(client.identity().get_plugin_info()).await.unwrap();
    mock.stop().await;
    // The link waits for the socket to come back (30 s by default) and the attempt deadline
    // ends the wait: nothing reached a plugin, so the mutating call is not "uncertain".
    let err = guard(client.node().node_unpublish_volume(
        csi_client::proto::NodeUnpublishVolumeRequest {
            volume_id: "vol-1".into(),
            target_path: "/pods/p1/vol-1".into(),
        },
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(err.kind(), csi_client::ErrorKind::NotConnected(_)),
        "{err:?}"
    );
    assert_eq!(
        err.class(),
        csi_client::ErrorClass::RetryElsewhere,
        "{err:?}"
    );
}
