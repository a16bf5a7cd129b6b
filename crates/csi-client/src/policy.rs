//! THE per-RPC policy table: deadlines, idempotency, which failures are retried, attempt
//! limits, total budgets, and the classification of every failure into an [`ErrorClass`].
//!
//! Everything the client decides about an RPC's timing and retrying lives in this one file, so
//! it can be read against the CSI spec (its per-RPC error tables, idempotency rules, timeouts
//! and general error scheme) in one sitting.
//!
//! Three separate pieces, in the manner of tower's retry module:
//! 1. **Classification** ([`classify`], [`classify_failure`]): a pure function from the RPC and
//!    what went wrong to an [`ErrorClass`]. It says what the *caller* should do.
//! 2. **Retry decision** ([`RpcPolicy::retries`]): which failures the client itself retries
//!    before returning, with a backoff ([`Backoff`]).
//! 3. **Limits**: an attempt limit and a total time budget per call (here), and a retry budget
//!    shared by all calls of a client ([`RetryBudget`](crate::RetryBudget)).
//!
//! Rules that hold for every row: UNIMPLEMENTED and INVALID_ARGUMENT are never retried, and
//! Probe is never retried (its caller — a health loop — is the retry loop).

use std::time::Duration;

use csi_proto::Rpc;
use csi_structs::ErrorClass;
use tonic::Code;

/// Whether an RPC changes anything on the storage side.
///
/// Every CSI RPC that changes state is required by the spec to be idempotent (§2.6), so both
/// kinds are safe to send again; the difference is what an unknown outcome means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    /// No side effect: a failed attempt changed nothing, whatever happened to it.
    ReadOnly,
    /// Changes state; the spec requires it to be idempotent. A failed attempt may or may not
    /// have taken effect.
    IdempotentMutation,
}

impl Effect {
    /// Whether the RPC changes state.
    pub const fn is_mutating(self) -> bool {
        matches!(self, Effect::IdempotentMutation)
    }
}

/// A set of gRPC codes, as a bit set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CodeSet(u32);

impl CodeSet {
    /// The empty set.
    pub const EMPTY: CodeSet = CodeSet(0);

    /// A set of the given codes.
    pub const fn of(codes: &[Code]) -> CodeSet {
        let mut bits = 0u32;
        let mut i = 0;
        while i < codes.len() {
            bits |= 1 << (codes[i] as u32);
            i += 1;
        }
        CodeSet(bits)
    }

    /// Whether `code` is in the set.
    pub const fn contains(self, code: Code) -> bool {
        self.0 & (1 << (code as u32)) != 0
    }

    /// The set with `code` added.
    #[must_use]
    pub const fn with(self, code: Code) -> CodeSet {
        CodeSet(self.0 | (1 << (code as u32)))
    }

    /// Every code in either set.
    #[must_use]
    pub const fn union(self, other: CodeSet) -> CodeSet {
        CodeSet(self.0 | other.0)
    }

    /// The set with `code` removed.
    #[must_use]
    pub const fn without(self, code: Code) -> CodeSet {
        CodeSet(self.0 & !(1 << (code as u32)))
    }
}

impl std::fmt::Debug for CodeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut set = f.debug_set();
        for n in 0..=16 {
            let code = Code::from_i32(n);
            if self.contains(code) {
                set.entry(&code);
            }
        }
        set.finish()
    }
}

/// Exponential backoff between attempts: `initial`, then times `factor`, never above `max`,
/// each delay with random jitter (delays are built with [`backon`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// Pause before the first retry.
    pub initial: Duration,
    /// Longest pause; jitter never pushes a pause above it.
    pub max: Duration,
    /// Growth factor per retry.
    pub factor: f32,
    /// Whether to add random jitter (up to the current delay) so that many clients failing
    /// together do not retry in lockstep.
    pub jitter: bool,
}

