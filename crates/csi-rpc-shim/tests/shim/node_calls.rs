//! Node calls go to the owning node only.

use csi_rpc_shim::{AgentRpc, Health, Instance, LocalStatus, NodeStatus, ServiceKind, ShimError};
use csi_structs::ErrorClass;

use crate::support::*;

#[tokio::test]
async fn own_node_is_served_locally() {
    let cluster = Cluster::start(vec![AgentSpec::node("a"), AgentSpec::node("b")]).await;
    guarded(
        cluster
            .agent("a")
            .shim
            .node_detach(node_detach("vol-1", "a"), CALL),
    )
    .await
    .unwrap();
    assert_eq!(cluster.served(AgentRpc::NodeDetach), ["a"]);
    assert_eq!(cluster.agent("a").shim.stats().sent, 0);
    assert_eq!(cluster.agent("b").shim.stats().received, 0);
}

#[tokio::test]
async fn another_node_is_reached_by_a_cluster_scoped_caller() {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    let out = guarded(
        cluster
            .agent("ops")
            .shim
            .node_expand(node_expand("vol-1", "b"), CALL),
    )
    .await
    .unwrap();
    assert_eq!(out.capacity_bytes, 10 << 30);
    assert_eq!(cluster.served(AgentRpc::NodeExpand), ["b"]);
    let seen = &cluster.agent("b").plugins.seen()[0];
    assert_eq!((seen.ctx.origin.as_str(), seen.ctx.hops), ("ops", 0));
}

#[tokio::test]
async fn node_plugin_missing_in_the_registry_is_retry_without_a_hop() {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    cluster
        .registry
        .remove(&n("b"), &plugin(), ServiceKind::Node);
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::PluginMissing {
            rpc: AgentRpc::NodeDetach,
            plugin: plugin(),
            node: n("b"),
            service: ServiceKind::Node
        }
    );
    assert_eq!(err.class(), ErrorClass::Retry);
    assert_eq!(cluster.agent("ops").shim.stats().sent, 0);
}

#[tokio::test]
async fn node_plugin_missing_on_the_node_itself_is_retry() {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    cluster
        .agent("b")
        .plugins
        .set_status(ServiceKind::Node, LocalStatus::Missing);
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ShimError::PluginMissing { node, service: ServiceKind::Node, .. } if *node == n("b")),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Retry);
    assert_eq!(cluster.agent("b").shim.stats().received, 1);
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());

    cluster.agent("b").plugins.set_status(
        ServiceKind::Node,
        LocalStatus::Unhealthy {
            reason: "probe failed".into(),
        },
    );
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_expand(node_expand("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ShimError::PluginUnhealthy { reason, .. } if reason == "probe failed"),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::Retry);
}

/// Health is advice for a release step: a node plugin whose probe fails (in the registry and
/// on its node) still gets its node detach; any other node call is refused there.
#[tokio::test]
async fn a_release_step_reaches_an_unhealthy_node_plugin_and_nothing_else_does() {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    cluster.registry.update(
        &n("b"),
        &plugin(),
        Instance::Node {
            plugin_node: plugin_node("b"),
            health: Health::unhealthy("probe failed: deadline"),
        },
    );
    cluster.agent("b").plugins.set_status(
        ServiceKind::Node,
        LocalStatus::Unhealthy {
            reason: "probe failed: deadline".into(),
        },
    );
    guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .expect("the release step is sent whatever the probe said");
    assert_eq!(cluster.served(AgentRpc::NodeDetach), ["b"]);

    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_expand(node_expand("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ShimError::PluginUnhealthy { node, .. } if *node == n("b")),
        "{err:?}"
    );
    assert!(cluster.served(AgentRpc::NodeExpand).is_empty());
    // The own node serves its release step too.
    guarded(
        cluster
            .agent("b")
            .shim
            .node_detach(node_detach("vol-2", "b"), CALL),
    )
    .await
    .expect("served on the node itself");
    assert_eq!(cluster.agent("b").plugins.calls(AgentRpc::NodeDetach), 2);
}

#[tokio::test]
async fn a_node_that_left_is_node_gone() {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    cluster.registry.set_node_status(&n("b"), NodeStatus::Gone);
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert!(err.is_node_gone(), "{err:?}");
    assert_eq!(
        err,
        ShimError::NodeGone {
            rpc: AgentRpc::NodeDetach,
            node: n("b")
        }
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
    assert_eq!(cluster.agent("b").shim.stats().received, 0);
}

#[tokio::test]
async fn unknown_and_down_nodes_are_retry_not_gone() {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "never-seen"), CALL),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ShimError::UnknownNode { .. }), "{err:?}");
    assert!(!err.is_node_gone());
    assert_eq!(err.class(), ErrorClass::Retry);

    cluster.registry.set_node_status(&n("b"), NodeStatus::Down);
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ShimError::NodeDown { .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Retry);
}

#[tokio::test]
async fn a_node_agent_that_cannot_be_reached_is_retry() {
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops"),
        AgentSpec::node("b").stopped(),
    ])
    .await;
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_expand(node_expand("vol-1", "b"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::PeerUnreachable {
            rpc: AgentRpc::NodeExpand,
            node: n("b")
        }
    );
    assert_eq!(err.class(), ErrorClass::Retry);
}
