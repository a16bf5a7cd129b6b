//! The unix socket transport: permissions, endpoint text, stale sockets, refusing to delete
//! other files, removal on shutdown and on drop, a late socket; and the in-memory transport.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;

use csi_proto::v1::ProbeRequest;
use csi_proto::v1::identity_client::IdentityClient;
use csi_testkit::{Error, MockPlugin, Quirk};

use crate::support::*;

fn plugin() -> MockPlugin {
    MockPlugin::builder().build().unwrap()
}

#[tokio::test]
async fn socket_is_private_and_named_by_an_absolute_endpoint() {
    let h = start_default().await;
    let path = h.server.socket_path().unwrap().to_path_buf();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // The socket was bound in a private directory and moved into place: nothing is left
    // beside it (the spec forbids extra files next to the socket).
    let beside: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name.to_string_lossy().starts_with(".csi-mock-bind-"))
        .collect();
    assert!(beside.is_empty(), "left behind: {beside:?}");
    // It still answers on the final path.
    let mut identity = IdentityClient::new(h.server.channel().await.unwrap());
    identity.probe(ProbeRequest {}).await.unwrap();
    assert_eq!(h.server.endpoint(), format!("unix://{}", path.display()));
    assert!(h.server.endpoint().starts_with("unix:///"));
    h.server.shutdown().await.unwrap();
    assert!(!path.exists(), "shutdown removes the socket");
}

#[tokio::test]
async fn dropping_the_handle_stops_the_server_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("drop.sock");
    let server = plugin().serve_unix(&path).await.unwrap();
    let mut identity = IdentityClient::new(server.channel().await.unwrap());
    identity.probe(ProbeRequest {}).await.unwrap();
    drop(server);
    assert!(!path.exists());
    // Nothing answers any more: a new connection is refused.
    assert!(csi_testkit::transport::connect_unix(&path).await.is_err());
}

#[tokio::test]
async fn a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    // A crashed run leaves its socket file behind with nothing listening.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let server = plugin()
        .serve_unix(&path)
        .await
        .expect("the stale socket is removed");
    let mut identity = IdentityClient::new(server.channel().await.unwrap());
    identity
        .probe(ProbeRequest {})
        .await
        .expect("served on the fresh socket");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_live_socket_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.sock");
    let first = plugin().serve_unix(&path).await.unwrap();
    let err = plugin().serve_unix(&path).await.unwrap_err();
    assert!(matches!(err, Error::SocketInUse { .. }), "{err}");
    let mut identity = IdentityClient::new(first.channel().await.unwrap());
    identity
        .probe(ProbeRequest {})
        .await
        .expect("the first server still answers");
    first.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_regular_file_is_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.sock");
    std::fs::write(&path, b"precious").unwrap();
    let err = plugin().serve_unix(&path).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotASocket {
                kind: "regular file",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("refusing to delete"));
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    let missing = dir.path().join("no-such-dir").join("csi.sock");
    let err = plugin().serve_unix(&missing).await.unwrap_err();
    assert!(matches!(err, Error::SocketDirMissing { .. }), "{err}");
}

#[tokio::test]
async fn a_late_socket_appears_after_the_delay() {
    let dir = tempfile::tempdir().unwrap();
    // Far in the future: the socket must not exist right after start-up.
    let never = dir.path().join("never.sock");
    let plugin = MockPlugin::builder()
        .quirk(Quirk::LateSocket(Duration::from_secs(3600)))
        .build()
        .unwrap();
    let server = plugin.serve_unix(&never).await.unwrap();
    assert!(!server.is_bound() && !never.exists());
    server
        .shutdown()
        .await
        .expect("a pending late socket shuts down cleanly");
    assert!(!never.exists());

    let late = dir.path().join("late.sock");
    let plugin = MockPlugin::builder()
        .quirk(Quirk::LateSocket(Duration::from_millis(20)))
        .build()
        .unwrap();
    let server = plugin.serve_unix(&late).await.unwrap();
    let mut identity = IdentityClient::new(server.lazy_channel().await.unwrap());
    let ready = tokio::time::timeout(GUARD, async {
        loop {
            if let Ok(probe) = identity.probe(ProbeRequest {}).await {
                return probe.into_inner();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the socket appears");
    assert_eq!(ready.ready, Some(true));
    assert!(server.is_bound());
    server.shutdown().await.unwrap();
    assert!(!late.exists());
}

#[tokio::test]
async fn in_memory_channels_reach_the_same_plugin() {
    let plugin = plugin();
    let (server, channel) = plugin.serve_in_memory().await.unwrap();
    assert!(server.socket_path().is_none());
    IdentityClient::new(channel)
        .probe(ProbeRequest {})
        .await
        .unwrap();
    let second = server.channel().await.unwrap();
    IdentityClient::new(second)
        .probe(ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(plugin.calls().count(csi_proto::Rpc::Probe), 2);
    server.shutdown().await.unwrap();
}
