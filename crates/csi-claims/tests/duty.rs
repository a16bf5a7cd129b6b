//! The fenced controller duty in the driver: the local deadline, the store's fence and the
//! confirmation of the record before a controller call. A store here fences the way etcd
//! does (a duty key with a creation revision); tokio's clock is paused, so "a holder paused
//! past its lease" is the clock moving while the holder's keep-alives are not confirmed.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use csi_claims::backoff::BackoffPolicy;
use csi_claims::driver::{ClaimsDriver, ClaimsHandle, DriverConfig, DriverError};
use csi_claims::duty::{Duty, Fence};
use csi_claims::store::{ClaimStore, StoreError, Stored, Version};
use csi_claims::{
    ClaimState, ControllerRequirement, DetachRpc, MachineConfig, MemoryStore, VolumeRecord,
};
use csi_structs::{ErrorClass, VolumeId};
use support::{FakeController, FakeNode, Plugin, info, write_claim};

/// A memory store that fences controller-side steps as etcd does: it holds the duty key's
/// current creation revision, and refuses a fence naming another. With `behind_your_back`,
/// another agent performs the controller step and records it just before the next
/// confirmation is answered.
#[derive(Default)]
struct FencingStore {
    inner: MemoryStore,
    duty_revision: Mutex<i64>,
    behind_your_back: Mutex<bool>,
    confirmations: Mutex<usize>,
}

impl FencingStore {
    fn check(&self, volume: &VolumeId, fence: &Fence) -> Result<(), StoreError> {
        let now = *self.duty_revision.lock().unwrap();
        if fence.revision == now {
            Ok(())
        } else {
            Err(StoreError::Fenced {
                volume: volume.clone(),
                detail: format!("duty key now at revision {now}"),
            })
        }
    }
}

#[async_trait]
impl ClaimStore for FencingStore {
    async fn load_all(&self) -> Result<Vec<Stored>, StoreError> {
        self.inner.load_all().await
    }
    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        self.inner.load(volume).await
    }
    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError> {
        self.inner.compare_and_swap(volume, expected, new).await
    }
    async fn compare_and_swap_fenced(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
        fence: &Fence,
    ) -> Result<Option<Version>, StoreError> {
        self.check(volume, fence)?;
        self.inner.compare_and_swap(volume, expected, new).await
    }
    async fn confirm_fenced(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        *self.confirmations.lock().unwrap() += 1;
        let sneak = std::mem::take(&mut *self.behind_your_back.lock().unwrap());
        if sneak && let Some(current) = self.inner.load(volume).await? {
            let record = controller_detached(&current.record);
            self.inner
                .compare_and_swap(volume, Some(current.version), Some(&record))
                .await?;
        }
        self.check(volume, fence)?;
        let found = self.inner.load(volume).await?.map(|s| s.version);
        if found == expected {
            Ok(())
        } else {
            Err(StoreError::Conflict {
                volume: volume.clone(),
                expected,
                found,
            })
        }
    }
}

const DUTY_KEY: &str = "/test/leader/controller-duty";

fn fence(revision: i64) -> Fence {
    Fence {
        key: DUTY_KEY.to_owned(),
        revision,
    }
}

fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// A driver on `store` whose controller duty is off until the test hands it one.
async fn start(store: &Arc<FencingStore>, plugin: &Arc<Plugin>) -> (ClaimsHandle, ClaimsDriver) {
    let config = DriverConfig {
        machine: MachineConfig {
            backoff: BackoffPolicy::new(Duration::from_secs(2), Duration::from_secs(2)).unwrap(),
            ..MachineConfig::with_seed(5)
        },
        ..DriverConfig::default()
    };
    let (claims, driver) = ClaimsDriver::start(
        Arc::clone(store),
        Arc::new(FakeNode(Arc::clone(plugin))),
        Arc::new(FakeController(Arc::clone(plugin))),
        config,
    )
    .await
    .unwrap();
    claims.set_controller_duty(false);
    (claims, driver)
}

/// Workload `w`'s claim of `v` on node `n1`, durable.
async fn claim(claims: &ClaimsHandle, v: &csi_claims::VolumeInfo) -> csi_structs::WorkloadId {
    claims
        .claim(v, write_claim(v, "w", "n1"))
        .await
        .unwrap()
        .workload()
        .clone()
}

fn controller_calls(plugin: &Plugin) -> usize {
    plugin
        .calls()
        .iter()
        .filter(|c| c.rpc == DetachRpc::ControllerUnpublish)
        .count()
}

async fn stored_state(store: &FencingStore, volume: &VolumeId) -> Option<ClaimState> {
    let stored = store.load(volume).await.unwrap()?;
    stored.record.claims().first().map(|c| c.state().clone())
}

/// Waits (virtual time) for the release to stand still, and returns what the wait ended with.
async fn release_for(
    claims: &ClaimsHandle,
    volume: &VolumeId,
    workload: &csi_structs::WorkloadId,
    wait: Duration,
) -> Result<csi_claims::Claim, DriverError> {
    let deadline = tokio::time::Instant::now() + wait;
    claims
        .release_and_wait_until(volume, workload, deadline)
        .await
}