impl Backoff {
    /// Short calls (identity, capabilities, reads): 100 ms doubling to 2 s.
    pub const SHORT: Backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(2),
        factor: 2.0,
        jitter: true,
    };

    /// Mutations that reach cloud APIs: 1 s doubling to 30 s (the Kubernetes sidecars start at
    /// 1 s).
    pub const LONG: Backoff = Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(30),
        factor: 2.0,
        jitter: true,
    };

    /// The sequence of pauses for up to `retries` retries.
    pub fn delays(&self, retries: u32) -> impl Iterator<Item = Duration> + use<> {
        use backon::BackoffBuilder as _;
        let mut builder = backon::ExponentialBuilder::new()
            .with_min_delay(self.initial)
            .with_max_delay(self.max)
            .with_factor(self.factor)
            .with_max_times(retries as usize);
        if self.jitter {
            builder = builder.with_jitter();
        }
        let cap = self.max;
        builder.build().map(move |d| d.min(cap))
    }
}

/// How the client treats one RPC. One row of the table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RpcPolicy {
    /// Deadline of one attempt; also sent to the plugin as `grpc-timeout`.
    pub attempt_deadline: Duration,
    /// Deadline of the whole call, all attempts and pauses included.
    pub total_budget: Duration,
    /// Most attempts, the first included (1 = never retried).
    pub max_attempts: u32,
    /// Whether the RPC changes state.
    pub effect: Effect,
    /// Plugin status codes the client retries itself (after backoff).
    pub retry_codes: CodeSet,
    /// Whether an attempt that hit its deadline, or whose connection broke mid-call, is
    /// retried. Safe for every CSI RPC because mutations are idempotent (§2.6, §3.3).
    pub retry_uncertain: bool,
    /// Pauses between attempts.
    pub backoff: Backoff,
}

/// What went wrong with one attempt, as far as classification is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The plugin answered with this (non-OK) status code.
    Status(Code),
    /// The attempt hit its own deadline (our timer, not a code from the wire).
    AttemptDeadline,
    /// The whole call ran out of its total budget.
    CallDeadline,
    /// The connection broke after the request may have been sent.
    ConnectionLost,
    /// The plugin could not be reached at all; the request was never sent.
    NotConnected,
    /// The endpoint can never be dialled as it is (not a socket, permission denied, an
    /// invalid address: an [`EndpointFault`](crate::connection::EndpointFault)); the request
    /// was never sent and no retry can change that.
    BadEndpoint,
    /// The plugin's answer was unusable: over the decode limit, undecodable, not gRPC, or
    /// breaking the spec (a missing required field, a negative size, a stream out of order).
    /// The plugin reported no failure; we refused its answer.
    InvalidResponse,
    /// The request was refused before sending (it breaks the spec); nothing was sent.
    InvalidRequest,
    /// Another call about the same volume held the volume's turn until the call's budget ran
    /// out ([`VolumeTurns`](crate::VolumeTurns)); nothing was sent.
    VolumeBusy,
}

const fn index(rpc: Rpc) -> usize {
    rpc as usize
}

/// Codes every retry-safe RPC retries: the plugin is briefly unavailable, or another operation
/// on the same volume is pending (§3.7 ABORTED), or the plugin is shedding load.
const TRANSIENT: CodeSet =
    CodeSet::of(&[Code::Unavailable, Code::Aborted, Code::ResourceExhausted]);
/// A deadline or cancellation reported *by the plugin*: retrying an idempotent call continues
/// where it stopped (§3.3).
const PLUGIN_TIMEOUTS: CodeSet = CodeSet::of(&[Code::DeadlineExceeded, Code::Cancelled]);

/// Whether the RPC's table entry in the spec makes ABORTED mean "bad `starting_token`": a retry
/// with the same token fails the same way, the listing must restart.
const fn aborted_means_bad_token(rpc: Rpc) -> bool {
    matches!(
        rpc,
        Rpc::ListVolumes | Rpc::ListSnapshots | Rpc::ControllerListVolumeHealth
    )
}

/// Whether RESOURCE_EXHAUSTED names a condition only someone else can remove (quota, a full
/// node, no space), so retrying within one call is pointless: CreateVolume ("remove the cause,
/// then backoff"), ControllerPublishVolume (node at its volume limit), CreateSnapshot ("no
/// automatic retry"), CreateVolumeGroupSnapshot (no space).
const fn exhausted_needs_outside_action(rpc: Rpc) -> bool {
    matches!(
        rpc,
        Rpc::CreateVolume
            | Rpc::ControllerPublishVolume
            | Rpc::CreateSnapshot
            | Rpc::CreateVolumeGroupSnapshot
    )
}

