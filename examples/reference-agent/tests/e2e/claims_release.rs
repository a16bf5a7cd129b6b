//! Issue 5's integration tests: csi-claims' release driver with the agent's adapters and
//! csi-client clients, against the csi-testkit mock served on real unix sockets.
//!
//! One mock plugin (one state, one call log) is served on two sockets, one the controller
//! client dials and one the node client dials, so the node plugin can go away while the
//! controller stays, and the call log orders the calls of both.
//!
//! The detach clients make ONE attempt per detach RPC: the node client is the agent's own
//! ([`NodeDetachPolicy::DEFAULT`]: one attempt, a 1 s wait for a missing socket, so "plugin
//! missing" is an answer, not a two-minute wait), the controller client has
//! `max_attempts = 1` for `ControllerUnpublishVolume`. Every call the mock logs is then one
//! attempt of the claims layer, and every retry seen is the claims layer's backoff, not
//! csi-client's own retry loop.
//!
//! Time is real (the mock and the clients talk over real sockets); every wait is bounded by a
//! hang guard and nothing asserts on elapsed time. Tests that must see a volume "stuck" use a
//! one-hour backoff, so the state cannot move on until the test wakes it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use csi_claims::backoff::BackoffPolicy;
use csi_claims::driver::{ClaimsDriver, ClaimsHandle, DriverConfig, NodeDetacher};
use csi_claims::machine::{LastError, ReleaseStatus, ReleaseWait};
use csi_claims::store::ClaimStore;
use csi_claims::{
    ClaimMode, ClaimRequest, ClaimState, ControllerRequirement, ControllerStep, DetachError,
    DetachRpc, MemoryStore, NodeDetachRequest, NodeStep, RedbStore, VolumeInfo,
};
use csi_claims::{ControllerDetachRequest, driver::ControllerDetacher};
use csi_client::{Code, CsiClient, Endpoint, ErrorClass, NodePublish, NodeStage, Rpc, proto};
use csi_node::detach::{ClientControllerDetacher, ClientNodeDetacher, NoSecrets, NodeDetachPolicy};
use csi_node::layout::{Layout, PublishUsage};
use csi_structs::{
    AccessMode, AccessTypeKind, MountOptions, NodeId, PluginId, PublishContext, Secrets,
    VolumeCapability, VolumeContext, VolumeId, WorkloadId,
};
use csi_testkit::{CallList, MockPlugin, MockServer};

/// Only a hang guard: each release here takes well under a second.
const GUARD: Duration = Duration::from_secs(60);

/// A volume published and staged on the node through the mock, as an agent would have left
/// it before the release, with the mock served on a controller and a node socket.
struct Fixture {
    tmp: tempfile::TempDir,
    plugin: MockPlugin,
    _controller_server: MockServer,
    node_server: Option<MockServer>,
    layout: Layout,
    info: VolumeInfo,
    request: ClaimRequest,
    target: PathBuf,
}

fn usage() -> PublishUsage {
    PublishUsage {
        read_only: false,
        attachment: AccessTypeKind::Mount,
        access_mode: AccessMode::SingleNodeWriter,
    }
}

