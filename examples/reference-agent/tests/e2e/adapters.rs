//! The detacher adapters driven by csi-claims' release pipeline against the mock: classes
//! kept as csi-client assigned them, no unstage call without staging, directories removed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use csi_claims::backoff::BackoffPolicy;
use csi_claims::driver::{ClaimsDriver, ControllerDetacher, DriverConfig, NodeDetacher};
use csi_claims::{
    ClaimMode, ClaimRequest, ControllerDetachRequest, ControllerRequirement, DetachError,
    DetachRpc, MemoryStore, NodeDetachRequest, VolumeInfo,
};
use csi_client::{Code, CsiClient, Endpoint, ErrorClass, NodePublish, NodeStage, Rpc, proto};
use csi_node::detach::{ClientControllerDetacher, ClientNodeDetacher, NoSecrets, NodeDetachPolicy};
use csi_node::layout::{Layout, PublishUsage};
use csi_structs::{
    AccessMode, AccessTypeKind, MountOptions, NodeId, PluginId, PublishContext, Secrets,
    VolumeCapability, VolumeContext, VolumeId, WorkloadId,
};
use csi_testkit::{MockPlugin, MockServer, NodeCapability};
use tokio::sync::mpsc;

const GUARD: Duration = Duration::from_secs(60);

/// One detach call the release pipeline made, and how it ended as the pipeline saw it.
#[derive(Debug)]
struct DetachRecord {
    rpc: DetachRpc,
    outcome: Result<(), DetachError>,
}

/// Wraps a node or a controller detacher, recording each of its calls.
#[derive(Debug)]
struct Observed<D: ?Sized> {
    inner: Arc<D>,
    records: mpsc::UnboundedSender<DetachRecord>,
}

impl<D: ?Sized> Observed<D> {
    fn new(inner: Arc<D>, records: mpsc::UnboundedSender<DetachRecord>) -> Self {
        Self { inner, records }
    }

    fn record(&self, rpc: DetachRpc, outcome: &Result<(), DetachError>) {
        let outcome = outcome.clone();
        self.records.send(DetachRecord { rpc, outcome }).unwrap();
    }
}

#[async_trait]
impl<D: NodeDetacher + ?Sized> NodeDetacher for Observed<D> {
    async fn node_unpublish(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        let outcome = self.inner.node_unpublish(request).await;
        self.record(DetachRpc::NodeUnpublish, &outcome);
        outcome
    }

    async fn node_unstage(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        let outcome = self.inner.node_unstage(request).await;
        self.record(DetachRpc::NodeUnstage, &outcome);
        outcome
    }
}

#[async_trait]
impl<D: ControllerDetacher + ?Sized> ControllerDetacher for Observed<D> {
    async fn controller_unpublish(
        &self,
        request: &ControllerDetachRequest,
    ) -> Result<(), DetachError> {
        let outcome = self.inner.controller_unpublish(request).await;
        self.record(DetachRpc::ControllerUnpublish, &outcome);
        outcome
    }
}

