//! The caller's deadline bounds every hop, and a call that arrives after it never reaches a
//! plugin.

use std::time::{Duration, SystemTime};

use csi_rpc_shim::wire::pb;
use csi_rpc_shim::{AgentRpc, ShimError};
use csi_structs::ErrorClass;

use crate::support::*;

/// Short enough for a hang test, long enough to stay well above the receiver's clock-skew
/// margin (250 ms), so the call reaches the hung plugin before it times out.
const SHORT: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_relayed_call_to_a_hung_plugin_fails_with_the_callers_deadline() {
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops").via("c", "b"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    cluster
        .agent("c")
        .plugins
        .script(AgentRpc::NodeExpand, Behaviour::Hang);
    let err = guarded(
        cluster
            .agent("ops")
            .shim
            .node_expand(node_expand("vol-1", "c"), SHORT),
    )
    .await
    .unwrap_err();
    assert!(err.is_deadline(), "{err:?}");
    assert_eq!(
        err,
        ShimError::DeadlineExceeded {
            rpc: AgentRpc::NodeExpand,
            node: Some(n("c"))
        }
    );
    // A mutating call that timed out may have happened.
    assert_eq!(err.class(), ErrorClass::Uncertain);

    // The plugin on c was handed the caller's deadline (never more time than the caller
    // gave), and c dropped the hung call instead of letting it run on.
    let seen = cluster.agent("c").plugins.seen();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].budget <= SHORT, "c got {:?}", seen[0].budget);
    assert_eq!(seen[0].ctx.hops, 1);
    let c = &cluster.agent("c").plugins;
    eventually(|| c.cancelled() == 1).await;
}

#[tokio::test]
async fn a_read_only_call_that_times_out_is_retry() {
    let cluster = Cluster::start(vec![AgentSpec::node("a"), AgentSpec::node("b")]).await;
    cluster.controllers_on(&["b"]);
    cluster
        .agent("b")
        .plugins
        .script(AgentRpc::ControllerListVolumes, Behaviour::Hang);
    let list = csi_rpc_shim::ListVolumes {
        query: csi_rpc_shim::ControllerQuery::new(plugin()),
        max_entries: 0,
        starting_token: String::new(),
    };
    let err = guarded(cluster.agent("a").shim.list_volumes(list, SHORT))
        .await
        .unwrap_err();
    assert!(err.is_deadline(), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Retry);
    let b = &cluster.agent("b").plugins;
    assert!(b.seen()[0].budget <= SHORT);
    eventually(|| b.cancelled() == 1).await;
}

#[tokio::test]
async fn a_local_hung_plugin_is_bounded_too() {
    let cluster = Cluster::start(vec![AgentSpec::node("a")]).await;
    cluster
        .agent("a")
        .plugins
        .script(AgentRpc::NodeDetach, Behaviour::Hang);
    let err = guarded(
        cluster
            .agent("a")
            .shim
            .node_detach(node_detach("vol-1", "a"), SHORT),
    )
    .await
    .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Uncertain);
    assert_eq!(cluster.agent("a").plugins.cancelled(), 1);
}

/// Found by the `shim` campaign (csi-campaigns): a peer that sent the request headers without
/// a `grpc-timeout` and then nothing held its call (and the stream) open forever, because the
/// shim's own cap starts only once the request has arrived. The server's timeout now ends it.
#[tokio::test]
async fn a_peer_that_sends_headers_and_then_nothing_gets_an_answer_by_the_cap() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a").max_remote_timeout(SHORT),
        AgentSpec::node("b"),
    ])
    .await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.agent("a").addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    // A request stream that never yields its message: headers go out, then nothing. No
    // timeout is set, so no `grpc-timeout` header is sent and the client never gives up.
    let silent = tonic::Request::new(tokio_stream::pending::<pb::NodeDetachRequest>());
    let path = http::uri::PathAndQuery::from_static(AgentRpc::NodeDetach.path());
    let codec = tonic_prost::ProstCodec::<pb::NodeDetachRequest, pb::NodeDetachResponse>::default();
    let status = guarded(grpc.client_streaming(silent, path, codec))
        .await
        .unwrap_err();
    assert_ne!(status.code(), tonic::Code::Ok);
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());
}

