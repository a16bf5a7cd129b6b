//! "Why is this volume stuck?": a snapshot of one volume's release.

use std::time::Instant;

use csi_structs::{ErrorClass, VolumeId, WorkloadId};

use crate::detach::DetachError;
use crate::model::Claim;

/// What a volume is waiting for right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    /// Nothing: idle, or backing off until [`VolumeStatus::next_retry`].
    Nothing,
    /// A node detach call for this workload's claim.
    NodeDetach(WorkloadId),
    /// A controller detach call for this workload's claim.
    ControllerDetach(WorkloadId),
    /// A free controller-call slot of the plugin, for this workload's claim.
    ControllerSlot(WorkloadId),
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

/// One volume's release, as an operator needs to see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeStatus {
    /// The volume.
    pub volume: VolumeId,
    /// Its claims, each with its state.
    pub claims: Vec<Claim>,
    /// The call in flight or awaited.
    pub pending: Pending,
    /// Failed attempts of the current step since it last succeeded.
    pub attempts: u32,
    /// The last failure, with its class.
    pub last_error: Option<LastError>,
    /// When the next attempt is due (`None`: not backing off).
    pub next_retry: Option<Instant>,
    /// Whether every change is durable.
    pub durable: bool,
}
