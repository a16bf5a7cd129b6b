//! The attach path and the release pipeline together, on the mock plugin: what a node does
//! for the claims made on it, and undoes when they are released.

mod support;

use std::sync::Arc;

use csi_claims::driver::{ClaimsDriver, ClaimsHandle, DriverConfig, DriverError};
use csi_claims::machine::LastError;
use csi_claims::{
    Claim, ClaimMode, ClaimRequest, ControllerRequirement, DetachRpc, MemoryStore, NodeStep,
    VolumeInfo,
};
use csi_client::{Code, Rpc};
use csi_node::attach::{AttachError, Attacher};
use csi_node::detach::{ClientControllerDetacher, NoSecrets, VolumeNodeDetacher};
use csi_node::plugins::PluginEvent;
use csi_node::volumes::{MountRequest, UnmountRequest, VolumeError, VolumeManager};
use csi_structs::{
    AccessMode, AccessTypeKind, ErrorClass, MountOptions, NodeId, PluginId, RegisteredVolume,
    VolumeCapability, VolumeId, VolumeSpec, WorkloadId,
};
use csi_testkit::FaultStep;
use support::{GUARD, Plugin, mock_plugin, mock_plugin_probing_fast};
use tokio::time::Instant;

struct Node {
    plugin: Plugin,
    volumes: VolumeManager,
    attacher: Attacher,
    claims: ClaimsHandle,
    _driver: ClaimsDriver,
    me: NodeId,
}

impl std::ops::Deref for Node {
    type Target = Plugin;
    fn deref(&self) -> &Plugin {
        &self.plugin
    }
}

/// Node `n1` with the mock plugin: its volume manager, an attacher, and a claims driver
/// whose detachers are csi-node's.
async fn node() -> Node {
    node_on(mock_plugin().await).await
}

/// The same node over `plugin`.
async fn node_on(plugin: Plugin) -> Node {
    let volumes = plugin.volumes("csi");
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::new(VolumeNodeDetacher::new(volumes.clone())),
        Arc::new(ClientControllerDetacher::over(
            Arc::new(plugin.plugins.clone()),
            Arc::new(NoSecrets),
        )),
        DriverConfig::default(),
    )
    .await
    .expect("driver starts");
    let me = NodeId::new("n1").expect("id");
    Node {
        attacher: Attacher::new(me.clone(), plugin.plugins.clone(), volumes.clone()),
        volumes,
        plugin,
        claims,
        _driver: driver,
        me,
    }
}

impl Node {
    /// Releases a claim and waits until it is freed (hang guard only).
    async fn release(&self, volume: &VolumeId, workload: &WorkloadId) -> Claim {
        self.claims
            .release_and_wait_until(volume, workload, Instant::now() + GUARD)
            .await
            .expect("freed (hang guard)")
    }

    /// Creates `name` with every capability of `modes`, through the typed create.
    async fn create(&self, name: &str, modes: &[AccessMode]) -> RegisteredVolume {
        let spec = VolumeSpec::new(
            VolumeId::new(name).expect("id"),
            PluginId::new("mock").expect("id"),
            modes
                .iter()
                .map(|m| VolumeCapability::mount(*m, MountOptions::new()))
                .collect(),
        );
        let mut volume = RegisteredVolume::for_creation(spec).expect("valid spec");
        let ready = self.plugins.get(&volume.spec().plugin_id).expect("ready");
        let created = ready
            .client
            .controller()
            .create(volume.spec())
            .await
            .expect("created");
        volume.record_created(&created);
        volume
    }

    async fn claim(
        &self,
        volume: &RegisteredVolume,
        workload: &str,
        mode: ClaimMode,
        access_mode: AccessMode,
    ) -> Claim {
        let ready = self.plugins.get(&volume.spec().plugin_id).expect("ready");
        let info = VolumeInfo {
            id: volume.id().clone(),
            external_id: volume.external_id().expect("created").clone(),
            plugin: volume.spec().plugin_id.clone(),
            controller: ControllerRequirement::of(&ready.fingerprint.capabilities),
        };
        let plugin_node = ready
            .fingerprint
            .node
            .as_ref()
            .expect("node")
            .node_id
            .clone();
        self.claims
            .claim(
                &info,
                ClaimRequest {
                    volume: volume.id().clone(),
                    workload: WorkloadId::new(workload).expect("id"),
                    node: self.me.clone(),
                    plugin_node,
                    mode,
                    access_mode,
                    attachment: AccessTypeKind::Mount,
                },
            )
            .await
            .expect("claimed")
    }
}

