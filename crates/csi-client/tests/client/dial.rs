//! Endpoints that can never be dialled: refused where they are made, or failing at the first
//! attempt of a call; a socket that is merely not there yet is still waited for.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use csi_client::{
    AttemptEvent, CallObserver, CsiClient, Endpoint, EndpointError, EndpointFault, ErrorClass,
    ErrorKind, Rpc, proto,
};

use crate::support::{TinyServer, eventually, guard};

/// Counts attempts and keeps their labels.
#[derive(Debug, Default)]
struct Attempts {
    count: AtomicU32,
    labels: Mutex<Vec<&'static str>>,
}

impl CallObserver for Attempts {
    fn on_attempt(&self, event: &AttemptEvent) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.labels.lock().unwrap().push(event.outcome.label());
    }
}

fn expand() -> proto::ControllerExpandVolumeRequest {
    proto::ControllerExpandVolumeRequest {
        volume_id: "vol-1".into(),
        capacity_range: Some(proto::CapacityRange {
            required_bytes: 2 << 30,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

/// A ControllerExpandVolume call (the mutation row: several attempts, long backoff) on
/// `path` with the default policies, as a new user would make it.
async fn expand_at(path: &Path) -> (csi_client::Error, CsiClient, Arc<Attempts>) {
    let endpoint = Endpoint::unix(path).expect("test invariant: temp paths are short");
    let attempts = Arc::new(Attempts::default());
    let client = CsiClient::builder(endpoint)
        .observer(Arc::clone(&attempts) as Arc<dyn CallObserver>)
        .build();
    assert!(
        client
            .policies()
            .get(Rpc::ControllerExpandVolume)
            .max_attempts
            > 1,
        "the row would retry a failure it retries"
    );
    let err = guard(client.controller().controller_expand_volume(expand()))
        .await
        .expect_err("nothing listens there");
    (err, client, attempts)
}

fn assert_ends_at_once(
    err: &csi_client::Error,
    client: &CsiClient,
    attempts: &Attempts,
    fault: EndpointFault,
    path: &Path,
) {
    assert_eq!(err.attempts(), 1, "{err}");
    assert_eq!(attempts.count.load(Ordering::Relaxed), 1, "{err}");
    assert_eq!(
        attempts.labels.lock().unwrap().as_slice(),
        ["bad_endpoint"],
        "{err}"
    );
    assert_eq!(
        client.connection().dial_attempts(),
        1,
        "no wait for a socket: {err}"
    );
    assert_eq!(err.class(), ErrorClass::Fatal, "{err}");
    match err.kind() {
        ErrorKind::BadEndpoint(connect) => {
            assert_eq!(connect.fault(), Some(fault), "{err}");
            assert_eq!(connect.endpoint(), format!("unix://{}", path.display()));
        }
        other => panic!("expected a bad endpoint, got {other:?}"),
    }
    let text = err.to_string();
    for part in [
        "ControllerExpandVolume",
        &format!("unix://{}", path.display()),
        "fatal",
        "1 attempt)",
    ] {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_fails_in_one_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    std::fs::write(&path, b"not a socket").unwrap();
    let (err, client, attempts) = expand_at(&path).await;
    assert_ends_at_once(&err, &client, &attempts, EndpointFault::NotASocket, &path);
    assert!(err.to_string().contains("not a socket"), "{err}");
}

#[tokio::test]
async fn a_directory_fails_in_one_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let (err, client, attempts) = expand_at(dir.path()).await;
    assert_ends_at_once(
        &err,
        &client,
        &attempts,
        EndpointFault::NotASocket,
        dir.path(),
    );
}

#[tokio::test]
async fn a_path_through_a_file_fails_in_one_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plugin");
    std::fs::write(&file, b"").unwrap();
    let path = file.join("csi.sock");
    let (err, client, attempts) = expand_at(&path).await;
    assert_ends_at_once(
        &err,
        &client,
        &attempts,
        EndpointFault::NotADirectory,
        &path,
    );
}

#[tokio::test]
async fn malformed_endpoints_are_refused_where_they_are_made() {
    assert_eq!(Endpoint::unix(""), Err(EndpointError::Empty));
    assert_eq!("".parse::<Endpoint>(), Err(EndpointError::Empty));
    for relative in ["csi.sock", "./run/csi.sock"] {
        let err = Endpoint::unix(relative).expect_err("a relative path");
        assert!(
            matches!(&err, EndpointError::RelativePath { path, .. } if path == relative),
            "{err:?}"
        );
        assert!(err.to_string().contains("not absolute"), "{err}");
    }
    let err = "unix://run/csi.sock".parse::<Endpoint>().unwrap_err();
    assert!(
        err.to_string().contains("\"run/csi.sock\" is not absolute"),
        "{err}"
    );
    let long = format!("/{}.sock", "a".repeat(200));
    let err = Endpoint::unix(&long).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("endpoint {long:?}: unix socket path is 206 bytes, the limit is 107")
    );
    let err = Endpoint::tcp("localhost", 0).unwrap_err();
    assert!(err.to_string().contains("port \"0\""), "{err}");
}

#[tokio::test]
async fn a_stale_socket_is_waited_for_like_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    // A socket file nobody listens on: a plugin that exited and will be back.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let client = CsiClient::new(Endpoint::unix(&path).unwrap());
    let identity = client.identity();
    let call = tokio::spawn(async move { identity.get_plugin_info().await });
    assert!(eventually(|| client.connection().dial_attempts() >= 2).await);
    assert!(!call.is_finished(), "still waiting for the plugin");
    std::fs::remove_file(&path).unwrap();
    let server = TinyServer::start(&path);
    let info = guard(call).await.unwrap().unwrap();
    assert_eq!(info.name.as_str(), "tiny.example.com");
    server.stop().await;
}

#[tokio::test]
async fn a_stale_socket_that_stays_is_retry_elsewhere_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let client = CsiClient::builder(Endpoint::unix(&path).unwrap())
        .connect_options(csi_client::ConnectOptions {
            socket_wait: std::time::Duration::from_millis(20),
            ..csi_client::ConnectOptions::DEFAULT
        })
        .policies(crate::support::fast_policies())
        .build();
    let err = guard(client.node().node_get_capabilities())
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::RetryElsewhere, "{err}");
    assert!(
        matches!(err.kind(), ErrorKind::NotConnected(c) if c.fault().is_none()),
        "{err:?}"
    );
    assert_eq!(
        err.attempts(),
        client.policies().get(Rpc::NodeGetCapabilities).max_attempts,
        "retried as far as the policy allows"
    );
}
