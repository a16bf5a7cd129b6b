//! The volume manager on the mock plugin: turns per volume, usage restored on reopen,
//! uncertain outcomes, events, a plugin that sees the data directory elsewhere, the older
//! usage file format, a node plugin gone.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use csi_client::{Code, Endpoint, ErrorClass, NodePublish, NodeStage, Rpc, proto};
use csi_node::layout::{Layout, PublishUsage};
use csi_node::plugins::{PluginManager, PluginManagerConfig};
use csi_node::state::StateFileError;
use csi_node::volumes::{
    ExpandRequest, MountRequest, StepState, UnmountRequest, Unmounted, VolumeError, VolumeEvent,
    VolumeManager,
};
use csi_structs::{
    AccessMode, CapacityRange, ExternalVolumeId, MountOptions, PluginId, PublishContext, Secrets,
    VolumeCapability, VolumeContext, VolumeId, VolumeSecrets, WorkloadId,
};
use csi_testkit::disk::StalledFile;
use csi_testkit::{FaultStep, MockPlugin};
use support::{
    GUARD, Made, Plugin, create_and_attach, mock_plugin, mount_request, unmount_request,
};

/// The mock plugin; volumes are created on it and published to its node.
struct Node {
    plugin: Plugin,
}

impl std::ops::Deref for Node {
    type Target = Plugin;
    fn deref(&self) -> &Plugin {
        &self.plugin
    }
}

async fn node() -> Node {
    Node {
        plugin: mock_plugin().await,
    }
}

fn capability() -> VolumeCapability {
    VolumeCapability::mount(AccessMode::SingleNodeMultiWriter, MountOptions::new())
}

impl Node {
    fn manager(&self) -> VolumeManager {
        self.volumes("node")
    }

    /// Creates volume `name` and publishes it to the mock's node.
    async fn volume(&self, name: &str) -> (VolumeId, ExternalVolumeId, PublishContext) {
        create_and_attach(&self.plugins, &self.id, name, &capability()).await
    }

    fn mount(&self, made: &Made, workload: &str) -> MountRequest {
        mount_request(self, made, workload, &capability())
    }

    fn unmount(&self, made: &Made, workload: &str) -> UnmountRequest {
        unmount_request(self, made, workload, &capability())
    }
}

fn no_aborted(mock: &MockPlugin) -> bool {
    mock.calls()
        .all()
        .iter()
        .all(|c| c.outcome.code() != Some(Code::Aborted))
}

#[tokio::test]
async fn an_unmount_during_another_workload_s_publish_waits_and_keeps_the_staging() {
    let node = node().await;
    let volumes = node.manager();
    let db = node.volume("db").await;
    volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect("w1 mounted");

    // w2's publish takes a while; w1's unmount comes in the middle of it.
    node.mock
        .faults()
        .on(Rpc::NodePublishVolume)
        .then_delay(Duration::from_millis(300));
    let mount = tokio::spawn({
        let volumes = volumes.clone();
        let request = node.mount(&db, "w2");
        async move { volumes.mount(&request).await }
    });
    node.mock
        .calls()
        .wait_for(GUARD, |c| c.count(Rpc::NodePublishVolume) == 2)
        .await
        .expect("w2's publish reached the plugin (hang guard)");
    let unmounted = volumes
        .unmount(&node.unmount(&db, "w1"))
        .await
        .expect("w1 unmounted");
    let target = mount.await.expect("task").expect("w2 mounted");

    assert_eq!(
        unmounted,
        Unmounted {
            unpublished: true,
            unstaged: false
        },
        "w2 still uses the volume"
    );
    assert_eq!(node.mock.calls().count(Rpc::NodeUnstageVolume), 0);
    assert_eq!(node.mock.staged().len(), 1);
    let published = node.mock.published();
    assert_eq!(published.len(), 1, "{published:?}");
    assert_eq!(Path::new(&published[0].path), target.as_path());
    // The calls on the volume did not overlap: the mock answers ABORTED to a call on a
    // volume that has one in flight.
    assert!(no_aborted(&node.mock));
}

