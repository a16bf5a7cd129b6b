//! The spec's error codes: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION,
//! RESOURCE_EXHAUSTED, ABORTED, UNIMPLEMENTED, size limits, and the quirks.

use std::collections::HashMap;

use csi_proto::Rpc;
use csi_proto::v1::volume_capability::AccessType;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_testkit::{ControllerCapability, MockPlugin, NodeCapability, Quirk, RecordedOutcome, Role};
use tonic::Code;

use crate::support::*;

#[tokio::test]
async fn missing_fields_are_invalid_and_named() {
    let h = start_default().await;
    let mut c = h.controller();
    let mut req = create_req("x");
    req.name.clear();
    let status = code(c.create_volume(req).await);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("name"), "{}", status.message());

    let mut req = create_req("x");
    req.volume_capabilities.clear();
    let status = code(c.create_volume(req).await);
    assert!(
        status.message().contains("volume_capabilities"),
        "{}",
        status.message()
    );

    let volume = h.create("y").await;
    let mut publish = publish_req(&volume, "", mount(Mode::SingleNodeWriter));
    publish.node_id.clear();
    let status = code(c.controller_publish_volume(publish).await);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("node_id"), "{}", status.message());

    let mut publish = publish_req(&volume, "node-1", mount(Mode::SingleNodeWriter));
    publish.volume_capability = None;
    let status = code(c.controller_publish_volume(publish).await);
    assert!(
        status.message().contains("volume_capability"),
        "{}",
        status.message()
    );

    let mut stage = stage_req(&volume, std::path::Path::new("/"), HashMap::new());
    stage.staging_target_path.clear();
    let status = code(h.node().node_stage_volume(stage).await);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("staging_target_path"));
}

#[tokio::test]
async fn size_limits_are_enforced() {
    let h = start_default().await;
    let status = code(
        h.controller()
            .create_volume(create_req(&"n".repeat(129)))
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("128"), "{}", status.message());
    let mut req = create_req("big-params");
    req.parameters.insert("k".into(), "v".repeat(5000));
    let status = code(h.controller().create_volume(req).await);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("parameters"));
    let mut req = create_req("too-large");
    req.capacity_range = Some(CapacityRange {
        required_bytes: i64::MAX,
        limit_bytes: 0,
    });
    assert_eq!(
        code(h.controller().create_volume(req).await).code(),
        Code::OutOfRange
    );
}

