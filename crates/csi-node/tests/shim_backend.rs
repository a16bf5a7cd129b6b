//! csi-node's side of csi-rpc-shim (`NodeBackend`): what it says of the local plugins, and
//! the calls it serves, on the mock plugin.
#![cfg(feature = "shim")]

mod support;

use std::time::Duration;

use csi_node::shim::NodeBackend;
use csi_rpc_shim::{
    ControllerQuery, CreateVolume, DeleteVolume, LocalPlugins, LocalStatus, PluginFailure,
    ServiceKind, ShimContext,
};
use csi_structs::{
    AccessMode, ErrorClass, MountOptions, NodeId, Parameters, PluginId, Secrets, VolumeCapability,
    VolumeId,
};
use support::mock_plugin;

fn context() -> ShimContext {
    ShimContext {
        deadline: tokio::time::Instant::now() + Duration::from_secs(30),
        origin: NodeId::new("n1").expect("id"),
        hops: 0,
    }
}

#[tokio::test]
async fn a_healthy_local_plugin_serves_controller_calls_and_an_unknown_one_is_missing() {
    let plugin = mock_plugin().await;
    let backend = NodeBackend::new(plugin.plugins.clone(), plugin.volumes("csi"));
    assert_eq!(
        backend.status(&plugin.id, ServiceKind::Controller),
        LocalStatus::Healthy
    );
    assert_eq!(
        backend.status(&plugin.id, ServiceKind::Node),
        LocalStatus::Healthy
    );
    let other = PluginId::new("other").expect("id");
    assert_eq!(
        backend.status(&other, ServiceKind::Controller),
        LocalStatus::Missing
    );

    let capability = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
    let create = |plugin: &PluginId| CreateVolume {
        query: ControllerQuery::new(plugin.clone()),
        volume: VolumeId::new("data").expect("id"),
        required_bytes: 1 << 30,
        limit_bytes: 0,
        capabilities: vec![capability.clone()],
        parameters: Parameters::default(),
        secrets: Secrets::default(),
        accessibility_requirements: None,
        content_source: None,
    };
    let created = backend
        .create_volume(&context(), create(&plugin.id))
        .await
        .expect("created through the backend");
    assert_eq!(created.capacity_bytes, 1 << 30);
    assert_eq!(plugin.mock.volumes().len(), 1);

    // A plugin not here is refused before any call, as one to try elsewhere.
    let err = backend
        .create_volume(&context(), create(&other))
        .await
        .expect_err("no such plugin here");
    assert_eq!(err.class, ErrorClass::RetryElsewhere);
    assert_eq!(err.failure, PluginFailure::Unreachable);

    backend
        .delete_volume(
            &context(),
            DeleteVolume {
                query: ControllerQuery::new(plugin.id.clone()),
                volume: VolumeId::new("data").expect("id"),
                external_volume: created.external_volume,
                secrets: Secrets::default(),
            },
        )
        .await
        .expect("deleted");
    assert!(plugin.mock.volumes().is_empty());
}

