//! Forgetting a volume whose release cannot finish: the driver drops its claims, its waiter is
//! answered, and the volume can be claimed again.

mod support;

use std::sync::Arc;
use std::time::Duration;

use csi_claims::backoff::BackoffPolicy;
use csi_claims::driver::{ClaimsDriver, DriverConfig};
use csi_claims::store::{ClaimStore, Forgetting};
use csi_claims::{
    ClaimMode, ControllerRequirement, DetachRpc, MachineConfig, MemoryStore, NodeStep,
};
use csi_structs::{AccessMode, ErrorClass, VolumeId};
use support::{FakeController, FakeNode, Plugin, info, request};

/// Hang guard only: the paused clock makes real waiting impossible anyway.
async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(24 * 3600), f)
        .await
        .expect("hang guard: the driver did not finish")
}

#[tokio::test(start_paused = true)]
async fn a_forgotten_volume_stuck_in_its_node_step_is_dropped_and_claimable_again() {
    let plugin = Plugin::new();
    // The node plugin is gone for good: every node step fails.
    plugin.script(DetachRpc::NodeUnpublish, ErrorClass::RetryElsewhere, 10_000);
    let store = Arc::new(Forgetting::new(Arc::new(MemoryStore::new())));
    let config = DriverConfig {
        machine: MachineConfig {
            backoff: BackoffPolicy::new(Duration::from_secs(1), Duration::from_secs(10)).unwrap(),
            ..MachineConfig::with_seed(5)
        },
        ..DriverConfig::default()
    };
    let (claims, driver) = ClaimsDriver::start(
        Arc::clone(&store),
        Arc::new(FakeNode(Arc::clone(&plugin))),
        Arc::new(FakeController(Arc::clone(&plugin))),
        config,
    )
    .await
    .unwrap();
    let v = info("v", "p", ControllerRequirement::Required);
    let write = |workload: &str| {
        request(
            &v,
            workload,
            "n1",
            ClaimMode::Write,
            AccessMode::SingleNodeWriter,
        )
    };
    let a = guard(claims.claim(&v, write("a"))).await.unwrap();
    let waiting = {
        let claims = claims.clone();
        let workload = a.workload().clone();
        tokio::spawn(async move {
            claims
                .release_and_wait(&VolumeId::new("v").unwrap(), &workload)
                .await
        })
    };
    // Stuck: the node step failed and waits for its retry.
    guard(async {
        while claims.stuck().is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    // A second writer is refused while the stuck claim holds the volume.
    assert!(guard(claims.claim(&v, write("b"))).await.is_err());

    let dropped = store.forget(&v.id).await.unwrap().expect("a record");
    assert_eq!(dropped.claims().len(), 1);
    // The waiter hears of it; the node step never succeeded.
    let freed = guard(waiting).await.unwrap().unwrap();
    assert_ne!(
        freed.state().node_step(),
        Some(NodeStep::Detached { unstaged: true })
    );
    assert!(claims.record(&v.id).is_none());
    assert!(claims.stuck().is_empty());
    assert!(store.load(&v.id).await.unwrap().is_none());
    assert!(store.forget(&v.id).await.unwrap().is_none(), "nothing left");

    // The volume is free: a new claim is admitted and written.
    let b = guard(claims.claim(&v, write("b"))).await.unwrap();
    assert_eq!(b.workload().as_str(), "b");
    assert_eq!(
        store
            .load(&v.id)
            .await
            .unwrap()
            .unwrap()
            .record
            .claims()
            .len(),
        1
    );
    driver.shutdown().await;
}