impl Fixture {
    async fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let plugin = MockPlugin::builder().build().unwrap();
        let controller_server = plugin
            .serve_unix(tmp.path().join("controller.sock"))
            .await
            .unwrap();
        let node_server = plugin
            .serve_unix(tmp.path().join("node.sock"))
            .await
            .unwrap();
        let controller =
            CsiClient::new(Endpoint::unix(tmp.path().join("controller.sock")).unwrap());
        let node = CsiClient::new(Endpoint::unix(tmp.path().join("node.sock")).unwrap());
        let layout = Layout::new(tmp.path().join("data"));
        let plugin_node = node.fingerprint().await.unwrap().node.unwrap().node_id;
        let cap = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
        let volume = controller
            .controller()
            .create_volume(proto::CreateVolumeRequest {
                name: "claims-release".into(),
                volume_capabilities: vec![(&cap).into()],
                ..Default::default()
            })
            .await
            .unwrap();
        let context: PublishContext = controller
            .controller()
            .publish(
                &volume.volume_id,
                &plugin_node,
                &cap,
                false,
                &VolumeContext::new(),
                &Secrets::default(),
            )
            .await
            .unwrap();
        let id = VolumeId::new("vol-r").unwrap();
        let workload = WorkloadId::new("wl-r").unwrap();
        let staging = layout.staging_path(&id).unwrap();
        std::fs::create_dir_all(&staging).unwrap();
        node.node()
            .stage(&NodeStage {
                volume: &volume.volume_id,
                staging_target_path: &staging,
                capability: &cap,
                publish_context: &context,
                volume_context: &VolumeContext::new(),
                secrets: &Secrets::default(),
            })
            .await
            .unwrap();
        let target = layout.target_path(&id, &workload, &usage()).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        node.node()
            .publish(&NodePublish {
                volume: &volume.volume_id,
                staging_target_path: Some(&staging),
                target_path: &target,
                capability: &cap,
                readonly: false,
                publish_context: &context,
                volume_context: &VolumeContext::new(),
                secrets: &Secrets::default(),
            })
            .await
            .unwrap();
        assert!(target.is_dir(), "the mock made the target");
        assert_eq!(plugin.published_nodes(volume.volume_id.as_str()).len(), 1);
        let info = VolumeInfo {
            id: id.clone(),
            external_id: volume.volume_id.clone(),
            plugin: PluginId::new("mock").unwrap(),
            controller: ControllerRequirement::Required,
        };
        let request = ClaimRequest {
            volume: id,
            workload,
            node: NodeId::new("local").unwrap(),
            plugin_node,
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            attachment: AccessTypeKind::Mount,
        };
        // Only the release's calls matter from here on.
        plugin.calls().clear();
        Fixture {
            tmp,
            plugin,
            _controller_server: controller_server,
            node_server: Some(node_server),
            layout,
            info,
            request,
            target,
        }
    }

    fn node_socket(&self) -> PathBuf {
        self.tmp.path().join("node.sock")
    }

    fn controller_socket(&self) -> PathBuf {
        self.tmp.path().join("controller.sock")
    }

    /// The node plugin goes away: its server stops and its socket is removed.
    async fn stop_node_plugin(&mut self) {
        if let Some(server) = self.node_server.take() {
            server.shutdown().await.unwrap();
        }
        assert!(!self.node_socket().exists(), "the node socket is gone");
    }

    /// The node plugin comes back on the same socket path, with the same state.
    async fn start_node_plugin(&mut self) {
        assert!(self.node_server.is_none(), "the node plugin was stopped");
        let server = self.plugin.serve_unix(self.node_socket()).await.unwrap();
        self.node_server = Some(server);
    }

    /// The node adapter as the agent builds it: a client with the agent's
    /// [`NodeDetachPolicy::DEFAULT`] (one attempt per node detach RPC, a short socket wait).
    fn node_detacher(&self) -> ClientNodeDetacher {
        let client = NodeDetachPolicy::DEFAULT.client(Endpoint::unix(self.node_socket()).unwrap());
        ClientNodeDetacher::new(client, self.layout.clone(), true)
    }

    /// The controller adapter, over a client that makes one attempt per
    /// `ControllerUnpublishVolume`.
    fn controller_detacher(&self) -> ClientControllerDetacher {
        let client = CsiClient::builder(Endpoint::unix(self.controller_socket()).unwrap())
            .policy(Rpc::ControllerUnpublishVolume, |p| p.max_attempts = 1)
            .build();
        ClientControllerDetacher::new(client, Arc::new(NoSecrets))
    }

    /// The release's detach calls in the order the mock received them.
    fn detach_calls(&self) -> CallList {
        self.plugin.calls().snapshot().filter(|c| {
            matches!(
                c.rpc,
                Rpc::NodeUnpublishVolume | Rpc::NodeUnstageVolume | Rpc::ControllerUnpublishVolume
            )
        })
    }

    /// Nothing of the volume is left on the node or attached to it.
    fn assert_fully_detached(&self) {
        assert!(self.plugin.staged().is_empty(), "unstaged");
        assert!(self.plugin.published().is_empty(), "unpublished");
        assert!(
            self.plugin
                .published_nodes(self.info.external_id.as_str())
                .is_empty(),
            "controller-unpublished"
        );
        assert!(!self.target.exists(), "the target directory is gone");
    }
}

fn config(backoff: BackoffPolicy) -> DriverConfig {
    let mut config = DriverConfig::default();
    config.machine.backoff = backoff;
    config
}

