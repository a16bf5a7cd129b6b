//! The caller's deadline bounds every hop.

use std::time::Duration;

use csi_rpc_shim::wire::pb;
use csi_rpc_shim::{AgentRpc, ShimError};
use csi_structs::ErrorClass;

use crate::support::*;

const SHORT: Duration = Duration::from_millis(300);

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
