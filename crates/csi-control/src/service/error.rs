//! What a volume operation answers when it fails: [`ServiceError`].

use csi_claims::driver::DriverError;
use csi_claims::{ClaimDenied, ClaimError, StoreError};
use csi_node::shim::plugin_failure;
use csi_node::state::StateFileError;
use csi_node::volumes::VolumeError;
use csi_rpc_shim::{PluginFailure, ShimError};
use csi_structs::{ErrorClass, VolumeId};

use crate::catalog::CatalogError;

/// A failed operation of the [`VolumeService`](super::VolumeService).
///
/// The variants say whose fault it is: the caller's ([`NotFound`](Self::NotFound),
/// [`Invalid`](Self::Invalid), [`Conflict`](Self::Conflict)), the plugin's
/// ([`Unsupported`](Self::Unsupported), [`Call`](Self::Call)), the claim layer's
/// ([`Denied`](Self::Denied), [`Claims`](Self::Claims)), or the service's own disk or store
/// ([`State`](Self::State), [`Local`](Self::Local), [`Store`](Self::Store)), or a runtime
/// shutting down under the operation ([`Stopped`](Self::Stopped)).
/// [`class`](Self::class) says what a caller may do next.
///
/// A claim the access mode does not admit is one arm away:
///
/// ```
/// use csi_claims::DenyReason;
/// use csi_control::ServiceError;
///
/// fn taken(answer: &Result<(), ServiceError>) -> bool {
///     matches!(answer, Err(ServiceError::Denied(d)) if d.reason == DenyReason::SingleWorkload)
/// }
/// # assert!(!taken(&Ok(())));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// No such volume (or plugin).
    #[error("no {what} {id:?}")]
    NotFound {
        /// `volume` or `plugin`.
        what: &'static str,
        /// The id asked for.
        id: String,
    },
    /// A field of the request is invalid.
    #[error("field `{field}`: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong, with the limit where there is one.
        reason: String,
    },
    /// The request conflicts with the volume's present state (taken id, claims left, being
    /// deleted, out of the node's topology, a volume that may exist only).
    #[error("{0}")]
    Conflict(String),
    /// The plugin cannot do what was asked: a capability it does not advertise, or not in the
    /// volume's present state.
    #[error("{0}")]
    Unsupported(String),
    /// The claim was denied before anything was recorded or called: the volume's access mode
    /// (or its attachment mode, or the workload's earlier claim) does not admit it beside the
    /// claims it has. The denial names the reason and the holders. (Boxed: it is large.)
    #[error(transparent)]
    Denied(Box<ClaimDenied>),
    /// The claim layer refused otherwise ([`ClaimError`]'s other refusals, a release refused)
    /// or stopped. A denial is [`Denied`](Self::Denied), never this.
    #[error(transparent)]
    Claims(DriverError),
    /// A plugin call (here or through a peer) failed.
    #[error("{step}: {detail}")]
    Call {
        /// The step: the RPC's name, or `mount` and `claim` for the node's own steps.
        step: &'static str,
        /// The error class.
        class: ErrorClass,
        /// Who said what.
        failure: CallFailure,
        /// The error, with what the service did about it (an undo, a release).
        detail: String,
    },
    /// A state file could not be written (the catalog's, say): the service's own disk, never
    /// the plugin's fault.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// The service's own I/O failed (a directory, or the node's usage records), never the
    /// plugin's fault.
    #[error("{step}: {detail}")]
    Local {
        /// What was being done.
        step: &'static str,
        /// The error, naming the file.
        detail: String,
        /// Whether it was the node's database (the usage records): a store failure, like
        /// the claims'.
        store: bool,
    },
    /// The cluster store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The operation's task was dropped before it answered: the runtime is shutting down.
    /// How far it got is not known; read the volume, or ask again once the service runs
    /// again (the operations are idempotent).
    #[error(
        "{operation}: stopped before it ended (the runtime is shutting down); its outcome is not known"
    )]
    Stopped {
        /// The operation: `claim`, `create`, `release`, ...
        operation: &'static str,
    },
}

/// Who said what when a plugin call failed: the plugin, or what happened without it saying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallFailure {
    /// The plugin answered with an error status.
    Status,
    /// The plugin answered, and its answer was unusable.
    UnusableAnswer,
    /// A deadline of ours passed before the plugin answered.
    Deadline,
    /// The plugin could not be reached.
    Unreachable,
    /// The request was refused before it was sent.
    NotSent,
    /// The serving agent failed on its own side.
    Agent,
    /// A node operation was refused because the plugin is not known to be healthy.
    Unhealthy,
}