#[tokio::test]
async fn operations_on_one_volume_take_turns_while_other_volumes_go_on() {
    let node = node().await;
    let volumes = node.manager();
    let a = node.volume("a").await;
    let b = node.volume("b").await;
    node.mock
        .faults()
        .on(Rpc::NodeStageVolume)
        .for_volume(a.1.as_str())
        .hang();
    let spawn_mount = |workload: &'static str| {
        let volumes = volumes.clone();
        let request = node.mount(&a, workload);
        tokio::spawn(async move { volumes.mount(&request).await })
    };
    let first = spawn_mount("w1");
    node.mock
        .calls()
        .wait_for(GUARD, |c| {
            c.for_volume(a.1.as_str()).count(Rpc::NodeStageVolume) == 1
        })
        .await
        .expect("a's stage reached the plugin (hang guard)");
    let second = spawn_mount("w2");

    // Volume b is mounted while a's stage hangs.
    volumes
        .mount(&node.mount(&b, "w1"))
        .await
        .expect("b mounted meanwhile");
    assert!(!first.is_finished() && !second.is_finished());
    let of_a = node.mock.calls().for_volume(a.1.as_str());
    assert_eq!(of_a.count(Rpc::NodeStageVolume), 1, "w2 waits its turn");
    assert_eq!(of_a.count(Rpc::NodePublishVolume), 0);

    // The hung stage is answered UNAVAILABLE and retried; then both publish, one by one.
    node.mock.faults().release_hung();
    first.await.expect("task").expect("a mounted for w1");
    second.await.expect("task").expect("a mounted for w2");
    let of_a = node.mock.calls().for_volume(a.1.as_str());
    assert_eq!(of_a.count(Rpc::NodeStageVolume), 2, "one hung, one retried");
    assert_eq!(of_a.count(Rpc::NodePublishVolume), 2);
    assert!(no_aborted(&node.mock));
}

#[tokio::test]
async fn a_reopened_manager_knows_who_uses_what() {
    let node = node().await;
    let volumes = node.manager();
    let db = node.volume("db").await;
    for w in ["w1", "w2"] {
        volumes.mount(&node.mount(&db, w)).await.expect("mounted");
    }
    // w3's publish ends uncertain (INTERNAL on a mutation: it may have happened), and the
    // mount's undo of it fails too: the record keeps it.
    node.mock
        .faults()
        .on(Rpc::NodePublishVolume)
        .fail(Code::Internal, "lost track");
    node.mock
        .faults()
        .on(Rpc::NodeUnpublishVolume)
        .fail(Code::Unavailable, "busy");
    let err = volumes
        .mount(&node.mount(&db, "w3"))
        .await
        .expect_err("uncertain");
    assert_eq!(err.class(), ErrorClass::Uncertain, "{err}");
    assert!(matches!(err, VolumeError::NotUndone { .. }), "{err:?}");

    drop(volumes);
    let volumes = node.manager();
    assert_eq!(volumes.in_use().get("mock"), Some(&3));
    let pending = volumes.uncertain();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].workload.as_ref().map(|w| w.as_str()), Some("w3"));
    assert_eq!(pending[0].state, StepState::Uncertain);
    let shown = pending[0].to_string();
    assert!(
        shown.starts_with(&format!(
            "volume {} (plugin {}) for workload w3: publish uncertain at /",
            db.0, node.id
        )),
        "{shown}"
    );
    let w1 = WorkloadId::new("w1").expect("id");
    assert_eq!(
        volumes.published(&db.0, &w1),
        Some(
            volumes
                .layout()
                .target_path(&db.0, &w1, &PublishUsage::of(&capability(), false))
                .expect("path")
        )
    );

    // An unmount that names another usage still finds the target the mount recorded.
    let mut w1 = node.unmount(&db, "w1");
    w1.usage.read_only = true;
    let done = volumes.unmount(&w1).await.expect("w1 unmounted");
    assert!(done.unpublished && !done.unstaged);
    assert_eq!(node.mock.published().len(), 1, "w1's publication is gone");
    let done = volumes
        .unmount(&node.unmount(&db, "w3"))
        .await
        .expect("w3's uncertain publish cleaned up");
    assert!(!done.unstaged);
    assert!(volumes.uncertain().is_empty());
    let done = volumes
        .unmount(&node.unmount(&db, "w2"))
        .await
        .expect("w2 unmounted");
    assert!(done.unstaged, "the last user unstages");
    assert!(node.mock.staged().is_empty() && node.mock.published().is_empty());
    assert!(node.manager().records().is_empty(), "written: nothing left");
    // Again: already done, no call.
    let calls = node.mock.calls().len();
    let done = volumes
        .unmount(&node.unmount(&db, "w2"))
        .await
        .expect("idempotent");
    assert_eq!(
        done,
        Unmounted {
            unpublished: false,
            unstaged: false
        }
    );
    assert_eq!(node.mock.calls().len(), calls);
}

