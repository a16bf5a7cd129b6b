//! csi-control's front door, `ControlPlane`: one call opens a node and its control plane,
//! with the safe defaults on (secrets from the catalog on every call that takes them, the
//! node's records confirmed after a restart, the service and the node closed together).

use std::time::Duration;

use csi_claims::ClaimMode;
use csi_client::{Endpoint, Rpc};
use csi_control::service::{ClaimVolume, NewSnapshot, NewVolume, RegisterVolume, SnapshotsOf};
use csi_control::{ControlPlane, PlaneError, ServiceEvent};
use csi_node::volumes::ReconcileAction;
use csi_structs::volume_secrets::{SecretsUse, VolumeSecrets};
use csi_structs::{AccessMode, ExternalVolumeId, NodeId, PluginId, VolumeId, WorkloadId};
use csi_testkit::{MockPlugin, MockPluginBuilder, MockServer, RecordedOutcome};
use tokio::time::Instant;

/// Only a guard against a hang: a healthy run needs a fraction of it.
const GUARD: Duration = Duration::from_secs(60);

/// The mock on a socket in a temporary directory, and the control plane's state beside it.
struct Setup {
    dir: tempfile::TempDir,
    mock: MockPlugin,
    _server: MockServer,
    plugin: PluginId,
}

impl Setup {
    async fn new(builder: MockPluginBuilder) -> Setup {
        let dir = tempfile::tempdir().expect("temp dir");
        let mock = builder.build().expect("mock");
        let server = mock
            .serve_unix(dir.path().join("mock.sock"))
            .await
            .expect("serves");
        Setup {
            dir,
            mock,
            _server: server,
            plugin: PluginId::new("mock").expect("id"),
        }
    }

    /// Opens the control plane on the state directory (the same one every time).
    async fn open(&self) -> ControlPlane {
        ControlPlane::builder(self.dir.path().join("state"), node())
            .call_timeout(Duration::from_secs(20))
            .open()
            .await
            .expect("the control plane opens")
    }

    /// Opens it, registers the mock and waits until it is ready.
    async fn open_with_plugin(&self) -> ControlPlane {
        let plane = self.open().await;
        let endpoint = Endpoint::unix(self.dir.path().join("mock.sock")).expect("endpoint");
        plane
            .register_plugin(self.plugin.clone(), endpoint)
            .await
            .expect("registered");
        plane
            .wait_for_plugin(&self.plugin, GUARD)
            .await
            .expect("the plugin is ready");
        plane
    }
}

impl Setup {
    /// Creates volume `data` (single-node writer) and claims it for `web-1`, published here.
    async fn claimed_volume(&self, plane: &ControlPlane) -> csi_control::service::Claimed {
        let new = NewVolume::new(
            id("data"),
            self.plugin.clone(),
            AccessMode::SingleNodeWriter,
        );
        plane.service().create(new).await.expect("created");
        plane
            .service()
            .claim(claim("data", "web-1", ClaimMode::Write))
            .await
            .expect("claimed")
    }
}

fn node() -> NodeId {
    NodeId::new("n1").expect("node id")
}

fn id(s: &str) -> VolumeId {
    VolumeId::new(s).expect("volume id")
}

fn workload(s: &str) -> WorkloadId {
    WorkloadId::new(s).expect("workload id")
}

fn claim(volume: &str, who: &str, mode: ClaimMode) -> ClaimVolume {
    ClaimVolume {
        volume: id(volume),
        workload: workload(who),
        mode,
    }
}

