//! Authentication and the rule that a node acts only for itself.

use csi_rpc_shim::wire::pb;
use csi_rpc_shim::{AgentRpc, Denied, ShimError};
use csi_structs::ErrorClass;

use crate::support::*;

#[tokio::test]
async fn a_wrong_token_is_refused_and_never_shown() {
    let wrong = "not-the-token-of-a-000000";
    let cluster = Cluster::start(vec![
        AgentSpec::node("a").presenting(wrong),
        AgentSpec::node("b"),
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
    // b refused a's credentials; the failover loop treats that as final.
    assert_eq!(
        err,
        ShimError::Unauthenticated {
            rpc: AgentRpc::ControllerDetach,
            node: n("b")
        }
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
    assert!(cluster.served(AgentRpc::ControllerDetach).is_empty());
    for shown in [
        err.to_string(),
        format!("{err:?}"),
        format!("{:?}", cluster.agent("a").shim),
    ] {
        assert!(!shown.contains(wrong), "{shown}");
        assert!(!shown.contains(&token_of("a")), "{shown}");
    }
}

#[tokio::test]
async fn missing_or_unknown_credentials_get_unauthenticated() {
    let cluster = Cluster::start(vec![AgentSpec::node("a"), AgentSpec::node("b")]).await;
    let mut client = raw_client(cluster.agent("b").addr).await;
    let msg = pb::NodeDetachRequest::default();

    let status = client
        .node_detach(tonic::Request::new(msg.clone()))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert_eq!(detail(&status).kind, pb::ErrorKind::Unauthenticated as i32);

    for (node, token) in [
        ("stranger", token_of("a")),
        ("a", token_of("b")),
        ("a", "x".repeat(40)),
    ] {
        let status = client
            .node_detach(with_creds(msg.clone(), node, &token, None))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{node}");
        assert!(!status.message().contains(&token), "{}", status.message());
    }
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());
}

#[tokio::test]
async fn a_node_cannot_detach_for_another_node() {
    let cluster = Cluster::start(vec![
        AgentSpec::node("a"),
        AgentSpec::node("b"),
        AgentSpec::node("c"),
    ])
    .await;
    cluster.controllers_on(&["b"]);
    let a = &cluster.agent("a").shim;

    // Refused by a itself before anything is sent.
    let err = guarded(a.node_detach(node_detach("vol-1", "c"), CALL))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ShimError::Denied {
            rpc: AgentRpc::NodeDetach,
            denied: Denied::OtherNode {
                caller: n("a"),
                subject: n("c")
            }
        }
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
    let err = guarded(a.controller_detach(detach("vol-1", "c"), CALL))
        .await
        .unwrap_err();
    assert!(matches!(err, ShimError::Denied { .. }), "{err:?}");
    assert_eq!(a.stats().sent, 0);

    // And by the serving agents, for a caller that skips its own checks.
    let mut to_b = raw_client(cluster.agent("b").addr).await;
    let wire = pb::ControllerDetachRequest {
        query: Some(pb::ControllerQuery {
            plugin_id: "ebs".into(),
            preferred_node: String::new(),
            target_node: "b".into(),
        }),
        volume_id: "vol-1".into(),
        external_volume_id: "ext-vol-1".into(),
        node_id: "c".into(),
        plugin_node_id: "i-c".into(),
        secrets: Default::default(),
    };
    let status = to_b
        .controller_detach(with_creds(wire.clone(), "a", &token_of("a"), None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(detail(&status).kind, pb::ErrorKind::PermissionDenied as i32);

    // Naming itself but another node's plugin node id is refused too.
    let sneaky = pb::ControllerDetachRequest {
        node_id: "a".into(),
        plugin_node_id: "i-c".into(),
        ..wire.clone()
    };
    let status = to_b
        .controller_detach(with_creds(sneaky, "a", &token_of("a"), None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);

    let mut to_c = raw_client(cluster.agent("c").addr).await;
    let nd = pb::NodeDetachRequest {
        plugin_id: "ebs".into(),
        volume_id: "vol-1".into(),
        external_volume_id: "ext-vol-1".into(),
        node_id: "c".into(),
        workload_id: "alloc-1".into(),
        capability: Some(pb::Capability {
            access_mode: 1,
            access_type: pb::AccessType::Block as i32,
            ..Default::default()
        }),
        read_only: false,
    };
    let status = to_c
        .node_detach(with_creds(nd.clone(), "a", &token_of("a"), None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert!(cluster.served(AgentRpc::ControllerDetach).is_empty());
    assert!(cluster.served(AgentRpc::NodeDetach).is_empty());

    // The same call with its own node's credentials goes through.
    to_c.node_detach(with_creds(nd, "c", &token_of("c"), None))
        .await
        .unwrap();
    assert_eq!(cluster.served(AgentRpc::NodeDetach), ["c"]);
}

#[tokio::test]
async fn node_scope_cannot_make_cluster_wide_calls() {
    let cluster = Cluster::start(vec![AgentSpec::node("a"), AgentSpec::cluster("ops")]).await;
    cluster.controllers_on(&["a"]);
    let create = csi_rpc_shim::CreateVolume {
        query: csi_rpc_shim::ControllerQuery::new(plugin()),
        volume: csi_structs::VolumeId::new("vol-new").unwrap(),
        required_bytes: 1 << 30,
        limit_bytes: 0,
        capabilities: vec![capability()],
        parameters: Default::default(),
        secrets: secrets(),
        accessibility_requirements: None,
        content_source: None,
    };
    let err = guarded(cluster.agent("a").shim.create_volume(create.clone(), CALL))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ShimError::Denied {
                denied: Denied::ClusterOnly { .. },
                ..
            }
        ),
        "{err:?}"
    );
    // The cluster-scoped agent may, and reaches a's controller.
    let out = guarded(cluster.agent("ops").shim.create_volume(create, CALL))
        .await
        .unwrap();
    assert_eq!(out.external_volume.as_str(), "ext-vol-new");
    assert_eq!(cluster.served(AgentRpc::ControllerCreateVolume), ["a"]);
}
