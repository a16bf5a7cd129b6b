//! The volume service against csi-testkit's mock plugin, through a real csi-rpc-shim `Shim`
//! whose local backend is csi-node's `NodeBackend`: one node, no peers.

mod support;

use std::sync::Arc;
use std::time::Duration;

use csi_claims::driver::DriverError;
use csi_claims::{ClaimError, ClaimMode, ClaimRequest, DenyReason};
use csi_client::{Code, Rpc};
use csi_control::service::{
    CallFailure, DetachVolume, NewSnapshot, NewVolumeSource, RegisterVolume, SnapshotsOf,
};
use csi_control::{ServiceError, ServiceEvent, VolumeService};
use csi_node::volumes::ReconcileAction;
use csi_structs::{
    AccessMode, AccessTypeKind, ErrorClass, ExternalVolumeId, NodeId, Parameters, PluginId,
    PluginNodeId, Topology, VolumeContext, VolumeSecrets,
};
use csi_testkit::capabilities::{CONTROLLER_IMPLEMENTED, NODE_IMPLEMENTED};
use csi_testkit::{
    ControllerCapability, MockPlugin, NodeCapability, Quirk, RecordedOutcome, VolumeExpansion,
};
use support::{Harness, me, volume_id, workload, write_claim};

const GIB: u64 = 1 << 30;

fn register_request(h: &Harness, id: &str, external: &str) -> RegisterVolume {
    RegisterVolume {
        id: volume_id(id),
        external_id: ExternalVolumeId::new(external).expect("external id"),
        plugin: h.plugin.clone(),
        access_mode: AccessMode::SingleNodeWriter,
        attachment: AccessTypeKind::Mount,
        controller_publish: None,
        context: VolumeContext::new(),
        secrets: VolumeSecrets::default(),
        accessible_topology: Vec::new(),
    }
}

fn zone(value: &str) -> Topology {
    Topology::try_from_iter([("zone", value)]).expect("topology")
}

/// The field of an `Invalid`, and its reason; panics on anything else.
fn invalid(err: ServiceError) -> (&'static str, String) {
    match err {
        ServiceError::Invalid { field, reason } => (field, reason),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

/// The message of a `Conflict`; panics on anything else.
fn conflict(err: ServiceError) -> String {
    match err {
        ServiceError::Conflict(message) => message,
        other => panic!("expected Conflict, got {other:?}"),
    }
}

// ---- register ---------------------------------------------------------------------------------

#[tokio::test]
async fn register_validates_with_the_fingerprinted_controller_and_refuses_a_taken_id() {
    let mut h = Harness::with(MockPlugin::builder().volume("pre-1", GIB as i64)).await;
    let id = volume_id("data");

    let entry = h
        .service
        .register_volume(register_request(&h, "data", "pre-1"))
        .await
        .expect("registered");
    assert!(!entry.created);
    assert!(
        entry.controller_publish,
        "taken from the fingerprint: the mock advertises PUBLISH_UNPUBLISH_VOLUME"
    );
    let validated = h
        .mock
        .calls()
        .of(Rpc::ValidateVolumeCapabilities)
        .into_records();
    assert_eq!(validated.len(), 1, "{validated:?}");
    assert_eq!(validated[0].volume_id.as_deref(), Some("pre-1"));
    assert_eq!(h.entry(&id), Some(entry));
    assert_eq!(
        h.events(),
        vec![ServiceEvent::VolumeRegistered {
            volume: id.clone(),
            plugin: h.plugin.clone(),
            created: false,
        }]
    );

    // The same id again: a conflict, before any plugin call.
    let err = h
        .service
        .register_volume(register_request(&h, "data", "pre-1"))
        .await
        .expect_err("the id is taken");
    assert!(conflict(err).contains("data"));
    assert_eq!(h.mock.calls().count(Rpc::ValidateVolumeCapabilities), 1);
    assert!(h.events().is_empty());
}

#[tokio::test]
async fn register_for_a_plugin_with_no_known_controller_needs_controller_publish() {
    let mut h = Harness::start().await;
    let mut request = register_request(&h, "elsewhere", "vol-x");
    request.plugin = PluginId::new("absent").expect("id");

    let (field, reason) = invalid(
        h.service
            .register_volume(request.clone())
            .await
            .expect_err("unknown whether it needs controller publish"),
    );
    assert_eq!(field, "controller_publish");
    assert!(reason.contains("absent"), "{reason}");
    assert!(h.entry(&volume_id("elsewhere")).is_none());

    // Said explicitly, it is registered as it is: no controller to validate with.
    request.controller_publish = Some(false);
    let entry = h
        .service
        .register_volume(request)
        .await
        .expect("registered");
    assert!(!entry.controller_publish);
    assert_eq!(h.mock.calls().count(Rpc::ValidateVolumeCapabilities), 0);
    assert!(matches!(
        h.events().as_slice(),
        [ServiceEvent::VolumeRegistered { created: false, .. }]
    ));
}

#[tokio::test]
async fn register_of_a_volume_the_plugin_does_not_confirm_is_refused() {
    // The plugin confirms another access mode than the one asked for.
    let h = Harness::with(
        MockPlugin::builder()
            .volume("pre-1", GIB as i64)
            .quirk(Quirk::ConfirmDifferentCapability),
    )
    .await;
    let (field, reason) = invalid(
        h.service
            .register_volume(register_request(&h, "data", "pre-1"))
            .await
            .expect_err("not confirmed"),
    );
    assert_eq!(field, "access_mode");
    assert!(reason.contains("does not confirm"), "{reason}");
    assert_eq!(h.mock.calls().count(Rpc::ValidateVolumeCapabilities), 1);
    assert!(h.entry(&volume_id("data")).is_none());
}

// ---- create -----------------------------------------------------------------------------------

#[tokio::test]
async fn create_makes_the_volume_in_the_plugin_and_records_it() {
    let mut h = Harness::start().await;
    let id = volume_id("data");
    let entry = h
        .service
        .create(h.new_volume("data", 2 * GIB))
        .await
        .expect("created");

    let volumes = h.mock.volumes();
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].volume_id, entry.external_id.as_str());
    assert_eq!(volumes[0].capacity_bytes, (2 * GIB) as i64);
    assert!(entry.created);
    assert_eq!(entry.capacity_bytes, Some(2 * GIB));
    assert!(entry.controller_publish);
    assert!(entry.may_exist.is_none());
    assert_eq!(h.entry(&id), Some(entry.clone()));
    let create = h.mock.calls().last(Rpc::CreateVolume).expect("called");
    assert!(
        create.request.contains("\"data\""),
        "named by the id: {create:?}"
    );
    assert_eq!(
        h.events(),
        vec![ServiceEvent::VolumeRegistered {
            volume: id,
            plugin: h.plugin.clone(),
            created: true,
        }]
    );

    // A taken id is a conflict, and the plugin is not called again.
    let err = h
        .service
        .create(h.new_volume("data", GIB))
        .await
        .expect_err("taken");
    conflict(err);
    assert_eq!(h.mock.calls().count(Rpc::CreateVolume), 1);
    assert_eq!(h.mock.volumes().len(), 1);
}