impl From<DriverError> for ServiceError {
    /// A denial becomes [`ServiceError::Denied`]; everything else stays the claim layer's.
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Claim(ClaimError::Denied(denied)) => ServiceError::Denied(denied),
            other => ServiceError::Claims(other),
        }
    }
}

impl From<CatalogError> for ServiceError {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::State(e) => ServiceError::State(e),
            CatalogError::Store(e) => ServiceError::Store(e),
            claimed @ CatalogError::Claimed { .. } => ServiceError::Conflict(claimed.to_string()),
        }
    }
}

impl From<PluginFailure> for CallFailure {
    fn from(f: PluginFailure) -> Self {
        match f {
            PluginFailure::UnusableAnswer => CallFailure::UnusableAnswer,
            PluginFailure::Deadline => CallFailure::Deadline,
            PluginFailure::Unreachable => CallFailure::Unreachable,
            PluginFailure::NotSent => CallFailure::NotSent,
            PluginFailure::Agent => CallFailure::Agent,
            _ => CallFailure::Status,
        }
    }
}

impl std::fmt::Display for CallFailure {
    /// Who said what, for people: `the plugin answered with an error`, `the plugin's answer
    /// was unusable`, `our deadline passed`, `the plugin could not be reached`, `refused
    /// before it was sent`, `the serving agent failed`, `the plugin is not known to be
    /// healthy`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CallFailure::Status => "the plugin answered with an error",
            CallFailure::UnusableAnswer => "the plugin's answer was unusable",
            CallFailure::Deadline => "our deadline passed",
            CallFailure::Unreachable => "the plugin could not be reached",
            CallFailure::NotSent => "refused before it was sent",
            CallFailure::Agent => "the serving agent failed",
            CallFailure::Unhealthy => "the plugin is not known to be healthy",
        })
    }
}

impl CallFailure {
    /// Who failed a call through the shim.
    pub fn of_shim(e: &ShimError) -> CallFailure {
        match e {
            ShimError::Plugin { error, .. } => error.failure.into(),
            ShimError::DeadlineExceeded { .. } => CallFailure::Deadline,
            _ => CallFailure::Status,
        }
    }

    /// Why a failed `CreateVolume` that failed so may have made a volume, for people.
    pub fn why_create_may_exist(self) -> &'static str {
        match self {
            CallFailure::UnusableAnswer => "CreateVolume's answer was unusable",
            CallFailure::Deadline => "CreateVolume's deadline passed",
            _ => "CreateVolume's outcome is uncertain",
        }
    }
}

impl ServiceError {
    /// What a caller may do next: `None` for an answer to act on (not found, invalid, a
    /// conflict, unsupported, a permanent store error); the call's class for a plugin call;
    /// the claim layer's for a claim refused, at once or after waiting for releasing claims
    /// (retry while holders may release, retry elsewhere at the plugin's attach limit, fatal
    /// when the request must change);
    /// [`ErrorClass::Retry`] for the service's own failures (its disk, its store), which say
    /// nothing of the plugin; [`ErrorClass::Uncertain`] for an operation stopped before it
    /// ended.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            ServiceError::Call { class, .. } => Some(*class),
            ServiceError::Denied(denied) => Some(denied.reason.class()),
            ServiceError::Claims(e) if e.is_store_failure() => Some(ErrorClass::Retry),
            ServiceError::Claims(e) => e.claim_refusal().map(csi_claims::ClaimError::class),
            ServiceError::Store(e) if e.is_permanent() => None,
            ServiceError::State(_) | ServiceError::Local { .. } | ServiceError::Store(_) => {
                Some(ErrorClass::Retry)
            }
            ServiceError::Stopped { .. } => Some(ErrorClass::Uncertain),
            _ => None,
        }
    }

    /// A plugin call made through the shim failed during `step`.
    pub fn shim(step: &'static str, e: &ShimError) -> ServiceError {
        ServiceError::Call {
            step,
            class: e.class(),
            failure: CallFailure::of_shim(e),
            detail: e.to_string(),
        }
    }

    /// A node operation of csi-node's volume manager failed during `step`.
    pub fn node(step: &'static str, e: &VolumeError) -> ServiceError {
        // Our own disk: the usage records or a directory could not be written.
        if let VolumeError::Dir { .. } | VolumeError::Usage { .. } = e {
            let store = matches!(e, VolumeError::Usage { source, .. }
                if matches!(**source, StateFileError::Store { .. }));
            return ServiceError::Local {
                step,
                detail: e.to_string(),
                store,
            };
        }
        if let VolumeError::Path(p) = e {
            return invalid(p.field, p);
        }
        fn failure(e: &VolumeError) -> CallFailure {
            match e {
                VolumeError::NotUndone { failed, .. } => failure(failed),
                VolumeError::NotConfirmed { source, .. } => failure(source),
                VolumeError::Call { source, .. } => plugin_failure(source).into(),
                VolumeError::PluginMissing { .. } => CallFailure::Unreachable,
                VolumeError::NotHealthy { .. } => CallFailure::Unhealthy,
                _ => CallFailure::Agent,
            }
        }
        ServiceError::Call {
            step,
            class: e.class(),
            failure: failure(e),
            detail: e.to_string(),
        }
    }

    /// Adds what the service did about a failure (an undo, a release) to its detail: a
    /// plugin call's, or the service's own I/O's.
    pub(crate) fn with_note(mut self, note: &str) -> ServiceError {
        if let ServiceError::Call { detail, .. } | ServiceError::Local { detail, .. } = &mut self {
            detail.push_str("; ");
            detail.push_str(note);
        }
        self
    }
}

