//! A thin tokio driver for the [`ReleaseMachine`]: it performs the machine's actions through
//! the detacher traits and the store, feeds the results back, and sleeps until the next
//! retry deadline or until woken.
//!
//! The loop has the shape of mini-redis's purge task: compute the next deadline from the
//! state, then `select!` over `sleep_until(deadline)`, a [`Notify`] and shutdown. All state
//! sits behind one std `Mutex`, held only for short, non-async sections (feeding an input,
//! draining outputs), never across an `.await`. Each action runs as its own task, so volumes
//! progress concurrently while the machine keeps every per-volume and per-plugin limit.
//!
//! Durability: the machine only asks for a detach call once the volume's last change is
//! written, and a write is only reported once [`ClaimStore::compare_and_swap`] returned, so
//! every checkpoint is durable before the next call.
//!
//! A store shared by several agents (etcd) reports the changes other agents make
//! ([`ClaimStore::load_and_watch`]); the loop feeds each to the machine
//! ([`ReleaseMachine::observed`]), so every agent's view follows the store's, volume by volume,
//! without rescanning the others. Which release steps this agent performs is the machine's
//! [`Duties`](crate::machine::Duties); [`ClaimsHandle::set_controller_duty`] hands the
//! controller-side ones over at run time.
//!
//! Stopping: [`ClaimsDriver::shutdown`] stops the loop; dropping the [`ClaimsDriver`] aborts
//! it and every call in flight. Either way nothing is lost: a restarted driver loads the
//! store and resumes each release at the step its checkpoint names (steps are idempotent).

mod detacher;
mod handle;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, watch};
use tokio::task::{JoinHandle, JoinSet};

pub use detacher::{ControllerDetacher, NodeDetacher};
pub use handle::{ClaimsHandle, DriverError};

use crate::detach::{ControllerDetachRequest, DetachError, DetachRpc, NodeDetachRequest};
use crate::duty::Duty;
use crate::error::error_chain;
use crate::machine::{
    Action, Event, MachineConfig, NotStarted, PersistRequest, ReleaseMachine, ReloadRequest,
};
use crate::store::{Change, Changes, ClaimStore, StoreError};
use csi_structs::{ErrorClass, VolumeId};

use handle::Waiters;

/// How many more store changes one turn of the loop takes after the one that woke it.
const CHANGES_PER_TURN: usize = 256;

/// How the driver runs.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// The machine's configuration (backoff, controller-call limits, jitter seed).
    pub machine: MachineConfig,
    /// A backstop deadline for each detacher call; an expired call counts as
    /// [`ErrorClass::Uncertain`] and is retried. Default: 5 minutes.
    pub call_timeout: Duration,
    /// The longest a claim store read or write may take (a stalled disk, a store that never
    /// answers). Past it the call counts as [`StoreError::TimedOut`]: its outcome is unknown,
    /// so the volume's record is read again before the next write, and whoever waits for it
    /// is answered with the store's failure instead of waiting on. Default: 10 seconds.
    pub store_timeout: Duration,
    /// How many events a slow [`ClaimsHandle::subscribe`] receiver may lag behind. Default 1024.
    pub event_capacity: usize,
    /// How long, after the start, the release steps of a volume wait for its plugin to be
    /// reported available ([`ClaimsHandle::plugin_available`]) before their first attempt
    /// (see [`ReleaseMachine::await_plugins`]): an agent that restarts resumes its releases
    /// once it has found its plugins again, not before. Default zero: no wait.
    pub first_plugin_wait: Duration,
    /// Whether controller steps wait too ([`ReleaseMachine::await_plugins`]) or node steps
    /// only ([`ReleaseMachine::await_node_plugins`]: a member of a cluster, whose controller
    /// steps may call another node's plugin). Default `true`.
    pub first_plugin_wait_controllers: bool,
    /// How many freed claims the driver remembers, so that a wait for a release that has
    /// already finished ([`ClaimsHandle::release_and_wait`]) answers with the freed claim
    /// instead of "no such claim". The oldest are forgotten first. Default 4096.
    pub freed_memory: usize,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            machine: MachineConfig::default(),
            call_timeout: Duration::from_secs(300),
            store_timeout: Duration::from_secs(10),
            event_capacity: 1024,
            first_plugin_wait: Duration::ZERO,
            first_plugin_wait_controllers: true,
            freed_memory: 4096,
        }
    }
}

