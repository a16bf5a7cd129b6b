//! The release machine: claims, accounting and the release pipeline as a pure state machine.
//!
//! [`ReleaseMachine`] does no I/O, reads no clock and spawns nothing (the shape of
//! `quinn-proto`'s `Connection`). Everything it needs comes in through method calls, every
//! time-dependent input takes `now`, and everything it wants done comes out as a value.
//! Its instants are tokio's [`Instant`], the type of every deadline in
//! the crates above it, used as a plain value: the machine needs no runtime, and a test drives
//! it with whatever instants it passes. The [driver](crate::driver) passes tokio's clock, so a
//! paused runtime pauses the releases too.
//!
//! # Calling protocol
//!
//! - **Inputs (commands):** [`load`](ReleaseMachine::load) (records read at startup),
//!   [`claim`](ReleaseMachine::claim), [`release`](ReleaseMachine::release).
//! - **Inputs (facts):** [`node_gone`](ReleaseMachine::node_gone),
//!   [`node_returned`](ReleaseMachine::node_returned),
//!   [`node_detached_after_return`](ReleaseMachine::node_detached_after_return),
//!   [`plugin_available`](ReleaseMachine::plugin_available), and
//!   [`handle_timeout`](ReleaseMachine::handle_timeout) when the deadline from
//!   [`poll_timeout`](ReleaseMachine::poll_timeout) has passed.
//! - **Inputs (results)** of the actions it asked for:
//!   [`persisted`](ReleaseMachine::persisted), [`reloaded`](ReleaseMachine::reloaded),
//!   [`node_detached`](ReleaseMachine::node_detached),
//!   [`controller_detached`](ReleaseMachine::controller_detached).
//! - **Outputs:** after any input, call [`poll_action`](ReleaseMachine::poll_action) until it
//!   returns `None` and perform each [`Action`] (in any order, concurrently if you like), then
//!   drain [`poll_event`](ReleaseMachine::poll_event), then arm a timer for
//!   [`poll_timeout`](ReleaseMachine::poll_timeout).
//! - **Getters:** [`status`](ReleaseMachine::status), [`stuck`](ReleaseMachine::stuck),
//!   [`record`](ReleaseMachine::record).
//!
//! # Guarantees
//!
//! - Per volume, at most one store write and at most one detach call are outstanding, and a
//!   detach call is only asked for when every change of that volume is durable. So every
//!   transition is checkpointed with the whole claim before the next call is made.
//! - A claim's controller step is only asked for after its node step succeeded or was
//!   skipped because its node is gone for good (see [`crate::transition`]).
//! - At most [`MachineConfig::controller_limit`] controller calls per plugin are outstanding.
//!   Volumes whose controller step finds no free slot wait in line, first come first served:
//!   a freed slot wakes only the volume at the front of its plugin's line, and passes on to
//!   the next one if that volume does not take it at once. A volume woken with a store write
//!   or read to make first keeps its place: it rejoins the line at the front when it reaches
//!   its controller step. One whose next step changed (or whose record is gone) leaves the
//!   line, and rejoins at the back should it reach a controller step again.
//! - A failed step is retried after a per-volume, capped, jittered backoff, or earlier when
//!   an event says the cause may be gone. The machine's own writes never wake a failed step,
//!   so there is no tight loop. Each failed attempt is announced ([`Event::StepFailed`]: the
//!   step, its error class, the attempt and when it is retried), the wait shows in
//!   [`status`](ReleaseMachine::status) as [`ReleaseWait::Backoff`], and a failed step that
//!   succeeds at last is announced too ([`Event::StepRecovered`]).
//!
//! ```
//! use tokio::time::Instant;
//! use csi_claims::{Action, ClaimMode, ClaimRequest, ControllerRequirement, MachineConfig,
//!                  ReleaseMachine, VolumeInfo};
//! use csi_structs::*;
//!
//! let now = Instant::now();
//! let mut m = ReleaseMachine::new(MachineConfig::with_seed(1));
//! let info = VolumeInfo {
//!     id: VolumeId::new("db").unwrap(),
//!     external_id: ExternalVolumeId::new("vol-0a").unwrap(),
//!     plugin: PluginId::new("ebs").unwrap(),
//!     controller: ControllerRequirement::Required,
//! };
//! let request = ClaimRequest {
//!     volume: info.id.clone(),
//!     workload: WorkloadId::new("web-1").unwrap(),
//!     node: NodeId::new("n1").unwrap(),
//!     plugin_node: PluginNodeId::new("i-1").unwrap(),
//!     mode: ClaimMode::Write,
//!     access_mode: AccessMode::SingleNodeWriter,
//!     attachment: AccessTypeKind::Mount,
//! };
//! m.claim(&info, request, now).unwrap();
//! // The claim must be written before anyone relies on it.
//! let Some(Action::Persist(write)) = m.poll_action() else { panic!() };
//! assert!(m.poll_action().is_none());
//! m.persisted(write.ticket, Ok(Some(csi_claims::store::Version::FIRST)), now);
//! assert!(matches!(m.poll_event(), Some(csi_claims::Event::ClaimDurable { .. })));
//! ```

mod config;
mod error;
mod output;
mod status;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use tokio::time::Instant;

use csi_structs::{ErrorClass, NodeId, PluginId, VolumeId, WorkloadId};

pub use config::{Duties, MachineConfig, NodeDuties};
pub use error::{ClaimError, LoadError, ReleaseError};
pub use output::{Action, Event, NotStarted, PersistRequest, ReloadRequest, StepFailure, Ticket};
pub use status::{LastError, ReleaseStatus, ReleaseWait, RetriedStep};

use crate::accounting::{self, Admission, admit};
use crate::backoff::{BackoffPolicy, JitterRng};
use crate::detach::{ControllerDetachRequest, DetachError, DetachRpc, NodeDetachRequest};
use crate::error::error_chain;
use crate::model::{Claim, ClaimMode, ClaimRequest, VolumeInfo, VolumeRecord};
use crate::state::{ClaimState, ControllerStep, DetachSteps, NodeDetached, NodeStep};
use crate::store::{Format, StoreError, Stored, Version};
use crate::transition::{Side, Step, next_step_performed_by};

/// The outcome of an accepted [`ReleaseMachine::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// The claim as recorded.
    pub claim: Claim,
    /// Whether it is already durable. If not, wait for [`Event::ClaimDurable`] before using
    /// the volume.
    pub durable: bool,
}