#[tokio::test]
async fn every_operation_ends_with_its_event() {
    let node = node().await;
    let volumes = node.manager();
    let mut events = volumes.subscribe();
    let db = node.volume("db").await;
    let target = volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect("mounted");
    let event = events.recv().await.expect("event");
    assert_eq!(
        event.to_string(),
        format!(
            "volume {} (plugin {}) for workload w1: mounted at {}",
            db.0,
            node.id,
            target.display()
        )
    );
    match event {
        VolumeEvent::Mount {
            workload, outcome, ..
        } => {
            assert_eq!(workload.as_str(), "w1");
            assert_eq!(outcome.expect("succeeded"), target);
        }
        other => panic!("expected a mount, got {other:?}"),
    }
    let expand = |volume: &VolumeId, external: &ExternalVolumeId| ExpandRequest {
        plugin: node.id.clone(),
        volume: volume.clone(),
        external_id: external.clone(),
        capacity: CapacityRange::new(Some(1 << 30), None).expect("range"),
        capability: Some(capability()),
        secrets: Secrets::new(),
    };
    let grown = volumes
        .expand(&expand(&db.0, &db.1))
        .await
        .expect("expanded on the node");
    assert_eq!(grown, Some(1 << 30));
    let call = node
        .mock
        .calls()
        .last(Rpc::NodeExpandVolume)
        .expect("called");
    assert!(
        call.request.contains(&target.display().to_string()),
        "at the published target: {}",
        call.request
    );
    let event = events.recv().await.expect("event");
    assert_eq!(
        event.to_string(),
        format!(
            "volume {} (plugin {}): expanded on this node to {} bytes",
            db.0,
            node.id,
            1u64 << 30
        )
    );
    match event {
        VolumeEvent::Expand { outcome, .. } => assert_eq!(outcome.expect("ok"), grown),
        other => panic!("expected an expansion, got {other:?}"),
    }
    // A volume neither staged nor published here cannot be expanded here.
    let elsewhere = node.volume("elsewhere").await;
    let err = volumes
        .expand(&expand(&elsewhere.0, &elsewhere.1))
        .await
        .expect_err("not here");
    assert!(matches!(err, VolumeError::NotHere { .. }), "{err}");
    let event = events.recv().await.expect("event");
    let text = event.to_string();
    assert!(
        text.starts_with(&format!(
            "volume {} (plugin {}): node expansion failed (",
            elsewhere.0, node.id
        )),
        "{text}"
    );
    match event {
        VolumeEvent::Expand { outcome, .. } => assert!(outcome.is_err()),
        other => panic!("expected an expansion, got {other:?}"),
    }
    volumes
        .unmount(&node.unmount(&db, "w1"))
        .await
        .expect("unmounted");
    match events.recv().await.expect("event") {
        VolumeEvent::Unmount { outcome, .. } => assert_eq!(
            outcome.expect("succeeded"),
            Unmounted {
                unpublished: true,
                unstaged: true
            }
        ),
        other => panic!("expected an unmount, got {other:?}"),
    }
}