pub(crate) struct State {
    pub(crate) machine: ReleaseMachine,
    pub(crate) waiters: Waiters,
    /// The claims freed last, for waits that come after the release finished.
    pub(crate) freed: handle::Freed,
    /// Set when the loop ended (shutdown, abort or drop): calls answer
    /// [`DriverError::Stopped`] instead of waiting for a loop that will not come.
    pub(crate) stopped: bool,
    /// Why the shared store's watch is broken, while it is.
    pub(crate) store_watch: Option<String>,
    /// Why the store fails, from its first failed call until one succeeds.
    pub(crate) store_failure: Option<String>,
    /// How this driver holds the controller duty.
    pub(crate) duty: DutyState,
}

/// How a driver holds the controller duty (see [`crate::duty`]).
#[derive(Clone, Debug, Default)]
pub(crate) enum DutyState {
    /// Without a fence: on or off as [`ClaimsHandle::set_controller_duty`] says (one agent,
    /// or a duty handed out by other means).
    #[default]
    Unfenced,
    /// Under a fenced duty: each controller-side step checks it before it starts.
    Held(Duty),
    /// A fenced duty was held and is not any more: controller-side steps are refused.
    Dropped,
}

/// Whether a controller-side step may start now.
enum Gate {
    /// No fence: go.
    Open,
    /// Go, under this duty (the store compares its fence).
    Fenced(Duty),
    /// Do not: this agent does not hold the duty; why.
    Closed(String),
}

impl Shared {
    /// The gate for a controller-side step starting now: checked after every wait, immediately
    /// before the step.
    fn gate(&self) -> Gate {
        let state = self.lock();
        match &state.duty {
            DutyState::Unfenced => Gate::Open,
            DutyState::Held(duty) if duty.holds(now()) => Gate::Fenced(duty.clone()),
            DutyState::Held(duty) => {
                if state.machine.controller_duty() {
                    tracing::warn!(holder = duty.holder(), fence = %duty.fence(),
                        "controller duty lapsed: its local deadline passed without a confirmed \
                         keep-alive; no controller-side step starts until it is confirmed again");
                }
                Gate::Closed(format!(
                    "the local deadline of the controller duty ({}) passed without a confirmed \
                     keep-alive",
                    duty.fence()
                ))
            }
            DutyState::Dropped => Gate::Closed("this agent gave up the controller duty".into()),
        }
    }
}

impl State {
    /// Notes how a store call ended, logging once when the store starts failing and once
    /// when it works again (not once per call or per volume).
    fn note_store<T>(&mut self, result: &Result<T, StoreError>) {
        match result {
            Err(e) if e.is_unavailable() => {
                let detail = error_chain(e);
                if self.store_failure.is_none() {
                    tracing::error!(error = %detail,
                        "claim store failing: claims and releases fail at once with this \
                         error until it works again");
                }
                self.store_failure = Some(detail);
            }
            Err(e) if !e.is_conflict() => {
                // One record, not the store: bounded by the volume's backoff.
                tracing::warn!(error = %error_chain(e), "claim store refused a record");
            }
            _ => {
                if let Some(was) = self.store_failure.take() {
                    tracing::info!(was = %was, "claim store works again");
                }
            }
        }
    }
}

