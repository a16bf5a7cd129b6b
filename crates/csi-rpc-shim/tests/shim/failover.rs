//! Controller choice and failover.

use csi_rpc_shim::{
    AgentRpc, GrpcCode, LocalStatus, PluginError, RefusalReason, ServiceKind, ShimError, Strategy,
};
use csi_structs::ErrorClass;

use crate::support::*;

#[tokio::test]
async fn a_controller_whose_agent_is_down_is_skipped() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b").stopped(),
        AgentSpec::node("c"),
    ])
    .await;
    cluster.controllers_on(&["b", "c"]);
    let mut req = attach("vol-1", "a");
    req.query = req.query.prefer(n("b"));
    let out = guarded(cluster.agent("a").shim.controller_attach(req, CALL))
        .await
        .expect("c serves after b is found down");
    assert_eq!(out.publish_context.get("served_by"), Some("c"));
    assert_eq!(cluster.served(AgentRpc::ControllerAttach), ["c"]);
    // The secrets reached the plugin intact across the wire.
    let seen = cluster.agent("c").plugins.seen();
    assert_eq!(seen[0].secrets.as_ref(), Some(&secrets()));
    assert_eq!(seen[0].ctx.origin, n("a"));
}

#[tokio::test]
async fn unavailable_or_retry_elsewhere_fails_over_to_the_next_instance() {
    for failure in [
        unavailable(),
        Behaviour::Fail(PluginError::new(
            ErrorClass::RetryElsewhere,
            GrpcCode::FailedPrecondition,
            "not the leader",
        )),
    ] {
        let cluster = Cluster::start(vec![
            AgentSpec::node("a"),
            AgentSpec::node("b"),
            AgentSpec::node("c"),
        ])
        .await;
        cluster.controllers_on(&["b", "c"]);
        cluster
            .agent("b")
            .plugins
            .script(AgentRpc::ControllerDetach, failure.clone());
        let mut req = detach("vol-1", "a");
        req.query = req.query.prefer(n("b"));
        guarded(cluster.agent("a").shim.controller_detach(req, CALL))
            .await
            .unwrap_or_else(|e| panic!("{failure:?}: {e}"));
        assert_eq!(
            cluster.agent("b").plugins.calls(AgentRpc::ControllerDetach),
            1
        );
        assert_eq!(
            cluster.agent("c").plugins.calls(AgentRpc::ControllerDetach),
            1
        );
    }
}

#[tokio::test]
async fn a_fatal_answer_is_returned_without_trying_others() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    cluster.controllers_on(&["b", "c"]);
    let bad = PluginError::new(
        ErrorClass::Fatal,
        GrpcCode::InvalidArgument,
        "bad capability",
    );
    cluster
        .agent("b")
        .plugins
        .script(AgentRpc::ControllerAttach, Behaviour::Fail(bad.clone()));
    let mut req = attach("vol-1", "a");
    req.query = req.query.prefer(n("b"));
    let err = guarded(cluster.agent("a").shim.controller_attach(req, CALL))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ShimError::Plugin {
            rpc: AgentRpc::ControllerAttach,
            node: n("b"),
            error: bad
        }
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
    assert_eq!(cluster.served(AgentRpc::ControllerAttach), ["b"]);
}

#[tokio::test]
async fn when_every_instance_refuses_one_error_lists_each_reason() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
        AgentSpec::node("d").stopped(),
        AgentSpec::node("e"),
    ])
    .await;
    cluster.controllers_on(&["b", "c", "d"]);
    cluster.registry.update(
        &n("e"),
        &plugin(),
        csi_rpc_shim::Instance::Controller(csi_rpc_shim::Health::unhealthy("probe failed")),
    );
    cluster
        .agent("b")
        .plugins
        .script(AgentRpc::ControllerAttach, unavailable());
    cluster
        .agent("c")
        .plugins
        .set_status(ServiceKind::Controller, LocalStatus::Missing);
    let err = guarded(
        cluster
            .agent("a")
            .shim
            .controller_attach(attach("vol-1", "a"), CALL),
    )
    .await
    .unwrap_err();
    let ShimError::NoController {
        rpc,
        plugin: p,
        refusals,
        maybe_sent,
    } = &err
    else {
        panic!("expected NoController, got {err:?}");
    };
    assert_eq!(*rpc, AgentRpc::ControllerAttach);
    assert_eq!(*p, plugin());
    assert!(!maybe_sent);
    let mut by_node: Vec<(String, RefusalReason)> = refusals
        .iter()
        .map(|r| (r.node.to_string(), r.reason.clone()))
        .collect();
    by_node.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(by_node.len(), 4, "{by_node:?}");
    assert!(
        matches!(&by_node[0], (n, RefusalReason::Plugin(e)) if n == "b" && e.code() == Some(GrpcCode::Unavailable))
    );
    assert_eq!(by_node[1], ("c".into(), RefusalReason::PluginMissing));
    assert_eq!(by_node[2], ("d".into(), RefusalReason::PeerUnreachable));
    assert!(matches!(&by_node[3], (n, RefusalReason::Unhealthy { .. }) if n == "e"));
    assert_eq!(err.class(), ErrorClass::Retry);
    let text = err.to_string();
    for node in ["b:", "c:", "d:", "e:"] {
        assert!(text.contains(node), "{text}");
    }
}

#[tokio::test]
async fn no_controller_at_all_is_one_clear_error() {
    let cluster = Cluster::start(vec![AgentSpec::node("a")]).await;
    let err = guarded(
        cluster
            .agent("a")
            .shim
            .controller_detach(detach("vol-1", "a"), CALL),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ShimError::NoController { refusals, .. } if refusals.is_empty()),
        "{err:?}"
    );
    assert!(err.to_string().contains("no instance is registered"));
}