#[tokio::test]
async fn create_takes_the_plugin_s_default_size_and_refuses_one_over_the_wire_s_limit() {
    let h = Harness::with(MockPlugin::builder().default_volume_size(3 * GIB as i64)).await;
    let (field, _) = invalid(
        h.service
            .create(h.new_volume("huge", u64::MAX))
            .await
            .expect_err("over i64::MAX"),
    );
    assert_eq!(field, "capacity_bytes");
    assert_eq!(h.mock.calls().count(Rpc::CreateVolume), 0);
    assert!(h.entry(&volume_id("huge")).is_none());

    // 0: no capacity range; the plugin's default size is recorded.
    let entry = h
        .service
        .create(h.new_volume("data", 0))
        .await
        .expect("created");
    assert_eq!(entry.capacity_bytes, Some(3 * GIB));
    let create = h.mock.calls().last(Rpc::CreateVolume).expect("called");
    assert!(
        create.request.contains("capacity_range: None"),
        "{create:?}"
    );
}

/// A plugin name no node knows is the caller's mistake, refused before any call naming the
/// field and the plugins that are known, never a retryable "no instance is registered".
#[tokio::test]
async fn create_for_a_plugin_no_node_knows_names_the_known_plugins() {
    let h = Harness::start().await;
    let mut request = h.new_volume("data", GIB);
    request.plugin = PluginId::new("mokc").expect("id");
    let error = h.service.create(request).await.expect_err("a typo");
    assert_eq!(error.class(), None, "not retryable: {error}");
    let (field, reason) = invalid(error);
    assert_eq!(field, "plugin");
    assert!(reason.contains("no plugin mokc"), "{reason}");
    assert!(reason.contains("known plugins: mock"), "{reason}");
    assert_eq!(h.mock.calls().count(Rpc::CreateVolume), 0);
    assert!(h.entry(&volume_id("data")).is_none());
}

#[tokio::test]
async fn create_with_topology_for_a_plugin_without_accessibility_constraints_is_invalid() {
    let h = Harness::start().await;
    let mut request = h.new_volume("data", GIB);
    request.requisite_topology = vec![zone("a")];
    let (field, reason) = invalid(
        h.service
            .create(request)
            .await
            .expect_err("the mock takes no topology"),
    );
    assert_eq!(field, "requisite_topology");
    assert!(
        reason.contains("VOLUME_ACCESSIBILITY_CONSTRAINTS"),
        "{reason}"
    );
    assert_eq!(
        h.mock.calls().count(Rpc::CreateVolume),
        0,
        "refused before any call"
    );
    assert!(h.mock.volumes().is_empty());
    assert!(h.entry(&volume_id("data")).is_none());
}

#[tokio::test]
async fn create_with_topology_records_where_the_volume_is_reachable() {
    let h = Harness::with(MockPlugin::builder().topology("zone", "a")).await;
    let mut request = h.new_volume("data", GIB);
    request.requisite_topology = vec![zone("a")];
    let entry = h.service.create(request).await.expect("created");
    assert_eq!(entry.accessible_topology, vec![zone("a")]);
    let create = h.mock.calls().last(Rpc::CreateVolume).expect("called");
    assert!(
        create.request.contains("accessibility_requirements: Some"),
        "{create:?}"
    );
    // Reachable here: claimed and published.
    h.claim("data", "web-1").await;
    assert_eq!(h.mock.published().len(), 1);
}

#[tokio::test]
async fn a_volume_reachable_only_elsewhere_is_not_claimed_here() {
    let h = Harness::with(
        MockPlugin::builder()
            .topology("zone", "a")
            .quirk(Quirk::VolumesElsewhere),
    )
    .await;
    let entry = h.create("data").await;
    assert!(!entry.accessible_topology.is_empty());
    let err = h
        .service
        .claim(write_claim("data", "web-1"))
        .await
        .expect_err("the node is outside the volume's topology");
    conflict(err);
    assert!(
        h.service
            .volume(&volume_id("data"))
            .expect("known")
            .claims
            .is_empty(),
        "refused before the claim"
    );
    assert_eq!(h.mock.calls().count(Rpc::ControllerPublishVolume), 0);
    assert_eq!(h.mock.calls().count(Rpc::NodeStageVolume), 0);
}

// ---- create with an uncertain outcome ---------------------------------------------------------

#[tokio::test]
async fn an_uncertain_create_is_undone_before_the_answer() {
    let mut h = Harness::start().await;
    // INTERNAL on CreateVolume: the outcome is uncertain, and the client does not retry it.
    h.mock
        .faults()
        .on(Rpc::CreateVolume)
        .fail(Code::Internal, "backend lost the answer");

    let err = h
        .service
        .create(h.new_volume("data", GIB))
        .await
        .expect_err("uncertain, undone");
    let ServiceError::Call {
        step,
        class,
        failure,
        detail,
    } = err
    else {
        panic!("expected a call error, got {err:?}");
    };
    assert_eq!(step, "CreateVolume");
    assert_eq!(class, ErrorClass::Retry, "undone: creating again is safe");
    assert_eq!(failure, CallFailure::Status);
    assert!(detail.contains("undone"), "{detail}");

    // The undo: CreateVolume again by name, then DeleteVolume of the id it gave.
    let calls = h.mock.calls().snapshot().without_discovery();
    assert_eq!(
        calls.runs(),
        vec![(Rpc::CreateVolume, 2), (Rpc::DeleteVolume, 1)],
        "{calls:?}"
    );
    assert!(h.mock.volumes().is_empty(), "{:?}", h.mock.volumes());
    assert!(h.entry(&volume_id("data")).is_none());
    let events = h.events();
    assert!(
        matches!(
            events.as_slice(),
            [ServiceEvent::CreateUndone { volume, plugin, .. }]
                if volume == &volume_id("data") && plugin == &h.plugin
        ),
        "{events:?}"
    );

    // Creating again is safe and works.
    let entry = h.create("data").await;
    assert_eq!(h.mock_volumes(), vec![entry.external_id.to_string()]);
}

