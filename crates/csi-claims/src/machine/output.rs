//! What the machine asks its driver to do ([`Action`]) and tells it ([`Event`]).

use std::sync::Arc;
use tokio::time::Instant;

use csi_structs::untrusted::escaped;
use csi_structs::{ErrorClass, VolumeId, WorkloadId};

use crate::detach::{ControllerDetachRequest, DetachRpc, NodeDetachRequest};
use crate::model::{Claim, VolumeRecord};
use crate::store::Version;

use super::RetriedStep;

/// Names one requested action; hand it back with the action's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub(crate) u64);

impl Ticket {
    /// The ticket's number (unique per machine).
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// Something the driver must perform, then report back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write a volume's record ([`ClaimStore::compare_and_swap`](crate::ClaimStore::compare_and_swap));
    /// report with [`ReleaseMachine::persisted`](super::ReleaseMachine::persisted).
    Persist(PersistRequest),
    /// Read a volume's record again after a stale write
    /// ([`ClaimStore::load`](crate::ClaimStore::load)); report with
    /// [`ReleaseMachine::reloaded`](super::ReleaseMachine::reloaded).
    Reload(ReloadRequest),
    /// Run the node step of a claim; report with
    /// [`ReleaseMachine::node_detached`](super::ReleaseMachine::node_detached).
    NodeDetach(NodeDetachRequest),
    /// Run the controller step of a claim; report with
    /// [`ReleaseMachine::controller_detached`](super::ReleaseMachine::controller_detached),
    /// or with [`ReleaseMachine::controller_not_started`](super::ReleaseMachine::controller_not_started)
    /// when the call was not made (the duty lapsed, the record changed).
    ControllerDetach(ControllerDetachRequest),
}

/// "Persist this record": compare-and-swap the volume's record from `expected` to `record`
/// (`None`: delete it, the last claim was freed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistRequest {
    /// Names this write.
    pub ticket: Ticket,
    /// The volume.
    pub volume: VolumeId,
    /// The version the machine last saw durable (`None`: no record).
    pub expected: Option<Version>,
    /// The whole new record, or `None` to delete. Shared with the machine (which changes
    /// its copy on write), so asking for a write does not copy the record.
    pub record: Option<Arc<VolumeRecord>>,
    /// Whether this write records a controller-side step (a skip, ready to free, a free):
    /// under a fenced duty ([`crate::duty`]) only the duty's holder may make it
    /// ([`ClaimStore::compare_and_swap_fenced`](crate::ClaimStore::compare_and_swap_fenced)),
    /// and only before its deadline.
    pub fenced: bool,
}

/// Why the driver did not make the controller call of an [`Action::ControllerDetach`]
/// (report with
/// [`ReleaseMachine::controller_not_started`](super::ReleaseMachine::controller_not_started)).
#[derive(Debug)]
pub enum NotStarted {
    /// This agent does not hold the controller duty now: its local deadline passed, or the
    /// store refused its fence ([`crate::duty`]).
    NotHolder,
    /// The store holds a newer record of the volume than the one the step was decided on.
    Stale,
    /// The store could not confirm the step (it failed or did not answer).
    Store(crate::StoreError),
}

impl std::fmt::Display for NotStarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotStarted::NotHolder => f.write_str("this agent does not hold the controller duty"),
            NotStarted::Stale => {
                f.write_str("the volume's record changed since the step was decided")
            }
            NotStarted::Store(e) => write!(f, "the store could not confirm the step: {e}"),
        }
    }
}

/// "Reload this volume": its record changed under the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReloadRequest {
    /// Names this read.
    pub ticket: Ticket,
    /// The volume.
    pub volume: VolumeId,
}

