//! Typed answers, validation and the higher-level helpers against the mock plugin.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use csi_client::{
    AttemptEvent, CallEvent, CallObserver, Code, ErrorClass, ErrorKind, HealthReason, HealthState,
    Readiness, ResponseError, Rpc, proto,
};
use csi_structs::confirm::AskedCapabilities;
use csi_structs::{
    AccessMode, ConfirmPolicy, Confirmation, ExternalVolumeId, Mismatch, MountOptions, Parameters,
    Secrets, VolumeCapability,
};
use csi_testkit::Quirk;

use crate::support::{Mock, TinyServer, guard};

fn asked() -> AskedCapabilities {
    AskedCapabilities::new(vec![VolumeCapability::mount(
        AccessMode::SingleNodeWriter,
        MountOptions::new().with_fs_type("ext4"),
    )])
}

fn vol1() -> ExternalVolumeId {
    ExternalVolumeId::new("vol-1").unwrap()
}

#[tokio::test]
async fn invalid_requests_are_refused_before_sending() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let mut req = proto::NodeStageVolumeRequest::default();
    req.secrets.insert("password".into(), "hunter2".into());
    let err = guard(client.node().node_stage_volume(req))
        .await
        .unwrap_err();
    let ErrorKind::InvalidRequest(errs) = err.kind() else {
        panic!("expected an invalid request, got {err:?}");
    };
    let fields: Vec<String> = errs
        .violations()
        .iter()
        .map(|v| v.field.to_string())
        .collect();
    assert_eq!(
        fields,
        ["volume_id", "staging_target_path", "volume_capability"]
    );
    assert_eq!((err.attempts(), err.class()), (0, ErrorClass::Fatal));
    assert!(mock.plugin.calls().is_empty(), "nothing reached the plugin");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[tokio::test]
async fn request_names_with_control_characters_are_refused_before_sending() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let err = guard(client.controller().create_snapshot(
        &vol1(),
        "snap\u{1b}[2J",
        &Parameters::default(),
        &Secrets::default(),
    ))
    .await
    .unwrap_err();
    let ErrorKind::InvalidRequest(errs) = err.kind() else {
        panic!("expected an invalid request, got {err:?}");
    };
    let fields: Vec<String> = errs
        .violations()
        .iter()
        .map(|v| v.field.to_string())
        .collect();
    assert_eq!(fields, ["name"]);
    assert_eq!((err.attempts(), err.class()), (0, ErrorClass::Fatal));
    assert!(mock.plugin.calls().is_empty(), "nothing reached the plugin");
}

#[tokio::test]
async fn secrets_never_reach_an_error() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::DeleteVolume)
        .fail(Code::PermissionDenied, "denied")
        .install();
    let client = mock.client(|_| {});
    let mut req = proto::DeleteVolumeRequest {
        volume_id: "vol-1".into(),
        ..Default::default()
    };
    req.secrets.insert("token".into(), "s3cr3t-value".into());
    let err = guard(client.controller().delete_volume(req))
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::Fatal);
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("s3cr3t-value"), "{shown}");
    assert!(
        shown.contains("DeleteVolume") && shown.contains("vol-1"),
        "{shown}"
    );
}

#[tokio::test]
async fn an_invalid_answer_is_a_typed_error_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.sock");
    let server = TinyServer::start_named(&path, "");
    let client = csi_client::CsiClient::new(csi_client::Endpoint::unix(&path).unwrap());
    let err = guard(client.identity().get_plugin_info())
        .await
        .unwrap_err();
    let ErrorKind::InvalidResponse(ResponseError::Fields(errs)) = err.kind() else {
        panic!("expected an invalid response, got {err:?}");
    };
    assert_eq!(errs.violations()[0].field.to_string(), "name");
    // A read whose answer is unusable may be asked again; it is never fatal.
    assert_eq!(err.class(), ErrorClass::Retry);
    assert_eq!(err.attempts(), 1, "an invalid answer is not retried");
    server.stop().await;
}

#[tokio::test]
async fn validate_confirms_what_was_asked() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let answer = guard(client.controller().validate_volume_capabilities(
        &vol1(),
        &asked(),
        &Secrets::default(),
        ConfirmPolicy::Strict,
    ))
    .await
    .unwrap();
    assert_eq!(answer, Confirmation::Confirmed);
}

