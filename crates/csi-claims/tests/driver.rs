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
