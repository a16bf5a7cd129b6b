//! Required secrets over a real socket: a call without the secret, or with another value, is
//! refused with INVALID_ARGUMENT naming the key and never the value, and shows in the call log;
//! with it the call is served; other rpcs are not touched; a requirement on an rpc without
//! secrets is refused when the mock is built.

use std::collections::HashMap;

use csi_proto::Rpc;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_testkit::secrets::{SecretRequirementError, takes_secrets};
use csi_testkit::{ConfigError, MockPlugin, RecordedOutcome, Role};
use tonic::Code;

use crate::support::*;

/// The required value: it must never appear in a status, the call log or a log line.
const VALUE: &str = "S3CR3T-VALUE-7f1c";
/// A value that is not the required one: it must not appear either.
const WRONG: &str = "WR0NG-VALUE-93ab";

fn secrets(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

fn create(name: &str, pairs: &[(&str, &str)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        secrets: secrets(pairs),
        ..create_req(name)
    }
}

fn assert_hides_values(text: &str) {
    assert!(
        !text.contains(VALUE) && !text.contains(WRONG),
        "a secret value leaked: {text}"
    );
}

#[tokio::test]
async fn a_call_without_the_required_secret_is_refused_and_logged() {
    let h = start(MockPlugin::builder().require_secret(Rpc::CreateVolume, "token", VALUE)).await;
    let mut controller = h.controller();

    let missing = controller
        .create_volume(create("a", &[("other", VALUE)]))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert_eq!(missing.message(), r#"CreateVolume: missing secret "token""#);

    let wrong = controller
        .create_volume(create("a", &[("token", WRONG)]))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument);
    assert!(
        wrong.message().starts_with("CreateVolume: ") && wrong.message().contains(r#""token""#),
        "{}",
        wrong.message()
    );
    assert_hides_values(wrong.message());

    let created = controller
        .create_volume(create("a", &[("token", VALUE), ("other", WRONG)]))
        .await
        .expect("the required secret is there")
        .into_inner();
    assert!(created.volume.is_some());
    assert_eq!(h.plugin().volumes().len(), 1);

    let records = h.server.calls().of(Rpc::CreateVolume).into_records();
    let outcomes: Vec<RecordedOutcome> = records.iter().map(|r| r.outcome.clone()).collect();
    assert_eq!(
        outcomes,
        vec![
            RecordedOutcome::Failed {
                code: Code::InvalidArgument,
                message: missing.message().to_string(),
            },
            RecordedOutcome::Failed {
                code: Code::InvalidArgument,
                message: wrong.message().to_string(),
            },
            RecordedOutcome::Ok,
        ]
    );
    for record in &records {
        assert_hides_values(&format!("{record:?}"));
        assert!(record.request.contains("token") || record.request.contains("other"));
    }
}

#[tokio::test]
async fn every_requirement_of_an_rpc_must_hold_and_other_rpcs_are_untouched() {
    let h = start(
        MockPlugin::builder()
            .require_secret(Rpc::NodeStageVolume, "user", "admin")
            .require_secret(Rpc::NodeStageVolume, "token", VALUE),
    )
    .await;
    // Calls of other rpcs, with a secrets field or without, are served without secrets.
    let volume = h.create("a").await;
    let context = h
        .controller()
        .controller_publish_volume(publish_req(
            &volume,
            "node-1",
            mount(Mode::SingleNodeWriter),
        ))
        .await
        .expect("ControllerPublishVolume has no requirement")
        .into_inner()
        .publish_context;
    h.controller()
        .list_volumes(ListVolumesRequest::default())
        .await
        .expect("ListVolumes takes no secrets");

    let staging = h.co_dir("staging");
    let stage = |pairs: &[(&str, &str)]| NodeStageVolumeRequest {
        secrets: secrets(pairs),
        ..stage_req(&volume, &staging, context.clone())
    };
    let mut node = h.node();
    let refused = node
        .node_stage_volume(stage(&[("user", "admin")]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        r#"NodeStageVolume: missing secret "token""#
    );
    let refused = node
        .node_stage_volume(stage(&[("token", VALUE), ("user", WRONG)]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().starts_with("NodeStageVolume: ")
            && refused.message().contains(r#""user""#)
            && !refused.message().contains(r#""token""#),
        "{}",
        refused.message()
    );
    assert_hides_values(refused.message());
    assert!(h.plugin().staged().is_empty());

    node.node_stage_volume(stage(&[("user", "admin"), ("token", VALUE)]))
        .await
        .expect("both secrets are there");
    assert_eq!(h.plugin().staged().len(), 1);
}

#[tokio::test]
async fn requirements_can_be_added_and_cleared_while_the_mock_runs() {
    let h = start(MockPlugin::builder()).await;
    let mut controller = h.controller();
    controller
        .create_volume(create("a", &[]))
        .await
        .expect("no requirement yet");

    h.plugin()
        .require_secret(Rpc::CreateVolume, "token", VALUE)
        .expect("CreateVolume takes secrets");
    let refused = controller
        .create_volume(create("b", &[]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        h.plugin()
            .require_secret(Rpc::NodeUnpublishVolume, "token", VALUE),
        Err(SecretRequirementError::NoSecretsField {
            rpc: Rpc::NodeUnpublishVolume
        })
    );

    h.plugin().clear_secret_requirements();
    controller
        .create_volume(create("b", &[]))
        .await
        .expect("the requirement is gone");
}

#[tokio::test]
async fn a_scripted_fault_and_unimplemented_come_before_the_secrets() {
    let h = start(
        MockPlugin::builder()
            .role(Role::Node)
            .require_secret(Rpc::CreateVolume, "token", VALUE)
            .require_secret(Rpc::NodePublishVolume, "token", VALUE),
    )
    .await;
    // A node-only plugin does not serve CreateVolume, whatever its secrets.
    let unimplemented = h
        .controller()
        .create_volume(create("a", &[]))
        .await
        .unwrap_err();
    assert_eq!(unimplemented.code(), Code::Unimplemented);

    h.server
        .faults()
        .on(Rpc::NodePublishVolume)
        .fail(Code::Unavailable, "scripted");
    let target = h.co_dir("target").join("vol-1");
    let publish = || NodePublishVolumeRequest {
        volume_id: "vol-1".into(),
        target_path: path_str(&target),
        volume_capability: Some(mount(Mode::SingleNodeWriter)),
        ..Default::default()
    };
    let mut node = h.node();
    let scripted = node.node_publish_volume(publish()).await.unwrap_err();
    assert_eq!(
        (scripted.code(), scripted.message()),
        (Code::Unavailable, "scripted")
    );
    let refused = node.node_publish_volume(publish()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        r#"NodePublishVolume: missing secret "token""#
    );
}

#[tokio::test]
async fn a_streaming_rpc_is_refused_before_its_stream() {
    let h = start(MockPlugin::builder().require_secret(Rpc::GetMetadataAllocated, "token", VALUE))
        .await;
    let refused = h
        .metadata()
        .get_metadata_allocated(GetMetadataAllocatedRequest {
            snapshot_id: "snap-unknown".into(),
            secrets: secrets(&[("token", WRONG)]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains(r#""token""#),
        "{}",
        refused.message()
    );
    assert_hides_values(refused.message());
}

#[test]
fn only_rpcs_with_a_secrets_field_accept_a_requirement() {
    let err = MockPlugin::builder()
        .require_secret(Rpc::NodeStageVolume, "token", VALUE)
        .require_secret(Rpc::NodeUnpublishVolume, "token", VALUE)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::SecretRequirement(SecretRequirementError::NoSecretsField {
            rpc: Rpc::NodeUnpublishVolume
        })
    );
    let text = err.to_string();
    assert!(text.contains("NodeUnpublishVolume"), "{text}");
    assert_hides_values(&text);

    let accepted: Vec<Rpc> = Rpc::ALL
        .iter()
        .copied()
        .filter(|&rpc| {
            MockPlugin::builder()
                .require_secret(rpc, "token", VALUE)
                .build()
                .is_ok()
        })
        .collect();
    assert_eq!(accepted.len(), 22);
    assert!(accepted.iter().all(|&rpc| takes_secrets(rpc)));
    for rpc in [
        Rpc::CreateVolume,
        Rpc::DeleteVolume,
        Rpc::ControllerPublishVolume,
        Rpc::ControllerUnpublishVolume,
        Rpc::ValidateVolumeCapabilities,
        Rpc::ListSnapshots,
        Rpc::CreateSnapshot,
        Rpc::DeleteSnapshot,
        Rpc::ControllerExpandVolume,
        Rpc::ControllerModifyVolume,
        Rpc::NodeStageVolume,
        Rpc::NodePublishVolume,
        Rpc::NodeExpandVolume,
        Rpc::CreateVolumeGroupSnapshot,
        Rpc::GetMetadataAllocated,
        Rpc::GetMetadataDelta,
    ] {
        assert!(accepted.contains(&rpc), "{rpc:?}");
    }

    let bad_key = MockPlugin::builder()
        .require_secret(Rpc::NodeStageVolume, "no spaces", VALUE)
        .build()
        .unwrap_err();
    assert!(matches!(
        bad_key,
        ConfigError::SecretRequirement(SecretRequirementError::Invalid {
            rpc: Rpc::NodeStageVolume,
            ..
        })
    ));
    assert_hides_values(&bad_key.to_string());
    assert_hides_values(&format!(
        "{:?}",
        MockPlugin::builder().require_secret(Rpc::NodeStageVolume, "token", VALUE)
    ));
}

#[test]
fn no_log_line_holds_a_secret_value() {
    let lines = csi_testkit::logs::capture(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let plugin = MockPlugin::builder()
                .require_secret(Rpc::CreateVolume, "token", VALUE)
                .build()
                .expect("a valid configuration");
            let (server, channel) = plugin.serve_in_memory().await.expect("served");
            let mut controller = csi_proto::v1::controller_client::ControllerClient::new(channel);
            for pairs in [&[("token", WRONG)][..], &[][..], &[("token", VALUE)][..]] {
                let _ = controller.create_volume(create("a", pairs)).await;
            }
            server.shutdown().await.expect("shut down");
        });
    });
    assert!(
        lines.iter().any(|line| line.contains("missing secret")),
        "the refusals are logged: {lines:#?}"
    );
    for line in &lines {
        assert_hides_values(line);
    }
}
