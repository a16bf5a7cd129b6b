//! One agent at a time performs the controller-side release steps: a leader key under a lease,
//! held as a fenced [`Duty`].
//!
//! Each agent campaigns with [`EtcdStore::elect_controller_duty`]: it writes
//! `<prefix>/leader/controller-duty` (its name as the value) under a lease of its own, only if
//! the key does not exist (a transaction on `create_revision == 0`). The winner keeps the lease
//! alive and performs the duty ([`ClaimsHandle::hold_controller_duty`]); the others watch the
//! key and campaign again when it is deleted, which etcd does when the winner resigns or its
//! lease expires (a crashed or partitioned agent, within the lease's TTL).
//!
//! The winner holds the duty as a [`Duty`] (see [`crate::duty`] for why both checks are
//! needed):
//! - its **fence** is the duty key at the revision of the winner's put: every controller-side
//!   write, and the confirmation before every controller call, compares it in the same etcd
//!   transaction, so a deposed holder's steps are refused by etcd itself;
//! - its **local deadline** is the time the last confirmed keep-alive was sent, plus the TTL,
//!   minus the margin of [`DutyTiming`]. The driver checks it before each step, after every
//!   wait; a holder paused past it wakes with no right to act until a keep-alive is confirmed
//!   again, which etcd only does if the lease is still alive.
//!
//! The winner gives the duty up as soon as a keep-alive is not confirmed in time (a third of
//! the TTL), and etcd deletes the key when the lease expires. A step already sent may still
//! finish on the old holder; `ControllerUnpublishVolume` is idempotent, and its outcome is
//! recorded by a compare-and-swap write that fails for a writer whose copy is stale, so
//! nothing is recorded twice.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::etcd::EtcdStore;
use crate::driver::ClaimsHandle;
use crate::duty::{Duty, DutyTiming, Fence};

/// The shortest lease etcd grants reliably (its minimum follows the election timeout).
pub const MIN_DUTY_TTL: Duration = Duration::from_secs(2);

/// A running campaign for the controller duty. Dropping it stops campaigning without
/// resigning (as a crash would: the lease runs out); [`resign`](Self::resign) hands the duty
/// over at once.
#[derive(Debug)]
pub struct ControllerElection {
    leader: watch::Receiver<Option<String>>,
    task: Option<JoinHandle<()>>,
    store: EtcdStore,
    lease: Arc<std::sync::Mutex<Option<i64>>>,
    handle: ClaimsHandle,
}

impl ControllerElection {
    /// Who holds the duty now, as far as this agent knows (`None`: nobody, or unknown while the
    /// store is unreachable).
    pub fn leader(&self) -> Option<String> {
        self.leader.borrow().clone()
    }

    /// Changes of [`leader`](Self::leader).
    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.leader.clone()
    }

    /// Stops performing the duty and gives it up at once (the lease is revoked, so another
    /// agent is elected without waiting for the TTL).
    pub async fn resign(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.handle.drop_controller_duty();
        self.store.revoke_taken_lease(&self.lease).await;
    }
}

impl Drop for ControllerElection {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            self.handle.drop_controller_duty();
        }
    }
}

impl EtcdStore {
    /// Campaigns for the controller duty as `name` (the agent's node id, say) with a lease of
    /// `timing`'s TTL (at least [`MIN_DUTY_TTL`]), handing `handle` a fenced [`Duty`] while
    /// this agent holds it. See the [module docs](self).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use csi_claims::duty::DutyTiming;
    /// # use csi_claims::store::EtcdStore;
    /// # async fn run(store: EtcdStore, claims: csi_claims::driver::ClaimsHandle) {
    /// let timing = DutyTiming::new(Duration::from_secs(10)).expect("a 2 s margin fits");
    /// let election = store.elect_controller_duty("node-1", timing, claims);
    /// println!("leader: {:?}", election.leader());
    /// # }
    /// ```
    pub fn elect_controller_duty(
        &self,
        name: impl Into<String>,
        timing: DutyTiming,
        handle: ClaimsHandle,
    ) -> ControllerElection {
        let (tx, rx) = watch::channel(None);
        let lease = Arc::new(std::sync::Mutex::new(None));
        // A longer TTL keeps the margin valid (under a third of the TTL).
        let timing = DutyTiming::with_margin(timing.ttl().max(MIN_DUTY_TTL), timing.margin())
            .unwrap_or(timing);
        let campaign = Campaign {
            store: self.clone(),
            name: name.into(),
            ttl: timing.ttl(),
            timing,
            handle: handle.clone(),
            leader: tx,
            lease: Arc::clone(&lease),
        };
        ControllerElection {
            leader: rx,
            task: Some(tokio::spawn(campaign.run())),
            store: self.clone(),
            lease,
            handle,
        }
    }

    fn duty_key(&self) -> String {
        format!(
            "{}/leader/controller-duty",
            self.config().prefix.trim_end_matches('/')
        )
    }
}

struct Campaign {
    store: EtcdStore,
    name: String,
    ttl: Duration,
    timing: DutyTiming,
    handle: ClaimsHandle,
    leader: watch::Sender<Option<String>>,
    lease: Arc<std::sync::Mutex<Option<i64>>>,
}

