//! A whole node from one state directory: opened, used, closed, and opened again with what
//! it held.

mod support;

use std::time::Duration;

use csi_claims::{ClaimMode, ClaimRequest, ControllerRequirement, VolumeInfo};
use csi_client::Endpoint;
use csi_node::volumes::Restore;
use csi_node::{Node, NodeError};
use csi_structs::{
    AccessMode, AccessTypeKind, MountOptions, NodeId, PluginId, RegisteredVolume, VolumeCapability,
    VolumeId, VolumeSpec, WorkloadId,
};
use csi_testkit::MockPlugin;
use support::GUARD;
use tokio::time::Instant;

fn me() -> NodeId {
    NodeId::new("n1").expect("node id")
}

#[tokio::test]
async fn a_node_reopened_from_its_directory_has_its_plugins_claims_and_usage_records() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("csi");
    let socket = dir.path().join("mock.sock");
    let mock = MockPlugin::builder().build().expect("mock");
    let _server = mock.serve_unix(&socket).await.expect("serves");
    let plugin = PluginId::new("mock").expect("id");

    let node = Node::open(&state, me()).await.expect("opens");
    node.register_plugin(plugin.clone(), Endpoint::unix(&socket).expect("endpoint"))
        .await
        .expect("registered");
    let ready = node
        .plugins()
        .wait_for(&plugin, Instant::now() + GUARD)
        .await
        .expect("ready");
    let plugin_node = ready
        .fingerprint
        .node
        .clone()
        .expect("a node service")
        .node_id;

    // A volume, claimed and attached for a workload.
    let mode = AccessMode::SingleNodeWriter;
    let spec = VolumeSpec::new(
        VolumeId::new("data").expect("id"),
        plugin.clone(),
        vec![VolumeCapability::mount(mode, MountOptions::new())],
    );
    let mut volume = RegisteredVolume::for_creation(spec).expect("valid");
    let created = ready
        .client
        .controller()
        .create(volume.spec())
        .await
        .expect("created");
    volume.record_created(&created);
    let info = VolumeInfo {
        id: volume.id().clone(),
        external_id: created.volume_id.clone(),
        plugin: plugin.clone(),
        controller: ControllerRequirement::of(&ready.fingerprint.capabilities),
    };
    let workload = WorkloadId::new("web-1").expect("id");
    let request = ClaimRequest {
        volume: volume.id().clone(),
        workload: workload.clone(),
        node: me(),
        plugin_node,
        mode: ClaimMode::Write,
        access_mode: mode,
        attachment: AccessTypeKind::Mount,
    };
    let claim = node.claims().claim(&info, request).await.expect("claimed");
    let attached = node
        .attacher()
        .attach(&volume, &claim)
        .await
        .expect("attached");
    assert_eq!(
        node.volumes().published(volume.id(), &workload),
        Some(attached.target.clone())
    );
    drop(ready);
    node.close().await.expect("closed");

    // Every file was closed: the same directory opens again, with what it held.
    let node = Node::open(&state, me()).await.expect("opens again");
    let ready = node
        .wait_for(&plugin, GUARD)
        .await
        .expect("the registration was restored");
    drop(ready);
    let record = node
        .claims()
        .record(volume.id())
        .expect("the claim was restored");
    assert_eq!(record.claims().len(), 1);
    let usage = node
        .volumes()
        .record(&plugin, volume.id())
        .expect("the usage record");
    assert!(usage.users.contains_key("web-1"), "{usage:?}");
    // The usage records are beliefs until confirmed with the plugin (which still has them).
    let confirmed = node.volumes().reconcile(&|_: &_| Restore::Keep).await;
    assert_eq!(confirmed.records.len(), 1);

    // The release runs through the node's pipeline: unpublished, unstaged, detached.
    node.claims()
        .release_and_wait_until(volume.id(), &workload, Instant::now() + GUARD)
        .await
        .expect("released");
    assert!(mock.published().is_empty() && mock.staged().is_empty());
    assert!(node.volumes().record(&plugin, volume.id()).is_none());
    // The registration restored at open is the one deregistered by the plugin's id.
    assert!(node.deregister_plugin(&plugin).await.expect("written"));
    assert!(
        !node
            .deregister_plugin(&plugin)
            .await
            .expect("nothing to write")
    );
    assert!(node.plugins().status(&plugin).is_none());
    node.close().await.expect("closed");
    let node = Node::open(&state, me()).await.expect("opens again");
    assert!(
        node.plugins().status(&plugin).is_none(),
        "stays deregistered"
    );
    node.close().await.expect("closed");
}

