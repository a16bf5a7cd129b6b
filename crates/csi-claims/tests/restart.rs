//! Crash and restart on the same redb file: the driver is killed (its task aborted, every call
//! in flight dropped) at scripted points in the middle of releases, then started again on the
//! reopened database. Every release completes, no claim is lost, none is freed twice, and no
//! controller detach ever precedes the node detach of the same claim.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_claims::backoff::BackoffPolicy;
use csi_claims::driver::{ClaimsDriver, ClaimsHandle, DriverConfig};
use csi_claims::store::{ClaimStore, RedbStore, StoreError, Stored, Version};
use csi_claims::{
    ClaimMode, ClaimState, ControllerRequirement, DetachRpc, Event, MachineConfig, VolumeInfo,
    VolumeRecord,
};
use csi_structs::{AccessMode, ErrorClass, VolumeId};
use support::{Call, FakeController, FakeNode, Plugin, info, request};
use tokio::sync::{Notify, broadcast};

/// A redb store that announces its `n`-th committed write: the test then kills the driver
/// before (or while) the machine hears of it.
#[derive(Debug)]
struct KillingStore {
    inner: RedbStore,
    writes: AtomicUsize,
    kill_after: Option<usize>,
    killed: Arc<Notify>,
}

#[async_trait::async_trait]
impl ClaimStore for KillingStore {
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
        let result = self.inner.compare_and_swap(volume, expected, new).await;
        if result.is_ok() {
            let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
            if Some(n) == self.kill_after {
                self.killed.notify_one();
            }
        }
        result
    }
}

#[derive(Clone, Copy, Debug)]
enum KillPoint {
    /// The `n`-th detach call never returns, and the process dies during it.
    DuringCall(usize),
    /// The process dies right after the `n`-th store write committed.
    AfterWrite(usize),
}

const CLAIMS: usize = 6;

/// What phase 1 saw acknowledged before the crash.
#[derive(Debug, Default)]
struct Acked {
    claims: HashSet<(String, String)>,
    releases: HashSet<(String, String)>,
}

fn wanted() -> Vec<(
    VolumeInfo,
    &'static str,
    &'static str,
    ClaimMode,
    AccessMode,
)> {
    let shared = info("shared", "p", ControllerRequirement::Required);
    let single = info("single", "p", ControllerRequirement::Required);
    let local = info("local", "q", ControllerRequirement::NotRequired);
    vec![
        (
            shared.clone(),
            "a",
            "n1",
            ClaimMode::Write,
            AccessMode::MultiNodeMultiWriter,
        ),
        (
            shared.clone(),
            "b",
            "n1",
            ClaimMode::Read,
            AccessMode::MultiNodeMultiWriter,
        ),
        (
            shared,
            "c",
            "n2",
            ClaimMode::Write,
            AccessMode::MultiNodeMultiWriter,
        ),
        (
            single,
            "d",
            "n1",
            ClaimMode::Write,
            AccessMode::SingleNodeWriter,
        ),
        (
            local.clone(),
            "e",
            "n2",
            ClaimMode::Read,
            AccessMode::MultiNodeReaderOnly,
        ),
        (
            local,
            "f",
            "n3",
            ClaimMode::Read,
            AccessMode::MultiNodeReaderOnly,
        ),
    ]
}

fn driver_config() -> DriverConfig {
    DriverConfig {
        machine: MachineConfig {
            backoff: BackoffPolicy::new(Duration::from_secs(1), Duration::from_secs(4)).unwrap(),
            ..MachineConfig::with_seed(17)
        },
        ..DriverConfig::default()
    }
}

fn drain_freed(rx: &mut broadcast::Receiver<Event>, freed: &mut HashMap<(String, String), usize>) {
    while let Ok(event) = rx.try_recv() {
        if let Event::Freed(c) = event {
            *freed
                .entry((c.volume().to_string(), c.workload().to_string()))
                .or_default() += 1;
        }
    }
}

async fn start(store: Arc<dyn ClaimStore>, plugin: &Arc<Plugin>) -> (ClaimsHandle, ClaimsDriver) {
    ClaimsDriver::start(
        store,
        Arc::new(FakeNode(Arc::clone(plugin))),
        Arc::new(FakeController(Arc::clone(plugin))),
        driver_config(),
    )
    .await
    .unwrap()
}

