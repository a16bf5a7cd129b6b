//! The volume manager after a restart: its records restored from the usage file are
//! confirmed against the plugin before they are trusted. The mock keeps its storage in a
//! state file, so a test can restart it as after a host reboot (stagings and publications
//! gone, volumes and controller publications kept) or as a plugin restart (everything kept),
//! on the same socket; the node side restarts with a new plugin manager and a volume manager
//! opened from the same usage file.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_client::{Code, Endpoint, ErrorClass, Rpc};
use csi_node::layout::{Layout, PublishUsage};
use csi_node::plugins::{PluginManager, PluginManagerConfig};
use csi_node::volumes::{
    MountRequest, ReconcileOutcome, Reconciled, Republish, Restore, Restored, StepState,
    UnmountRequest, VolumeError, VolumeEvent, VolumeManager,
};
use csi_structs::{
    AccessMode, ExternalVolumeId, MountOptions, PluginId, PublishContext, Secrets,
    VolumeCapability, VolumeContext, VolumeId, WorkloadId,
};
use csi_testkit::{MockPlugin, MockServer, Quirk};
use support::{GUARD, create_and_attach};

fn capability() -> VolumeCapability {
    VolumeCapability::mount(AccessMode::SingleNodeMultiWriter, MountOptions::new())
}

fn workload(name: &str) -> WorkloadId {
    WorkloadId::new(name).expect("id")
}

/// A volume on the mock, attached to its node.
#[derive(Clone)]
struct Vol {
    id: VolumeId,
    external: ExternalVolumeId,
    context: PublishContext,
}

/// How the mock comes back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Restart {
    /// The host rebooted: nothing is staged or published on it any more.
    Reboot,
    /// Only the plugin restarted: what it staged and published is still there.
    Plugin,
}

/// One node: the mock on a socket with its state file, and the node side.
struct Host {
    dir: tempfile::TempDir,
    mock: MockPlugin,
    server: Option<MockServer>,
    plugins: PluginManager,
    volumes: VolumeManager,
    id: PluginId,
}

impl Host {
    async fn start() -> Host {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mock, server) = serve_mock(dir.path(), None).await;
        let plugins = plugin_manager(dir.path(), true).await;
        let volumes = open_volumes(dir.path(), &plugins);
        Host {
            dir,
            mock,
            server: Some(server),
            plugins,
            volumes,
            id: PluginId::new("mock").expect("id"),
        }
    }

    /// Creates volume `name` and attaches it to the mock's node.
    async fn volume(&self, name: &str) -> Vol {
        let (id, external, context) =
            create_and_attach(&self.plugins, &self.id, name, &capability()).await;
        Vol {
            id,
            external,
            context,
        }
    }

    fn mount(&self, vol: &Vol, w: &str) -> MountRequest {
        MountRequest {
            plugin: self.id.clone(),
            volume: vol.id.clone(),
            external_id: vol.external.clone(),
            capability: capability(),
            read_only: false,
            workload: workload(w),
            publish_context: vol.context.clone(),
            volume_context: VolumeContext::new(),
            secrets: Secrets::new().into(),
        }
    }

    fn unmount(&self, vol: &Vol, w: &str) -> UnmountRequest {
        UnmountRequest {
            plugin: self.id.clone(),
            volume: vol.id.clone(),
            external_id: vol.external.clone(),
            workload: workload(w),
            usage: PublishUsage::of(&capability(), false),
        }
    }

    /// Stops the mock and the node side, then starts them again: the mock from its state
    /// file (emptied of stagings and publications on a reboot), the node side with a new
    /// plugin manager (registering the mock unless `plugin_back` is false) and a volume
    /// manager opened from the same usage file. The call log starts empty.
    async fn restart(&mut self, how: Restart, plugin_back: bool, quirk: Option<Quirk>) {
        if let Some(server) = self.server.take() {
            server.shutdown().await.expect("mock stops");
        }
        self.plugins.shutdown();
        let state = self.dir.path().join("mock-state.json");
        if how == Restart::Reboot {
            let mut saved: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&state).expect("mock state")).expect("json");
            saved["staged"] = serde_json::json!([]);
            saved["published"] = serde_json::json!([]);
            std::fs::write(&state, serde_json::to_vec(&saved).expect("json")).expect("written");
        }
        let (mock, server) = serve_mock(self.dir.path(), quirk).await;
        self.mock = mock;
        self.server = Some(server);
        self.plugins = plugin_manager(self.dir.path(), plugin_back).await;
        self.volumes = open_volumes(self.dir.path(), &self.plugins);
    }

    /// The rpcs the mock saw about `vol`, in order (no discovery calls).
    fn rpcs(&self, vol: &Vol) -> Vec<Rpc> {
        self.mock
            .calls()
            .snapshot()
            .for_volume(vol.external.as_str())
            .without_discovery()
            .rpcs()
    }

    fn target(&self, vol: &Vol, w: &str) -> PathBuf {
        self.volumes
            .layout()
            .target_path(
                &vol.id,
                &workload(w),
                &PublishUsage::of(&capability(), false),
            )
            .expect("path")
    }
}