#[tokio::test]
async fn stage_and_publish_each_send_their_own_secrets() {
    let node = node().await;
    let volumes = node.manager();
    let db = node.volume("db").await;
    let secrets = VolumeSecrets::parse_key_values(
        "common-key=c\n[node-stage]\nstage-key=s\n[node-publish]\npublish-key=p\n",
    )
    .expect("valid secrets");
    let request = MountRequest {
        secrets,
        ..node.mount(&db, "w1")
    };
    volumes.mount(&request).await.expect("mounted");
    let calls = node.mock.calls();
    let stage = calls.last(Rpc::NodeStageVolume).expect("staged").request;
    let publish = calls
        .last(Rpc::NodePublishVolume)
        .expect("published")
        .request;
    // The call log shows secret names only; the values stay redacted.
    for (request, own, other) in [
        (&stage, "stage-key", "publish-key"),
        (&publish, "publish-key", "stage-key"),
    ] {
        assert!(request.contains("\"common-key\""), "{request}");
        assert!(request.contains(&format!("\"{own}\"")), "{request}");
        assert!(!request.contains(other), "{request}");
    }
}

#[tokio::test]
async fn unmounting_what_is_already_cleaned_up_needs_no_plugin() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = PluginManager::builder(PluginManagerConfig::default())
        .start()
        .expect("starts");
    let volumes = VolumeManager::open(
        Layout::new(dir.path()),
        dir.path().join("usage.json"),
        Arc::new(plugins),
    )
    .expect("opens");
    let request = UnmountRequest {
        plugin: PluginId::new("gone").expect("id"),
        volume: VolumeId::new("v1").expect("id"),
        external_id: ExternalVolumeId::new("vol-1").expect("id"),
        workload: WorkloadId::new("w1").expect("id"),
        usage: PublishUsage::of(&capability(), false),
    };
    // No record and no target directory: done, without calling the (missing) plugin.
    volumes.unmount(&request).await.expect("already done");
    // A target directory left behind means it may still be mounted: the plugin is needed.
    let target = volumes
        .layout()
        .target_path(&request.volume, &request.workload, &request.usage)
        .expect("valid ids");
    std::fs::create_dir_all(&target).expect("dir");
    let err = volumes
        .unmount(&request)
        .await
        .expect_err("needs the plugin");
    assert_eq!(err.class(), ErrorClass::RetryElsewhere);
    // An id that would escape the data directory is refused before anything happens.
    let escape = UnmountRequest {
        workload: WorkloadId::new("..").expect("the id type allows it"),
        ..request
    };
    let err = volumes.unmount(&escape).await.expect_err("refused");
    assert!(
        matches!(err, VolumeError::Path(ref e) if e.field == "workload_id"),
        "{err}"
    );
}

#[test]
fn a_usage_record_that_cannot_be_used_stops_the_open_with_its_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("usage.json");
    std::fs::write(
        &file,
        r#"{"version": 2, "volumes": {"mock/x": {"plugin": "mock", "volume": "db",
            "external_id": "e", "staging": null, "stage": null, "users": {}}}}"#,
    )
    .expect("write");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let plugins = runtime.block_on(async {
        PluginManager::builder(PluginManagerConfig::default())
            .start()
            .expect("starts")
    });
    match VolumeManager::open(Layout::new(dir.path()), &file, Arc::new(plugins)) {
        Err(StateFileError::Record { key, .. }) => assert_eq!(key, "mock/x"),
        other => panic!("expected a record error, got {other:?}"),
    }
}

