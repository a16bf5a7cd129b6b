//! The caller's deadline bounds every hop.

use std::time::Duration;

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