struct Published {
    _tmp: tempfile::TempDir,
    server: MockServer,
    endpoint: Endpoint,
    client: CsiClient,
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

/// A volume created, published to the node, staged (when `staging`) and published at the
/// layout's paths, as an agent would have done before the release.
async fn published(staging: bool) -> Published {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("csi.sock");
    let mut builder = MockPlugin::builder();
    if !staging {
        builder = builder.node_capabilities(Vec::<NodeCapability>::new());
    }
    let server = builder.build().unwrap().serve_unix(&socket).await.unwrap();
    let endpoint = Endpoint::unix(&socket).unwrap();
    let client = CsiClient::new(endpoint.clone());
    let layout = Layout::new(tmp.path().join("data"));
    let fingerprint = client.fingerprint().await.unwrap();
    let plugin_node = fingerprint.node.unwrap().node_id;
    let cap = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
    let volume = client
        .controller()
        .create_volume(proto::CreateVolumeRequest {
            name: "adapters".into(),
            volume_capabilities: vec![(&cap).into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let id = VolumeId::new("vol-a").unwrap();
    let workload = WorkloadId::new("wl-a").unwrap();
    let context: PublishContext = client
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
    let staging_path = layout.staging_path(&id).unwrap();
    if staging {
        std::fs::create_dir_all(&staging_path).unwrap();
        client
            .node()
            .stage(&NodeStage {
                volume: &volume.volume_id,
                staging_target_path: &staging_path,
                capability: &cap,
                publish_context: &context,
                volume_context: &VolumeContext::new(),
                secrets: &Secrets::default(),
            })
            .await
            .unwrap();
    }
    let target = layout.target_path(&id, &workload, &usage()).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    client
        .node()
        .publish(&NodePublish {
            volume: &volume.volume_id,
            staging_target_path: staging.then_some(staging_path.as_path()),
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
    Published {
        _tmp: tmp,
        server,
        endpoint,
        client,
        layout,
        info,
        request,
        target,
    }
}

/// Claims and releases through the pipeline with the adapters, the node detacher's client
/// built with [`NodeDetachPolicy::DEFAULT`]; returns every call record.
async fn release(p: &Published, staging: bool) -> Vec<DetachRecord> {
    release_with(p, staging, NodeDetachPolicy::DEFAULT).await
}

/// [`release`] with the node detacher's client built with `policy`.
async fn release_with(p: &Published, staging: bool, policy: NodeDetachPolicy) -> Vec<DetachRecord> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let node =
        ClientNodeDetacher::new(policy.client(p.endpoint.clone()), p.layout.clone(), staging);
    let controller = ClientControllerDetacher::new(p.client.clone(), Arc::new(NoSecrets));
    let mut config = DriverConfig::default();
    config.machine.backoff =
        BackoffPolicy::new(Duration::from_millis(10), Duration::from_millis(50)).unwrap();
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::new(Observed::new(Arc::new(node), tx.clone())),
        Arc::new(Observed::new(Arc::new(controller), tx)),
        config,
    )
    .await
    .unwrap();
    claims.claim(&p.info, p.request.clone()).await.unwrap();
    let freed = tokio::time::timeout(
        GUARD,
        claims.release_and_wait(&p.info.id, &p.request.workload),
    )
    .await
    .expect("the release finishes (hang guard)")
    .unwrap();
    assert_eq!(freed.state().name(), "freed");
    driver.shutdown().await;
    let mut records = Vec::new();
    while let Ok(record) = rx.try_recv() {
        records.push(record);
    }
    records
}

fn summary(records: &[DetachRecord]) -> Vec<(DetachRpc, Option<ErrorClass>)> {
    records
        .iter()
        .map(|r| (r.rpc, r.outcome.as_ref().err().map(|e| e.class)))
        .collect()
}

#[tokio::test]
async fn release_calls_node_then_controller_and_removes_the_directories() {
    let p = published(true).await;
    let records = release(&p, true).await;
    assert_eq!(
        summary(&records),
        [
            (DetachRpc::NodeUnpublish, None),
            (DetachRpc::NodeUnstage, None),
            (DetachRpc::ControllerUnpublish, None),
        ]
    );
    p.server
        .calls()
        .snapshot()
        .without_discovery()
        .filter(|c| {
            matches!(
                c.rpc,
                Rpc::NodeUnpublishVolume | Rpc::NodeUnstageVolume | Rpc::ControllerUnpublishVolume
            )
        })
        .assert_runs(&[
            (Rpc::NodeUnpublishVolume, 1),
            (Rpc::NodeUnstageVolume, 1),
            (Rpc::ControllerUnpublishVolume, 1),
        ])
        .unwrap();
    assert!(p.server.plugin().staged().is_empty());
    assert!(p.server.plugin().published().is_empty());
    assert!(!p.target.exists());
    assert!(
        !p.layout.workload_root().join("wl-a").exists(),
        "the workload's directory is gone"
    );
    assert!(
        !p.layout.staging_root().join("vol-a").exists(),
        "the volume's staging directory is gone"
    );
    assert!(
        p.layout.staging_root().exists() && p.layout.workload_root().exists(),
        "roots stay"
    );
}

#[tokio::test]
async fn classes_are_kept_as_csi_client_gave_them() {
    let p = published(true).await;
    let faults = p.server.faults();
    // NOT_FOUND on unpublish and on controller unpublish: already done (csi-client's class).
    faults
        .on(Rpc::NodeUnpublishVolume)
        .fail(Code::NotFound, "scripted: no such target");
    faults
        .on(Rpc::ControllerUnpublishVolume)
        .fail(Code::NotFound, "scripted: not attached");
    // INVALID_ARGUMENT on unstage: fatal; the pipeline retries the node step (unpublish, then
    // unstage) later and it then succeeds.
    faults
        .on(Rpc::NodeUnstageVolume)
        .fail(Code::InvalidArgument, "scripted: refused");
    let records = release(&p, true).await;
    assert_eq!(
        summary(&records),
        [
            (DetachRpc::NodeUnpublish, Some(ErrorClass::AlreadyDone)),
            (DetachRpc::NodeUnstage, Some(ErrorClass::Fatal)),
            (DetachRpc::NodeUnpublish, None),
            (DetachRpc::NodeUnstage, None),
            (
                DetachRpc::ControllerUnpublish,
                Some(ErrorClass::AlreadyDone)
            ),
        ]
    );
    let detail = &records[1].outcome.as_ref().unwrap_err().detail;
    assert!(
        detail.contains("NodeUnstageVolume"),
        "the detail names the RPC: {detail}"
    );
    // The unpublish answered NOT_FOUND without removing the target; the adapter still
    // removed the empty directory, as "already done" means the plugin is finished with it.
    assert!(!p.target.exists());
}

#[tokio::test]
async fn without_staging_the_unstage_request_makes_no_call() {
    let p = published(false).await;
    let records = release(&p, false).await;
    assert_eq!(
        summary(&records),
        [
            (DetachRpc::NodeUnpublish, None),
            (DetachRpc::NodeUnstage, None),
            (DetachRpc::ControllerUnpublish, None),
        ]
    );
    assert_eq!(p.server.calls().count(Rpc::NodeUnstageVolume), 0);
    assert_eq!(p.server.calls().count(Rpc::NodeUnpublishVolume), 1);
    assert!(!p.target.exists());
}

/// The attempt limit is the one in the client's policy rows: a node detacher whose client was
/// built with three attempts makes three within one call (the adapter used to override every
/// call with a limit of its own, one attempt, whatever the client said).
#[tokio::test]
async fn node_calls_make_the_attempts_of_the_clients_rows() {
    let p = published(true).await;
    p.server.faults().on(Rpc::NodeUnpublishVolume).fail_times(
        2,
        Code::Unavailable,
        "scripted: busy",
    );
    let policy = NodeDetachPolicy {
        max_attempts: 3,
        ..NodeDetachPolicy::DEFAULT
    };
    let records = release_with(&p, true, policy).await;
    // The two UNAVAILABLE answers were retried inside the first call: the pipeline saw no
    // failure.
    assert_eq!(
        summary(&records),
        [
            (DetachRpc::NodeUnpublish, None),
            (DetachRpc::NodeUnstage, None),
            (DetachRpc::ControllerUnpublish, None),
        ]
    );
    assert_eq!(p.server.calls().count(Rpc::NodeUnpublishVolume), 3);
    assert!(!p.target.exists());
}