#[tokio::test]
async fn close_names_a_kept_volume_manager_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let node = Node::open(dir.path(), me()).await.expect("opens");
    // A clone kept outside the node (a volume service over it holds one) keeps the database
    // open: close says so at once, whatever its wait, instead of waiting it out.
    let kept = node.volumes().clone();
    let err = node
        .close_within(GUARD)
        .await
        .expect_err("the volume manager's clone holds the database");
    assert!(
        matches!(&err, NodeError::Held { node, holders: 1 } if node == &me()),
        "{err:?}"
    );
    assert!(err.to_string().contains("volume manager"), "{err}");
    // Once it goes, the file is closed and the directory opens again.
    drop(kept);
    let node = tokio::time::timeout(GUARD, async {
        loop {
            match Node::open(dir.path(), me()).await {
                Ok(node) => break node,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .expect("opens again once the handle is dropped");
    node.close().await.expect("closed");
}

/// Keeps the RPC of every call it sees.
#[derive(Debug, Default)]
struct SeenCalls(std::sync::Mutex<Vec<csi_client::Rpc>>);

impl csi_client::CallObserver for SeenCalls {
    fn on_call(&self, event: &csi_client::CallEvent) {
        self.0.lock().expect("not poisoned").push(event.rpc);
    }
}

#[tokio::test]
async fn every_client_of_a_registration_is_built_with_the_embedder_s_settings() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("mock.sock");
    let mock = MockPlugin::builder().build().expect("mock");
    let _server = mock.serve_unix(&socket).await.expect("serves");
    let plugin = PluginId::new("mock").expect("id");
    let seen = Arc::new(SeenCalls::default());
    let calls = Arc::new(csi_client::CallsInFlight::new());
    let customize: csi_node::plugins::ClientCustomizer = {
        let (seen, calls) = (Arc::clone(&seen), Arc::clone(&calls));
        Arc::new(move |_, b: csi_client::CsiClientBuilder| {
            b.observer(Arc::clone(&seen) as Arc<dyn csi_client::CallObserver>)
                .calls_in_flight(Arc::clone(&calls))
        })
    };
    let node = Node::builder(dir.path().join("csi"), me())
        .client_builder(customize)
        .open()
        .await
        .expect("opens");
    node.register_plugin(plugin.clone(), Endpoint::unix(&socket).expect("endpoint"))
        .await
        .expect("registered");
    let ready = node
        .plugins()
        .wait_for(&plugin, Instant::now() + GUARD)
        .await
        .expect("ready");
    // The fingerprint went through the observer; both clients list their calls in ours.
    assert!(
        seen.0
            .lock()
            .expect("not poisoned")
            .contains(&csi_client::Rpc::GetPluginInfo)
    );
    assert!(Arc::ptr_eq(ready.client.calls_in_flight(), &calls));
    assert!(Arc::ptr_eq(ready.detach.calls_in_flight(), &calls));
    drop(ready);
    node.close().await.expect("closed");
}

#[tokio::test]
async fn an_older_usage_file_moves_into_the_node_s_database() {
    let dir = tempfile::tempdir().expect("temp dir");
    let legacy = dir.path().join("usage.json");
    std::fs::write(
        &legacy,
        r#"{"version": 2, "volumes": {"mock/data": {"plugin": "mock", "volume": "data",
            "external_id": "ext-data", "staging": null, "stage": null,
            "users": {"web-1": {"target": "/t", "publish": "done"}}}}}"#,
    )
    .expect("written");
    let node = Node::open(dir.path(), me()).await.expect("opens");
    let plugin = PluginId::new("mock").expect("id");
    let record = node
        .volumes()
        .record(&plugin, &VolumeId::new("data").expect("id"))
        .expect("moved in");
    assert_eq!(record.external_id, "ext-data");
    assert!(!legacy.exists(), "the old file is set aside once moved");
    node.close().await.expect("closed");
}

#[tokio::test]
async fn a_state_directory_that_cannot_be_made_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("written");
    let err = Node::open(file.join("csi"), me())
        .await
        .expect_err("a file is in the way");
    assert!(matches!(err, NodeError::Directory { .. }), "{err:?}");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}
