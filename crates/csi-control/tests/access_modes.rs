//! Every access mode, claimed through the volume service against csi-testkit's mock plugin,
//! which follows the spec's multiplicity rules (csi-spec §4.5: a volume `NODE_READY` on several
//! nodes only with `MULTI_NODE_*`; several `PUBLISHED` target paths on one node only with
//! `MULTI_NODE_*` or `SINGLE_NODE_MULTI_WRITER`).
//!
//! Two nodes, `n1` and `n2`, each a csi-node `Node` with its own directory, its own shim (its
//! own node only: controller calls go to its local plugin's controller) and its own
//! `VolumeService`; they share one claim store (in memory, with the watch a shared store
//! gives every writer, as etcd does), one catalog and one storage model (the mock, served as
//! plugin node `node-1` to `n1` and, through `MockPlugin::as_node`, as `node-2` to `n2`).
//!
//! Each row of the table is an access mode and a sequence of claims (workload, node, read or
//! write) on a volume of its own, with what each claim must come to:
//!
//! - admitted: the claim succeeds and the plugin holds a publication at its target path, on
//!   its node (so the plugin accepted every call the service made);
//! - denied: the service answers the claim layer's denial, with the reason the row names
//!   and every holder named, and the plugin saw no `ControllerPublishVolume`, `NodeStageVolume` or
//!   `NodePublishVolume` for it. Then the calls the service would have made are sent to the
//!   plugin directly, and the plugin must refuse them with FAILED_PRECONDITION at the call the
//!   row names: if the plugin would accept, the accounting denies too much; if the service
//!   admits, the accounting lets through what the plugin refuses after calls. Two denials
//!   keep the mode's meaning only (a writer on a read-only mode, a second writer on
//!   `MULTI_NODE_SINGLE_WRITER`): the spec gives the plugin no refusal for them, and the row
//!   says so instead of probing.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use csi_claims::driver::DriverConfig;
use csi_claims::store::{ChangeSender, Changes, Format, Stored};
use csi_claims::{
    ClaimMode, ClaimStore, DenyReason, Duties, MachineConfig, StoreError, Version, VolumeRecord,
};
use csi_client::{Code, CsiClient, Endpoint, NodePublish, NodeStage, Rpc};
use csi_control::service::{ClaimVolume, NewVolume};
use csi_control::{CatalogEntry, FileCatalog, ServiceError, VolumeCatalog, VolumeService};
use csi_node::Node;
use csi_node::layout::PublishUsage;
use csi_node::plugins::PluginObserver;
use csi_node::shim::{NodeBackend, RegistryFeed};
use csi_rpc_shim::{
    Credentials, NodeStatus, Registry, Routes, Scope, Shim, ShimConfig, Token, TokenBook,
};
use csi_structs::{
    AccessMode, AccessTypeKind, NodeId, Parameters, PluginId, PluginNodeId, Secrets, VolumeId,
    VolumeSecrets,
};
use csi_testkit::{MockPlugin, MockServer};
use support::{GUARD, volume_id, workload};

use ClaimMode::{Read as R, Write as W};

/// Which of the two nodes a claim is made on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    N1 = 0,
    N2 = 1,
}

/// The denial a row expects (the claim layer's [`DenyReason`], without its details).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deny {
    SingleWorkload,
    OtherNode,
    ReadOnlyMode,
    OneWriter,
}

impl Deny {
    fn matches(self, reason: &DenyReason) -> bool {
        matches!(
            (self, reason),
            (Deny::SingleWorkload, DenyReason::SingleWorkload)
                | (Deny::OtherNode, DenyReason::OtherNode { .. })
                | (Deny::ReadOnlyMode, DenyReason::ReadOnlyMode)
                | (Deny::OneWriter, DenyReason::WritersExhausted { max: 1 })
        )
    }
}