/// Retries come after 10 to 50 ms.
fn quick() -> BackoffPolicy {
    BackoffPolicy::new(Duration::from_millis(10), Duration::from_millis(50)).unwrap()
}

/// No retry comes by itself within any test's life: only a wake-up moves the volume on.
fn an_hour() -> BackoffPolicy {
    BackoffPolicy::new(Duration::from_secs(3600), Duration::from_secs(3600)).unwrap()
}

/// Polls `status` until `done` holds; panics after the hang guard.
async fn wait_for_status(
    claims: &ClaimsHandle,
    volume: &VolumeId,
    done: impl Fn(&ReleaseStatus) -> bool,
) -> ReleaseStatus {
    let polled = tokio::time::timeout(GUARD, async {
        loop {
            if let Some(status) = claims.status(volume)
                && done(&status)
            {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    match polled {
        Ok(status) => status,
        Err(_) => panic!(
            "volume {volume} did not reach the awaited status within {GUARD:?}; last: {:?}",
            claims.status(volume)
        ),
    }
}

/// The volume failed its node step once and is backing off.
async fn wait_until_stuck(claims: &ClaimsHandle, volume: &VolumeId) -> ReleaseStatus {
    wait_for_status(claims, volume, |s| {
        s.attempts >= 1
            && matches!(s.pending, ReleaseWait::Backoff { .. })
            && s.next_retry.is_some()
    })
    .await
}

fn detach_error(status: &ReleaseStatus) -> &DetachError {
    match &status.last_error {
        Some(LastError::Detach { error, .. }) => error,
        other => panic!("expected a detach error, got {other:?}"),
    }
}

/// Asserts the volume is held in its node step after the node plugin was found missing:
/// one failed attempt, class `RetryElsewhere`, a retry scheduled, the claim still
/// `Releasing` (neither detached nor skipped), and no detach call reached the mock.
fn assert_held_in_node_step(f: &Fixture, claims: &ClaimsHandle, status: &ReleaseStatus) {
    assert_eq!(status.attempts, 1, "{status:?}");
    let error = detach_error(status);
    assert_eq!(error.rpc, DetachRpc::NodeUnpublish, "{error:?}");
    // csi-client: the socket could not be dialled at all, so this plugin instance cannot serve.
    assert_eq!(error.class, ErrorClass::RetryElsewhere, "{error:?}");
    assert_eq!(status.claims.len(), 1);
    assert_eq!(status.claims[0].state(), &ClaimState::Releasing);
    assert!(status.durable, "the release request is checkpointed");
    let stuck = claims.stuck();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0].volume, f.info.id);
    assert!(
        f.detach_calls().is_empty(),
        "no detach call reached the mock, and the controller step was not run: {:?}",
        f.detach_calls()
    );
    assert_eq!(
        f.plugin.published_nodes(f.info.external_id.as_str()).len(),
        1,
        "the volume is still attached to the node"
    );
}

/// The freed claim says both steps ran: unpublish plus unstage, then controller unpublish.
fn assert_freed_after_both_steps(state: &ClaimState) {
    assert_eq!(state.name(), "freed");
    assert_eq!(
        state.node_step(),
        Some(NodeStep::Detached { unstaged: true })
    );
    assert_eq!(state.controller_step(), Some(&ControllerStep::Detached));
}

#[tokio::test]
async fn node_plugin_missing_requeues_and_finishes_when_it_returns() {
    let mut f = Fixture::new().await;
    f.stop_node_plugin().await;
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::new(f.node_detacher()),
        Arc::new(f.controller_detacher()),
        config(an_hour()),
    )
    .await
    .unwrap();
    claims.claim(&f.info, f.request.clone()).await.unwrap();
    let waiter = {
        let claims = claims.clone();
        let volume = f.info.id.clone();
        let workload = f.request.workload.clone();
        tokio::spawn(async move { claims.release_and_wait(&volume, &workload).await })
    };

    let status = wait_until_stuck(&claims, &f.info.id).await;
    assert_held_in_node_step(&f, &claims, &status);
    assert!(!waiter.is_finished(), "the release is not done");

    // The plugin comes back; the agent's plugin watcher would report it. The hour-long
    // backoff has not passed, so only this wake-up can finish the release.
    f.start_node_plugin().await;
    claims.plugin_available(&f.info.plugin, Some(&f.request.node));
    let freed = tokio::time::timeout(GUARD, waiter)
        .await
        .expect("the release finishes once the plugin is back (hang guard)")
        .unwrap()
        .unwrap();
    assert_freed_after_both_steps(freed.state());
    f.detach_calls()
        .assert_runs(&[
            (Rpc::NodeUnpublishVolume, 1),
            (Rpc::NodeUnstageVolume, 1),
            (Rpc::ControllerUnpublishVolume, 1),
        ])
        .unwrap();
    f.assert_fully_detached();
    assert!(claims.stuck().is_empty(), "{:?}", claims.stuck());
    driver.shutdown().await;
}

#[tokio::test]
async fn controller_not_found_counts_as_done() {
    let f = Fixture::new().await;
    f.plugin
        .faults()
        .on(Rpc::ControllerUnpublishVolume)
        .fail(Code::NotFound, "scripted: volume not attached");
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::new(f.node_detacher()),
        Arc::new(f.controller_detacher()),
        // A retry would come quickly, so a NOT_FOUND wrongly taken for a failure would show
        // up as a second ControllerUnpublishVolume below.
        config(quick()),
    )
    .await
    .unwrap();
    claims.claim(&f.info, f.request.clone()).await.unwrap();
    let freed = tokio::time::timeout(
        GUARD,
        claims.release_and_wait(&f.info.id, &f.request.workload),
    )
    .await
    .expect("the release finishes (hang guard)")
    .unwrap();
    assert_freed_after_both_steps(freed.state());
    let calls = f.detach_calls();
    calls
        .assert_runs(&[
            (Rpc::NodeUnpublishVolume, 1),
            (Rpc::NodeUnstageVolume, 1),
            (Rpc::ControllerUnpublishVolume, 1),
        ])
        .unwrap();
    let controller = calls.of(Rpc::ControllerUnpublishVolume);
    assert_eq!(
        controller.records()[0].outcome.code(),
        Some(Code::NotFound),
        "the one controller call was answered NOT_FOUND"
    );
    assert!(claims.stuck().is_empty(), "{:?}", claims.stuck());
    driver.shutdown().await;
}