enum Round {
    /// Won and held it until the lease could not be confirmed.
    Lost,
    /// Someone else holds it; wait for the key to go, from this revision.
    Follow(i64),
    /// The store failed; back off.
    Failed,
}

impl Campaign {
    async fn run(self) {
        let mut delay = Duration::from_millis(100);
        loop {
            match self.round().await {
                Round::Lost => delay = Duration::from_millis(100),
                Round::Follow(revision) => {
                    delay = Duration::from_millis(100);
                    if !self.follow(revision).await {
                        tokio::time::sleep(delay).await;
                    }
                    continue;
                }
                Round::Failed => {
                    let _ = self.leader.send(None);
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(self.ttl);
        }
    }

    fn limit(&self) -> Duration {
        self.store.config().request_timeout.min(self.ttl / 2)
    }

    /// Grants a lease and tries to take the key with it.
    async fn round(&self) -> Round {
        let limit = self.limit();
        let mut leases = self.store.client().lease_client();
        let ttl_secs = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        // The lease cannot expire before the grant was sent plus its TTL.
        let sent = crate::driver::now();
        let granted = match tokio::time::timeout(limit, leases.grant(ttl_secs, None)).await {
            Ok(Ok(g)) => g,
            _ => return Round::Failed,
        };
        let id = granted.id();
        let key = self.store.duty_key();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                self.name.as_str(),
                Some(PutOptions::new().with_lease(id)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let mut kv = self.store.client().kv_client();
        let answer = tokio::time::timeout(limit, kv.txn(txn)).await;
        let Ok(Ok(answer)) = answer else {
            let _ = tokio::time::timeout(limit, leases.revoke(id)).await;
            return Round::Failed;
        };
        if !answer.succeeded() {
            let _ = tokio::time::timeout(limit, leases.revoke(id)).await;
            let revision = answer.header().map_or(0, |h| h.revision());
            let holder = answer.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(get) => get
                    .kvs()
                    .first()
                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                _ => None,
            });
            let _ = self.leader.send(holder);
            return Round::Follow(revision);
        }
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
        let _ = self.leader.send(Some(self.name.clone()));
        // The key did not exist: the transaction's revision is its creation revision.
        let fence = Fence {
            key,
            revision: answer.header().map_or(0, |h| h.revision()),
        };
        let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        let duty = Duty::new(
            self.name.clone(),
            fence,
            self.timing.deadline(sent, granted_ttl),
        );
        tracing::info!(name = %self.name, lease = id, fence = %duty.fence(),
            "took the controller duty");
        self.handle.hold_controller_duty(duty.clone());
        self.hold(id, &duty).await;
        tracing::warn!(name = %self.name, "gave up the controller duty: lease not confirmed");
        self.handle.drop_controller_duty();
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // If the cluster still has the lease, free the key now rather than at its expiry.
        let _ = tokio::time::timeout(limit, leases.revoke(id)).await;
        let _ = self.leader.send(None);
        Round::Lost
    }

    /// Keeps the lease alive until a keep-alive is not confirmed in time; each confirmed one
    /// extends `duty`'s deadline from the moment it was sent.
    async fn hold(&self, id: i64, duty: &Duty) {
        let limit = self.limit();
        let every = self.ttl / 3;
        let mut leases = self.store.client().lease_client();
        let Ok(Ok((mut keeper, mut answers))) =
            tokio::time::timeout(limit, leases.keep_alive(id)).await
        else {
            return;
        };
        loop {
            tokio::time::sleep(every).await;
            if duty.until().is_none() {
                // The store refused the fence (the key was deleted or taken over behind this
                // agent's back): the lease alone is no duty.
                return;
            }
            let sent = crate::driver::now();
            let confirmed = tokio::time::timeout(every, async {
                keeper.keep_alive().await.ok()?;
                answers.message().await.ok().flatten()
            })
            .await;
            match confirmed {
                Ok(Some(answer)) if answer.ttl() > 0 => {
                    let left = Duration::from_secs(u64::try_from(answer.ttl()).unwrap_or(0));
                    duty.extend(self.timing.deadline(sent, left));
                    self.handle.controller_duty_confirmed(duty);
                }
                _ => return,
            }
        }
    }

    /// Waits for the key to be deleted; `false` when the watch broke.
    async fn follow(&self, revision: i64) -> bool {
        let key = self.store.duty_key();
        let mut watcher = self.store.client().watch_client();
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let Ok(Ok(mut stream)) =
            tokio::time::timeout(self.limit(), watcher.watch(key.as_str(), Some(options))).await
        else {
            return false;
        };
        loop {
            match stream.message().await {
                Ok(Some(response)) => {
                    if response.canceled() {
                        return false;
                    }
                    for event in response.events() {
                        match event.event_type() {
                            EventType::Delete => {
                                let _ = self.leader.send(None);
                                return true;
                            }
                            EventType::Put => {
                                let holder = event
                                    .kv()
                                    .map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
                                let _ = self.leader.send(holder);
                            }
                        }
                    }
                }
                _ => return false,
            }
        }
    }
}