/// Whether NOT_FOUND means "the thing to remove is already gone": the desired end state holds.
const fn not_found_means_done(rpc: Rpc) -> bool {
    matches!(
        rpc,
        Rpc::NodeUnpublishVolume
            | Rpc::NodeUnstageVolume
            | Rpc::ControllerUnpublishVolume
            | Rpc::DeleteVolume
            | Rpc::DeleteSnapshot
            | Rpc::DeleteVolumeGroupSnapshot
    )
}

/// The spec's idempotency summary (§2.6): the RPCs that change state.
pub const fn effect(rpc: Rpc) -> Effect {
    match rpc {
        Rpc::CreateVolume
        | Rpc::DeleteVolume
        | Rpc::ControllerPublishVolume
        | Rpc::ControllerUnpublishVolume
        | Rpc::ControllerModifyVolume
        | Rpc::CreateSnapshot
        | Rpc::DeleteSnapshot
        | Rpc::ControllerExpandVolume
        | Rpc::NodeStageVolume
        | Rpc::NodeUnstageVolume
        | Rpc::NodePublishVolume
        | Rpc::NodeUnpublishVolume
        | Rpc::NodeExpandVolume
        | Rpc::CreateVolumeGroupSnapshot
        | Rpc::DeleteVolumeGroupSnapshot => Effect::IdempotentMutation,
        // ValidateVolumeCapabilities is listed as "must be idempotent" but changes nothing.
        Rpc::ValidateVolumeCapabilities
        | Rpc::GetPluginInfo
        | Rpc::GetPluginCapabilities
        | Rpc::Probe
        | Rpc::ListVolumes
        | Rpc::ControllerListVolumeHealth
        | Rpc::ControllerGetVolumeHealth
        | Rpc::GetCapacity
        | Rpc::ControllerGetCapabilities
        | Rpc::ListSnapshots
        | Rpc::GetSnapshot
        | Rpc::ControllerGetVolume
        | Rpc::GroupControllerGetCapabilities
        | Rpc::GetVolumeGroupSnapshot
        | Rpc::GetMetadataAllocated
        | Rpc::GetMetadataDelta
        | Rpc::NodeGetVolumeStats
        | Rpc::NodeGetVolumeHealth
        | Rpc::NodeGetStorageHealth
        | Rpc::NodeGetCapabilities
        | Rpc::NodeGetInfo => Effect::ReadOnly,
    }
}

/// The default policy of `rpc`: the table.
///
/// | group | attempt deadline | total | attempts | backoff |
/// |---|---|---|---|---|
/// | Probe | 5 s | 5 s | 1 (never retried) | — |
/// | GetPluginInfo, GetPluginCapabilities, *GetCapabilities, NodeGetInfo | 10 s | 30 s | 3 | short |
/// | controller and node mutations (cloud APIs) | 2 min | 10 min | 4 | long |
/// | ValidateVolumeCapabilities and other reads | 30 s | 2 min | 3 | short |
/// | snapshot metadata streams (opening, and each message) | 60 s | 30 min | 3 | short |
///
/// Two minutes per mutation attempt is what Kubernetes (kubelet's `csiTimeout`) and Nomad use;
/// five seconds per probe is Nomad's supervisor value.
pub const fn default_policy(rpc: Rpc) -> RpcPolicy {
    let effect = effect(rpc);
    let mut retry_codes = TRANSIENT.union(PLUGIN_TIMEOUTS);
    if aborted_means_bad_token(rpc) {
        retry_codes = retry_codes.without(Code::Aborted);
    }
    if exhausted_needs_outside_action(rpc) {
        retry_codes = retry_codes.without(Code::ResourceExhausted);
    }
    match rpc {
        Rpc::Probe => RpcPolicy {
            attempt_deadline: Duration::from_secs(5),
            total_budget: Duration::from_secs(5),
            max_attempts: 1,
            effect,
            retry_codes: CodeSet::EMPTY,
            retry_uncertain: false,
            backoff: Backoff::SHORT,
        },
        Rpc::GetPluginInfo
        | Rpc::GetPluginCapabilities
        | Rpc::ControllerGetCapabilities
        | Rpc::NodeGetCapabilities
        | Rpc::GroupControllerGetCapabilities
        | Rpc::NodeGetInfo => RpcPolicy {
            attempt_deadline: Duration::from_secs(10),
            total_budget: Duration::from_secs(30),
            max_attempts: 3,
            effect,
            retry_codes,
            retry_uncertain: true,
            backoff: Backoff::SHORT,
        },
        Rpc::GetMetadataAllocated | Rpc::GetMetadataDelta => RpcPolicy {
            attempt_deadline: Duration::from_secs(60),
            total_budget: Duration::from_secs(30 * 60),
            max_attempts: 3,
            effect,
            retry_codes,
            retry_uncertain: true,
            backoff: Backoff::SHORT,
        },
        _ => match effect {
            Effect::IdempotentMutation => RpcPolicy {
                attempt_deadline: Duration::from_secs(120),
                total_budget: Duration::from_secs(600),
                max_attempts: 4,
                effect,
                retry_codes,
                retry_uncertain: true,
                backoff: Backoff::LONG,
            },
            Effect::ReadOnly => RpcPolicy {
                attempt_deadline: Duration::from_secs(30),
                total_budget: Duration::from_secs(120),
                max_attempts: 3,
                effect,
                retry_codes,
                retry_uncertain: true,
                backoff: Backoff::SHORT,
            },
        },
    }
}

