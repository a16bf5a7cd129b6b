//! A test written with csi-testkit: script a fault into the mock plugin, run the code under
//! test against it over a real unix socket, and assert on the call log.
//!
//! The code under test is `unstage`, a tiny piece of an orchestrator that unstages a volume
//! with csi-client. `cargo test -p csi-agent --example mock_plugin_test` runs the tests;
//! `cargo run -p csi-agent --example mock_plugin_test` runs the first scenario and prints the
//! call log.

use std::path::Path;

use csi_client::{CsiClient, Endpoint, ErrorClass, Rpc};
use csi_structs::ExternalVolumeId;
use csi_testkit::{MockPlugin, MockServer, Role};

/// The code under test: unstage `volume` from `staging`, counting "already done" as done.
async fn unstage(
    client: &CsiClient,
    volume: &ExternalVolumeId,
    staging: &str,
) -> Result<(), csi_client::Error> {
    match client
        .node()
        .unstage(volume, std::path::Path::new(staging))
        .await
    {
        Err(e) if e.class() == ErrorClass::AlreadyDone => Ok(()),
        other => other,
    }
}

/// A node-only mock plugin on a socket in `dir`, and a client for it.
async fn node_plugin(dir: &Path) -> (MockServer, CsiClient) {
    let socket = dir.join("csi.sock");
    let plugin = MockPlugin::builder()
        .role(Role::Node)
        .build()
        .expect("the default node-only configuration is valid");
    let server = plugin
        .serve_unix(&socket)
        .await
        .expect("a fresh temporary socket path can be served");
    let endpoint = Endpoint::unix(&socket).expect("the temporary socket path is a valid endpoint");
    (server, CsiClient::new(endpoint))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let (server, client) = node_plugin(tmp.path()).await;
    server
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail_times(2, csi_client::Code::Unavailable, "busy");
    let volume = ExternalVolumeId::new("vol-1")?;
    unstage(&client, &volume, "/nonexistent/staging/vol-1").await?;
    for call in server.calls().all() {
        println!("{:>3} {:<24} {:?}", call.seq, call.rpc.name(), call.outcome);
    }
    server.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_client::Code;

    #[tokio::test]
    async fn unavailable_twice_is_retried_by_the_client_until_it_succeeds() {
        let tmp = tempfile::tempdir().unwrap();
        let (server, client) = node_plugin(tmp.path()).await;
        server.faults().on(Rpc::NodeUnstageVolume).fail_times(
            2,
            Code::Unavailable,
            "scripted: busy",
        );
        let volume = ExternalVolumeId::new("vol-1").unwrap();

        unstage(&client, &volume, "/staging/vol-1").await.unwrap();

        // Three calls of one RPC in a row: two scripted failures, then normal service.
        server
            .calls()
            .snapshot()
            .without_discovery()
            .assert_runs(&[(Rpc::NodeUnstageVolume, 3)])
            .unwrap();
        let codes: Vec<_> = server
            .calls()
            .of(Rpc::NodeUnstageVolume)
            .records()
            .iter()
            .map(|c| c.outcome.code())
            .collect();
        assert_eq!(
            codes[..2],
            [Some(Code::Unavailable), Some(Code::Unavailable)]
        );
        assert!(server.faults().is_exhausted(), "the script was used up");
        server.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn invalid_argument_is_fatal_and_not_retried() {
        let tmp = tempfile::tempdir().unwrap();
        let (server, client) = node_plugin(tmp.path()).await;
        server
            .faults()
            .on(Rpc::NodeUnstageVolume)
            .fail(Code::InvalidArgument, "scripted: bad path");
        let volume = ExternalVolumeId::new("vol-1").unwrap();

        let err = unstage(&client, &volume, "/staging/vol-1")
            .await
            .unwrap_err();

        assert_eq!(err.class(), ErrorClass::Fatal);
        assert_eq!(err.rpc(), Rpc::NodeUnstageVolume);
        assert_eq!(server.calls().count(Rpc::NodeUnstageVolume), 1);
        server.shutdown().await.unwrap();
    }
}