#[tokio::test]
async fn absent_confirmed_under_both_policies() {
    let mock = Mock::start(
        csi_testkit::MockPlugin::builder()
            .volume("vol-1", 1 << 30)
            .quirk(Quirk::NeverConfirm)
            .build()
            .unwrap(),
    )
    .await;
    let client = mock.client(|_| {});
    let controller = client.controller();
    let strict = guard(controller.validate_volume_capabilities(
        &vol1(),
        &asked(),
        &Secrets::default(),
        ConfirmPolicy::Strict,
    ))
    .await
    .unwrap();
    assert!(!strict.is_accepted());
    assert_eq!(strict.mismatches(), [Mismatch::NothingConfirmed]);
    let lenient = guard(controller.validate_volume_capabilities(
        &vol1(),
        &asked(),
        &Secrets::default(),
        ConfirmPolicy::Lenient,
    ))
    .await
    .unwrap();
    assert!(
        matches!(lenient, Confirmation::AcceptedUnconfirmed { .. }),
        "{lenient:?}"
    );
}

#[tokio::test]
async fn mismatched_confirmations_name_the_field() {
    for (quirk, field) in [
        (
            Quirk::ConfirmDifferentCapability,
            "volume_capabilities[0].access_mode",
        ),
        (
            Quirk::EchoDifferentFsType,
            "volume_capabilities[0].mount.fs_type",
        ),
    ] {
        let mock = Mock::start(
            csi_testkit::MockPlugin::builder()
                .volume("vol-1", 1 << 30)
                .quirk(quirk)
                .build()
                .unwrap(),
        )
        .await;
        let client = mock.client(|_| {});
        let answer = guard(client.controller().validate_volume_capabilities(
            &vol1(),
            &asked(),
            &Secrets::default(),
            ConfirmPolicy::Strict,
        ))
        .await
        .unwrap();
        assert!(!answer.is_accepted(), "{quirk:?}: {answer:?}");
        let texts: Vec<String> = answer
            .mismatches()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(
            texts.iter().any(|t| t.starts_with(field)),
            "{quirk:?}: {texts:?}"
        );
    }
}

#[tokio::test]
async fn fingerprint_gathers_everything_in_one_value() {
    let mock = Mock::start(
        csi_testkit::MockPlugin::builder()
            .node_id("node-7")
            .topology("topology.example.com/zone", "z1")
            .build()
            .unwrap(),
    )
    .await;
    let client = mock.client(|_| {});
    let fp = guard(client.fingerprint()).await.unwrap();
    assert_eq!(fp.plugin.name.as_str(), "mock.csi.example");
    assert!(fp.capabilities.plugin.has_controller_service());
    assert!(fp.capabilities.controller.can_create_delete());
    assert!(!fp.capabilities.node.is_empty());
    let node = fp.node.expect("the mock serves the node service");
    assert_eq!(node.node_id.as_str(), "node-7");
    assert_eq!(node.max_volumes, None, "0 on the wire means no limit");
    assert_eq!(
        node.topology
            .as_ref()
            .and_then(|t| t.get("topology.example.com/zone")),
        Some("z1")
    );
}

#[tokio::test]
async fn probe_readiness_follows_the_answer() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    mock.plugin.set_quirk(Quirk::ProbeReadyAbsent);
    assert_eq!(
        guard(client.identity().probe()).await.unwrap(),
        Readiness::Ready
    );
    mock.plugin.set_quirk(Quirk::ProbeNotReady);
    assert_eq!(
        guard(client.identity().probe()).await.unwrap(),
        Readiness::NotReady
    );
}

#[tokio::test]
async fn health_watcher_reports_transitions_and_a_final_unhealthy() {
    let mut mock = Mock::default().await;
    let client = mock.client(|_| {});
    let mut health = client.watch_health(Duration::from_millis(10));

    let first = guard(health.next()).await.unwrap();
    assert_eq!(first.state, HealthState::Healthy);

    mock.plugin.set_quirk(Quirk::ProbeNotReady);
    let second = guard(health.next()).await.unwrap();
    assert_eq!(second.state, HealthState::NotReady);
    assert!(matches!(second.reason, HealthReason::ReportedNotReady));

    mock.plugin.clear_quirks();
    mock.faults()
        .on(Rpc::Probe)
        .fail(Code::FailedPrecondition, "disk driver missing")
        .install();
    let third = guard(health.next()).await.unwrap();
    assert_eq!(third.state, HealthState::Unhealthy);
    let HealthReason::ProbeFailed(e) = &third.reason else {
        panic!("expected a probe failure, got {:?}", third.reason);
    };
    assert_eq!(e.class(), ErrorClass::RetryElsewhere);
    assert_eq!(e.message(), Some("disk driver missing"));

    mock.stop().await;
    let last = loop {
        let event = guard(health.next())
            .await
            .expect("a final event before the end");
        if event.last {
            break event;
        }
    };
    assert_eq!(last.state, HealthState::Unhealthy);
    assert!(matches!(last.reason, HealthReason::SocketRemoved));
    assert!(guard(health.next()).await.is_none());
}

