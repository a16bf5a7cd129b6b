//! A claim store whose disk fills up: redb on a backend that fails every write while told to
//! (as a full disk does), then recovers. Claims and releases must fail at once with an error
//! naming the store and its file, never hang, and work again without a restart.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use csi_claims::driver::{ClaimsDriver, ClaimsHandle, DriverConfig, DriverError};
use csi_claims::store::{ClaimStore, RedbStore, StoreError};
use csi_claims::{ClaimError, ControllerRequirement};
use csi_structs::{VolumeId, WorkloadId};
use csi_testkit::disk::DiskFaults;
use support::{FakeController, FakeNode, Plugin, info, write_claim};

/// The switches and the call counter of the disk under a store.
type Disk = DiskFaults;

/// A redb store on `path` on a [`FaultyDisk`](csi_testkit::disk::FaultyDisk), with its
/// switches.
fn store_on_full_disk(path: &Path) -> (RedbStore, Disk) {
    let disk = Disk::default();
    let store =
        RedbStore::with_opener(format!("redb {}", path.display()), disk.opener(path)).unwrap();
    (store, disk)
}

/// Hang guard only: every answer below is expected at once.
async fn guard<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("hang guard: a store failure must be answered, not waited out")
}

/// Retries `attempt` until it returns `Some` (bounded by the hang guard): the store opens its
/// file again on the first call after its wait.
async fn until<T, F: Future<Output = Option<T>>>(mut attempt: impl FnMut() -> F) -> T {
    guard(async {
        loop {
            if let Some(done) = attempt().await {
                return done;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

fn vid(s: &str) -> VolumeId {
    VolumeId::new(s).unwrap()
}

#[tokio::test]
async fn a_full_disk_fails_every_call_at_once_naming_the_file_and_the_store_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.redb");
    let (store, disk) = store_on_full_disk(&path);
    let Disk { full, calls, .. } = disk;
    let file = path.display().to_string();
    let v = info("v1", "p", ControllerRequirement::Required);
    // A record as the machine makes it.
    let mut machine = csi_claims::ReleaseMachine::new(csi_claims::MachineConfig::default());
    let claim = write_claim(&v, "w", "n1");
    machine
        .claim(&v, claim, tokio::time::Instant::now())
        .unwrap();
    let Some(csi_claims::Action::Persist(write)) = machine.poll_action() else {
        panic!("a write is asked for");
    };
    let mut record = write.record.as_deref().cloned().unwrap();
    let before = store
        .compare_and_swap(&v.id, None, Some(&record))
        .await
        .unwrap();

    full.store(true, Ordering::SeqCst);
    let failed = store
        .compare_and_swap(&v.id, before, Some(&record))
        .await
        .unwrap_err();
    let cause = std::error::Error::source(&failed).map(ToString::to_string);
    let text = format!("{failed}: {cause:?}");
    assert!(matches!(failed, StoreError::Redb { .. }), "{text}");
    assert!(failed.is_unavailable());
    assert!(
        failed.to_string().contains(&file) && cause.is_some_and(|c| c.contains("No space left")),
        "{text}"
    );

    // Closed now: every call is refused without touching the disk, naming file and cause.
    let touched = calls.load(Ordering::SeqCst);
    for _ in 0..3 {
        let refused = store.load(&v.id).await.unwrap_err();
        let text = refused.to_string();
        assert!(matches!(refused, StoreError::Unavailable { .. }), "{text}");
        assert!(text.contains(&file) && text.contains("I/O error"), "{text}");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        touched,
        "no disk access while closed"
    );
    assert!(store.database().is_none());

    // Space comes back: the store opens the file again by itself, with what was committed.
    full.store(false, Ordering::SeqCst);
    let stored = until(|| {
        let store = store.clone();
        let id = v.id.clone();
        async move { store.load(&id).await.ok() }
    })
    .await
    .expect("the record written before the failure");
    assert!(store.database().is_some());
    record = stored.record;
    store
        .compare_and_swap(&v.id, Some(stored.version), Some(&record))
        .await
        .expect("writes work again");
}

async fn start(store: RedbStore) -> (ClaimsHandle, ClaimsDriver) {
    let plugin = Plugin::new();
    ClaimsDriver::start(
        Arc::new(store),
        Arc::new(FakeNode(Arc::clone(&plugin))),
        Arc::new(FakeController(plugin)),
        DriverConfig::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn claims_and_releases_fail_fast_while_the_disk_is_full_and_work_again_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.redb");
    let (store, disk) = store_on_full_disk(&path);
    let full = disk.full;
    let file = path.display().to_string();
    let (claims, driver) = start(store).await;
    let held = info("held", "p", ControllerRequirement::Required);
    let writer = |v: &csi_claims::VolumeInfo, w: &str| write_claim(v, w, "n1");
    guard(claims.claim(&held, writer(&held, "a")))
        .await
        .unwrap();
    assert_eq!(claims.store_failure(), None);

    full.store(true, Ordering::SeqCst);
    let fresh = info("fresh", "p", ControllerRequirement::Required);
    let err = guard(claims.claim(&fresh, writer(&fresh, "b")))
        .await
        .unwrap_err();
    assert!(err.is_store_failure(), "{err}");
    let text = err.to_string();
    assert!(
        matches!(err, DriverError::NotStored { what: "claim", .. })
            && text.contains(&file)
            && text.contains("No space left"),
        "{text}"
    );
    // Never shown as taken: nothing of it is in the store.
    assert!(
        claims
            .stored_record(&vid("fresh"))
            .is_none_or(|r| r.claims().is_empty())
    );
    let failure = claims
        .store_failure()
        .expect("the driver knows the store fails");
    assert!(failure.contains(&file), "{failure}");

    // The release of a held claim fails at once too, and the claim stays held.
    let err = guard(claims.release(&vid("held"), &WorkloadId::new("a").unwrap()))
        .await
        .unwrap_err();
    assert!(err.is_store_failure(), "{err}");
    assert!(err.to_string().contains(&file), "{err}");
    // Asked again while the volume waits: refused at once, naming the store.
    let err = guard(claims.claim(&fresh, writer(&fresh, "b")))
        .await
        .unwrap_err();
    assert!(err.is_store_failure(), "{err}");

    // Space comes back: claims work again without a restart.
    full.store(false, Ordering::SeqCst);
    let claimed = until(|| {
        let claims = claims.clone();
        let fresh = fresh.clone();
        async move { claims.claim(&fresh, writer(&fresh, "b")).await.ok() }
    })
    .await;
    assert_eq!(claimed.workload().as_str(), "b");
    assert_eq!(claims.store_failure(), None, "the store works again");
    let held_now = claims.stored_record(&vid("held")).unwrap();
    assert_eq!(held_now.claims()[0].state().name(), "taken");
    let refused = claims
        .claim(&held, writer(&held, "z"))
        .await
        .expect_err("the held claim still holds its single-writer volume");
    assert!(
        matches!(refused, DriverError::Claim(ClaimError::Denied(_))),
        "{refused}"
    );
    driver.shutdown().await;

    // A restart finds exactly the claims that were acknowledged.
    let reopened = RedbStore::open(&path).unwrap();
    let mut stored: Vec<String> = reopened
        .load_all()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|s| {
            s.record
                .claims()
                .iter()
                .map(|c| format!("{}/{}", c.volume(), c.workload()))
                .collect::<Vec<_>>()
        })
        .collect();
    stored.sort();
    assert_eq!(stored, ["fresh/b", "held/a"]);
}

/// A store that never answers while `stalled` is set (a disk that hangs), over a memory store.
#[derive(Debug)]
struct Stalling {
    inner: csi_claims::store::MemoryStore,
    stalled: Arc<AtomicBool>,
}

impl Stalling {
    async fn stall_while_set(&self) {
        while self.stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[async_trait::async_trait]
impl ClaimStore for Stalling {
    async fn load_all(&self) -> Result<Vec<csi_claims::store::Stored>, StoreError> {
        self.stall_while_set().await;
        self.inner.load_all().await
    }

    async fn load(
        &self,
        volume: &VolumeId,
    ) -> Result<Option<csi_claims::store::Stored>, StoreError> {
        self.stall_while_set().await;
        self.inner.load(volume).await
    }

    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<csi_claims::store::Version>,
        record: Option<&csi_claims::VolumeRecord>,
    ) -> Result<Option<csi_claims::store::Version>, StoreError> {
        self.stall_while_set().await;
        self.inner.compare_and_swap(volume, expected, record).await
    }
}

#[tokio::test]
async fn a_store_that_hangs_fails_claims_after_the_store_timeout_and_they_work_once_it_answers() {
    let stalled = Arc::new(AtomicBool::new(false));
    let store = Stalling {
        inner: csi_claims::store::MemoryStore::new(),
        stalled: Arc::clone(&stalled),
    };
    let plugin = Plugin::new();
    let (claims, _driver) = ClaimsDriver::start(
        Arc::new(store),
        Arc::new(FakeNode(Arc::clone(&plugin))),
        Arc::new(FakeController(plugin)),
        DriverConfig {
            store_timeout: Duration::from_millis(50),
            ..DriverConfig::default()
        },
    )
    .await
    .unwrap();
    let v = info("v", "p", ControllerRequirement::Required);
    let writer = |w: &str| write_claim(&v, w, "n1");

    stalled.store(true, Ordering::SeqCst);
    let err = guard(claims.claim(&v, writer("a"))).await.unwrap_err();
    assert!(err.is_store_failure(), "{err}");
    assert!(
        matches!(err, DriverError::NotStored { what: "claim", .. })
            && err.to_string().contains("did not answer within 50ms"),
        "{err}"
    );
    assert!(
        claims.store_failure().is_some(),
        "the driver knows the store fails"
    );

    // The store answers again: the write that was cut off may have happened; the volume is
    // read again, and a claim works.
    stalled.store(false, Ordering::SeqCst);
    let claimed = until(|| {
        let claims = claims.clone();
        let request = writer("a");
        let v = v.clone();
        async move { claims.claim(&v, request).await.ok() }
    })
    .await;
    assert_eq!(claimed.workload().as_str(), "a");
    assert_eq!(claims.store_failure(), None);
}

#[tokio::test]
async fn a_panic_of_redb_s_when_the_store_closes_its_file_stays_inside_the_store() {
    // Found by the crash campaign (seed 24, release build): redb opened a damaged file, then
    // panicked in the write it makes when the database closes, and the panic reached whoever
    // dropped the store.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.redb");
    let (store, disk) = store_on_full_disk(&path);
    assert!(guard(store.load_all()).await.unwrap().is_empty());
    disk.panics.store(true, Ordering::SeqCst);
    let before = disk.calls.load(Ordering::SeqCst);
    drop(store);
    assert!(
        disk.calls.load(Ordering::SeqCst) > before,
        "closing wrote to the file (and so panicked)"
    );
}

/// Waits until the disk has seen more than `syncs` syncs (a commit reached the disk).
async fn synced_past(disk: &Disk, syncs: u64) {
    until(|| async { (disk.syncs.load(Ordering::SeqCst) > syncs).then_some(()) }).await;
}

/// Stalls the disk under a compare-and-swap of a new record of `volume`, started here: returns
/// its task once its commit has reached the disk's sync, where it waits until
/// `disk.stalls` is cleared.
async fn stalled_under(store: &RedbStore, disk: &Disk, volume: &str) -> Swap {
    disk.stalls.store(true, Ordering::SeqCst);
    let before = disk.syncs.load(Ordering::SeqCst);
    let first = swap_new(store, volume);
    synced_past(disk, before).await;
    first
}

/// A compare-and-swap on a task of its own.
type Swap = tokio::task::JoinHandle<Result<Option<csi_claims::Version>, StoreError>>;

/// Starts a compare-and-swap of a new record of `volume` on a task of its own.
fn swap_new(store: &RedbStore, volume: &str) -> Swap {
    let (store, (id, record)) = (store.clone(), support::a_record(volume));
    tokio::spawn(async move { store.compare_and_swap(&id, None, Some(&record)).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_queued_behind_a_commit_share_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let (store, disk) = store_on_full_disk(&dir.path().join("claims.redb"));
    // What one commit alone costs in syncs.
    let before = disk.syncs.load(Ordering::SeqCst);
    guard(swap_new(&store, "alone")).await.unwrap().unwrap();
    let per_commit = disk.syncs.load(Ordering::SeqCst) - before;
    assert!(per_commit >= 1, "a commit syncs");

    // The disk stalls under a first write; 63 more are asked for meanwhile.
    let before = disk.syncs.load(Ordering::SeqCst);
    let first = stalled_under(&store, &disk, "v-first").await;
    let queued: Vec<_> = (0..63)
        .map(|i| swap_new(&store, &format!("v{i}")))
        .collect();
    // Every caller has queued its write (none can be answered while the disk stalls).
    until(|| async { (store.writes_waiting() == 63).then_some(()) }).await;
    disk.stalls.store(false, Ordering::SeqCst);
    guard(first).await.unwrap().unwrap();
    for write in queued {
        assert_eq!(
            guard(write).await.unwrap().unwrap(),
            Some(csi_claims::Version::FIRST)
        );
    }
    // The first commit, then the 63 in one (or, had a few come late, a few more): far
    // fewer than one commit each.
    let commits = (disk.syncs.load(Ordering::SeqCst) - before) / per_commit;
    assert!(commits <= 4, "{commits} commits for 64 writes");
    assert_eq!(store.load_all().await.unwrap().len(), 65);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_write_in_a_batch_is_refused_alone_and_a_stalled_commit_holds_up_no_read() {
    let dir = tempfile::tempdir().unwrap();
    let (store, disk) = store_on_full_disk(&dir.path().join("claims.redb"));
    let (stale_id, stale_record) = support::a_record("stale");
    let stored = store
        .compare_and_swap(&stale_id, None, Some(&stale_record))
        .await
        .unwrap();

    let first = stalled_under(&store, &disk, "first").await;
    // The commit under way holds up no read: the record written before is there.
    let read = guard(store.load(&stale_id)).await.unwrap().unwrap();
    assert_eq!(Some(read.version), stored);
    // A write that believes there is no record, among good ones, in the same batch.
    let stale = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .compare_and_swap(&stale_id, None, Some(&stale_record))
                .await
        })
    };
    let good: Vec<_> = (0..5)
        .map(|i| swap_new(&store, &format!("good{i}")))
        .collect();
    until(|| async { (store.writes_waiting() == 6).then_some(()) }).await;
    disk.stalls.store(false, Ordering::SeqCst);
    guard(first).await.unwrap().unwrap();
    let refused = guard(stale).await.unwrap().unwrap_err();
    assert!(refused.is_conflict(), "{refused}");
    for write in good {
        guard(write)
            .await
            .unwrap()
            .expect("the others of the batch land");
    }
    assert_eq!(store.load_all().await.unwrap().len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_fails_every_write_of_its_batch_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("claims.redb");
    let (store, disk) = store_on_full_disk(&path);
    let records = store.records("node.usage").unwrap();

    let first = stalled_under(&store, &disk, "first").await;
    // A claim and a record of another table queue behind it; then the disk fills up.
    let claim = swap_new(&store, "second");
    let record = {
        let records = records.clone();
        tokio::spawn(async move { records.put("web/db", Some(b"{}".to_vec())).await })
    };
    until(|| async { (store.writes_waiting() == 2).then_some(()) }).await;
    disk.full.store(true, Ordering::SeqCst);
    disk.stalls.store(false, Ordering::SeqCst);
    guard(first)
        .await
        .unwrap()
        .expect("its sync had started before the disk filled");
    let claim = guard(claim).await.unwrap().unwrap_err();
    let record = guard(record).await.unwrap().unwrap_err();
    for failed in [&claim, &record] {
        assert!(failed.is_unavailable(), "{failed}");
        assert!(
            failed.to_string().contains(&path.display().to_string()),
            "{failed}"
        );
    }

    // Space comes back: the store opens the file again; neither write landed.
    disk.full.store(false, Ordering::SeqCst);
    let all = until(|| {
        let store = store.clone();
        async move { store.load_all().await.ok() }
    })
    .await;
    assert_eq!(all.len(), 1, "only the first write landed");
    assert!(records.read_all().unwrap().is_empty());
}

#[tokio::test]
async fn records_of_another_table_are_kept_beside_the_claims_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.redb");
    {
        let store = RedbStore::open(&path).unwrap();
        let refused = store.records("csi_claims.volumes").unwrap_err();
        assert!(
            refused.to_string().contains("csi_claims.volumes"),
            "{refused}"
        );
        assert!(
            refused.is_permanent() && !refused.is_unavailable(),
            "{refused}"
        );
        assert!(store.records("").is_err());
        let records = store.records("node.usage").unwrap();
        assert!(
            records.read_all().unwrap().is_empty(),
            "a table never written is empty"
        );
        records.put("a", Some(b"1".to_vec())).await.unwrap();
        records.put("b", Some(b"2".to_vec())).await.unwrap();
        records.put("a", None).await.unwrap();
        records
            .put_all_blocking(&[("c".to_owned(), b"3".to_vec())])
            .unwrap();
        let (id, record) = support::a_record("v");
        store
            .compare_and_swap(&id, None, Some(&record))
            .await
            .unwrap();
    }
    let store = RedbStore::open(&path).unwrap();
    let records = store.records("node.usage").unwrap();
    assert_eq!(
        records.read_all().unwrap(),
        vec![
            ("b".to_owned(), b"2".to_vec()),
            ("c".to_owned(), b"3".to_vec())
        ]
    );
    assert!(records.name().contains("node.redb") && records.name().contains("node.usage"));
    assert_eq!(
        store.load_all().await.unwrap().len(),
        1,
        "the claims are their own"
    );
}
