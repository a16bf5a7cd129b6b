//! [`ClaimsHandle`]: how the rest of the agent talks to the running driver.

use std::collections::HashMap;
use std::sync::Arc;

use csi_structs::{NodeId, PluginId, VolumeId, WorkloadId};
use tokio::sync::{Notify, broadcast, oneshot};

use super::{DutyState, Shared, now};
use crate::duty::Duty;
use crate::machine::{
    ClaimError, Event, ReleaseError, ReleaseMachine, ReleaseStarted, ReleaseStatus,
};
use crate::model::{Claim, ClaimRequest, VolumeInfo, VolumeRecord};

/// Errors of [`ClaimsHandle`] calls.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The claim was refused.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The release was refused.
    #[error(transparent)]
    Release(#[from] ReleaseError),
    /// The claim was recorded in memory but another writer changed the volume's record
    /// before it became durable, and the stored record does not have it. Claim again.
    #[error("claim of workload {workload} on volume {volume} was lost to a concurrent writer")]
    Lost {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
    /// The claim can never be stored: the store refused the volume's record for good (too
    /// large, say); `reason` says why. Claiming again fails the same way.
    #[error("claim of workload {workload} on volume {volume} cannot be stored: {reason}")]
    Refused {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// The store's error.
        reason: String,
    },
    /// [`ClaimsHandle::release_and_wait_until`] reached its deadline before the claim was
    /// freed. Nothing is lost: the release is durable and goes on, retried until it completes
    /// (waiting again, or [`Event::Freed`](crate::Event::Freed), says when); `status` is
    /// where it stood at the deadline.
    #[error(
        "release of workload {workload} on volume {volume} not finished after waiting {waited:?}{}",
        status_summary(status.as_deref())
    )]
    StillReleasing {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// How long the wait lasted.
        waited: std::time::Duration,
        /// The volume's release at the deadline: the step awaited, the attempts and the last
        /// error (`None` when the volume has no record any more).
        status: Option<Box<ReleaseStatus>>,
    },
    /// [`ClaimsHandle::claim_until`] waited for the claims being released in its way until
    /// its deadline, and the claim is still refused: `refusal` is the refusal as it stands
    /// (what [`claim`](ClaimsHandle::claim) answers at once), `waited_for` the releasing
    /// claims still in its way. Nothing was recorded for the claim; those releases go on, and
    /// a claim made once they are freed may be admitted. Its [class](crate::Error::class) is
    /// the refusal's.
    #[error(
        "{refusal}; the claim of workload {workload} on volume {volume} waited {waited:?} for \
         the release of {} to finish, and it has not",
        releasing_claims(waited_for)
    )]
    WaitedForRelease {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// How long the claim waited.
        waited: std::time::Duration,
        /// The releasing claims still in the way at the deadline (on the volume, or, at the
        /// plugin's attach limit, on the plugin's other volumes on the node).
        waited_for: Vec<Claim>,
        /// The refusal at the deadline.
        refusal: Box<ClaimError>,
    },
    /// The claim store failed while the claim or release was being written (its disk, its
    /// database, the network to it): whether it reached the store is unknown. The answer comes
    /// at once, not when the store works again. Ask again once the store works (the same
    /// claim or release is accepted whether or not the first one was stored); meanwhile the
    /// volume's claims and releases are refused with a `StoreUnavailable` error.
    #[error("the {what} of workload {workload} on volume {volume} may not be stored: {reason}")]
    NotStored {
        /// `claim` or `release`.
        what: &'static str,
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// The store's error, as text (it names the store, and the file for redb).
        reason: String,
    },
    /// The driver stopped before the answer came.
    #[error("the claims driver stopped")]
    Stopped,
}

/// `workload a on volume v (write on n1, releasing), ...`: the claims a claim waited for.
fn releasing_claims(claims: &[Claim]) -> String {
    let shown: Vec<String> = claims
        .iter()
        .map(|c| {
            format!(
                "workload {} on volume {} ({} on {}, {})",
                c.workload(),
                c.volume(),
                c.mode(),
                c.node(),
                c.state().name()
            )
        })
        .collect();
    shown.join(", ")
}