/// Classifies a status code the plugin returned for `rpc`. Pure; the table in the tests lists
/// every interesting pair.
///
/// The general rules (§3.7) with the per-RPC exceptions of §2:
/// - NOT_FOUND on an unpublish, unstage or delete: the thing is gone → [`ErrorClass::AlreadyDone`].
///   Elsewhere NOT_FOUND means the object the request names does not exist → fatal.
/// - UNAVAILABLE, RESOURCE_EXHAUSTED → retry; ABORTED → retry (another operation is pending),
///   except on the listing RPCs where it means a bad `starting_token` → fatal (restart listing).
/// - DEADLINE_EXCEEDED, CANCELLED, UNKNOWN, INTERNAL: on a mutating RPC the operation may have
///   happened → [`ErrorClass::Uncertain`]; on a read → retry.
/// - FAILED_PRECONDITION: per RPC (see below).
/// - INVALID_ARGUMENT, ALREADY_EXISTS, OUT_OF_RANGE, UNIMPLEMENTED, PERMISSION_DENIED,
///   UNAUTHENTICATED, DATA_LOSS → fatal: the request (or its secrets, or an admin) must change.
///
/// FAILED_PRECONDITION:
/// - Probe: the plugin is not healthy → [`ErrorClass::RetryElsewhere`] (this instance cannot serve).
/// - DeleteVolume, DeleteSnapshot, DeleteVolumeGroupSnapshot (in use), ControllerPublishVolume
///   (published on another node), ControllerExpandVolume (published, no online expansion): the
///   condition clears once other operations finish → retry later (not retried within the call).
/// - NodeStageVolume, NodePublishVolume (capability not supported, or not staged),
///   NodeExpandVolume (spec: no-retry), CreateVolumeGroupSnapshot (volume configuration),
///   GetMetadataDelta (no changed-block tracking) and every other RPC → fatal.
pub const fn classify(rpc: Rpc, code: Code) -> ErrorClass {
    let mutating = effect(rpc).is_mutating();
    match code {
        Code::NotFound if not_found_means_done(rpc) => ErrorClass::AlreadyDone,
        Code::NotFound => ErrorClass::Fatal,
        Code::Aborted if aborted_means_bad_token(rpc) => ErrorClass::Fatal,
        Code::Unavailable | Code::ResourceExhausted | Code::Aborted => ErrorClass::Retry,
        // An OK code in an error position is a broken plugin; the outcome is unknown.
        Code::Ok | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown | Code::Internal => {
            if mutating {
                ErrorClass::Uncertain
            } else {
                ErrorClass::Retry
            }
        }
        Code::FailedPrecondition => match rpc {
            Rpc::Probe => ErrorClass::RetryElsewhere,
            Rpc::DeleteVolume
            | Rpc::DeleteSnapshot
            | Rpc::DeleteVolumeGroupSnapshot
            | Rpc::ControllerPublishVolume
            | Rpc::ControllerExpandVolume => ErrorClass::Retry,
            _ => ErrorClass::Fatal,
        },
        Code::InvalidArgument
        | Code::AlreadyExists
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::DataLoss => ErrorClass::Fatal,
    }
}

