//! Driver tests: fake detachers with scripted answers, tokio's paused clock.

mod support;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use csi_claims::backoff::BackoffPolicy;
use csi_claims::driver::{
    ClaimsDriver, ControllerDetacher, DriverConfig, DriverError, NodeDetacher,
};
use csi_claims::machine::{LastError, ReleaseWait, RetriedStep};
use csi_claims::store::{ClaimStore, RedbStore};
use csi_claims::{
    ClaimError, ClaimMode, ClaimState, ControllerDetachRequest, ControllerRequirement,
    ControllerStep, DetachError, DetachRpc, Event, MachineConfig, MemoryStore, NodeDetachRequest,
    NodeStep,
};
use csi_structs::{AccessMode, ErrorClass, PluginId, VolumeId, WorkloadId};
use support::{FakeController, FakeNode, Plugin, info, request, write_claim};

fn config(initial: Duration, max: Duration) -> DriverConfig {
    DriverConfig {
        machine: MachineConfig {
            backoff: BackoffPolicy::new(initial, max).unwrap(),
            ..MachineConfig::with_seed(3)
        },
        ..DriverConfig::default()
    }
}

async fn start(
    plugin: &Arc<Plugin>,
    config: DriverConfig,
) -> (csi_claims::driver::ClaimsHandle, ClaimsDriver) {
    ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::new(FakeNode(Arc::clone(plugin))),
        Arc::new(FakeController(Arc::clone(plugin))),
        config,
    )
    .await
    .unwrap()
}

/// Hang guard only: the paused clock makes real waiting impossible anyway.
async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(24 * 3600), f)
        .await
        .expect("hang guard: the driver did not finish")
}