pub(crate) struct Shared {
    state: Mutex<State>,
    pub(crate) wake: Notify,
    pub(crate) events: broadcast::Sender<Event>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic inside the machine, which leaves no half-applied input
        // behind that later inputs could not handle; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

pub(crate) fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// The running release loop. Dropping it aborts the loop and every call in flight (like
/// mini-redis's `DbDropGuard`); [`shutdown`](Self::shutdown) stops it in an orderly way.
#[derive(Debug)]
pub struct ClaimsDriver {
    task: Option<JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl ClaimsDriver {
    /// Loads every record from `store`, then starts the loop on the current tokio runtime.
    /// Releases that were in progress resume at once.
    ///
    /// # Errors
    ///
    /// The store's error when the records cannot be read.
    pub async fn start<S, N, C>(
        store: Arc<S>,
        node: Arc<N>,
        controller: Arc<C>,
        config: DriverConfig,
    ) -> Result<(ClaimsHandle, ClaimsDriver), StoreError>
    where
        S: ClaimStore + ?Sized,
        N: NodeDetacher + ?Sized,
        C: ControllerDetacher + ?Sized,
    {
        let (records, changes) = store.load_and_watch().await?;
        let mut machine = ReleaseMachine::new(config.machine.clone());
        if changes.is_some() {
            machine.follow_store_changes();
        }
        if !config.first_plugin_wait.is_zero() {
            let until = now() + config.first_plugin_wait;
            if config.first_plugin_wait_controllers {
                machine.await_plugins(until);
            } else {
                machine.await_node_plugins(until);
            }
        }
        for stored in records {
            let volume = stored.record.info().id.clone();
            if machine.load(stored).is_err() {
                tracing::warn!(%volume, "claim store returned the volume twice; kept the first");
            }
        }
        let (events, _) = broadcast::channel(config.event_capacity.max(1));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                machine,
                waiters: Waiters::default(),
                freed: handle::Freed::new(config.freed_memory),
                stopped: false,
                store_watch: None,
                store_failure: None,
                duty: DutyState::Unfenced,
            }),
            wake: Notify::new(),
            events,
        });
        let (stop, stopped) = watch::channel(false);
        let runner = Runner {
            shared: Arc::clone(&shared),
            store,
            store_calls: Arc::new(StoreCalls::default()),
            node,
            controller,
            call_timeout: config.call_timeout,
            store_timeout: config.store_timeout,
        };
        let task = tokio::spawn(runner.run(stopped, changes));
        Ok((
            ClaimsHandle::new(shared),
            ClaimsDriver {
                task: Some(task),
                stop,
            },
        ))
    }

    /// Stops the loop and waits for it. Detach calls in flight are dropped (their outcome is
    /// settled by the next start, which repeats the step); store calls in flight are waited
    /// for, up to [`DriverConfig::store_timeout`], since a write cannot be taken back. When it
    /// returns, the driver holds no reference to the store any more: a store the caller does
    /// not hold either is closed (a [`RedbStore`](crate::RedbStore)'s file can be opened
    /// again at once). Only a store call stalled past the timeout still holds it, until it
    /// ends.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Aborts the loop and every call in flight at once, as a crash would.
    pub fn abort(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for ClaimsDriver {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct Runner<S: ?Sized, N: ?Sized, C: ?Sized> {
    shared: Arc<Shared>,
    store: Arc<S>,
    /// Store calls still running in the background (see [`bounded_store`]).
    store_calls: Arc<StoreCalls>,
    node: Arc<N>,
    controller: Arc<C>,
    call_timeout: Duration,
    store_timeout: Duration,
}

impl<S, N, C> Runner<S, N, C>
where
    S: ClaimStore + ?Sized,
    N: NodeDetacher + ?Sized,
    C: ControllerDetacher + ?Sized,
{
    async fn run(self, mut stopped: watch::Receiver<bool>, mut changes: Option<Changes>) {
        // Runs when the loop ends, and also when the task is aborted (the future is dropped).
        let _stop = StopGuard(Arc::clone(&self.shared));
        // Dropping the set (when the loop ends or is aborted) aborts every call in flight.
        let mut calls = JoinSet::new();
        self.turns(&mut stopped, &mut changes, &mut calls).await;
        // An orderly stop: every call is aborted and gone, then the store calls it started
        // finish (a write cannot be taken back), so that the store is let go on return.
        calls.shutdown().await;
        drop(changes);
        self.store_calls.finished(self.store_timeout).await;
    }

    async fn turns(
        &self,
        stopped: &mut watch::Receiver<bool>,
        changes: &mut Option<Changes>,
        calls: &mut JoinSet<()>,
    ) {
        loop {
            let change = async {
                match changes.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            let deadline = self.turn(calls);
            let sleep = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stopped.changed() => break,
                () = self.shared.wake.notified() => {}
                () = sleep => {}
                Some(_) = calls.join_next(), if !calls.is_empty() => {}
                next = change => match next {
                    Some(change) => {
                        self.apply(change);
                        // Take what else waits in the same turn (bounded, so that calls
                        // and timers are not held up by a long burst).
                        if let Some(rx) = changes.as_mut() {
                            for _ in 0..CHANGES_PER_TURN {
                                let Some(change) = rx.try_recv() else { break };
                                self.apply(change);
                            }
                        }
                    }
                    None => {
                        tracing::error!("the claim store's watch ended; other agents' changes \
                            are no longer seen until restart");
                        self.shared.lock().store_watch =
                            Some("the store's watch ended".to_owned());
                        *changes = None;
                    }
                },
            }
        }
    }

    /// Feeds one change of a shared store to the machine.
    fn apply(&self, change: Change) {
        let mut state = self.shared.lock();
        match change {
            Change::Volume {
                volume,
                version,
                record,
            } => state.machine.observed(&volume, version, record, now()),
            Change::Resync { version, records } => {
                let count = records.len();
                let news = state.machine.resync(version, records, now());
                tracing::debug!(version = %version, records = count, news,
                    "claim store read again");
            }
            Change::Undecodable(error) => {
                tracing::error!(error = %error_chain(&error), "claim store: skipped a record");
            }
            Change::Interrupted(error) => {
                let detail = error_chain(&error);
                tracing::warn!(error = %detail, "claim store watch interrupted; resuming");
                state.store_watch = Some(detail);
            }
            Change::Resumed => {
                tracing::info!("claim store watch resumed");
                state.store_watch = None;
            }
        }
    }

    /// One turn: fire due timers, start every action, deliver events; returns the next
    /// deadline.
    fn turn(&self, calls: &mut JoinSet<()>) -> Option<tokio::time::Instant> {
        let mut state = self.shared.lock();
        state.machine.handle_timeout(now());
        while let Some(action) = state.machine.poll_action() {
            self.spawn(calls, action);
        }
        while let Some(event) = state.machine.poll_event() {
            let State {
                machine,
                waiters,
                freed,
                ..
            } = &mut *state;
            if let Event::Freed(claim) = &event {
                freed.remember(claim);
            }
            waiters.deliver(machine, &event);
            let _ = self.shared.events.send(event);
        }
        state.machine.poll_timeout()
    }

    fn spawn(&self, calls: &mut JoinSet<()>, action: Action) {
        let shared = Arc::clone(&self.shared);
        match action {
            Action::Persist(request) => {
                let store = Arc::clone(&self.store);
                let limit = (Arc::clone(&self.store_calls), self.store_timeout);
                calls.spawn(persist(shared, store, request, limit));
            }
            Action::Reload(request) => {
                let store = Arc::clone(&self.store);
                let limit = (Arc::clone(&self.store_calls), self.store_timeout);
                calls.spawn(reload(shared, store, request, limit));
            }
            Action::NodeDetach(request) => {
                let node = Arc::clone(&self.node);
                let limit = self.call_timeout;
                calls.spawn(async move {
                    tracing::debug!(volume = %request.volume, node = %request.node,
                        workload = %request.workload, unstage = request.unstage, "node detach");
                    let result = node_step(&*node, &request, limit).await;
                    if let Err(e) = &result {
                        tracing::warn!(volume = %request.volume, node = %request.node,
                            workload = %request.workload, error = %e, "node detach failed");
                    }
                    shared
                        .lock()
                        .machine
                        .node_detached(request.ticket, result, now());
                    shared.wake.notify_one();
                });
            }
            Action::ControllerDetach(request) => {
                let controller = Arc::clone(&self.controller);
                let store = Arc::clone(&self.store);
                let limits = (
                    self.call_timeout,
                    (Arc::clone(&self.store_calls), self.store_timeout),
                );
                calls.spawn(async move {
                    tracing::debug!(volume = %request.volume, plugin = %request.plugin,
                        plugin_node = %request.plugin_node, "controller detach");
                    let outcome =
                        controller_step(&shared, store, &*controller, &request, limits).await;
                    match &outcome {
                        Ok(Err(e)) => {
                            tracing::warn!(volume = %request.volume, plugin = %request.plugin,
                                workload = %request.workload, error = %e,
                                "controller detach failed");
                        }
                        Err(why) => {
                            tracing::info!(volume = %request.volume, plugin = %request.plugin,
                                workload = %request.workload, why = %why,
                                "controller detach not started");
                        }
                        Ok(Ok(())) => {}
                    }
                    let mut state = shared.lock();
                    match outcome {
                        Ok(result) => {
                            state
                                .machine
                                .controller_detached(request.ticket, result, now());
                        }
                        Err(why) => {
                            state
                                .machine
                                .controller_not_started(request.ticket, why, now());
                        }
                    }
                    drop(state);
                    shared.wake.notify_one();
                });
            }
        }
    }
}

/// Marks the driver stopped and answers every waiter, however the loop ends.
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.stopped = true;
        // Claims waiting for releasing claims decide again, and find the driver stopped.
        state.waiters.wake_all_blocked();
        // Dropping the senders answers every waiting call with `DriverError::Stopped`.
        state.waiters = Waiters::default();
    }
}

