//! `EtcdStore` against a real etcd (Debian's `etcd-server`), started by the tests on loopback
//! with a temporary data directory and free ports: several drivers (one per "agent") share one
//! store. Run with `cargo test -p csi-claims --features etcd` (needs `etcd` on the PATH).
#![cfg(feature = "etcd")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use csi_claims::driver::{
    ClaimsDriver, ClaimsHandle, ControllerDetacher, DriverConfig, DriverError, NodeDetacher,
};
use csi_claims::duty::DutyTiming;
use csi_claims::store::{Change, Changes, ClaimStore, EtcdStore, EtcdStoreConfig, StoreError};
use csi_claims::{
    ClaimError, ClaimMode, ClaimRequest, ClaimState, ControllerDetachRequest,
    ControllerRequirement, DetachError, Duties, MachineConfig, NodeDetachRequest, VolumeInfo,
};
use csi_structs::{
    AccessMode, AccessTypeKind, ErrorClass, ExternalVolumeId, NodeId, PluginId, PluginNodeId,
    VolumeId, WorkloadId,
};
use csi_testkit::etcd::LocalEtcd;

// ---------------------------------------------------------------------------------------
// etcd on loopback
// ---------------------------------------------------------------------------------------

/// A local etcd (csi-testkit's) and stores on it.
struct Etcd(LocalEtcd);

impl Etcd {
    fn start(n: usize) -> Etcd {
        Etcd(LocalEtcd::start(n).expect("etcd on the PATH (Debian: apt-get install etcd-server)"))
    }

    fn kill(&mut self, i: usize) {
        self.0.kill(i);
    }

    /// Starts a killed member again on its data directory.
    fn restart(&mut self, i: usize) {
        self.0.restart(i).expect("etcd restarts");
    }

    fn endpoints(&self) -> Vec<String> {
        self.0.endpoints()
    }

    fn config(&self, prefix: &str) -> EtcdStoreConfig {
        let mut config = EtcdStoreConfig::new(self.endpoints()).with_prefix(prefix);
        config.request_timeout = Duration::from_secs(2);
        config
    }

