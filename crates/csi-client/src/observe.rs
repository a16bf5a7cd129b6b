//! A hook for metrics: every attempt and every call, with its RPC, duration and outcome.
//!
//! The client already emits `tracing` spans (`csi.call` with `rpc`, `volume_id`, `node_id`,
//! `attempts`, `code`, `class`, `duration_ms`; `csi.attempt` with `attempt`). Spans carry ids
//! only; no request field that could hold a secret is ever recorded. For counters and latency
//! histograms, plug a [`CallObserver`] into the client builder; for per-RPC latency and gRPC
//! codes as seen on the wire, see [`metrics`](crate::metrics).

use std::fmt;
use std::time::Duration;

use csi_proto::Rpc;
use csi_structs::{ErrorClass, ExternalVolumeId};
use tonic::Code;

use crate::policy::Failure;

/// How an attempt or a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// The plugin answered OK (and the answer was valid).
    Ok,
    /// It failed, with this failure and class.
    Failed {
        /// What went wrong.
        failure: Failure,
        /// What the caller should do.
        class: ErrorClass,
    },
}

impl CallOutcome {
    /// The gRPC code for metrics labels: `Ok`, the plugin's code, or `None` when the failure
    /// had no code (a deadline of ours, a lost or absent connection, an invalid message).
    pub fn code(&self) -> Option<Code> {
        match self {
            CallOutcome::Ok => Some(Code::Ok),
            CallOutcome::Failed {
                failure: Failure::Status(code),
                ..
            } => Some(*code),
            CallOutcome::Failed { .. } => None,
        }
    }

    /// A short label for metrics: the code name (`Ok`, `NotFound`, …) or the failure kind
    /// (`attempt_deadline`, `call_deadline`, `connection_lost`, `not_connected`,
    /// `bad_endpoint`, `invalid_response`, `invalid_request`).
    pub fn label(&self) -> &'static str {
        match self {
            CallOutcome::Ok => "Ok",
            CallOutcome::Failed { failure, .. } => match failure {
                Failure::Status(code) => code_name(*code),
                Failure::AttemptDeadline => "attempt_deadline",
                Failure::CallDeadline => "call_deadline",
                Failure::ConnectionLost => "connection_lost",
                Failure::NotConnected => "not_connected",
                Failure::BadEndpoint => "bad_endpoint",
                Failure::InvalidResponse => "invalid_response",
                Failure::InvalidRequest => "invalid_request",
                Failure::VolumeBusy => "volume_busy",
            },
        }
    }
}

/// The canonical name of a gRPC code, as a static string.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// One attempt that finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptEvent {
    /// The RPC.
    pub rpc: Rpc,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Time from sending (dial included) to the answer or the deadline.
    pub duration: Duration,
    /// How it ended.
    pub outcome: CallOutcome,
}

/// One call that finished, all attempts included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallEvent {
    /// The RPC.
    pub rpc: Rpc,
    /// The plugin's volume id the request names, where it names one (`None` for discovery
    /// calls, `CreateVolume`, listings).
    pub volume: Option<ExternalVolumeId>,
    /// Attempts made (0 if the request was refused before sending).
    pub attempts: u32,
    /// Time from the call to its result, pauses included.
    pub duration: Duration,
    /// How it ended.
    pub outcome: CallOutcome,
}

/// Receives an event for every attempt and every call; implement it to feed metrics, or to
/// show each call as it ends (its RPC, volume, duration and outcome).
///
/// Methods run inline on the calling task, before the call's result is returned: keep them
/// short and non-blocking (increment a counter, record into a histogram, send into a
/// channel). Both have empty defaults.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use csi_client::{CallEvent, CallObserver};
///
/// #[derive(Debug, Default)]
/// struct CountFailures(AtomicU64);
///
/// impl CallObserver for CountFailures {
///     fn on_call(&self, event: &CallEvent) {
///         if event.outcome.code() != Some(csi_client::Code::Ok) {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait CallObserver: fmt::Debug + Send + Sync + 'static {
    /// Called after every attempt.
    fn on_attempt(&self, event: &AttemptEvent) {
        let _ = event;
    }

    /// Called once per call, after the last attempt.
    fn on_call(&self, event: &CallEvent) {
        let _ = event;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_codes() {
        assert_eq!(CallOutcome::Ok.label(), "Ok");
        let f = CallOutcome::Failed {
            failure: Failure::Status(Code::NotFound),
            class: ErrorClass::AlreadyDone,
        };
        assert_eq!((f.label(), f.code()), ("NotFound", Some(Code::NotFound)));
        let t = CallOutcome::Failed {
            failure: Failure::AttemptDeadline,
            class: ErrorClass::Uncertain,
        };
        assert_eq!((t.label(), t.code()), ("attempt_deadline", None));
        for n in 0..=16 {
            let code = Code::from_i32(n);
            assert_eq!(format!("{code:?}"), code_name(code));
        }
    }
}
