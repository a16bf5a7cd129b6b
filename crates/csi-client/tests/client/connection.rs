//! The connection: `:authority`, `grpc-timeout`, one dial under concurrent first use.

use std::time::Duration;

use csi_client::{CsiClient, Endpoint, Readiness};

use crate::support::{TinyServer, guard};

fn client_for(path: &std::path::Path) -> CsiClient {
    CsiClient::new(Endpoint::unix(path).expect("test invariant: temp paths are short and absolute"))
}

#[tokio::test]
async fn authority_is_localhost_and_deadline_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.sock");
    let server = TinyServer::start(&path);
    let client = client_for(&path);
    let ready = guard(client.identity().probe()).await.unwrap();
    assert_eq!(ready, Readiness::Ready);
    let authorities = server.seen.authorities.lock().unwrap().clone();
    assert_eq!(authorities, ["localhost"]);
    let timeouts = server.seen.timeouts.lock().unwrap().clone();
    assert_eq!(timeouts.len(), 1);
    let header = timeouts[0].clone().expect("grpc-timeout header is sent");
    // The unit is one of tonic's (n, u, m, S, M, H); the value is positive and at most the 5 s
    // probe deadline.
    let (value, unit) = header.split_at(header.len() - 1);
    let value: u64 = value.parse().unwrap();
    let nanos = match unit {
        "n" => value,
        "u" => value * 1_000,
        "m" => value * 1_000_000,
        "S" => value * 1_000_000_000,
        other => panic!("unexpected grpc-timeout unit {other:?}"),
    };
    assert!(
        nanos > 0 && nanos <= Duration::from_secs(5).as_nanos() as u64,
        "{header}"
    );
    server.stop().await;
}

#[tokio::test]
async fn concurrent_first_use_dials_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.sock");
    let server = TinyServer::start(&path);
    let client = client_for(&path);
    assert!(!client.connection().is_connected());
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let identity = client.identity();
        tasks.push(tokio::spawn(
            async move { identity.get_plugin_info().await },
        ));
    }
    for t in tasks {
        let info = guard(t).await.unwrap().unwrap();
        assert_eq!(info.name.as_str(), "tiny.example.com");
    }
    assert_eq!(client.connection().dial_attempts(), 1);
    assert_eq!(server.seen.authorities.lock().unwrap().len(), 16);
    server.stop().await;
}

#[tokio::test]
async fn tcp_endpoints_reach_a_local_proxy() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = TinyServer::start_tcp(listener);
    let endpoint: Endpoint = format!("tcp://127.0.0.1:{port}").parse().unwrap();
    let client = CsiClient::new(endpoint);
    let info = guard(client.identity().get_plugin_info()).await.unwrap();
    assert_eq!(info.name.as_str(), "tiny.example.com");
    assert_eq!(
        server.seen.authorities.lock().unwrap().clone(),
        [format!("127.0.0.1:{port}")]
    );
    server.stop().await;
}

#[tokio::test]
async fn dropping_the_future_cancels_the_call() {
    let mock = crate::support::Mock::default().await;
    mock.faults()
        .on(csi_client::Rpc::NodeGetInfo)
        .hang()
        .install();
    let client = mock.client(|_| {});
    let node = client.node();
    let call = tokio::spawn(async move { node.node_get_info().await });
    let calls = mock.plugin.calls();
    calls
        .wait_for(Duration::from_secs(30), |log| {
            log.count(csi_client::Rpc::NodeGetInfo) == 1
        })
        .await
        .unwrap();
    call.abort();
    // The plugin sees the stream reset and records the call as abandoned by the caller.
    calls
        .wait_for(Duration::from_secs(30), |log| {
            log.of(csi_client::Rpc::NodeGetInfo)
                .records()
                .iter()
                .any(|r| r.outcome == csi_testkit::Outcome::Abandoned)
        })
        .await
        .unwrap();
    assert_eq!(
        mock.count(csi_client::Rpc::NodeGetInfo),
        1,
        "no further attempt after the drop"
    );
}

#[tokio::test]
async fn spans_name_the_call_and_never_a_secret() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("csi_client=trace"))
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let mock = crate::support::Mock::default().await;
    mock.faults()
        .on(csi_client::Rpc::NodeStageVolume)
        .fail(csi_client::Code::Internal, "backend hiccup")
        .install();
    let client =
        mock.client(|t| t.update(csi_client::Rpc::NodeStageVolume, |p| p.max_attempts = 1));
    let mut req = csi_client::proto::NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        staging_target_path: "/staging/vol-1".into(),
        volume_capability: Some(csi_client::proto::VolumeCapability {
            access_mode: Some(csi_client::proto::volume_capability::AccessMode { mode: 1 }),
            access_type: Some(csi_client::proto::volume_capability::AccessType::Block(
                Default::default(),
            )),
        }),
        ..Default::default()
    };
    req.secrets
        .insert("password".into(), "hunter2-secret".into());
    let err = guard(client.node().node_stage_volume(req))
        .await
        .unwrap_err();
    assert_eq!(err.class(), csi_client::ErrorClass::Uncertain);

    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("csi.call"), "{text}");
    assert!(
        text.contains("rpc=\"NodeStageVolume\"") || text.contains("rpc=NodeStageVolume"),
        "{text}"
    );
    assert!(text.contains("vol-1"), "{text}");
    assert!(text.contains("Internal"), "{text}");
    assert!(
        !text.contains("hunter2"),
        "a secret reached the logs: {text}"
    );
}
