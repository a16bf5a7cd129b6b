//! Conversions between this crate's types and the `csi-proto` wire types.
//!
//! Both directions, at the edge:
//! - `From<&Domain> for wire::Message` never fails: a domain value is valid by construction.
//! - `TryFrom<wire::Message> for Domain` (and from `&wire::Message`) checks every rule the
//!   spec states for that message and reports *all* broken ones in a [`WireError`], which
//!   names the message and each field. A plugin that sends an empty node id, a negative size,
//!   an unknown access mode or a capability without an access type gets a typed error, never
//!   a panic.
//!
//! Unknown *capability* numbers are the exception the spec makes (§3.15): they are kept
//! aside and ignored, so those conversions are infallible.
//!
//! ```
//! use csi_proto::v1;
//! use csi_structs::NodeInfo;
//!
//! let wire = v1::NodeGetInfoResponse { node_id: String::new(), max_volumes_per_node: -1, ..Default::default() };
//! let err = NodeInfo::try_from(wire).unwrap_err();
//! assert_eq!(err.message, "NodeGetInfoResponse");
//! let fields: Vec<String> = err.errors.violations().iter().map(|v| v.field.to_string()).collect();
//! assert_eq!(fields, ["node_id", "max_volumes_per_node"]);
//! ```

mod capability;
mod capability_set;
mod confirm;
mod expansion;
mod info;
mod registration;
mod snapshot;
mod topology;
mod volume;

use crate::validation::{FieldPath, Problem, ValidationErrors};

/// A wire message that breaks the spec: which message, and every broken rule in it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid csi.v1.{message}: {errors}")]
pub struct WireError {
    /// The protobuf message name, e.g. `NodeGetInfoResponse`.
    pub message: &'static str,
    /// Every broken rule, each naming its field inside the message.
    pub errors: ValidationErrors,
}

impl WireError {
    /// A wire error for `message` from collected violations.
    pub fn new(message: &'static str, errors: ValidationErrors) -> Self {
        Self { message, errors }
    }
}

/// Finishes a conversion: `Ok` when nothing was recorded and a value was built.
pub(crate) fn finish<T>(
    message: &'static str,
    errs: ValidationErrors,
    value: Option<T>,
) -> Result<T, WireError> {
    match value {
        Some(v) if errs.is_empty() => Ok(v),
        _ => Err(WireError::new(message, errs)),
    }
}

/// Records the violations of `result` (paths as they are) and returns its value.
pub(crate) fn collect<T>(
    errs: &mut ValidationErrors,
    result: Result<T, ValidationErrors>,
) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            errs.extend(e);
            None
        }
    }
}

/// A non-negative wire size; 0 means unset/unknown.
pub(crate) fn optional_size(
    errs: &mut ValidationErrors,
    at: FieldPath,
    value: i64,
) -> Option<Option<u64>> {
    if value < 0 {
        errs.push(at, Problem::Negative { value });
        return None;
    }
    Some(size_from_wire(value))
}

/// A wire size (`capacity_bytes`, `size_bytes`, …) as a domain size: the wire's 0 means
/// unknown. For a size already checked on its way in (by this module's conversions, or by
/// csi-rpc-shim's wire checks), which is never negative; a negative one is unknown too.
///
/// ```
/// use csi_structs::wire::{size_from_wire, size_to_wire};
///
/// assert_eq!(size_from_wire(0), None);
/// assert_eq!(size_from_wire(1 << 30), Some(1 << 30));
/// assert_eq!(size_to_wire(None), 0);
/// assert_eq!(size_to_wire(Some(u64::MAX)), i64::MAX);
/// ```
pub fn size_from_wire(value: i64) -> Option<u64> {
    u64::try_from(value).ok().filter(|v| *v > 0)
}

/// A domain size back to the wire: 0 for unknown, and `i64::MAX` for a size beyond it.
pub fn size_to_wire(value: Option<u64>) -> i64 {
    value.map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX))
}

/// `""` → `None`.
pub(crate) fn non_empty(value: &str) -> Option<String> {
    if value.is_empty() {
        None
    } else {
        Some(value.to_string())
    }
}

macro_rules! by_ref_and_value {
    ($wire:ty => $domain:ty) => {
        impl TryFrom<$wire> for $domain {
            type Error = $crate::wire::WireError;
            fn try_from(w: $wire) -> Result<Self, Self::Error> {
                <$domain>::try_from(&w)
            }
        }
    };
}
pub(crate) use by_ref_and_value;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wire_size_of_zero_is_unknown() {
        assert_eq!(size_from_wire(0), None);
        assert_eq!(size_from_wire(-1), None);
        assert_eq!(size_from_wire(1 << 30), Some(1 << 30));
        assert_eq!(size_from_wire(i64::MAX), Some(i64::MAX as u64));
    }
}