async fn serve_mock(dir: &Path, quirk: Option<Quirk>) -> (MockPlugin, MockServer) {
    let mut builder = MockPlugin::builder().state_file(dir.join("mock-state.json"));
    if let Some(q) = quirk {
        builder = builder.quirk(q);
    }
    let mock = builder.build().expect("mock");
    let server = mock
        .serve_unix(dir.join("mock.sock"))
        .await
        .expect("serves");
    (mock, server)
}

/// A plugin manager with the mock registered (and healthy) when `register` says so.
async fn plugin_manager(dir: &Path, register: bool) -> PluginManager {
    let plugins = PluginManager::builder(PluginManagerConfig::default())
        .start()
        .expect("starts");
    if register {
        let id = PluginId::new("mock").expect("id");
        plugins
            .register(
                id.clone(),
                Endpoint::unix(dir.join("mock.sock")).expect("endpoint"),
            )
            .expect("registered");
        plugins
            .wait_for(&id, tokio::time::Instant::now() + GUARD)
            .await
            .expect("fingerprinted and healthy (hang guard)");
    }
    plugins
}

fn open_volumes(dir: &Path, plugins: &PluginManager) -> VolumeManager {
    let root = dir.join("node");
    VolumeManager::open(
        Layout::new(&root),
        root.join("usage.json"),
        Arc::new(plugins.clone()),
    )
    .expect("opens")
}

/// The embedder's answer for every publication: still wanted, with the fields the mounts used.
fn republish(_: &Restored) -> Restore {
    Restore::Republish(Republish {
        capability: capability(),
        read_only: false,
        volume_context: VolumeContext::new(),
        secrets: Secrets::new().into(),
    })
}

fn actions(report: &Reconciled) -> Vec<(String, String, &'static str)> {
    report
        .records
        .iter()
        .map(|r| {
            (
                r.volume.to_string(),
                r.workload
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                r.action().as_str(),
            )
        })
        .collect()
}

/// Nomad's host reboot: the records say staged and published, the plugin has nothing. The
/// workload's next mount stages again before it publishes, instead of publishing onto a
/// staging path the plugin no longer has (FAILED_PRECONDITION, fatal).
#[tokio::test]
async fn after_a_host_reboot_the_next_mount_stages_again_before_it_publishes() {
    let mut host = Host::start().await;
    let db = host.volume("db").await;
    for w in ["w1", "w2"] {
        host.volumes
            .mount(&host.mount(&db, w))
            .await
            .expect("mounted");
    }

    host.restart(Restart::Reboot, true, None).await;
    assert!(host.mock.staged().is_empty() && host.mock.published().is_empty());
    let record = host.volumes.record(&host.id, &db.id).expect("restored");
    assert_eq!(
        record.stage,
        Some(StepState::Done),
        "the record says staged"
    );

    let target = host
        .volumes
        .mount(&host.mount(&db, "w1"))
        .await
        .expect("mounted again after the reboot");
    assert_eq!(target, host.target(&db, "w1"));
    assert_eq!(
        host.rpcs(&db),
        [Rpc::NodeStageVolume, Rpc::NodePublishVolume],
        "staged again, then published"
    );
    assert_eq!(host.mock.staged().len(), 1);
    assert_eq!(host.mock.published().len(), 1);

    // The staging is confirmed now: w2's mount publishes only.
    host.volumes
        .mount(&host.mount(&db, "w2"))
        .await
        .expect("w2 mounted");
    assert_eq!(
        host.rpcs(&db),
        [
            Rpc::NodeStageVolume,
            Rpc::NodePublishVolume,
            Rpc::NodePublishVolume
        ]
    );
    assert_eq!(host.mock.published().len(), 2);
}