/// Classifies any failure of `rpc`, including those that carry no status code.
///
/// - A deadline (ours, per attempt or overall) or a connection lost mid-call: on a mutating RPC
///   the operation may have happened → [`ErrorClass::Uncertain`]; on a read → retry.
/// - The plugin could not be reached at all: this instance cannot serve →
///   [`ErrorClass::RetryElsewhere`].
/// - The endpoint can never be dialled as it is (not a socket, permission denied, an invalid
///   address) → [`ErrorClass::Fatal`]: the configuration or the filesystem must change.
/// - An unusable answer (too large, undecodable, not gRPC, breaking the spec): the plugin
///   reported no failure, so on a mutating RPC the operation may have happened →
///   uncertain; on a read nothing changed → retry. Never fatal: the request was fine.
/// - A request refused before sending → fatal.
/// - A call whose volume stayed busy with another call until its budget ran out: nothing
///   was sent → retry.
pub const fn classify_failure(rpc: Rpc, failure: Failure) -> ErrorClass {
    let mutating = effect(rpc).is_mutating();
    match failure {
        Failure::Status(code) => classify(rpc, code),
        Failure::AttemptDeadline
        | Failure::CallDeadline
        | Failure::ConnectionLost
        | Failure::InvalidResponse => {
            if mutating {
                ErrorClass::Uncertain
            } else {
                ErrorClass::Retry
            }
        }
        Failure::NotConnected => ErrorClass::RetryElsewhere,
        Failure::BadEndpoint => ErrorClass::Fatal,
        Failure::InvalidRequest => ErrorClass::Fatal,
        Failure::VolumeBusy => ErrorClass::Retry,
    }
}

impl RpcPolicy {
    /// Whether the client retries `failure` itself (attempts and budgets permitting).
    ///
    /// Never: INVALID_ARGUMENT, UNIMPLEMENTED (whatever the table says), invalid requests,
    /// unusable answers (the same request would most likely get the same answer; the caller
    /// decides by the class), the overall deadline, an endpoint that can never be dialled as
    /// it is.
    /// Always (if `max_attempts` allows): a plugin that could not be reached, because nothing
    /// was sent.
    pub const fn retries(&self, failure: Failure) -> bool {
        match failure {
            Failure::Status(Code::InvalidArgument | Code::Unimplemented) => false,
            Failure::Status(code) => self.retry_codes.contains(code),
            Failure::AttemptDeadline | Failure::ConnectionLost => self.retry_uncertain,
            Failure::NotConnected => true,
            Failure::CallDeadline
            | Failure::BadEndpoint
            | Failure::InvalidResponse
            | Failure::InvalidRequest
            | Failure::VolumeBusy => false,
        }
    }

    /// This policy with the per-call overrides of `options` applied.
    #[must_use]
    pub fn with_options(mut self, options: &CallOptions) -> RpcPolicy {
        if let Some(d) = options.attempt_deadline {
            self.attempt_deadline = d;
        }
        if let Some(t) = options.total_budget {
            self.total_budget = t;
        }
        if let Some(n) = options.max_attempts {
            self.max_attempts = n.max(1);
        }
        self
    }
}

/// Per-call overrides of an [`RpcPolicy`]. Unset fields keep the client's policy. Probe stays
/// at one attempt whatever `max_attempts` says.
///
/// ```
/// use std::time::Duration;
/// use csi_client::CallOptions;
///
/// let opts = CallOptions::new().attempt_deadline(Duration::from_secs(5)).max_attempts(1);
/// assert_eq!(opts.max_attempts, Some(1));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// Deadline of one attempt.
    pub attempt_deadline: Option<Duration>,
    /// Deadline of the whole call.
    pub total_budget: Option<Duration>,
    /// Most attempts (at least 1).
    pub max_attempts: Option<u32>,
}

impl CallOptions {
    /// No overrides.
    pub const fn new() -> Self {
        CallOptions {
            attempt_deadline: None,
            total_budget: None,
            max_attempts: None,
        }
    }

    /// Overrides the per-attempt deadline.
    #[must_use]
    pub const fn attempt_deadline(mut self, deadline: Duration) -> Self {
        self.attempt_deadline = Some(deadline);
        self
    }

    /// Overrides the whole call's deadline.
    #[must_use]
    pub const fn total_budget(mut self, budget: Duration) -> Self {
        self.total_budget = Some(budget);
        self
    }

