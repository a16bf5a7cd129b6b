//! Requests from other agents are checked like user input; secrets never print.

use csi_rpc_shim::wire::{SECRET_MESSAGES, pb};
use csi_rpc_shim::{AgentRpc, ShimError};

use crate::support::*;

#[tokio::test]
async fn a_malformed_request_is_rejected_naming_each_field() {
    let cluster = Cluster::start(vec![AgentSpec::node("a"), AgentSpec::node("b")]).await;
    let mut to_b = raw_client(cluster.agent("b").addr).await;
    let mut secrets = std::collections::BTreeMap::new();
    secrets.insert("bad key!".to_string(), "v".to_string());
    let wire = pb::ControllerAttachRequest {
        query: Some(pb::ControllerQuery {
            plugin_id: "ebs".into(),
            preferred_node: String::new(),
            target_node: "b".into(),
        }),
        volume_id: String::new(),
        external_volume_id: "x".repeat(200),
        node_id: "a".into(),
        plugin_node_id: "i-a".into(),
        capability: Some(pb::Capability {
            access_mode: 99,
            access_type: pb::AccessType::Block as i32,
            ..Default::default()
        }),
        read_only: false,
        secrets,
        volume_context: [("k".to_string(), "v".repeat(5000))].into(),
    };
    let status = to_b
        .controller_attach(with_creds(wire, "a", &token_of("a"), None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let d = detail(&status);
    assert_eq!(d.kind, pb::ErrorKind::InvalidRequest as i32);
    let joined = d.violations.join("\n");
    for field in [
        "volume_id",
        "external_volume_id",
        "capability.access_mode",
        "secrets",
        "volume_context",
    ] {
        assert!(
            d.violations.iter().any(|v| v.starts_with(field)),
            "{field} missing from:\n{joined}"
        );
    }
    assert!(cluster.served(AgentRpc::ControllerAttach).is_empty());
}

#[tokio::test]
async fn an_oversized_message_is_refused() {
    let cluster = Cluster::start(vec![AgentSpec::node("a"), AgentSpec::node("b")]).await;
    let mut to_b = raw_client(cluster.agent("b").addr).await;
    let wire = pb::ControllerValidateRequest {
        parameters: [("k".to_string(), "v".repeat(1 << 20))].into(),
        ..Default::default()
    };
    let status = to_b
        .controller_validate(with_creds(wire, "a", &token_of("a"), None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange);
}

/// Sends a CreateVolume with these sizes and capabilities from a cluster agent whose only
/// controller is elsewhere; it must fail locally as an invalid request, sending nothing.
/// Returns the violation lines.
async fn refused_create(
    required_bytes: i64,
    limit_bytes: i64,
    capabilities: Vec<csi_structs::VolumeCapability>,
) -> Vec<String> {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    cluster.controllers_on(&["b"]);
    let create = csi_rpc_shim::CreateVolume {
        query: csi_rpc_shim::ControllerQuery::new(plugin()),
        volume: csi_structs::VolumeId::new("vol-new").unwrap(),
        required_bytes,
        limit_bytes,
        capabilities,
        parameters: Default::default(),
        secrets: secrets(),
        accessibility_requirements: None,
        content_source: None,
    };
    let err = guarded(cluster.agent("ops").shim.create_volume(create, CALL))
        .await
        .unwrap_err();
    let ShimError::InvalidRequest { error, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(cluster.agent("ops").shim.stats().sent, 0);
    error.lines()
}

#[tokio::test]
async fn an_invalid_local_request_fails_before_sending() {
    let lines = refused_create(-1, 0, vec![]).await;
    assert!(
        lines.iter().any(|l| l.starts_with("required_bytes")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("capabilities")),
        "{lines:?}"
    );
}

#[tokio::test]
async fn a_size_limit_below_the_requirement_is_refused_naming_the_limit() {
    let lines = refused_create(2 << 30, 1 << 30, vec![attach("vol-1", "b").capability]).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("limit_bytes"), "{lines:?}");
}

#[test]
fn no_debug_print_shows_a_secret() {
    let secret = "hunter2-very-secret";
    let domain = [
        format!("{:?}", attach("vol-1", "a")),
        format!("{:?}", detach("vol-1", "a")),
        format!("{:?}", node_expand("vol-1", "a")),
    ];
    let mut map = std::collections::BTreeMap::new();
    map.insert("password".to_string(), secret.to_string());
    let wire = [
        format!(
            "{:?}",
            pb::ControllerAttachRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::ControllerDetachRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::ControllerValidateRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::ControllerCreateVolumeRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::ControllerDeleteVolumeRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::ControllerExpandVolumeRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::ControllerCreateSnapshotRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::ControllerDeleteSnapshotRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::ControllerListSnapshotsRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
        format!(
            "{:?}",
            pb::NodeExpandRequest {
                secrets: map.clone(),
                ..Default::default()
            }
        ),
    ];
    // Every message with secrets is covered above.
    assert_eq!(SECRET_MESSAGES.len(), wire.len());
    for shown in domain.iter().chain(&wire) {
        assert!(shown.contains("password"), "{shown}");
        assert!(!shown.contains(secret), "{shown}");
    }
}

#[tokio::test]
async fn a_snapshot_name_with_a_banned_control_character_is_refused() {
    let cluster = Cluster::start(vec![AgentSpec::cluster("ops"), AgentSpec::node("b")]).await;
    cluster.controllers_on(&["b"]);
    let create = csi_rpc_shim::CreateSnapshot {
        query: csi_rpc_shim::ControllerQuery::new(plugin()),
        volume: csi_structs::VolumeId::new("vol-1").unwrap(),
        source: csi_structs::ExternalVolumeId::new("ext-1").unwrap(),
        // U+0007 is among the characters the spec bans in names.
        name: "nightly\u{7}backup".into(),
        parameters: Default::default(),
        secrets: secrets(),
    };
    let err = guarded(cluster.agent("ops").shim.create_snapshot(create, CALL))
        .await
        .unwrap_err();
    let ShimError::InvalidRequest { error, .. } = &err else {
        panic!("{err:?}");
    };
    let lines = error.lines();
    assert!(lines.iter().any(|l| l.starts_with("name")), "{lines:?}");
    assert_eq!(cluster.agent("ops").shim.stats().sent, 0);
    assert!(
        cluster
            .served(AgentRpc::ControllerCreateSnapshot)
            .is_empty()
    );
}