/// The same reboot, confirmed at once by reconcile: every volume staged again, every
/// publication the embedder still wants published again, one the embedder does not know kept
/// unconfirmed (and staged again by its next mount); a second reconcile calls nothing.
#[tokio::test]
async fn after_a_host_reboot_reconcile_stages_and_publishes_every_record_again() {
    let mut host = Host::start().await;
    let db = host.volume("db").await;
    let logs = host.volume("logs").await;
    let tmp = host.volume("tmp").await;
    for (vol, w) in [(&db, "w1"), (&db, "w2"), (&logs, "w1"), (&tmp, "w3")] {
        host.volumes
            .mount(&host.mount(vol, w))
            .await
            .expect("mounted");
    }

    host.restart(Restart::Reboot, true, None).await;
    let mut events = host.volumes.subscribe();
    let lookup = |p: &Restored| {
        if p.workload.as_str() == "w3" {
            Restore::Keep
        } else {
            republish(p)
        }
    };
    let report = host.volumes.reconcile(&lookup).await;
    let row = |v: &str, w: &str, a| (v.to_owned(), w.to_owned(), a);
    assert_eq!(
        actions(&report),
        [
            row("db", "w1", "republished"),
            row("db", "w2", "republished"),
            row("logs", "w1", "republished"),
            row("tmp", "w3", "kept"),
        ]
    );
    assert!(!report.is_complete(), "tmp is not confirmed");
    assert_eq!(report.failed().count(), 0);
    assert_eq!(
        report.to_string(),
        "4 record(s): 3 republished, 0 released, 1 kept, 0 not confirmed"
    );
    let restaged: Vec<bool> = report
        .records
        .iter()
        .filter_map(|r| match &r.outcome {
            ReconcileOutcome::Republished { restaged, .. } => Some(*restaged),
            _ => None,
        })
        .collect();
    assert_eq!(restaged, [true, false, true], "one stage per volume");
    for r in &report.records {
        assert_eq!(r.found.stage, Some(StepState::Done), "{r}");
        assert_eq!(r.found.publish, Some(StepState::Done), "{r}");
        // The mock never mounts: the host's table shows no mount at either path.
        assert_eq!(r.found.target_mounted, Some(false), "{r}");
        assert_eq!(r.found.staging_mounted, Some(false), "{r}");
    }
    assert_eq!(
        host.rpcs(&db),
        [
            Rpc::NodeStageVolume,
            Rpc::NodePublishVolume,
            Rpc::NodePublishVolume
        ]
    );
    assert_eq!(
        host.rpcs(&logs),
        [Rpc::NodeStageVolume, Rpc::NodePublishVolume]
    );
    assert!(host.rpcs(&tmp).is_empty(), "kept: nothing called");
    assert_eq!(host.mock.staged().len(), 2);
    assert_eq!(host.mock.published().len(), 3);
    for want in &report.records {
        match events.recv().await.expect("event") {
            VolumeEvent::Reconcile(got) => {
                assert_eq!(
                    (got.volume, got.workload),
                    (want.volume.clone(), want.workload.clone())
                );
            }
            other => panic!("expected a reconcile event, got {other:?}"),
        }
    }

    // Again: what was confirmed is not called again; tmp is still unconfirmed and kept.
    host.mock.calls().clear();
    let again = host.volumes.reconcile(&lookup).await;
    assert_eq!(
        actions(&again),
        [
            row("db", "w1", "already_confirmed"),
            row("db", "w2", "already_confirmed"),
            row("logs", "w1", "already_confirmed"),
            row("tmp", "w3", "kept"),
        ]
    );
    assert!(host.mock.calls().snapshot().without_discovery().is_empty());

    // tmp's workload mounts again: staged, then published.
    host.volumes
        .mount(&host.mount(&tmp, "w3"))
        .await
        .expect("w3 mounted");
    assert_eq!(
        host.rpcs(&tmp),
        [Rpc::NodeStageVolume, Rpc::NodePublishVolume]
    );
}

