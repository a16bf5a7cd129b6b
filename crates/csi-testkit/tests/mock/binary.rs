//! The `csi-mock-plugin` binary: exit codes, serving a real client, clean stop on SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::{GetPluginInfoRequest, ProbeRequest};

use crate::support::GUARD;

const BIN: &str = env!("CARGO_BIN_EXE_csi-mock-plugin");

#[test]
fn a_bad_flag_exits_2() {
    let out = Command::new(BIN)
        .args(["--endpoint", "unix:///tmp/x.sock", "--no-such-flag"])
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    let out = Command::new(BIN)
        .args([
            "--endpoint",
            "unix:///tmp/x.sock",
            "--controller-caps",
            "TELEPORT",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TELEPORT"));
}

#[test]
fn an_endpoint_that_is_not_a_unix_socket_exits_2() {
    for endpoint in [
        "tcp://127.0.0.1:9000",
        "unix://relative.sock",
        "/abs/no-scheme.sock",
    ] {
        let out = Command::new(BIN)
            .args(["--endpoint", endpoint])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{endpoint}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("unix"), "{endpoint}: {stderr}");
    }
    let out = Command::new(BIN)
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a missing endpoint is a usage error"
    );
}

#[tokio::test]
async fn serves_from_csi_endpoint_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let mut child = Command::new(BIN)
        .env("CSI_ENDPOINT", format!("unix://{}", path.display()))
        .args(["--name", "bin.mock.example", "--role", "node"])
        .args(["--quirk", "probe-not-ready"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let info = tokio::time::timeout(GUARD, async {
        loop {
            if let Ok(channel) = csi_testkit::transport::connect_unix(&path).await {
                let mut identity = IdentityClient::new(channel);
                if let Ok(info) = identity.get_plugin_info(GetPluginInfoRequest {}).await {
                    return info.into_inner();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the binary starts serving");
    assert_eq!(info.name, "bin.mock.example");
    let channel = csi_testkit::transport::connect_unix(&path).await.unwrap();
    let probe = IdentityClient::new(channel)
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false), "--quirk reaches the plugin");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(GUARD, async {
        loop {
            if let Some(exit) = child.try_wait().unwrap() {
                return exit;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the binary stops on SIGTERM");
    assert_eq!(exit.code(), Some(0));
    assert!(!path.exists(), "the socket is removed");
}