    /// Overrides the attempt limit (values below 1 count as 1).
    #[must_use]
    pub const fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }
}

/// The policy of every RPC for one client: [`default_policy`] unless overridden. Probe is
/// sent once per call even if its row is changed to allow more attempts.
///
/// ```
/// use std::time::Duration;
/// use csi_client::{PolicyTable, Rpc};
///
/// let mut table = PolicyTable::default();
/// table.update(Rpc::NodePublishVolume, |p| p.attempt_deadline = Duration::from_secs(30));
/// assert_eq!(table.get(Rpc::NodePublishVolume).attempt_deadline, Duration::from_secs(30));
/// assert_eq!(table.get(Rpc::Probe).max_attempts, 1);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyTable {
    rows: Vec<RpcPolicy>,
}

impl Default for PolicyTable {
    fn default() -> Self {
        PolicyTable {
            rows: Rpc::ALL.iter().map(|&rpc| default_policy(rpc)).collect(),
        }
    }
}

impl PolicyTable {
    /// The policy of `rpc`.
    pub fn get(&self, rpc: Rpc) -> RpcPolicy {
        self.rows
            .get(index(rpc))
            .copied()
            .unwrap_or_else(|| default_policy(rpc))
    }

    /// Replaces the policy of `rpc`.
    pub fn set(&mut self, rpc: Rpc, policy: RpcPolicy) {
        if let Some(row) = self.rows.get_mut(index(rpc)) {
            *row = policy;
        }
    }

    /// Changes the policy of `rpc` in place.
    pub fn update(&mut self, rpc: Rpc, change: impl FnOnce(&mut RpcPolicy)) {
        if let Some(row) = self.rows.get_mut(index(rpc)) {
            change(row);
        }
    }