/// The node side restarts while the plugin keeps what it staged and published: the repeated
/// stage and publish are answered OK (idempotent) and nothing is torn down. A staging left by
/// an unmount whose unstage failed before the restart is cleaned up.
#[tokio::test]
async fn after_a_plugin_restart_the_repeated_calls_are_answered_ok_and_nothing_is_torn_down() {
    let mut host = Host::start().await;
    let db = host.volume("db").await;
    let logs = host.volume("logs").await;
    for w in ["w1", "w2"] {
        host.volumes
            .mount(&host.mount(&db, w))
            .await
            .expect("mounted");
    }
    host.volumes
        .mount(&host.mount(&logs, "w1"))
        .await
        .expect("mounted");
    // logs' unmount unpublishes, then its unstage fails: the record keeps the staging alone.
    host.mock
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail(Code::Internal, "busy");
    let err = host
        .volumes
        .unmount(&host.unmount(&logs, "w1"))
        .await
        .expect_err("unstage failed");
    assert!(
        matches!(
            err,
            VolumeError::Call {
                step: "NodeUnstageVolume",
                ..
            }
        ),
        "{err:?}"
    );
    let staged = host.mock.staged();
    let published = host.mock.published();
    assert_eq!((staged.len(), published.len()), (2, 2));

    host.restart(Restart::Plugin, true, None).await;
    let report = host.volumes.reconcile(&republish).await;
    let row = |v: &str, w: &str, a| (v.to_owned(), w.to_owned(), a);
    assert_eq!(
        actions(&report),
        [
            row("db", "w1", "republished"),
            row("db", "w2", "republished"),
            row("logs", "", "cleaned"),
        ]
    );
    assert!(report.is_complete());
    assert_eq!(
        host.rpcs(&db),
        [
            Rpc::NodeStageVolume,
            Rpc::NodePublishVolume,
            Rpc::NodePublishVolume
        ],
        "db: confirmed, nothing torn down"
    );
    assert!(
        host.mock
            .calls()
            .all()
            .iter()
            .all(|c| c.outcome.code().is_none()),
        "every call answered OK: {:?}",
        host.mock.calls().all()
    );
    assert_eq!(host.rpcs(&logs), [Rpc::NodeUnstageVolume]);
    assert_eq!(host.mock.staged().len(), 1);
    assert_eq!(host.mock.published(), published);
    assert!(host.volumes.record(&host.id, &logs.id).is_none());
}

/// A workload gone while the node was down is released through the plugin after the
/// restart, whatever the plugin has left: by its unmount (the record is restored, so the
/// unpublish is sent even though its target directory is gone) and by reconcile when the
/// embedder says so. NOT_FOUND counts as done, and no record is left behind.
#[tokio::test]
async fn a_restored_record_of_a_gone_workload_is_released_through_the_plugin() {
    let mut host = Host::start().await;
    let db = host.volume("db").await;
    let logs = host.volume("logs").await;
    host.volumes
        .mount(&host.mount(&db, "w1"))
        .await
        .expect("mounted");
    host.volumes
        .mount(&host.mount(&logs, "w2"))
        .await
        .expect("mounted");

    // The plugin answers NOT_FOUND to an unpublish or unstage of what it does not have.
    host.restart(
        Restart::Reboot,
        true,
        Some(Quirk::NotFoundOnRepeatedUnpublish),
    )
    .await;
    let target = host.target(&db, "w1");
    std::fs::remove_dir(&target).expect("the target directory goes");

    let done = host
        .volumes
        .unmount(&host.unmount(&db, "w1"))
        .await
        .expect("released");
    assert!(done.unpublished && done.unstaged, "{done:?}");
    assert_eq!(
        host.rpcs(&db),
        [Rpc::NodeUnpublishVolume, Rpc::NodeUnstageVolume]
    );
    let codes: Vec<Option<Code>> = host
        .mock
        .calls()
        .snapshot()
        .for_volume(db.external.as_str())
        .without_discovery()
        .records()
        .iter()
        .map(|c| c.outcome.code())
        .collect();
    assert_eq!(codes, [Some(Code::NotFound), Some(Code::NotFound)]);
    assert!(host.volumes.record(&host.id, &db.id).is_none());

    // logs' workload is gone too; the embedder says so to reconcile.
    let report = host
        .volumes
        .reconcile(&|_: &Restored| Restore::Release)
        .await;
    assert_eq!(report.records.len(), 1);
    match &report.records[0].outcome {
        ReconcileOutcome::Released(done) => assert!(done.unpublished && done.unstaged),
        other => panic!("expected released, got {other:?}"),
    }
    assert_eq!(
        host.rpcs(&logs),
        [Rpc::NodeUnpublishVolume, Rpc::NodeUnstageVolume]
    );
    assert!(host.volumes.records().is_empty());
    // Written: a restart finds nothing left.
    host.restart(Restart::Plugin, true, None).await;
    assert!(host.volumes.records().is_empty());
    assert!(!host.target(&logs, "w2").exists());
}