/// `; <step> (<n> failed attempts, last: <error>)`, for a release that did not finish in
/// time.
fn status_summary(status: Option<&ReleaseStatus>) -> String {
    status.map_or_else(String::new, |s| format!("; {}", s.progress()))
}

impl DriverError {
    /// The claim layer's refusal of a claim, if this is one: [`DriverError::Claim`], or the
    /// refusal that stood after [`DriverError::WaitedForRelease`]'s wait.
    pub fn claim_refusal(&self) -> Option<&ClaimError> {
        match self {
            DriverError::Claim(refusal) => Some(refusal),
            DriverError::WaitedForRelease { refusal, .. } => Some(refusal),
            _ => None,
        }
    }

    /// Whether the claim store failed ([`DriverError::NotStored`], or a claim or release
    /// refused while the volume waits for the store), rather than the request or a plugin.
    pub fn is_store_failure(&self) -> bool {
        matches!(
            self,
            DriverError::NotStored { .. }
                | DriverError::Claim(ClaimError::StoreUnavailable { .. })
                | DriverError::Release(ReleaseError::StoreUnavailable { .. })
        )
    }
}

type Key = (VolumeId, WorkloadId);

/// How often [`ClaimsHandle::claim`] decides again after losing a race for a volume's record.
const CLAIM_ATTEMPTS: u32 = 6;

/// Callers waiting for a claim to become durable or to be freed.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    durable: HashMap<Key, Vec<oneshot::Sender<Result<Claim, DriverError>>>>,
    released: HashMap<Key, Vec<oneshot::Sender<Result<(), DriverError>>>>,
    freed: HashMap<Key, Vec<oneshot::Sender<Result<Claim, DriverError>>>>,
    /// Claims waiting for claims of a volume to be freed ([`ClaimsHandle::claim_until`]):
    /// woken by any claim of the volume freed, then they decide again.
    blocked: HashMap<VolumeId, Vec<Arc<Notify>>>,
}

impl Waiters {
    pub(crate) fn deliver(&mut self, machine: &ReleaseMachine, event: &Event) {
        match event {
            Event::ClaimDurable { volume, workload } => {
                let key = (volume.clone(), workload.clone());
                let claim = machine
                    .record(volume)
                    .and_then(|r| r.claim(workload))
                    .cloned();
                for tx in self.durable.remove(&key).unwrap_or_default() {
                    let answer = claim.clone().ok_or_else(|| DriverError::Lost {
                        volume: volume.clone(),
                        workload: workload.clone(),
                    });
                    let _ = tx.send(answer);
                }
            }
            Event::ClaimRefused {
                volume,
                workload,
                reason,
            } => {
                let key = (volume.clone(), workload.clone());
                for tx in self.durable.remove(&key).unwrap_or_default() {
                    let _ = tx.send(Err(DriverError::Refused {
                        volume: volume.clone(),
                        workload: workload.clone(),
                        reason: reason.clone(),
                    }));
                }
            }
            Event::ReleaseDurable { volume, workload } => {
                let key = (volume.clone(), workload.clone());
                for tx in self.released.remove(&key).unwrap_or_default() {
                    let _ = tx.send(Ok(()));
                }
            }
            Event::ClaimNotStored {
                volume,
                workload,
                reason,
            } => {
                let key = (volume.clone(), workload.clone());
                let error = not_stored("claim", &key, reason);
                for tx in self.durable.remove(&key).unwrap_or_default() {
                    let _ = tx.send(Err(error.clone()));
                }
            }
            Event::ReleaseNotStored {
                volume,
                workload,
                reason,
            } => {
                // Whoever waits for the release to be written, or for the claim to be
                // freed, hears now: the release may never run.
                let key = (volume.clone(), workload.clone());
                let error = not_stored("release", &key, reason);
                for tx in self.released.remove(&key).unwrap_or_default() {
                    let _ = tx.send(Err(error.clone()));
                }
                for tx in self.freed.remove(&key).unwrap_or_default() {
                    let _ = tx.send(Err(error.clone()));
                }
                // The releasing claim is not shown any more: claims waiting for it decide
                // again.
                self.wake_blocked(volume);
            }
            Event::ClaimLost { volume, workload } => {
                let key = (volume.clone(), workload.clone());
                for tx in self.durable.remove(&key).unwrap_or_default() {
                    let _ = tx.send(Err(DriverError::Lost {
                        volume: volume.clone(),
                        workload: workload.clone(),
                    }));
                }
            }
            Event::Freed(claim) => {
                let key = (claim.volume().clone(), claim.workload().clone());
                for tx in self.freed.remove(&key).unwrap_or_default() {
                    let _ = tx.send(Ok(claim.clone()));
                }
                self.wake_blocked(claim.volume());
            }
            // Progress reports: nobody waits on them (the release goes on by itself).
            Event::StepFailed(_) | Event::StepRecovered { .. } => {}
        }
    }
}

