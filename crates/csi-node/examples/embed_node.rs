//! An orchestrator's node on the library crates alone: two workloads share a volume on the
//! mock plugin, the second unmount unstages it, the claims are released through csi-claims
//! and the volume is deleted.
//!
//! `cargo run -p csi-node --example embed_node` (the mock plugin runs in-process on a unix
//! socket in a temporary directory; it exits 1 naming the step that failed).

use std::sync::Arc;
use std::time::Duration;

use csi_claims::driver::{ClaimsDriver, DriverConfig};
use csi_claims::{ClaimMode, ClaimRequest, ControllerRequirement, MemoryStore, VolumeInfo};
use csi_client::Endpoint;
use csi_node::attach::Attacher;
use csi_node::detach::{ClientControllerDetacher, NoSecrets, VolumeNodeDetacher};
use csi_node::layout::Layout;
use csi_node::plugins::{PluginManager, PluginManagerConfig};
use csi_node::volumes::{Restore, Restored, VolumeEvent, VolumeManager};
use csi_structs::{
    AccessMode, AccessTypeKind, MountOptions, NodeId, PluginId, RegisteredVolume, VolumeCapability,
    VolumeId, VolumeSpec, WorkloadId,
};
use tokio::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long any one step may take before the example gives up.
const STEP: Duration = Duration::from_secs(30);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("embed_node failed: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    // The plugin: csi-testkit's mock, serving on a socket as a real plugin would.
    let socket = dir.path().join("mock.sock");
    let mock = csi_testkit::MockPlugin::builder().build()?;
    let server = mock.serve_unix(&socket).await?;

    // 1. The plugin manager: register the plugin and wait until it is fingerprinted.
    let plugins = PluginManager::builder(PluginManagerConfig::default())
        .state_file(dir.path().join("plugins.json"))
        .start()?;
    let plugin = PluginId::new("mock")?;
    plugins.register(plugin.clone(), Endpoint::unix(&socket)?)?;
    let ready = plugins.wait_for(&plugin, Instant::now() + STEP).await?;
    let plugin_node = ready
        .fingerprint
        .node
        .clone()
        .ok_or("no node service")?
        .node_id;
    println!("plugin {plugin}: {}", ready.fingerprint.plugin.name);

    // 2. The volume manager, the claims and their release pipeline, the attach path.
    let data = dir.path().join("csi");
    let volumes = VolumeManager::open(
        Layout::new(&data),
        data.join("usage.json"),
        Arc::new(plugins.clone()),
    )?;
    // After a restart the usage records say what was done before it, not what holds now
    // (a rebooted host has nothing staged): they are confirmed with the plugin before any is
    // trusted. This node's claims live in memory, so it knows of no earlier publication to
    // publish again: each is kept for its release (and none exists in a fresh directory).
    let restored = volumes.reconcile(&|_: &Restored| Restore::Keep).await;
    println!("usage records restored: {}", restored.records.len());
    let mut events = volumes.subscribe();
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::new(VolumeNodeDetacher::new(volumes.clone())),
        Arc::new(ClientControllerDetacher::over(
            Arc::new(plugins.clone()),
            Arc::new(NoSecrets),
        )),
        DriverConfig::default(),
    )
    .await?;
    let me = NodeId::new("node-1")?;
    let attacher = Attacher::new(me.clone(), plugins.clone(), volumes.clone());

    // 3. Create the volume from its spec.
    let mode = AccessMode::SingleNodeMultiWriter;
    let capability = VolumeCapability::mount(mode, MountOptions::new());
    let spec = VolumeSpec::new(VolumeId::new("shared")?, plugin.clone(), vec![capability]);
    let mut volume = RegisteredVolume::for_creation(spec)?;
    let created = ready.client.controller().create(volume.spec()).await?;
    volume.record_created(&created);
    let external_id = created.volume_id.clone();
    println!("created volume {} (plugin id {external_id})", volume.id());
    let info = VolumeInfo {
        id: volume.id().clone(),
        external_id: external_id.clone(),
        plugin: plugin.clone(),
        controller: ControllerRequirement::of(&ready.fingerprint.capabilities),
    };

    // 4. Two workloads claim it on this node; each claim is attached here.
    let workloads = [WorkloadId::new("web-1")?, WorkloadId::new("web-2")?];
    for workload in &workloads {
        let request = ClaimRequest {
            volume: volume.id().clone(),
            workload: workload.clone(),
            node: me.clone(),
            plugin_node: plugin_node.clone(),
            mode: ClaimMode::Write,
            access_mode: mode,
            attachment: AccessTypeKind::Mount,
        };
        let claim = claims.claim(&info, request).await?;
        let attached = attacher.attach(&volume, &claim).await?;
        println!(
            "{workload}: published at {} (controller publish now: {})",
            attached.target.display(),
            attached.controller_published
        );
        next_event(&mut events).await?;
    }

    // 5. Release both through the claims' pipeline; only the last unmount unstages.
    for (i, workload) in workloads.iter().enumerate() {
        let freed = claims
            .release_and_wait_until(volume.id(), workload, Instant::now() + STEP)
            .await?;
        let unmounted = match next_event(&mut events).await? {
            VolumeEvent::Unmount { outcome, .. } => outcome?,
            other => return Err(format!("expected an unmount, got {other:?}").into()),
        };
        let last = i + 1 == workloads.len();
        if unmounted.unstaged != last {
            return Err(format!("{workload}: unstaged {}", unmounted.unstaged).into());
        }
        println!(
            "{workload}: released ({}), unstaged: {}",
            freed.state().name(),
            unmounted.unstaged
        );
    }

    // 6. Delete the volume: nothing holds it any more.
    ready
        .client
        .controller()
        .delete(&external_id, &volume.spec().secrets)
        .await?;
    if !mock.volumes().is_empty() || !mock.staged().is_empty() {
        return Err("the plugin still has the volume".into());
    }
    println!("deleted volume {}", volume.id());
    driver.shutdown().await;
    server.shutdown().await?;
    Ok(())
}

/// The volume manager's next event, within a step's time.
async fn next_event(
    events: &mut tokio::sync::broadcast::Receiver<VolumeEvent>,
) -> Result<VolumeEvent, Error> {
    Ok(tokio::time::timeout(STEP, events.recv()).await??)
}
