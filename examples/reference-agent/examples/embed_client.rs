//! Embedding `csi-client`: fingerprint a CSI plugin, create a volume, publish it to this node,
//! and clean up, with typed answers and classified errors.
//!
//! It starts the csi-testkit mock plugin on a unix socket in a temporary directory so it runs
//! anywhere: `cargo run -p csi-agent --example embed_client`. Point `drive` at a real plugin's
//! socket to do the same there. `cargo test -p csi-agent --example embed_client` runs the
//! test below, which checks the calls the plugin received.

use std::error::Error;
use std::path::Path;

use csi_client::{CsiClient, Endpoint, ErrorClass, NodePublish};
use csi_structs::{
    AccessMode, MountOptions, PluginId, PublishContext, Secrets, VolumeCapability, VolumeId,
    VolumeSpec,
};

/// Fingerprints the plugin at `endpoint`, then creates, publishes, unpublishes and deletes a
/// volume, publishing under `dir`. Returns the plugin's volume id.
async fn drive(endpoint: Endpoint, dir: &Path) -> Result<String, Box<dyn Error>> {
    let client = CsiClient::new(endpoint);

    // One pass over every discovery call.
    let fingerprint = client.fingerprint().await?;
    println!(
        "plugin {} {}: staging {}, controller publish {}",
        fingerprint.plugin.name,
        fingerprint.plugin.vendor_version,
        fingerprint.capabilities.node.requires_staging(),
        fingerprint
            .capabilities
            .lifecycle_requires(csi_client::Rpc::ControllerPublishVolume),
    );

    // The orchestrator's volume spec in (CreateVolume named after its id, so a repeat after a
    // lost answer finds the same volume), typed `csi_structs::Volume` out (checked on arrival).
    let capability = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
    let spec = VolumeSpec::new(
        VolumeId::new("embed-example")?,
        PluginId::new("mock")?,
        vec![capability.clone()],
    );
    let volume = client.controller().create(&spec).await?;
    println!("created {}", volume.volume_id);

    // Domain-typed helpers for the node calls. (This plugin publishes without staging or a
    // controller step only because the example keeps to the essentials; see `csi-agent demo`
    // for the whole lifecycle adapted to the plugin's capabilities.)
    let target = dir.join("target");
    let target_path = target.as_path();
    client
        .node()
        .publish(&NodePublish {
            volume: &volume.volume_id,
            staging_target_path: None,
            target_path,
            capability: &capability,
            readonly: false,
            publish_context: &PublishContext::new(),
            volume_context: &volume.volume_context,
            secrets: &Secrets::default(),
        })
        .await?;
    println!("published at {}", target_path.display());

    client
        .node()
        .unpublish(&volume.volume_id, target_path)
        .await?;
    // A second unpublish answers NOT_FOUND, which csi-client classifies as "already done":
    // decide on the class, never on the message.
    match client
        .node()
        .unpublish(&volume.volume_id, target_path)
        .await
    {
        Ok(()) => {}
        Err(e) if e.class() == ErrorClass::AlreadyDone => println!("already unpublished"),
        Err(e) => return Err(e.into()),
    }
    client
        .controller()
        .delete(&volume.volume_id, &Secrets::default())
        .await?;
    println!("deleted {}", volume.volume_id);
    Ok(volume.volume_id.to_string())
}

/// A plugin that needs neither staging nor a controller publish step.
fn simple_plugin() -> Result<csi_testkit::MockPlugin, csi_testkit::ConfigError> {
    csi_testkit::MockPlugin::builder()
        .controller_capabilities([csi_testkit::ControllerCapability::CreateDeleteVolume])
        .node_capabilities(Vec::new())
        .build()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let tmp = tempfile::tempdir()?;
    let socket = tmp.path().join("csi.sock");
    let server = simple_plugin()?.serve_unix(&socket).await?;
    drive(Endpoint::unix(&socket)?, tmp.path()).await?;
    server.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_client::Rpc;

    #[tokio::test]
    async fn drives_the_mock_through_create_publish_unpublish_delete() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("csi.sock");
        let server = simple_plugin().unwrap().serve_unix(&socket).await.unwrap();
        let volume = drive(Endpoint::unix(&socket).unwrap(), tmp.path())
            .await
            .unwrap();
        server
            .calls()
            .snapshot()
            .without_discovery()
            .assert_runs(&[
                (Rpc::CreateVolume, 1),
                (Rpc::NodePublishVolume, 1),
                (Rpc::NodeUnpublishVolume, 2),
                (Rpc::DeleteVolume, 1),
            ])
            .unwrap();
        assert!(server.calls().for_volume(&volume).len() >= 4);
        assert!(server.plugin().volumes().is_empty());
        server.shutdown().await.unwrap();
    }
}