impl Waiters {
    /// Wakes every claim waiting for a claim of `volume` to be freed.
    fn wake_blocked(&mut self, volume: &VolumeId) {
        for waiting in self.blocked.remove(volume).unwrap_or_default() {
            waiting.notify_one();
        }
    }

    /// Wakes every claim waiting for a freed claim: the driver stopped, and they answer so.
    pub(crate) fn wake_all_blocked(&mut self) {
        for (_, waiting) in self.blocked.drain() {
            for w in waiting {
                w.notify_one();
            }
        }
    }
}

/// A claim's wait for the releasing claims in its way ([`ClaimsHandle::claim_until`]): where
/// it is registered, and what it waits for. Dropping it (the claim answered, or its future
/// dropped) takes it out of every list it is in.
struct ReleaseWait {
    shared: Arc<Shared>,
    wake: Arc<Notify>,
    /// The volumes whose freed claims wake it.
    on: Vec<VolumeId>,
    /// The releasing claims in the way at the last refusal (empty: waiting cannot help).
    blockers: Vec<Claim>,
}

impl ReleaseWait {
    fn new(shared: &Arc<Shared>) -> Self {
        Self {
            shared: Arc::clone(shared),
            wake: Arc::new(Notify::new()),
            on: Vec::new(),
            blockers: Vec::new(),
        }
    }

    /// Notes the claims in the way and waits for each of their volumes (the driver's lock
    /// held: a claim freed after the refusal wakes it).
    fn register(&mut self, waiters: &mut Waiters, blockers: Vec<Claim>) {
        for claim in &blockers {
            let volume = claim.volume();
            let list = waiters.blocked.entry(volume.clone()).or_default();
            if !list.iter().any(|w| Arc::ptr_eq(w, &self.wake)) {
                list.push(Arc::clone(&self.wake));
            }
            if !self.on.contains(volume) {
                self.on.push(volume.clone());
            }
        }
        self.blockers = blockers;
    }
}

impl Drop for ReleaseWait {
    fn drop(&mut self) {
        if self.on.is_empty() {
            return;
        }
        let mut state = self.shared.lock();
        for volume in &self.on {
            if let Some(list) = state.waiters.blocked.get_mut(volume) {
                list.retain(|w| !Arc::ptr_eq(w, &self.wake));
                if list.is_empty() {
                    state.waiters.blocked.remove(volume);
                }
            }
        }
    }
}

/// The claims freed last, newest kept: a wait that comes after its release finished is
/// answered with the freed claim.
#[derive(Debug)]
pub(crate) struct Freed {
    limit: usize,
    order: std::collections::VecDeque<Key>,
    claims: HashMap<Key, Claim>,
}

impl Freed {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            order: std::collections::VecDeque::new(),
            claims: HashMap::new(),
        }
    }

    pub(crate) fn remember(&mut self, claim: &Claim) {
        if self.limit == 0 {
            return;
        }
        let key = (claim.volume().clone(), claim.workload().clone());
        if self.claims.insert(key.clone(), claim.clone()).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.limit {
            if let Some(old) = self.order.pop_front() {
                self.claims.remove(&old);
            }
        }
    }

    fn get(&self, volume: &VolumeId, workload: &WorkloadId) -> Option<Claim> {
        self.claims
            .get(&(volume.clone(), workload.clone()))
            .cloned()
    }
}