/// A `ControllerUnpublishVolume` of `vol-1` from node c, for the controller on `target`.
fn detach_wire(target: &str) -> pb::ControllerDetachRequest {
    pb::ControllerDetachRequest {
        query: Some(pb::ControllerQuery {
            plugin_id: "ebs".into(),
            preferred_node: String::new(),
            target_node: target.into(),
        }),
        volume_id: "vol-1".into(),
        external_volume_id: "ext-vol-1".into(),
        node_id: "c".into(),
        plugin_node_id: "i-c".into(),
        secrets: Default::default(),
    }
}

/// The flake of `cluster_fencing_a_paused_duty_holder_never_detaches_a_volume_attached_again`,
/// made deterministic: a request that waited in a paused agent's socket is read with a fresh
/// relative `grpc-timeout` (gRPC's deadline restarts when the receiver reads it), while its
/// sender gave up long ago. The stamp says so, and the plugin is never called.
#[tokio::test]
async fn a_call_read_after_its_senders_deadline_never_reaches_the_plugin() {
    let cluster = Cluster::start(vec![AgentSpec::node("b"), AgentSpec::node("c")]).await;
    let mut to_b = raw_client(cluster.agent("b").addr).await;
    // Sent with a 30 s deadline a minute ago; the grpc-timeout says 10 s from now.
    let sent_at = SystemTime::now() - Duration::from_secs(60);
    let req = stamped(
        with_creds(detach_wire("b"), "c", &token_of("c"), None),
        sent_at + Duration::from_secs(30),
    );
    let status = guarded(to_b.controller_detach(req)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    let detail = detail(&status);
    assert_eq!(detail.kind, pb::ErrorKind::DeadlineExceeded as i32);
    // The class the sender gives its own deadline passing: the step is taken again.
    assert_eq!(detail.class, pb::ErrorClass::Uncertain as i32);
    assert_eq!(detail.node_id, "b");
    assert_eq!(
        cluster.agent("b").plugins.calls(AgentRpc::ControllerDetach),
        0
    );
    assert_eq!(cluster.agent("b").shim.stats().served_here, 0);
}

#[tokio::test]
async fn a_stamp_still_ahead_but_within_the_clock_skew_margin_is_refused_too() {
    let cluster = Cluster::start(vec![AgentSpec::node("b"), AgentSpec::node("c")]).await;
    let mut to_b = raw_client(cluster.agent("b").addr).await;
    // Half the default margin ahead: b's clock may lag c's by that much.
    let req = stamped(
        with_creds(detach_wire("b"), "c", &token_of("c"), None),
        SystemTime::now() + csi_rpc_shim::DEFAULT_CLOCK_SKEW_MARGIN / 2,
    );
    let status = guarded(to_b.controller_detach(req)).await.unwrap_err();
    assert_eq!(detail(&status).kind, pb::ErrorKind::DeadlineExceeded as i32);
    assert_eq!(
        cluster.agent("b").plugins.calls(AgentRpc::ControllerDetach),
        0
    );
}

#[tokio::test]
async fn a_call_with_time_left_is_served_within_it_and_one_without_a_stamp_as_before() {
    let cluster = Cluster::start(vec![AgentSpec::node("b"), AgentSpec::node("c")]).await;
    let mut to_b = raw_client(cluster.agent("b").addr).await;
    // The stamp is sooner than the grpc-timeout (10 s): the plugin call gets no more than
    // what is left of the stamp.
    let stamp = Duration::from_secs(8);
    let req = stamped(
        with_creds(detach_wire("b"), "c", &token_of("c"), None),
        SystemTime::now() + stamp,
    );
    guarded(to_b.controller_detach(req)).await.unwrap();
    // From an agent that predates the stamp: bounded by its grpc-timeout alone.
    guarded(to_b.controller_detach(with_creds(detach_wire("b"), "c", &token_of("c"), None)))
        .await
        .unwrap();
    let seen = cluster.agent("b").plugins.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].budget < stamp, "got {:?}", seen[0].budget);
    assert!(seen[1].budget <= CALL, "got {:?}", seen[1].budget);
    assert_eq!(seen[0].ctx.origin, n("c"));
}

