//! An operation whose caller stops waiting runs to its end: the volume service's future is
//! dropped while the mock plugin holds one of the operation's calls (a frozen plugin), the
//! plugin resumes, and the operation ends as if it had been awaited. Never a claim taken with
//! nothing mounted, never a release left half done.

mod support;

use std::future::Future;

use csi_claims::ClaimState;
use csi_client::Rpc;
use csi_control::{ServiceError, ServiceEvent};
use csi_testkit::{CallList, RecordedOutcome};
use support::{GUARD, Harness, volume_id, workload, write_claim};
use tokio::time::Instant;

/// Whether the log shows a `rpc` call waiting for the plugin (recorded, not answered yet).
fn held(calls: &CallList, rpc: Rpc) -> bool {
    calls
        .of(rpc)
        .records()
        .iter()
        .any(|r| r.outcome == RecordedOutcome::InFlight)
}

/// Scripts a hold on the next `rpc`, polls `operation` until the plugin holds that call, then
/// drops it (the caller hangs up), resumes the plugin and waits until the service runs no
/// operation any more.
async fn drop_while_held<T>(h: &Harness, rpc: Rpc, operation: impl Future<Output = T>) {
    h.mock.faults().on(rpc).hold();
    let calls = h.mock.calls();
    tokio::select! {
        _ = operation => panic!("the operation answered while the plugin held its {rpc:?}"),
        waited = calls.wait_for(GUARD, |c| held(c, rpc)) => {
            waited.expect("the plugin holds the call (hang guard)");
        }
    }
    // The operation's future is dropped: its caller is gone.
    h.mock.faults().resume_held();
    tokio::time::timeout(GUARD, h.service.wait_idle())
        .await
        .expect("the operation ran to its end (hang guard)");
    assert!(
        h.mock
            .calls()
            .of(rpc)
            .records()
            .iter()
            .all(|r| r.outcome == RecordedOutcome::Ok),
        "the held {rpc:?} was served, not abandoned: {:?}",
        h.mock.calls().of(rpc).records()
    );
}

/// Claims `v1` for `w1`, dropping the claim's future while the plugin holds `rpc`, and checks
/// that the claim ended taken and published, in the service and at the plugin, and that
/// claiming again answers the same.
async fn a_claim_dropped_while_the_plugin_holds(rpc: Rpc) {
    let mut h = Harness::start().await;
    let entry = h.create("v1").await;
    let external = entry.external_id.to_string();
    h.events();

    drop_while_held(&h, rpc, h.service.claim(write_claim("v1", "w1"))).await;

    let state = h.service.volume(&volume_id("v1")).expect("in the catalog");
    let [(claim, target)] = state.claims.as_slice() else {
        panic!("one claim: {:?}", state.claims);
    };
    assert_eq!(claim.state(), &ClaimState::Taken, "{claim:?}");
    let target = target.clone().expect("published on this node");
    assert_eq!(
        h.mock.published_nodes(&external),
        vec![h.mock.node_id().to_owned()],
        "controller-published to this node"
    );
    assert!(
        h.mock.staged().iter().any(|s| s.volume_id == external),
        "staged: {:?}",
        h.mock.staged()
    );
    assert!(
        h.mock
            .published()
            .iter()
            .any(|p| p.volume_id == external && p.path == target),
        "published at {}: {:?}",
        target.display(),
        h.mock.published()
    );
    assert!(
        h.events().iter().any(|e| matches!(
            e,
            ServiceEvent::Claimed { target_path, .. } if *target_path == target
        )),
        "the claim's end is told to subscribers"
    );

    // Asking again gives the same answer, and nothing new at the plugin.
    let publishes = h.mock.calls().count(Rpc::ControllerPublishVolume);
    let again = h.claim("v1", "w1").await;
    assert_eq!(again.target_path, target);
    assert_eq!(again.claim.state(), &ClaimState::Taken);
    assert_eq!(
        h.mock.calls().count(Rpc::ControllerPublishVolume),
        publishes,
        "attached once"
    );
    let state = h.service.volume(&volume_id("v1")).expect("in the catalog");
    assert_eq!(state.claims.len(), 1, "{:?}", state.claims);
}

#[tokio::test]
async fn a_claim_dropped_during_controller_publish_ends_taken_and_published() {
    a_claim_dropped_while_the_plugin_holds(Rpc::ControllerPublishVolume).await;
}

#[tokio::test]
async fn a_claim_dropped_during_node_stage_ends_taken_and_published() {
    a_claim_dropped_while_the_plugin_holds(Rpc::NodeStageVolume).await;
}

#[tokio::test]
async fn a_claim_dropped_during_node_publish_ends_taken_and_published() {
    a_claim_dropped_while_the_plugin_holds(Rpc::NodePublishVolume).await;
}

#[tokio::test]
async fn a_release_dropped_during_node_unpublish_ends_freed_with_nothing_left() {
    let h = Harness::start().await;
    let entry = h.create("v1").await;
    let external = entry.external_id.to_string();
    h.claim("v1", "w1").await;

    let (v1, w1) = (volume_id("v1"), workload("w1"));
    drop_while_held(
        &h,
        Rpc::NodeUnpublishVolume,
        h.service.release_and_wait(&v1, &w1, Instant::now() + GUARD),
    )
    .await;

    let state = h.service.volume(&v1).expect("in the catalog");
    assert!(state.claims.is_empty(), "freed: {:?}", state.claims);
    assert!(h.mock.published().is_empty(), "{:?}", h.mock.published());
    assert!(h.mock.staged().is_empty(), "{:?}", h.mock.staged());
    assert!(h.mock.published_nodes(&external).is_empty(), "detached");
}

#[tokio::test]
async fn a_create_dropped_during_create_volume_ends_in_the_catalog_and_the_plugin() {
    let h = Harness::start().await;
    drop_while_held(
        &h,
        Rpc::CreateVolume,
        h.service.create(h.new_volume("v2", 1 << 30)),
    )
    .await;

    let entry = h.entry(&volume_id("v2")).expect("registered");
    assert!(entry.created && entry.may_exist.is_none(), "{entry:?}");
    assert_eq!(h.mock_volumes(), vec![entry.external_id.to_string()]);
    // Asking again: the id is taken, by that very volume.
    let again = h
        .service
        .create(h.new_volume("v2", 1 << 30))
        .await
        .expect_err("created already");
    assert!(
        matches!(&again, ServiceError::Conflict(m) if m.contains("v2")),
        "{again:?}"
    );
}