/// What the plugin answers to the calls the service would have made for a denied claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plugin {
    /// FAILED_PRECONDITION at this call; the calls before it succeed (idempotent repeats of
    /// what the holders on the node already did).
    RefusesAt(Rpc),
    /// The spec gives the plugin no refusal: the denial keeps the mode's meaning only.
    NoRefusalInSpec,
}

#[derive(Clone, Copy, Debug)]
enum Expect {
    Admitted,
    Denied(Deny, Plugin),
}

/// One claim of a row.
#[derive(Clone, Copy, Debug)]
struct Step {
    workload: &'static str,
    at: At,
    mode: ClaimMode,
    expect: Expect,
}

fn ok(workload: &'static str, at: At, mode: ClaimMode) -> Step {
    Step {
        workload,
        at,
        mode,
        expect: Expect::Admitted,
    }
}

fn no(workload: &'static str, at: At, mode: ClaimMode, deny: Deny, plugin: Plugin) -> Step {
    Step {
        workload,
        at,
        mode,
        expect: Expect::Denied(deny, plugin),
    }
}

/// The table: each access mode with claims on the same node and the other, readers and
/// writers, in order, on a volume of the row's own.
fn rows() -> Vec<(AccessMode, Vec<Step>)> {
    use AccessMode::*;
    use At::{N1, N2};
    use Deny::*;
    let controller = Plugin::RefusesAt(Rpc::ControllerPublishVolume);
    let node = Plugin::RefusesAt(Rpc::NodePublishVolume);
    let meaning = Plugin::NoRefusalInSpec;
    vec![
        (
            SingleNodeWriter,
            vec![
                ok("a", N1, W),
                no("b", N1, R, SingleWorkload, node),
                no("c", N1, W, SingleWorkload, node),
                no("d", N2, R, SingleWorkload, controller),
            ],
        ),
        (
            SingleNodeReaderOnly,
            vec![
                no("a", N1, W, ReadOnlyMode, meaning),
                ok("a", N1, R),
                no("b", N1, R, SingleWorkload, node),
                no("c", N2, R, SingleWorkload, controller),
            ],
        ),
        (
            SingleNodeSingleWriter,
            vec![
                ok("a", N2, W),
                // A reader beside the writer on its node: a second target path.
                no("b", N2, R, SingleWorkload, node),
                no("c", N2, W, SingleWorkload, node),
                no("d", N1, R, SingleWorkload, controller),
            ],
        ),
        (
            SingleNodeMultiWriter,
            vec![
                ok("a", N1, W),
                ok("b", N1, W),
                ok("c", N1, R),
                no("d", N2, R, OtherNode, controller),
                no("e", N2, W, OtherNode, controller),
            ],
        ),
        (
            MultiNodeReaderOnly,
            vec![
                ok("a", N1, R),
                ok("b", N1, R),
                ok("c", N2, R),
                no("d", N2, W, ReadOnlyMode, meaning),
            ],
        ),
        (
            MultiNodeSingleWriter,
            vec![
                ok("a", N1, R),
                ok("b", N2, W),
                // Readers beside the writer, on its node and the other.
                ok("c", N2, R),
                ok("d", N1, R),
                no("e", N1, W, OneWriter, meaning),
                no("f", N2, W, OneWriter, meaning),
            ],
        ),
        (
            MultiNodeMultiWriter,
            vec![
                ok("a", N1, W),
                ok("b", N1, W),
                ok("c", N2, W),
                ok("d", N2, R),
            ],
        ),
    ]
}

/// The claim store the two nodes share, in memory, written the way etcd is: one revision for
/// every write (deletes included), and a watch that tells every driver each write, its own
/// included. (csi-claims' `MemoryStore` is a store of one writer: the other driver would
/// decide on what it last read until its next write.)
#[derive(Default)]
struct SharedStore {
    inner: Mutex<SharedRecords>,
}

#[derive(Default)]
struct SharedRecords {
    revision: u64,
    records: BTreeMap<VolumeId, (Version, VolumeRecord)>,
    watchers: Vec<ChangeSender>,
}