/// A format 1 usage file from an older version: volume `db` staged and published read-only
/// for `reader`; the writer's mount tried a second staging at its own per-usage path, which
/// the plugin refused (one staging per volume on a node), so that record says `started` for
/// both steps. Opened, it becomes one record; unmounting the reader keeps the staging,
/// unmounting the writer unstages both paths (the refused one answers NOT_FOUND, which is
/// done).
#[tokio::test]
async fn format_1_stagings_are_unstaged_with_the_last_publication() {
    let node = node().await;
    let cap = VolumeCapability::mount(AccessMode::MultiNodeSingleWriter, MountOptions::new());
    let ready = node.plugins.get(&node.id).expect("fingerprinted");
    let ext = ready
        .client
        .controller()
        .create_volume(proto::CreateVolumeRequest {
            name: "db".into(),
            volume_capabilities: vec![(&cap).into()],
            ..Default::default()
        })
        .await
        .expect("created")
        .volume_id;
    let plugin_node = &ready.fingerprint.node.as_ref().expect("node").node_id;
    let context = ready
        .client
        .controller()
        .publish(
            &ext,
            plugin_node,
            &cap,
            false,
            &VolumeContext::new(),
            &Secrets::new(),
        )
        .await
        .expect("attached");
    // The state the older version left behind, made through the client.
    let layout = Layout::new(node.dir.path().join("node"));
    let volume = VolumeId::new("db").expect("id");
    let mut records = serde_json::Map::new();
    for (workload, read_only) in [("reader", true), ("writer", false)] {
        let usage = PublishUsage::of(&cap, read_only);
        let staging = layout.staging_root().join("db").join(usage.segment());
        let target = layout
            .target_path(&volume, &WorkloadId::new(workload).expect("id"), &usage)
            .expect("path");
        std::fs::create_dir_all(&staging).expect("staging dir");
        std::fs::create_dir_all(target.parent().expect("parent")).expect("target parent");
        let step = if read_only { "done" } else { "started" };
        records.insert(
            format!("mock/db/{}", usage.segment()),
            serde_json::json!({
                "plugin": "mock", "volume": "db", "external_id": ext.as_str(),
                "staging": staging, "stage": step,
                "users": {workload: {"target": target, "publish": step}},
            }),
        );
        if !read_only {
            continue;
        }
        let node_client = ready.client.node();
        node_client
            .stage(&NodeStage {
                volume: &ext,
                staging_target_path: &staging,
                capability: &cap,
                publish_context: &context,
                volume_context: &VolumeContext::new(),
                secrets: &Secrets::new(),
            })
            .await
            .expect("staged");
        node_client
            .publish(&NodePublish {
                volume: &ext,
                staging_target_path: Some(&staging),
                target_path: &target,
                capability: &cap,
                readonly: read_only,
                publish_context: &context,
                volume_context: &VolumeContext::new(),
                secrets: &Secrets::new(),
            })
            .await
            .expect("published");
    }
    let file = node.dir.path().join("node").join("usage.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&serde_json::json!({"volumes": records})).expect("json"),
    )
    .expect("write v1");
    assert_eq!(node.mock.staged().len(), 1);
    node.mock.calls().clear();

    let volumes = node.manager();
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
    assert_eq!(written["version"], 2, "written back as format 2: {written}");
    assert_eq!(
        written["volumes"]
            .as_object()
            .map(|v| v.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["mock/db".to_owned()])
    );
    let unmount = |workload: &str, read_only| UnmountRequest {
        plugin: node.id.clone(),
        volume: volume.clone(),
        external_id: ext.clone(),
        workload: WorkloadId::new(workload).expect("id"),
        usage: PublishUsage::of(&cap, read_only),
    };
    volumes
        .unmount(&unmount("reader", true))
        .await
        .expect("reader released");
    assert_eq!(node.mock.calls().count(Rpc::NodeUnpublishVolume), 1);
    assert_eq!(
        node.mock.calls().count(Rpc::NodeUnstageVolume),
        0,
        "the writer still uses it"
    );
    assert_eq!(node.mock.staged().len(), 1);

    volumes
        .unmount(&unmount("writer", false))
        .await
        .expect("writer released");
    assert_eq!(node.mock.calls().count(Rpc::NodeUnpublishVolume), 2);
    assert_eq!(
        node.mock.calls().count(Rpc::NodeUnstageVolume),
        2,
        "both stagings"
    );
    assert!(node.mock.staged().is_empty() && node.mock.published().is_empty());
    assert!(volumes.in_use().is_empty(), "{:?}", volumes.in_use());
    assert!(!layout.staging_root().join("db").exists());
}

