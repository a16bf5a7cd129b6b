//! "Why is this volume stuck?": a snapshot of one volume's release.

use tokio::time::Instant;

use std::fmt;

use csi_structs::untrusted::escaped;
use csi_structs::{ErrorClass, VolumeId, WorkloadId};

use crate::detach::DetachError;
use crate::model::Claim;
use crate::transition::Side;

/// What a volume is waiting for right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseWait {
    /// Nothing: no release step is in flight, awaited or backing off. (A store write of the
    /// volume may be in flight.)
    Nothing,
    /// The backoff after `step` failed: it is retried at `until` (the same instant as
    /// [`ReleaseStatus::next_retry`]), or earlier when an event says the cause may be gone (the
    /// plugin or the node is back, the store answers). Until then no release step of the
    /// volume is started.
    Backoff {
        /// The step that failed and waits to be retried.
        step: RetriedStep,
        /// When the retry is due.
        until: Instant,
    },
    /// A node detach call for this workload's claim.
    NodeDetach(WorkloadId),
    /// A controller detach call for this workload's claim.
    ControllerDetach(WorkloadId),
    /// A free controller-call slot of the plugin, for this workload's claim.
    ControllerSlot(WorkloadId),
}

impl fmt::Display for ReleaseWait {
    /// `nothing in flight`, `the node detach of workload w1`, `the controller detach of
    /// workload w1`, `a controller call slot for workload w1`, `the backoff before retrying
    /// the node detach of workload w1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReleaseWait::Nothing => f.write_str("nothing in flight"),
            ReleaseWait::NodeDetach(w) => write!(f, "the node detach of workload {w}"),
            ReleaseWait::ControllerDetach(w) => write!(f, "the controller detach of workload {w}"),
            ReleaseWait::ControllerSlot(w) => write!(f, "a controller call slot for workload {w}"),
            ReleaseWait::Backoff { step, .. } => {
                write!(f, "the backoff before retrying the {step}")
            }
        }
    }
}

/// A step of a volume's release that is retried after a backoff when it fails: the step of
/// [`ReleaseWait::Backoff`], [`Event::StepFailed`](crate::Event::StepFailed) and
/// [`Event::StepRecovered`](crate::Event::StepRecovered).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RetriedStep {
    /// The node detach call (`NodeUnpublishVolume`, and `NodeUnstageVolume` for the last
    /// user of the volume on its node) of this workload's claim.
    NodeDetach(WorkloadId),
    /// The controller detach call (`ControllerUnpublishVolume`) of this workload's claim.
    ControllerDetach(WorkloadId),
    /// Reading the volume's record again after the claim store failed (or refused the record
    /// for good, or could not confirm a controller step): it belongs to no one claim, and no
    /// claim or release of the volume is taken until it succeeds.
    StoreRead,
}

impl RetriedStep {
    /// The workload whose claim the step is for (`None` for [`RetriedStep::StoreRead`]).
    pub fn workload(&self) -> Option<&WorkloadId> {
        match self {
            RetriedStep::NodeDetach(w) | RetriedStep::ControllerDetach(w) => Some(w),
            RetriedStep::StoreRead => None,
        }
    }

    /// Which agent performs the step, when agents share a store (`None` for
    /// [`RetriedStep::StoreRead`], which every agent does for itself).
    pub fn side(&self) -> Option<Side> {
        match self {
            RetriedStep::NodeDetach(_) => Some(Side::Node),
            RetriedStep::ControllerDetach(_) => Some(Side::Controller),
            RetriedStep::StoreRead => None,
        }
    }

    /// The step's name: `node_detach`, `controller_detach` or `store_read`.
    pub fn name(&self) -> &'static str {
        match self {
            RetriedStep::NodeDetach(_) => "node_detach",
            RetriedStep::ControllerDetach(_) => "controller_detach",
            RetriedStep::StoreRead => "store_read",
        }
    }
}

impl std::fmt::Display for RetriedStep {
    /// `node detach of workload w1`, `controller detach of workload w1`, `store read`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetriedStep::NodeDetach(w) => write!(f, "node detach of workload {w}"),
            RetriedStep::ControllerDetach(w) => write!(f, "controller detach of workload {w}"),
            RetriedStep::StoreRead => f.write_str("store read"),
        }
    }
}