#[tokio::test]
async fn a_restart_restores_the_plugin_and_confirms_the_node_s_publications() {
    let setup = Setup::new(MockPlugin::builder()).await;
    let plane = setup.open_with_plugin().await;
    let claimed = setup.claimed_volume(&plane).await;
    let first = plane.reconciled().await;
    assert!(
        first.report.records.is_empty(),
        "a node opened on an empty directory has nothing to confirm: {:?}",
        first.report.records
    );
    let publishes = setup.mock.calls().count(Rpc::NodePublishVolume);
    plane.close().await.expect("closed");

    // Opened again without registering the plugin: it is restored, and the publication the
    // node's records hold is confirmed with it before it is trusted.
    let plane = setup.open().await;
    let reconciled = plane.reconciled().await;
    let actions: Vec<(ReconcileAction, Option<String>)> = reconciled
        .report
        .records
        .iter()
        .map(|r| (r.action(), r.workload.as_ref().map(ToString::to_string)))
        .collect();
    assert_eq!(
        actions,
        [(ReconcileAction::Republished, Some("web-1".to_owned()))]
    );
    assert!(reconciled.plugins_not_ready.is_empty());
    assert_eq!(
        reconciled.to_string(),
        "node's usage records confirmed: 1 record(s): 1 republished, 0 released, 0 kept, 0 not \
         confirmed"
    );
    assert_eq!(
        setup.mock.calls().count(Rpc::NodePublishVolume),
        publishes + 1
    );
    assert_eq!(
        plane
            .service()
            .volumes()
            .published(&id("data"), &workload("web-1")),
        Some(claimed.target_path)
    );

    // The claim was kept, and its release runs through the reopened node.
    plane
        .service()
        .release_and_wait(&id("data"), &workload("web-1"), Instant::now() + GUARD)
        .await
        .expect("released");
    assert!(setup.mock.published().is_empty() && setup.mock.staged().is_empty());
    let external = plane.service().catalog().get(&id("data")).expect("entry");
    assert!(
        setup
            .mock
            .published_nodes(external.external_id.as_str())
            .is_empty(),
        "controller-unpublished too"
    );
    plane.close().await.expect("closed");
}