/// Node detach calls go through the plugin's detach client: when the node plugin's socket is
/// gone, one unpublish attempt with a short socket wait fails the unmount as
/// `RetryElsewhere`, instead of csi-client's four attempts of up to 30 s of dialling.
#[tokio::test]
async fn a_vanished_node_plugin_fails_the_unmount_after_one_short_attempt() {
    let mut node = node().await;
    let server = node.plugin.server.take().expect("serving");
    let volumes = node.manager();
    let db = node.volume("db").await;
    volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect("mounted");

    // The plugin goes away; the manager still has its registration.
    server.shutdown().await.expect("stops");
    let detach = node.plugins.get(&node.id).expect("still registered").detach;
    let dials_before = detach.connection().dial_attempts();
    let err = volumes
        .unmount(&node.unmount(&db, "w1"))
        .await
        .expect_err("the plugin is gone");
    assert_eq!(err.class(), ErrorClass::RetryElsewhere, "{err}");
    match &err {
        VolumeError::Call { step, source, .. } => {
            assert_eq!(*step, "NodeUnpublishVolume");
            assert_eq!(source.attempts(), 1, "one attempt: {source}");
            // The dial gave up by itself (socket missing after the short wait); no deadline
            // had to cut a 30 s wait short.
            match source.kind() {
                csi_client::ErrorKind::NotConnected(connect) => assert_eq!(
                    connect.io_error().kind(),
                    std::io::ErrorKind::NotFound,
                    "{source}"
                ),
                other => panic!("expected not connected, got {other}"),
            }
        }
        other => panic!("expected the unpublish call's error, got {other}"),
    }
    // One socket wait of 1 s, dials 10 ms, 20 ms, ... apart: a handful, not ~36 per attempt.
    let dials = detach.connection().dial_attempts() - dials_before;
    assert!((1..=10).contains(&dials), "{dials} dials");
    assert!(volumes.uncertain().is_empty(), "{:?}", volumes.uncertain());
    assert!(
        volumes
            .published(&db.0, &WorkloadId::new("w1").expect("id"))
            .is_some(),
        "the record is kept for the retry"
    );
}

/// A plugin that sees the data directory at another path (here a symbolic link standing in
/// for a container's mount): the calls carry its paths, the node's own checks and the usage
/// records the host's.
#[tokio::test]
async fn a_plugin_with_its_own_view_of_the_data_directory_gets_its_paths() {
    let node = node().await;
    let host = node.dir.path().join("host");
    let seen = node.dir.path().join("plugin-view");
    std::fs::create_dir_all(&host).expect("host dir");
    std::os::unix::fs::symlink(&host, &seen).expect("the plugin's view");
    let layout = Layout::new(&host)
        .with_plugin_root(&seen)
        .expect("absolute");
    let volumes = VolumeManager::open(
        layout.clone(),
        host.join("usage.json"),
        Arc::new(node.plugins.clone()),
    )
    .expect("opens");
    let db = node.volume("db").await;
    let target = volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect("mounted");
    assert!(
        target.starts_with(&host),
        "the host's path: {}",
        target.display()
    );
    assert!(target.exists(), "made by the plugin, seen on the host");
    let under_view = |paths: Vec<csi_testkit::NodePath>| {
        paths.iter().all(|p| p.path.starts_with(&seen)) && !paths.is_empty()
    };
    assert!(under_view(node.mock.staged()), "{:?}", node.mock.staged());
    assert!(
        under_view(node.mock.published()),
        "{:?}",
        node.mock.published()
    );
    assert_eq!(
        volumes.records()[0].users["w1"].target,
        target,
        "records keep host paths"
    );
    let done = volumes
        .unmount(&node.unmount(&db, "w1"))
        .await
        .expect("unmounted");
    assert!(done.unpublished && done.unstaged);
    assert!(node.mock.staged().is_empty() && node.mock.published().is_empty());
    assert!(
        !layout.workload_root().join("w1").exists()
            && !layout.staging_path(&db.0).expect("id").exists(),
        "the host's directories are removed"
    );
}