fn not_stored(what: &'static str, (volume, workload): &Key, reason: &str) -> DriverError {
    DriverError::NotStored {
        what,
        volume: volume.clone(),
        workload: workload.clone(),
        reason: reason.to_owned(),
    }
}

/// A cheap, cloneable handle to a running [`ClaimsDriver`](super::ClaimsDriver).
#[derive(Clone, Debug)]
pub struct ClaimsHandle {
    shared: Arc<Shared>,
}

impl ClaimsHandle {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Claims a volume and returns once the claim is durable (the workload may then use the
    /// volume). Claiming again with the same workload and terms returns the same claim.
    ///
    /// # Errors
    ///
    /// [`DriverError::Claim`] when refused (a denial names the volume, the mode and the
    /// holders), [`DriverError::Lost`] when a concurrent writer won,
    /// [`DriverError::NotStored`] at once when the store fails while writing it,
    /// [`DriverError::Stopped`].
    pub async fn claim(
        &self,
        info: &VolumeInfo,
        request: ClaimRequest,
    ) -> Result<Claim, DriverError> {
        self.claim_within(info, request, None).await
    }

    /// [`claim`](Self::claim) within the plugin's attach limit (`max_volumes_per_node` of
    /// its `NodeGetInfo`, csi-structs' `NodeInfo::max_volumes`): a claim that would attach
    /// the volume on a node where that many of the plugin's volumes hold claims is refused
    /// with [`ClaimError::AttachLimit`], before anything is written. `None`: no limit.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim), and [`DriverError::Claim`] with
    /// [`ClaimError::AttachLimit`].
    pub async fn claim_within(
        &self,
        info: &VolumeInfo,
        request: ClaimRequest,
        attach_limit: Option<std::num::NonZeroU64>,
    ) -> Result<Claim, DriverError> {
        self.claim_attempts(info, &request, attach_limit, None)
            .await
    }

    /// [`claim_within`](Self::claim_within), waiting until `deadline` for the claims being
    /// released that are all that stands in its way, instead of being refused at once.
    ///
    /// When the claim is refused and the only thing in its way is claims whose release has
    /// started (the workload's own earlier claim; other workloads' claims holding the
    /// capacity it needs, such as the one writer slot or the one workload of a single-node
    /// writer volume; a detach of the volume from this node in flight; the plugin's attach
    /// limit held by releasing claims of other volumes), the claim waits for those claims to
    /// be freed ([`Event::Freed`]), decides again, and waits again while it is still only
    /// blocked by releasing claims, all until `deadline`. A refusal that waiting cannot fix
    /// (a claim in the way that is not releasing, a request refused on its own terms) is
    /// answered at once, as [`claim_within`](Self::claim_within) answers it. No polling: the
    /// wait wakes when a claim of a volume in the way is freed.
    ///
    /// The deadline bounds the wait for releases: a claim admitted before it is answered
    /// once it is durable (as [`claim_within`](Self::claim_within) answers), even if that
    /// comes after the deadline. A deadline already passed waits for nothing.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     claims: csi_claims::driver::ClaimsHandle,
    /// #     info: csi_claims::VolumeInfo,
    /// #     request: csi_claims::ClaimRequest,
    /// # ) -> Result<(), csi_claims::driver::DriverError> {
    /// use std::time::Duration;
    ///
    /// // The workload restarted on this node: its earlier claim may still be releasing.
    /// let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    /// let claim = claims.claim_until(&info, request, None, deadline).await?;
    /// # let _ = claim;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`claim_within`](Self::claim_within); and [`DriverError::WaitedForRelease`] when
    /// the claim was still refused at the deadline by releasing claims: the refusal, how long
    /// it waited and the claims it waited for.
    pub async fn claim_until(
        &self,
        info: &VolumeInfo,
        request: ClaimRequest,
        attach_limit: Option<std::num::NonZeroU64>,
        deadline: tokio::time::Instant,
    ) -> Result<Claim, DriverError> {
        let started = tokio::time::Instant::now();
        let mut wait = ReleaseWait::new(&self.shared);
        loop {
            let refusal = match self
                .claim_attempts(info, &request, attach_limit, Some(&mut wait))
                .await
            {
                Err(DriverError::Claim(refusal)) if !wait.blockers.is_empty() => refusal,
                other => return other,
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(if started >= deadline {
                    // Nothing was waited for.
                    DriverError::Claim(refusal)
                } else {
                    DriverError::WaitedForRelease {
                        volume: request.volume.clone(),
                        workload: request.workload.clone(),
                        waited: deadline.saturating_duration_since(started),
                        waited_for: std::mem::take(&mut wait.blockers),
                        refusal: Box::new(refusal),
                    }
                });
            }
            tracing::debug!(volume = %request.volume, workload = %request.workload,
                waiting_for = %releasing_claims(&wait.blockers),
                "claim waits for releasing claims in its way");
            // Woken by a claim of a volume in the way freed (or the driver stopping); at the
            // deadline, decided once more, then answered.
            let _ = tokio::time::timeout_at(deadline, wait.wake.notified()).await;
        }
    }

    /// One claim decided, and decided again after losing a race for the volume's record or
    /// while the record is being read again. With `wait`, a refusal names the releasing
    /// claims in its way there, and the wait is registered for their volumes' freed claims
    /// in the same critical section as the refusal.
    async fn claim_attempts(
        &self,
        info: &VolumeInfo,
        request: &ClaimRequest,
        attach_limit: Option<std::num::NonZeroU64>,
        mut wait: Option<&mut ReleaseWait>,
    ) -> Result<Claim, DriverError> {
        // With a store shared by several agents, another agent may write the volume between
        // this machine's decision and its write; the write is then refused, the volume read
        // again, and the claim decided again on what the store holds (so the answer is the
        // cluster-wide one: a denial, or a claim that is durable).
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self
                .claim_once(info, request, attach_limit, wait.as_deref_mut())
                .await
            {
                Err(DriverError::Lost { .. }) if attempts < CLAIM_ATTEMPTS => {
                    // Other agents are writing the volume: step aside a little longer each
                    // time (10 ms, 20 ms, ...) so that racing claims do not collide again.
                    self.settled(&request.volume).await;
                    tokio::time::sleep(std::time::Duration::from_millis(5 << attempts)).await;
                }
                Err(DriverError::Claim(ClaimError::Reloading { .. }))
                    if attempts < CLAIM_ATTEMPTS =>
                {
                    // A reload in flight settles in one store read; wait for the machine.
                    self.settled(&request.volume).await;
                }
                other => return other,
            }
        }
    }

