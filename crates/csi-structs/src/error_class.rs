//! [`ErrorClass`]: what a caller should do about a failed call.
//!
//! Every failed CSI call is classified once, where it happens (in `csi-client`), and the class
//! travels with the error, across the agent-to-agent wire too (it serializes as a snake_case
//! string). Nobody decides by reading message text.

use std::fmt;
use std::str::FromStr;

/// What a caller should do about a failed call. There is no default: every error is
/// classified on purpose.
///
/// ```
/// use csi_structs::ErrorClass;
///
/// let class: ErrorClass = "retry_elsewhere".parse().unwrap();
/// assert_eq!(class, ErrorClass::RetryElsewhere);
/// assert!(class.is_retryable());
/// assert!(!ErrorClass::Fatal.is_retryable());
/// ```
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The desired end state already holds; treat the call as a success.
    /// Typical source: `NOT_FOUND` from an unpublish or unstage call.
    AlreadyDone,
    /// Transient: back off and send the same request to the same target again.
    /// Typical sources: `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED`, a per-attempt deadline.
    Retry,
    /// This instance cannot serve the call; send it to another instance (another controller).
    /// Typical source: the plugin is missing or unhealthy on the chosen node.
    RetryElsewhere,
    /// The operation may or may not have happened. The caller must either retry it to
    /// completion (CSI's mutating calls are idempotent) or undo it with its reverse call; it
    /// must not assume either outcome. Typical sources: `DEADLINE_EXCEEDED`, `CANCELLED`, a
    /// connection lost in the middle of a mutating call.
    Uncertain,
    /// The request itself must change; do not retry it as it is.
    /// Typical sources: `INVALID_ARGUMENT`, `ALREADY_EXISTS`, `OUT_OF_RANGE`, `UNIMPLEMENTED`.
    Fatal,
}

impl ErrorClass {
    /// Every class, in declaration order.
    pub const ALL: [ErrorClass; 5] = [
        ErrorClass::AlreadyDone,
        ErrorClass::Retry,
        ErrorClass::RetryElsewhere,
        ErrorClass::Uncertain,
        ErrorClass::Fatal,
    ];

    /// The snake_case name, as serialized: `already_done`, `retry`, `retry_elsewhere`,
    /// `uncertain`, `fatal`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorClass::AlreadyDone => "already_done",
            ErrorClass::Retry => "retry",
            ErrorClass::RetryElsewhere => "retry_elsewhere",
            ErrorClass::Uncertain => "uncertain",
            ErrorClass::Fatal => "fatal",
        }
    }

    /// Whether sending the same request again (here or elsewhere) is a sensible reaction:
    /// [`Retry`](Self::Retry), [`RetryElsewhere`](Self::RetryElsewhere) and
    /// [`Uncertain`](Self::Uncertain) (retrying to completion is one of the two correct
    /// reactions to an unknown outcome, because CSI's mutating calls are idempotent).
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorClass::Retry | ErrorClass::RetryElsewhere | ErrorClass::Uncertain
        )
    }

    /// Whether the retry should go to the same target ([`Retry`](Self::Retry) and
    /// [`Uncertain`](Self::Uncertain)).
    pub const fn retries_same_target(self) -> bool {
        matches!(self, ErrorClass::Retry | ErrorClass::Uncertain)
    }

    /// Whether the retry must go to a different instance.
    pub const fn needs_other_target(self) -> bool {
        matches!(self, ErrorClass::RetryElsewhere)
    }

    /// Whether the outcome is unknown: the side effect may have happened.
    pub const fn is_uncertain(self) -> bool {
        matches!(self, ErrorClass::Uncertain)
    }

    /// Whether the call counts as a success (the end state already holds).
    pub const fn is_already_done(self) -> bool {
        matches!(self, ErrorClass::AlreadyDone)
    }

    /// Whether the request must change before it can succeed.
    pub const fn is_fatal(self) -> bool {
        matches!(self, ErrorClass::Fatal)
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`ErrorClass`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown error class {value:?} (expected one of already_done, retry, retry_elsewhere, uncertain, fatal)"
)]
pub struct UnknownErrorClass {
    /// The string received.
    pub value: String,
}

impl FromStr for ErrorClass {
    type Err = UnknownErrorClass;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownErrorClass {
                value: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_str_and_serde() {
        for class in ErrorClass::ALL {
            assert_eq!(class.as_str().parse::<ErrorClass>(), Ok(class));
            assert_eq!(class.to_string(), class.as_str());
            let json = serde_json::to_string(&class).unwrap();
            assert_eq!(json, format!("\"{}\"", class.as_str()));
            assert_eq!(serde_json::from_str::<ErrorClass>(&json).unwrap(), class);
        }
        assert_eq!(
            "Retry".parse::<ErrorClass>(),
            Err(UnknownErrorClass {
                value: "Retry".into()
            })
        );
    }

    #[test]
    fn predicates_table() {
        // class, retryable, same target, other target, uncertain, done, fatal
        let table = [
            (
                ErrorClass::AlreadyDone,
                false,
                false,
                false,
                false,
                true,
                false,
            ),
            (ErrorClass::Retry, true, true, false, false, false, false),
            (
                ErrorClass::RetryElsewhere,
                true,
                false,
                true,
                false,
                false,
                false,
            ),
            (ErrorClass::Uncertain, true, true, false, true, false, false),
            (ErrorClass::Fatal, false, false, false, false, false, true),
        ];
        for (c, retry, same, other, unc, done, fatal) in table {
            assert_eq!(c.is_retryable(), retry, "{c}");
            assert_eq!(c.retries_same_target(), same, "{c}");
            assert_eq!(c.needs_other_target(), other, "{c}");
            assert_eq!(c.is_uncertain(), unc, "{c}");
            assert_eq!(c.is_already_done(), done, "{c}");
            assert_eq!(c.is_fatal(), fatal, "{c}");
        }
    }
}
