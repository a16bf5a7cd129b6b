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
    // Eight callers: a client opens a second connection only for a request that finds eight
    // already in flight on the first, so every dial counted here is the first connection's.
    for _ in 0..8 {
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
    assert_eq!(server.seen.authorities.lock().unwrap().len(), 8);
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
                .any(|r| r.outcome == csi_testkit::RecordedOutcome::Abandoned)
        })
        .await
        .unwrap();
    assert_eq!(
        mock.count(csi_client::Rpc::NodeGetInfo),
        1,
        "no further attempt after the drop"
    );
}
