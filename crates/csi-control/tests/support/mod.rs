//! What the volume service's tests share: csi-testkit's mock plugin on a unix socket, a
//! csi-node `Node` that registered and fingerprinted it (its `RegistryFeed` telling the shim's
//! registry), a csi-rpc-shim `Shim` whose local
//! backend is csi-node's `NodeBackend` (one node, no peers), a `FileCatalog`, and the
//! `VolumeService` over them.

// Each test binary uses its own part of it.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use csi_client::Endpoint;
use csi_control::service::{ClaimVolume, Claimed, NewVolume};
use csi_control::{CatalogEntry, FileCatalog, ServiceEvent, VolumeCatalog, VolumeService};
use csi_node::Node;
use csi_node::plugins::PluginObserver;
use csi_node::shim::{NodeBackend, RegistryFeed};
use csi_rpc_shim::{
    Credentials, NodeStatus, Registry, Routes, Scope, Shim, ShimConfig, Token, TokenBook,
};
use csi_structs::{
    AccessMode, AccessTypeKind, NodeId, Parameters, PluginId, VolumeId, VolumeSecrets, WorkloadId,
};
use csi_testkit::{MockPlugin, MockPluginBuilder, MockServer};
use tokio::sync::broadcast;
use tokio::time::Instant;

/// Only a guard against a hang: a healthy run needs a fraction of it.
pub const GUARD: Duration = Duration::from_secs(60);

/// The node's id (the orchestrator's; the mock reports its own plugin node id, `node-1`).
pub fn me() -> NodeId {
    NodeId::new("n1").expect("node id")
}

pub fn volume_id(id: &str) -> VolumeId {
    VolumeId::new(id).expect("volume id")
}

pub fn workload(id: &str) -> WorkloadId {
    WorkloadId::new(id).expect("workload id")
}

/// Whether `event` is the release pipeline's progress, forwarded from the claim driver.
pub fn is_release_progress(event: &ServiceEvent) -> bool {
    matches!(
        event,
        ServiceEvent::ReleaseStarted { .. }
            | ServiceEvent::ReleaseStepFailed(_)
            | ServiceEvent::ReleaseStepRecovered { .. }
            | ServiceEvent::Freed { .. }
    )
}

/// One node with the mock plugin `mock`, and the volume service over it.
pub struct Harness {
    /// Holds the socket, the node's state directory and the catalog's.
    pub dir: tempfile::TempDir,
    pub mock: MockPlugin,
    pub server: MockServer,
    pub plugin: PluginId,
    pub node: Node,
    pub service: VolumeService,
    /// Subscribed before the first operation.
    pub events: broadcast::Receiver<ServiceEvent>,
}

impl Harness {
    /// The default mock (controller and node, every capability it implements, no topology).
    pub async fn start() -> Harness {
        Harness::with(MockPlugin::builder()).await
    }