/// CreateVolume fails uncertainly, and so does the undo's CreateVolume by name (a fatal
/// answer ends the undo at once): the catalog keeps that a volume may exist.
async fn may_exist(h: &mut Harness, id: &str) {
    h.mock
        .faults()
        .on(Rpc::CreateVolume)
        .fail(Code::Internal, "backend lost the answer")
        .fail(Code::InvalidArgument, "backend confused");
    let err = h
        .service
        .create(h.new_volume(id, GIB))
        .await
        .expect_err("uncertain, not undone");
    let ServiceError::Call { class, detail, .. } = &err else {
        panic!("expected a call error, got {err:?}");
    };
    assert_eq!(*class, ErrorClass::Uncertain, "{err}");
    assert!(detail.contains("may be left behind"), "{detail}");
    assert!(detail.contains("kept in the volume book"), "{detail}");
    let entry = h.entry(&volume_id(id)).expect("kept");
    let may = entry.may_exist.expect("marked as may exist");
    assert!(!may.why.is_empty());
    assert_eq!(h.mock.calls().count(Rpc::DeleteVolume), 0);
    let events = h.events();
    assert!(
        matches!(events.as_slice(), [ServiceEvent::MayExist { volume, .. }] if volume == &volume_id(id)),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_volume_that_may_exist_admits_nothing_until_deregistered() {
    let mut h = Harness::start().await;
    may_exist(&mut h, "data").await;
    let id = volume_id("data");

    let message = conflict(
        h.service
            .claim(write_claim("data", "web-1"))
            .await
            .expect_err("not created"),
    );
    assert!(message.contains("may exist"), "{message}");
    conflict(
        h.service
            .expand(&id, 2 * GIB)
            .await
            .expect_err("not created"),
    );
    conflict(h.service.delete(&id).await.expect_err("not created"));
    assert_eq!(h.mock.calls().count(Rpc::NodeStageVolume), 0);
    assert!(h.entry(&id).is_some());

    // Deregistering clears it, saying what may be left in the plugin.
    let gone = h
        .service
        .deregister_volume(&id, false, false)
        .await
        .expect("deregistered");
    assert_eq!(gone.dropped_claims, 0);
    assert!(
        gone.left_behind
            .iter()
            .any(|l| l.to_string().contains("may exist")),
        "{:?}",
        gone.left_behind
    );
    assert!(h.entry(&id).is_none());
    assert_eq!(
        h.mock.calls().count(Rpc::DeleteVolume),
        0,
        "plugin not called"
    );
}

#[tokio::test]
async fn a_create_of_a_volume_that_may_exist_resolves_it_first() {
    let mut h = Harness::start().await;
    may_exist(&mut h, "data").await;
    let creates = h.mock.calls().count(Rpc::CreateVolume);

    // The faults are used up: the create finds the volume by name, deletes it, then creates.
    let entry = h.create("data").await;
    assert!(entry.may_exist.is_none());
    assert!(entry.created);
    assert_eq!(h.entry(&volume_id("data")), Some(entry.clone()));
    assert_eq!(h.mock.calls().count(Rpc::CreateVolume), creates + 2);
    assert_eq!(h.mock.calls().count(Rpc::DeleteVolume), 1);
    assert_eq!(h.mock_volumes(), vec![entry.external_id.to_string()]);
    let events = h.events();
    assert!(
        matches!(
            events.as_slice(),
            [
                ServiceEvent::CreateUndone { .. },
                ServiceEvent::VolumeRegistered { created: true, .. }
            ]
        ),
        "{events:?}"
    );
}

// ---- claim ------------------------------------------------------------------------------------

#[tokio::test]
async fn a_claim_publishes_the_volume_here_through_the_controller() {
    let mut h = Harness::start().await;
    let entry = h.create("data").await;
    h.events();

    let claimed = h.claim("data", "web-1").await;
    assert!(claimed.target_path.exists(), "{:?}", claimed.target_path);
    assert_eq!(claimed.claim.workload(), &workload("web-1"));
    assert_eq!(claimed.claim.node(), &me());
    assert_eq!(h.mock.calls().count(Rpc::ControllerPublishVolume), 1);
    assert_eq!(
        h.mock.published_nodes(entry.external_id.as_str()),
        vec!["node-1".to_owned()]
    );
    let published = h.mock.published();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].volume_id, entry.external_id.as_str());
    assert_eq!(published[0].path, claimed.target_path);
    assert_eq!(h.mock.staged().len(), 1);

    let state = h.service.volume(&volume_id("data")).expect("known");
    assert_eq!(state.claims.len(), 1);
    assert_eq!(state.to_string(), "volume data (plugin mock): 1 claim(s)");
    assert_eq!(state.claims[0].1.as_ref(), Some(&claimed.target_path));
    assert_eq!(
        h.events(),
        vec![ServiceEvent::Claimed {
            volume: volume_id("data"),
            workload: workload("web-1"),
            target_path: claimed.target_path.clone(),
        }]
    );
}

/// Creates `id`, a multi-node multi-writer mount volume (a writer and a reader on one node).
async fn create_shared(h: &Harness, id: &str) -> csi_control::CatalogEntry {
    let mut request = h.new_volume(id, GIB);
    request.access_mode = AccessMode::MultiNodeMultiWriter;
    h.service.create(request).await.expect("created")
}

fn read_claim(volume: &str, workload_id: &str) -> csi_control::service::ClaimVolume {
    csi_control::service::ClaimVolume {
        mode: ClaimMode::Read,
        ..write_claim(volume, workload_id)
    }
}

#[tokio::test]
async fn a_writer_and_a_reader_on_one_node_share_one_controller_publish() {
    let h = Harness::start().await;
    let entry = create_shared(&h, "data").await;

    let writer = h.claim("data", "writer").await;
    let reader = h
        .service
        .claim(read_claim("data", "reader"))
        .await
        .expect("the reader claims the volume attached for the writer");
    assert_eq!(
        h.mock.calls().count(Rpc::ControllerPublishVolume),
        1,
        "one ControllerPublishVolume per volume and node"
    );
    // Both publications got the publish_context of that one call (the mock refuses a node
    // call with any other), and the volume was staged once.
    assert_eq!(h.mock.published().len(), 2);
    assert_eq!(h.mock.staged().len(), 1);
    assert!(writer.target_path.exists() && reader.target_path.exists());

    // Released one after the other: only the last claim on the node detaches the volume.
    h.release_and_wait("data", "writer").await;
    assert_eq!(h.mock.calls().count(Rpc::ControllerUnpublishVolume), 0);
    assert_eq!(
        h.mock.published_nodes(entry.external_id.as_str()),
        vec!["node-1".to_owned()],
        "still attached for the reader"
    );
    h.release_and_wait("data", "reader").await;
    assert_eq!(h.mock.calls().count(Rpc::ControllerUnpublishVolume), 1);
    assert!(
        h.mock
            .published_nodes(entry.external_id.as_str())
            .is_empty()
    );
    assert!(h.mock.published().is_empty() && h.mock.staged().is_empty());
}

#[tokio::test]
async fn concurrent_claims_of_one_volume_on_one_node_send_one_controller_publish() {
    let h = Harness::start().await;
    create_shared(&h, "data").await;
    // The first ControllerPublishVolume takes a while, so the second claim comes while it
    // is in flight (a hang guard of the ordering, not a timing asserted).
    h.mock
        .faults()
        .on(Rpc::ControllerPublishVolume)
        .then_delay(Duration::from_millis(300));

    let (writer, reader) = tokio::join!(
        h.service.claim(write_claim("data", "writer")),
        h.service.claim(read_claim("data", "reader")),
    );
    writer.expect("the writer's claim");
    reader.expect("the reader's claim");
    assert_eq!(h.mock.calls().count(Rpc::ControllerPublishVolume), 1);
    assert_eq!(h.mock.published().len(), 2);

    h.release_and_wait("data", "writer").await;
    h.release_and_wait("data", "reader").await;
    assert_eq!(h.mock.calls().count(Rpc::ControllerUnpublishVolume), 1);
}