#[tokio::test]
async fn unknown_volumes_nodes_and_snapshots_are_not_found() {
    let h = start_default().await;
    let ghost = Volume {
        volume_id: "vol-ghost".into(),
        ..Default::default()
    };
    let status = code(
        h.controller()
            .controller_publish_volume(publish_req(&ghost, "node-1", mount(Mode::SingleNodeWriter)))
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
    let volume = h.create("real").await;
    let status = code(
        h.controller()
            .controller_publish_volume(publish_req(
                &volume,
                "node-9",
                mount(Mode::SingleNodeWriter),
            ))
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("node-9"));
    let status = code(
        h.node()
            .node_stage_volume(stage_req(&ghost, &h.co_dir("s"), HashMap::new()))
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
    let status = code(
        h.controller()
            .get_snapshot(GetSnapshotRequest {
                snapshot_id: "snap-ghost".into(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
    let mut req = create_req("from-ghost");
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: "snap-ghost".into(),
            },
        )),
    });
    assert_eq!(
        code(h.controller().create_volume(req).await).code(),
        Code::NotFound
    );
}

#[tokio::test]
async fn same_name_with_other_arguments_already_exists() {
    let h = start_default().await;
    let volume = h.create("dup").await;
    let mut req = create_req("dup");
    req.parameters.insert("tier".into(), "gold".into());
    let status = code(h.controller().create_volume(req).await);
    assert_eq!(status.code(), Code::AlreadyExists);
    assert!(status.message().contains("parameters"));
    let other = h.create("other").await;
    let snap = |source: &Volume| CreateSnapshotRequest {
        source_volume_id: source.volume_id.clone(),
        name: "snap".into(),
        ..Default::default()
    };
    h.controller().create_snapshot(snap(&volume)).await.unwrap();
    assert_eq!(
        code(h.controller().create_snapshot(snap(&other)).await).code(),
        Code::AlreadyExists
    );
}

#[tokio::test]
async fn single_node_volume_published_elsewhere_fails_precondition() {
    let h = start_default().await;
    let volume = h.create("rwo").await;
    let mut c = h.controller();
    c.controller_publish_volume(publish_req(
        &volume,
        "node-1",
        mount(Mode::SingleNodeWriter),
    ))
    .await
    .unwrap();
    let status = code(
        c.controller_publish_volume(publish_req(
            &volume,
            "node-2",
            mount(Mode::SingleNodeWriter),
        ))
        .await,
    );
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("node-1"),
        "names the other node: {}",
        status.message()
    );

    let shared = c
        .create_volume(create_with("rwx", mount(Mode::MultiNodeMultiWriter)))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    for node in ["node-1", "node-2"] {
        c.controller_publish_volume(publish_req(
            &shared,
            node,
            mount(Mode::MultiNodeMultiWriter),
        ))
        .await
        .expect("MULTI_NODE volumes publish to several nodes");
    }
    // Same node, other arguments: ALREADY_EXISTS.
    let mut readonly = publish_req(&shared, "node-1", mount(Mode::MultiNodeMultiWriter));
    readonly.readonly = true;
    let status = code(c.controller_publish_volume(readonly).await);
    assert_eq!(status.code(), Code::AlreadyExists);
    // A mode the volume was not created for: INVALID_ARGUMENT.
    let status = code(
        c.controller_publish_volume(publish_req(
            &shared,
            "node-1",
            mount(Mode::MultiNodeReaderOnly),
        ))
        .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn single_node_modes_need_their_capability() {
    let h = start(MockPlugin::builder().controller_capabilities([
        ControllerCapability::CreateDeleteVolume,
        ControllerCapability::PublishUnpublishVolume,
    ]))
    .await;
    let status = code(
        h.controller()
            .create_volume(create_with("snsw", mount(Mode::SingleNodeSingleWriter)))
            .await,
    );
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("SINGLE_NODE_MULTI_WRITER"),
        "{}",
        status.message()
    );
    let h = start_default().await;
    h.controller()
        .create_volume(create_with("snsw", mount(Mode::SingleNodeSingleWriter)))
        .await
        .expect("advertised by default");
}

#[tokio::test]
async fn max_volumes_per_node_is_resource_exhausted() {
    let h = start(MockPlugin::builder().max_volumes_per_node(1)).await;
    let a = h.create("a").await;
    let b = h.create("b").await;
    let mut c = h.controller();
    c.controller_publish_volume(publish_req(&a, "node-1", mount(Mode::SingleNodeWriter)))
        .await
        .unwrap();
    let status = code(
        c.controller_publish_volume(publish_req(&b, "node-1", mount(Mode::SingleNodeWriter)))
            .await,
    );
    assert_eq!(status.code(), Code::ResourceExhausted);
    let info = h
        .node()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.max_volumes_per_node, 1);
    assert_eq!(info.node_id, "node-1");
}

#[tokio::test]
async fn a_second_call_on_a_busy_volume_is_aborted() {
    let h = start_default().await;
    let volume = h.create("busy").await;
    h.server
        .faults()
        .on(Rpc::ControllerPublishVolume)
        .for_volume(&volume.volume_id)
        .hang();
    let mut first_client = h.controller();
    let req = publish_req(&volume, "node-1", mount(Mode::SingleNodeWriter));
    let first = tokio::spawn({
        let req = req.clone();
        async move { first_client.controller_publish_volume(req).await }
    });
    h.server
        .calls()
        .wait_for(GUARD, |c| c.count(Rpc::ControllerPublishVolume) == 1)
        .await
        .expect("the first call arrives");
    let status = code(h.controller().controller_publish_volume(req.clone()).await);
    assert_eq!(status.code(), Code::Aborted);
    // Another volume is not blocked.
    let other = h.create("free").await;
    h.controller()
        .controller_publish_volume(publish_req(&other, "node-1", mount(Mode::SingleNodeWriter)))
        .await
        .expect("other volumes are served");
    h.server.faults().release_hung();
    let released = tokio::time::timeout(GUARD, first)
        .await
        .expect("released")
        .unwrap();
    assert_eq!(code(released).code(), Code::Unavailable);
    // The guard is gone: the volume can be published now.
    h.controller()
        .controller_publish_volume(req)
        .await
        .expect("served after release");
}