impl SharedStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, SharedRecords> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The workloads holding `volume`, sorted.
    fn holders(&self, volume: &VolumeId) -> Vec<String> {
        let mut holders: Vec<String> = self
            .lock()
            .records
            .get(volume)
            .map(|(_, record)| {
                record
                    .claims()
                    .iter()
                    .map(|c| c.workload().to_string())
                    .collect()
            })
            .unwrap_or_default();
        holders.sort();
        holders
    }
}

fn stored((version, record): &(Version, VolumeRecord)) -> Stored {
    Stored {
        version: *version,
        record: record.clone(),
        format: Format::V2,
    }
}

#[async_trait::async_trait]
impl ClaimStore for SharedStore {
    async fn load_all(&self) -> Result<Vec<Stored>, StoreError> {
        Ok(self.lock().records.values().map(stored).collect())
    }

    async fn load_and_watch(&self) -> Result<(Vec<Stored>, Option<Changes>), StoreError> {
        let mut inner = self.lock();
        let (sender, changes) = Changes::channel();
        inner.watchers.push(sender);
        Ok((inner.records.values().map(stored).collect(), Some(changes)))
    }

    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        Ok(self.lock().records.get(volume).map(stored))
    }

    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError> {
        let mut inner = self.lock();
        let found = inner.records.get(volume).map(|(v, _)| *v);
        if found != expected {
            return Err(StoreError::Conflict {
                volume: volume.clone(),
                expected,
                found,
            });
        }
        // The revision after the last one, whichever volume that write was of.
        let version = Version::after(Version::from_u64(inner.revision));
        inner.revision = version.get();
        match new {
            Some(record) => inner
                .records
                .insert(volume.clone(), (version, record.clone())),
            None => inner.records.remove(volume),
        };
        for watcher in &inner.watchers {
            watcher.volume(volume.clone(), version, new.cloned());
        }
        Ok(new.map(|_| version))
    }
}

/// One node: its `Node`, its service, and the mock as this node's plugin.
struct Site {
    node: Node,
    service: VolumeService,
    /// The mock handle serving this node (one storage model, one call log for both).
    mock: MockPlugin,
    /// Serves `mock` on this node's socket.
    _server: MockServer,
    /// A direct line to this node's plugin, for the probes.
    client: CsiClient,
    plugin_node: PluginNodeId,
}

/// Two sites over one claim store, one catalog and one storage model.
struct Cluster {
    _dir: tempfile::TempDir,
    store: Arc<SharedStore>,
    sites: [Site; 2],
}

fn plugin_id() -> PluginId {
    PluginId::new("mock").expect("plugin id")
}

impl Cluster {
    async fn open() -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Arc::new(SharedStore::default());
        let catalog_dir = dir.path().join("catalog");
        std::fs::create_dir_all(&catalog_dir).expect("catalog dir");
        let catalog: Arc<dyn VolumeCatalog> = Arc::new(
            FileCatalog::open(&catalog_dir)
                .await
                .expect("catalog opens"),
        );
        let first = MockPlugin::builder()
            .node_id("node-1")
            .build()
            .expect("mock");
        let second = first.as_node("node-2").expect("the mock as node-2");
        // Each node performs its own node steps; n1 the controller steps.
        let n1 = Site::open(dir.path(), "n1", true, first, &store, &catalog).await;
        let n2 = Site::open(dir.path(), "n2", false, second, &store, &catalog).await;
        Cluster {
            _dir: dir,
            store,
            sites: [n1, n2],
        }
    }
}