#[tokio::test]
async fn the_registry_feed_publishes_a_healthy_plugin_and_takes_it_away_when_it_goes() {
    use std::sync::Arc;

    use csi_node::Node;
    use csi_node::plugins::PluginObserver;
    use csi_node::shim::RegistryFeed;
    use csi_rpc_shim::{NodePlugin, NodeStatus, Registry};

    let dir = tempfile::tempdir().expect("temp dir");
    let mock = csi_testkit::MockPlugin::builder().build().expect("mock");
    let socket = dir.path().join("mock.sock");
    let _server = mock.serve_unix(&socket).await.expect("serves");
    let me = NodeId::new("n1").expect("id");
    let plugin = PluginId::new("mock").expect("id");
    let registry = Arc::new(Registry::new());
    registry.set_node_status(&me, NodeStatus::Ready);
    let feed = Arc::new(RegistryFeed::new(me.clone(), Arc::clone(&registry)));
    let node = Node::builder(dir.path().join("node"), me.clone())
        .observer(Arc::clone(&feed) as Arc<dyn PluginObserver>)
        .open()
        .await
        .expect("opens");
    assert!(feed.wake(node.claims().clone()));
    assert!(
        !feed.wake(node.claims().clone()),
        "a second driver is refused"
    );
    assert_eq!(registry.node_plugin(&me, &plugin), NodePlugin::Missing);

    node.register_plugin(
        plugin.clone(),
        csi_client::Endpoint::unix(&socket).expect("endpoint"),
    )
    .await
    .expect("registered");
    node.wait_for(&plugin, Duration::from_secs(60))
        .await
        .expect("fingerprinted and healthy (hang guard)");
    assert_eq!(registry.controllers(&plugin).ready, vec![me.clone()]);
    assert!(
        matches!(
            registry.node_plugin(&me, &plugin),
            NodePlugin::Ready { plugin_node } if plugin_node.as_str() == "node-1"
        ),
        "{:?}",
        registry.node_plugin(&me, &plugin)
    );

    assert!(node.deregister_plugin(&plugin).await.expect("deregistered"));
    assert_eq!(registry.node_plugin(&me, &plugin), NodePlugin::Missing);
    assert!(registry.controllers(&plugin).ready.is_empty());
    assert!(registry.controllers(&plugin).refused.is_empty());
    node.close().await.expect("closed");
}

/// A call served under a caller's deadline shorter than csi-client's retry pause (a duty
/// holder's forwarded `ControllerUnpublishVolume`, say): the plugin's retryable failure comes
/// back at once, not an uncertain "deadline passed" once the client paused past the deadline.
#[tokio::test]
async fn a_retryable_failure_under_a_short_caller_deadline_is_answered_at_once() {
    use csi_client::{Code, Rpc};
    use csi_rpc_shim::{ControllerDetach, GrpcCode};
    use csi_testkit::FaultStep;

    let plugin = mock_plugin().await;
    let backend = NodeBackend::new(plugin.plugins.clone(), plugin.volumes("csi"));
    let capability = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new());
    let (volume, external, _) =
        support::create_and_attach(&plugin.plugins, &plugin.id, "v", &capability).await;
    let ready = plugin.plugins.get(&plugin.id).expect("fingerprinted");
    let plugin_node = ready
        .fingerprint
        .node
        .as_ref()
        .expect("node")
        .node_id
        .clone();
    plugin
        .mock
        .faults()
        .on(Rpc::ControllerUnpublishVolume)
        .step(FaultStep::Fail {
            code: Code::Unavailable,
            message: "controller busy (test)".into(),
        })
        .install();

    // Less than csi-client's first pause before retrying an unpublish (a second or more).
    let left = Duration::from_millis(500);
    let ctx = ShimContext {
        deadline: tokio::time::Instant::now() + left,
        ..context()
    };
    let err = backend
        .controller_detach(
            &ctx,
            ControllerDetach {
                query: ControllerQuery::new(plugin.id.clone()),
                volume,
                external_volume: external.clone(),
                node: NodeId::new("n1").expect("id"),
                plugin_node,
                secrets: Secrets::default(),
            },
        )
        .await
        .expect_err("the plugin failed it");
    // The plugin's own answer, not the caller's deadline: a client that paused for a retry
    // would have been cut off at the deadline, an uncertain failure (no time is measured).
    assert_eq!(
        err.failure,
        PluginFailure::Status(GrpcCode::from(Code::Unavailable)),
        "{err:?}"
    );
    assert_eq!(
        plugin
            .mock
            .calls()
            .of(Rpc::ControllerUnpublishVolume)
            .into_records()
            .len(),
        1,
        "no retry was sent"
    );
    assert_eq!(plugin.mock.published_nodes(external.as_str()).len(), 1);
}
