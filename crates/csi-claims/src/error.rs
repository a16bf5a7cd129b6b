//! [`Error`]: every error of this crate in one enum, with its [`ErrorClass`].
//!
//! The narrow errors live next to the code that produces them ([`ClaimError`],
//! [`ReleaseError`], [`LoadError`], [`StoreError`], [`DecodeError`](crate::store::DecodeError),
//! [`BackoffPolicyError`], [`DriverError`]); this enum gathers them for callers that want one
//! type, and says what to do about each through [`Error::class`].

use csi_structs::ErrorClass;

use crate::backoff::BackoffPolicyError;
use crate::driver::DriverError;
use crate::machine::{ClaimError, LoadError, ReleaseError};
use crate::store::StoreError;

/// Any error of `csi-claims`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A claim was refused.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// A release was refused.
    #[error(transparent)]
    Release(#[from] ReleaseError),
    /// A stored record could not be taken over.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The claim store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A backoff policy was refused.
    #[error(transparent)]
    Backoff(#[from] BackoffPolicyError),
    /// A call through the driver failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
}

impl Error {
    /// What the caller should do about it.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Claim(e) => e.class(),
            Error::Release(e) => e.class(),
            Error::Load(_) | Error::Backoff(_) => ErrorClass::Fatal,
            Error::Store(e) => e.class(),
            Error::Driver(e) => match e {
                DriverError::Claim(c) => c.class(),
                DriverError::WaitedForRelease { refusal, .. } => refusal.class(),
                DriverError::Release(r) => r.class(),
                DriverError::Lost { .. } | DriverError::NotStored { .. } => ErrorClass::Retry,
                DriverError::Refused { .. } => ErrorClass::Fatal,
                DriverError::StillReleasing { .. } => ErrorClass::Retry,
                DriverError::Stopped => ErrorClass::Fatal,
            },
        }
    }
}

impl StoreError {
    /// What the caller should do about it: [`ErrorClass::Retry`] when the store failed or a
    /// write was stale, [`ErrorClass::RetryElsewhere`] when another agent holds the duty,
    /// [`ErrorClass::Fatal`] when the store refuses the record for good (or is misconfigured).
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::Conflict { .. }
            | StoreError::Interrupted { .. }
            | StoreError::TimedOut { .. } => ErrorClass::Retry,
            StoreError::LoadInterrupted
            | StoreError::Redb { .. }
            | StoreError::Unavailable { .. } => ErrorClass::Retry,
            StoreError::Etcd { .. } => ErrorClass::Retry,
            // Another agent holds the duty now: it performs the step.
            StoreError::Fenced { .. } => ErrorClass::RetryElsewhere,
            StoreError::WrongKey { .. }
            | StoreError::TooLarge { .. }
            | StoreError::Decode { .. }
            | StoreError::Encode { .. }
            | StoreError::TableName { .. } => ErrorClass::Fatal,
        }
    }
}

impl ClaimError {
    /// What the caller should do about it: [`ErrorClass::Retry`] when waiting can help (the
    /// holders may release the volume, a detach or reload settles),
    /// [`ErrorClass::RetryElsewhere`] when the node is at its plugin's attach limit,
    /// [`ErrorClass::Fatal`] when the request itself must change.
    pub fn class(&self) -> ErrorClass {
        match self {
            ClaimError::Denied(denied) => denied.reason.class(),
            ClaimError::DetachInFlight { .. }
            | ClaimError::Reloading { .. }
            | ClaimError::StoreUnavailable { .. } => ErrorClass::Retry,
            // The node is full for this plugin: another node can take the workload (or this
            // one, once a volume is detached).
            ClaimError::AttachLimit { .. } => ErrorClass::RetryElsewhere,
            ClaimError::VolumeMismatch { .. }
            | ClaimError::VolumeInfoMismatch { .. }
            | ClaimError::NodeGone { .. } => ErrorClass::Fatal,
        }
    }
}

impl ReleaseError {
    /// [`ErrorClass::AlreadyDone`] when there is no such claim (a release is idempotent: the
    /// claim may have been freed already), [`ErrorClass::Retry`] while the volume reloads or
    /// the store fails.
    pub fn class(&self) -> ErrorClass {
        match self {
            ReleaseError::NoSuchClaim { .. } => ErrorClass::AlreadyDone,
            ReleaseError::Reloading { .. } | ReleaseError::StoreUnavailable { .. } => {
                ErrorClass::Retry
            }
        }
    }
}

/// An error and its sources on one line (`outer: cause: root cause`), for logs and statuses.
///
/// ```
/// let e = std::io::Error::other("disk full");
/// assert_eq!(csi_claims::error::error_chain(&e), "disk full");
/// ```
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use csi_structs::{VolumeId, WorkloadId};

    use super::*;

    #[test]
    fn classes() {
        let volume = VolumeId::new("v").unwrap();
        let workload = WorkloadId::new("w").unwrap();
        let gone = Error::from(ReleaseError::NoSuchClaim {
            volume: volume.clone(),
            workload,
        });
        assert_eq!(gone.class(), ErrorClass::AlreadyDone);
        let busy = Error::from(ClaimError::Reloading {
            volume: volume.clone(),
        });
        assert_eq!(busy.class(), ErrorClass::Retry);
        let conflict = Error::from(StoreError::Conflict {
            volume,
            expected: None,
            found: None,
        });
        assert_eq!(conflict.class(), ErrorClass::Retry);
        assert_eq!(Error::from(DriverError::Stopped).class(), ErrorClass::Fatal);
    }
}