#[derive(Debug, Default)]
struct Counter {
    attempts: AtomicU32,
    calls: AtomicU32,
    failed_attempts: AtomicU32,
}

impl CallObserver for Counter {
    fn on_attempt(&self, event: &AttemptEvent) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        if event.outcome.code() != Some(Code::Ok) {
            self.failed_attempts.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn on_call(&self, event: &CallEvent) {
        assert_eq!(event.rpc, Rpc::NodeGetCapabilities);
        assert_eq!(event.outcome.label(), "Ok");
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[tokio::test]
async fn the_observer_sees_every_attempt_and_call() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::NodeGetCapabilities)
        .fail_times(2, Code::Aborted, "pending")
        .install();
    let counter = Arc::new(Counter::default());
    let client = csi_client::CsiClient::builder(mock.endpoint())
        .policies(crate::support::fast_policies())
        .observer(counter.clone())
        .build();
    guard(client.node().node_get_capabilities()).await.unwrap();
    assert_eq!(counter.attempts.load(Ordering::Relaxed), 3);
    assert_eq!(counter.failed_attempts.load(Ordering::Relaxed), 2);
    assert_eq!(counter.calls.load(Ordering::Relaxed), 1);
}

/// Each finished call, as an observer that shows calls would keep it.
#[derive(Debug, Default)]
struct Calls(std::sync::Mutex<Vec<CallEvent>>);

impl CallObserver for Calls {
    fn on_call(&self, event: &CallEvent) {
        self.0.lock().unwrap().push(event.clone());
    }
}

#[tokio::test]
async fn a_call_event_names_the_volume_of_its_request() {
    let mock = Mock::default().await;
    mock.faults()
        .on(Rpc::DeleteSnapshot)
        .fail(Code::FailedPrecondition, "in use")
        .install();
    let calls = Arc::new(Calls::default());
    let client = csi_client::CsiClient::builder(mock.endpoint())
        .observer(calls.clone())
        .build();
    let volume = ExternalVolumeId::new("vol-named").unwrap();
    guard(client.controller().delete(&volume, &Secrets::default()))
        .await
        .unwrap();
    guard(client.node().node_get_capabilities()).await.unwrap();
    let snapshot = csi_structs::SnapshotId::new("snap-1").unwrap();
    let failed = guard(
        client
            .controller()
            .delete_snapshot(&snapshot, &Secrets::default()),
    )
    .await;
    assert!(failed.is_err());
    let seen: Vec<(Rpc, Option<String>, &str)> = calls
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c.rpc,
                c.volume.as_ref().map(|v| v.to_string()),
                c.outcome.label(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (Rpc::DeleteVolume, Some("vol-named".to_owned()), "Ok"),
            (Rpc::NodeGetCapabilities, None, "Ok"),
            (Rpc::DeleteSnapshot, None, "FailedPrecondition"),
        ]
    );
}

#[tokio::test]
async fn create_volume_returns_the_domain_volume() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let req = proto::CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![(&VolumeCapability::block(AccessMode::SingleNodeWriter)).into()],
        capacity_range: Some(proto::CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let volume = guard(client.controller().create_volume(req.clone()))
        .await
        .unwrap();
    assert!(!volume.volume_id.as_str().is_empty());
    assert!(volume.capacity_bytes.is_some_and(|c| c >= 1 << 20));
    // Idempotent by name: the same volume again.
    let again = guard(client.controller().create_volume(req)).await.unwrap();
    assert_eq!(again.volume_id, volume.volume_id);
}