#[tokio::test]
async fn sticky_choice_sends_a_volumes_calls_to_one_controller_from_every_agent() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    cluster.controllers_on(&["a", "b", "c"]);
    for from in ["a", "b", "c"] {
        for _ in 0..2 {
            guarded(
                cluster
                    .agent(from)
                    .shim
                    .controller_detach(detach("vol-sticky", from), CALL),
            )
            .await
            .unwrap();
        }
    }
    let served = cluster.served(AgentRpc::ControllerDetach);
    assert_eq!(
        served.len(),
        1,
        "one controller for the volume, got {served:?}"
    );
    assert_eq!(
        cluster
            .agent(&served[0])
            .plugins
            .calls(AgentRpc::ControllerDetach),
        6
    );
}

#[tokio::test]
async fn round_robin_spreads_calls() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a").strategy(Strategy::RoundRobin),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    cluster.controllers_on(&["b", "c"]);
    for _ in 0..4 {
        guarded(
            cluster
                .agent("a")
                .shim
                .controller_detach(detach("vol-1", "a"), CALL),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        cluster.agent("b").plugins.calls(AgentRpc::ControllerDetach),
        2
    );
    assert_eq!(
        cluster.agent("c").plugins.calls(AgentRpc::ControllerDetach),
        2
    );
}

#[tokio::test]
async fn a_controller_on_this_node_is_served_without_a_hop() {
    let cluster = Cluster::start(vec![AgentSpec::node("a"), AgentSpec::node("b")]).await;
    cluster.controllers_on(&["a", "b"]);
    let mut req = attach("vol-1", "a");
    req.query = req.query.prefer(n("a"));
    let out = guarded(cluster.agent("a").shim.controller_attach(req, CALL))
        .await
        .unwrap();
    assert_eq!(out.publish_context.get("served_by"), Some("a"));
    let stats = cluster.agent("a").shim.stats();
    assert_eq!((stats.sent, stats.served_here), (0, 1));
    assert_eq!(cluster.agent("b").shim.stats().received, 0);
}

/// A plugin failure whose outcome is unknown (csi-client classes a lost connection or an
/// expired attempt on a mutating call as uncertain, and reports it as UNAVAILABLE) still fails
/// over, but when every instance refuses the caller must learn that the attach may have
/// happened: the combined error is uncertain, never a plain retry.
#[tokio::test]
async fn an_uncertain_refusal_keeps_the_outcome_unknown() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    cluster.controllers_on(&["b", "c"]);
    cluster.agent("b").plugins.script(
        AgentRpc::ControllerAttach,
        Behaviour::Fail(PluginError::new(
            ErrorClass::Uncertain,
            GrpcCode::Unavailable,
            "connection lost mid-call",
        )),
    );
    cluster
        .agent("c")
        .plugins
        .set_status(ServiceKind::Controller, LocalStatus::Missing);
    let err = guarded(
        cluster
            .agent("a")
            .shim
            .controller_attach(attach("vol-1", "a"), CALL),
    )
    .await
    .unwrap_err();
    let ShimError::NoController { maybe_sent, .. } = &err else {
        panic!("expected NoController, got {err:?}");
    };
    assert!(maybe_sent, "b may have attached the volume: {err:?}");
    assert_eq!(err.class(), ErrorClass::Uncertain);
}

/// Health is advice for a release step: a controller instance reported unhealthy is tried
/// after the healthy ones (here: after the only healthy one answers UNAVAILABLE), and alone
/// it still gets the detach; an attach is never sent to it.
#[tokio::test]
async fn a_controller_detach_reaches_an_unhealthy_controller_after_the_healthy_ones() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    cluster.controllers_on(&["c"]);
    cluster.registry.update(
        &n("b"),
        &plugin(),
        csi_rpc_shim::Instance::Controller(csi_rpc_shim::Health::unhealthy("probe hangs")),
    );
    cluster.agent("b").plugins.set_status(
        ServiceKind::Controller,
        LocalStatus::Unhealthy {
            reason: "probe hangs".into(),
        },
    );
    cluster
        .agent("c")
        .plugins
        .script(AgentRpc::ControllerDetach, unavailable());
    guarded(
        cluster
            .agent("a")
            .shim
            .controller_detach(detach("vol-1", "a"), CALL),
    )
    .await
    .expect("the unhealthy instance serves the detach after the healthy one refused");
    assert_eq!(
        cluster.agent("c").plugins.calls(AgentRpc::ControllerDetach),
        1
    );
    assert_eq!(
        cluster.agent("b").plugins.calls(AgentRpc::ControllerDetach),
        1
    );

    // An attach that prefers the unhealthy instance still goes to the healthy one only; once
    // that refuses, there is no controller for it.
    let mut req = attach("vol-1", "a");
    req.query = req.query.prefer(n("b"));
    guarded(cluster.agent("a").shim.controller_attach(req.clone(), CALL))
        .await
        .expect("the healthy instance serves the attach");
    cluster
        .agent("c")
        .plugins
        .script(AgentRpc::ControllerAttach, unavailable());
    let err = guarded(cluster.agent("a").shim.controller_attach(req, CALL))
        .await
        .unwrap_err();
    assert!(matches!(err, ShimError::NoController { .. }), "{err:?}");
    assert_eq!(
        cluster.agent("b").plugins.calls(AgentRpc::ControllerAttach),
        0
    );
}