/// An invalid `field`.
pub(crate) fn invalid(field: &'static str, reason: impl std::fmt::Display) -> ServiceError {
    ServiceError::Invalid {
        field,
        reason: reason.to_string(),
    }
}

/// A volume being deleted admits nothing new.
pub(crate) fn deleting(volume: &VolumeId) -> ServiceError {
    ServiceError::Conflict(format!(
        "volume {volume} is being deleted; it admits no new claim"
    ))
}

/// No volume `id`.
pub(crate) fn no_volume(id: &VolumeId) -> ServiceError {
    ServiceError::NotFound {
        what: "volume",
        id: id.to_string(),
    }
}

/// A size the spec's `int64` fields cannot carry.
pub(crate) fn wire_size(field: &'static str, bytes: u64) -> Result<i64, ServiceError> {
    i64::try_from(bytes).map_err(|_| invalid(field, format!("{bytes} is over {} bytes", i64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_rpc_shim::{AgentRpc, PluginError};
    use csi_structs::NodeId;

    fn through_shim(class: ErrorClass, failure: PluginFailure) -> ServiceError {
        let e = ShimError::Plugin {
            rpc: AgentRpc::ControllerCreateVolume,
            node: NodeId::new("n1").expect("id"),
            error: PluginError::failed(class, failure, "CreateVolume failed"),
        };
        ServiceError::shim("CreateVolume", &e)
    }

    #[test]
    fn a_volume_that_may_exist_says_why() {
        assert_eq!(
            CallFailure::UnusableAnswer.why_create_may_exist(),
            "CreateVolume's answer was unusable"
        );
        assert_eq!(
            CallFailure::Deadline.why_create_may_exist(),
            "CreateVolume's deadline passed"
        );
        assert_eq!(
            CallFailure::Status.why_create_may_exist(),
            "CreateVolume's outcome is uncertain"
        );
    }

    #[test]
    fn a_call_keeps_who_failed_and_its_class_and_a_note_is_added_to_its_detail() {
        let e = through_shim(ErrorClass::Uncertain, PluginFailure::UnusableAnswer);
        let ServiceError::Call { failure, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*failure, CallFailure::UnusableAnswer);
        assert_eq!(failure.to_string(), "the plugin's answer was unusable");
        assert_eq!(e.class(), Some(ErrorClass::Uncertain));
        let noted = e.with_note("undone");
        assert!(noted.to_string().ends_with("; undone"), "{noted}");
        // A refusal of the caller's is not a call, and gets no note.
        let refused = invalid("name", "too long").with_note("undone");
        assert_eq!(refused.to_string(), "field `name`: too long");
        assert_eq!(refused.class(), None);
    }

    #[test]
    fn our_own_disk_is_retry_and_never_the_plugins() {
        let dir = ServiceError::node(
            "mount",
            &VolumeError::Dir {
                volume: VolumeId::new("v").expect("id"),
                action: "create",
                path: "/data/node/staging/v".into(),
                source: std::sync::Arc::new(std::io::Error::from_raw_os_error(28)),
            },
        );
        assert!(
            matches!(dir, ServiceError::Local { store: false, .. }),
            "{dir:?}"
        );
        assert_eq!(dir.class(), Some(ErrorClass::Retry));
        let state = ServiceError::from(CatalogError::State(StateFileError::Io {
            path: "/data/volumes.json".into(),
            source: std::io::Error::from_raw_os_error(28),
        }));
        assert_eq!(state.class(), Some(ErrorClass::Retry));
        assert!(state.to_string().contains("/data/volumes.json"), "{state}");
    }

    #[test]
    fn a_size_over_the_wires_int64_is_refused_naming_the_field() {
        assert_eq!(wire_size("capacity_bytes", 1 << 30).ok(), Some(1 << 30));
        let e = wire_size("capacity_bytes", u64::MAX).expect_err("over i64");
        assert!(
            matches!(
                e,
                ServiceError::Invalid {
                    field: "capacity_bytes",
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