    /// The mock `builder` makes.
    pub async fn with(builder: MockPluginBuilder) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let mock = builder.build().expect("mock");
        let socket = dir.path().join("mock.sock");
        let server = mock.serve_unix(&socket).await.expect("serves");
        let plugin = PluginId::new("mock").expect("id");
        let (node, registry) = open_node(&dir).await;
        node.register_plugin(plugin.clone(), Endpoint::unix(&socket).expect("endpoint"))
            .await
            .expect("registered");
        let (service, events) = service_over(&dir, &node, registry, &plugin).await;
        Harness {
            dir,
            mock,
            server,
            plugin,
            node,
            service,
            events,
        }
    }

    /// Stops the service, closes the node (every file), and opens both again on the same
    /// directories, as after an agent's restart. The mock keeps running with its state.
    pub async fn restart(self) -> Harness {
        let Harness {
            dir,
            mock,
            server,
            plugin,
            node,
            service,
            events,
        } = self;
        // The service (and the shim's backend in it) hold the node's managers.
        drop((service, events));
        node.close().await.expect("node closed");
        let (node, registry) = open_node(&dir).await;
        let (service, events) = service_over(&dir, &node, registry, &plugin).await;
        Harness {
            dir,
            mock,
            server,
            plugin,
            node,
            service,
            events,
        }
    }

    /// Every event of the service's own operations sent since the last call (the service
    /// sends them before it answers). The release pipeline's progress, which arrives on its
    /// own time, is left out: [`next_release_event`](Self::next_release_event) waits for it.
    pub fn events(&mut self) -> Vec<ServiceEvent> {
        std::iter::from_fn(|| self.events.try_recv().ok())
            .filter(|e| !is_release_progress(e))
            .collect()
    }

    /// The next release-progress event (release started, step failed or recovered, claim
    /// freed), waiting for it (bounded by [`GUARD`]); the service's other events on the way
    /// are skipped.
    pub async fn next_release_event(&mut self) -> ServiceEvent {
        tokio::time::timeout(GUARD, async {
            loop {
                match self.events.recv().await {
                    Ok(e) if is_release_progress(&e) => return e,
                    Ok(_) => {}
                    Err(e) => panic!("the service's events ended: {e}"),
                }
            }
        })
        .await
        .expect("a release event within the guard")
    }

    /// The catalog's entry of `id`.
    pub fn entry(&self, id: &VolumeId) -> Option<CatalogEntry> {
        self.service.catalog().get(id)
    }

    /// A mount volume with access mode single-node-writer, `capacity` bytes, in the mock.
    pub fn new_volume(&self, id: &str, capacity: u64) -> NewVolume {
        NewVolume {
            id: volume_id(id),
            plugin: self.plugin.clone(),
            access_mode: AccessMode::SingleNodeWriter,
            attachment: AccessTypeKind::Mount,
            capacity_bytes: capacity,
            parameters: Parameters::default(),
            secrets: VolumeSecrets::default(),
            requisite_topology: Vec::new(),
            preferred_topology: Vec::new(),
            source: None,
        }
    }

    /// Creates `id` (1 GiB) through the service.
    pub async fn create(&self, id: &str) -> CatalogEntry {
        self.service
            .create(self.new_volume(id, 1 << 30))
            .await
            .expect("created")
    }

    /// A write claim of `volume` for `workload`, published here.
    pub async fn claim(&self, volume: &str, workload_id: &str) -> Claimed {
        self.service
            .claim(write_claim(volume, workload_id))
            .await
            .expect("claimed and published")
    }

    /// Releases a claim and waits (bounded by [`GUARD`]) until its release has finished.
    pub async fn release_and_wait(&self, volume: &str, workload_id: &str) {
        self.service
            .claims()
            .release_and_wait_until(
                &volume_id(volume),
                &workload(workload_id),
                Instant::now() + GUARD,
            )
            .await
            .expect("released (hang guard)");
    }

    /// Waits (bounded by [`GUARD`]) until the service shows no claim of `volume`.
    pub async fn wait_no_claims(&self, volume: &VolumeId) {
        tokio::time::timeout(GUARD, async {
            while !self
                .service
                .volume(volume)
                .expect("in the catalog")
                .claims
                .is_empty()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the claims are gone (hang guard)");
    }

    /// Every volume id the mock holds.
    pub fn mock_volumes(&self) -> Vec<String> {
        self.mock
            .volumes()
            .into_iter()
            .map(|v| v.volume_id)
            .collect()
    }
}

pub fn write_claim(volume: &str, workload_id: &str) -> ClaimVolume {
    ClaimVolume {
        volume: volume_id(volume),
        workload: workload(workload_id),
        mode: csi_claims::ClaimMode::Write,
    }
}

fn state_dir(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("csi")
}

/// Opens the node in `<dir>/csi` with csi-node's `RegistryFeed`, which tells the shim's
/// registry what the node's plugins serve (and wakes the node's releases).
async fn open_node(dir: &tempfile::TempDir) -> (Node, Arc<Registry>) {
    let registry = Arc::new(Registry::new());
    registry.set_node_status(&me(), NodeStatus::Ready);
    let feed = Arc::new(RegistryFeed::new(me(), Arc::clone(&registry)));
    let node = Node::builder(state_dir(dir), me())
        .observer(Arc::clone(&feed) as Arc<dyn PluginObserver>)
        .open()
        .await
        .expect("node opens");
    assert!(feed.wake(node.claims().clone()), "first driver given");
    (node, registry)
}

/// Waits for the plugin (fingerprinted and healthy, so the feed has published it), then
/// builds the shim (this node's plugins, no peers), the catalog (`<dir>/catalog`) and the
/// service.
async fn service_over(
    dir: &tempfile::TempDir,
    node: &Node,
    registry: Arc<Registry>,
    plugin: &PluginId,
) -> (VolumeService, broadcast::Receiver<ServiceEvent>) {
    node.wait_for(plugin, GUARD)
        .await
        .expect("fingerprinted and healthy (hang guard)");
    let me = node.id().clone();
    let backend = Arc::new(NodeBackend::new(
        node.plugins().clone(),
        node.volumes().clone(),
    ));
    let config = ShimConfig::new(
        Credentials {
            node: me,
            token: Token::new("test-token-0123456789abcdef").expect("token"),
        },
        Scope::Cluster,
    );
    let shim = Shim::new(config, registry, backend, TokenBook::new(), Routes::new());
    let catalog_dir = dir.path().join("catalog");
    std::fs::create_dir_all(&catalog_dir).expect("catalog dir");
    let catalog: Arc<dyn VolumeCatalog> = Arc::new(
        FileCatalog::open(&catalog_dir)
            .await
            .expect("catalog opens"),
    );
    let service = VolumeService::for_node(node, catalog, shim).build();
    let events = service.subscribe();
    (service, events)
}