/// Every call the control plane's clients report, as (RPC, volume, outcome).
#[derive(Debug, Default)]
struct SeenCalls(std::sync::Mutex<Vec<(Rpc, Option<String>, &'static str)>>);

impl csi_client::CallObserver for SeenCalls {
    fn on_call(&self, call: &csi_client::CallEvent) {
        let volume = call.volume.as_ref().map(ToString::to_string);
        let seen = (call.rpc, volume, call.outcome.label());
        self.0.lock().expect("not poisoned").push(seen);
    }
}

#[tokio::test]
async fn every_call_of_the_service_and_the_release_pipeline_reaches_the_call_observer() {
    use std::sync::Arc;
    let setup = Setup::new(MockPlugin::builder()).await;
    let seen = Arc::new(SeenCalls::default());
    let calls = Arc::new(csi_client::CallsInFlight::new());
    let plane = ControlPlane::builder(setup.dir.path().join("state"), node())
        .call_observer(Arc::clone(&seen) as Arc<dyn csi_client::CallObserver>)
        .calls_in_flight(Arc::clone(&calls))
        .open()
        .await
        .expect("opens");
    let endpoint = Endpoint::unix(setup.dir.path().join("mock.sock")).expect("endpoint");
    plane
        .register_plugin(setup.plugin.clone(), endpoint)
        .await
        .expect("registered");
    let ready = plane
        .wait_for_plugin(&setup.plugin, GUARD)
        .await
        .expect("ready");
    assert!(Arc::ptr_eq(ready.client.calls_in_flight(), &calls));
    assert!(Arc::ptr_eq(ready.detach.calls_in_flight(), &calls));
    drop(ready);
    // Only the volume's calls from here on: the fingerprint's and probes' are before.
    seen.0.lock().expect("not poisoned").clear();

    let service = plane.service();
    let new = NewVolume::new(
        id("data"),
        setup.plugin.clone(),
        AccessMode::SingleNodeWriter,
    );
    let created = service.create(new).await.expect("created");
    service
        .claim(claim("data", "web-1", ClaimMode::Write))
        .await
        .expect("claimed");
    service
        .release_and_wait(&id("data"), &workload("web-1"), Instant::now() + GUARD)
        .await
        .expect("released");
    service.delete(&id("data")).await.expect("deleted");

    let vol = Some(created.external_id.to_string());
    let volume_calls: Vec<_> = seen
        .0
        .lock()
        .expect("not poisoned")
        .iter()
        .filter(|(rpc, _, _)| *rpc != Rpc::Probe)
        .cloned()
        .collect();
    assert_eq!(
        volume_calls,
        [
            (Rpc::CreateVolume, None, "Ok"),
            (Rpc::ControllerPublishVolume, vol.clone(), "Ok"),
            (Rpc::NodeStageVolume, vol.clone(), "Ok"),
            (Rpc::NodePublishVolume, vol.clone(), "Ok"),
            (Rpc::NodeUnpublishVolume, vol.clone(), "Ok"),
            (Rpc::NodeUnstageVolume, vol.clone(), "Ok"),
            (Rpc::ControllerUnpublishVolume, vol.clone(), "Ok"),
            (Rpc::DeleteVolume, vol, "Ok"),
        ]
    );
    assert!(
        calls.list().is_empty(),
        "nothing in flight once all answered"
    );
    plane.close().await.expect("closed");
}

#[tokio::test]
async fn close_names_a_service_still_held_elsewhere() {
    let setup = Setup::new(MockPlugin::builder()).await;
    let plane = setup.open_with_plugin().await;
    let kept = std::sync::Arc::clone(plane.service());
    match plane.close().await {
        Err(PlaneError::ServiceHeld { node: n, holders }) => {
            assert_eq!((n, holders), (node(), 1));
        }
        other => panic!("expected the held service to be named: {other:?}"),
    }
    drop(kept);
    // Once the last handle is gone, the directory opens again.
    let plane = setup.open().await;
    plane.close().await.expect("closed");
}

#[tokio::test]
async fn a_release_s_progress_and_its_failed_step_come_on_the_service_s_stream() {
    let setup = Setup::new(MockPlugin::builder()).await;
    let plane = setup.open_with_plugin().await;
    setup.claimed_volume(&plane).await;
    setup
        .mock
        .faults()
        .on(Rpc::NodeUnpublishVolume)
        .fail(csi_client::Code::Unavailable, "the target is busy")
        .install();
    let mut events = plane.service().subscribe();
    plane
        .service()
        .release(&id("data"), &workload("web-1"))
        .await
        .expect("release durable");

    let mut seen = Vec::new();
    tokio::time::timeout(GUARD, async {
        loop {
            let event = events.recv().await.expect("the stream goes on");
            let freed = matches!(event, ServiceEvent::Freed { .. });
            seen.push(event);
            if freed {
                return;
            }
        }
    })
    .await
    .expect("freed within the guard");

    let failed = seen
        .iter()
        .find_map(|e| match e {
            ServiceEvent::ReleaseStepFailed(f) => Some(f),
            _ => None,
        })
        .expect("the failed step is an event");
    assert_eq!(failed.rpc, Some("NodeUnpublishVolume"));
    assert_eq!(failed.workload, Some(workload("web-1")));
    assert_eq!(failed.attempt, 1);
    assert!(
        failed.message.contains("the target is busy"),
        "the plugin's message is carried: {}",
        failed.message
    );
    let shown = ServiceEvent::ReleaseStepFailed(failed.clone()).to_string();
    assert!(
        shown.contains("NodeUnpublishVolume") && shown.contains("attempt 1"),
        "{shown}"
    );
    assert!(
        matches!(seen.first(), Some(ServiceEvent::ReleaseStarted { volume, .. }) if volume == &id("data")),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|e| matches!(
            e,
            ServiceEvent::ReleaseStepRecovered {
                failed_attempts: 1,
                ..
            }
        )),
        "{seen:?}"
    );
    assert_eq!(
        seen.last(),
        Some(&ServiceEvent::Freed {
            volume: id("data"),
            workload: workload("web-1"),
            node: node(),
        })
    );
    drop(events);
    plane.close().await.expect("closed");
}

// ---- secrets on every call that takes them ---------------------------------------------------

/// Secrets with one key per use (`create-key = create-secret`, `node-stage-key = …`), so a
/// call that got another use's set, or none, lacks the key its plugin requires.
fn secrets_per_use() -> VolumeSecrets {
    let text: String = SecretsUse::ALL
        .iter()
        .map(|u| format!("[{0}]\n{0}-key={0}-secret\n", u.name()))
        .collect();
    VolumeSecrets::parse_key_values(&text).expect("secrets text")
}

/// The whole life of a volume through the front door, with the volume's secrets: register
/// (validated), create, claim, a restart (the publication confirmed again), expand,
/// snapshots, release, delete, deregister. The first step that fails is named.
async fn whole_flow(setup: &Setup, secrets: VolumeSecrets) -> Result<(), String> {
    let plane = setup.open_with_plugin().await;
    let at = |step: &'static str| move |e: csi_control::ServiceError| format!("{step}: {e}");
    let service = plane.service();
    let legacy = RegisterVolume {
        secrets: secrets.clone(),
        ..RegisterVolume::new(
            id("legacy"),
            ExternalVolumeId::new("legacy").expect("id"),
            setup.plugin.clone(),
            AccessMode::SingleNodeWriter,
        )
    };
    service
        .register_volume(legacy)
        .await
        .map_err(at("register"))?;
    let new = NewVolume {
        capacity_bytes: 1 << 30,
        secrets,
        ..NewVolume::new(
            id("data"),
            setup.plugin.clone(),
            AccessMode::SingleNodeWriter,
        )
    };
    service.create(new).await.map_err(at("create"))?;
    service
        .claim(claim("data", "web-1", ClaimMode::Write))
        .await
        .map_err(at("claim"))?;
    plane.close().await.expect("closed");

    let plane = setup.open().await;
    let confirmed = plane.reconciled().await;
    if let Some(failed) = confirmed.report.failed().next() {
        return Err(format!("restart: {failed:?}"));
    }
    let service = plane.service();
    service
        .expand(&id("data"), 2 << 30)
        .await
        .map_err(at("expand"))?;
    let cut = NewSnapshot {
        name: "nightly".into(),
        parameters: Default::default(),
    };
    let snapshot = service
        .create_snapshot(&id("data"), cut)
        .await
        .map_err(at("create_snapshot"))?;
    let of_volume = SnapshotsOf::Volume(id("data"));
    service
        .list_snapshots(&of_volume)
        .await
        .map_err(at("list_snapshots"))?;
    service
        .delete_snapshot(&of_volume, &snapshot.id)
        .await
        .map_err(at("delete_snapshot"))?;
    service
        .release_and_wait(&id("data"), &workload("web-1"), Instant::now() + GUARD)
        .await
        .map_err(at("release"))?;
    service.delete(&id("data")).await.map_err(at("delete"))?;
    service
        .deregister_volume(&id("legacy"), false, false)
        .await
        .map_err(at("deregister"))?;
    plane.close().await.expect("closed");
    Ok(())
}

/// With a plugin that refuses `rpc` without the secret of `use_`, the whole flow succeeds,
/// `rpc` was called, and every call of it carried the secret.
async fn every_call_carries_its_secrets(rpc: Rpc, use_: SecretsUse) {
    let name = use_.name();
    let builder = MockPlugin::builder()
        .volume("legacy", 1 << 30)
        .require_secret(rpc, format!("{name}-key"), format!("{name}-secret"));
    let setup = Setup::new(builder).await;
    whole_flow(&setup, secrets_per_use())
        .await
        .unwrap_or_else(|e| panic!("{} with its secrets required: {e}", rpc.name()));
    let calls = setup.mock.calls().of(rpc);
    assert!(!calls.is_empty(), "the flow calls {}", rpc.name());
    for call in calls.records() {
        assert_eq!(
            call.outcome,
            RecordedOutcome::Ok,
            "{}: {call:?}",
            rpc.name()
        );
    }
}

macro_rules! secrets_reach {
    ($($test:ident: $rpc:ident, $use_:ident;)*) => {$(
        #[tokio::test]
        async fn $test() {
            every_call_carries_its_secrets(Rpc::$rpc, SecretsUse::$use_).await;
        }
    )*};
}

secrets_reach! {
    secrets_reach_validate_volume_capabilities: ValidateVolumeCapabilities, Validate;
    secrets_reach_create_volume: CreateVolume, Create;
    secrets_reach_controller_publish_volume: ControllerPublishVolume, ControllerPublish;
    secrets_reach_node_stage_volume: NodeStageVolume, NodeStage;
    secrets_reach_node_publish_volume: NodePublishVolume, NodePublish;
    secrets_reach_controller_expand_volume: ControllerExpandVolume, ControllerExpand;
    secrets_reach_node_expand_volume: NodeExpandVolume, NodeExpand;
    secrets_reach_create_snapshot: CreateSnapshot, Snapshot;
    secrets_reach_list_snapshots: ListSnapshots, Snapshot;
    secrets_reach_delete_snapshot: DeleteSnapshot, Snapshot;
    secrets_reach_controller_unpublish_volume: ControllerUnpublishVolume, ControllerPublish;
    secrets_reach_delete_volume: DeleteVolume, Delete;
}

#[tokio::test]
async fn a_volume_without_its_secrets_is_refused_by_such_a_plugin() {
    // The control: the same plugin refuses the flow when the volume has no secrets, so the
    // tests above would fail if a call lost them.
    let builder = MockPlugin::builder()
        .volume("legacy", 1 << 30)
        .require_secret(Rpc::CreateVolume, "create-key", "create-secret");
    let setup = Setup::new(builder).await;
    let failed = whole_flow(&setup, VolumeSecrets::default())
        .await
        .expect_err("refused without secrets");
    assert!(failed.starts_with("create:"), "{failed}");
    assert!(
        failed.contains("create-key"),
        "the plugin's refusal names the key: {failed}"
    );
    assert!(
        !failed.contains("create-secret"),
        "never the value: {failed}"
    );
}

// ---- a directory of csi-control's `Stores` -----------------------------------------------------

#[tokio::test]
async fn a_directory_laid_out_by_stores_is_taken_over_with_its_claims_and_records() {
    let setup = Setup::new(MockPlugin::builder()).await;
    let plane = setup.open_with_plugin().await;
    setup.claimed_volume(&plane).await;
    plane.close().await.expect("closed");
    // The embedded layout of `Stores` (the reference agent's data directory): the claims and
    // the usage records in `claims.redb` beside `volumes.json`, the paths under `node/`.
    let state = setup.dir.path().join("state");
    let database = state.join("node").join(csi_node::node::DATABASE_FILE);
    let claims_file = state.join(csi_control::stores::CLAIMS_FILE);
    std::fs::rename(&database, &claims_file).expect("laid out as Stores does");

    let plane = setup.open().await;
    assert!(database.exists() && !claims_file.exists(), "moved once");
    let reconciled = plane.reconciled().await;
    let actions: Vec<&str> = reconciled
        .report
        .records
        .iter()
        .map(|r| r.action().as_str())
        .collect();
    assert_eq!(actions, ["republished"], "the usage record came along");
    let state_now = plane.service().volume(&id("data")).expect("in the catalog");
    let holders: Vec<String> = state_now
        .claims
        .iter()
        .map(|(c, _)| c.workload().to_string())
        .collect();
    assert_eq!(holders, ["web-1"], "the claim came along");
    plane.close().await.expect("closed");

    // With both files there, neither is taken for the other.
    std::fs::copy(&database, &claims_file).expect("copied");
    match ControlPlane::open(&state, node()).await {
        Err(PlaneError::TwoDatabases { old, new }) => {
            assert_eq!((old, new), (claims_file, database));
        }
        other => panic!("expected both databases named: {other:?}"),
    }
}