/// The outcome of an accepted [`ReleaseMachine::release`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseStarted {
    /// The claim moved from taken to releasing.
    Started,
    /// The claim was already being released; nothing changed.
    AlreadyReleasing,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Idle,
    Node {
        ticket: Ticket,
        workload: WorkloadId,
        unstage: bool,
    },
    Controller {
        ticket: Ticket,
        workload: WorkloadId,
        /// The claims on the same node whose node step was done when the call was made: the
        /// call detaches the volume from the node for them too.
        covers: Vec<Claim>,
    },
    WaitingSlot {
        workload: WorkloadId,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reload {
    None,
    Wanted,
    InFlight(Ticket),
}

#[derive(Clone, Debug, Default)]
struct Retry {
    attempts: u32,
    not_before: Option<Instant>,
    last_error: Option<LastError>,
    /// The step whose failure counted last (the claim's workload names the claim that goes
    /// after the others, see [`crate::transition`]).
    failed_step: Option<RetriedStep>,
}

impl Retry {
    fn ready(&self) -> bool {
        self.not_before.is_none()
    }

    /// The workload whose step failed last (step retries only).
    fn failed_for(&self) -> Option<&WorkloadId> {
        self.failed_step.as_ref().and_then(RetriedStep::workload)
    }

    /// The backoff being waited out: the failed step and when it is retried.
    fn backoff(&self) -> Option<(RetriedStep, Instant)> {
        self.failed_step.clone().zip(self.not_before)
    }

    /// Starts over; returns the failed step and its failed attempts if one had failed
    /// (for [`Event::StepRecovered`]).
    fn succeeded(&mut self) -> Option<(RetriedStep, u32)> {
        let recovered = std::mem::take(self);
        recovered
            .failed_step
            .filter(|_| recovered.attempts > 0)
            .map(|step| (step, recovered.attempts))
    }

    /// `step` (of a claim) succeeded. The backoff only starts over when it was the claim
    /// that failed; another claim's progress does not reset a stuck claim's backoff. Returns
    /// the failed attempts when it was this very step that had failed.
    fn succeeded_step(&mut self, step: &RetriedStep) -> Option<u32> {
        let failed = self.failed_for();
        if failed.is_some() && failed != step.workload() {
            return None;
        }
        self.succeeded()
            .and_then(|(failed, attempts)| (&failed == step).then_some(attempts))
    }

    /// `step` failed: counts the attempt and schedules the retry. Returns when it is due.
    fn failed(
        &mut self,
        step: RetriedStep,
        now: Instant,
        error: LastError,
        fatal: bool,
        policy: &BackoffPolicy,
        rng: &mut JitterRng,
    ) -> Instant {
        self.attempts = self.attempts.saturating_add(1);
        let delay = if fatal {
            policy.delay_at_cap(rng)
        } else {
            policy.delay(self.attempts, rng)
        };
        let at = now + delay;
        self.not_before = Some(at);
        self.last_error = Some(error);
        self.failed_step = Some(step);
        at
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaitFor {
    Claim,
    Release,
}

/// A claim or release that is announced once the revision holding it is durable.
#[derive(Clone, Debug)]
struct Waiter {
    rev: u64,
    workload: WorkloadId,
    what: WaitFor,
    /// The claim was added by the change this waiter waits for (not held already).
    new_claim: bool,
}

impl Waiter {
    fn event(self, volume: &VolumeId) -> Event {
        let (volume, workload) = (volume.clone(), self.workload);
        match self.what {
            WaitFor::Claim => Event::ClaimDurable { volume, workload },
            WaitFor::Release => Event::ReleaseDurable { volume, workload },
        }
    }

    /// The answer when the write it waits for failed.
    fn not_stored(self, volume: &VolumeId, reason: String) -> Event {
        let (volume, workload) = (volume.clone(), self.workload);
        match self.what {
            WaitFor::Claim => Event::ClaimNotStored {
                volume,
                workload,
                reason,
            },
            WaitFor::Release => Event::ReleaseNotStored {
                volume,
                workload,
                reason,
            },
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// Shared with the store write in flight; changed copy-on-write.
    record: Arc<VolumeRecord>,
    /// Revision of `record` in memory; bumped by every change.
    rev: u64,
    /// Revision last acknowledged durable.
    durable_rev: u64,
    /// Store version of `durable_rev`.
    version: Option<Version>,
    persist: Option<(Ticket, u64)>,
    reload: Reload,
    op: Op,
    step_retry: Retry,
    store_retry: Retry,
    /// Claims and releases waiting to be durable.
    waiters: Vec<Waiter>,
    /// Claims freed in memory, announced once durable: (revision, claim in state Freed).
    frees: Vec<(u64, Claim)>,
    queued: bool,
    /// The newest change another writer made that the machine could not take over at once
    /// (a write or read was out): its version, and whether a record exists after it.
    stale: Option<(Version, bool)>,
    /// A controller-call slot of this plugin handed to the volume when it was woken from the
    /// line of [`Op::WaitingSlot`]: taken by its controller step, or passed on to the next
    /// waiter once the volume has been looked at (see [`ReleaseMachine::poll_action`]).
    slot_grant: Option<PluginId>,
    /// The plugin whose slot the volume was woken for and passed on because a store write or
    /// read of its own had to come first: at its controller step it goes ahead of the line
    /// (see [`Op::WaitingSlot`]). Dropped when its next step is anything else.
    kept_turn: Option<PluginId>,
    /// The newest version of the record this machine knows of (written, read or observed),
    /// kept across a delete: a store's watch may bring back older changes, the machine's own
    /// among them, after the machine has moved past them.
    floor: Option<Version>,
    /// The last write was this machine's delete of the record: its echo is still to come.
    deleted_here: bool,
    /// Steps this machine performed whose outcome is in memory but not yet durable: the
    /// revision that holds it, the claim as it was before the step, and the state after. A
    /// write refused because another agent wrote the volume meanwhile is followed by a read;
    /// these outcomes are applied again to what was read (if the claim is still as it was),
    /// so that a call that succeeded is not made again.
    unrecorded: Vec<(u64, Claim, ClaimState)>,
    /// Set while the volume waits to be read again after a failed store call: the store's
    /// error, with which its claims and releases are refused at once meanwhile.
    store_fault: Option<String>,
}

impl Entry {
    fn new(record: VolumeRecord, version: Option<Version>) -> Self {
        Self {
            record: Arc::new(record),
            rev: 0,
            durable_rev: 0,
            version,
            persist: None,
            reload: Reload::None,
            op: Op::Idle,
            step_retry: Retry::default(),
            store_retry: Retry::default(),
            waiters: Vec::new(),
            frees: Vec::new(),
            queued: false,
            stale: None,
            slot_grant: None,
            kept_turn: None,
            floor: version,
            deleted_here: false,
            unrecorded: Vec::new(),
            store_fault: None,
        }
    }

    /// No write, no reload and no unwritten change: a record seen in the store can replace
    /// the one in memory.
    fn settled(&self) -> bool {
        self.clean() && self.reload == Reload::None
    }

    fn raise_floor(&mut self, version: Option<Version>) {
        self.floor = self.floor.max(version);
    }

    fn mark_stale(&mut self, version: Version, exists: bool) {
        if self.stale.is_none_or(|(v, _)| v < version) {
            self.stale = Some((version, exists));
        }
    }

    fn clean(&self) -> bool {
        self.rev == self.durable_rev && self.persist.is_none()
    }

    fn finished(&self) -> bool {
        self.record.claims.is_empty()
            && self.clean()
            && self.op == Op::Idle
            && self.slot_grant.is_none()
            && self.reload == Reload::None
            && self.waiters.is_empty()
            && self.frees.is_empty()
    }
}

#[derive(Clone, Debug)]
enum Outstanding {
    Persist(VolumeId),
    Reload(VolumeId),
    Node(VolumeId),
    Controller(VolumeId, PluginId),
}

/// The controller-call slots of one plugin.
///
/// `busy + granted` never exceeds the plugin's limit, and `waiters` is only non-empty while
/// no slot is free (`busy + granted >= limit`): every place that frees or hands back a slot
/// wakes the next waiters ([`ReleaseMachine::wake_slot_waiters`]).
#[derive(Debug, Default)]
struct Slots {
    /// Controller calls in flight.
    busy: usize,
    /// Slots handed to woken waiters that have not taken them or passed them on yet.
    granted: usize,
    /// The volumes in [`Op::WaitingSlot`], oldest first; each at most once.
    waiters: VecDeque<VolumeId>,
}

/// The claim and release state machine for all volumes of one agent. See the
/// [module docs](self) for the calling protocol.
#[derive(Debug)]
pub struct ReleaseMachine {
    config: MachineConfig,
    volumes: HashMap<VolumeId, Entry>,
    ready: VecDeque<VolumeId>,
    events: VecDeque<Event>,
    timers: BinaryHeap<Reverse<(Instant, VolumeId)>>,
    outstanding: HashMap<Ticket, Outstanding>,
    /// Controller-call slots per plugin.
    slots: HashMap<PluginId, Slots>,
    gone: HashSet<NodeId>,
    controller_duty: bool,
    /// Whether a store's changes are fed to [`observed`](Self::observed): then the floors of
    /// volumes no longer managed are kept until their deletion is observed.
    observing: bool,
    /// Floors of volumes that were finished and dropped while observing.
    retired: HashMap<VolumeId, Version>,
    /// Volumes whose last store call failed because the store did: woken when the store
    /// answers again.
    store_down: HashSet<VolumeId>,
    /// Until when release steps wait for their plugin to be reported available (after a
    /// start, before the plugins are fingerprinted), and the plugins reported so far.
    awaiting_plugins: Option<(Instant, HashSet<PluginId>)>,
    /// Whether controller steps wait too (not when their plugin may be another node's).
    awaiting_controllers: bool,
    rng: JitterRng,
    next_ticket: u64,
}

impl ReleaseMachine {
    /// An empty machine.
    pub fn new(config: MachineConfig) -> Self {
        let rng = JitterRng::from_seed(config.jitter_seed);
        Self {
            controller_duty: config.duties.controller,
            observing: false,
            retired: HashMap::new(),
            store_down: HashSet::new(),
            awaiting_plugins: None,
            awaiting_controllers: false,
            config,
            volumes: HashMap::new(),
            ready: VecDeque::new(),
            events: VecDeque::new(),
            timers: BinaryHeap::new(),
            outstanding: HashMap::new(),
            slots: HashMap::new(),
            gone: HashSet::new(),
            rng,
            next_ticket: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &MachineConfig {
        &self.config
    }

    // ----------------------------------------------------------------------------------
    // Commands
    // ----------------------------------------------------------------------------------

    /// Takes over a record read from the store (at startup). Releases in progress resume at
    /// the step their state names. A record in the older format is rewritten in the current
    /// format by the next checkpoint, which is asked for at once.
    ///
    /// # Errors
    ///
    /// [`LoadError::AlreadyLoaded`] if the machine already manages the volume.
    pub fn load(&mut self, stored: Stored) -> Result<(), LoadError> {
        let volume = stored.record.info.id.clone();
        if self.volumes.contains_key(&volume) {
            return Err(LoadError::AlreadyLoaded { volume });
        }
        let mut entry = Entry::new(stored.record, Some(stored.version));
        if stored.format == Format::V1 {
            entry.rev = 1;
        }
        self.volumes.insert(volume.clone(), entry);
        self.queue(&volume);
        Ok(())
    }

    /// Records a claim if the volume's access mode allows it.
    ///
    /// A new claim is not durable yet: use the volume only after [`Event::ClaimDurable`] for
    /// it (or when [`Admitted::durable`] is already true). Claiming again with the same
    /// workload and terms changes nothing.
    ///
    /// # Errors
    ///
    /// See [`ClaimError`]; [`ClaimError::Denied`] names the volume, the mode and the holders.
    pub fn claim(
        &mut self,
        info: &VolumeInfo,
        request: ClaimRequest,
        now: Instant,
    ) -> Result<Admitted, ClaimError> {
        self.claim_within(info, request, None, now)
    }

    /// [`claim`](Self::claim), refused with [`ClaimError::AttachLimit`] when the claim would
    /// attach the volume on a node where `attach_limit` of the plugin's volumes already hold
    /// claims (counted over every volume the machine knows; with a store shared by a
    /// cluster, that is every volume, and only the node's own agent claims for it).
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim), and [`ClaimError::AttachLimit`].
    pub fn claim_within(
        &mut self,
        info: &VolumeInfo,
        request: ClaimRequest,
        attach_limit: Option<std::num::NonZeroU64>,
        _now: Instant,
    ) -> Result<Admitted, ClaimError> {
        if request.volume != info.id {
            return Err(ClaimError::VolumeMismatch {
                request: request.volume,
                info: info.id.clone(),
            });
        }
        if self.gone.contains(&request.node) {
            return Err(ClaimError::NodeGone {
                volume: request.volume,
                node: request.node,
            });
        }
        if let Some(limit) = attach_limit {
            self.check_attach_limit(info, &request, limit.get())?;
        }
        let volume = request.volume.clone();
        let result = self.claim_inner(info, request);
        if result.is_err() && self.volumes.get(&volume).is_some_and(Entry::finished) {
            // Do not keep an empty entry made just for a refused claim.
            self.volumes.remove(&volume);
        }
        if let Err(ClaimError::StoreUnavailable { .. }) = &result {
            self.read_again_now(&volume);
        }
        result
    }

    /// Refuses a claim that would attach `request`'s volume on its node past `limit`.
    fn check_attach_limit(
        &self,
        info: &VolumeInfo,
        request: &ClaimRequest,
        limit: u64,
    ) -> Result<(), ClaimError> {
        let on_node =
            |record: &VolumeRecord| record.claims.iter().any(|c| c.node() == &request.node);
        if self
            .volumes
            .get(&request.volume)
            .is_some_and(|e| on_node(&e.record))
        {
            // Attached there already: one more claim is no new attachment.
            return Ok(());
        }
        let count = self
            .volumes
            .iter()
            .filter(|(id, e)| {
                **id != request.volume && e.record.info.plugin == info.plugin && on_node(&e.record)
            })
            .count() as u64;
        if count >= limit {
            return Err(ClaimError::AttachLimit {
                volume: request.volume.clone(),
                node: request.node.clone(),
                plugin: info.plugin.clone(),
                limit,
                count,
            });
        }
        Ok(())
    }

    fn claim_inner(
        &mut self,
        info: &VolumeInfo,
        request: ClaimRequest,
    ) -> Result<Admitted, ClaimError> {
        let volume = request.volume.clone();
        let entry = self
            .volumes
            .entry(volume.clone())
            .or_insert_with(|| Entry::new(VolumeRecord::new(info.clone()), None));
        let known = &entry.record.info;
        let mismatch = if known.external_id != info.external_id {
            Some("external_id")
        } else if known.plugin != info.plugin {
            Some("plugin")
        } else if known.controller != info.controller {
            Some("controller")
        } else {
            None
        };
        if let Some(field) = mismatch {
            return Err(ClaimError::VolumeInfoMismatch { volume, field });
        }
        if entry.reload != Reload::None {
            if let Some(reason) = &entry.store_fault {
                return Err(ClaimError::StoreUnavailable {
                    volume,
                    reason: reason.clone(),
                });
            }
            return Err(ClaimError::Reloading { volume });
        }
        let admission = admit(&entry.record.claims, &request)
            .map_err(|denied| ClaimError::Denied(Box::new(denied)))?;
        // An unstage or a controller detach in flight on the claim's node would pull the
        // volume from under the new claim's stage and publish.
        let detaching = match &entry.op {
            Op::Node {
                workload,
                unstage: true,
                ..
            }
            | Op::Controller { workload, .. } => Some(workload),
            _ => None,
        };
        if let Some(workload) = detaching {
            let node = entry.record.claim(workload).map(|c| &c.node);
            if node == Some(&request.node) {
                return Err(ClaimError::DetachInFlight {
                    volume,
                    node: request.node,
                });
            }
        }
        let workload = request.workload.clone();
        let new_claim = admission == Admission::New;
        let durable = match admission {
            Admission::AlreadyHeld => entry.clean(),
            Admission::New => {
                Arc::make_mut(&mut entry.record)
                    .claims
                    .push(Claim::taken(request));
                entry.rev += 1;
                false
            }
        };
        if !durable {
            entry.waiters.push(Waiter {
                rev: entry.rev,
                workload: workload.clone(),
                what: WaitFor::Claim,
                new_claim,
            });
        }
        let claim = entry
            .record
            .claim(&workload)
            .cloned()
            .expect("invariant: the claim was found or pushed just above");
        self.queue(&volume);
        Ok(Admitted { claim, durable })
    }

    /// The claims being released that are all that stands in the way of a claim this
    /// machine just refused with `refusal` ([`claim_within`](Self::claim_within) with the
    /// same `info`, `request` and `attach_limit`): once they are freed, deciding again may
    /// admit it. Empty when waiting cannot help (a claim that is not releasing refuses it, or
    /// the request itself does); then the refusal stands.
    ///
    /// - A denial by the access mode ([`ClaimError::Denied`]): the releasing claims on the
    ///   volume when the volume's other claims admit the request
    ///   ([`releases_in_the_way`](crate::accounting::releases_in_the_way)): the workload's
    ///   own earlier claim, or capacity it needs.
    /// - A detach in flight on the node ([`ClaimError::DetachInFlight`]): the claim whose
    ///   unstage or controller detach it is.
    /// - The plugin's attach limit ([`ClaimError::AttachLimit`]): the releasing claims on the
    ///   node of the plugin's other volumes that have no other claim there, when without them
    ///   the node would be under the limit.
    ///
    /// Pure, like every getter: changes nothing.
    pub fn releases_in_the_way(
        &self,
        info: &VolumeInfo,
        request: &ClaimRequest,
        attach_limit: Option<std::num::NonZeroU64>,
        refusal: &ClaimError,
    ) -> Vec<Claim> {
        match refusal {
            ClaimError::Denied(_) => self
                .volumes
                .get(&request.volume)
                .and_then(|e| accounting::releases_in_the_way(&e.record.claims, request))
                .unwrap_or_default()
                .into_iter()
                .cloned()
                .collect(),
            ClaimError::DetachInFlight { .. } => {
                let Some(entry) = self.volumes.get(&request.volume) else {
                    return Vec::new();
                };
                let detaching = match &entry.op {
                    Op::Node { workload, .. } | Op::Controller { workload, .. } => workload,
                    Op::Idle | Op::WaitingSlot { .. } => return Vec::new(),
                };
                entry
                    .record
                    .claim(detaching)
                    .filter(|c| c.state.is_releasing())
                    .cloned()
                    .into_iter()
                    .collect()
            }
            ClaimError::AttachLimit { .. } => {
                let Some(limit) = attach_limit else {
                    return Vec::new();
                };
                let mut holding = 0_u64;
                let mut releasing = Vec::new();
                for (id, entry) in &self.volumes {
                    if *id == request.volume || entry.record.info.plugin != info.plugin {
                        continue;
                    }
                    let on_node: Vec<&Claim> = entry
                        .record
                        .claims
                        .iter()
                        .filter(|c| c.node == request.node)
                        .collect();
                    if on_node.iter().any(|c| !c.state.is_releasing()) {
                        holding += 1;
                    } else {
                        releasing.extend(on_node.into_iter().cloned());
                    }
                }
                if holding < limit.get() {
                    // No hash-map order in what is shown.
                    releasing
                        .sort_by(|a, b| (&a.volume, &a.workload).cmp(&(&b.volume, &b.workload)));
                    releasing
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        }
    }

    /// Starts releasing the claim of `workload` on `volume`. The claim keeps its capacity
    /// until it is freed. [`Event::ReleaseDurable`] follows once the release request is
    /// durable (at once if it already is): from then on a crash cannot lose it.
    ///
    /// # Errors
    ///
    /// [`ReleaseError::NoSuchClaim`] when there is no such claim (already freed, or never
    /// made); [`ReleaseError::Reloading`] while the volume is reloaded.
    pub fn release(
        &mut self,
        volume: &VolumeId,
        workload: &WorkloadId,
        _now: Instant,
    ) -> Result<ReleaseStarted, ReleaseError> {
        let no_claim = || ReleaseError::NoSuchClaim {
            volume: volume.clone(),
            workload: workload.clone(),
        };
        let entry = self.volumes.get_mut(volume).ok_or_else(no_claim)?;
        if entry.reload != Reload::None {
            if let Some(reason) = &entry.store_fault {
                let reason = reason.clone();
                self.read_again_now(volume);
                return Err(ReleaseError::StoreUnavailable {
                    volume: volume.clone(),
                    reason,
                });
            }
            return Err(ReleaseError::Reloading {
                volume: volume.clone(),
            });
        }
        let index = entry.record.position(workload).ok_or_else(no_claim)?;
        let claim = &mut Arc::make_mut(&mut entry.record).claims[index];
        let started = if claim.state.is_releasing() {
            ReleaseStarted::AlreadyReleasing
        } else {
            claim.state = ClaimState::Releasing;
            entry.rev += 1;
            ReleaseStarted::Started
        };
        let waiter = Waiter {
            rev: entry.rev,
            workload: workload.clone(),
            what: WaitFor::Release,
            new_claim: false,
        };
        if entry.clean() {
            self.events.push_back(waiter.event(volume));
        } else {
            entry.waiters.push(waiter);
        }
        self.queue(volume);
        Ok(started)
    }

    // ----------------------------------------------------------------------------------
    // Facts
    // ----------------------------------------------------------------------------------

    /// The node is gone for good (deleted, decommissioned): its workloads are gone and
    /// nothing can be unpublished there. Every claim made from it starts releasing, and their
    /// node steps are recorded as skipped ([`NodeStep::SkippedNodeGone`]) before their
    /// controller steps run. A node that is merely unreachable must not be reported here:
    /// its node steps fail and retry instead.
    ///
    /// The set of gone nodes is not stored (it is a fact about the cluster, not about a
    /// volume): after a restart, report gone nodes again. Claims already recorded as
    /// [`NodeStep::SkippedNodeGone`] keep that record.
    pub fn node_gone(&mut self, node: &NodeId, _now: Instant) {
        self.gone.insert(node.clone());
        let mut touched = Vec::new();
        for (volume, entry) in &mut self.volumes {
            let mut hit = false;
            if !entry.record.claims.iter().any(|c| &c.node == node) {
                continue;
            }
            for claim in &mut Arc::make_mut(&mut entry.record).claims {
                if &claim.node == node {
                    hit = true;
                    if claim.state == ClaimState::Taken {
                        claim.state = ClaimState::Releasing;
                        entry.rev += 1;
                    }
                }
            }
            if hit {
                entry.step_retry.not_before = None;
                touched.push(volume.clone());
            }
        }
        for volume in touched {
            self.queue(&volume);
        }
    }

    /// The node is back (or was reported gone by mistake): claims can be made there again,
    /// and volumes with claims on it retry their failed steps now.
    pub fn node_returned(&mut self, node: &NodeId, _now: Instant) {
        self.gone.remove(node);
        self.wake_where(|e| e.record.claims.iter().any(|c| &c.node == node));
    }

    /// A node reported gone for good came back and unpublished the volume of `workload`'s
    /// claim itself (and unstaged it when `unstaged`): what its node step would have done,
    /// had it not been skipped. A claim of `node` whose node step was recorded as skipped
    /// ([`NodeStep::SkippedNodeGone`]) and whose controller step has not run yet
    /// ([`ClaimState::NodeDetached`]) is recorded as detached by its node
    /// ([`NodeStep::Detached`]), and the volume's failed step is retried at once. The
    /// change is written to the store like any checkpoint, so the agent that performs
    /// controller steps sees it too and retries there at once as well: a controller step
    /// that the plugin refused while the volume was still staged or published on the node
    /// (`FAILED_PRECONDITION`) need not wait out its backoff.
    ///
    /// Returns whether the claim was found so; otherwise (no such claim, another node's, a
    /// node step not skipped, a controller step already run) nothing changes.
    pub fn node_detached_after_return(
        &mut self,
        volume: &VolumeId,
        workload: &WorkloadId,
        node: &NodeId,
        unstaged: bool,
        _now: Instant,
    ) -> bool {
        let Some(entry) = self.volumes.get_mut(volume) else {
            return false;
        };
        let skipped = ClaimState::NodeDetached(NodeDetached {
            node: NodeStep::SkippedNodeGone,
        });
        let Some(index) = entry
            .record
            .claims
            .iter()
            .position(|c| &c.workload == workload && &c.node == node && c.state == skipped)
        else {
            return false;
        };
        let claim = &mut Arc::make_mut(&mut entry.record).claims[index];
        let before = claim.clone();
        claim.state = ClaimState::NodeDetached(NodeDetached {
            node: NodeStep::Detached { unstaged },
        });
        let after = claim.state.clone();
        entry.rev += 1;
        // Applied again to what a read brings, should another agent's write come first.
        entry.unrecorded.push((entry.rev, before, after));
        entry.step_retry.not_before = None;
        self.queue(volume);
        true
    }

    /// Until `until`, a volume's release steps wait for its plugin to be reported available
    /// ([`plugin_available`](Self::plugin_available)) before their first attempt; claims and
    /// store writes go on. For a start: releases loaded from the store would otherwise be
    /// tried before the plugins are fingerprinted again, and fail. After `until` (see
    /// [`poll_timeout`](Self::poll_timeout)) every release goes on, available or not.
    pub fn await_plugins(&mut self, until: Instant) {
        self.awaiting_plugins = Some((until, HashSet::new()));
        self.awaiting_controllers = true;
    }

    /// As [`await_plugins`](Self::await_plugins), for node steps only: controller steps go
    /// at once. For a member of a cluster, whose node steps call its own plugins (reported
    /// as it finds them) while a controller step may call another node's.
    pub fn await_node_plugins(&mut self, until: Instant) {
        self.awaiting_plugins = Some((until, HashSet::new()));
        self.awaiting_controllers = false;
    }

    /// The plugin became available (on `node`, or anywhere when `None`): volumes served by it
    /// retry their failed steps now instead of waiting out their backoff (and no longer wait
    /// for it, see [`await_plugins`](Self::await_plugins)).
    pub fn plugin_available(&mut self, plugin: &PluginId, node: Option<&NodeId>, _now: Instant) {
        if let Some((_, available)) = &mut self.awaiting_plugins {
            available.insert(plugin.clone());
        }
        self.wake_where(|e| {
            &e.record.info.plugin == plugin
                && node.is_none_or(|n| e.record.claims.iter().any(|c| &c.node == n))
        });
    }

    /// Says that every change of the store will be fed to [`observed`](Self::observed) (a
    /// store shared through a watch). From then on the machine remembers, for each volume it
    /// deleted and dropped, the last version it knew, until the watch brings back the
    /// deletion, so that an older change arriving late does not bring the volume back.
    pub fn follow_store_changes(&mut self) {
        self.observing = true;
    }

    /// Starts or stops performing controller-side steps (see
    /// [`Side::Controller`]): agents that share a store hand this duty to one of them at a
    /// time, e.g. by an election. Starting wakes every volume, so releases another agent left
    /// half-done resume from their stored checkpoints; stopping lets calls in flight finish
    /// but starts no new controller-side step.
    pub fn set_controller_duty(&mut self, on: bool, _now: Instant) {
        let was = std::mem::replace(&mut self.controller_duty, on);
        if on && !was {
            self.wake_where(|_| true);
        }
    }

    /// Whether this machine performs controller-side steps now.
    pub fn controller_duty(&self) -> bool {
        self.controller_duty
    }

    /// A change of a volume's record made in the store by any writer (a shared store's
    /// watch, see [`ClaimStore::load_and_watch`](crate::ClaimStore::load_and_watch)):
    /// `record` as written at `version`, or `None` when the record was deleted.
    ///
    /// A change no newer than the machine's copy (its own write coming back) changes nothing.
    /// A newer one replaces the copy at once when nothing of the volume is being written or
    /// read; otherwise it is remembered, and the volume is read again once the write is
    /// answered (a write based on the older copy is refused by the store anyway). A volume the
    /// machine does not manage yet is taken over, as [`load`](Self::load) does.
    pub fn observed(
        &mut self,
        volume: &VolumeId,
        version: Version,
        record: Option<VolumeRecord>,
        now: Instant,
    ) {
        self.observe(volume, version, record, now);
    }

    /// [`observed`](Self::observed); says whether the change was news to the machine (taken
    /// over, or remembered to be read).
    fn observe(
        &mut self,
        volume: &VolumeId,
        version: Version,
        record: Option<VolumeRecord>,
        _now: Instant,
    ) -> bool {
        let Some(entry) = self.volumes.get_mut(volume) else {
            if let Some(&floor) = self.retired.get(volume) {
                if version <= floor {
                    return false; // a change from before this machine dropped the volume
                }
                self.retired.remove(volume);
            }
            if let Some(record) = record.filter(|r| !r.claims.is_empty() && &r.info.id == volume) {
                self.volumes
                    .insert(volume.clone(), Entry::new(record, Some(version)));
                self.queue(volume);
                return true;
            }
            return false;
        };
        if entry.floor.is_some_and(|known| known >= version) {
            return false;
        }
        if !entry.settled() {
            entry.mark_stale(version, record.is_some());
            return true;
        }
        let exists = record.is_some();
        let record = record
            .filter(|r| r.info.id == *volume)
            .unwrap_or_else(|| VolumeRecord::new(entry.record.info.clone()));
        self.events.extend(freed_elsewhere(&entry.record, &record));
        entry.record = Arc::new(record);
        entry.version = exists.then_some(version);
        entry.raise_floor(Some(version));
        entry.deleted_here = false;
        entry.stale = None;
        // The other writer's progress may be what a failed step was waiting for.
        entry.step_retry.not_before = None;
        self.queue(volume);
        true
    }

    /// Every record in the store at `version`, read again (after a shared store's watch lost
    /// its place, or as a periodic check): each is [`observed`](Self::observed), and a
    /// managed volume without a record is observed deleted. Returns how many volumes the read
    /// told the machine something new about: 0 when the watch had brought every change.
    pub fn resync(&mut self, version: Version, records: Vec<Stored>, now: Instant) -> usize {
        let present: HashSet<VolumeId> = records.iter().map(|s| s.record.info.id.clone()).collect();
        let missing: Vec<VolumeId> = self
            .volumes
            .keys()
            .filter(|v| !present.contains(*v))
            .cloned()
            .collect();
        let mut news = 0;
        for volume in missing {
            news += usize::from(self.observe(&volume, version, None, now));
        }
        for stored in records {
            let volume = stored.record.info.id.clone();
            news += usize::from(self.observe(&volume, stored.version, Some(stored.record), now));
        }
        news
    }

    /// Retries every due step. Call when the deadline from
    /// [`poll_timeout`](Self::poll_timeout) has passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self
            .awaiting_plugins
            .as_ref()
            .is_some_and(|(until, _)| *until <= now)
        {
            self.awaiting_plugins = None;
            let waiting: Vec<VolumeId> = self.volumes.keys().cloned().collect();
            for volume in waiting {
                self.queue(&volume);
            }
        }
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, volume))) = self.timers.pop() else {
                break;
            };
            let Some(entry) = self.volumes.get_mut(&volume) else {
                continue;
            };
            let mut due = false;
            for retry in [&mut entry.step_retry, &mut entry.store_retry] {
                if retry.not_before.is_some_and(|t| t <= now) {
                    retry.not_before = None;
                    due = true;
                }
            }
            if due {
                self.queue(&volume);
            }
        }
    }

    // ----------------------------------------------------------------------------------
    // Results
    // ----------------------------------------------------------------------------------

    /// The result of an [`Action::Persist`]: the new version (`None` after a delete) or the
    /// store's error.
    ///
    /// - A stale write ([`StoreError::Conflict`]) makes the machine reload the volume
    ///   ([`Action::Reload`]) at once and decide again on what it reads.
    /// - A record the store can never take ([`StoreError::is_permanent`]) refuses the new
    ///   claims in it ([`Event::ClaimRefused`]) and reloads the volume after a backoff.
    /// - Any other failure (the store's disk, database or network failed) leaves the outcome
    ///   of the write unknown: the volume is read again at once ([`Action::Reload`]), and
    ///   what the store holds decides (a claim in it is durable, one not in it is lost). If
    ///   that read fails too, the store is down: see [`reloaded`](Self::reloaded).
    pub fn persisted(
        &mut self,
        ticket: Ticket,
        result: Result<Option<Version>, StoreError>,
        now: Instant,
    ) {
        let Some(Outstanding::Persist(volume)) = self.outstanding.remove(&ticket) else {
            return;
        };
        let Some(entry) = self.volumes.get_mut(&volume) else {
            return;
        };
        let Some((t, rev)) = entry.persist else {
            return;
        };
        if t != ticket {
            return;
        }
        entry.persist = None;
        if result.is_ok() {
            entry.store_fault = None;
        }
        let store_answered = match &result {
            Ok(_) => true,
            Err(e) => !e.is_unavailable(),
        };
        match result {
            Ok(version) => {
                // A change by another writer newer than this write, or a record made again
                // after this delete, is read before anything else.
                let behind = match (entry.stale.take(), version) {
                    (Some((seen, _)), Some(written)) => seen > written,
                    (Some((_, exists)), None) => exists,
                    (None, _) => false,
                };
                if behind {
                    entry.reload = Reload::Wanted;
                }
                entry.raise_floor(version);
                entry.deleted_here = version.is_none();
                entry.version = version;
                entry.durable_rev = rev;
                entry.unrecorded.retain(|(r, _, _)| *r > rev);
                self.events
                    .extend(entry.store_retry.succeeded().map(|r| recovered(&volume, r)));
                for waiter in entry.waiters.extract_if(.., |w| w.rev <= rev) {
                    self.events.push_back(waiter.event(&volume));
                }
                for (_, claim) in entry.frees.extract_if(.., |(r, _)| *r <= rev) {
                    self.events.push_back(Event::Freed(claim));
                }
            }
            Err(e) if e.is_conflict() => {
                entry.reload = Reload::Wanted;
            }
            Err(e) if e.is_fenced() => {
                // This agent does not hold the controller duty (any more): nothing was
                // written, the copy may be stale, and no controller-side step starts until
                // the duty is confirmed again.
                entry.reload = Reload::Wanted;
                self.controller_duty = false;
            }
            Err(e) if e.is_permanent() => {
                // The unwritten changes can never be written: new claims are refused, and the
                // volume is read again (releases asked for are asked for again), after a
                // backoff so that a release that cannot be written does not spin.
                let reason = error_chain(&e);
                let durable = entry.durable_rev;
                let refused = entry
                    .waiters
                    .extract_if(.., |w| w.what == WaitFor::Claim && w.rev > durable);
                for waiter in refused {
                    self.events.push_back(Event::ClaimRefused {
                        volume: volume.clone(),
                        workload: waiter.workload,
                        reason: reason.clone(),
                    });
                }
                self.read_again_later(&volume, reason, e.class(), now);
            }
            Err(e) => {
                // The outcome is unknown (the store may have written it before failing): read
                // the volume again at once, which settles every waiter if the store answers.
                // If the read fails too, the store is down: see `reloaded`.
                entry.reload = Reload::Wanted;
                entry.store_retry.last_error = Some(LastError::Store {
                    detail: error_chain(&e),
                    at: now,
                });
            }
        }
        if store_answered {
            self.store_answered();
        }
        self.queue(&volume);
    }

    /// The result of an [`Action::Reload`]. The stored record replaces the one in memory;
    /// claims that were waiting to become durable and are not in it are reported as
    /// [`Event::ClaimLost`].
    ///
    /// A failed read answers everyone still waiting on the volume at once
    /// ([`Event::ClaimNotStored`], [`Event::ReleaseNotStored`]), stops showing the claims
    /// not known to be stored, and reads the volume again after a backoff, or as soon as the
    /// store answers a call about another volume, or a claim or release of this one is asked
    /// for. Until the read succeeds, its claims and releases are refused at once with
    /// [`ClaimError::StoreUnavailable`] / [`ReleaseError::StoreUnavailable`], and none of its
    /// release steps is started.
    pub fn reloaded(
        &mut self,
        ticket: Ticket,
        result: Result<Option<Stored>, StoreError>,
        now: Instant,
    ) {
        let Some(Outstanding::Reload(volume)) = self.outstanding.remove(&ticket) else {
            return;
        };
        let Some(entry) = self.volumes.get_mut(&volume) else {
            return;
        };
        if entry.reload != Reload::InFlight(ticket) {
            return;
        }
        match result {
            Ok(stored) => {
                let (record, version, format) = match stored {
                    Some(s) => (s.record, Some(s.version), s.format),
                    None => (
                        VolumeRecord::new(entry.record.info.clone()),
                        None,
                        Format::V2,
                    ),
                };
                let mut record = record;
                let mut rev = u64::from(format == Format::V1);
                // Outcomes of calls this machine made that the refused write carried.
                let mut unrecorded = Vec::new();
                for (_, before, after) in entry.unrecorded.drain(..) {
                    if let Some(i) = record.position(&before.workload)
                        && record.claims[i] == before
                    {
                        record.claims[i].state = after.clone();
                        rev += 1;
                        unrecorded.push((rev, before, after));
                    }
                }
                let mut kept = Vec::new();
                for mut waiter in entry.waiters.drain(..) {
                    let position = record.position(&waiter.workload);
                    match (waiter.what, position) {
                        (WaitFor::Claim, Some(_)) => {
                            self.events.push_back(waiter.event(&volume));
                        }
                        (WaitFor::Claim, None) => self.events.push_back(Event::ClaimLost {
                            volume: volume.clone(),
                            workload: waiter.workload,
                        }),
                        // A release the other writer did not see is asked for again.
                        (WaitFor::Release, Some(i))
                            if record.claims[i].state == ClaimState::Taken =>
                        {
                            record.claims[i].state = ClaimState::Releasing;
                            rev += 1;
                            waiter.rev = rev;
                            kept.push(waiter);
                        }
                        (WaitFor::Release, _) => self.events.push_back(waiter.event(&volume)),
                    }
                }
                for waiter in &mut kept {
                    waiter.rev = rev;
                }
                entry.waiters = kept;
                // Frees not yet durable: if the claim is gone from the store, someone freed
                // it; if not, it will be released again from its stored state.
                for (_, claim) in entry.frees.drain(..) {
                    if record.position(&claim.workload).is_none() {
                        self.events.push_back(Event::Freed(claim));
                    }
                }
                self.events.extend(freed_elsewhere(&entry.record, &record));
                entry.record = Arc::new(record);
                entry.version = version;
                entry.raise_floor(version);
                entry.deleted_here = false;
                for outcome in &mut unrecorded {
                    outcome.0 = rev;
                }
                entry.unrecorded = unrecorded;
                entry.rev = rev;
                entry.durable_rev = 0;
                entry.reload = Reload::None;
                self.events
                    .extend(entry.store_retry.succeeded().map(|r| recovered(&volume, r)));
                entry.store_fault = None;
                self.store_down.remove(&volume);
                // A change seen after this read was made: read again (the watch's report of
                // what was read settles it).
                entry.reload = match (entry.stale.take(), version) {
                    (Some((seen, exists)), Some(read)) if seen > read => {
                        entry.stale = Some((seen, exists));
                        Reload::Wanted
                    }
                    (Some((seen, true)), None) => {
                        entry.stale = Some((seen, true));
                        Reload::Wanted
                    }
                    _ => Reload::None,
                };
            }
            Err(e) => {
                let answered = !e.is_unavailable();
                self.store_failed(&volume, &e, now);
                if answered {
                    self.store_answered();
                }
                self.queue(&volume);
                return;
            }
        }
        self.store_answered();
        self.queue(&volume);
    }

    /// The result of an [`Action::NodeDetach`]. `Ok` and [`ErrorClass::AlreadyDone`] mean the
    /// node step is done; any other error fails the step, and the volume is retried after its
    /// backoff (never skipped): [`Event::StepFailed`] says when.
    pub fn node_detached(&mut self, ticket: Ticket, result: Result<(), DetachError>, now: Instant) {
        let Some(Outstanding::Node(volume)) = self.outstanding.remove(&ticket) else {
            return;
        };
        let Some(entry) = self.volumes.get_mut(&volume) else {
            return;
        };
        let Op::Node {
            ticket: t,
            workload,
            unstage,
        } = &entry.op
        else {
            return;
        };
        if *t != ticket {
            return;
        }
        let (workload, unstage) = (workload.clone(), *unstage);
        entry.op = Op::Idle;
        let step = RetriedStep::NodeDetach(workload.clone());
        match result {
            Err(e) if e.class != ErrorClass::AlreadyDone => {
                self.step_failed(&volume, step, e, now);
            }
            _ => {
                let failed = entry.step_retry.succeeded_step(&step);
                self.events
                    .extend(failed.map(|n| recovered(&volume, (step, n))));
                if let Some(i) = entry.record.position(&workload) {
                    let claim = &mut Arc::make_mut(&mut entry.record).claims[i];
                    if claim.state == ClaimState::Releasing {
                        let before = claim.clone();
                        claim.state = ClaimState::NodeDetached(NodeDetached {
                            node: NodeStep::Detached { unstaged: unstage },
                        });
                        entry.rev += 1;
                        let after = claim.state.clone();
                        entry.unrecorded.push((entry.rev, before, after));
                    }
                }
            }
        }
        self.queue(&volume);
    }

    /// The result of an [`Action::ControllerDetach`]. `Ok` and [`ErrorClass::AlreadyDone`]
    /// mean the controller step is done; any other error fails the step and the volume is
    /// retried after its backoff ([`Event::StepFailed`] says when). Frees the plugin's
    /// controller-call slot either way.
    pub fn controller_detached(
        &mut self,
        ticket: Ticket,
        result: Result<(), DetachError>,
        now: Instant,
    ) {
        let Some(Outstanding::Controller(volume, plugin)) = self.outstanding.remove(&ticket) else {
            return;
        };
        self.release_slot(&plugin);
        let Some(entry) = self.volumes.get_mut(&volume) else {
            return;
        };
        let Op::Controller {
            ticket: t,
            workload,
            covers,
        } = &entry.op
        else {
            return;
        };
        if *t != ticket {
            return;
        }
        let (workload, covers) = (workload.clone(), covers.clone());
        entry.op = Op::Idle;
        let step = RetriedStep::ControllerDetach(workload.clone());
        match result {
            Err(e) if e.class != ErrorClass::AlreadyDone => {
                self.step_failed(&volume, step, e, now);
            }
            _ => {
                let failed = entry.step_retry.succeeded_step(&step);
                self.events
                    .extend(failed.map(|n| recovered(&volume, (step, n))));
                // `ControllerUnpublishVolume` detaches the volume from the node, not from one
                // claim: the claims on that node whose node step was done when the call was
                // made (and that are still as they were) are detached by it too.
                let record = Arc::make_mut(&mut entry.record);
                let mut changed = false;
                for claim in record.claims.iter_mut() {
                    let asked = claim.workload == workload;
                    if !asked && !covers.contains(claim) {
                        continue;
                    }
                    if let ClaimState::NodeDetached(done) = &claim.state {
                        let before = claim.clone();
                        claim.state = ClaimState::ControllerDetached(DetachSteps {
                            node: done.node,
                            controller: ControllerStep::Detached,
                        });
                        changed = true;
                        entry
                            .unrecorded
                            .push((entry.rev + 1, before, claim.state.clone()));
                    }
                }
                if changed {
                    entry.rev += 1;
                }
            }
        }
        self.queue(&volume);
    }

    /// An [`Action::ControllerDetach`] whose call was not made: see [`NotStarted`]. Frees the
    /// plugin's controller-call slot; counts no failed attempt.
    ///
    /// - [`NotStarted::NotHolder`]: the duty lapsed (its local deadline passed, or the store
    ///   refused the fence). No controller-side step starts until
    ///   [`set_controller_duty`](Self::set_controller_duty) turns the duty on again, and the
    ///   volume is read again before then: a holder acts only on what it read while holding.
    /// - [`NotStarted::Stale`]: the store holds a newer record than the one the step was
    ///   decided on; the volume is read again at once and the step decided again.
    /// - [`NotStarted::Store`]: the store could not confirm; the volume is read again after
    ///   its store backoff.
    pub fn controller_not_started(&mut self, ticket: Ticket, why: NotStarted, now: Instant) {
        let Some(Outstanding::Controller(volume, plugin)) = self.outstanding.remove(&ticket) else {
            return;
        };
        self.release_slot(&plugin);
        let Some(entry) = self.volumes.get_mut(&volume) else {
            return;
        };
        if !matches!(&entry.op, Op::Controller { ticket: t, .. } if *t == ticket) {
            return;
        }
        entry.op = Op::Idle;
        match why {
            NotStarted::NotHolder => {
                self.controller_duty = false;
                entry.reload = Reload::Wanted;
            }
            NotStarted::Stale => entry.reload = Reload::Wanted,
            NotStarted::Store(error) => {
                let unavailable = error.is_unavailable();
                self.read_again_later(&volume, error_chain(&error), error.class(), now);
                if unavailable {
                    self.store_down.insert(volume.clone());
                }
            }
        }
        self.queue(&volume);
    }

    // ----------------------------------------------------------------------------------
    // Outputs
    // ----------------------------------------------------------------------------------

    /// The next action to perform, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        while let Some(volume) = self.ready.pop_front() {
            let Some(entry) = self.volumes.get_mut(&volume) else {
                continue;
            };
            entry.queued = false;
            let action = self.next_action(&volume);
            // A slot the volume was woken for and did not take goes to the next in line.
            self.pass_on_slot(&volume);
            if let Some(action) = action {
                // The volume may have more to do (a write while a call is out); look again.
                self.queue(&volume);
                return Some(action);
            }
            if self.volumes.get(&volume).is_some_and(Entry::finished)
                && let Some(entry) = self.volumes.remove(&volume)
                && self.observing
                && entry.deleted_here
                && let Some(floor) = entry.floor
            {
                self.retired.insert(volume, floor);
            }
        }
        None
    }

    /// The next notification, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called (the earliest
    /// retry deadline), if ever.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let awaiting = self.awaiting_plugins.as_ref().map(|(until, _)| *until);
        while let Some(Reverse((at, volume))) = self.timers.peek() {
            let live = self.volumes.get(volume).is_some_and(|e| {
                e.step_retry.not_before == Some(*at) || e.store_retry.not_before == Some(*at)
            });
            if live {
                return Some(awaiting.map_or(*at, |until| until.min(*at)));
            }
            self.timers.pop();
        }
        awaiting
    }

    // ----------------------------------------------------------------------------------
    // Getters
    // ----------------------------------------------------------------------------------

    /// The claims on `volume` as the machine sees them (possibly not yet durable).
    pub fn record(&self, volume: &VolumeId) -> Option<&VolumeRecord> {
        self.volumes.get(volume).map(|e| &*e.record)
    }

    /// The claims on `volume` that are durable: [`record`](Self::record) without the claims
    /// still being written for the first time (an operator should not see a claim as taken
    /// before the store has it).
    pub fn stored_record(&self, volume: &VolumeId) -> Option<VolumeRecord> {
        let entry = self.volumes.get(volume)?;
        let mut record = (*entry.record).clone();
        let unwritten: Vec<&WorkloadId> = entry
            .waiters
            .iter()
            .filter(|w| w.what == WaitFor::Claim && w.new_claim)
            .map(|w| &w.workload)
            .collect();
        if !unwritten.is_empty() {
            record.claims.retain(|c| !unwritten.contains(&&c.workload));
        }
        Some(record)
    }

    /// Every volume the machine manages.
    pub fn volumes(&self) -> impl Iterator<Item = &VolumeId> {
        self.volumes.keys()
    }

    /// Where the release of `volume` stands: its claims and states, the call in flight, the
    /// last error with its class, the number of failed attempts and the next retry time.
    pub fn status(&self, volume: &VolumeId) -> Option<ReleaseStatus> {
        let entry = self.volumes.get(volume)?;
        let retry = if entry.store_retry.last_error.is_some() {
            &entry.store_retry
        } else {
            &entry.step_retry
        };
        // The store's backoff comes first: no step starts before the volume is read again.
        let backoff = entry
            .store_retry
            .backoff()
            .or_else(|| entry.step_retry.backoff());
        let pending = match &entry.op {
            Op::Idle => match backoff {
                Some((step, until)) => ReleaseWait::Backoff { step, until },
                None => ReleaseWait::Nothing,
            },
            Op::Node { workload, .. } => ReleaseWait::NodeDetach(workload.clone()),
            Op::Controller { workload, .. } => ReleaseWait::ControllerDetach(workload.clone()),
            Op::WaitingSlot { workload } => ReleaseWait::ControllerSlot(workload.clone()),
        };
        Some(ReleaseStatus {
            volume: volume.clone(),
            claims: entry.record.claims.clone(),
            pending,
            attempts: retry.attempts,
            last_error: retry.last_error.clone(),
            next_retry: entry.step_retry.not_before.or(entry.store_retry.not_before),
            durable: entry.clean(),
        })
    }

    /// The status of every volume whose last step or write failed.
    pub fn stuck(&self) -> Vec<ReleaseStatus> {
        self.volumes
            .iter()
            .filter(|(_, e)| e.step_retry.attempts > 0 || e.store_retry.attempts > 0)
            .filter_map(|(v, _)| self.status(v))
            .collect()
    }

    /// Whether `volume`'s record is being read again (claims and releases of it are refused
    /// with a `Reloading` error meanwhile).
    pub fn is_reloading(&self, volume: &VolumeId) -> bool {
        self.volumes
            .get(volume)
            .is_some_and(|e| e.reload != Reload::None)
    }

    /// Whether `node` was reported gone.
    pub fn is_node_gone(&self, node: &NodeId) -> bool {
        self.gone.contains(node)
    }

    // ----------------------------------------------------------------------------------
    // Internals
    // ----------------------------------------------------------------------------------

    fn queue(&mut self, volume: &VolumeId) {
        if let Some(entry) = self.volumes.get_mut(volume)
            && !entry.queued
        {
            entry.queued = true;
            self.ready.push_back(volume.clone());
        }
    }

    fn wake_where(&mut self, pick: impl Fn(&Entry) -> bool) {
        let woken: Vec<VolumeId> = self
            .volumes
            .iter_mut()
            .filter(|(_, e)| pick(e))
            .map(|(v, e)| {
                e.step_retry.not_before = None;
                e.store_retry.not_before = None;
                v.clone()
            })
            .collect();
        for volume in woken {
            self.queue(&volume);
        }
    }

    /// A read of `volume` failed: see [`reloaded`](Self::reloaded).
    fn store_failed(&mut self, volume: &VolumeId, error: &StoreError, now: Instant) {
        let Some(entry) = self.volumes.get_mut(volume) else {
            return;
        };
        let reason = error_chain(error);
        let mut unwritten = Vec::new();
        for waiter in entry.waiters.drain(..) {
            if waiter.what == WaitFor::Claim && waiter.new_claim {
                unwritten.push(waiter.workload.clone());
            }
            self.events
                .push_back(waiter.not_stored(volume, reason.clone()));
        }
        if !unwritten.is_empty() {
            // Never durable as far as anyone knows: not shown as taken. If the write did
            // reach the store, the read that follows brings the claim back.
            Arc::make_mut(&mut entry.record)
                .claims
                .retain(|c| !unwritten.contains(&c.workload));
        }
        entry.store_fault = Some(reason.clone());
        self.read_again_later(volume, reason, error.class(), now);
        // The store itself failed, not this volume's record: any later success of the store
        // ends the volume's wait.
        if error.is_unavailable() {
            self.store_down.insert(volume.clone());
        }
    }

    /// Reads `volume` again after its store backoff, `reason` being the store's error (of
    /// class `class`); announces the wait ([`Event::StepFailed`]).
    fn read_again_later(
        &mut self,
        volume: &VolumeId,
        reason: String,
        class: ErrorClass,
        now: Instant,
    ) {
        let Some(entry) = self.volumes.get_mut(volume) else {
            return;
        };
        entry.reload = Reload::Wanted;
        let step = RetriedStep::StoreRead;
        let detail = reason.clone();
        let at = entry.store_retry.failed(
            step.clone(),
            now,
            LastError::Store {
                detail: reason,
                at: now,
            },
            false,
            &self.config.backoff,
            &mut self.rng,
        );
        let attempt = entry.store_retry.attempts;
        self.retry_at(volume, step, (class, None, detail), attempt, at);
    }

    /// A detach call of `volume` failed: the volume's release steps wait out its backoff (at
    /// the cap for a fatal error); announces the wait ([`Event::StepFailed`]).
    fn step_failed(
        &mut self,
        volume: &VolumeId,
        step: RetriedStep,
        error: DetachError,
        now: Instant,
    ) {
        let Some(entry) = self.volumes.get_mut(volume) else {
            return;
        };
        let (class, rpc, detail) = (error.class, Some(error.rpc), error.detail.clone());
        let at = entry.step_retry.failed(
            step.clone(),
            now,
            LastError::Detach { error, at: now },
            class == ErrorClass::Fatal,
            &self.config.backoff,
            &mut self.rng,
        );
        let attempt = entry.step_retry.attempts;
        self.retry_at(volume, step, (class, rpc, detail), attempt, at);
    }

    /// Wakes `volume` at `at` for the retry of `step`, whose `attempt` failed (with its
    /// class, the call and what went wrong), and announces it ([`Event::StepFailed`]).
    fn retry_at(
        &mut self,
        volume: &VolumeId,
        step: RetriedStep,
        (class, rpc, detail): (ErrorClass, Option<DetachRpc>, String),
        attempt: u32,
        at: Instant,
    ) {
        self.timers.push(Reverse((at, volume.clone())));
        self.events.push_back(Event::StepFailed(StepFailure {
            volume: volume.clone(),
            step,
            class,
            rpc,
            detail,
            attempt,
            next_retry: at,
        }));
    }

    /// The store answered a call: the volumes that wait out a backoff because the store had
    /// failed are read again now.
    fn store_answered(&mut self) {
        if self.store_down.is_empty() {
            return;
        }
        let down = std::mem::take(&mut self.store_down);
        for volume in down {
            self.read_again_now(&volume);
        }
    }

    /// Ends the backoff of a volume that waits to be read again after a failed store call.
    fn read_again_now(&mut self, volume: &VolumeId) {
        if let Some(entry) = self.volumes.get_mut(volume)
            && entry.reload == Reload::Wanted
            && entry.store_fault.is_some()
        {
            entry.store_retry.not_before = None;
            self.queue(volume);
        }
    }

    fn ticket(&mut self) -> Ticket {
        self.next_ticket += 1;
        Ticket(self.next_ticket)
    }

    /// A controller call of `plugin` ended: its slot goes to the next in line.
    fn release_slot(&mut self, plugin: &PluginId) {
        if let Some(slots) = self.slots.get_mut(plugin) {
            slots.busy = slots.busy.saturating_sub(1);
        }
        self.wake_slot_waiters(plugin);
    }

    /// `volume` was looked at: a slot it was woken for and did not take is handed back, and
    /// goes to the next in line.
    fn pass_on_slot(&mut self, volume: &VolumeId) {
        let Some(entry) = self.volumes.get_mut(volume) else {
            return;
        };
        let Some(plugin) = entry.slot_grant.take() else {
            return;
        };
        // A write or read of its own comes first: the volume keeps its place in the line.
        if !entry.settled() {
            entry.kept_turn = Some(plugin.clone());
        }
        if let Some(slots) = self.slots.get_mut(&plugin) {
            slots.granted = slots.granted.saturating_sub(1);
        }
        self.wake_slot_waiters(&plugin);
    }

    /// Wakes the oldest waiters of `plugin`, one per free slot, handing each a slot. Entries
    /// that no longer wait (gone, or no longer in [`Op::WaitingSlot`]) are dropped unwoken.
    fn wake_slot_waiters(&mut self, plugin: &PluginId) {
        let limit = self.config.controller_limit(plugin);
        let Some(slots) = self.slots.get_mut(plugin) else {
            return;
        };
        while slots.busy + slots.granted < limit {
            let Some(volume) = slots.waiters.pop_front() else {
                break;
            };
            let Some(entry) = self.volumes.get_mut(&volume) else {
                continue;
            };
            if !matches!(entry.op, Op::WaitingSlot { .. }) {
                continue;
            }
            entry.op = Op::Idle;
            entry.slot_grant = Some(plugin.clone());
            slots.granted += 1;
            if !entry.queued {
                entry.queued = true;
                self.ready.push_back(volume);
            }
        }
    }

    fn next_action(&mut self, volume: &VolumeId) -> Option<Action> {
        let gone = &self.gone;
        let (node_duties, controller_duty) = (&self.config.duties.node, self.controller_duty);
        let performs = |claim: &Claim, side: Side| match side {
            Side::Node => match node_duties {
                NodeDuties::All => true,
                NodeDuties::Only(node) => &claim.node == node,
            },
            Side::Controller => controller_duty,
        };
        let entry = self.volumes.get_mut(volume)?;

        // 1. A reload after a stale write comes before anything else.
        match entry.reload {
            Reload::InFlight(_) => return None,
            Reload::Wanted if entry.persist.is_none() => {
                if !entry.store_retry.ready() {
                    return None;
                }
                self.next_ticket += 1;
                let ticket = Ticket(self.next_ticket);
                entry.reload = Reload::InFlight(ticket);
                self.outstanding
                    .insert(ticket, Outstanding::Reload(volume.clone()));
                return Some(Action::Reload(ReloadRequest {
                    ticket,
                    volume: volume.clone(),
                }));
            }
            Reload::Wanted => return None,
            Reload::None => {}
        }

        // 2. Make every change durable, one write at a time.
        if entry.persist.is_none() && entry.rev > entry.durable_rev {
            if !entry.store_retry.ready() {
                return None;
            }
            return Some(self.persist_action(volume, false));
        }

        // 3. The next release step, only when everything is durable and nothing is out.
        if entry.op != Op::Idle || !entry.clean() || !entry.step_retry.ready() {
            return None;
        }
        let deferred = entry.step_retry.failed_for();
        let step = next_step_performed_by(&entry.record, |n| gone.contains(n), deferred, performs);
        if !matches!(step, Step::ControllerDetach { .. }) {
            entry.kept_turn = None;
        }
        // After a start, no plugin call before the plugin is known to be there again.
        let waits = match step {
            Step::NodeDetach { .. } => true,
            Step::ControllerDetach { .. } => self.awaiting_controllers,
            _ => false,
        };
        if waits
            && let Some((_, available)) = &self.awaiting_plugins
            && !available.contains(&entry.record.info.plugin)
        {
            return None;
        }
        match step {
            Step::Idle => None,
            Step::Record { index, to } => {
                Arc::make_mut(&mut entry.record).claims[index].state = to;
                entry.rev += 1;
                Some(self.persist_action(volume, true))
            }
            Step::Free { index } => {
                let mut claim = Arc::make_mut(&mut entry.record).claims.remove(index);
                claim.state = match claim.state {
                    ClaimState::ReadyToFree(d) | ClaimState::Freed(d) => ClaimState::Freed(d),
                    other => other,
                };
                entry.rev += 1;
                entry.frees.push((entry.rev, claim));
                Some(self.persist_action(volume, true))
            }
            Step::NodeDetach { index, unstage } => {
                let claim = &entry.record.claims[index];
                let info = &entry.record.info;
                self.next_ticket += 1;
                let ticket = Ticket(self.next_ticket);
                let request = NodeDetachRequest {
                    ticket,
                    volume: volume.clone(),
                    external_volume: info.external_id.clone(),
                    plugin: info.plugin.clone(),
                    node: claim.node.clone(),
                    workload: claim.workload.clone(),
                    access_mode: claim.access_mode,
                    attachment: claim.attachment,
                    read_only: claim.mode == ClaimMode::Read,
                    unstage,
                };
                entry.op = Op::Node {
                    ticket,
                    workload: claim.workload.clone(),
                    unstage,
                };
                self.outstanding
                    .insert(ticket, Outstanding::Node(volume.clone()));
                Some(Action::NodeDetach(request))
            }
            Step::ControllerDetach { index } => {
                let claim = &entry.record.claims[index];
                let info = &entry.record.info;
                let plugin = info.plugin.clone();
                let limit = self.config.controller_limit(&plugin);
                let slots = self.slots.entry(plugin.clone()).or_default();
                // A volume woken from the line takes the slot it was handed, and one that
                // kept its place goes first; any other takes a free slot only when nobody
                // waits (no overtaking the line).
                let woken = entry.slot_grant.take_if(|p| *p == plugin).is_some();
                let ahead = entry.kept_turn.take_if(|p| *p == plugin).is_some();
                if woken {
                    slots.granted = slots.granted.saturating_sub(1);
                }
                let free = slots.busy + slots.granted < limit;
                if !free || (!woken && !ahead && !slots.waiters.is_empty()) {
                    entry.op = Op::WaitingSlot {
                        workload: claim.workload.clone(),
                    };
                    debug_assert!(
                        !slots.waiters.contains(volume),
                        "a volume waits for a slot at most once"
                    );
                    if ahead {
                        slots.waiters.push_front(volume.clone());
                    } else {
                        slots.waiters.push_back(volume.clone());
                    }
                    // Should a slot be free, the line moves on (never stranded).
                    self.wake_slot_waiters(&plugin);
                    return None;
                }
                slots.busy += 1;
                self.next_ticket += 1;
                let ticket = Ticket(self.next_ticket);
                let request = ControllerDetachRequest {
                    ticket,
                    volume: volume.clone(),
                    external_volume: info.external_id.clone(),
                    plugin: plugin.clone(),
                    node: claim.node.clone(),
                    plugin_node: claim.plugin_node.clone(),
                    workload: claim.workload.clone(),
                    decided_on: entry.version,
                    duty_deadline: None,
                };
                let covers = entry
                    .record
                    .claims
                    .iter()
                    .filter(|c| {
                        c.node == claim.node
                            && c.workload != claim.workload
                            && matches!(c.state, ClaimState::NodeDetached(_))
                    })
                    .cloned()
                    .collect();
                entry.op = Op::Controller {
                    ticket,
                    workload: claim.workload.clone(),
                    covers,
                };
                self.outstanding
                    .insert(ticket, Outstanding::Controller(volume.clone(), plugin));
                Some(Action::ControllerDetach(request))
            }
        }
    }

    fn persist_action(&mut self, volume: &VolumeId, fenced: bool) -> Action {
        let ticket = self.ticket();
        let entry = self
            .volumes
            .get_mut(volume)
            .expect("invariant: persist_action is only called for a managed volume");
        entry.persist = Some((ticket, entry.rev));
        self.outstanding
            .insert(ticket, Outstanding::Persist(volume.clone()));
        Action::Persist(PersistRequest {
            ticket,
            volume: volume.clone(),
            expected: entry.version,
            record: (!entry.record.claims.is_empty()).then(|| Arc::clone(&entry.record)),
            fenced,
        })
    }
}