    /// The driver's state once the volume can take a release: with a store shared by several
    /// agents, the volume's record may be being read again after another agent's write, and a
    /// release waits for that (as a claim does) rather than failing.
    async fn start_release(
        &self,
        volume: &VolumeId,
    ) -> Result<std::sync::MutexGuard<'_, super::State>, DriverError> {
        for _ in 0..CLAIM_ATTEMPTS {
            {
                let state = self.shared.lock();
                if state.stopped {
                    return Err(DriverError::Stopped);
                }
                if !state.machine.is_reloading(volume) {
                    return Ok(state);
                }
            }
            self.settled(volume).await;
        }
        // Still reloading: the machine answers with its `Reloading` error.
        let state = self.shared.lock();
        if state.stopped {
            return Err(DriverError::Stopped);
        }
        Ok(state)
    }

    /// Waits, at most about a second, until the volume's record is not being read again.
    async fn settled(&self, volume: &VolumeId) {
        for _ in 0..100 {
            if !self.shared.lock().machine.is_reloading(volume) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    async fn claim_once(
        &self,
        info: &VolumeInfo,
        request: &ClaimRequest,
        attach_limit: Option<std::num::NonZeroU64>,
        wait: Option<&mut ReleaseWait>,
    ) -> Result<Claim, DriverError> {
        let key = (request.volume.clone(), request.workload.clone());
        let rx = {
            let mut state = self.shared.lock();
            if state.stopped {
                return Err(DriverError::Stopped);
            }
            let decided = state
                .machine
                .claim_within(info, request.clone(), attach_limit, now());
            let admitted = match decided {
                Ok(admitted) => admitted,
                Err(refusal) => {
                    if let Some(wait) = wait {
                        let blockers = state.machine.releases_in_the_way(
                            info,
                            request,
                            attach_limit,
                            &refusal,
                        );
                        wait.register(&mut state.waiters, blockers);
                    }
                    return Err(refusal.into());
                }
            };
            if admitted.durable {
                return Ok(admitted.claim);
            }
            let (tx, rx) = oneshot::channel();
            state.waiters.durable.entry(key).or_default().push(tx);
            rx
        };
        self.shared.wake.notify_one();
        rx.await.map_err(|_| DriverError::Stopped)?
    }

    /// Starts releasing a claim and returns once the release request is durable (a crash can
    /// no longer lose it). The claim keeps its capacity until it is freed ([`Event::Freed`]).
    ///
    /// # Errors
    ///
    /// [`DriverError::Release`] when there is no such claim, [`DriverError::NotStored`] at
    /// once when the store fails while writing it, [`DriverError::Stopped`].
    pub async fn release(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
    ) -> Result<ReleaseStarted, DriverError> {
        let (started, rx) = {
            let mut state = self.start_release(volume).await?;
            let started = state.machine.release(volume, workload, now())?;
            let (tx, rx) = oneshot::channel();
            state
                .waiters
                .released
                .entry((volume.clone(), workload.clone()))
                .or_default()
                .push(tx);
            (started, rx)
        };
        self.shared.wake.notify_one();
        rx.await.map_err(|_| DriverError::Stopped)??;
        Ok(started)
    }

    /// Starts releasing a claim (if not already) and returns the claim once it is freed, in
    /// state [`ClaimState::Freed`](crate::ClaimState::Freed) with how both steps ended. A
    /// claim freed before the call (its release already finished) is answered at once, as
    /// long as it is among the last [`DriverConfig::freed_memory`](super::DriverConfig::freed_memory)
    /// claims freed; one freed longer ago answers [`ReleaseError::NoSuchClaim`], as does a
    /// claim that never was. Each answer says how both steps ended
    /// (`DoneElsewhere` for a step another agent sharing the store performed and this one did
    /// not see end). Waits as long as the release takes (a release is retried until it
    /// completes), and first for a reload of the volume after another agent's write.
    ///
    /// A release that cannot finish (a node plugin that keeps failing the unpublish, say)
    /// makes this wait forever; [`stuck`](Self::stuck) and [`status`](Self::status) show why.
    /// To bound the wait, use [`release_and_wait_until`](Self::release_and_wait_until).
    ///
    /// # Errors
    ///
    /// [`DriverError::Release`] when there is no such claim, or when the volume is still being
    /// read again after several waits (`Reloading`); [`DriverError::NotStored`] when the store
    /// failed while writing the release; [`DriverError::Stopped`].
    pub async fn release_and_wait(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
    ) -> Result<Claim, DriverError> {
        self.release_and_wait_inner(volume, workload, None).await
    }

    /// [`release_and_wait`](Self::release_and_wait), waiting at most until `deadline`.
    ///
    /// # Errors
    ///
    /// As [`release_and_wait`](Self::release_and_wait), and [`DriverError::StillReleasing`]
    /// at the deadline, with where the release stands; the release itself goes on.
    pub async fn release_and_wait_until(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
        deadline: tokio::time::Instant,
    ) -> Result<Claim, DriverError> {
        self.release_and_wait_inner(volume, workload, Some(deadline))
            .await
    }

    async fn release_and_wait_inner(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Claim, DriverError> {
        let started = tokio::time::Instant::now();
        let rx = {
            let mut state = self.start_release(volume).await?;
            match state.machine.release(volume, workload, now()) {
                Ok(_) => {}
                // Freed already: the wait came after the release finished.
                Err(ReleaseError::NoSuchClaim { .. })
                    if let Some(freed) = state.freed.get(volume, workload) =>
                {
                    return Ok(freed);
                }
                Err(e) => return Err(e.into()),
            }
            let (tx, rx) = oneshot::channel();
            state
                .waiters
                .freed
                .entry((volume.clone(), workload.clone()))
                .or_default()
                .push(tx);
            rx
        };
        self.shared.wake.notify_one();
        let Some(deadline) = deadline else {
            return rx.await.map_err(|_| DriverError::Stopped)?;
        };
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(answer) => answer.map_err(|_| DriverError::Stopped)?,
            Err(_) => {
                let mut state = self.shared.lock();
                // This waiter is gone; leave the others.
                if let Some(waiting) = state
                    .waiters
                    .freed
                    .get_mut(&(volume.clone(), workload.clone()))
                {
                    waiting.retain(|tx| !tx.is_closed());
                }
                Err(DriverError::StillReleasing {
                    volume: volume.clone(),
                    workload: workload.clone(),
                    waited: deadline.saturating_duration_since(started),
                    status: state.machine.status(volume).map(Box::new),
                })
            }
        }
    }

    /// Reports a node gone for good; see [`ReleaseMachine::node_gone`].
    pub fn node_gone(&self, node: &NodeId) {
        self.shared.lock().machine.node_gone(node, now());
        self.shared.wake.notify_one();
    }

    /// Reports a node back; see [`ReleaseMachine::node_returned`].
    pub fn node_returned(&self, node: &NodeId) {
        self.shared.lock().machine.node_returned(node, now());
        self.shared.wake.notify_one();
    }

    /// Records that a node reported gone for good came back and unpublished (and, when
    /// `unstaged`, unstaged) the volume of `workload`'s claim itself, and retries the
    /// volume's controller step at once; see [`ReleaseMachine::node_detached_after_return`].
    /// Returns whether the claim was found with its node step skipped and its controller
    /// step still to run.
    pub fn node_detached_after_return(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
        node: &NodeId,
        unstaged: bool,
    ) -> bool {
        let recorded = self.shared.lock().machine.node_detached_after_return(
            volume,
            workload,
            node,
            unstaged,
            now(),
        );
        if recorded {
            self.shared.wake.notify_one();
        }
        recorded
    }

    /// Starts or stops performing controller-side release steps without a fence (see
    /// [`ReleaseMachine::set_controller_duty`]): for one agent, or a duty handed out by other
    /// means than a [`Duty`]. Turning it off also ends a fenced duty held
    /// ([`drop_controller_duty`](Self::drop_controller_duty)); turning it on replaces one.
    pub fn set_controller_duty(&self, on: bool) {
        let mut state = self.shared.lock();
        if on {
            if let DutyState::Held(duty) = &state.duty {
                duty.lapse();
            }
            state.duty = DutyState::Unfenced;
        } else if let DutyState::Held(duty) = &state.duty {
            duty.lapse();
            state.duty = DutyState::Dropped;
        }
        state.machine.set_controller_duty(on, now());
        drop(state);
        self.shared.wake.notify_one();
    }

    /// Starts performing controller-side release steps under `duty` (an election won): each
    /// step checks the duty's local deadline before it starts and after every wait, and the
    /// store compares its fence (see [`crate::duty`]). Every volume is looked at again, and
    /// each step is confirmed against the record the store holds before it is taken.
    pub fn hold_controller_duty(&self, duty: Duty) {
        let mut state = self.shared.lock();
        if let DutyState::Held(old) = &state.duty
            && !old.same_as(&duty)
        {
            old.lapse();
        }
        state.duty = DutyState::Held(duty);
        state.machine.set_controller_duty(true, now());
        drop(state);
        self.shared.wake.notify_one();
    }

    /// The holder of `duty` confirmed its lease again (and extended the duty's deadline): if
    /// a step had found the duty lapsed, controller-side steps start again.
    pub fn controller_duty_confirmed(&self, duty: &Duty) {
        let mut state = self.shared.lock();
        let held = matches!(&state.duty, DutyState::Held(d) if d.same_as(duty));
        if held && duty.holds(now()) && !state.machine.controller_duty() {
            tracing::info!(holder = duty.holder(), fence = %duty.fence(),
                "controller duty confirmed again");
            state.machine.set_controller_duty(true, now());
            drop(state);
            self.shared.wake.notify_one();
        }
    }

    /// Stops performing controller-side release steps under a fenced duty (an election lost or
    /// given up): the duty lapses, so steps about to start do not, and controller-side writes
    /// are refused until another duty is held. Calls already sent are not recalled.
    pub fn drop_controller_duty(&self) {
        let mut state = self.shared.lock();
        if let DutyState::Held(duty) = &state.duty {
            duty.lapse();
        }
        state.duty = DutyState::Dropped;
        state.machine.set_controller_duty(false, now());
        drop(state);
        self.shared.wake.notify_one();
    }

    /// The fenced duty this driver holds, if any (lapsed or not: see [`Duty::holds`]).
    pub fn duty(&self) -> Option<Duty> {
        match &self.shared.lock().duty {
            DutyState::Held(duty) => Some(duty.clone()),
            DutyState::Unfenced | DutyState::Dropped => None,
        }
    }

    /// Whether this driver performs controller-side release steps now.
    pub fn controller_duty(&self) -> bool {
        self.shared.lock().machine.controller_duty()
    }

    /// Why a shared store's watch is broken, while it is (`None`: it works, or the store has
    /// no watch). Meanwhile other agents' changes are not seen; the watch resumes by itself.
    pub fn store_watch_error(&self) -> Option<String> {
        self.shared.lock().store_watch.clone()
    }

    /// Why the claim store fails, while it does: the error of its last failed call (naming
    /// the store, and the file for redb), from the first failure until a call succeeds
    /// again. `None` while it works. Claims and releases meanwhile fail at once with a
    /// [`DriverError::is_store_failure`] error.
    pub fn store_failure(&self) -> Option<String> {
        self.shared.lock().store_failure.clone()
    }

    /// The claims on a volume that are durable: as [`record`](Self::record), without claims
    /// still being written for the first time (shown once the store has them).
    pub fn stored_record(&self, volume: &VolumeId) -> Option<VolumeRecord> {
        self.shared.lock().machine.stored_record(volume)
    }

    /// Reports a plugin available again; see [`ReleaseMachine::plugin_available`].
    pub fn plugin_available(&self, plugin: &PluginId, node: Option<&NodeId>) {
        self.shared
            .lock()
            .machine
            .plugin_available(plugin, node, now());
        self.shared.wake.notify_one();
    }

    /// Where a volume's release stands; see [`ReleaseMachine::status`].
    pub fn status(&self, volume: &VolumeId) -> Option<ReleaseStatus> {
        self.shared.lock().machine.status(volume)
    }

    /// Every volume whose last step or write failed; see [`ReleaseMachine::stuck`].
    pub fn stuck(&self) -> Vec<ReleaseStatus> {
        self.shared.lock().machine.stuck()
    }

    /// The claims on a volume as the machine sees them.
    pub fn record(&self, volume: &VolumeId) -> Option<VolumeRecord> {
        self.shared.lock().machine.record(volume).cloned()
    }

    /// Every event from now on ([`Event::ClaimDurable`], [`Event::ClaimLost`],
    /// [`Event::Freed`], and a release's progress: [`Event::StepFailed`] for each failed
    /// attempt of a step, [`Event::StepRecovered`] when it succeeds again). A receiver that falls more than
    /// [`DriverConfig::event_capacity`](super::DriverConfig::event_capacity) behind misses
    /// the oldest.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// Logs every event from this call on (it subscribes at once; the future it returns
    /// does the logging), one line each ([`Event::log`]), and how many were missed when the
    /// log falls behind; ends once the driver has stopped and every handle is dropped. Drop
    /// it (or select it against a stop signal) to stop sooner.
    pub fn log_events(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut events = self.subscribe();
        async move {
            loop {
                match events.recv().await {
                    Ok(event) => event.log(),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "claim event log fell behind");
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    }
}