#[tokio::test]
async fn metadata_streams_are_read_to_their_clean_end() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let snapshot = guard(client.controller().create_snapshot(
        &vol1(),
        "snap-1",
        &Parameters::default(),
        &Secrets::default(),
    ))
    .await
    .unwrap();
    let mut stream = guard(client.snapshot_metadata().get_metadata_allocated(
        proto::GetMetadataAllocatedRequest {
            snapshot_id: snapshot.snapshot_id.as_str().to_owned(),
            starting_offset: 0,
            max_results: 4,
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    let mut last_offset = 0;
    while let Some(msg) = guard(stream.message()).await.unwrap() {
        for b in &msg.block_metadata {
            assert!(b.byte_offset >= last_offset);
            last_offset = b.byte_offset + b.size_bytes;
        }
    }
    assert!(last_offset > 0, "the stream delivered no block at all");
    assert_eq!(stream.resume_offset(), last_offset);
    assert!(guard(stream.message()).await.unwrap().is_none());
}

#[tokio::test]
async fn a_full_attach_cycle_with_domain_values() {
    use csi_structs::{PluginNodeId, PublishContext, VolumeContext};

    let mock = Mock::start(
        csi_testkit::MockPlugin::builder()
            .volume("vol-1", 1 << 30)
            .quirk(Quirk::NotFoundOnRepeatedUnpublish)
            .build()
            .unwrap(),
    )
    .await;
    let client = mock.client(|_| {});
    let (controller, node) = (client.controller(), client.node());
    let info = guard(node.node_get_info()).await.unwrap();
    let node_id: PluginNodeId = info.node_id;
    let volume = vol1();
    let cap = VolumeCapability::mount(
        AccessMode::SingleNodeWriter,
        MountOptions::new().with_fs_type("ext4"),
    );
    let secrets = Secrets::default();
    let context = VolumeContext::default();

    let publish_context: PublishContext =
        guard(controller.publish(&volume, &node_id, &cap, false, &context, &secrets))
            .await
            .unwrap();
    let (staging, target) = mock
        .stage_and_publish(&node, &volume, &cap, &publish_context)
        .await;
    assert_eq!(mock.plugin.published().len(), 1);

    guard(node.unpublish(&volume, &target)).await.unwrap();
    // The plugin answers NOT_FOUND to a repeated unpublish: already done.
    let again = guard(node.unpublish(&volume, &target)).await.unwrap_err();
    assert_eq!(again.class(), ErrorClass::AlreadyDone, "{again}");
    guard(node.unstage(&volume, &staging)).await.unwrap();
    guard(controller.unpublish(&volume, Some(&node_id), &secrets))
        .await
        .unwrap();
    assert!(mock.plugin.published_nodes("vol-1").is_empty());
}

/// Creates `pvc-0` to `pvc-5` (block, single-node writer) beside the mock's `vol-1`; answers
/// the ids of all seven.
async fn six_volumes_beside_vol1(
    controller: &csi_client::ControllerClient,
) -> std::collections::BTreeSet<String> {
    let mut created = std::collections::BTreeSet::from(["vol-1".to_owned()]);
    for i in 0..6 {
        let volume = guard(controller.create_volume(proto::CreateVolumeRequest {
            name: format!("pvc-{i}"),
            volume_capabilities: vec![
                (&VolumeCapability::block(AccessMode::SingleNodeWriter)).into(),
            ],
            ..Default::default()
        }))
        .await
        .unwrap();
        created.insert(volume.volume_id.as_str().to_owned());
    }
    created
}

#[tokio::test]
async fn list_all_volumes_follows_every_page_of_the_mock() {
    let mock = Mock::default().await;
    let client = mock.client(|_| {});
    let created = six_volumes_beside_vol1(&client.controller()).await;
    let entries = guard(
        client
            .controller()
            .list_all_volumes(proto::ListVolumesRequest {
                max_entries: 2,
                starting_token: String::new(),
            }),
    )
    .await
    .unwrap();
    let listed: Vec<String> = entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect();
    assert_eq!(listed.len(), 7, "{listed:?}");
    assert_eq!(
        listed
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>(),
        created
    );
    // Four pages of at most two entries each.
    assert_eq!(mock.count(Rpc::ListVolumes), 4);
}

#[tokio::test]
async fn list_all_volumes_with_status_follows_every_page_with_nodes_and_conditions() {
    use csi_structs::{PluginNodeId, PublishContext, VolumeCondition, VolumeContext};

    let mock = Mock::start(
        csi_testkit::MockPlugin::builder()
            .volume("vol-1", 1 << 30)
            .volume_condition()
            .build()
            .unwrap(),
    )
    .await;
    let client = mock.client(|_| {});
    let controller = client.controller();
    let created = six_volumes_beside_vol1(&controller).await;
    let node = PluginNodeId::new("node-1").unwrap();
    let _: PublishContext = guard(controller.publish(
        &vol1(),
        &node,
        &VolumeCapability::block(AccessMode::SingleNodeWriter),
        false,
        &VolumeContext::default(),
        &Secrets::default(),
    ))
    .await
    .unwrap();
    let sick = created.iter().find(|id| *id != "vol-1").unwrap().clone();
    mock.plugin
        .set_volume_condition(&sick, true, "disk detached");

    let volumes = guard(controller.list_all_volumes_with_status(2))
        .await
        .unwrap();
    // Four pages of at most two entries each.
    assert_eq!(mock.count(Rpc::ListVolumes), 4);
    let listed: std::collections::BTreeSet<String> = volumes
        .iter()
        .map(|v| v.volume.volume_id.as_str().to_owned())
        .collect();
    assert_eq!((volumes.len(), listed), (7, created));
    for v in &volumes {
        let id = v.volume.volume_id.as_str();
        let nodes: Vec<&str> = v
            .status
            .published_nodes
            .iter()
            .map(|n| n.as_str())
            .collect();
        let expected_nodes: &[&str] = if id == "vol-1" { &["node-1"] } else { &[] };
        assert_eq!(nodes, expected_nodes, "{id}");
        let expected = if id == sick {
            VolumeCondition {
                abnormal: true,
                message: "disk detached".into(),
            }
        } else {
            VolumeCondition {
                abnormal: false,
                message: String::new(),
            }
        };
        assert_eq!(v.status.condition.as_ref(), Some(&expected), "{id}");
    }
    let vol_1 = volumes
        .iter()
        .find(|v| v.volume.volume_id == vol1())
        .unwrap();
    assert_eq!(vol_1.volume.capacity_bytes, Some(1 << 30));
}

#[tokio::test]
async fn list_all_volumes_with_status_takes_an_entry_without_status_as_empty() {
    use csi_testkit::ControllerCapability;
    use csi_testkit::capabilities::CONTROLLER_IMPLEMENTED;

    // Neither LIST_VOLUMES_PUBLISHED_NODES nor VOLUME_CONDITION: the entries carry no status.
    let mock = Mock::start(
        csi_testkit::MockPlugin::builder()
            .volume("vol-1", 1 << 30)
            .controller_capabilities(
                CONTROLLER_IMPLEMENTED
                    .iter()
                    .copied()
                    .filter(|c| *c != ControllerCapability::ListVolumesPublishedNodes),
            )
            .build()
            .unwrap(),
    )
    .await;
    let client = mock.client(|_| {});
    let raw = guard(
        client
            .controller()
            .list_all_volumes(proto::ListVolumesRequest::default()),
    )
    .await
    .unwrap();
    assert!(raw.iter().all(|e| e.status.is_none()), "{raw:?}");
    let volumes = guard(client.controller().list_all_volumes_with_status(0))
        .await
        .unwrap();
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].volume.volume_id, vol1());
    assert_eq!(volumes[0].status, csi_structs::VolumeStatus::default());
}

#[tokio::test]
async fn a_node_path_that_is_not_utf8_is_refused_before_it_is_sent() {
    use std::os::unix::ffi::OsStrExt;
    let mock = Mock::start(csi_testkit::MockPlugin::builder().build().unwrap()).await;
    let client = mock.client(|_| {});
    let node = client.node();
    let volume = vol1();
    let bad = std::path::Path::new(std::ffi::OsStr::from_bytes(b"/target/\xff"));
    let err = guard(node.unpublish(&volume, bad)).await.unwrap_err();
    assert!(
        matches!(err.kind(), csi_client::ErrorKind::InvalidRequest(_)),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("target_path") && text.contains("UTF-8"),
        "{text}"
    );
    assert_eq!(
        mock.count(csi_client::Rpc::NodeUnpublishVolume),
        0,
        "nothing was sent"
    );
}