async fn persist<S: ClaimStore + ?Sized>(
    shared: Arc<Shared>,
    store: Arc<S>,
    request: PersistRequest,
    limit: StoreLimit,
) {
    let PersistRequest {
        ticket,
        volume,
        expected,
        record,
        fenced,
    } = request;
    let key = volume.clone();
    let gate = Arc::clone(&shared);
    let result = bounded_store(volume, limit, async move {
        let record = record.as_deref();
        if !fenced {
            return store.compare_and_swap(&key, expected, record).await;
        }
        // A controller-side record: checked now, after the wait for the task to run.
        match gate.gate() {
            Gate::Open => store.compare_and_swap(&key, expected, record).await,
            Gate::Fenced(duty) => {
                let written = store
                    .compare_and_swap_fenced(&key, expected, record, duty.fence())
                    .await;
                if written.as_ref().is_err_and(StoreError::is_fenced) {
                    lost_to_the_store(&duty);
                }
                written
            }
            Gate::Closed(detail) => Err(StoreError::Fenced {
                volume: key,
                detail,
            }),
        }
    })
    .await;
    let mut state = shared.lock();
    state.note_store(&result);
    state.machine.persisted(ticket, result, now());
    drop(state);
    shared.wake.notify_one();
}

async fn reload<S: ClaimStore + ?Sized>(
    shared: Arc<Shared>,
    store: Arc<S>,
    request: ReloadRequest,
    limit: StoreLimit,
) {
    let ReloadRequest { ticket, volume } = request;
    let key = volume.clone();
    let result = bounded_store(volume, limit, async move { store.load(&key).await }).await;
    let mut state = shared.lock();
    state.note_store(&result);
    state.machine.reloaded(ticket, result, now());
    drop(state);
    shared.wake.notify_one();
}