#[tokio::test(start_paused = true)]
async fn a_holder_past_its_deadline_starts_no_controller_step_until_a_keep_alive_is_confirmed() {
    let store = Arc::new(FencingStore::default());
    *store.duty_revision.lock().unwrap() = 7;
    let plugin = Plugin::new();
    // The first controller call fails: the step waits out its backoff (2 s).
    plugin.script(DetachRpc::ControllerUnpublish, ErrorClass::Retry, 1);
    let (claims, driver) = start(&store, &plugin).await;
    // The last confirmed keep-alive gives a deadline 1 s from now; none follows (the holder
    // is paused, or its keep-alives go unanswered).
    let duty = Duty::new("n0", fence(7), now() + Duration::from_secs(1));
    claims.hold_controller_duty(duty.clone());

    let v = info("v", "p", ControllerRequirement::Required);
    let w = claim(&claims, &v).await;
    let waited = release_for(&claims, &v.id, &w, Duration::from_secs(60)).await;
    assert!(
        matches!(waited, Err(DriverError::StillReleasing { .. })),
        "{waited:?}"
    );
    // One call (the failed one) before the deadline; none after it, though the backoff
    // expired 58 s ago.
    assert_eq!(controller_calls(&plugin), 1, "{:?}", plugin.calls());
    assert!(!claims.controller_duty(), "the lapse turned the duty off");
    assert!(matches!(
        stored_state(&store, &v.id).await,
        Some(ClaimState::NodeDetached(_))
    ));

    // A keep-alive is confirmed again (the lease was still alive): steps start again.
    duty.extend(now() + Duration::from_secs(3));
    claims.controller_duty_confirmed(&duty);
    let freed = release_for(&claims, &v.id, &w, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(freed.state(), ClaimState::Freed(_)));
    assert_eq!(controller_calls(&plugin), 2);
    assert!(store.load(&v.id).await.unwrap().is_none());
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_confirmation_of_a_lapsed_deadline_does_not_bring_the_duty_back() {
    let store = Arc::new(FencingStore::default());
    *store.duty_revision.lock().unwrap() = 3;
    let plugin = Plugin::new();
    let (claims, driver) = start(&store, &plugin).await;
    let duty = Duty::new("n0", fence(3), now());
    claims.hold_controller_duty(duty.clone());
    let v = info("v", "p", ControllerRequirement::Required);
    let w = claim(&claims, &v).await;
    let _ = release_for(&claims, &v.id, &w, Duration::from_secs(10)).await;
    assert_eq!(controller_calls(&plugin), 0);
    // A keep-alive sent before the pause and read after it confirms nothing: its deadline
    // (from when it was sent) is already past.
    duty.extend(now() - Duration::from_millis(1));
    claims.controller_duty_confirmed(&duty);
    assert!(!claims.controller_duty());
    let _ = release_for(&claims, &v.id, &w, Duration::from_secs(10)).await;
    assert_eq!(controller_calls(&plugin), 0);
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_duty_writes_no_controller_side_record() {
    let store = Arc::new(FencingStore::default());
    *store.duty_revision.lock().unwrap() = 1;
    let plugin = Plugin::new();
    let (claims, driver) = start(&store, &plugin).await;
    // No controller publish step: after the node step, the next steps are records only.
    let v = info("v", "p", ControllerRequirement::NotRequired);
    let w = claim(&claims, &v).await;
    claims.hold_controller_duty(Duty::new("n0", fence(1), now()));
    let waited = release_for(&claims, &v.id, &w, Duration::from_secs(30)).await;
    assert!(matches!(waited, Err(DriverError::StillReleasing { .. })));
    // The node step is the node's (not fenced); the skip of the controller step is a record
    // the holder may not write.
    assert!(
        matches!(
            stored_state(&store, &v.id).await,
            Some(ClaimState::NodeDetached(_))
        ),
        "{:?}",
        stored_state(&store, &v.id).await
    );
    claims.hold_controller_duty(Duty::new("n0", fence(1), now() + Duration::from_secs(5)));
    let freed = release_for(&claims, &v.id, &w, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(freed.state(), ClaimState::Freed(_)));
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_fence_the_store_no_longer_holds_stops_the_call_whatever_the_clock_says() {
    let store = Arc::new(FencingStore::default());
    // The duty key was created again by another agent (revision 9); this agent's duty names
    // revision 4 and its clock says it still holds it (a host suspended and resumed).
    *store.duty_revision.lock().unwrap() = 9;
    let plugin = Plugin::new();
    let (claims, driver) = start(&store, &plugin).await;
    claims.hold_controller_duty(Duty::new("n0", fence(4), now() + Duration::from_secs(3600)));
    for (volume, controller) in [
        ("attached", ControllerRequirement::Required),
        ("local", ControllerRequirement::NotRequired),
    ] {
        let v = info(volume, "p", controller);
        let w = claim(&claims, &v).await;
        let waited = release_for(&claims, &v.id, &w, Duration::from_secs(30)).await;
        assert!(
            matches!(waited, Err(DriverError::StillReleasing { .. })),
            "{volume}: {waited:?}"
        );
        assert!(matches!(
            stored_state(&store, &v.id).await,
            Some(ClaimState::NodeDetached(_))
        ));
        claims.hold_controller_duty(Duty::new("n0", fence(4), now() + Duration::from_secs(3600)));
    }
    assert_eq!(controller_calls(&plugin), 0, "{:?}", plugin.calls());
    assert!(*store.confirmations.lock().unwrap() >= 1);
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_step_decided_on_a_stale_copy_is_decided_again_on_what_the_store_holds() {
    let store = Arc::new(FencingStore::default());
    *store.duty_revision.lock().unwrap() = 2;
    let plugin = Plugin::new();
    let (claims, driver) = start(&store, &plugin).await;
    claims.hold_controller_duty(Duty::new("n0", fence(2), now() + Duration::from_secs(3600)));
    let v = info("v", "p", ControllerRequirement::Required);
    let w = claim(&claims, &v).await;
    // Another agent detached the volume on the controller and recorded it, unseen by this
    // one (no watch): this agent's copy still says the controller step is next.
    *store.behind_your_back.lock().unwrap() = true;
    let freed = release_for(&claims, &v.id, &w, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(freed.state(), ClaimState::Freed(_)));
    assert_eq!(
        controller_calls(&plugin),
        0,
        "the step was decided again on the stored record, which needed no call: {:?}",
        plugin.calls()
    );
    driver.shutdown().await;
}

/// `record` with its node-detached claims moved on to "controller step done", as another
/// agent would have written it (through the stored format: the fields are the crate's).
fn controller_detached(record: &VolumeRecord) -> VolumeRecord {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if map.get("state").and_then(|s| s.as_str()) == Some("node_detached") {
                    map.insert("state".into(), "controller_detached".into());
                    map.insert(
                        "controller".into(),
                        serde_json::json!({ "controller_step": "detached" }),
                    );
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut json: serde_json::Value =
        serde_json::from_slice(&csi_claims::store::encode(record).unwrap()).unwrap();
    walk(&mut json);
    let (changed, _) = csi_claims::store::decode(&serde_json::to_vec(&json).unwrap()).unwrap();
    assert!(matches!(
        changed.claims()[0].state(),
        ClaimState::ControllerDetached(_)
    ));
    changed
}

#[tokio::test(start_paused = true)]
async fn without_a_duty_object_nothing_is_fenced() {
    // One agent: `set_controller_duty(true)` performs controller steps with no fence and no
    // confirmation (a store of one writer has nobody to fence off).
    let store = Arc::new(FencingStore::default());
    *store.duty_revision.lock().unwrap() = 1;
    let plugin = Plugin::new();
    let (claims, driver) = start(&store, &plugin).await;
    claims.set_controller_duty(true);
    let v = info("v", "p", ControllerRequirement::Required);
    let w = claim(&claims, &v).await;
    release_for(&claims, &v.id, &w, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(controller_calls(&plugin), 1);
    assert_eq!(*store.confirmations.lock().unwrap(), 0);
    // Dropping a duty that was never fenced leaves it off, and the handle shows no duty.
    claims.drop_controller_duty();
    assert!(!claims.controller_duty());
    assert!(claims.duty().is_none());
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_call_under_way_when_the_duty_lapses_is_abandoned_with_its_retries() {
    // A controller call that takes 10 s (a plugin retrying, a slow hop) starts 2 s before the
    // duty's deadline, and no keep-alive is confirmed: the driver drops the call at the
    // deadline instead of letting it (and whatever retries it has left) run on.
    let store = Arc::new(FencingStore::default());
    *store.duty_revision.lock().unwrap() = 5;
    let plugin = Plugin::new();
    *plugin.controller_latency.lock().unwrap() = Duration::from_secs(10);
    let (claims, driver) = start(&store, &plugin).await;
    claims.hold_controller_duty(Duty::new("n0", fence(5), now() + Duration::from_secs(2)));
    let v = info("v", "p", ControllerRequirement::Required);
    let w = claim(&claims, &v).await;
    let waited = release_for(&claims, &v.id, &w, Duration::from_secs(60)).await;
    let Err(DriverError::StillReleasing { status, .. }) = waited else {
        panic!("{waited:?}");
    };
    // Never answered: the fake plugin logs a controller call once it answers.
    assert_eq!(controller_calls(&plugin), 0, "{:?}", plugin.calls());
    let last = format!("{:?}", status.and_then(|s| s.last_error));
    assert!(last.contains("lapsed during the call"), "{last}");
    assert!(!claims.controller_duty());
    driver.shutdown().await;
}