#[tokio::test(start_paused = true)]
async fn release_calls_unpublish_unstage_then_controller_then_frees() {
    let plugin = Plugin::new();
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    let v = info("v", "p", ControllerRequirement::Required);
    let mut events = claims.subscribe();
    let claim = guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    assert_eq!(claim.state(), &ClaimState::Taken);
    assert!(matches!(
        events.recv().await.unwrap(),
        Event::ClaimDurable { .. }
    ));

    let freed = guard(claims.release_and_wait(&v.id, claim.workload()))
        .await
        .unwrap();
    assert_eq!(
        freed.state().node_step(),
        Some(NodeStep::Detached { unstaged: true })
    );
    assert_eq!(
        freed.state().controller_step(),
        Some(&ControllerStep::Detached)
    );
    let rpcs: Vec<DetachRpc> = plugin.calls().iter().map(|c| c.rpc).collect();
    assert_eq!(
        rpcs,
        [
            DetachRpc::NodeUnpublish,
            DetachRpc::NodeUnstage,
            DetachRpc::ControllerUnpublish
        ]
    );
    assert!(matches!(
        events.recv().await.unwrap(),
        Event::ReleaseDurable { .. }
    ));
    assert!(matches!(events.recv().await.unwrap(), Event::Freed(_)));
    assert!(claims.record(&v.id).is_none());
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn missing_node_plugin_is_retried_with_backoff_until_it_returns() {
    let plugin = Plugin::new();
    plugin.script(DetachRpc::NodeUnpublish, ErrorClass::RetryElsewhere, 2);
    let (claims, driver) = start(
        &plugin,
        config(Duration::from_secs(2), Duration::from_secs(60)),
    )
    .await;
    let v = info("v", "p", ControllerRequirement::Required);
    let a = guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let freed = guard(claims.release_and_wait(&v.id, a.workload()))
        .await
        .unwrap();
    assert!(matches!(freed.state(), ClaimState::Freed(_)));
    let calls = plugin.calls();
    let unpublishes = calls
        .iter()
        .filter(|c| c.rpc == DetachRpc::NodeUnpublish)
        .count();
    assert_eq!(unpublishes, 3, "two failures, then success");
    // Backoff, not a tight loop: at least 2 s + 4 s (less 20 % jitter) of virtual time passed.
    assert!(tokio::time::Instant::now() - started >= Duration::from_millis(4800));
    let first_controller = calls
        .iter()
        .position(|c| c.rpc == DetachRpc::ControllerUnpublish)
        .unwrap();
    let last_node = calls
        .iter()
        .rposition(|c| c.rpc == DetachRpc::NodeUnpublish)
        .unwrap();
    assert!(first_controller > last_node);
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_hears_each_failed_attempt_and_the_recovery() {
    let plugin = Plugin::new();
    plugin.script(DetachRpc::NodeUnpublish, ErrorClass::Retry, 2);
    let (claims, driver) = start(
        &plugin,
        config(Duration::from_secs(2), Duration::from_secs(60)),
    )
    .await;
    let v = info("v", "p", ControllerRequirement::Required);
    let a = guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    let mut events = claims.subscribe();
    let released_at = tokio::time::Instant::now();
    guard(claims.release_and_wait(&v.id, a.workload()))
        .await
        .unwrap();
    let step = RetriedStep::NodeDetach(a.workload().clone());
    let mut failures = Vec::new();
    let mut recovered = None;
    while let Ok(event) = events.try_recv() {
        match event {
            Event::StepFailed(f) => failures.push(f),
            Event::StepRecovered {
                volume,
                step,
                failed_attempts,
            } => recovered = Some((volume, step, failed_attempts)),
            _ => {}
        }
    }
    let seen: Vec<_> = failures
        .iter()
        .map(|f| (&f.volume, &f.step, f.class, f.attempt))
        .collect();
    assert_eq!(
        seen,
        [
            (&v.id, &step, ErrorClass::Retry, 1),
            (&v.id, &step, ErrorClass::Retry, 2)
        ]
    );
    // The retries are due after the backoff's delays: 2 s, then 4 s (less at most 20 %
    // jitter), each counted from the failure before (virtual time: calls take none).
    let first = failures[0].next_retry - released_at;
    let second = failures[1].next_retry - failures[0].next_retry;
    assert!(
        first >= Duration::from_millis(1600) && first <= Duration::from_millis(2000),
        "{first:?}"
    );
    assert!(
        second >= Duration::from_millis(3200) && second <= Duration::from_millis(4010),
        "{second:?}"
    );
    assert_eq!(recovered, Some((v.id.clone(), step, 2)));
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stuck_release_says_why_and_wakes_when_the_plugin_is_back() {
    let plugin = Plugin::new();
    plugin.script(DetachRpc::ControllerUnpublish, ErrorClass::Retry, 1);
    let hour = Duration::from_secs(3600);
    let (claims, driver) = start(&plugin, config(hour, hour)).await;
    let v = info("v", "p", ControllerRequirement::Required);
    let a = guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    claims.release(&v.id, a.workload()).await.unwrap();
    // Wait (bounded) until the controller call has failed.
    let mut status = None;
    for _ in 0..1000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if let Some(s) = claims.stuck().pop() {
            status = Some(s);
            break;
        }
    }
    let status = status.expect("the failed controller call should show as stuck");
    assert_eq!(status.attempts, 1);
    // Backing off, naming the step, until the retry it announces.
    assert_eq!(
        status.pending,
        ReleaseWait::Backoff {
            step: RetriedStep::ControllerDetach(a.workload().clone()),
            until: status.next_retry.expect("a retry is due"),
        }
    );
    assert!(matches!(
        &status.last_error,
        Some(LastError::Detach { error, .. }) if error.class == ErrorClass::Retry
            && error.rpc == DetachRpc::ControllerUnpublish
    ));
    assert!(status.next_retry.is_some());
    assert_eq!(status.claims[0].state().name(), "node_detached");

    let before = tokio::time::Instant::now();
    let mut events = claims.subscribe();
    claims.plugin_available(&PluginId::new("p").unwrap(), None);
    let freed = guard(async {
        loop {
            if let Event::Freed(c) = events.recv().await.unwrap() {
                break c;
            }
        }
    })
    .await;
    assert_eq!(freed.workload(), a.workload());
    assert!(
        tokio::time::Instant::now() - before < hour / 2,
        "woken early, not after the hour-long backoff"
    );
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_bounded_wait_for_a_release_ends_with_where_it_stands() {
    let plugin = Plugin::new();
    // The node plugin keeps failing the unpublish for longer than the caller will wait.
    plugin.script(DetachRpc::NodeUnpublish, ErrorClass::Uncertain, 1000);
    let (claims, driver) = start(
        &plugin,
        config(Duration::from_secs(1), Duration::from_secs(10)),
    )
    .await;
    let v = info("v", "p", ControllerRequirement::Required);
    let a = guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let err = guard(claims.release_and_wait_until(&v.id, a.workload(), deadline))
        .await
        .unwrap_err();
    let DriverError::StillReleasing {
        volume,
        workload,
        waited,
        status,
    } = &err
    else {
        panic!("expected StillReleasing, got {err}");
    };
    assert_eq!((volume, workload), (&v.id, a.workload()));
    assert_eq!(*waited, Duration::from_secs(30));
    let status = status.as_deref().expect("the volume is still there");
    assert!(status.attempts >= 1, "{status:?}");
    assert!(matches!(
        &status.last_error,
        Some(LastError::Detach { error, .. }) if error.rpc == DetachRpc::NodeUnpublish
    ));
    let text = err.to_string();
    assert!(
        text.contains("not finished after waiting 30s") && text.contains("NodeUnpublishVolume"),
        "{text}"
    );
    assert_eq!(csi_claims::Error::from(err).class(), ErrorClass::Retry);
    // The release went on: it is still durable and still retried.
    assert!(
        claims.record(&v.id).unwrap().claims()[0]
            .state()
            .is_releasing()
    );
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn controller_calls_per_plugin_are_bounded() {
    for limit in [1usize, 3] {
        let plugin = Plugin::new();
        *plugin.controller_latency.lock().unwrap() = Duration::from_secs(1);
        let mut cfg = DriverConfig::default();
        cfg.machine.controller_calls_per_plugin = NonZeroUsize::new(limit).unwrap();
        let (claims, driver) = start(&plugin, cfg).await;
        let mut waits = Vec::new();
        for i in 0..6 {
            let v = info(&format!("v{i}"), "p", ControllerRequirement::Required);
            let a = guard(claims.claim(&v, write_claim(&v, "w", "n1")))
                .await
                .unwrap();
            let claims = claims.clone();
            let workload = a.workload().clone();
            waits.push(tokio::spawn(async move {
                claims.release_and_wait(&v.id, &workload).await
            }));
        }
        for w in waits {
            guard(w).await.unwrap().unwrap();
        }
        let (_, most) = *plugin.in_flight.lock().unwrap();
        assert_eq!(
            most, limit,
            "at most {limit} controller calls at once, and the limit is used"
        );
        driver.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn denied_claims_name_volume_mode_and_holders() {
    let plugin = Plugin::new();
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    let v = info("v", "p", ControllerRequirement::NotRequired);
    guard(claims.claim(
        &v,
        request(
            &v,
            "a",
            "n1",
            ClaimMode::Write,
            AccessMode::MultiNodeSingleWriter,
        ),
    ))
    .await
    .unwrap();
    let err = guard(claims.claim(
        &v,
        request(
            &v,
            "b",
            "n2",
            ClaimMode::Write,
            AccessMode::MultiNodeSingleWriter,
        ),
    ))
    .await
    .unwrap_err();
    let DriverError::Claim(ClaimError::Denied(denied)) = &err else {
        panic!("expected a denial, got {err:?}");
    };
    assert_eq!(denied.workload, WorkloadId::new("b").unwrap());
    let text = err.to_string();
    assert!(
        text.contains("volume v")
            && text.contains("write")
            && text.contains("a (write on n1, taken)"),
        "{text}"
    );
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn stopping_the_driver_answers_waiters() {
    let plugin = Plugin::new();
    plugin.script(DetachRpc::NodeUnpublish, ErrorClass::Fatal, 100);
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    let v = info("v", "p", ControllerRequirement::NotRequired);
    let a = guard(claims.claim(
        &v,
        request(
            &v,
            "a",
            "n1",
            ClaimMode::Read,
            AccessMode::MultiNodeReaderOnly,
        ),
    ))
    .await
    .unwrap();
    let waiting = {
        let claims = claims.clone();
        let w = a.workload().clone();
        tokio::spawn(async move { claims.release_and_wait(&v.id, &w).await })
    };
    tokio::task::yield_now().await;
    driver.shutdown().await;
    drop(claims);
    assert_eq!(guard(waiting).await.unwrap(), Err(DriverError::Stopped));
}

#[tokio::test(start_paused = true)]
async fn a_call_that_never_answers_is_cut_off_and_retried() {
    let plugin = Plugin::new();
    // The first call (NodeUnpublish) hangs forever.
    *plugin.hang_at.lock().unwrap() = Some(1);
    let mut cfg = config(Duration::from_secs(1), Duration::from_secs(8));
    cfg.call_timeout = Duration::from_secs(30);
    let (claims, driver) = start(&plugin, cfg).await;
    let v = info("v", "p", ControllerRequirement::NotRequired);
    let a = guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let freed = guard(claims.release_and_wait(&v.id, a.workload()))
        .await
        .unwrap();
    assert!(matches!(freed.state(), ClaimState::Freed(_)));
    assert!(tokio::time::Instant::now() - started >= Duration::from_secs(30));
    let unpublishes = plugin
        .calls()
        .iter()
        .filter(|c| c.rpc == DetachRpc::NodeUnpublish)
        .count();
    assert_eq!(unpublishes, 2, "the hung call, then its retry");
    driver.shutdown().await;
}

/// A detacher that, at every call, reads the store and records the claim's durable state.
struct Witness {
    store: Arc<RedbStore>,
    seen: std::sync::Mutex<Vec<(DetachRpc, String, Option<&'static str>)>>,
}

impl Witness {
    async fn see(&self, rpc: DetachRpc, volume: &VolumeId, workload: &WorkloadId) {
        let state = self
            .store
            .load(volume)
            .await
            .unwrap()
            .and_then(|s| s.record.claim(workload).map(|c| c.state().name()));
        self.seen
            .lock()
            .unwrap()
            .push((rpc, workload.to_string(), state));
    }
}

#[async_trait::async_trait]
impl NodeDetacher for Witness {
    async fn node_unpublish(&self, r: &NodeDetachRequest) -> Result<(), DetachError> {
        self.see(DetachRpc::NodeUnpublish, &r.volume, &r.workload)
            .await;
        Ok(())
    }

    async fn node_unstage(&self, r: &NodeDetachRequest) -> Result<(), DetachError> {
        self.see(DetachRpc::NodeUnstage, &r.volume, &r.workload)
            .await;
        Ok(())
    }
}

#[async_trait::async_trait]
impl ControllerDetacher for Witness {
    async fn controller_unpublish(&self, r: &ControllerDetachRequest) -> Result<(), DetachError> {
        self.see(DetachRpc::ControllerUnpublish, &r.volume, &r.workload)
            .await;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn every_call_sees_the_previous_step_durable_in_redb() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(dir.path().join("claims.redb")).unwrap());
    let witness = Arc::new(Witness {
        store: Arc::clone(&store),
        seen: std::sync::Mutex::default(),
    });
    let (claims, driver) = ClaimsDriver::start(
        Arc::clone(&store),
        Arc::clone(&witness),
        Arc::clone(&witness),
        DriverConfig::default(),
    )
    .await
    .unwrap();
    let mut waits = Vec::new();
    for i in 0..4 {
        let v = info(&format!("v{i}"), "p", ControllerRequirement::Required);
        for (w, n) in [("a", "n1"), ("b", "n1"), ("c", "n2")] {
            guard(claims.claim(
                &v,
                request(&v, w, n, ClaimMode::Read, AccessMode::MultiNodeReaderOnly),
            ))
            .await
            .unwrap();
        }
        for w in ["a", "b", "c"] {
            let (claims, id, w) = (claims.clone(), v.id.clone(), WorkloadId::new(w).unwrap());
            waits.push(tokio::spawn(async move {
                claims.release_and_wait(&id, &w).await
            }));
        }
    }
    for w in waits {
        guard(w).await.unwrap().unwrap();
    }
    driver.shutdown().await;
    let seen = witness.seen.lock().unwrap().clone();
    assert!(
        seen.len() >= 4 * (3 + 2 + 2),
        "unpublish x3, unstage x2, controller x2 per volume"
    );
    for (rpc, workload, state) in seen {
        let expected = match rpc {
            DetachRpc::NodeUnpublish | DetachRpc::NodeUnstage => "releasing",
            DetachRpc::ControllerUnpublish => "node_detached",
        };
        assert_eq!(state, Some(expected), "{rpc} for {workload}");
    }
    assert!(store.load_all().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_shutdown_the_store_file_opens_again_at_once() {
    // Writes in flight when the driver stops: shutdown returns once they ended and the
    // driver let go of the store, so the same file opens again (redb allows one open).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.redb");
    for round in 0..5 {
        let store = Arc::new(RedbStore::open(&path).unwrap());
        let plugin = Plugin::new();
        let (claims, driver) = ClaimsDriver::start(
            store,
            Arc::new(FakeNode(Arc::clone(&plugin))),
            Arc::new(FakeController(Arc::clone(&plugin))),
            DriverConfig::default(),
        )
        .await
        .unwrap();
        let mut claiming = Vec::new();
        for i in 0..20 {
            let (claims, v) = (
                claims.clone(),
                info(
                    &format!("r{round}-v{i}"),
                    "p",
                    ControllerRequirement::Required,
                ),
            );
            claiming.push(tokio::spawn(async move {
                claims.claim(&v, write_claim(&v, "w", "n1")).await
            }));
        }
        // Let some of the writes start, then stop in the middle of them.
        tokio::task::yield_now().await;
        driver.shutdown().await;
        let reopened = RedbStore::open(&path);
        assert!(
            reopened.is_ok(),
            "round {round}: {:?}",
            reopened.err().map(|e| e.to_string())
        );
        for c in claiming {
            // Durable, or answered "stopped"; never hung.
            match c.await.unwrap() {
                Ok(_) | Err(DriverError::Stopped) => {}
                Err(other) => panic!("round {round}: {other}"),
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_a_release_that_already_finished_answers_freed() {
    let plugin = Plugin::new();
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    let v = info("v", "p", ControllerRequirement::Required);
    let claim = guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    let first = guard(claims.release_and_wait(&v.id, claim.workload()))
        .await
        .unwrap();
    // Asked again after the release finished (a caller that lost the first answer):
    // the same freed claim, and no call made again.
    let calls = plugin.calls().len();
    let again = guard(claims.release_and_wait(&v.id, claim.workload()))
        .await
        .unwrap();
    assert_eq!(again, first);
    assert!(matches!(again.state(), ClaimState::Freed(_)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let bounded = claims
        .release_and_wait_until(&v.id, claim.workload(), deadline)
        .await
        .unwrap();
    assert_eq!(bounded, first);
    assert_eq!(plugin.calls().len(), calls);
    // A claim that never was is still no claim.
    let never = claims
        .release_and_wait(&v.id, &WorkloadId::new("never").unwrap())
        .await;
    assert!(
        matches!(
            never,
            Err(DriverError::Release(
                csi_claims::ReleaseError::NoSuchClaim { .. }
            ))
        ),
        "{never:?}"
    );
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_memory_of_freed_claims_is_bounded() {
    let plugin = Plugin::new();
    let config = DriverConfig {
        freed_memory: 2,
        ..DriverConfig::default()
    };
    let (claims, driver) = start(&plugin, config).await;
    let mut workloads = Vec::new();
    for i in 0..3 {
        let v = info(&format!("v{i}"), "p", ControllerRequirement::NotRequired);
        let claim = guard(claims.claim(&v, write_claim(&v, "w", "n1")))
            .await
            .unwrap();
        guard(claims.release_and_wait(&v.id, claim.workload()))
            .await
            .unwrap();
        workloads.push((v.id.clone(), claim.workload().clone()));
    }
    // The oldest of three is forgotten; the last two are answered.
    let (oldest, w) = &workloads[0];
    assert!(matches!(
        claims.release_and_wait(oldest, w).await,
        Err(DriverError::Release(
            csi_claims::ReleaseError::NoSuchClaim { .. }
        ))
    ));
    for (v, w) in &workloads[1..] {
        assert!(claims.release_and_wait(v, w).await.is_ok());
    }
    driver.shutdown().await;
}

#[test]
fn log_events_logs_from_its_call_until_the_driver_and_its_handles_are_gone() {
    let lines = csi_testkit::logs::capture(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let plugin = Plugin::new();
            let (claims, driver) = start(&plugin, DriverConfig::default()).await;
            // Subscribed by the call: the events before the future is first polled count.
            let log = claims.log_events();
            let v = info("v", "p", ControllerRequirement::Required);
            let claim = claims.claim(&v, write_claim(&v, "a", "n1")).await.unwrap();
            claims
                .release_and_wait(&v.id, claim.workload())
                .await
                .unwrap();
            driver.shutdown().await;
            drop(claims);
            tokio::time::timeout(Duration::from_secs(30), log)
                .await
                .expect("hang guard: the log ends with the driver");
        });
    });
    let messages: Vec<&str> = ["claim written", "release written", "claim freed"]
        .into_iter()
        .filter(|m| lines.iter().any(|l| l.contains(m)))
        .collect();
    assert_eq!(messages.len(), 3, "{lines:#?}");
    let freed = lines.iter().find(|l| l.contains("claim freed")).unwrap();
    assert!(freed.contains("volume=v workload=a node=n1"), "{freed}");
}

/// Compile-only: the handle's futures can be spawned on a multi-threaded runtime.
#[allow(dead_code)]
fn public_futures_are_send(handle: &csi_claims::driver::ClaimsHandle) {
    fn is_send<T: Send>(_: T) {}
    let v = info("v", "p", ControllerRequirement::NotRequired);
    is_send(handle.claim(
        &v,
        request(
            &v,
            "a",
            "n1",
            ClaimMode::Read,
            AccessMode::MultiNodeReaderOnly,
        ),
    ));
    is_send(handle.release_and_wait(&v.id, &WorkloadId::new("a").unwrap()));
    is_send(handle.release_and_wait_until(
        &v.id,
        &WorkloadId::new("a").unwrap(),
        tokio::time::Instant::now(),
    ));
    is_send(ClaimsDriver::start(
        Arc::new(MemoryStore::new()),
        Arc::new(FakeNode(Plugin::new())),
        Arc::new(FakeController(Plugin::new())),
        DriverConfig::default(),
    ));
}

// ---- claims that wait for releases in their way (`claim_until`) ---------------------------

/// The deadline of a wait meant to be long enough: the paused clock runs the releases to
/// their end well before it.
fn far() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(3600)
}

/// A claim admitted before `deadline` (virtual time) was woken by the claim freed in its way:
/// at the deadline it would have been decided again all the same.
fn woken_before(deadline: tokio::time::Instant) {
    assert!(
        tokio::time::Instant::now() < deadline,
        "woken by the freed claim, not by the deadline"
    );
}

/// Events received so far, in order.
fn drain(events: &mut tokio::sync::broadcast::Receiver<Event>) -> Vec<Event> {
    std::iter::from_fn(|| events.try_recv().ok()).collect()
}

/// Position of the first event `pick` matches.
fn at(events: &[Event], pick: impl Fn(&Event) -> bool) -> usize {
    events
        .iter()
        .position(pick)
        .unwrap_or_else(|| panic!("no such event in {events:?}"))
}

#[tokio::test(start_paused = true)]
async fn a_claim_waits_for_its_own_workload_s_release_and_is_admitted_once_it_is_freed() {
    let plugin = Plugin::new();
    // The release sits in its controller step a while (virtual time).
    *plugin.controller_latency.lock().unwrap() = Duration::from_secs(10);
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    let v = info("v", "p", ControllerRequirement::Required);
    guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    guard(claims.release(&v.id, &WorkloadId::new("a").unwrap()))
        .await
        .unwrap();
    let mut events = claims.subscribe();

    // Refused at once while its release runs, as before ...
    let refused = guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, DriverError::Claim(ClaimError::Denied(d))
            if matches!(d.reason, csi_claims::DenyReason::ReleaseInProgress { .. })),
        "{refused:?}"
    );
    // ... and admitted by the claim that waits for the release.
    let deadline = far();
    let again = guard(claims.claim_until(&v, write_claim(&v, "a", "n1"), None, deadline))
        .await
        .expect("admitted once the earlier claim is freed");
    woken_before(deadline);
    assert_eq!(again.state(), &ClaimState::Taken);
    let seen = drain(&mut events);
    let freed = at(
        &seen,
        |e| matches!(e, Event::Freed(c) if c.workload().as_str() == "a"),
    );
    let durable = at(&seen, |e| matches!(e, Event::ClaimDurable { .. }));
    assert!(freed < durable, "freed, then claimed again: {seen:?}");
    let rpcs: Vec<DetachRpc> = plugin.calls().iter().map(|c| c.rpc).collect();
    assert_eq!(
        rpcs.last(),
        Some(&DetachRpc::ControllerUnpublish),
        "the whole release ran first"
    );
    driver.shutdown().await;
}

/// A driver over a plugin whose controller step takes 10 s (virtual time), so a release sits
/// in it while a claim comes.
async fn slow_controller_driver() -> (Arc<Plugin>, csi_claims::driver::ClaimsHandle, ClaimsDriver) {
    let plugin = Plugin::new();
    *plugin.controller_latency.lock().unwrap() = Duration::from_secs(10);
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    (plugin, claims, driver)
}

/// A write claim of `v` by `workload` on `node`, the volume a multi-node single-writer one.
fn single_writer(
    v: &csi_claims::VolumeInfo,
    workload: &str,
    node: &str,
) -> csi_claims::ClaimRequest {
    request(
        v,
        workload,
        node,
        ClaimMode::Write,
        AccessMode::MultiNodeSingleWriter,
    )
}

#[tokio::test(start_paused = true)]
async fn a_claim_waits_for_the_capacity_another_workload_s_release_gives_back() {
    let (_plugin, claims, driver) = slow_controller_driver().await;
    let v = info("v", "p", ControllerRequirement::Required);
    let single = |w: &str, node: &str| single_writer(&v, w, node);
    guard(claims.claim(&v, single("a", "n1"))).await.unwrap();
    guard(claims.release(&v.id, &WorkloadId::new("a").unwrap()))
        .await
        .unwrap();

    // The one writer slot is a's until a is freed; b waits for it.
    let deadline = far();
    let b = guard(claims.claim_until(&v, single("b", "n2"), None, deadline))
        .await
        .expect("admitted once a's claim is freed");
    woken_before(deadline);
    assert_eq!(b.workload().as_str(), "b");
    let record = claims.record(&v.id).expect("b's claim");
    let holders: Vec<&str> = record
        .claims()
        .iter()
        .map(|c| c.workload().as_str())
        .collect();
    assert_eq!(holders, ["b"]);
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_waits_for_the_attach_limit_a_release_on_the_node_gives_back() {
    let plugin = Plugin::new();
    *plugin.controller_latency.lock().unwrap() = Duration::from_secs(10);
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    let one = std::num::NonZeroU64::new(1);
    let (v1, v2) = (
        info("v1", "p", ControllerRequirement::Required),
        info("v2", "p", ControllerRequirement::Required),
    );
    guard(claims.claim_within(&v1, write_claim(&v1, "a", "n1"), one))
        .await
        .unwrap();
    guard(claims.release(&v1.id, &WorkloadId::new("a").unwrap()))
        .await
        .unwrap();

    let refused = guard(claims.claim_within(&v2, write_claim(&v2, "b", "n1"), one))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, DriverError::Claim(ClaimError::AttachLimit { .. })),
        "{refused:?}"
    );
    let deadline = far();
    guard(claims.claim_until(&v2, write_claim(&v2, "b", "n1"), one, deadline))
        .await
        .expect("admitted once v1 is detached from the node and freed");
    woken_before(deadline);
    assert!(claims.record(&v1.id).is_none());
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_blocker_is_not_releasing_is_refused_at_once() {
    let (_plugin, claims, driver) = slow_controller_driver().await;
    let v = info("v", "p", ControllerRequirement::Required);
    let single = |w: &str, node: &str| single_writer(&v, w, node);
    guard(claims.claim(&v, single("a", "n1"))).await.unwrap();

    // a holds the one writer slot and is not releasing: waiting cannot help. Had it waited,
    // the answer at the deadline would be `WaitedForRelease`.
    let refused = guard(claims.claim_until(&v, single("b", "n2"), None, far()))
        .await
        .unwrap_err();
    let DriverError::Claim(ClaimError::Denied(denied)) = &refused else {
        panic!("refused at once with the denial, got {refused:?}");
    };
    assert_eq!(
        denied.reason,
        csi_claims::DenyReason::WritersExhausted { max: 1 }
    );

    // Another workload's release beside a's held writer does not change that.
    guard(claims.claim(
        &v,
        request(
            &v,
            "r",
            "n3",
            ClaimMode::Read,
            AccessMode::MultiNodeSingleWriter,
        ),
    ))
    .await
    .unwrap();
    guard(claims.release(&v.id, &WorkloadId::new("r").unwrap()))
        .await
        .unwrap();
    let refused = guard(claims.claim_until(&v, single("b", "n2"), None, far()))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, DriverError::Claim(ClaimError::Denied(_))),
        "{refused:?}"
    );
    // And a request refused on its own terms is not waited on either.
    let refused = guard(claims.claim_until(
        &v,
        request(
            &v,
            "c",
            "n2",
            ClaimMode::Write,
            AccessMode::SingleNodeWriter,
        ),
        None,
        far(),
    ))
    .await
    .unwrap_err();
    assert!(
        matches!(&refused, DriverError::Claim(ClaimError::Denied(d))
            if matches!(d.reason, csi_claims::DenyReason::AccessModeChange { .. })),
        "{refused:?}"
    );
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_outlasts_the_deadline_is_refused_naming_the_wait() {
    let plugin = Plugin::new();
    // The release's node step keeps failing: it backs off and tries again, for a long time.
    plugin.script(DetachRpc::NodeUnpublish, ErrorClass::Retry, 10_000);
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    let v = info("v", "p", ControllerRequirement::Required);
    guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    guard(claims.release(&v.id, &WorkloadId::new("a").unwrap()))
        .await
        .unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let refused = guard(claims.claim_until(&v, write_claim(&v, "a", "n1"), None, deadline))
        .await
        .unwrap_err();
    let DriverError::WaitedForRelease {
        volume,
        workload,
        waited_for,
        refusal,
        ..
    } = &refused
    else {
        panic!("expected a refusal after waiting, got {refused:?}");
    };
    assert_eq!((volume.as_str(), workload.as_str()), ("v", "a"));
    let waited: Vec<&str> = waited_for.iter().map(|c| c.workload().as_str()).collect();
    assert_eq!(waited, ["a"]);
    assert!(
        matches!(&**refusal, ClaimError::Denied(d)
            if matches!(d.reason, csi_claims::DenyReason::ReleaseInProgress { .. })),
        "{refusal:?}"
    );
    assert_eq!(refused.claim_refusal(), Some(&**refusal));
    assert_eq!(
        csi_claims::Error::from(refused.clone()).class(),
        ErrorClass::Retry,
        "the refusal's class"
    );
    let text = refused.to_string();
    for part in [
        "earlier claim is being released",
        "the claim of workload a on volume v waited",
        "for the release of workload a on volume v (write on n1, releasing)",
    ] {
        assert!(text.contains(part), "{part:?} missing in {text}");
    }
    // Nothing was recorded for the refused claim; the release goes on.
    let record = claims.record(&v.id).expect("a's claim, releasing");
    assert_eq!(record.claims().len(), 1);
    assert!(record.claims()[0].state().is_releasing());
    driver.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_waiting_claim_hears_the_driver_stop() {
    let plugin = Plugin::new();
    plugin.script(DetachRpc::NodeUnpublish, ErrorClass::Retry, 10_000);
    let (claims, driver) = start(&plugin, DriverConfig::default()).await;
    let v = info("v", "p", ControllerRequirement::Required);
    guard(claims.claim(&v, write_claim(&v, "a", "n1")))
        .await
        .unwrap();
    guard(claims.release(&v.id, &WorkloadId::new("a").unwrap()))
        .await
        .unwrap();
    let deadline = far();
    let waiting = {
        let claims = claims.clone();
        let v = v.clone();
        tokio::spawn(async move {
            claims
                .claim_until(&v, write_claim(&v, "a", "n1"), None, deadline)
                .await
        })
    };
    tokio::task::yield_now().await;
    driver.shutdown().await;
    assert_eq!(guard(waiting).await.unwrap(), Err(DriverError::Stopped));
    woken_before(deadline);
}