/// `reconcile_where` confirms the records it picks and leaves the others as they are, for a
/// later call: released records first (what waits on them goes on), republished ones after.
#[tokio::test]
async fn reconcile_where_confirms_only_the_records_it_picks() {
    let mut host = Host::start().await;
    let db = host.volume("db").await;
    let logs = host.volume("logs").await;
    for (vol, w) in [(&db, "w1"), (&logs, "w2")] {
        host.volumes
            .mount(&host.mount(vol, w))
            .await
            .expect("mounted");
    }
    host.restart(Restart::Plugin, true, None).await;

    let gone = db.id.clone();
    let first = host
        .volumes
        .reconcile_where(&|_: &Restored| Restore::Release, &|r| r.volume == gone)
        .await;
    assert_eq!(
        actions(&first),
        [("db".to_owned(), "w1".to_owned(), "released")]
    );
    assert!(host.rpcs(&logs).is_empty(), "logs not picked: not called");
    assert!(host.volumes.record(&host.id, &db.id).is_none());
    assert!(host.volumes.record(&host.id, &logs.id).is_some());

    let rest = host.volumes.reconcile(&republish).await;
    assert_eq!(
        actions(&rest),
        [("logs".to_owned(), "w2".to_owned(), "republished")]
    );
}

/// A restored record whose plugin never comes back: reconcile reports it with an error
/// naming the plugin and the volume, calls nothing and keeps it; so do a mount and an
/// unmount, for the release pipeline to finish once the plugin is back.
#[tokio::test]
async fn a_restored_record_whose_plugin_never_comes_back_is_kept_with_an_error_naming_it() {
    let mut host = Host::start().await;
    let db = host.volume("db").await;
    host.volumes
        .mount(&host.mount(&db, "w1"))
        .await
        .expect("mounted");

    host.restart(Restart::Reboot, false, None).await;
    let report = host.volumes.reconcile(&republish).await;
    assert_eq!(report.records.len(), 1);
    let record = &report.records[0];
    let ReconcileOutcome::PluginMissing(err) = &record.outcome else {
        panic!("expected plugin missing, got {:?}", record.outcome);
    };
    assert!(
        matches!(err, VolumeError::NotConfirmed { source, .. } if matches!(**source, VolumeError::PluginMissing { .. })),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::RetryElsewhere);
    let text = err.to_string();
    assert!(
        text.contains("plugin mock") && text.contains("volume db"),
        "{text}"
    );
    assert!(!report.is_complete());
    assert_eq!(report.failed().count(), 1);

    let unmount = host
        .volumes
        .unmount(&host.unmount(&db, "w1"))
        .await
        .expect_err("no plugin");
    assert!(
        matches!(unmount, VolumeError::PluginMissing { .. }),
        "{unmount:?}"
    );
    assert!(host.mock.calls().snapshot().without_discovery().is_empty());
    let kept = host.volumes.record(&host.id, &db.id).expect("kept");
    assert_eq!(kept.stage, Some(StepState::Done));
    assert!(kept.users.contains_key("w1"));
}

/// The same rule without a restart: a staging whose unstage failed is not known to be whole
/// any more, so the next mount stages again, and reconcile (asked meanwhile) cleans it up
/// rather than trusting it.
#[tokio::test]
async fn a_staging_whose_unstage_failed_is_not_trusted_any_more() {
    let host = Host::start().await;
    let db = host.volume("db").await;
    host.volumes
        .mount(&host.mount(&db, "w1"))
        .await
        .expect("mounted");
    host.mock
        .faults()
        .on(Rpc::NodeUnstageVolume)
        .fail(Code::Internal, "lost track");
    host.volumes
        .unmount(&host.unmount(&db, "w1"))
        .await
        .expect_err("the unstage failed");
    let record = host.volumes.record(&host.id, &db.id).expect("kept");
    assert!(record.users.is_empty() && record.stage == Some(StepState::Done));

    host.mock.calls().clear();
    host.volumes
        .mount(&host.mount(&db, "w2"))
        .await
        .expect("w2 mounted");
    assert_eq!(
        host.rpcs(&db),
        [Rpc::NodeStageVolume, Rpc::NodePublishVolume],
        "staged again"
    );

    // Seen to succeed now: reconcile leaves it alone.
    host.mock.calls().clear();
    let report = host.volumes.reconcile(&republish).await;
    assert_eq!(
        actions(&report),
        [("db".to_owned(), "w2".to_owned(), "already_confirmed")]
    );
    assert!(host.rpcs(&db).is_empty());
}