/// Runs one crash-and-restart; returns whether the crash point was reached (rather than
/// phase 1 finishing first).
async fn scenario(kill: KillPoint) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.redb");
    let plugin = Plugin::new();
    plugin.script(DetachRpc::NodeUnpublish, ErrorClass::Retry, 1);
    let store_killed = Arc::new(Notify::new());
    let (kill_after, hang_at) = match kill {
        KillPoint::DuringCall(n) => (None, Some(n)),
        KillPoint::AfterWrite(n) => (Some(n), None),
    };
    *plugin.hang_at.lock().unwrap() = hang_at;
    let mut freed: HashMap<(String, String), usize> = HashMap::new();

    // Phase 1: claim, release everything, die somewhere in the middle.
    let store = Arc::new(KillingStore {
        inner: RedbStore::open(&path).unwrap(),
        writes: AtomicUsize::new(0),
        kill_after,
        killed: Arc::clone(&store_killed),
    });
    let (claims, driver) = start(Arc::clone(&store) as Arc<dyn ClaimStore>, &plugin).await;
    let mut events = claims.subscribe();
    let acked: Arc<Mutex<Acked>> = Arc::default();
    let work = {
        let claims = claims.clone();
        let acked = Arc::clone(&acked);
        tokio::spawn(async move {
            for (v, w, n, mode, access) in wanted() {
                let claim = claims
                    .claim(&v, request(&v, w, n, mode, access))
                    .await
                    .unwrap();
                acked
                    .lock()
                    .unwrap()
                    .claims
                    .insert((v.id.to_string(), w.to_owned()));
                claims.release(&v.id, claim.workload()).await.unwrap();
                acked
                    .lock()
                    .unwrap()
                    .releases
                    .insert((v.id.to_string(), w.to_owned()));
            }
        })
    };
    let all_freed = async {
        while freed.values().sum::<usize>() < CLAIMS {
            if let Ok(Event::Freed(c)) = events.recv().await {
                *freed
                    .entry((c.volume().to_string(), c.workload().to_string()))
                    .or_default() += 1;
            }
        }
    };
    let died = tokio::time::timeout(Duration::from_secs(3600), async {
        tokio::select! {
            () = plugin.killed.notified() => true,
            () = store_killed.notified() => true,
            () = all_freed => false,
        }
    })
    .await
    .expect("hang guard: phase 1 neither died nor finished");
    work.abort();
    driver.abort();
    drain_freed(&mut events, &mut freed);
    drop(claims);
    drop(events);
    // Calls in flight are aborted; a store write already running on the blocking pool
    // finishes first. Wait (bounded) until nothing holds the database any more.
    let mut store = Some(store);
    for _ in 0..10_000 {
        if store.as_ref().is_some_and(|s| Arc::strong_count(s) == 1) {
            store = None;
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(store.is_none(), "the killed driver still holds the store");

    // Phase 2: a new process on the same file.
    *plugin.hang_at.lock().unwrap() = None;
    let reopened = Arc::new(RedbStore::open(&path).unwrap());
    let (claims, driver) = start(Arc::clone(&reopened) as Arc<dyn ClaimStore>, &plugin).await;
    let mut events = claims.subscribe();
    // The restarted agent releases the claims of workloads that stopped, as it would after
    // any restart. A release that was acknowledged before the crash must not need this.
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    for stored in reopened.load_all().await.unwrap() {
        for claim in stored.record.claims() {
            if claim.state() == &ClaimState::Taken {
                let key = (claim.volume().to_string(), claim.workload().to_string());
                assert!(
                    !acked.releases.contains(&key),
                    "{kill:?}: acknowledged release of {key:?} was lost"
                );
                claims
                    .release(claim.volume(), claim.workload())
                    .await
                    .unwrap();
            }
        }
    }
    let mut done = false;
    for _ in 0..10_000 {
        if reopened.load_all().await.unwrap().is_empty() {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the last events out.
    tokio::time::sleep(Duration::from_millis(10)).await;
    drain_freed(&mut events, &mut freed);
    driver.shutdown().await;
    assert!(
        done,
        "{kill:?}: releases did not complete: {:?}",
        reopened.load_all().await
    );

    let calls = plugin.calls();
    check_calls(kill, &calls, &acked);
    for ((v, w), n) in &freed {
        assert_eq!(*n, 1, "{kill:?}: {w} on {v} freed {n} times");
    }
    assert!(
        freed.len() <= CLAIMS && !freed.is_empty(),
        "{kill:?}: freed events {freed:?}"
    );
    died
}

/// Every claim was node-detached before any controller detach of it, and every claim went
/// through the node step (nothing was dropped without a release).
fn check_calls(kill: KillPoint, calls: &[Call], acked: &Acked) {
    for (v, w) in &acked.claims {
        let (v, w) = (v.as_str(), w.as_str());
        let of = |rpc: DetachRpc| {
            calls
                .iter()
                .enumerate()
                .filter(move |(_, c)| c.rpc == rpc && c.volume == v && c.workload == w)
        };
        let node_ok = of(DetachRpc::NodeUnpublish)
            .find(|(_, c)| c.ok)
            .map(|(i, _)| i);
        let node_ok = node_ok
            .unwrap_or_else(|| panic!("{kill:?}: {w} on {v} never node-detached: {calls:#?}"));
        if let Some((first_controller, _)) = of(DetachRpc::ControllerUnpublish).next() {
            assert!(
                first_controller > node_ok,
                "{kill:?}: controller detach of {w} on {v} before its node detach: {calls:#?}"
            );
        }
    }
    // The volume shared on n1 is unstaged there only once nobody uses it any more, and the
    // controller detaches it from n1 only after that.
    let n1_unstage = calls.iter().position(|c| {
        c.rpc == DetachRpc::NodeUnstage && c.volume == "shared" && c.node == "n1" && c.ok
    });
    let n1_controller = calls.iter().position(|c| {
        c.rpc == DetachRpc::ControllerUnpublish && c.volume == "shared" && c.node == "n1"
    });
    if let (Some(u), Some(c)) = (n1_unstage, n1_controller) {
        assert!(
            u < c,
            "{kill:?}: controller detach from n1 before the unstage there"
        );
    }
    assert!(
        n1_controller.is_some(),
        "{kill:?}: shared volume never detached from n1"
    );
    let local_controller = calls
        .iter()
        .any(|c| c.rpc == DetachRpc::ControllerUnpublish && c.volume == "local");
    assert!(
        !local_controller,
        "{kill:?}: a volume that needs no controller step got one"
    );
}

#[tokio::test(start_paused = true)]
async fn killed_during_detach_calls() {
    for n in 1..=14 {
        assert!(
            scenario(KillPoint::DuringCall(n)).await,
            "call {n} was never made"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn killed_right_after_store_writes() {
    // Claims, release requests and release checkpoints interleave.
    for n in 1..=30 {
        assert!(
            scenario(KillPoint::AfterWrite(n)).await,
            "write {n} was never made"
        );
    }
}