/// A notification for whoever waits on claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The claim of `workload` on `volume` is durable: the workload may use the volume.
    ClaimDurable {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
    /// The release of `workload`'s claim on `volume` is durable: a crash can no longer lose
    /// it, and it will run to completion.
    ReleaseDurable {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
    /// A claim that was not yet durable was lost: another writer changed the volume's record
    /// first, and the reloaded record does not have it. Claim again.
    ClaimLost {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
    /// A claim that was not yet durable can never be written: the store refused the volume's
    /// record for good (too large for it, say). The claim is dropped; `reason` says why.
    ClaimRefused {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// The store's error, as text.
        reason: String,
    },
    /// A claim was waiting to become durable and the store failed (its disk, its database, the
    /// network to it): whether the claim reached the store is unknown. It is no longer shown;
    /// the volume is read again once the store answers, and a claim that did reach it comes
    /// back then. Claim again: the same terms are accepted either way.
    ClaimNotStored {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// The store's error, as text (it names the store).
        reason: String,
    },
    /// A release was waiting to become durable and the store failed: whether the release
    /// reached the store is unknown, and the volume is read again once the store answers.
    /// Release again: a release already stored is accepted again.
    ReleaseNotStored {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// The store's error, as text (it names the store).
        reason: String,
    },
    /// The claim is freed (durably gone from the store); its capacity is back. Carries the
    /// claim in state [`ClaimState::Freed`](crate::ClaimState::Freed), with how both steps
    /// ended. A claim freed by another agent sharing the store carries the last state this
    /// machine saw of it (`Freed` when that said how both steps ended).
    Freed(Claim),
    /// A release step failed (a detach call, or a read of the volume after the store failed)
    /// and waits out a backoff before it is tried again: one event per failed attempt. The
    /// volume's status says [`ReleaseWait::Backoff`](super::ReleaseWait::Backoff) meanwhile.
    StepFailed(StepFailure),
    /// A step that had failed ([`Event::StepFailed`]) succeeded: its backoff is over and the
    /// release goes on. Not sent for a step whose retry was overtaken (another agent did it,
    /// its node was reported gone).
    StepRecovered {
        /// The volume.
        volume: VolumeId,
        /// The step, naming its claim's workload.
        step: RetriedStep,
        /// How many attempts had failed before this one succeeded.
        failed_attempts: u32,
    },
}

impl Event {
    /// Writes one `tracing` line for the event (a target under `csi_claims`): `debug` for
    /// writes that became durable and for failed writes the caller was already told of, `info`
    /// for a freed claim and a step that succeeded after failing, `warn` for a refused or lost
    /// claim and each failed release step (with its class, attempt and time to the retry).
    /// The detach calls themselves are logged by the driver, with their errors.
    ///
    /// ```
    /// # async fn run(claims: csi_claims::driver::ClaimsHandle) {
    /// let mut events = claims.subscribe();
    /// while let Ok(event) = events.recv().await {
    ///     event.log();
    /// }
    /// # }
    /// ```
    pub fn log(&self) {
        match self {
            Event::ClaimDurable { volume, workload } => {
                tracing::debug!(%volume, %workload, "claim written");
            }
            Event::ReleaseDurable { volume, workload } => {
                tracing::debug!(%volume, %workload, "release written");
            }
            Event::ClaimRefused {
                volume,
                workload,
                reason,
            } => {
                tracing::warn!(%volume, %workload, %reason, "claim refused by the claim store");
            }
            Event::ClaimLost { volume, workload } => {
                tracing::warn!(%volume, %workload, "claim lost to a concurrent writer");
            }
            Event::ClaimNotStored {
                volume, workload, ..
            } => {
                tracing::debug!(%volume, %workload, "claim not stored: the claim store fails");
            }
            Event::ReleaseNotStored {
                volume, workload, ..
            } => {
                tracing::debug!(%volume, %workload, "release not stored: the claim store fails");
            }
            Event::Freed(claim) => {
                let state = claim.state();
                tracing::info!(
                    volume = %claim.volume(),
                    workload = %claim.workload(),
                    node = %claim.node(),
                    node_step = ?state.node_step(),
                    controller_step = ?state.controller_step(),
                    "claim freed"
                );
            }
            Event::StepFailed(failure) => {
                let retry_in_ms = failure
                    .next_retry
                    .saturating_duration_since(Instant::now())
                    .as_millis();
                tracing::warn!(
                    volume = %failure.volume,
                    workload = %failure.workload().map_or("-", |w| w.as_str()),
                    step = %failure.step.name(),
                    rpc = %failure.rpc.map_or("-", DetachRpc::name),
                    class = %failure.class.as_str(),
                    attempt = failure.attempt,
                    retry_in_ms,
                    "release step failed; retry scheduled"
                );
            }
            Event::StepRecovered {
                volume,
                step,
                failed_attempts,
            } => {
                tracing::info!(
                    %volume,
                    workload = %step.workload().map_or("-", |w| w.as_str()),
                    step = %step.name(),
                    failed_attempts,
                    "release step succeeded after failing"
                );
            }
        }
    }
}

impl std::fmt::Display for Event {
    /// One line for people, plugin and store text escaped: `volume v1: claim of w1 durable`,
    /// `volume v1: claim of w1 on node n1 freed`, a [`StepFailure`]'s line, …
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::ClaimDurable { volume, workload } => {
                write!(f, "volume {volume}: claim of {workload} durable")
            }
            Event::ReleaseDurable { volume, workload } => {
                write!(f, "volume {volume}: release of {workload} durable")
            }
            Event::ClaimLost { volume, workload } => write!(
                f,
                "volume {volume}: claim of {workload} lost to a concurrent writer"
            ),
            Event::ClaimRefused {
                volume,
                workload,
                reason,
            } => write!(
                f,
                "volume {volume}: claim of {workload} refused by the claim store: {}",
                escaped(reason)
            ),
            Event::ClaimNotStored {
                volume,
                workload,
                reason,
            } => write!(
                f,
                "volume {volume}: claim of {workload} may not be stored: {}",
                escaped(reason)
            ),
            Event::ReleaseNotStored {
                volume,
                workload,
                reason,
            } => write!(
                f,
                "volume {volume}: release of {workload} may not be stored: {}",
                escaped(reason)
            ),
            Event::Freed(claim) => write!(
                f,
                "volume {}: claim of {} on node {} freed",
                claim.volume(),
                claim.workload(),
                claim.node()
            ),
            Event::StepFailed(failure) => failure.fmt(f),
            Event::StepRecovered {
                volume,
                step,
                failed_attempts,
            } => write!(
                f,
                "volume {volume}: {step} succeeded after {failed_attempts} failed attempt(s)"
            ),
        }
    }
}