#[tokio::test]
async fn rpcs_outside_the_capabilities_are_unimplemented() {
    let h = start(MockPlugin::builder().role(Role::Node)).await;
    let status = code(h.controller().create_volume(create_req("x")).await);
    assert_eq!(status.code(), Code::Unimplemented);
    let caps = h
        .identity()
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let controller_service = caps.capabilities.iter().any(|c| {
        matches!(
            c.r#type,
            Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: 1 }
            ))
        )
    });
    assert!(
        !controller_service,
        "a node-only plugin omits CONTROLLER_SERVICE"
    );

    let h = start(
        MockPlugin::builder()
            .controller_capabilities([ControllerCapability::CreateDeleteVolume])
            .node_capabilities([NodeCapability::GetVolumeStats]),
    )
    .await;
    let status = code(
        h.controller()
            .list_volumes(ListVolumesRequest::default())
            .await,
    );
    assert_eq!(status.code(), Code::Unimplemented);
    assert!(status.message().contains("LIST_VOLUMES"));
    let volume = h.create("v").await;
    let status = code(
        h.node()
            .node_stage_volume(stage_req(&volume, &h.co_dir("s"), HashMap::new()))
            .await,
    );
    assert_eq!(status.code(), Code::Unimplemented);
    let reported = h
        .controller()
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(reported.len(), 1);
    assert_eq!(
        h.server
            .calls()
            .last(Rpc::NodeStageVolume)
            .unwrap()
            .outcome
            .code(),
        Some(Code::Unimplemented)
    );
}

#[tokio::test]
async fn validate_capabilities_quirks() {
    let h = start_default().await;
    let volume = h.create("v").await;
    let validate = |caps: Vec<VolumeCapability>| ValidateVolumeCapabilitiesRequest {
        volume_id: volume.volume_id.clone(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let ok = h
        .controller()
        .validate_volume_capabilities(validate(vec![mount(Mode::SingleNodeWriter)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ok.confirmed.unwrap().volume_capabilities,
        vec![mount(Mode::SingleNodeWriter)]
    );
    let no = h
        .controller()
        .validate_volume_capabilities(validate(vec![mount(Mode::MultiNodeMultiWriter)]))
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none() && !no.message.is_empty());

    h.plugin().set_quirk(Quirk::EchoDifferentFsType);
    let echoed = h
        .controller()
        .validate_volume_capabilities(validate(vec![mount(Mode::SingleNodeWriter)]))
        .await
        .unwrap()
        .into_inner()
        .confirmed
        .unwrap();
    let Some(AccessType::Mount(m)) = &echoed.volume_capabilities[0].access_type else {
        panic!("mount capability expected");
    };
    assert_ne!(m.fs_type, "ext4");

    h.plugin().set_quirk(Quirk::ConfirmUnknownAccessMode);
    let unknown = h
        .controller()
        .validate_volume_capabilities(validate(vec![mount(Mode::SingleNodeWriter)]))
        .await
        .unwrap()
        .into_inner()
        .confirmed
        .unwrap();
    assert_eq!(unknown.volume_capabilities[0].access_mode.unwrap().mode, 0);

    h.plugin().clear_quirks();
    h.plugin().set_quirk(Quirk::ConfirmDifferentCapability);
    let different = h
        .controller()
        .validate_volume_capabilities(validate(vec![mount(Mode::SingleNodeWriter)]))
        .await
        .unwrap()
        .into_inner()
        .confirmed
        .unwrap();
    assert_ne!(
        different.volume_capabilities,
        vec![mount(Mode::SingleNodeWriter)]
    );

    h.plugin().set_quirk(Quirk::NeverConfirm);
    let never = h
        .controller()
        .validate_volume_capabilities(validate(vec![mount(Mode::SingleNodeWriter)]))
        .await
        .unwrap()
        .into_inner();
    assert!(never.confirmed.is_none());
}

#[tokio::test]
async fn probe_quirks() {
    let h = start(MockPlugin::builder().quirk(Quirk::ProbeNotReady)).await;
    let probe = h
        .identity()
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false));
    h.plugin().set_quirk(Quirk::ProbeReadyAbsent);
    let probe = h
        .identity()
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, None);
    h.plugin().clear_quirks();
    let probe = h
        .identity()
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
}

#[tokio::test]
async fn the_call_log_never_holds_a_secret() {
    let h = start_default().await;
    let mut req = create_req("secretive");
    req.secrets.insert("password".into(), "hunter2".into());
    h.controller().create_volume(req).await.unwrap();
    let record = h.server.calls().last(Rpc::CreateVolume).unwrap();
    assert!(record.request.contains("password"));
    assert!(!record.request.contains("hunter2"));
    assert_eq!(record.outcome, RecordedOutcome::Ok);
}
