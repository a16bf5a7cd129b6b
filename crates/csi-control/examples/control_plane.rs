//! An orchestrator's control plane on the library crates: one node (csi-node's `Node`), the
//! shim that reaches its plugins (csi-rpc-shim, fed by csi-node's `RegistryFeed`), a catalog
//! in a file, and the `VolumeService` over them. A volume is created, claimed (controller
//! publish, stage, publish), expanded, snapshotted, released, and deleted; every step's
//! `ServiceEvent` is printed.
//!
//! `cargo run -p csi-control --example control_plane` (the mock plugin runs in-process on a
//! unix socket in a temporary directory; it exits 1 naming the step that failed).

use std::sync::Arc;
use std::time::Duration;

use csi_claims::ClaimMode;
use csi_client::Endpoint;
use csi_control::service::{ClaimVolume, NewSnapshot, NewVolume, SnapshotsOf};
use csi_control::{FileCatalog, VolumeCatalog, VolumeService};
use csi_node::Node;
use csi_node::plugins::PluginObserver;
use csi_node::shim::{NodeBackend, RegistryFeed};
use csi_rpc_shim::{
    Credentials, NodeStatus, Registry, Routes, Scope, Shim, ShimConfig, Token, TokenBook,
};
use csi_structs::{
    AccessMode, AccessTypeKind, NodeId, Parameters, PluginId, VolumeId, VolumeSecrets, WorkloadId,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long any one step may take before the example gives up.
const STEP: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("control_plane failed: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("mock.sock");
    let mock = csi_testkit::MockPlugin::builder().build()?;
    let _server = mock.serve_unix(&socket).await?;
    let (me, plugin) = (NodeId::new("node-1")?, PluginId::new("mock")?);

    // 1. The node, whose plugins the feed tells the shim's registry about.
    let registry = Arc::new(Registry::new());
    registry.set_node_status(&me, NodeStatus::Ready);
    let feed = Arc::new(RegistryFeed::new(me.clone(), Arc::clone(&registry)));
    let node = Node::builder(dir.path().join("node"), me.clone())
        .observer(Arc::clone(&feed) as Arc<dyn PluginObserver>)
        .open()
        .await?;
    feed.wake(node.claims().clone());
    node.register(plugin.clone(), Endpoint::unix(&socket)?)
        .await?;
    node.wait_for(&plugin, STEP).await?;

    // 2. The shim (this node alone: its own plugins, no peers), the catalog, the service.
    let credentials = Credentials {
        node: me.clone(),
        token: Token::new("an-example-token-0123456789")?,
    };
    let backend = Arc::new(NodeBackend::new(
        node.plugins().clone(),
        node.volumes().clone(),
    ));
    let config = ShimConfig::new(credentials, Scope::Cluster);
    let shim = Shim::new(config, registry, backend, TokenBook::new(), Routes::new());
    let catalog: Arc<dyn VolumeCatalog> = Arc::new(FileCatalog::open(dir.path()).await?);
    let service = VolumeService::for_node(&node, catalog, shim)
        .call_timeout(STEP)
        .build();
    let mut events = service.subscribe();

    // 3. Created in the plugin; claimed by a writer and published on this node.
    let volume = VolumeId::new("db")?;
    let created = service
        .create(NewVolume {
            id: volume.clone(),
            plugin: plugin.clone(),
            access_mode: AccessMode::SingleNodeWriter,
            attachment: AccessTypeKind::Mount,
            capacity_bytes: 1 << 30,
            parameters: Parameters::default(),
            secrets: VolumeSecrets::default(),
            requisite_topology: Vec::new(),
            preferred_topology: Vec::new(),
            source: None,
        })
        .await?;
    println!("created {} as {}", created.id, created.external_id);
    let writer = WorkloadId::new("web-1")?;
    let claimed = service
        .claim(ClaimVolume {
            volume: volume.clone(),
            workload: writer.clone(),
            mode: ClaimMode::Write,
        })
        .await?;
    println!("{writer}: published at {}", claimed.target_path.display());

    // 4. Grown while published (controller, then this node), and snapshotted.
    let grown = service.expand(&volume, 2 << 30).await?;
    println!(
        "expanded to {} bytes on {:?}",
        grown.capacity_bytes, grown.nodes_expanded
    );
    let snapshot = service
        .create_snapshot(
            &volume,
            NewSnapshot {
                name: "db-nightly".into(),
                parameters: Parameters::default(),
            },
        )
        .await?;
    let listed = service
        .list_snapshots(&SnapshotsOf::Volume(volume.clone()))
        .await?;
    println!("snapshot {} ({} listed)", snapshot.id, listed.len());
    service
        .delete_snapshot(&SnapshotsOf::Volume(volume.clone()), &snapshot.id)
        .await?;

    // 5. Released (the pipeline unpublishes, unstages and detaches), then deleted.
    let deadline = tokio::time::Instant::now() + STEP;
    service.release_and_wait(&volume, &writer, deadline).await?;
    service.delete(&volume).await?;
    if !mock.volumes().is_empty() {
        return Err("the plugin still holds the volume".into());
    }

    while let Ok(event) = events.try_recv() {
        println!("event: {event:?}");
    }
    drop(service);
    node.close().await?;
    Ok(())
}