/// [`Event::Freed`] for each claim that was being released in `old` and is gone from `new`:
/// another writer freed it. The claim carries the last state this machine saw (in state
/// [`ClaimState::Freed`] when that state said how both steps ended).
fn freed_elsewhere<'a>(
    old: &'a VolumeRecord,
    new: &'a VolumeRecord,
) -> impl Iterator<Item = Event> + 'a {
    old.claims
        .iter()
        .filter(|c| c.state.is_releasing() && new.position(&c.workload).is_none())
        .map(|c| {
            let mut claim = c.clone();
            // The agent that freed it knew how both steps ended; this one knows what it saw.
            let detached = match &claim.state {
                ClaimState::ControllerDetached(d) | ClaimState::ReadyToFree(d) => d.clone(),
                ClaimState::NodeDetached(n) => DetachSteps {
                    node: n.node,
                    controller: ControllerStep::DoneElsewhere,
                },
                _ => DetachSteps {
                    node: NodeStep::DoneElsewhere,
                    controller: ControllerStep::DoneElsewhere,
                },
            };
            claim.state = ClaimState::Freed(detached);
            Event::Freed(claim)
        })
}

/// [`Event::StepRecovered`]: `volume`'s `step` succeeded after `failed_attempts` failures.
fn recovered(volume: &VolumeId, (step, failed_attempts): (RetriedStep, u32)) -> Event {
    Event::StepRecovered {
        volume: volume.clone(),
        step,
        failed_attempts,
    }
}

#[cfg(test)]
mod tests;