    /// A store once the cluster answers (bounded: 30 s).
    async fn store(&self, prefix: &str) -> EtcdStore {
        let store = EtcdStore::connect(self.config(prefix))
            .await
            .expect("connect");
        for _ in 0..300 {
            if store.load_all().await.is_ok() {
                return store;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd did not answer within 30 s");
    }
}

// ---------------------------------------------------------------------------------------
// Agents: a driver per node over one store
// ---------------------------------------------------------------------------------------

/// Detachers that succeed, or hang while `hang` is set (a call in flight when its agent dies).
#[derive(Default)]
struct Plugin {
    hang_controller: AtomicBool,
    /// While set, controller calls fail as retryable (counted in `controller_attempts`).
    fail_controller: AtomicBool,
    /// Every controller call that reached the plugin, failed or not.
    controller_attempts: std::sync::atomic::AtomicUsize,
    controller_calls: std::sync::Mutex<Vec<(String, String)>>,
    node_calls: std::sync::Mutex<Vec<(String, String)>>,
}

#[async_trait]
impl NodeDetacher for Plugin {
    async fn node_unpublish(&self, r: &NodeDetachRequest) -> Result<(), DetachError> {
        self.node_calls
            .lock()
            .unwrap()
            .push((r.volume.to_string(), r.workload.to_string()));
        Ok(())
    }
    async fn node_unstage(&self, _: &NodeDetachRequest) -> Result<(), DetachError> {
        Ok(())
    }
}

#[async_trait]
impl ControllerDetacher for Plugin {
    async fn controller_unpublish(&self, r: &ControllerDetachRequest) -> Result<(), DetachError> {
        self.controller_attempts.fetch_add(1, Ordering::SeqCst);
        while self.hang_controller.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.fail_controller.load(Ordering::SeqCst) {
            return Err(DetachError::new(
                csi_claims::DetachRpc::ControllerUnpublish,
                ErrorClass::Retry,
                "scripted failure",
            ));
        }
        self.controller_calls
            .lock()
            .unwrap()
            .push((r.volume.to_string(), r.workload.to_string()));
        Ok(())
    }
}

struct Agent {
    node: NodeId,
    claims: ClaimsHandle,
    driver: ClaimsDriver,
    plugin: Arc<Plugin>,
}

async fn agent(store: &EtcdStore, node: &str, controller: bool) -> Agent {
    let node = NodeId::new(node).unwrap();
    let plugin = Arc::new(Plugin::default());
    let config = DriverConfig {
        machine: MachineConfig {
            duties: Duties::node(node.clone(), controller),
            ..MachineConfig::with_seed(node.as_str().len() as u64)
        },
        call_timeout: Duration::from_secs(60),
        ..DriverConfig::default()
    };
    let (claims, driver) = ClaimsDriver::start(
        Arc::new(store.clone()),
        Arc::clone(&plugin),
        Arc::clone(&plugin),
        config,
    )
    .await
    .expect("driver starts");
    Agent {
        node,
        claims,
        driver,
        plugin,
    }
}

fn info(volume: &str, controller: ControllerRequirement) -> VolumeInfo {
    VolumeInfo {
        id: VolumeId::new(volume).unwrap(),
        external_id: ExternalVolumeId::new(format!("ext-{volume}")).unwrap(),
        plugin: PluginId::new("plug").unwrap(),
        controller,
    }
}

fn request(
    info: &VolumeInfo,
    node: &NodeId,
    workload: &str,
    mode: ClaimMode,
    access: AccessMode,
) -> ClaimRequest {
    ClaimRequest {
        volume: info.id.clone(),
        workload: WorkloadId::new(workload).unwrap(),
        node: node.clone(),
        plugin_node: PluginNodeId::new(format!("sp-{node}")).unwrap(),
        mode,
        access_mode: access,
        attachment: AccessTypeKind::Mount,
    }
}

/// A write claim of a single-writer volume.
fn writer(info: &VolumeInfo, node: &NodeId, workload: &str) -> ClaimRequest {
    request(
        info,
        node,
        workload,
        ClaimMode::Write,
        AccessMode::SingleNodeWriter,
    )
}

/// Waits (bounded) until `check` holds.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 30 s: {what}");
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_on_a_single_writer_volume_one_wins_every_time() {
    let etcd = Etcd::start(1);
    let store = etcd.store("/race").await;
    // Three agents, each with its own connection; the first also drives controller-side steps.
    let mut agents = Vec::new();
    for (i, node) in ["n0", "n1", "n2"].into_iter().enumerate() {
        let own = EtcdStore::connect(etcd.config("/race")).await.unwrap();
        agents.push(agent(&own, node, i == 0).await);
    }
    let sw = info("sw", ControllerRequirement::Required);
    for round in 0..100 {
        let attempts = agents.iter().map(|a| {
            let claims = a.claims.clone();
            let req = request(
                &sw,
                &a.node,
                &format!("w{round}-{}", a.node),
                ClaimMode::Write,
                AccessMode::SingleNodeWriter,
            );
            let sw = sw.clone();
            tokio::spawn(async move { claims.claim(&sw, req).await })
        });
        let mut results = Vec::new();
        for a in attempts.collect::<Vec<_>>() {
            results.push(a.await.unwrap());
        }
        let winners: Vec<usize> = (0..3).filter(|&i| results[i].is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for (i, r) in results.iter().enumerate() {
            if let Err(e) = r {
                assert!(
                    matches!(e, DriverError::Claim(ClaimError::Denied(_))),
                    "round {round}: agent {i} was refused by the claim accounting, not {e:?}"
                );
            }
        }
        // The winner releases; its node step runs on its agent, the rest on agent 0.
        let w = winners[0];
        let workload = WorkloadId::new(format!("w{round}-{}", agents[w].node)).unwrap();
        let freed = tokio::time::timeout(
            Duration::from_secs(30),
            agents[w].claims.release_and_wait(&sw.id, &workload),
        )
        .await
        .expect("released within 30 s")
        .unwrap();
        assert_eq!(freed.workload(), &workload);
        eventually("every agent sees the volume free", async || {
            agents.iter().all(|a| {
                a.claims
                    .record(&sw.id)
                    .is_none_or(|r| r.claims().is_empty())
            })
        })
        .await;
    }
    // Every controller step ran on agent 0, once per round.
    assert_eq!(agents[0].plugin.controller_calls.lock().unwrap().len(), 100);
    assert!(agents[1].plugin.controller_calls.lock().unwrap().is_empty());
    assert!(store.load_all().await.unwrap().is_empty());

    // Read-only many-node volume: every agent's read claim is admitted.
    let ro = info("ro", ControllerRequirement::NotRequired);
    for a in &agents {
        let req = request(
            &ro,
            &a.node,
            &format!("r-{}", a.node),
            ClaimMode::Read,
            AccessMode::MultiNodeReaderOnly,
        );
        a.claims
            .claim(&ro, req)
            .await
            .expect("read claims are all admitted");
    }
    let stored = store.load(&ro.id).await.unwrap().expect("record");
    assert_eq!(stored.record.claims().len(), 3);
    for a in agents {
        a.driver.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_values_are_named_and_do_not_stop_other_volumes() {
    let etcd = Etcd::start(1);
    let store = etcd.store("/garbage").await;
    let mut kv = store.client().kv_client();
    kv.put("/garbage/claims/bad", "not json", None)
        .await
        .unwrap();
    kv.put("/garbage/claims/no spaces allowed?", "{}", None)
        .await
        .unwrap();
    let a = agent(&store, "n0", true).await;
    let v = info("good", ControllerRequirement::NotRequired);
    a.claims
        .claim(&v, writer(&v, &a.node, "w"))
        .await
        .expect("other volumes work");

    let (records, changes) = store.load_and_watch().await.unwrap();
    assert_eq!(records.len(), 1, "only the good record");
    let mut changes = changes.expect("etcd watches");
    let mut named = Vec::new();
    while let Ok(Some(Change::Undecodable(e))) =
        tokio::time::timeout(Duration::from_millis(500), changes.recv()).await
    {
        named.push(e.to_string());
    }
    assert_eq!(named.len(), 2, "{named:?}");
    assert!(
        named.iter().any(|e| e.contains("/garbage/claims/bad")),
        "{named:?}"
    );
    // A value that goes bad later is reported by the watch, with its key.
    kv.put("/garbage/claims/later", [0xff, 0x00], None)
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), changes.recv()).await {
        Ok(Some(Change::Undecodable(StoreError::Decode { key, .. }))) => {
            assert_eq!(key, "/garbage/claims/later");
        }
        other => panic!("expected the damaged value to be named, got {other:?}"),
    }
    a.driver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_is_named_and_answered_at_once_and_the_release_runs_when_etcd_is_back() {
    let mut etcd = Etcd::start(1);
    let store = etcd.store("/outage").await;
    let a = agent(&store, "n0", true).await;
    let v = info("v", ControllerRequirement::Required);
    let workload = WorkloadId::new("w").unwrap();
    a.claims.claim(&v, writer(&v, &a.node, "w")).await.unwrap();

    etcd.kill(0);
    // A store call names the store and what it was doing.
    let err = store.load(&v.id).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("etcd at http://127.0.0.1:"), "{text}");
    assert!(text.contains("volume v"), "{text}");
    assert_eq!(csi_claims::Error::from(err).class(), ErrorClass::Retry);
    // The release is asked for during the outage: it fails at once, naming the store, and
    // the volume shows as stuck on it.
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        a.claims.release_and_wait(&v.id, &workload),
    )
    .await
    .expect("answered, not waited out")
    .unwrap_err();
    assert!(err.is_store_failure(), "{err}");
    assert!(err.to_string().contains("etcd at"), "{err}");
    assert!(
        a.claims
            .store_failure()
            .is_some_and(|f| f.contains("etcd at"))
    );
    eventually("the stuck volume names the store", async || {
        a.claims.stuck().iter().any(|s| {
            s.last_error
                .as_ref()
                .is_some_and(|e| matches!(e, csi_claims::machine::LastError::Store { detail, .. } if detail.contains("etcd at")))
        })
    })
    .await;
    eventually("the watch reports the outage", async || {
        a.claims.store_watch_error().is_some()
    })
    .await;

    // Once etcd is back, the release asked again is accepted and runs to the end.
    etcd.restart(0);
    let mut freed = None;
    for _ in 0..600 {
        match a.claims.release_and_wait(&v.id, &workload).await {
            Ok(claim) => {
                freed = Some(claim);
                break;
            }
            Err(e) if e.is_store_failure() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let freed = freed.expect("the release finishes within 30 s once etcd is back");
    assert_eq!(a.claims.store_failure(), None);
    assert!(matches!(freed.state(), ClaimState::Freed(_)));
    assert_eq!(a.plugin.controller_calls.lock().unwrap().len(), 1);
    eventually("the watch resumes", async || {
        a.claims.store_watch_error().is_none()
    })
    .await;
    assert!(store.load(&v.id).await.unwrap().is_none());
    a.driver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_cluster_with_one_member_killed_keeps_working() {
    let mut etcd = Etcd::start(3);
    let store = etcd.store("/three").await;
    let a = agent(&store, "n0", true).await;
    let v = info("v", ControllerRequirement::Required);
    a.claims.claim(&v, writer(&v, &a.node, "w1")).await.unwrap();
    etcd.kill(0);
    // Claims and releases go on through the other two members.
    let u = info("u", ControllerRequirement::Required);
    tokio::time::timeout(
        Duration::from_secs(30),
        a.claims.claim(&u, writer(&u, &a.node, "w2")),
    )
    .await
    .expect("claim within 30 s")
    .unwrap();
    for (vol, w) in [(&v, "w1"), (&u, "w2")] {
        tokio::time::timeout(
            Duration::from_secs(30),
            a.claims
                .release_and_wait(&vol.id, &WorkloadId::new(w).unwrap()),
        )
        .await
        .expect("release within 30 s")
        .unwrap();
    }
    assert!(store.load_all().await.unwrap().is_empty());
    a.driver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_agent_driving_a_release_dies_another_takes_over_and_finishes_it() {
    let etcd = Etcd::start(1);
    let store_a = etcd.store("/takeover").await;
    let store_b = EtcdStore::connect(etcd.config("/takeover")).await.unwrap();
    let ttl = DutyTiming::new(Duration::from_secs(2)).unwrap();
    let a = agent(&store_a, "n0", false).await;
    let election_a = store_a.elect_controller_duty("n0", ttl, a.claims.clone());
    eventually("n0 takes the duty", async || a.claims.controller_duty()).await;
    let b = agent(&store_b, "n1", false).await;
    let election_b = store_b.elect_controller_duty("n1", ttl, b.claims.clone());
    eventually("n1 sees n0 lead", async || {
        election_b.leader().as_deref() == Some("n0")
    })
    .await;
    assert!(!b.claims.controller_duty());

    // A claim of n1's workload; n0 will hang in its controller call when released.
    a.plugin.hang_controller.store(true, Ordering::SeqCst);
    let v = info("v", ControllerRequirement::Required);
    let w = WorkloadId::new("w").unwrap();
    b.claims.claim(&v, writer(&v, &b.node, "w")).await.unwrap();
    b.claims.release(&v.id, &w).await.unwrap();
    eventually("n0's controller call is in flight", async || {
        a.claims.status(&v.id).is_some_and(|s| {
            matches!(
                s.pending,
                csi_claims::machine::ReleaseWait::ControllerDetach(_)
            )
        })
    })
    .await;

    // n0 dies: its driver and campaign stop without resigning (the lease runs out).
    a.driver.abort();
    drop(election_a);
    let freed = tokio::time::timeout(
        Duration::from_secs(30),
        b.claims.release_and_wait(&v.id, &w),
    )
    .await
    .expect("n1 finishes the release within 30 s")
    .unwrap();
    assert!(matches!(freed.state(), ClaimState::Freed(_)), "{freed:?}");
    assert!(b.claims.controller_duty(), "n1 took the duty over");
    assert_eq!(election_b.leader().as_deref(), Some("n1"));
    assert_eq!(
        b.plugin.controller_calls.lock().unwrap().as_slice(),
        &[("v".to_owned(), "w".to_owned())],
        "the controller step ran once, on n1"
    );
    assert!(store_b.load(&v.id).await.unwrap().is_none());
    election_b.resign().await;
    assert!(!b.claims.controller_duty());
    b.driver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_duty_key_was_taken_over_is_refused_by_etcd_whatever_its_lease_says() {
    // The holder's lease stays alive and its keep-alives are confirmed: only the fence (the
    // duty key's creation revision, compared in etcd's transaction) can tell it lost the duty.
    let etcd = Etcd::start(1);
    let store_a = etcd.store("/fenced").await;
    let store_b = EtcdStore::connect(etcd.config("/fenced")).await.unwrap();
    let timing = DutyTiming::new(Duration::from_secs(2)).unwrap();
    let a = agent(&store_a, "n0", false).await;
    let election_a = store_a.elect_controller_duty("n0", timing, a.claims.clone());
    eventually("n0 takes the duty", async || a.claims.controller_duty()).await;
    let duty_a = a.claims.duty().expect("n0 holds a fenced duty");
    let b = agent(&store_b, "n1", false).await;
    let election_b = store_b.elect_controller_duty("n1", timing, b.claims.clone());
    eventually("n1 sees n0 lead", async || {
        election_b.leader().as_deref() == Some("n0")
    })
    .await;

    // n0's controller calls fail: the step waits in its backoff.
    a.plugin.fail_controller.store(true, Ordering::SeqCst);
    let v = info("v", ControllerRequirement::Required);
    let w = WorkloadId::new("w").unwrap();
    b.claims.claim(&v, writer(&v, &b.node, "w")).await.unwrap();
    b.claims.release(&v.id, &w).await.unwrap();
    eventually("n0 tried the controller step", async || {
        a.plugin.controller_attempts.load(Ordering::SeqCst) >= 1
    })
    .await;
    // n1's call will hang, so the volume stays at the controller step while n0 retries.
    b.plugin.hang_controller.store(true, Ordering::SeqCst);

    // The duty key goes behind n0's back (an operator, a restore); n1 takes it.
    let mut kv = store_a.client().kv_client();
    kv.delete(duty_a.fence().key.as_str(), None).await.unwrap();
    eventually("n1 takes the duty", async || b.claims.controller_duty()).await;
    let attempts_at_takeover = a.plugin.controller_attempts.load(Ordering::SeqCst);
    a.plugin.fail_controller.store(false, Ordering::SeqCst);
    eventually("n1's controller call is in flight", async || {
        b.plugin.controller_attempts.load(Ordering::SeqCst) >= 1
    })
    .await;

    // n0's next attempt is refused by etcd: its duty ends for good and it campaigns again,
    // following n1. Its clock and lease said it still held the duty.
    eventually(
        "n0 learns from the fence that it lost the duty",
        async || duty_a.until().is_none() && a.claims.duty().is_none(),
    )
    .await;
    eventually("n0 follows n1", async || {
        election_a.leader().as_deref() == Some("n1")
    })
    .await;
    assert!(!a.claims.controller_duty());
    assert_eq!(
        a.plugin.controller_attempts.load(Ordering::SeqCst),
        attempts_at_takeover,
        "no controller call left n0 after the takeover"
    );

    // n1 finishes the release.
    b.plugin.hang_controller.store(false, Ordering::SeqCst);
    let freed = tokio::time::timeout(
        Duration::from_secs(30),
        b.claims.release_and_wait(&v.id, &w),
    )
    .await
    .expect("n1 finishes within 30 s")
    .unwrap();
    assert!(matches!(freed.state(), ClaimState::Freed(_)), "{freed:?}");
    assert!(a.plugin.controller_calls.lock().unwrap().is_empty());
    assert_eq!(
        b.plugin.controller_calls.lock().unwrap().as_slice(),
        &[("v".to_owned(), "w".to_owned())]
    );
    assert_eq!(
        a.plugin.controller_attempts.load(Ordering::SeqCst),
        attempts_at_takeover
    );
    drop(election_a);
    election_b.resign().await;
    a.driver.shutdown().await;
    b.driver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_over_the_value_limit_is_refused_before_it_is_sent() {
    let etcd = Etcd::start(1);
    let default_limit = etcd.store("/large").await;
    let mut config = etcd.config("/large");
    config.max_value_bytes = 2_000;
    let store = EtcdStore::connect(config).await.unwrap();
    let v = info("v", ControllerRequirement::NotRequired);
    let record = readers(&v, 50);
    match store.compare_and_swap(&v.id, None, Some(&record)).await {
        Err(StoreError::TooLarge {
            volume,
            size,
            limit,
        }) => {
            assert_eq!(volume, v.id);
            assert!(size > limit);
            assert_eq!(limit, 2_000);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // Through a driver, a claim that would not fit is refused with the reason, not hung.
    let mut tiny = etcd.config("/large");
    tiny.max_value_bytes = 100;
    let a = agent(&EtcdStore::connect(tiny).await.unwrap(), "n", true).await;
    let u = info("u", ControllerRequirement::NotRequired);
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        a.claims.claim(&u, writer(&u, &a.node, "w")),
    )
    .await
    .expect("answered within 30 s");
    match refused {
        Err(DriverError::Refused { reason, .. }) => {
            assert!(reason.contains("limit is 100"), "{reason}")
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    a.driver.shutdown().await;
    // With the default limit, 2,000 readers on one volume fit in one value.
    let record = readers(&v, 2_000);
    let version = default_limit
        .compare_and_swap(&v.id, None, Some(&record))
        .await
        .unwrap();
    let stored = default_limit.load(&v.id).await.unwrap().unwrap();
    assert_eq!(Some(stored.version), version);
    assert_eq!(stored.record.claims().len(), 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_is_read_even_when_all_of_them_exceed_one_message() {
    let etcd = Etcd::start(1);
    let store = etcd.store("/many").await;
    // 700 volumes (more than one page) of 50 claims each: about 6 MB in all, more than the
    // 4 MiB one gRPC answer may carry by default.
    let mut total = 0;
    for i in 0..700 {
        let v = info(&format!("v{i:03}"), ControllerRequirement::NotRequired);
        let record = readers(&v, 50);
        total += csi_claims::store::encode(&record).unwrap().len();
        store
            .compare_and_swap(&v.id, None, Some(&record))
            .await
            .unwrap();
    }
    assert!(total > 4 << 20, "the records take {total} bytes");
    let all = store.load_all().await.expect("read in pages");
    assert_eq!(all.len(), 700);
    assert!(all.iter().all(|s| s.record.claims().len() == 50));
    let (records, _changes) = store.load_and_watch().await.unwrap();
    assert_eq!(records.len(), 700);
    // An agent starts on them.
    let a = agent(&store, "n0", false).await;
    for i in [0, 511, 512, 699] {
        let v = VolumeId::new(format!("v{i:03}")).unwrap();
        assert_eq!(a.claims.record(&v).map(|r| r.claims().len()), Some(50));
    }
    a.driver.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_catching_up_on_more_than_one_message_of_changes_misses_none() {
    let mut etcd = Etcd::start(3);
    let all = etcd.endpoints();
    let mut only_first = etcd.config("/backlog");
    only_first.endpoints = vec![all[0].clone()];
    // No periodic re-read: the watch alone must bring every change.
    only_first.resync_interval = None;
    let mut the_others = etcd.config("/backlog");
    the_others.endpoints = all[1..].to_vec();
    let _ready = etcd.store("/backlog").await;
    let store_b = EtcdStore::connect(the_others).await.unwrap();
    let a = agent(&EtcdStore::connect(only_first).await.unwrap(), "n0", false).await;

    // While a's member is down, about 6 MB of changes are made: when it is back, a's watch
    // is sent all of them at once.
    etcd.kill(0);
    eventually("a's watch notices", async || {
        a.claims.store_watch_error().is_some()
    })
    .await;
    for i in 0..700 {
        let v = info(&format!("v{i:03}"), ControllerRequirement::NotRequired);
        let record = readers(&v, 50);
        // The first writes may meet the election that follows the kill.
        let mut tries = 0;
        loop {
            match store_b.compare_and_swap(&v.id, None, Some(&record)).await {
                // A conflict: an earlier try was written, its answer lost.
                Ok(_) | Err(StoreError::Conflict { .. }) => break,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("b cannot write: {e}"),
            }
        }
    }
    etcd.restart(0);
    eventually("a sees every volume b wrote", async || {
        (0..700).all(|i| {
            let v = VolumeId::new(format!("v{i:03}")).unwrap();
            a.claims.record(&v).is_some()
        })
    })
    .await;
    a.driver.shutdown().await;
}

/// A record with `n` read claims, as a machine would write it.
fn readers(v: &VolumeInfo, n: usize) -> csi_claims::VolumeRecord {
    let now = tokio::time::Instant::now();
    let mut machine = csi_claims::ReleaseMachine::new(MachineConfig::with_seed(1));
    let node = NodeId::new("n").unwrap();
    for i in 0..n {
        let req = request(
            v,
            &node,
            &format!("reader-{i}"),
            ClaimMode::Read,
            AccessMode::MultiNodeReaderOnly,
        );
        machine.claim(v, req, now).unwrap();
    }
    match machine.poll_action() {
        Some(csi_claims::Action::Persist(p)) => (*p.record.unwrap()).clone(),
        other => panic!("expected a write, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_behind_a_compaction_reads_everything_again() {
    let mut etcd = Etcd::start(3);
    let all = etcd.endpoints();
    // Agent a reaches the cluster through member 0 only; agent b through the other two.
    let mut only_first = etcd.config("/compact");
    only_first.endpoints = vec![all[0].clone()];
    let mut the_others = etcd.config("/compact");
    the_others.endpoints = all[1..].to_vec();
    let _ready = etcd.store("/compact").await;
    let store_b = EtcdStore::connect(the_others).await.unwrap();
    let a = agent(&EtcdStore::connect(only_first).await.unwrap(), "n0", false).await;
    let b = agent(&store_b, "n1", true).await;
    let v = info("v", ControllerRequirement::NotRequired);
    b.claims.claim(&v, writer(&v, &b.node, "w1")).await.unwrap();
    eventually("a sees b's first claim", async || {
        a.claims.record(&v.id).is_some()
    })
    .await;

    // While a's member is down, b writes and the history is compacted past a's watch.
    etcd.kill(0);
    eventually("a's watch notices", async || {
        a.claims.store_watch_error().is_some()
    })
    .await;
    b.claims
        .release_and_wait(&v.id, &WorkloadId::new("w1").unwrap())
        .await
        .unwrap();
    let u = info("u", ControllerRequirement::NotRequired);
    b.claims.claim(&u, writer(&u, &b.node, "w2")).await.unwrap();
    let mut kv = store_b.client().kv_client();
    let now = kv.get("/compact/claims/u", None).await.unwrap();
    let revision = now.header().expect("a header").revision();
    kv.compact(
        revision,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();

    etcd.restart(0);
    eventually("a reads everything again: v freed, u claimed", async || {
        a.claims.record(&v.id).is_none_or(|r| r.claims().is_empty())
            && a.claims
                .record(&u.id)
                .is_some_and(|r| r.claims().len() == 1)
    })
    .await;
    eventually("a's watch is back", async || {
        a.claims.store_watch_error().is_none()
    })
    .await;
    a.driver.shutdown().await;
    b.driver.shutdown().await;
}

/// An etcd store whose watch loses every change of one volume, as etcd releases before
/// 3.4.31 and 3.5.13 can when a compaction meets a slow watcher. Re-reads pass through.
struct LossyWatch {
    inner: EtcdStore,
    lost: VolumeId,
}

#[async_trait]
impl ClaimStore for LossyWatch {
    async fn load_all(&self) -> Result<Vec<csi_claims::store::Stored>, StoreError> {
        self.inner.load_all().await
    }

    async fn load_and_watch(
        &self,
    ) -> Result<(Vec<csi_claims::store::Stored>, Option<Changes>), StoreError> {
        let (records, changes) = self.inner.load_and_watch().await?;
        let mut from = changes.expect("etcd watches");
        let (to, changes) = Changes::channel();
        let lost = self.lost.clone();
        tokio::spawn(async move {
            loop {
                let change = tokio::select! {
                    change = from.recv() => change,
                    () = to.closed() => return,
                };
                match change {
                    None => return,
                    Some(Change::Volume { volume, .. }) if volume == lost => {}
                    Some(change) => {
                        to.note(change);
                    }
                }
            }
        });
        Ok((records, Some(changes)))
    }

    async fn load(
        &self,
        volume: &VolumeId,
    ) -> Result<Option<csi_claims::store::Stored>, StoreError> {
        self.inner.load(volume).await
    }

    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<csi_claims::store::Version>,
        new: Option<&csi_claims::VolumeRecord>,
    ) -> Result<Option<csi_claims::store::Version>, StoreError> {
        self.inner.compare_and_swap(volume, expected, new).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_watch_lost_is_found_by_the_periodic_reread() {
    let etcd = Etcd::start(1);
    let _ready = etcd.store("/lossy").await;
    let v = info("v", ControllerRequirement::Required);
    // The duty holder's watch never reports v; it re-reads every 200 ms.
    let mut config = etcd.config("/lossy");
    config.resync_interval = Some(Duration::from_millis(200));
    let lossy = LossyWatch {
        inner: EtcdStore::connect(config).await.unwrap(),
        lost: v.id.clone(),
    };
    let a_node = NodeId::new("n0").unwrap();
    let a_plugin = Arc::new(Plugin::default());
    let a_config = DriverConfig {
        machine: MachineConfig {
            duties: Duties::node(a_node.clone(), true),
            ..MachineConfig::with_seed(7)
        },
        ..DriverConfig::default()
    };
    let (a_claims, a_driver) = ClaimsDriver::start(
        Arc::new(lossy),
        Arc::clone(&a_plugin),
        Arc::clone(&a_plugin),
        a_config,
    )
    .await
    .unwrap();
    let mut b_config = etcd.config("/lossy");
    b_config.resync_interval = None;
    let b = agent(&EtcdStore::connect(b_config).await.unwrap(), "n1", false).await;

    // b's claim and release of v: the node step is b's, the controller step is a's, and a
    // hears of v only from its re-reads.
    let w = WorkloadId::new("w").unwrap();
    b.claims.claim(&v, writer(&v, &b.node, "w")).await.unwrap();
    let freed = tokio::time::timeout(
        Duration::from_secs(30),
        b.claims.release_and_wait(&v.id, &w),
    )
    .await
    .expect("the release finishes although a's watch lost every change of v")
    .unwrap();
    assert!(matches!(freed.state(), ClaimState::Freed(_)), "{freed:?}");
    assert_eq!(
        a_plugin.controller_calls.lock().unwrap().as_slice(),
        &[("v".to_owned(), "w".to_owned())],
        "the duty holder made the controller call once"
    );
    assert!(a_claims.record(&v.id).is_none_or(|r| r.claims().is_empty()));
    a_driver.shutdown().await;
    b.driver.shutdown().await;
}

// ---------------------------------------------------------------------------------------
// Beside the claims: mirrors and held keys
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_follows_other_agents_writes_and_never_goes_back() {
    let etcd = Etcd::start(1);
    let a = etcd.store("/mirror").await;
    let b = etcd.store("/mirror").await;
    for bad in ["", "claims", "leader", "a/b"] {
        let e = a.mirror(bad).await.expect_err("not a mirror name");
        assert!(e.to_string().contains("one path segment"), "{e}");
    }
    let mirror = a.mirror("things").await.expect("mirror");
    assert!(mirror.is_empty());
    assert_eq!(mirror.key("x"), "/mirror/things/x");
    let mut changes = mirror.subscribe();

    // Another agent's writes arrive through the watch; keys outside the prefix do not.
    let mut kv = b.client().kv_client();
    kv.put("/mirror/things/x", "one", None).await.expect("put");
    kv.put("/mirror/other/x", "elsewhere", None)
        .await
        .expect("put");
    eventually("the mirror sees x", async || {
        mirror.get("x").is_some_and(|e| e.value == b"one")
    })
    .await;
    assert!(changes.has_changed().expect("sender alive"));
    changes.mark_unchanged();
    assert_eq!(mirror.len(), 1);

    // A delete noted at its revision is not undone by an older write arriving late.
    let put = kv.put("/mirror/things/y", "two", None).await.expect("put");
    let put_revision = put.header().expect("header").revision();
    let deleted = kv.delete("/mirror/things/y", None).await.expect("delete");
    let delete_revision = deleted.header().expect("header").revision();
    mirror.note("y", None, delete_revision);
    mirror.note("y", Some((b"two".to_vec(), 0)), put_revision);
    assert!(mirror.get("y").is_none(), "an older write came back");
    // The watch delivers both; y stays deleted, x stays.
    kv.put("/mirror/things/z", "three", None)
        .await
        .expect("put");
    eventually("the watch passes the delete", async || {
        mirror.get("z").is_some()
    })
    .await;
    assert!(mirror.get("y").is_none());
    assert_eq!(mirror.len(), 2);

    let other = b
        .mirror("things")
        .await
        .expect("a second mirror reads everything");
    let names: Vec<String> = other.list().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["x", "z"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_lives_with_its_holder_and_comes_back_after_its_lease_is_lost() {
    let etcd = Etcd::start(1);
    let store = etcd.store("/held").await;
    let members = store.mirror("members").await.expect("mirror");
    let ttl = Duration::from_secs(2);

    let held = store.hold_key(members.key("a"), b"v1".to_vec(), ttl);
    eventually("a is a member", async || members.get("a").is_some()).await;
    let first = members.get("a").expect("a");
    assert_eq!(first.value, b"v1");
    assert_ne!(first.lease, 0, "the key hangs on a lease");
    assert_eq!(
        held.state(),
        csi_claims::store::Held::Held { lease: first.lease }
    );

    held.set(b"v2".to_vec());
    eventually("the new value is written", async || {
        members.get("a").is_some_and(|e| e.value == b"v2")
    })
    .await;

    // The cluster drops the lease (as after an outage longer than the TTL): the holder
    // notices, takes a new lease and writes the key again.
    let mut leases = store.client().lease_client();
    leases.revoke(first.lease).await.expect("revoke");
    eventually("a is written again under a new lease", async || {
        members
            .get("a")
            .is_some_and(|e| e.lease != first.lease && e.value == b"v2")
    })
    .await;

    // Released: gone now. Dropped: gone when the lease runs out.
    held.release().await;
    eventually("a left", async || members.get("a").is_none()).await;
    let dropped = store.hold_key(members.key("b"), b"b".to_vec(), ttl);
    eventually("b is a member", async || members.get("b").is_some()).await;
    drop(dropped);
    eventually("b's lease ran out", async || members.get("b").is_none()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_interleaved_across_agents_answer_freed_and_call_each_step_once() {
    let etcd = Etcd::start(1);
    let store_a = etcd.store("/freed-elsewhere").await;
    let store_b = EtcdStore::connect(etcd.config("/freed-elsewhere"))
        .await
        .unwrap();
    // n0 does its own node steps only; n1 holds the controller duty and frees.
    let a = agent(&store_a, "n0", false).await;
    let b = agent(&store_b, "n1", true).await;
    let v = info("v", ControllerRequirement::Required);
    for round in 0..4 {
        let workloads: Vec<WorkloadId> = (0..30)
            .map(|i| WorkloadId::new(format!("w{round}-{i}")).unwrap())
            .collect();
        for w in &workloads {
            let multi = request(
                &v,
                &a.node,
                w.as_str(),
                ClaimMode::Write,
                AccessMode::MultiNodeMultiWriter,
            );
            a.claims.claim(&v, multi).await.unwrap();
        }
        // All released at once: n0's node steps and n1's controller steps and frees interleave
        // on one record, so n0 often sees a claim vanish before it saw its controller step.
        let waits: Vec<_> = workloads
            .iter()
            .map(|w| {
                let claims = a.claims.clone();
                let (id, w) = (v.id.clone(), w.clone());
                tokio::spawn(async move { claims.release_and_wait(&id, &w).await })
            })
            .collect();
        for wait in waits {
            let freed = tokio::time::timeout(Duration::from_secs(60), wait)
                .await
                .expect("every release ends")
                .expect("no panic")
                .expect("released, with no Reloading error on the way");
            // However much of the release n0 saw, its waiter hears `Freed`.
            let ClaimState::Freed(done) = freed.state() else {
                panic!("not freed: {freed:?}");
            };
            assert_ne!(
                done.node,
                csi_claims::NodeStep::DoneElsewhere,
                "n0 did the node step"
            );
        }
    }
    assert!(store_a.load(&v.id).await.unwrap().is_none());
    // Each call made once: a step's outcome that a refused write carried is written again
    // after the read, not earned again with a second call. (The controller is called for
    // the last claim on the node only: the others skip it, the volume still being used.)
    let node_calls = a.plugin.node_calls.lock().unwrap().clone();
    let controller_calls = b.plugin.controller_calls.lock().unwrap().clone();
    for (who, calls) in [
        ("n0's node", &node_calls),
        ("n1's controller", &controller_calls),
    ] {
        let distinct: std::collections::BTreeSet<_> = calls.iter().collect();
        assert_eq!(
            distinct.len(),
            calls.len(),
            "{who} calls repeated: {calls:?}"
        );
    }
    assert_eq!(node_calls.len(), 120);
    assert!(controller_calls.len() >= 4, "{controller_calls:?}");
    a.driver.shutdown().await;
    b.driver.shutdown().await;
}