#[tokio::test]
async fn a_malformed_stamp_is_refused_naming_the_header() {
    let cluster = Cluster::start(vec![AgentSpec::node("b"), AgentSpec::node("c")]).await;
    let mut to_b = raw_client(cluster.agent("b").addr).await;
    for bad in ["soon", "-5", "1.5e12", "", "99999999999999999999999"] {
        let mut req = with_creds(detach_wire("b"), "c", &token_of("c"), None);
        req.metadata_mut().insert(
            csi_rpc_shim::deadline::DEADLINE_HEADER,
            bad.parse().unwrap(),
        );
        let status = guarded(to_b.controller_detach(req)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{bad:?}");
        let detail = detail(&status);
        assert_eq!(detail.kind, pb::ErrorKind::InvalidRequest as i32);
        assert_eq!(detail.violations.len(), 1, "{bad:?}");
        assert!(
            detail.violations[0].contains(csi_rpc_shim::deadline::DEADLINE_HEADER),
            "{:?}",
            detail.violations
        );
    }
    assert_eq!(
        cluster.agent("b").plugins.calls(AgentRpc::ControllerDetach),
        0
    );
}

/// Through the shims: b's clock runs an hour ahead, as if b had been paused an hour with a's
/// request in its socket. b refuses it, and a reports its deadline passed waiting on b.
#[tokio::test]
async fn a_shim_stamps_its_calls_and_a_late_receiver_refuses_them() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b").clock_ahead(Duration::from_secs(3600)),
    ])
    .await;
    cluster.controllers_on(&["b"]);
    let err = guarded(
        cluster
            .agent("a")
            .shim
            .controller_detach(detach("vol-1", "a"), CALL),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ShimError::DeadlineExceeded {
            rpc: AgentRpc::ControllerDetach,
            node: Some(n("b"))
        }
    );
    assert_eq!(err.class(), ErrorClass::Uncertain);
    assert_eq!(
        cluster.agent("b").plugins.calls(AgentRpc::ControllerDetach),
        0
    );

    // The same agents with b's clock in step: served.
    let cluster = Cluster::start(vec![AgentSpec::node("a"), AgentSpec::node("b")]).await;
    cluster.controllers_on(&["b"]);
    guarded(
        cluster
            .agent("a")
            .shim
            .controller_detach(detach("vol-1", "a"), CALL),
    )
    .await
    .unwrap();
    assert_eq!(cluster.served(AgentRpc::ControllerDetach), ["b"]);
}

/// A relay passes the sender's stamp on: c, an hour ahead, refuses what b relays from ops.
/// And a relay refuses a late call itself rather than passing it on.
#[tokio::test]
async fn the_stamp_crosses_a_relay_and_a_relay_checks_it_too() {
    let cluster = Cluster::start(vec![
        AgentSpec::cluster("ops").via("c", "b"),
        AgentSpec::node("b"),
        AgentSpec::node("c").clock_ahead(Duration::from_secs(3600)),
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
        ShimError::DeadlineExceeded {
            rpc: AgentRpc::NodeExpand,
            node: Some(n("c"))
        }
    );
    assert_eq!(cluster.agent("b").shim.stats().relayed, 1);
    assert!(cluster.served(AgentRpc::NodeExpand).is_empty());

    // A late call reaching the relay goes no further.
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
    let req = stamped(
        with_creds(wire, "ops", &token_of("ops"), Some(0)),
        SystemTime::now() - Duration::from_secs(1),
    );
    let status = guarded(to_b.node_expand(req)).await.unwrap_err();
    let detail = detail(&status);
    assert_eq!(detail.kind, pb::ErrorKind::DeadlineExceeded as i32);
    assert_eq!(detail.node_id, "b");
    assert_eq!(
        cluster.agent("b").shim.stats().relayed,
        1,
        "not relayed again"
    );
    assert!(cluster.served(AgentRpc::NodeExpand).is_empty());
}