impl Site {
    /// Opens node `me` in `<root>/<me>` on the shared store (its release steps: its own node
    /// steps, and the controller steps if `controller`), registers `mock` (served on
    /// `<root>/<me>.sock`) and builds its service over the shared catalog.
    async fn open(
        root: &Path,
        me: &str,
        controller: bool,
        mock: MockPlugin,
        store: &Arc<SharedStore>,
        catalog: &Arc<dyn VolumeCatalog>,
    ) -> Site {
        let me = NodeId::new(me).expect("node id");
        let socket = root.join(format!("{me}.sock"));
        let server = mock.serve_unix(&socket).await.expect("the mock serves");
        let registry = Arc::new(Registry::new());
        registry.set_node_status(&me, NodeStatus::Ready);
        let feed = Arc::new(RegistryFeed::new(me.clone(), Arc::clone(&registry)));
        let driver = DriverConfig {
            machine: MachineConfig {
                duties: Duties::node(me.clone(), controller),
                ..MachineConfig::default()
            },
            ..DriverConfig::default()
        };
        let node = Node::builder(root.join(me.as_str()), me.clone())
            .claim_store(Arc::clone(store) as Arc<dyn ClaimStore>)
            .driver(driver)
            .observer(Arc::clone(&feed) as Arc<dyn PluginObserver>)
            .open()
            .await
            .expect("node opens");
        assert!(feed.wake(node.claims().clone()), "first driver given");
        let endpoint = Endpoint::unix(&socket).expect("endpoint");
        node.register_plugin(plugin_id(), endpoint.clone())
            .await
            .expect("registered");
        node.wait_for(&plugin_id(), GUARD)
            .await
            .expect("fingerprinted and healthy (hang guard)");
        let backend = Arc::new(NodeBackend::new(
            node.plugins().clone(),
            node.volumes().clone(),
        ));
        let config = ShimConfig::new(
            Credentials {
                node: me.clone(),
                token: Token::new("test-token-0123456789abcdef").expect("token"),
            },
            Scope::Cluster,
        );
        let shim = Shim::new(config, registry, backend, TokenBook::new(), Routes::new());
        let service = VolumeService::for_node(&node, Arc::clone(catalog), shim).build();
        let plugin_node = PluginNodeId::new(mock.node_id()).expect("plugin node id");
        Site {
            node,
            service,
            mock,
            _server: server,
            client: CsiClient::new(endpoint),
            plugin_node,
        }
    }
}

/// Runs one row on a volume of its own; the first step that goes wrong ends it, described.
async fn run_row(cluster: &Cluster, access: AccessMode, steps: &[Step]) -> Result<(), String> {
    let name = access.wire_name().to_lowercase().replace('_', "-");
    let entry = cluster.sites[0]
        .service
        .create(NewVolume {
            id: volume_id(&name),
            plugin: plugin_id(),
            access_mode: access,
            attachment: AccessTypeKind::Mount,
            capacity_bytes: 1 << 30,
            parameters: Parameters::default(),
            secrets: VolumeSecrets::default(),
            requisite_topology: Vec::new(),
            preferred_topology: Vec::new(),
            source: None,
        })
        .await
        .map_err(|e| format!("{access}: create: {e}"))?;
    let mut admitted: Vec<Step> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let site = &cluster.sites[step.at as usize];
        let what = format!(
            "{access} step {i} ({} {} on {})",
            step.workload,
            step.mode,
            site.node.id()
        );
        settle(cluster, site, &entry.id).await?;
        site.mock.calls().clear();
        let answer = tokio::time::timeout(
            GUARD,
            site.service.claim(ClaimVolume {
                volume: entry.id.clone(),
                workload: workload(step.workload),
                mode: step.mode,
            }),
        )
        .await
        .map_err(|_| format!("{what}: the claim hung (guard)"))?;
        match (step.expect, answer) {
            (Expect::Admitted, Ok(claimed)) => {
                let held = site.mock.published().into_iter().any(|p| {
                    p.volume_id == entry.external_id.as_str() && p.path == claimed.target_path
                });
                if !held {
                    return Err(format!(
                        "{what}: admitted, but the plugin holds no publication at {}",
                        claimed.target_path.display()
                    ));
                }
                admitted.push(*step);
            }
            (Expect::Admitted, Err(e)) => {
                return Err(format!("{what}: expected admitted and published, got: {e}"));
            }
            (Expect::Denied(..), Ok(claimed)) => {
                return Err(format!(
                    "{what}: expected a denial before any plugin call, but it was admitted and \
                     published at {}",
                    claimed.target_path.display()
                ));
            }
            (Expect::Denied(deny, plugin), Err(e)) => {
                check_denial(&what, access, deny, &admitted, &e)?;
                let calls: Vec<Rpc> = site
                    .mock
                    .calls()
                    .for_volume(entry.external_id.as_str())
                    .rpcs()
                    .into_iter()
                    .filter(|rpc| {
                        matches!(
                            rpc,
                            Rpc::ControllerPublishVolume
                                | Rpc::NodeStageVolume
                                | Rpc::NodePublishVolume
                        )
                    })
                    .collect();
                if !calls.is_empty() {
                    return Err(format!(
                        "{what}: denied, but after plugin calls {calls:?} ({e})"
                    ));
                }
                if let Plugin::RefusesAt(rpc) = plugin {
                    probe(site, &entry, step, rpc)
                        .await
                        .map_err(|why| format!("{what}: the plugin does not refuse it: {why}"))?;
                }
            }
        }
    }
    agrees_with_plugin(cluster, &entry, &admitted).map_err(|why| format!("{access}: {why}"))
}