#[tokio::test]
async fn after_a_restart_a_claim_reuses_the_recorded_publish_context() {
    let h = Harness::start().await;
    let entry = create_shared(&h, "data").await;
    h.claim("data", "writer").await;
    assert_eq!(h.mock.calls().count(Rpc::ControllerPublishVolume), 1);

    let h = h.restart().await;
    let context = h
        .service
        .volumes()
        .publish_context(&h.plugin, &volume_id("data"))
        .expect("the usage record kept the publish_context");
    assert!(!context.is_empty(), "the mock returns a device path");
    h.service
        .claim(read_claim("data", "reader"))
        .await
        .expect("the reader claims the volume attached before the restart");
    assert_eq!(
        h.mock.calls().count(Rpc::ControllerPublishVolume),
        1,
        "the attachment from before the restart was reused"
    );
    assert_eq!(h.mock.published().len(), 2);

    h.release_and_wait("data", "writer").await;
    h.release_and_wait("data", "reader").await;
    assert_eq!(h.mock.calls().count(Rpc::ControllerUnpublishVolume), 1);
    assert!(
        h.mock
            .published_nodes(entry.external_id.as_str())
            .is_empty()
    );
}

#[tokio::test]
async fn a_workload_that_releases_and_claims_again_at_once_gets_its_claim_once_released() {
    let mut h = Harness::start().await;
    let id = volume_id("data");
    h.create("data").await;
    h.claim("data", "web-1").await;
    // The release's first step takes a while, so the claim comes while it runs.
    h.mock
        .faults()
        .on(Rpc::NodeUnpublishVolume)
        .then_delay(Duration::from_secs(1));
    h.events();

    h.service
        .release(&id, &workload("web-1"))
        .await
        .expect("release durable");
    let state = h.service.volume(&id).expect("known");
    assert!(
        state.claims.iter().any(|(c, _)| c.state().is_releasing()),
        "the release runs: {:?}",
        state.claims
    );
    // Before, this was refused (the workload's earlier claim is being released) and the
    // workload had to ask again until the release was done.
    let again = h
        .service
        .claim(write_claim("data", "web-1"))
        .await
        .expect("claimed once the earlier claim is freed, without a refusal");
    assert_eq!(again.claim.state(), &csi_claims::ClaimState::Taken);

    // The whole release ran before the new claim's publish.
    let calls = h.mock.calls().snapshot().into_records();
    let last = |rpc: Rpc| calls.iter().rposition(|c| c.rpc == rpc).expect("called");
    assert!(
        last(Rpc::ControllerUnpublishVolume) < last(Rpc::ControllerPublishVolume),
        "detached, then attached again"
    );
    assert_eq!(h.mock.calls().count(Rpc::ControllerPublishVolume), 2);
    assert_eq!(h.mock.published().len(), 1);
    let events = h.events();
    assert!(
        matches!(events.as_slice(), [ServiceEvent::Claimed { .. }]),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_claim_that_waits_for_a_release_past_its_deadline_is_refused_naming_the_wait() {
    let h = Harness::start().await;
    let id = volume_id("data");
    h.create("data").await;
    h.claim("data", "web-1").await;
    // The release's node step keeps failing: the release backs off and tries again.
    h.mock
        .faults()
        .on(Rpc::NodeUnpublishVolume)
        .forever(csi_testkit::FaultStep::Fail {
            code: Code::Unavailable,
            message: "node plugin busy".into(),
        });
    h.service
        .release(&id, &workload("web-1"))
        .await
        .expect("release durable");

    // Another workload of this single-node-writer volume: it waits for web-1's release.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
    let refused = h
        .service
        .claim_until(write_claim("data", "web-2"), deadline)
        .await
        .expect_err("web-1 is still releasing at the deadline");
    let ServiceError::Claims(DriverError::WaitedForRelease { waited_for, .. }) = &refused else {
        panic!("{refused:?}");
    };
    let waited: Vec<&str> = waited_for.iter().map(|c| c.workload().as_str()).collect();
    assert_eq!(waited, ["web-1"]);
    assert_eq!(refused.class(), Some(ErrorClass::Retry));
    let text = refused.to_string();
    assert!(
        text.contains("single workload")
            && text.contains("workload web-2 on volume data waited")
            && text.contains("release of workload web-1"),
        "{text}"
    );
    assert_eq!(h.mock.calls().count(Rpc::ControllerPublishVolume), 1);

    // Once the release can finish, the claim is admitted.
    h.mock.faults().clear();
    h.service
        .claim(write_claim("data", "web-2"))
        .await
        .expect("admitted once web-1 is freed");
}

/// A claim the access mode does not admit is `ServiceError::Denied`, matched in one arm: the
/// reason, the holders and the class, the same words as the claim layer's, and no call made.
#[tokio::test]
async fn a_second_workload_on_a_single_node_writer_volume_is_denied_in_one_arm() {
    let h = Harness::start().await;
    h.create("data").await;
    h.claim("data", "web-1").await;
    let publishes = h.mock.calls().count(Rpc::NodePublishVolume);

    let answer = h.service.claim(write_claim("data", "web-2")).await;
    assert!(
        matches!(&answer, Err(ServiceError::Denied(d)) if d.reason == DenyReason::SingleWorkload),
        "{answer:?}"
    );
    let refused = answer.expect_err("denied");
    let ServiceError::Denied(denied) = &refused else {
        unreachable!()
    };
    assert_eq!(denied.workload, workload("web-2"));
    assert_eq!(denied.holders.0.len(), 1);
    assert_eq!(denied.holders.0[0].workload, workload("web-1"));
    assert_eq!(refused.class(), Some(ErrorClass::Retry));
    // The same words as the claim layer's error it came as.
    let as_driver = DriverError::Claim(ClaimError::Denied(denied.clone()));
    assert_eq!(refused.to_string(), as_driver.to_string());
    assert_eq!(h.mock.calls().count(Rpc::NodePublishVolume), publishes);
}

#[tokio::test]
async fn a_claim_past_the_plugin_s_attach_limit_is_refused_before_any_call() {
    let h = Harness::with(MockPlugin::builder().max_volumes_per_node(2)).await;
    for id in ["a", "b", "c"] {
        h.create(id).await;
    }
    h.claim("a", "web-1").await;
    h.claim("b", "web-2").await;
    let publishes = h.mock.calls().count(Rpc::ControllerPublishVolume);
    let stages = h.mock.calls().count(Rpc::NodeStageVolume);

    let refused = h
        .service
        .claim(write_claim("c", "web-3"))
        .await
        .expect_err("a third volume on the node");
    let ServiceError::Claims(DriverError::Claim(ClaimError::AttachLimit {
        plugin,
        node,
        limit,
        count,
        ..
    })) = &refused
    else {
        panic!("{refused:?}");
    };
    assert_eq!((plugin, node, *limit, *count), (&h.plugin, &me(), 2, 2));
    assert_eq!(refused.class(), Some(ErrorClass::RetryElsewhere));
    let text = refused.to_string();
    assert!(
        text.contains("plugin mock") && text.contains("node n1"),
        "{text}"
    );
    // Nothing was recorded or called for it.
    assert!(
        h.service
            .volume(&volume_id("c"))
            .expect("known")
            .claims
            .is_empty()
    );
    assert_eq!(
        h.mock.calls().count(Rpc::ControllerPublishVolume),
        publishes
    );
    assert_eq!(h.mock.calls().count(Rpc::NodeStageVolume), stages);

    // Once a volume is released (and detached), the node takes the third.
    h.release_and_wait("a", "web-1").await;
    h.claim("c", "web-3").await;
}

#[tokio::test]
async fn a_claim_of_an_unknown_volume_or_one_being_deleted_is_refused() {
    let h = Harness::start().await;
    let err = h
        .service
        .claim(write_claim("nope", "web-1"))
        .await
        .expect_err("no such volume");
    assert!(
        matches!(&err, ServiceError::NotFound { what: "volume", id } if id == "nope"),
        "{err:?}"
    );

    // A delete whose DeleteVolume fails leaves the volume marked as being deleted.
    let entry = h.create("data").await;
    h.mock
        .faults()
        .on(Rpc::DeleteVolume)
        .fail(Code::FailedPrecondition, "busy");
    let err = h
        .service
        .delete(&volume_id("data"))
        .await
        .expect_err("DeleteVolume failed");
    assert!(
        matches!(
            err,
            ServiceError::Call {
                step: "DeleteVolume",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(h.entry(&volume_id("data")).expect("kept").deleting);

    let message = conflict(
        h.service
            .claim(write_claim("data", "web-1"))
            .await
            .expect_err("being deleted"),
    );
    assert!(message.contains("being deleted"), "{message}");
    assert!(
        h.service
            .volume(&volume_id("data"))
            .expect("known")
            .claims
            .is_empty()
    );
    assert_eq!(h.mock.calls().count(Rpc::ControllerPublishVolume), 0);

    // A delete again finishes it.
    h.service
        .delete(&volume_id("data"))
        .await
        .expect("deleted the second time");
    assert!(h.entry(&volume_id("data")).is_none());
    assert!(!h.mock_volumes().contains(&entry.external_id.to_string()));
}

#[tokio::test]
async fn a_claim_whose_stage_fails_is_released_before_the_answer() {
    let mut h = Harness::start().await;
    let entry = h.create("data").await;
    h.events();
    h.mock
        .faults()
        .on(Rpc::NodeStageVolume)
        .fail(Code::FailedPrecondition, "device not ready");

    let err = h
        .service
        .claim(write_claim("data", "web-1"))
        .await
        .expect_err("NodeStageVolume failed");
    let ServiceError::Call { detail, .. } = &err else {
        panic!("expected a call error, got {err:?}");
    };
    assert!(detail.contains("the claim is released"), "{detail}");
    assert_eq!(h.mock.calls().count(Rpc::NodeStageVolume), 1);
    // The controller publish before the failed stage was undone by the release.
    assert_eq!(h.mock.calls().count(Rpc::ControllerPublishVolume), 1);
    assert!(
        h.mock
            .published_nodes(entry.external_id.as_str())
            .is_empty(),
        "ControllerUnpublishVolume ran"
    );
    assert!(h.mock.published().is_empty() && h.mock.staged().is_empty());
    let state = h.service.volume(&volume_id("data")).expect("known");
    assert!(state.claims.is_empty(), "{:?}", state.claims);
    let events = h.events();
    assert_eq!(
        events,
        vec![ServiceEvent::PublishFailed {
            volume: volume_id("data"),
            workload: workload("web-1"),
            undone: true,
        }]
    );

    // The volume is claimable again.
    h.claim("data", "web-1").await;
    assert_eq!(h.mock.published().len(), 1);
}

// ---- expand -----------------------------------------------------------------------------------

#[tokio::test]
async fn expand_grows_the_volume_and_refuses_to_shrink_it() {
    let mut h = Harness::start().await;
    let id = volume_id("data");
    h.create("data").await;
    h.events();

    let expanded = h.service.expand(&id, 2 * GIB).await.expect("expanded");
    assert_eq!(expanded.capacity_bytes, 2 * GIB);
    assert!(expanded.controller_expanded);
    assert!(expanded.nodes_expanded.is_empty(), "published nowhere");
    assert!(
        expanded.node_expansion_pending,
        "the mock asks for a node expansion"
    );
    let entry = h.entry(&id).expect("known");
    assert_eq!(entry.capacity_bytes, Some(2 * GIB));
    assert_eq!(entry.node_expansion, Some(2 * GIB));
    assert_eq!(h.mock.volumes()[0].capacity_bytes, (2 * GIB) as i64);
    assert_eq!(h.mock.calls().count(Rpc::ControllerExpandVolume), 1);

    let (field, reason) = invalid(h.service.expand(&id, GIB).await.expect_err("smaller"));
    assert_eq!(field, "capacity_bytes");
    assert!(reason.contains("volumes only grow"), "{reason}");
    let (field, _) = invalid(h.service.expand(&id, 0).await.expect_err("zero"));
    assert_eq!(field, "capacity_bytes");
    assert_eq!(h.mock.calls().count(Rpc::ControllerExpandVolume), 1);
    assert_eq!(h.entry(&id).expect("known").capacity_bytes, Some(2 * GIB));
    h.events();

    // The next claim runs the node expansion left waiting.
    h.claim("data", "web-1").await;
    assert_eq!(h.mock.calls().count(Rpc::NodeExpandVolume), 1);
    assert_eq!(h.entry(&id).expect("known").node_expansion, None);
    assert!(h.events().contains(&ServiceEvent::PendingNodeExpansion {
        volume: id.clone(),
        capacity_bytes: 2 * GIB,
        done: true,
    }));

    // Published now (the mock expands online): the controller, then this node, through the
    // shim's node route.
    let expanded = h.service.expand(&id, 3 * GIB).await.expect("expanded");
    assert_eq!(expanded.capacity_bytes, 3 * GIB);
    assert_eq!(expanded.nodes_expanded, vec![me()]);
    assert!(!expanded.node_expansion_pending);
    assert_eq!(h.mock.calls().count(Rpc::NodeExpandVolume), 2);
    let entry = h.entry(&id).expect("known");
    assert_eq!(entry.capacity_bytes, Some(3 * GIB));
    assert_eq!(entry.node_expansion, None);
}

#[tokio::test]
async fn expand_of_a_published_volume_is_unsupported_by_an_offline_only_plugin() {
    let h =
        Harness::with(MockPlugin::builder().volume_expansion(Some(VolumeExpansion::Offline))).await;
    let id = volume_id("data");
    h.create("data").await;
    h.claim("data", "web-1").await;
    let err = h
        .service
        .expand(&id, 2 * GIB)
        .await
        .expect_err("offline only");
    let ServiceError::Unsupported(message) = &err else {
        panic!("expected Unsupported, got {err:?}");
    };
    assert!(message.contains("offline"), "{message}");
    assert_eq!(h.mock.calls().count(Rpc::ControllerExpandVolume), 0);
    assert_eq!(h.entry(&id).expect("known").capacity_bytes, Some(GIB));

    // Released, it expands.
    h.release_and_wait("data", "web-1").await;
    let expanded = h.service.expand(&id, 2 * GIB).await.expect("expanded");
    assert_eq!(expanded.capacity_bytes, 2 * GIB);
    assert_eq!(h.mock.calls().count(Rpc::ControllerExpandVolume), 1);
}

#[tokio::test]
async fn expand_is_unsupported_without_expand_volume() {
    let h = Harness::with(
        MockPlugin::builder()
            .volume_expansion(None)
            .controller_capabilities(
                CONTROLLER_IMPLEMENTED
                    .iter()
                    .copied()
                    .filter(|c| *c != ControllerCapability::ExpandVolume),
            )
            .node_capabilities(
                NODE_IMPLEMENTED
                    .iter()
                    .copied()
                    .filter(|c| *c != NodeCapability::ExpandVolume),
            ),
    )
    .await;
    let id = volume_id("data");
    h.create("data").await;
    let err = h
        .service
        .expand(&id, 2 * GIB)
        .await
        .expect_err("cannot expand");
    assert!(
        matches!(&err, ServiceError::Unsupported(m) if m.contains("EXPAND_VOLUME")),
        "{err:?}"
    );
    assert_eq!(h.mock.calls().count(Rpc::ControllerExpandVolume), 0);
    assert_eq!(h.entry(&id).expect("known").capacity_bytes, Some(GIB));
}

// ---- snapshots --------------------------------------------------------------------------------

#[tokio::test]
async fn a_volume_is_made_from_a_snapshot_or_a_clone_of_a_catalog_volume() {
    let h = Harness::start().await;
    let source = h.create("data").await;
    let snapshot = h
        .service
        .create_snapshot(
            &volume_id("data"),
            NewSnapshot {
                name: "data-nightly".into(),
                parameters: Parameters::default(),
            },
        )
        .await
        .expect("cut");

    let mut restore = h.new_volume("restored", 0);
    restore.source = Some(NewVolumeSource::Snapshot(snapshot.id.clone()));
    let restored = h.service.create(restore).await.expect("restored");
    let sent = h
        .mock
        .calls()
        .last(Rpc::CreateVolume)
        .expect("sent")
        .request;
    assert!(
        sent.contains(snapshot.id.as_str()),
        "the snapshot is the content source: {sent}"
    );
    assert!(
        restored.capacity_bytes >= source.capacity_bytes,
        "at least the snapshot's size: {restored:?}"
    );

    let mut clone = h.new_volume("copy", 0);
    clone.source = Some(NewVolumeSource::Clone(volume_id("data")));
    h.service.create(clone).await.expect("cloned");
    let sent = h
        .mock
        .calls()
        .last(Rpc::CreateVolume)
        .expect("sent")
        .request;
    assert!(
        sent.contains(source.external_id.as_str()),
        "the source's plugin id is the content source: {sent}"
    );

    // A clone of a volume the catalog does not know: refused before any call.
    let creates = h.mock.calls().count(Rpc::CreateVolume);
    let mut unknown = h.new_volume("copy-2", 0);
    unknown.source = Some(NewVolumeSource::Clone(volume_id("nope")));
    let err = h.service.create(unknown).await.expect_err("no such volume");
    assert!(matches!(err, ServiceError::NotFound { .. }), "{err:?}");
    assert_eq!(h.mock.calls().count(Rpc::CreateVolume), creates);
    assert!(h.entry(&volume_id("copy-2")).is_none());
}

#[tokio::test]
async fn a_clone_for_a_plugin_without_clone_volume_is_refused_naming_it() {
    let h = Harness::with(
        MockPlugin::builder().controller_capabilities(
            CONTROLLER_IMPLEMENTED
                .iter()
                .copied()
                .filter(|c| *c != ControllerCapability::CloneVolume),
        ),
    )
    .await;
    h.create("data").await;
    let creates = h.mock.calls().count(Rpc::CreateVolume);
    let mut clone = h.new_volume("copy", 0);
    clone.source = Some(NewVolumeSource::Clone(volume_id("data")));
    let err = h.service.create(clone).await.expect_err("no CLONE_VOLUME");
    assert!(
        matches!(&err, ServiceError::Unsupported(m) if m.contains("CLONE_VOLUME")),
        "{err:?}"
    );
    assert_eq!(h.mock.calls().count(Rpc::CreateVolume), creates);
    assert!(h.entry(&volume_id("copy")).is_none());
}

#[tokio::test]
async fn snapshots_are_cut_listed_by_volume_and_deleted() {
    let mut h = Harness::start().await;
    let id = volume_id("data");
    let entry = h.create("data").await;
    // Another volume's snapshot must not show among this one's.
    h.create("other").await;
    h.service
        .create_snapshot(
            &volume_id("other"),
            NewSnapshot {
                name: "other-snap".into(),
                parameters: Parameters::default(),
            },
        )
        .await
        .expect("cut");
    h.events();

    let snapshot = h
        .service
        .create_snapshot(
            &id,
            NewSnapshot {
                name: "data-nightly".into(),
                parameters: Parameters::default(),
            },
        )
        .await
        .expect("cut");
    assert_eq!(snapshot.source_volume, Some(id.clone()));
    assert_eq!(snapshot.source, entry.external_id);
    assert_eq!(snapshot.size_bytes, entry.capacity_bytes);
    assert!(h.mock.snapshot_ids().contains(&snapshot.id.to_string()));
    assert!(matches!(
        h.events().as_slice(),
        [ServiceEvent::SnapshotCut { volume, .. }] if volume == &id
    ));

    let listed = h
        .service
        .list_snapshots(&SnapshotsOf::Volume(id.clone()))
        .await
        .expect("listed");
    assert_eq!(listed, vec![snapshot.clone()]);
    let all = h
        .service
        .list_snapshots(&SnapshotsOf::Plugin(h.plugin.clone()))
        .await
        .expect("listed");
    assert_eq!(all.len(), 2, "{all:?}");

    let plugin = h
        .service
        .delete_snapshot(&SnapshotsOf::Volume(id.clone()), &snapshot.id)
        .await
        .expect("deleted");
    assert_eq!(plugin, h.plugin);
    assert!(
        h.service
            .list_snapshots(&SnapshotsOf::Volume(id.clone()))
            .await
            .expect("listed")
            .is_empty()
    );
    assert_eq!(h.mock.snapshot_ids().len(), 1, "the other volume's stays");
    assert!(h.events().contains(&ServiceEvent::SnapshotDeleted {
        plugin: h.plugin.clone(),
        snapshot: snapshot.id.clone(),
    }));
}

#[tokio::test]
async fn the_plugin_s_listing_names_the_catalog_s_volumes_with_typed_sizes() {
    // One volume the catalog does not know, of a size the plugin does not know (wire 0).
    let h = Harness::with(MockPlugin::builder().volume("pre-existing", 0)).await;
    let entry = h.create("data").await;
    h.claim("data", "w1").await;

    let mut listed = h.service.list_external(&h.plugin).await.expect("listed");
    listed.sort_by(|a, b| a.known_as.cmp(&b.known_as));
    assert_eq!(listed.len(), 2, "{listed:?}");
    let (foreign, ours) = (&listed[0], &listed[1]);
    assert_eq!(foreign.known_as, None);
    assert_eq!(foreign.external_id.as_str(), "pre-existing");
    assert_eq!(foreign.capacity_bytes, None, "0 on the wire is unknown");
    assert!(foreign.published_nodes.is_empty());
    assert_eq!(ours.known_as, Some(volume_id("data")));
    assert_eq!(ours.external_id, entry.external_id);
    assert_eq!(ours.capacity_bytes, Some(GIB));
    assert_eq!(
        ours.published_nodes.len(),
        1,
        "published by the claim: {ours:?}"
    );
}

#[tokio::test]
async fn a_snapshot_with_a_name_the_spec_does_not_allow_is_invalid() {
    let h = Harness::start().await;
    h.create("data").await;
    let (field, _) = invalid(
        h.service
            .create_snapshot(
                &volume_id("data"),
                NewSnapshot {
                    name: String::new(),
                    parameters: Parameters::default(),
                },
            )
            .await
            .expect_err("an empty name"),
    );
    assert_eq!(field, "name");
    assert_eq!(h.mock.calls().count(Rpc::CreateSnapshot), 0);
}

// ---- delete -----------------------------------------------------------------------------------

#[tokio::test]
async fn delete_waits_for_the_claims_and_deletes_in_the_plugin() {
    let mut h = Harness::start().await;
    let id = volume_id("data");
    h.create("data").await;
    h.claim("data", "web-1").await;

    let message = conflict(h.service.delete(&id).await.expect_err("claimed"));
    assert!(message.contains("claim"), "{message}");
    assert_eq!(h.mock.calls().count(Rpc::DeleteVolume), 0);
    let entry = h.entry(&id).expect("still there");
    assert!(!entry.deleting, "refused before the mark");

    h.events();
    h.service
        .release(&id, &workload("web-1"))
        .await
        .expect("release durable");
    assert_eq!(
        h.next_release_event().await,
        ServiceEvent::ReleaseStarted {
            volume: id.clone(),
            workload: workload("web-1"),
        }
    );
    assert_eq!(
        h.next_release_event().await,
        ServiceEvent::Freed {
            volume: id.clone(),
            workload: workload("web-1"),
            node: me(),
        },
        "the release's progress follows on the service's stream, up to the freed claim"
    );
    h.wait_no_claims(&id).await;
    assert!(h.mock.published().is_empty() && h.mock.staged().is_empty());
    assert!(
        h.mock
            .published_nodes(entry.external_id.as_str())
            .is_empty()
    );
    h.events();

    let deleted = h.service.delete(&id).await.expect("deleted");
    assert_eq!(deleted.external_id, entry.external_id);
    assert_eq!(h.mock.calls().count(Rpc::DeleteVolume), 1);
    assert!(h.mock.volumes().is_empty());
    assert!(h.entry(&id).is_none());
    assert_eq!(
        h.events(),
        vec![ServiceEvent::VolumeDeleted {
            volume: id.clone(),
            in_plugin: true,
        }]
    );
    assert!(matches!(
        h.service.delete(&id).await,
        Err(ServiceError::NotFound { .. })
    ));
}

#[tokio::test]
async fn delete_of_a_registered_volume_leaves_it_in_the_plugin() {
    let mut h = Harness::with(MockPlugin::builder().volume("pre-1", GIB as i64)).await;
    let id = volume_id("data");
    h.service
        .register_volume(register_request(&h, "data", "pre-1"))
        .await
        .expect("registered");
    h.events();
    h.service.delete(&id).await.expect("deleted");
    assert_eq!(h.mock.calls().count(Rpc::DeleteVolume), 0);
    assert_eq!(h.mock_volumes(), vec!["pre-1".to_owned()]);
    assert!(h.entry(&id).is_none());
    assert_eq!(
        h.events(),
        vec![ServiceEvent::VolumeDeleted {
            volume: id,
            in_plugin: false,
        }]
    );
}

// ---- deregister -------------------------------------------------------------------------------

#[tokio::test]
async fn deregister_refuses_claims_without_force_and_forgets_without_the_plugin() {
    let mut h = Harness::start().await;
    let id = volume_id("data");
    let entry = h.create("data").await;
    h.claim("data", "web-1").await;

    conflict(
        h.service
            .deregister_volume(&id, false, false)
            .await
            .expect_err("claimed"),
    );
    let (field, reason) = invalid(
        h.service
            .deregister_volume(&id, true, false)
            .await
            .expect_err("not confirmed"),
    );
    assert_eq!(field, "confirmed");
    assert!(reason.contains("DeleteVolume removes it"), "{reason}");
    assert!(reason.contains("workload web-1"), "{reason}");
    assert!(reason.contains("ControllerUnpublishVolume"), "{reason}");
    assert!(h.entry(&id).is_some(), "nothing changed");

    h.release_and_wait("data", "web-1").await;
    h.wait_no_claims(&id).await;
    h.events();
    h.mock.calls().clear();

    let gone = h
        .service
        .deregister_volume(&id, false, false)
        .await
        .expect("deregistered");
    assert_eq!(gone.dropped_claims, 0);
    assert_eq!(gone.entry.external_id, entry.external_id);
    assert!(
        gone.left_behind
            .iter()
            .any(|l| l.to_string().contains("DeleteVolume removes it")),
        "{:?}",
        gone.left_behind
    );
    assert!(h.entry(&id).is_none());
    assert_eq!(h.mock_volumes(), vec![entry.external_id.to_string()]);
    let after = h.mock.calls().snapshot().without_discovery();
    assert!(after.is_empty(), "the plugin was called: {after:?}");
    assert_eq!(
        h.events(),
        vec![ServiceEvent::VolumeDeregistered {
            volume: id,
            dropped_claims: 0,
        }]
    );
}

// ---- detach -----------------------------------------------------------------------------------

#[tokio::test]
async fn detach_refuses_this_node_as_gone_and_a_node_without_claims() {
    let h = Harness::start().await;
    let id = volume_id("data");
    h.create("data").await;
    h.claim("data", "web-1").await;

    let (field, _) = invalid(
        h.service
            .detach(DetachVolume {
                volume: id.clone(),
                node: me(),
                node_gone: true,
            })
            .await
            .expect_err("this node is not gone"),
    );
    assert_eq!(field, "node_gone");

    let message = conflict(
        h.service
            .detach(DetachVolume {
                volume: id.clone(),
                node: NodeId::new("n2").expect("id"),
                node_gone: false,
            })
            .await
            .expect_err("no claim on n2"),
    );
    assert!(message.contains("n2"), "{message}");
    // Neither touched the claim.
    let state = h.service.volume(&id).expect("known");
    assert_eq!(state.claims.len(), 1);
    assert!(!state.claims[0].0.state().is_releasing());
}

#[tokio::test]
async fn detach_of_this_node_releases_its_claims() {
    let mut h = Harness::start().await;
    let id = volume_id("data");
    // Two writers on this node.
    let mut request = h.new_volume("data", GIB);
    request.access_mode = AccessMode::SingleNodeMultiWriter;
    let entry = h.service.create(request).await.expect("created");
    h.claim("data", "web-1").await;
    h.claim("data", "web-2").await;
    h.events();

    let detached = h
        .service
        .detach(DetachVolume {
            volume: id.clone(),
            node: me(),
            node_gone: false,
        })
        .await
        .expect("detaching");
    let mut releasing = detached.releasing.clone();
    releasing.sort();
    assert_eq!(releasing, vec![workload("web-1"), workload("web-2")]);
    assert!(!detached.node_gone);
    assert!(detached.note.is_none(), "{:?}", detached.note);
    assert!(matches!(
        h.events().as_slice(),
        [ServiceEvent::Detached { node, node_gone: false, .. }] if node == &me()
    ));

    h.wait_no_claims(&id).await;
    assert!(h.mock.published().is_empty() && h.mock.staged().is_empty());
    assert!(
        h.mock
            .published_nodes(entry.external_id.as_str())
            .is_empty()
    );
    // Nothing left: a second detach finds no claim.
    conflict(
        h.service
            .detach(DetachVolume {
                volume: id,
                node: me(),
                node_gone: false,
            })
            .await
            .expect_err("no claim left"),
    );
}

// ---- reconcile after a restart ----------------------------------------------------------------

#[tokio::test]
async fn after_a_restart_reconcile_publishes_the_claims_of_this_node_again() {
    let h = Harness::start().await;
    let id = volume_id("data");
    h.create("data").await;
    let claimed = h.claim("data", "web-1").await;
    let publishes = h.mock.calls().count(Rpc::NodePublishVolume);

    let mut h = h.restart().await;
    // The catalog and the claim were kept.
    let state = h.service.volume(&id).expect("the catalog was kept");
    assert_eq!(state.claims.len(), 1, "the claim was kept");

    let reconciled = h.service.reconcile_node(Duration::from_secs(30)).await;
    assert!(reconciled.plugins_not_ready.is_empty());
    let actions: Vec<(ReconcileAction, Option<String>)> = reconciled
        .report
        .records
        .iter()
        .map(|r| (r.action(), r.workload.as_ref().map(ToString::to_string)))
        .collect();
    assert_eq!(
        actions,
        vec![(ReconcileAction::Republished, Some("web-1".to_owned()))],
        "{:?}",
        reconciled.report.records
    );
    assert_eq!(h.mock.calls().count(Rpc::NodePublishVolume), publishes + 1);
    assert_eq!(
        h.service.volumes().published(&id, &workload("web-1")),
        Some(claimed.target_path.clone())
    );
    assert_eq!(
        h.events(),
        vec![ServiceEvent::NodeReconciled {
            records: 1,
            republished: 1,
            not_confirmed: 0,
        }]
    );

    // The claim works as before: released through the reopened node.
    h.release_and_wait("data", "web-1").await;
    assert!(h.mock.published().is_empty() && h.mock.staged().is_empty());
}

#[tokio::test]
async fn detach_of_a_node_gone_for_good_releases_its_claims_without_node_steps() {
    let mut h = Harness::with(MockPlugin::builder().other_node("node-2")).await;
    let id = volume_id("data");
    let mut request = h.new_volume("data", GIB);
    request.access_mode = AccessMode::MultiNodeMultiWriter;
    let entry = h.service.create(request).await.expect("created");
    // A claim another node took (on one node, each agent keeps its own claims: it is
    // written here directly, as that node's agent would have).
    let n2 = NodeId::new("n2").expect("id");
    h.service
        .claims()
        .claim(
            &entry.info(),
            ClaimRequest {
                volume: id.clone(),
                workload: workload("web-2"),
                node: n2.clone(),
                plugin_node: PluginNodeId::new("node-2").expect("id"),
                mode: ClaimMode::Write,
                access_mode: entry.access_mode,
                attachment: entry.attachment,
            },
        )
        .await
        .expect("claimed for n2");
    // And one here, which the detach of n2 leaves alone.
    h.claim("data", "web-1").await;
    h.events();

    let detached = h
        .service
        .detach(DetachVolume {
            volume: id.clone(),
            node: n2.clone(),
            node_gone: true,
        })
        .await
        .expect("detaching");
    assert!(detached.node_gone);
    assert_eq!(detached.releasing, vec![workload("web-2")]);
    assert!(matches!(
        h.events().as_slice(),
        [ServiceEvent::Detached { node, node_gone: true, .. }] if node == &n2
    ));
    tokio::time::timeout(support::GUARD, async {
        while h
            .service
            .volume(&id)
            .expect("known")
            .claims
            .iter()
            .any(|(c, _)| c.node() == &n2)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("n2's claim is released (hang guard)");
    // This node's claim and publication stay.
    let state = h.service.volume(&id).expect("known");
    assert_eq!(state.claims.len(), 1);
    assert_eq!(state.claims[0].0.workload(), &workload("web-1"));
    assert_eq!(h.mock.published().len(), 1);
    assert_eq!(h.mock.calls().count(Rpc::NodeUnpublishVolume), 0);
    // The controller step ran for the gone node's plugin node.
    let detached = h
        .mock
        .calls()
        .of(Rpc::ControllerUnpublishVolume)
        .into_records();
    assert!(
        detached
            .iter()
            .any(|c| c.node_id.as_deref() == Some("node-2") && c.outcome == RecordedOutcome::Ok),
        "{detached:?}"
    );
}

/// A forced deregistration answers how many claims it forgot, and they are gone from the
/// claim store (the node's own, through which `for_node` forgets), or a volume registered
/// again under the id would inherit them. A service with no store to forget through refuses,
/// changing nothing.
#[tokio::test]
async fn a_forced_deregistration_forgets_the_claims_or_is_refused() {
    let h = Harness::start().await;
    let id = volume_id("data");
    let entry = h.create("data").await;
    h.claim("data", "web-1").await;

    // Without a store to forget through: refused, the volume and its claim kept.
    let blind = VolumeService::builder(
        h.node.id().clone(),
        Arc::clone(h.service.catalog()),
        h.node.claims().clone(),
        h.service.shim().clone(),
        h.node.plugins().clone(),
        h.node.volumes().clone(),
    )
    .build();
    let refused = blind
        .deregister_volume(&id, true, true)
        .await
        .expect_err("cannot forget");
    assert!(
        matches!(refused, ServiceError::Unsupported(_)),
        "{refused:?}"
    );
    assert!(h.entry(&id).is_some(), "{refused}");
    assert_eq!(h.service.volume(&id).expect("known").claims.len(), 1);
    drop(blind);

    let target = h
        .service
        .volumes()
        .published(&id, &workload("web-1"))
        .expect("published here");
    let staging = h
        .service
        .volumes()
        .layout()
        .staging_path(&id)
        .expect("a staging path");
    let gone = h
        .service
        .deregister_volume(&id, true, true)
        .await
        .expect("forced");
    assert_eq!(gone.dropped_claims, 1);
    assert!(h.entry(&id).is_none());
    // What stays on this node, named with its paths: the mounts its usage record keeps.
    let left: Vec<String> = gone.left_behind.iter().map(ToString::to_string).collect();
    for expected in [
        format!(
            "publication for workload web-1 on node {} at {}",
            me(),
            target.display()
        ),
        format!("staging on node {} at {}", me(), staging.display()),
        "ControllerUnpublishVolume not done".to_owned(),
    ] {
        assert!(
            left.iter().any(|l| l.contains(&expected)),
            "{expected}: {left:#?}"
        );
    }
    // Deleted in the store before the answer; the driver drops its copy when the store's
    // watch tells it, a moment later (the guard is only against a hang).
    tokio::time::timeout(support::GUARD, async {
        while h
            .service
            .claims()
            .record(&id)
            .is_some_and(|r| !r.claims().is_empty())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the forgotten claims leave the driver");
    // Registered again, the volume starts without claims.
    let mut again = register_request(&h, "data", entry.external_id.as_str());
    again.controller_publish = Some(true);
    h.service
        .register_volume(again)
        .await
        .expect("registered again");
    let state = h.service.volume(&id).expect("known");
    assert!(state.claims.is_empty(), "inherited: {:?}", state.claims);
}