/// Health is advice, not a gate, for clean-up: a registration not fingerprinted yet (its
/// `GetPluginInfo` hangs, its health unknown) still gets its volume unpublished and unstaged.
#[tokio::test]
async fn a_plugin_not_fingerprinted_yet_still_gets_its_volume_unmounted() {
    let node = node().await;
    let volumes = node.manager();
    let db = node.volume("db").await;
    volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect("mounted");
    node.mock
        .faults()
        .on(Rpc::GetPluginInfo)
        .forever(FaultStep::Hang);
    let socket = node.dir.path().join("mock.sock");
    node.plugins
        .register(node.id.clone(), Endpoint::unix(&socket).expect("endpoint"))
        .expect("registered again");
    assert!(
        node.plugins.get(&node.id).is_none(),
        "the new registration is not fingerprinted"
    );
    let done = volumes
        .unmount(&node.unmount(&db, "w1"))
        .await
        .expect("unmounted all the same");
    assert!(done.unpublished && done.unstaged, "{done:?}");
    assert!(node.mock.staged().is_empty() && node.mock.published().is_empty());
    assert!(volumes.records().is_empty());
}

/// A failed mount leaves nothing behind: what it may have done (an uncertain publish or
/// stage) is undone before it returns, and only what this mount started.
#[tokio::test]
async fn a_failed_mount_undoes_what_it_may_have_done() {
    let node = node().await;
    let volumes = node.manager();
    let count = |rpc| node.mock.calls().count(rpc);
    // The next `rpc` ends uncertain (INTERNAL on a mutation: it may have happened).
    let lose_next = |rpc| {
        node.mock
            .faults()
            .on(rpc)
            .fail(Code::Internal, "lost track");
    };

    // An uncertain publish of the volume's first user: unpublished, then unstaged.
    let db = node.volume("db").await;
    lose_next(Rpc::NodePublishVolume);
    let err = volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect_err("uncertain");
    assert_eq!(err.class(), ErrorClass::Uncertain, "{err}");
    assert!(
        matches!(
            &err,
            VolumeError::Call {
                step: "NodePublishVolume",
                ..
            }
        ),
        "the mount's own error, the undo worked: {err:?}"
    );
    assert_eq!(count(Rpc::NodeUnpublishVolume), 1);
    assert_eq!(count(Rpc::NodeUnstageVolume), 1);
    assert!(volumes.records().is_empty() && volumes.uncertain().is_empty());
    assert!(node.mock.staged().is_empty() && node.mock.published().is_empty());

    // An uncertain stage: unstaged, never published.
    let logs = node.volume("logs").await;
    lose_next(Rpc::NodeStageVolume);
    let err = volumes
        .mount(&node.mount(&logs, "w1"))
        .await
        .expect_err("uncertain");
    assert!(
        matches!(
            &err,
            VolumeError::Call {
                step: "NodeStageVolume",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(count(Rpc::NodeStageVolume), 2);
    assert_eq!(count(Rpc::NodePublishVolume), 1, "logs was never published");
    assert_eq!(count(Rpc::NodeUnstageVolume), 2);
    assert!(volumes.records().is_empty() && node.mock.staged().is_empty());

    // Another workload's failed publish undoes its own publication and keeps the staging
    // the first one uses.
    volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect("w1 mounted");
    lose_next(Rpc::NodePublishVolume);
    volumes
        .mount(&node.mount(&db, "w2"))
        .await
        .expect_err("uncertain");
    assert_eq!(
        count(Rpc::NodeUnstageVolume),
        2,
        "w1 still uses the staging"
    );
    let w2 = WorkloadId::new("w2").expect("id");
    assert_eq!(volumes.published(&db.0, &w2), None);
    assert_eq!(node.mock.staged().len(), 1);
    assert_eq!(node.mock.published().len(), 1);

    // A repeated mount of a workload published before does not tear its publication down.
    let unpublishes = count(Rpc::NodeUnpublishVolume);
    lose_next(Rpc::NodePublishVolume);
    volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect_err("uncertain");
    assert_eq!(count(Rpc::NodeUnpublishVolume), unpublishes);
    assert_eq!(node.mock.published().len(), 1);
}

/// Whether a write of `file` is under way in this process; waits (at most a minute, off the
/// runtime) until that is `under_way`.
async fn until_write_of(file: &Path, under_way: bool) {
    let file = file.to_owned();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while csi_node::state::writes_under_way()
            .iter()
            .any(|(p, _)| *p == file)
            != under_way
        {
            assert!(std::time::Instant::now() < deadline, "hang guard: {file:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    })
    .await
    .expect("the waiting task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_the_usage_records_do_not_wait_for_a_stalled_write() {
    let node = node().await;
    let volumes = node.manager();
    let db = node.volume("db").await;
    let logs = node.volume("logs").await;
    volumes
        .mount(&node.mount(&db, "w1"))
        .await
        .expect("w1 mounted");

    // The disk stops answering as logs' mount records its user.
    let file = node.dir.path().join("node").join("usage.json");
    let stalled = StalledFile::at(&file.with_extension("json.tmp")).expect("a FIFO");
    let mount = tokio::spawn({
        let volumes = volumes.clone();
        let request = node.mount(&logs, "w2");
        async move { volumes.mount(&request).await }
    });
    until_write_of(&file, true).await;

    // Had the readers waited for the write, they would have answered only once it was given
    // up (after the state files' write timeout).
    let records = volumes.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].volume, "db");
    let w1 = WorkloadId::new("w1").expect("id");
    let w2 = WorkloadId::new("w2").expect("id");
    assert!(volumes.published(&db.0, &w1).is_some());
    assert!(volumes.published(&logs.0, &w2).is_none());
    assert!(volumes.publish_context(&node.id, &db.0).is_some());

    // The disk answers: the write fails (a FIFO cannot be synced) rather than having been
    // given up, unless this machine froze for the whole write timeout. Nothing was staged.
    tokio::task::spawn_blocking(move || stalled.answer())
        .await
        .expect("the disk task")
        .expect("the FIFO reads");
    let err = mount
        .await
        .expect("the mount task")
        .expect_err("the user could not be recorded");
    assert!(
        matches!(&err, VolumeError::Usage { source, .. } if matches!(**source, StateFileError::Io { .. })),
        "the write was given up while the readers waited: {err:?}"
    );
    assert!(
        node.mock
            .calls()
            .all()
            .iter()
            .all(|c| c.rpc != Rpc::NodeStageVolume
                || c.volume_id.as_deref() != Some(logs.1.as_str())),
        "logs was staged without its record"
    );

    // The disk works again: so does the mount.
    until_write_of(&file, false).await;
    volumes
        .mount(&node.mount(&logs, "w2"))
        .await
        .expect("w2 mounted");
    assert_eq!(volumes.records().len(), 2);
}