#[tokio::test]
async fn the_first_claim_on_a_node_attaches_the_volume_and_the_last_release_detaches_it() {
    let node = node().await;
    let mode = AccessMode::SingleNodeMultiWriter;
    let volume = node.create("db", &[mode]).await;
    assert_eq!(node.mock.calls().count(Rpc::CreateVolume), 1);

    let a = node.claim(&volume, "a", ClaimMode::Write, mode).await;
    let first = node.attacher.attach(&volume, &a).await.expect("attached");
    assert!(first.controller_published && !first.read_only);
    let b = node.claim(&volume, "b", ClaimMode::Read, mode).await;
    let second = node.attacher.attach(&volume, &b).await.expect("attached");
    assert!(!second.controller_published, "once per node");
    assert!(second.read_only, "a read claim is published read-only");
    assert_eq!(second.publish_context, first.publish_context, "kept");
    let calls = node.mock.calls();
    assert_eq!(calls.count(Rpc::ControllerPublishVolume), 1);
    assert_eq!(calls.count(Rpc::NodeStageVolume), 1);
    assert_eq!(calls.count(Rpc::NodePublishVolume), 2);
    // Attaching again after a lost answer is safe and changes nothing.
    let again = node.attacher.attach(&volume, &a).await.expect("again");
    assert_eq!(again.target, first.target);
    assert_eq!(node.mock.calls().count(Rpc::ControllerPublishVolume), 1);

    let deadline = Instant::now() + GUARD;
    node.claims
        .release_and_wait_until(volume.id(), a.workload(), deadline)
        .await
        .expect("a freed");
    assert_eq!(
        node.mock.calls().count(Rpc::NodeUnstageVolume),
        0,
        "b still uses it"
    );
    assert_eq!(node.mock.calls().count(Rpc::ControllerUnpublishVolume), 0);
    node.claims
        .release_and_wait_until(volume.id(), b.workload(), deadline)
        .await
        .expect("b freed");
    let calls = node.mock.calls();
    assert_eq!(calls.count(Rpc::NodeUnpublishVolume), 2);
    assert_eq!(calls.count(Rpc::NodeUnstageVolume), 1);
    assert_eq!(calls.count(Rpc::ControllerUnpublishVolume), 1);
    assert!(node.mock.staged().is_empty() && node.mock.published().is_empty());
    assert!(
        node.mock
            .published_nodes(volume.external_id().expect("id").as_str())
            .is_empty()
    );
}