/// The store calls running in their own tasks, counted so that an orderly stop waits for
/// them.
#[derive(Debug, Default)]
struct StoreCalls {
    running: std::sync::atomic::AtomicUsize,
    ended: Notify,
}

/// Counts one running store call while alive.
struct StoreCall(Arc<StoreCalls>);

impl StoreCall {
    fn start(calls: &Arc<StoreCalls>) -> Self {
        calls
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(Arc::clone(calls))
    }
}

impl Drop for StoreCall {
    fn drop(&mut self) {
        self.0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

impl StoreCalls {
    /// Waits until no store call runs, at most `limit`.
    async fn finished(&self, limit: Duration) {
        let all = async {
            loop {
                let ended = self.ended.notified();
                if self.running.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                    return;
                }
                ended.await;
            }
        };
        if tokio::time::timeout(limit, all).await.is_err() {
            tracing::warn!(after = ?limit,
                "claims driver stopped with a store call still running; the store is let go \
                 when it ends");
        }
    }
}

/// Where store calls are counted, and how long one may take.
type StoreLimit = (Arc<StoreCalls>, Duration);

/// Runs a store call in its own task, so that a store that panics answers "interrupted"
/// instead of never, and gives up waiting for it after `limit` ("timed out": its outcome is
/// unknown). The call itself goes on to its end in the background (counted, so that an
/// orderly stop waits for it); the volume's record is read again before the next write.
async fn bounded_store<T: Send + 'static>(
    volume: VolumeId,
    (calls, limit): StoreLimit,
    call: impl Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    let running = StoreCall::start(&calls);
    let call = async move {
        let result = call.await;
        drop(running);
        result
    };
    match tokio::time::timeout(limit, tokio::spawn(call)).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(StoreError::Interrupted { volume }),
        Err(_) => Err(StoreError::TimedOut {
            volume,
            after: limit,
        }),
    }
}

