//! One hop through a relay, and never two.

use csi_rpc_shim::wire::pb;
use csi_rpc_shim::{AgentRpc, GrpcCode, PluginError, PluginFailure, ShimError};
use csi_structs::ErrorClass;

use crate::support::*;

#[tokio::test]
async fn a_call_is_relayed_once_to_a_node_without_a_direct_link() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a").via("c", "b"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    cluster.controllers_on(&["c"]);
    let out = guarded(
        cluster
            .agent("a")
            .shim
            .controller_attach(attach("vol-1", "a"), CALL),
    )
    .await
    .unwrap();
    assert_eq!(out.publish_context.get("served_by"), Some("c"));
    assert_eq!(cluster.agent("b").shim.stats().relayed, 1);
    assert!(cluster.agent("b").plugins.seen().is_empty());
    let seen = &cluster.agent("c").plugins.seen()[0];
    assert_eq!(seen.ctx.origin, n("a"), "the relay passes the caller on");
    assert_eq!(seen.ctx.hops, 1);
}

#[tokio::test]
async fn a_relayed_error_keeps_its_node_and_class() {
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops").via("c", "b"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    let answer = PluginError::new(ErrorClass::AlreadyDone, GrpcCode::NotFound, "not staged");
    cluster
        .agent("c")
        .plugins
        .script(AgentRpc::NodeDetach, Behaviour::Fail(answer.clone()));
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_detach(node_detach("vol-1", "c"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::Plugin {
            rpc: AgentRpc::NodeDetach,
            node: n("c"),
            error: answer
        }
    );
    assert_eq!(err.class(), ErrorClass::AlreadyDone);
}

#[tokio::test]
async fn a_second_hop_is_refused() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    let mut to_b = raw_client(cluster.agent("b").addr).await;
    let wire = pb::NodeExpandRequest {
        plugin_id: "ebs".into(),
        volume_id: "vol-1".into(),
        external_volume_id: "ext-vol-1".into(),
        node_id: "c".into(),
        workload_id: "alloc-1".into(),
        required_bytes: 1,
        limit_bytes: 0,
        capability: Some(pb::Capability {
            access_mode: 1,
            access_type: pb::AccessType::Block as i32,
            ..Default::default()
        }),
        secrets: Default::default(),
    };
    // c acts for itself, but the call claims it was already relayed once and b is not the
    // target: b must not pass it on.
    for hops in ["1", "7", "garbage"] {
        let mut req = with_creds(wire.clone(), "c", &token_of("c"), None);
        req.metadata_mut()
            .insert(csi_rpc_shim::auth::HOPS_HEADER, hops.parse().unwrap());
        let status = to_b.node_expand(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{hops}");
        assert_eq!(detail(&status).kind, pb::ErrorKind::HopLimit as i32);
    }
    assert_eq!(cluster.agent("b").shim.stats().relayed, 0);
    assert!(cluster.served(AgentRpc::NodeExpand).is_empty());

    // With no hop taken yet, b relays it once.
    let out = to_b
        .node_expand(with_creds(wire, "c", &token_of("c"), Some(0)))
        .await
        .unwrap();
    assert_eq!(out.into_inner().capacity_bytes, 1);
    assert_eq!(cluster.agent("b").shim.stats().relayed, 1);
    assert_eq!(cluster.served(AgentRpc::NodeExpand), ["c"]);
}

#[tokio::test]
async fn a_relay_without_a_link_answers_no_route() {
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops").via("c", "b"),
        AgentSpec::node("b").no_route_to("c"),
        AgentSpec::node("c"),
    ])
    .await;
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_expand(node_expand("vol-1", "c"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::NoRoute {
            rpc: AgentRpc::NodeExpand,
            node: n("c")
        }
    );
    assert_eq!(err.class(), ErrorClass::Retry);
}

#[tokio::test]
async fn no_route_at_all_is_reported_without_sending() {
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops").no_route_to("c"),
        AgentSpec::node("c"),
    ])
    .await;
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_expand(node_expand("vol-1", "c"), CALL),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ShimError::NoRoute { .. }), "{err:?}");
    assert_eq!(cluster.agent("ops").shim.stats().sent, 0);
}

#[tokio::test]
async fn an_agents_own_failure_is_never_reported_as_the_plugins_here_or_across_a_hop() {
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops").via("c", "b"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    let message = "volume vol-1: state file /data/node/usage.json: No space left on device";
    let answer = PluginError::failed(ErrorClass::Retry, PluginFailure::Agent, message);
    for caller in ["c", "ops"] {
        cluster
            .agent("c")
            .plugins
            .script(AgentRpc::NodeDetach, Behaviour::Fail(answer.clone()));
        let err = guarded(
            cluster
                .agent(caller)
                .shim
                .node_detach(node_detach("vol-1", "c"), CALL),
        )
        .await
        .unwrap_err();
        match &err {
            ShimError::Plugin { error, .. } => {
                assert_eq!(error.failure, PluginFailure::Agent, "asked from {caller}");
            }
            other => panic!("asked from {caller}: {other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("the serving agent failed") && !text.contains("plugin answered"),
            "{text}"
        );
        assert!(text.contains("usage.json"), "{text}");
        assert_eq!(err.class(), ErrorClass::Retry);
    }
}
