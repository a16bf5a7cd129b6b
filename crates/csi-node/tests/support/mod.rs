//! What the integration tests share: the mock plugin on a unix socket, registered with a
//! plugin manager and fingerprinted.

// Each test binary uses its own part of it.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use csi_client::{Endpoint, Rpc, proto};
use csi_node::layout::{Layout, PublishUsage};
use csi_node::plugins::{PluginEvent, PluginManager, PluginManagerConfig};
use csi_node::volumes::{MountRequest, UnmountRequest, VolumeManager};
use csi_structs::{
    ExternalVolumeId, PluginId, PublishContext, Secrets, VolumeCapability, VolumeContext, VolumeId,
    WorkloadId,
};
use csi_testkit::{FaultStep, MockPlugin, MockServer};

/// Only a guard against a hang: a healthy run needs a fraction of it.
pub const GUARD: Duration = Duration::from_secs(60);

/// The mock plugin `mock`, serving, registered and fingerprinted.
pub struct Plugin {
    /// Holds the socket and every data directory of the test.
    pub dir: tempfile::TempDir,
    pub mock: MockPlugin,
    /// `None` once a test stopped it.
    pub server: Option<MockServer>,
    pub plugins: PluginManager,
    pub id: PluginId,
}

/// The mock with the default plugin manager, healthy (its first probe answered ready).
pub async fn mock_plugin() -> Plugin {
    mock_plugin_with(PluginManagerConfig::default(), false).await
}

/// The mock with a plugin manager that probes every 100 ms with a 300 ms `Probe` deadline,
/// so a probe that hangs turns the plugin unhealthy soon. With `probe_hangs` every `Probe`
/// hangs from the start and the plugin is only waited for until it is fingerprinted (its
/// health stays unknown until the first probe's deadline, then unhealthy); otherwise it is
/// waited for until healthy.
pub async fn mock_plugin_probing_fast(probe_hangs: bool) -> Plugin {
    let config = PluginManagerConfig {
        health_interval: Duration::from_millis(100),
        ..PluginManagerConfig::default()
    };
    mock_plugin_with(config, probe_hangs).await
}

async fn mock_plugin_with(config: PluginManagerConfig, probe_hangs: bool) -> Plugin {
    let dir = tempfile::tempdir().expect("temp dir");
    let mock = MockPlugin::builder().build().expect("mock");
    if probe_hangs {
        mock.faults().on(Rpc::Probe).forever(FaultStep::Hang);
    }
    let socket = dir.path().join("mock.sock");
    let server = mock.serve_unix(&socket).await.expect("serves");
    let fast = config.health_interval < PluginManagerConfig::default().health_interval;
    let plugins = PluginManager::builder(config)
        .client_builder(move |_, builder| {
            if fast {
                builder.policy(Rpc::Probe, |p| {
                    p.attempt_deadline = Duration::from_millis(300);
                    p.total_budget = Duration::from_millis(300);
                })
            } else {
                builder
            }
        })
        .start()
        .expect("starts");
    let id = PluginId::new("mock").expect("id");
    let mut events = plugins.subscribe();
    plugins
        .register(id.clone(), Endpoint::unix(&socket).expect("endpoint"))
        .expect("registered");
    if probe_hangs {
        tokio::time::timeout(GUARD, async {
            while !matches!(events.recv().await, Ok(PluginEvent::Fingerprinted { .. })) {}
        })
        .await
        .expect("fingerprinted (hang guard)");
    } else {
        plugins
            .wait_for(&id, tokio::time::Instant::now() + GUARD)
            .await
            .expect("fingerprinted and healthy (hang guard)");
    }
    Plugin {
        dir,
        mock,
        server: Some(server),
        plugins,
        id,
    }
}

impl Plugin {
    /// A volume manager with its paths and usage file under `<dir>/<name>` (opening it
    /// again later restores its records).
    pub fn volumes(&self, name: &str) -> VolumeManager {
        let root = self.dir.path().join(name);
        VolumeManager::open(
            Layout::new(&root),
            root.join("usage.json"),
            Arc::new(self.plugins.clone()),
        )
        .expect("opens")
    }
}

/// Creates volume `name` on plugin `id` (fingerprinted in `plugins`) with `capability`, and
/// publishes it to the plugin's node: its ids and the publish context.
pub async fn create_and_attach(
    plugins: &PluginManager,
    id: &PluginId,
    name: &str,
    capability: &VolumeCapability,
) -> (VolumeId, ExternalVolumeId, PublishContext) {
    let ready = plugins.get(id).expect("fingerprinted");
    let controller = ready.client.controller();
    let external = controller
        .create_volume(proto::CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![capability.into()],
            ..Default::default()
        })
        .await
        .expect("created")
        .volume_id;
    let node = ready.fingerprint.node.as_ref().expect("node service");
    let context = controller
        .publish(
            &external,
            &node.node_id,
            capability,
            false,
            &VolumeContext::new(),
            &Secrets::new(),
        )
        .await
        .expect("attached");
    (VolumeId::new(name).expect("id"), external, context)
}

/// A volume [`create_and_attach`] made: its ids and publish context.
pub type Made = (VolumeId, ExternalVolumeId, PublishContext);

/// A mount of `made` on `plugin` for `workload`, read-write, with `capability`.
pub fn mount_request(
    plugin: &Plugin,
    (volume, external, context): &Made,
    workload: &str,
    capability: &VolumeCapability,
) -> MountRequest {
    MountRequest {
        plugin: plugin.id.clone(),
        volume: volume.clone(),
        external_id: external.clone(),
        capability: capability.clone(),
        read_only: false,
        workload: WorkloadId::new(workload).expect("id"),
        publish_context: context.clone(),
        volume_context: VolumeContext::new(),
        secrets: Secrets::new().into(),
    }
}

/// The unmount of what [`mount_request`] mounted.
pub fn unmount_request(
    plugin: &Plugin,
    (volume, external, _): &Made,
    workload: &str,
    capability: &VolumeCapability,
) -> UnmountRequest {
    UnmountRequest {
        plugin: plugin.id.clone(),
        volume: volume.clone(),
        external_id: external.clone(),
        workload: WorkloadId::new(workload).expect("id"),
        usage: PublishUsage::of(capability, false),
    }
}