/// The controller step of a release: under a fenced duty, the gate, then the store's
/// confirmation that the record is the one the step was decided on and the fence holds, then
/// the gate again, then the call. `Err` when the call was not made.
async fn controller_step<S, C>(
    shared: &Shared,
    store: Arc<S>,
    controller: &C,
    request: &ControllerDetachRequest,
    (call_limit, store_limit): (Duration, StoreLimit),
) -> Result<Result<(), DetachError>, NotStarted>
where
    S: ClaimStore + ?Sized,
    C: ControllerDetacher + ?Sized,
{
    let duty = match shared.gate() {
        Gate::Open => None,
        Gate::Closed(_) => return Err(NotStarted::NotHolder),
        Gate::Fenced(duty) => {
            let volume = request.volume.clone();
            let expected = request.decided_on;
            let fence = duty.fence().clone();
            let confirmed = bounded_store(volume.clone(), store_limit, async move {
                store.confirm_fenced(&volume, expected, &fence).await
            })
            .await;
            match confirmed {
                Ok(()) => {}
                Err(e) if e.is_fenced() => {
                    lost_to_the_store(&duty);
                    return Err(NotStarted::NotHolder);
                }
                Err(e) if e.is_conflict() => return Err(NotStarted::Stale),
                Err(e) => return Err(NotStarted::Store(e)),
            }
            // The last check, after the store's answer: the call starts in the same poll.
            if !matches!(shared.gate(), Gate::Fenced(now) if now.same_as(&duty)) {
                return Err(NotStarted::NotHolder);
            }
            Some(duty)
        }
    };
    let call = async |request: &ControllerDetachRequest| {
        bounded(
            DetachRpc::ControllerUnpublish,
            call_limit,
            controller.controller_unpublish(request),
        )
        .await
    };
    let Some(duty) = duty else {
        return Ok(call(request).await);
    };
    let mut request = request.clone();
    request.duty_deadline = duty.until();
    Ok(while_held(&duty, call(&request)).await)
}

/// Runs a controller call under `duty`: abandoned (with whatever retries it had left) as soon
/// as the duty lapses. The lapse is looked at first on every wake-up, so a holder that wakes
/// from a pause drops the call before it could send a retry.
async fn while_held(
    duty: &Duty,
    call: impl Future<Output = Result<(), DetachError>>,
) -> Result<(), DetachError> {
    let lapsed = async {
        loop {
            match duty.until() {
                Some(until) if now() < until => {
                    tokio::time::sleep_until(until).await;
                }
                _ => return,
            }
        }
    };
    tokio::select! {
        biased;
        () = lapsed => Err(DetachError::new(
            DetachRpc::ControllerUnpublish,
            ErrorClass::Uncertain,
            format!(
                "abandoned: the controller duty ({}) lapsed during the call; whoever holds \
                 the duty takes the step again",
                duty.fence()
            ),
        )),
        result = call => result,
    }
}

/// The store refused `duty`'s fence: another agent holds the duty (or nobody does), whatever
/// this agent's keep-alives say. The duty ends for good; its holder campaigns again.
fn lost_to_the_store(duty: &Duty) {
    if duty.until().is_some() {
        tracing::warn!(holder = duty.holder(), fence = %duty.fence(),
            "the claim store refused the controller duty's fence: another agent holds it");
    }
    duty.lapse();
}

/// `NodeUnpublishVolume`, then `NodeUnstageVolume` when asked; "already done" counts as done.
async fn node_step<N: NodeDetacher + ?Sized>(
    node: &N,
    request: &NodeDetachRequest,
    limit: Duration,
) -> Result<(), DetachError> {
    bounded(
        DetachRpc::NodeUnpublish,
        limit,
        node.node_unpublish(request),
    )
    .await?;
    if request.unstage {
        bounded(DetachRpc::NodeUnstage, limit, node.node_unstage(request)).await?;
    }
    Ok(())
}

async fn bounded(
    rpc: DetachRpc,
    limit: Duration,
    call: impl Future<Output = Result<(), DetachError>>,
) -> Result<(), DetachError> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.class == ErrorClass::AlreadyDone => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(DetachError::new(
            rpc,
            ErrorClass::Uncertain,
            format!("no answer within the driver's backstop of {limit:?}"),
        )),
    }
}