/// Waits (bounded by [`GUARD`]) until `site`'s claims driver has heard of every write to the
/// volume's claims (the other node's come through the store's watch), so that the holders a
/// denial names are all of them.
async fn settle(cluster: &Cluster, site: &Site, volume: &VolumeId) -> Result<(), String> {
    let seen = || -> Vec<String> {
        let mut seen: Vec<String> = site
            .service
            .volume(volume)
            .map(|state| {
                state
                    .claims
                    .iter()
                    .map(|(c, _)| c.workload().to_string())
                    .collect()
            })
            .unwrap_or_default();
        seen.sort();
        seen
    };
    tokio::time::timeout(GUARD, async {
        while seen() != cluster.store.holders(volume) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .map_err(|_| {
        format!(
            "node {} never saw the claims {:?} (hang guard)",
            site.node.id(),
            cluster.store.holders(volume)
        )
    })
}

/// The answer is the claim layer's denial, with `deny`'s reason and the row's access mode,
/// naming the holders: the claims admitted so far.
fn check_denial(
    what: &str,
    access: AccessMode,
    deny: Deny,
    admitted: &[Step],
    e: &ServiceError,
) -> Result<(), String> {
    match e {
        ServiceError::Denied(denied)
            if deny.matches(&denied.reason) && denied.access_mode == access =>
        {
            let mut named: Vec<String> = denied
                .holders
                .0
                .iter()
                .map(|h| h.workload.to_string())
                .collect();
            named.sort();
            let mut holders: Vec<String> = admitted.iter().map(|s| s.workload.to_owned()).collect();
            holders.sort();
            if named == holders {
                Ok(())
            } else {
                Err(format!(
                    "{what}: the denial names holders {named:?}, not {holders:?}: {e}"
                ))
            }
        }
        other => Err(format!(
            "{what}: expected the claims denial {deny:?}, got: {other}"
        )),
    }
}

/// Sends this node's plugin the calls the service would have made for `step`, in its order
/// (controller publish, stage, publish), and wants FAILED_PRECONDITION at `refused_at`.
async fn probe(
    site: &Site,
    entry: &CatalogEntry,
    step: &Step,
    refused_at: Rpc,
) -> Result<(), String> {
    if !matches!(
        refused_at,
        Rpc::ControllerPublishVolume | Rpc::NodePublishVolume
    ) {
        return Err(format!("no probe ends at {refused_at:?}"));
    }
    let capability = entry.capability();
    let volume_context = entry.volume_context();
    let secrets = Secrets::default();
    let published = site
        .client
        .controller()
        .publish(
            &entry.external_id,
            &site.plugin_node,
            &capability,
            entry.access_mode.is_read_only(),
            &volume_context,
            &secrets,
        )
        .await;
    if refused_at == Rpc::ControllerPublishVolume {
        return failed_precondition(Rpc::ControllerPublishVolume, published.map(drop));
    }
    let publish_context = published.map_err(|e| format!("ControllerPublishVolume: {e}"))?;
    // Staged where the holders on this node had it staged.
    let staging = site
        .mock
        .staged()
        .into_iter()
        .find(|p| p.volume_id == entry.external_id.as_str())
        .ok_or("the volume is not staged on the node")?
        .path;
    site.client
        .node()
        .stage(&NodeStage {
            volume: &entry.external_id,
            staging_target_path: &staging,
            capability: &capability,
            publish_context: &publish_context,
            volume_context: &volume_context,
            secrets: &secrets,
        })
        .await
        .map_err(|e| format!("NodeStageVolume: {e}"))?;
    let read_only = step.mode == ClaimMode::Read || entry.access_mode.is_read_only();
    let target = site
        .node
        .volumes()
        .layout()
        .target_path(
            &entry.id,
            &workload(step.workload),
            &PublishUsage::of(&capability, read_only),
        )
        .map_err(|e| e.to_string())?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    let published = site
        .client
        .node()
        .publish(&NodePublish {
            volume: &entry.external_id,
            staging_target_path: Some(&staging),
            target_path: &target,
            capability: &capability,
            readonly: read_only,
            publish_context: &publish_context,
            volume_context: &volume_context,
            secrets: &secrets,
        })
        .await;
    failed_precondition(Rpc::NodePublishVolume, published)
}

fn failed_precondition(rpc: Rpc, answer: Result<(), csi_client::Error>) -> Result<(), String> {
    match answer {
        Err(e) if e.code() == Some(Code::FailedPrecondition) => Ok(()),
        Err(e) => Err(format!("{rpc:?} failed otherwise: {e}")),
        Ok(()) => Err(format!("{rpc:?} succeeded")),
    }
}

/// After a row, the claims and the plugin agree: the stored claims are the admitted ones, and
/// each node holds one publication of the volume per admitted claim on it.
fn agrees_with_plugin(
    cluster: &Cluster,
    entry: &CatalogEntry,
    admitted: &[Step],
) -> Result<(), String> {
    let stored = cluster.store.holders(&entry.id);
    let mut wanted: Vec<String> = admitted.iter().map(|s| s.workload.to_owned()).collect();
    wanted.sort();
    if stored != wanted {
        return Err(format!("stored claims {stored:?}, admitted {wanted:?}"));
    }
    for (i, site) in cluster.sites.iter().enumerate() {
        let on_node = admitted.iter().filter(|s| s.at as usize == i).count();
        let published = site
            .mock
            .published()
            .into_iter()
            .filter(|p| p.volume_id == entry.external_id.as_str())
            .count();
        if published != on_node {
            return Err(format!(
                "node {}: {published} publications for {on_node} admitted claims",
                site.node.id()
            ));
        }
    }
    Ok(())
}

/// For each access mode: what the accounting admits, the spec-following plugin accepts; what
/// it denies, it denies before any plugin call, and the plugin refuses too (or the spec gives
/// the plugin no refusal, and the row says so).
#[tokio::test]
async fn every_access_mode_admits_what_the_plugin_accepts_and_denies_before_calling_it() {
    let cluster = Cluster::open().await;
    let mut failed = Vec::new();
    for (access, steps) in rows() {
        if let Err(why) = run_row(&cluster, access, &steps).await {
            failed.push(why);
        }
    }
    assert!(
        failed.is_empty(),
        "rows that failed:\n{}",
        failed.join("\n")
    );
}