/// A failed release step and when it is tried again ([`Event::StepFailed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepFailure {
    /// The volume.
    pub volume: VolumeId,
    /// The step that failed, naming its claim's workload
    /// ([`RetriedStep::workload`]).
    pub step: RetriedStep,
    /// The class of the error: a detach call's [`DetachError::class`](crate::DetachError),
    /// or the store error's [`StoreError::class`](crate::StoreError::class).
    /// [`ErrorClass::Fatal`] is retried too, after the backoff's cap rather than a growing
    /// delay: the machine never gives up a release, and an operator who fixed the cause can
    /// cut the wait short (reporting the plugin available, say).
    pub class: ErrorClass,
    /// The call that failed (`None` for a store read): `NodeUnstageVolume` when the node
    /// step got past its unpublish, say.
    pub rpc: Option<DetachRpc>,
    /// What went wrong, for people: the plugin's or the store's message as the detacher or
    /// the store gave it (never parsed, never a secret; escape it before showing it).
    pub detail: String,
    /// The failed attempts of the volume's release since its last successful step, this one
    /// included: 1 for a first failure. It is the count the backoff grows with (and
    /// [`ReleaseStatus::attempts`](super::ReleaseStatus::attempts)); while one claim of the
    /// volume is being released, the failed attempts of this step so far.
    pub attempt: u32,
    /// When the retry is due: the failure's time plus the backoff's delay for `attempt` (its
    /// cap for a fatal error). An event that says the cause may be gone (the plugin or the
    /// node is back, the store answers) retries it earlier.
    pub next_retry: Instant,
}

impl StepFailure {
    /// The workload whose claim the step is for (`None` for a store read).
    pub fn workload(&self) -> Option<&WorkloadId> {
        self.step.workload()
    }
}

impl std::fmt::Display for StepFailure {
    /// `volume v1: node detach of workload w1 (NodeUnstageVolume) failed, attempt 2 (retry):
    /// device busy`, the detail escaped. When it is retried is left out: it is an instant of
    /// the caller's clock (see [`next_retry`](Self::next_retry)).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "volume {}: {}", self.volume, self.step)?;
        if let Some(rpc) = self.rpc {
            write!(f, " ({rpc})")?;
        }
        write!(
            f,
            " failed, attempt {} ({}): {}",
            self.attempt,
            self.class.as_str(),
            escaped(&self.detail)
        )
    }
}