/// The last failure seen for a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LastError {
    /// A detach call failed.
    Detach {
        /// The error, with its class.
        error: DetachError,
        /// When the result came in.
        at: Instant,
    },
    /// A store write or read failed (other than a stale write).
    Store {
        /// The store's error, as text.
        detail: String,
        /// When the result came in.
        at: Instant,
    },
}

impl LastError {
    /// The error class, for detach failures.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            LastError::Detach { error, .. } => Some(error.class),
            LastError::Store { .. } => None,
        }
    }
}

impl fmt::Display for LastError {
    /// The detach error (`NodeUnpublishVolume failed (retry): device busy`), or `store error:
    /// <the store's error>`; plugin and store text escaped. When it happened is left out: it
    /// is an instant of the caller's clock, not a time of day.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LastError::Detach { error, .. } => error.fmt(f),
            LastError::Store { detail, .. } => write!(f, "store error: {}", escaped(detail)),
        }
    }
}

/// One volume's release, as an operator needs to see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseStatus {
    /// The volume.
    pub volume: VolumeId,
    /// Its claims, each with its state.
    pub claims: Vec<Claim>,
    /// The call in flight or awaited, or the failed step whose backoff the volume waits out.
    pub pending: ReleaseWait,
    /// Failed attempts of the current step since it last succeeded.
    pub attempts: u32,
    /// The last failure, with its class.
    pub last_error: Option<LastError>,
    /// When the next attempt is due (`None`: not backing off).
    pub next_retry: Option<Instant>,
    /// Whether every change is durable.
    pub durable: bool,
}

impl ReleaseStatus {
    /// `<what it waits for> (<n> failed attempts, last: <error>)`, without the volume: the
    /// end of [`Display`](fmt::Display), and what a release that did not finish in time says
    /// of itself ([`DriverError::StillReleasing`](crate::driver::DriverError::StillReleasing)).
    pub fn progress(&self) -> impl fmt::Display + '_ {
        Progress(self)
    }
}

struct Progress<'a>(&'a ReleaseStatus);

impl fmt::Display for Progress<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        write!(f, "{} ({} failed attempts", s.pending, s.attempts)?;
        match &s.last_error {
            Some(e @ LastError::Detach { .. }) => write!(f, ", last: {e}")?,
            Some(e @ LastError::Store { .. }) => write!(f, ", last {e}")?,
            None => {}
        }
        f.write_str(")")
    }
}

impl fmt::Display for ReleaseStatus {
    /// One line for people: `volume v1: 2 claim(s); the backoff before retrying the node
    /// detach of workload w1 (3 failed attempts, last: NodeUnpublishVolume failed (retry):
    /// device busy)`, and `; not durable yet` while a change of it is not. Plugin and store
    /// text escaped; no secret is in a status.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "volume {}: {} claim(s); {}",
            self.volume,
            self.claims.len(),
            self.progress()
        )?;
        if !self.durable {
            f.write_str("; not durable yet")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detach::DetachRpc;

    fn wid(s: &str) -> WorkloadId {
        WorkloadId::new(s).expect("id")
    }

    #[test]
    fn a_status_is_one_line_for_people_with_plugin_text_escaped() {
        let at = Instant::now();
        let mut status = ReleaseStatus {
            volume: VolumeId::new("v1").expect("id"),
            claims: Vec::new(),
            pending: ReleaseWait::Backoff {
                step: RetriedStep::NodeDetach(wid("w1")),
                until: at,
            },
            attempts: 3,
            last_error: Some(LastError::Detach {
                error: DetachError::new(
                    DetachRpc::NodeUnpublish,
                    ErrorClass::Retry,
                    "device busy\n| forged | row",
                ),
                at,
            }),
            next_retry: Some(at),
            durable: true,
        };
        assert_eq!(
            status.to_string(),
            r"volume v1: 0 claim(s); the backoff before retrying the node detach of workload w1 (3 failed attempts, last: NodeUnpublishVolume failed (retry): device busy\n| forged | row)"
        );
        status.pending = ReleaseWait::Nothing;
        status.attempts = 0;
        status.last_error = Some(LastError::Store {
            detail: "claim store redb /data/claims.redb: disk full\r".into(),
            at,
        });
        status.durable = false;
        assert_eq!(
            status.to_string(),
            r"volume v1: 0 claim(s); nothing in flight (0 failed attempts, last store error: claim store redb /data/claims.redb: disk full\r); not durable yet"
        );
        assert_eq!(
            ReleaseWait::ControllerSlot(wid("w2")).to_string(),
            "a controller call slot for workload w2"
        );
    }
}