#[tokio::test]
async fn a_claim_that_does_not_fit_is_refused_before_any_call() {
    let node = node().await;
    let volume = node.create("db", &[AccessMode::SingleNodeWriter]).await;
    let other = node.create("other", &[AccessMode::SingleNodeWriter]).await;
    let claim = node
        .claim(&volume, "a", ClaimMode::Write, AccessMode::SingleNodeWriter)
        .await;
    let calls = node.mock.calls().len();
    let err = node
        .attacher
        .attach(&other, &claim)
        .await
        .expect_err("another volume");
    assert!(
        matches!(
            err,
            AttachError::Mismatch {
                field: "volume",
                ..
            }
        ),
        "{err}"
    );
    // A claim made on another node is that node's to attach.
    let elsewhere = Attacher::new(
        NodeId::new("n2").expect("id"),
        node.plugins.clone(),
        node.volumes("n2"),
    );
    let err = elsewhere
        .attach(&volume, &claim)
        .await
        .expect_err("not here");
    assert!(
        matches!(err, AttachError::Mismatch { field: "node", .. }),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
    assert_eq!(node.mock.calls().len(), calls, "no call was made");
}

/// A plugin whose health is not known to be good gets nothing published through it: the
/// attach is refused before any call, retryably, naming the plugin and its health.
#[tokio::test]
async fn a_claim_while_the_plugin_s_health_is_unknown_is_refused_before_any_call() {
    // Every Probe hangs: the plugin is fingerprinted, its health unknown until the first
    // probe's deadline, then unhealthy. Either way nothing may be published.
    let node = node_on(mock_plugin_probing_fast(true).await).await;
    let mode = AccessMode::SingleNodeWriter;
    let volume = node.create("db", &[mode]).await;
    let claim = node.claim(&volume, "a", ClaimMode::Write, mode).await;
    let err = node
        .attacher
        .attach(&volume, &claim)
        .await
        .expect_err("refused while health is not known to be good");
    let AttachError::Mount(VolumeError::NotHealthy { plugin, health }) = &err else {
        panic!("expected NotHealthy, got {err:?}");
    };
    assert_eq!(plugin.as_str(), "mock");
    assert!(!health.is_healthy(), "{health}");
    assert_eq!(err.class(), ErrorClass::Retry);
    let text = err.to_string();
    assert!(
        text.contains("plugin mock") && text.contains(&format!("its health is {health}")),
        "{text}"
    );
    let calls = node.mock.calls();
    for rpc in [
        Rpc::ControllerPublishVolume,
        Rpc::NodeStageVolume,
        Rpc::NodePublishVolume,
    ] {
        assert_eq!(calls.count(rpc), 0, "{rpc:?} was sent");
    }
    assert!(node.volumes("csi").records().is_empty(), "nothing recorded");
    // The claim is released all the same (nothing to undo on the node).
    node.release(volume.id(), claim.workload()).await;
}

/// Health is advice, not a gate, for clean-up: a plugin whose Probe hangs (reported
/// unhealthy) still gets its volume unpublished, unstaged and controller-unpublished.
#[tokio::test]
async fn a_plugin_whose_probe_hangs_still_gets_its_volume_released() {
    let node = node_on(mock_plugin_probing_fast(false).await).await;
    let mode = AccessMode::SingleNodeWriter;
    let volume = node.create("db", &[mode]).await;
    let claim = node.claim(&volume, "a", ClaimMode::Write, mode).await;
    node.attacher
        .attach(&volume, &claim)
        .await
        .expect("attached while healthy");

    let mut events = node.plugins.subscribe();
    node.mock.faults().on(Rpc::Probe).forever(FaultStep::Hang);
    tokio::time::timeout(GUARD, async {
        while !matches!(events.recv().await, Ok(PluginEvent::Unhealthy { .. })) {}
    })
    .await
    .expect("the hung probe makes it unhealthy (hang guard)");
    assert!(
        !node
            .plugins
            .status(&node.id)
            .expect("registered")
            .health
            .is_healthy()
    );

    node.release(volume.id(), claim.workload()).await;
    let calls = node.mock.calls();
    assert_eq!(calls.count(Rpc::NodeUnpublishVolume), 1);
    assert_eq!(calls.count(Rpc::NodeUnstageVolume), 1);
    assert_eq!(calls.count(Rpc::ControllerUnpublishVolume), 1);
    assert!(node.mock.staged().is_empty() && node.mock.published().is_empty());
    assert!(
        !node
            .plugins
            .status(&node.id)
            .expect("registered")
            .health
            .is_healthy(),
        "still unhealthy: the release did not wait for it"
    );
}

/// A failed attach undoes what it may have done before it returns: an uncertain controller
/// publish is unpublished; a mount that fails after the controller publish undoes itself and
/// the attach undoes the controller publish. The claim's release then has nothing left to do
/// but succeed.
#[tokio::test]
async fn a_failed_attach_undoes_what_it_may_have_done() {
    let node = node().await;
    let mode = AccessMode::SingleNodeWriter;
    let count = |rpc| node.mock.calls().count(rpc);

    // An uncertain ControllerPublishVolume (INTERNAL: it may have attached the volume).
    let db = node.create("db", &[mode]).await;
    let external = db.external_id().expect("created").as_str().to_owned();
    let a = node.claim(&db, "a", ClaimMode::Write, mode).await;
    node.mock
        .faults()
        .on(Rpc::ControllerPublishVolume)
        .fail(Code::Internal, "lost track");
    let err = node.attacher.attach(&db, &a).await.expect_err("uncertain");
    assert!(
        matches!(err, AttachError::ControllerPublish { .. }),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Uncertain);
    assert_eq!(count(Rpc::ControllerUnpublishVolume), 1, "undone");
    assert_eq!(count(Rpc::NodeStageVolume), 0);
    assert!(node.mock.published_nodes(&external).is_empty());
    node.release(db.id(), a.workload()).await;

    // The controller publish works, the node publish ends uncertain: every step is undone.
    let logs = node.create("logs", &[mode]).await;
    let external = logs.external_id().expect("created").as_str().to_owned();
    let b = node.claim(&logs, "b", ClaimMode::Write, mode).await;
    // The release of `a` sent ControllerUnpublishVolume again (answered: nothing to do).
    let unpublished = count(Rpc::ControllerUnpublishVolume);
    node.mock
        .faults()
        .on(Rpc::NodePublishVolume)
        .fail(Code::Internal, "lost track");
    let err = node
        .attacher
        .attach(&logs, &b)
        .await
        .expect_err("uncertain");
    assert!(matches!(err, AttachError::Mount(_)), "{err:?}");
    assert_eq!(count(Rpc::NodeUnpublishVolume), 1);
    assert_eq!(count(Rpc::NodeUnstageVolume), 1);
    assert_eq!(count(Rpc::ControllerUnpublishVolume), unpublished + 1);
    assert!(node.mock.published().is_empty() && node.mock.staged().is_empty());
    assert!(node.mock.published_nodes(&external).is_empty());
    assert!(node.volumes("csi").records().is_empty());
    node.release(logs.id(), b.workload()).await;
}

/// An uncertain controller publish whose undo fails too says so; releasing the claim
/// finishes the undo.
#[tokio::test]
async fn a_controller_publish_that_cannot_be_undone_is_left_to_the_release() {
    let node = node().await;
    let mode = AccessMode::SingleNodeWriter;
    let db = node.create("db", &[mode]).await;
    let external = db.external_id().expect("created").as_str().to_owned();
    let a = node.claim(&db, "a", ClaimMode::Write, mode).await;
    node.mock
        .faults()
        .on(Rpc::ControllerPublishVolume)
        .fail(Code::Internal, "lost track");
    node.mock
        .faults()
        .on(Rpc::ControllerUnpublishVolume)
        .fail(Code::InvalidArgument, "not now");
    let err = node.attacher.attach(&db, &a).await.expect_err("uncertain");
    let AttachError::ControllerNotUndone { failed, .. } = &err else {
        panic!("expected ControllerNotUndone, got {err:?}");
    };
    assert!(matches!(**failed, AttachError::ControllerPublish { .. }));
    assert_eq!(err.class(), ErrorClass::Uncertain);
    assert!(
        err.to_string().contains("releasing the claim retries it"),
        "{err}"
    );
    node.release(db.id(), a.workload()).await;
    let calls = node.mock.calls();
    assert_eq!(calls.count(Rpc::ControllerUnpublishVolume), 2);
    assert!(node.mock.published_nodes(&external).is_empty());
}

/// A freed claim never says a step was done that was not: the last claim's unstage is
/// confirmed with the volume manager, so a publication the claims do not know of (another
/// user of the volume here) keeps the claim releasing, its unstage step failing, until that
/// publication goes; then the claim is freed, the volume unstaged.
#[tokio::test]
async fn the_last_claim_s_unstage_is_confirmed_not_assumed() {
    let node = node().await;
    let mode = AccessMode::SingleNodeMultiWriter;
    let volume = node.create("db", &[mode]).await;
    let a = node.claim(&volume, "a", ClaimMode::Write, mode).await;
    node.attacher.attach(&volume, &a).await.expect("attached");
    let external_id = volume.external_id().expect("created").clone();
    let outside = WorkloadId::new("outside").expect("id");
    let capability = VolumeCapability::mount(mode, MountOptions::new());
    node.volumes
        .mount(&MountRequest {
            plugin: node.id.clone(),
            volume: volume.id().clone(),
            external_id: external_id.clone(),
            capability: capability.clone(),
            read_only: false,
            workload: outside.clone(),
            publish_context: node
                .volumes
                .publish_context(&node.id, volume.id())
                .unwrap_or_default(),
            volume_context: Default::default(),
            secrets: Default::default(),
        })
        .await
        .expect("published outside the claims");

    node.claims
        .release(volume.id(), a.workload())
        .await
        .expect("releasing");
    tokio::time::timeout(GUARD, async {
        loop {
            let soon = Instant::now() + std::time::Duration::from_millis(100);
            match node
                .claims
                .release_and_wait_until(volume.id(), a.workload(), soon)
                .await
            {
                Err(DriverError::StillReleasing {
                    status: Some(status),
                    ..
                }) if matches!(
                    &status.last_error,
                    Some(LastError::Detach { error, .. }) if error.rpc == DetachRpc::NodeUnstage
                ) =>
                {
                    let Some(LastError::Detach { error, .. }) = &status.last_error else {
                        unreachable!("matched above");
                    };
                    assert_eq!(error.class, ErrorClass::Retry);
                    assert!(error.detail.contains("outside"), "{}", error.detail);
                    break;
                }
                Err(DriverError::StillReleasing { .. }) => {}
                other => panic!("freed or failed while still staged here: {other:?}"),
            }
        }
    })
    .await
    .expect("the unstage step fails while the volume is still published (hang guard)");
    assert_eq!(node.mock.staged().len(), 1, "still staged");

    node.volumes
        .unmount(&UnmountRequest {
            plugin: node.id.clone(),
            volume: volume.id().clone(),
            external_id,
            workload: outside,
            usage: csi_node::layout::PublishUsage::of(&capability, false),
        })
        .await
        .expect("the last publication goes, and the staging with it");
    let freed = node.release(volume.id(), a.workload()).await;
    assert_eq!(
        freed.state().node_step(),
        Some(NodeStep::Detached { unstaged: true })
    );
    assert!(node.mock.staged().is_empty() && node.mock.published().is_empty());
}