    /// Changes the policy of every RPC in place (for example to shorten all deadlines in
    /// tests).
    pub fn update_all(&mut self, mut change: impl FnMut(Rpc, &mut RpcPolicy)) {
        for (&rpc, row) in Rpc::ALL.iter().zip(self.rows.iter_mut()) {
            change(rpc, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorClass::*;

    #[test]
    fn rpc_index_matches_declaration_order() {
        for (i, &rpc) in Rpc::ALL.iter().enumerate() {
            assert_eq!(index(rpc), i, "{rpc:?}");
        }
    }

    #[test]
    fn classification_table() {
        let table: &[(Rpc, Code, ErrorClass)] = &[
            // Removal of something absent is done.
            (Rpc::NodeUnpublishVolume, Code::NotFound, AlreadyDone),
            (Rpc::NodeUnstageVolume, Code::NotFound, AlreadyDone),
            (Rpc::ControllerUnpublishVolume, Code::NotFound, AlreadyDone),
            (Rpc::DeleteVolume, Code::NotFound, AlreadyDone),
            (Rpc::DeleteSnapshot, Code::NotFound, AlreadyDone),
            (Rpc::DeleteVolumeGroupSnapshot, Code::NotFound, AlreadyDone),
            // Elsewhere NOT_FOUND names a missing object.
            (Rpc::NodePublishVolume, Code::NotFound, Fatal),
            (Rpc::ControllerPublishVolume, Code::NotFound, Fatal),
            (Rpc::NodeExpandVolume, Code::NotFound, Fatal),
            (Rpc::GetSnapshot, Code::NotFound, Fatal),
            // Transient.
            (Rpc::CreateVolume, Code::Unavailable, Retry),
            (Rpc::NodeGetInfo, Code::Unavailable, Retry),
            (Rpc::ControllerPublishVolume, Code::ResourceExhausted, Retry),
            (Rpc::NodeStageVolume, Code::Aborted, Retry),
            (Rpc::CreateSnapshot, Code::Aborted, Retry),
            // ABORTED on listings is a bad token: restart the listing.
            (Rpc::ListVolumes, Code::Aborted, Fatal),
            (Rpc::ListSnapshots, Code::Aborted, Fatal),
            (Rpc::ControllerListVolumeHealth, Code::Aborted, Fatal),
            // Unknown outcome on mutations, plain retry on reads.
            (Rpc::NodePublishVolume, Code::DeadlineExceeded, Uncertain),
            (Rpc::CreateVolume, Code::Cancelled, Uncertain),
            (Rpc::ControllerPublishVolume, Code::Internal, Uncertain),
            (Rpc::NodeUnstageVolume, Code::Unknown, Uncertain),
            (Rpc::ListVolumes, Code::DeadlineExceeded, Retry),
            (Rpc::ValidateVolumeCapabilities, Code::Cancelled, Retry),
            (Rpc::GetCapacity, Code::Internal, Retry),
            // The request must change.
            (Rpc::CreateVolume, Code::InvalidArgument, Fatal),
            (Rpc::CreateVolume, Code::AlreadyExists, Fatal),
            (Rpc::CreateVolume, Code::OutOfRange, Fatal),
            (Rpc::NodeGetVolumeStats, Code::Unimplemented, Fatal),
            (Rpc::DeleteVolume, Code::PermissionDenied, Fatal),
            (Rpc::NodeStageVolume, Code::Unauthenticated, Fatal),
            (Rpc::DeleteSnapshot, Code::InvalidArgument, Fatal),
            (Rpc::GetMetadataAllocated, Code::OutOfRange, Fatal),
            // FAILED_PRECONDITION, per RPC.
            (Rpc::Probe, Code::FailedPrecondition, RetryElsewhere),
            (Rpc::DeleteVolume, Code::FailedPrecondition, Retry),
            (Rpc::DeleteSnapshot, Code::FailedPrecondition, Retry),
            (
                Rpc::DeleteVolumeGroupSnapshot,
                Code::FailedPrecondition,
                Retry,
            ),
            (
                Rpc::ControllerPublishVolume,
                Code::FailedPrecondition,
                Retry,
            ),
            (Rpc::ControllerExpandVolume, Code::FailedPrecondition, Retry),
            (Rpc::NodeExpandVolume, Code::FailedPrecondition, Fatal),
            (Rpc::NodeStageVolume, Code::FailedPrecondition, Fatal),
            (Rpc::NodePublishVolume, Code::FailedPrecondition, Fatal),
            (
                Rpc::CreateVolumeGroupSnapshot,
                Code::FailedPrecondition,
                Fatal,
            ),
            (Rpc::GetMetadataDelta, Code::FailedPrecondition, Fatal),
        ];
        for &(rpc, code, want) in table {
            assert_eq!(classify(rpc, code), want, "{rpc:?} {code:?}");
        }
    }

    #[test]
    fn failure_classification() {
        assert_eq!(
            classify_failure(Rpc::NodePublishVolume, Failure::AttemptDeadline),
            Uncertain
        );
        assert_eq!(
            classify_failure(Rpc::CreateVolume, Failure::CallDeadline),
            Uncertain
        );
        assert_eq!(
            classify_failure(Rpc::NodeUnpublishVolume, Failure::ConnectionLost),
            Uncertain
        );
        assert_eq!(
            classify_failure(Rpc::NodeGetInfo, Failure::AttemptDeadline),
            Retry
        );
        assert_eq!(classify_failure(Rpc::Probe, Failure::ConnectionLost), Retry);
        assert_eq!(
            classify_failure(Rpc::NodePublishVolume, Failure::NotConnected),
            RetryElsewhere
        );
        for &rpc in Rpc::ALL {
            assert_eq!(
                classify_failure(rpc, Failure::BadEndpoint),
                Fatal,
                "{rpc:?}"
            );
        }
        assert_eq!(
            classify_failure(Rpc::CreateVolume, Failure::InvalidResponse),
            Uncertain
        );
        assert_eq!(
            classify_failure(Rpc::NodeGetInfo, Failure::InvalidResponse),
            Retry
        );
        for &rpc in Rpc::ALL {
            assert_ne!(
                classify_failure(rpc, Failure::InvalidResponse),
                Fatal,
                "{rpc:?}: an unusable answer is never fatal"
            );
        }
        assert_eq!(
            classify_failure(Rpc::CreateVolume, Failure::InvalidRequest),
            Fatal
        );
        assert_eq!(
            classify_failure(Rpc::NodeUnpublishVolume, Failure::Status(Code::NotFound)),
            AlreadyDone
        );
    }

    #[test]
    fn never_retried_anywhere() {
        for &rpc in Rpc::ALL {
            let p = default_policy(rpc);
            assert!(!p.retries(Failure::Status(Code::Unimplemented)), "{rpc:?}");
            assert!(
                !p.retries(Failure::Status(Code::InvalidArgument)),
                "{rpc:?}"
            );
            assert!(!p.retries(Failure::Status(Code::AlreadyExists)), "{rpc:?}");
            assert!(!p.retries(Failure::InvalidResponse), "{rpc:?}");
            assert!(!p.retries(Failure::CallDeadline), "{rpc:?}");
            assert!(!p.retries(Failure::BadEndpoint), "{rpc:?}");
            assert!(p.retries(Failure::NotConnected), "{rpc:?}");
            assert!(p.max_attempts >= 1, "{rpc:?}");
            assert!(p.attempt_deadline <= p.total_budget, "{rpc:?}");
            // Whatever the client retries, the caller would also be told to retry.
            for n in 0..=16 {
                let code = Code::from_i32(n);
                if p.retries(Failure::Status(code)) {
                    assert!(
                        classify(rpc, code).is_retryable(),
                        "{rpc:?} retries {code:?}"
                    );
                }
            }
        }
        let probe = default_policy(Rpc::Probe);
        assert_eq!(probe.max_attempts, 1);
        assert_eq!(probe.retry_codes, CodeSet::EMPTY);
        assert!(!probe.retry_uncertain);
    }

    #[test]
    fn overrides_cannot_make_invalid_argument_retryable() {
        let mut p = default_policy(Rpc::CreateVolume);
        p.retry_codes = CodeSet::of(&[Code::InvalidArgument, Code::Unimplemented, Code::Internal]);
        assert!(!p.retries(Failure::Status(Code::InvalidArgument)));
        assert!(!p.retries(Failure::Status(Code::Unimplemented)));
        assert!(p.retries(Failure::Status(Code::Internal)));
    }

    #[test]
    fn deadlines_are_long_for_mutations_and_short_for_identity() {
        let mutation = default_policy(Rpc::CreateVolume);
        let node = default_policy(Rpc::NodePublishVolume);
        let caps = default_policy(Rpc::NodeGetCapabilities);
        let probe = default_policy(Rpc::Probe);
        assert!(mutation.attempt_deadline > caps.attempt_deadline);
        assert!(node.attempt_deadline > caps.attempt_deadline);
        assert!(caps.attempt_deadline > probe.attempt_deadline);
        assert!(
            !default_policy(Rpc::CreateSnapshot).retries(Failure::Status(Code::ResourceExhausted))
        );
        assert!(
            default_policy(Rpc::NodeStageVolume).retries(Failure::Status(Code::ResourceExhausted))
        );
        assert!(!default_policy(Rpc::ListVolumes).retries(Failure::Status(Code::Aborted)));
        assert!(default_policy(Rpc::NodeStageVolume).retries(Failure::AttemptDeadline));
    }

    #[test]
    fn call_options_override_and_clamp() {
        let p = default_policy(Rpc::NodeGetInfo).with_options(
            &CallOptions::new()
                .attempt_deadline(Duration::from_millis(5))
                .total_budget(Duration::from_millis(50))
                .max_attempts(0),
        );
        assert_eq!(p.attempt_deadline, Duration::from_millis(5));
        assert_eq!(p.total_budget, Duration::from_millis(50));
        assert_eq!(p.max_attempts, 1);
    }

    #[test]
    fn backoff_grows_and_respects_the_cap() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(350),
            factor: 2.0,
            jitter: false,
        };
        // backon multiplies in f32, so compare whole milliseconds.
        let d: Vec<u128> = b.delays(5).map(|d| d.as_millis()).collect();
        assert_eq!(d, [100, 200, 350, 350, 350]);
        let jittered = Backoff { jitter: true, ..b };
        for d in jittered.delays(50) {
            assert!(
                d >= Duration::from_millis(100) && d <= Duration::from_millis(350),
                "{d:?}"
            );
        }
        assert_eq!(b.delays(0).count(), 0);
    }

    #[test]
    fn code_set_ops() {
        let s = CodeSet::of(&[Code::Unavailable, Code::Aborted]);
        assert!(s.contains(Code::Unavailable) && s.contains(Code::Aborted));
        assert!(!s.contains(Code::Ok));
        assert!(!s.without(Code::Aborted).contains(Code::Aborted));
        assert_eq!(
            format!("{:?}", CodeSet::of(&[Code::NotFound])),
            "{NotFound}"
        );
    }
}