/// Where the claims layer said a volume stood as a node step started: failed attempts so
/// far, and the failed call with its class.
type Seen = (u32, Option<(DetachRpc, ErrorClass)>);

/// A [`NodeDetacher`] that, as each node step starts (with its unpublish), notes where the
/// claims layer says the volume stands: how many failed attempts and the last error's class.
struct Watching {
    inner: ClientNodeDetacher,
    claims: OnceLock<ClaimsHandle>,
    seen: Mutex<Vec<Seen>>,
}

#[async_trait]
impl NodeDetacher for Watching {
    async fn node_unpublish(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        let status = self
            .claims
            .get()
            .and_then(|claims| claims.status(&request.volume));
        if let Some(status) = status {
            let last = match &status.last_error {
                Some(LastError::Detach { error, .. }) => Some((error.rpc, error.class)),
                _ => None,
            };
            self.seen.lock().unwrap().push((status.attempts, last));
        }
        self.inner.node_unpublish(request).await
    }

    async fn node_unstage(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        self.inner.node_unstage(request).await
    }
}

#[tokio::test]
async fn unavailable_twice_backs_off_then_finishes() {
    let f = Fixture::new().await;
    f.plugin
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail_times(2, Code::Unavailable, "scripted: busy");
    let node = Arc::new(Watching {
        inner: f.node_detacher(),
        claims: OnceLock::new(),
        seen: Mutex::new(Vec::new()),
    });
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::clone(&node),
        Arc::new(f.controller_detacher()),
        config(quick()),
    )
    .await
    .unwrap();
    node.claims
        .set(claims.clone())
        .expect("the handle is set once, here");
    claims.claim(&f.info, f.request.clone()).await.unwrap();
    let freed = tokio::time::timeout(
        GUARD,
        claims.release_and_wait(&f.info.id, &f.request.workload),
    )
    .await
    .expect("the release finishes (hang guard)")
    .unwrap();
    assert_freed_after_both_steps(freed.state());

    // The client made one attempt per call (see the module docs), so the three unstage calls
    // are three node steps of the claims layer: two answered UNAVAILABLE, the third OK, and
    // only then the controller step, once.
    let calls = f.detach_calls();
    let unstage_codes: Vec<Option<Code>> = calls
        .of(Rpc::NodeUnstageVolume)
        .records()
        .iter()
        .map(|c| c.outcome.code())
        .collect();
    assert_eq!(
        unstage_codes,
        [Some(Code::Unavailable), Some(Code::Unavailable), None]
    );
    calls
        .filter(|c| {
            matches!(
                c.rpc,
                Rpc::NodeUnstageVolume | Rpc::ControllerUnpublishVolume
            )
        })
        .assert_runs(&[
            (Rpc::NodeUnstageVolume, 3),
            (Rpc::ControllerUnpublishVolume, 1),
        ])
        .unwrap();
    // Each retried node step was started by the claims layer with the failure counted and
    // classified: nothing woke it (no plugin or node event was sent), so the retries were
    // its backoff timer's.
    let seen = node.seen.lock().unwrap().clone();
    let retry = Some((DetachRpc::NodeUnstage, ErrorClass::Retry));
    assert_eq!(seen, [(0, None), (1, retry), (2, retry)]);
    f.assert_fully_detached();
    assert!(claims.stuck().is_empty(), "{:?}", claims.stuck());
    driver.shutdown().await;
}

/// Opens the redb file again once the crashed driver has let go of it (an aborted task drops
/// its store a moment later).
async fn reopen(path: &Path) -> RedbStore {
    let reopened = tokio::time::timeout(GUARD, async {
        loop {
            match RedbStore::open(path) {
                Ok(store) => return store,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await;
    reopened.expect("the crashed driver lets go of the database (hang guard)")
}

#[tokio::test]
async fn durable_release_survives_a_crash_while_the_node_plugin_is_missing() {
    let mut f = Fixture::new().await;
    let db = f.tmp.path().join("claims.redb");
    f.stop_node_plugin().await;

    // First life: the release starts, the node plugin is missing, the volume backs off.
    let store = Arc::new(RedbStore::open(&db).unwrap());
    let (claims, driver) = ClaimsDriver::start(
        Arc::clone(&store),
        Arc::new(f.node_detacher()),
        Arc::new(f.controller_detacher()),
        config(an_hour()),
    )
    .await
    .unwrap();
    claims.claim(&f.info, f.request.clone()).await.unwrap();
    claims
        .release(&f.info.id, &f.request.workload)
        .await
        .unwrap();
    let status = wait_until_stuck(&claims, &f.info.id).await;
    assert_held_in_node_step(&f, &claims, &status);
    // The file holds the whole claim, releasing, with the plugin's node id and the modes.
    let stored = store
        .load(&f.info.id)
        .await
        .unwrap()
        .expect("the volume is stored");
    let claim = stored
        .record
        .claim(&f.request.workload)
        .expect("the claim is stored");
    assert_eq!(claim.state(), &ClaimState::Releasing);
    assert_eq!(claim.plugin_node(), &f.request.plugin_node);
    assert_eq!(claim.access_mode(), AccessMode::SingleNodeWriter);
    assert_eq!(claim.attachment(), AccessTypeKind::Mount);
    assert_eq!(stored.record.info().external_id, f.info.external_id);

    // Crash.
    driver.abort();
    drop(claims);
    drop(store);

    // Second life on the same file, plugin still missing: the release resumes by itself
    // (nobody asks for it again) and is held in the node step again.
    let store = Arc::new(reopen(&db).await);
    let (claims, driver) = ClaimsDriver::start(
        Arc::clone(&store),
        Arc::new(f.node_detacher()),
        Arc::new(f.controller_detacher()),
        config(an_hour()),
    )
    .await
    .unwrap();
    let status = wait_until_stuck(&claims, &f.info.id).await;
    assert_held_in_node_step(&f, &claims, &status);

    // The plugin returns: the resumed release finishes, both steps once, node first.
    let waiter = {
        let claims = claims.clone();
        let volume = f.info.id.clone();
        let workload = f.request.workload.clone();
        tokio::spawn(async move { claims.release_and_wait(&volume, &workload).await })
    };
    f.start_node_plugin().await;
    claims.plugin_available(&f.info.plugin, Some(&f.request.node));
    let freed = tokio::time::timeout(GUARD, waiter)
        .await
        .expect("the resumed release finishes (hang guard)")
        .unwrap()
        .unwrap();
    assert_freed_after_both_steps(freed.state());
    f.detach_calls()
        .assert_runs(&[
            (Rpc::NodeUnpublishVolume, 1),
            (Rpc::NodeUnstageVolume, 1),
            (Rpc::ControllerUnpublishVolume, 1),
        ])
        .unwrap();
    f.assert_fully_detached();
    driver.shutdown().await;
    let left = store.load(&f.info.id).await.unwrap();
    assert!(
        left.as_ref()
            .is_none_or(|s| s.record.claim(&f.request.workload).is_none()),
        "the freed claim is gone from the file: {left:?}"
    );
}

/// A controller detacher that only counts its calls (the node step must come first).
#[derive(Default)]
struct CountingController {
    calls: Mutex<u32>,
}

#[async_trait]
impl ControllerDetacher for CountingController {
    async fn controller_unpublish(&self, _: &ControllerDetachRequest) -> Result<(), DetachError> {
        *self.calls.lock().unwrap() += 1;
        Ok(())
    }
}

/// The claim of [`Fixture`], for a volume that no plugin was ever asked about.
fn unplugged_claim() -> (VolumeInfo, ClaimRequest) {
    let info = VolumeInfo {
        id: VolumeId::new("vol-missing").unwrap(),
        external_id: csi_structs::ExternalVolumeId::new("ext-missing").unwrap(),
        plugin: PluginId::new("gone").unwrap(),
        controller: ControllerRequirement::Required,
    };
    let request = ClaimRequest {
        volume: info.id.clone(),
        workload: WorkloadId::new("wl-missing").unwrap(),
        node: NodeId::new("local").unwrap(),
        plugin_node: csi_structs::PluginNodeId::new("plugin-node").unwrap(),
        mode: ClaimMode::Write,
        access_mode: AccessMode::SingleNodeWriter,
        attachment: AccessTypeKind::Mount,
    };
    (info, request)
}

/// With csi-client's defaults a node step against a missing plugin socket made up to four
/// attempts of up to 30 s of dialling each (about two minutes, some 140 dials) before the
/// driver heard of it. The agent's node detach policy makes it one short attempt.
///
/// The clock is paused, so "how long" is tokio's virtual time: deterministic, and the test
/// takes no real time waiting. The hour-long release backoff keeps the volume where the
/// first failed step left it.
#[tokio::test(start_paused = true)]
async fn a_missing_node_plugin_fails_the_node_step_after_one_short_attempt() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = NodeDetachPolicy::DEFAULT;
    // No plugin ever serves this socket.
    let client = policy.client(Endpoint::unix(tmp.path().join("node.sock")).unwrap());
    let node = ClientNodeDetacher::new(client.clone(), Layout::new(tmp.path().join("data")), true);
    let controller = Arc::new(CountingController::default());
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::new(node),
        Arc::clone(&controller),
        config(an_hour()),
    )
    .await
    .unwrap();
    let (info, request) = unplugged_claim();
    claims.claim(&info, request.clone()).await.unwrap();
    let started = tokio::time::Instant::now();
    claims.release(&info.id, &request.workload).await.unwrap();
    let status = wait_until_stuck(&claims, &info.id).await;
    let waited = started.elapsed();

    assert_eq!(status.attempts, 1, "{status:?}");
    let error = detach_error(&status);
    assert_eq!(error.rpc, DetachRpc::NodeUnpublish, "{error:?}");
    assert_eq!(error.class, ErrorClass::RetryElsewhere, "{error:?}");
    assert_eq!(status.claims[0].state(), &ClaimState::Releasing);
    assert_eq!(*controller.calls.lock().unwrap(), 0, "no controller step");
    // One attempt of one socket wait: dials 10 ms, 20 ms, ... apart within 1 s, a handful.
    // csi-client's defaults dial about 36 times per attempt, four attempts.
    let dials = client.connection().dial_attempts();
    assert!((1..=10).contains(&dials), "{dials} dials");
    // Virtual time: the step failed within one socket wait (plus the 5 ms status poll), not
    // after four attempts of 30 s.
    assert!(
        waited <= policy.socket_wait + Duration::from_millis(50),
        "{waited:?} of virtual time"
    );
    driver.shutdown().await;
}
