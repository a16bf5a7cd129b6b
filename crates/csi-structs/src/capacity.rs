//! [`CapacityRange`]: how large a volume must and may be (spec §3.9).
//!
//! At least one bound is set, neither is negative (sizes here are `u64`, and at most
//! `i64::MAX` so they fit the wire), and the limit is not below the requirement. Equal bounds
//! ask for an exact size.
//!
//! ```
//! use csi_structs::CapacityRange;
//!
//! let r = CapacityRange::between(1 << 30, 2 << 30)?;
//! assert!(r.allows(1 << 30) && !r.allows(3 << 30));
//! assert!(CapacityRange::new(None, None).is_err());
//! assert!(CapacityRange::between(10, 5).is_err());
//! # Ok::<(), csi_structs::ValidationErrors>(())
//! ```

use std::fmt;

use crate::validation::{FieldPath, Problem, SizeUnit, ValidationErrors};

/// The largest size the wire can carry (`int64`).
pub const MAX_WIRE_BYTES: u64 = i64::MAX as u64;

/// A requested size range in bytes (`csi.v1.CapacityRange`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "CapacityRangeRepr", into = "CapacityRangeRepr")]
pub struct CapacityRange {
    required_bytes: Option<u64>,
    limit_bytes: Option<u64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CapacityRangeRepr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    required_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    limit_bytes: Option<u64>,
}

impl TryFrom<CapacityRangeRepr> for CapacityRange {
    type Error = ValidationErrors;
    fn try_from(r: CapacityRangeRepr) -> Result<Self, Self::Error> {
        CapacityRange::new(r.required_bytes, r.limit_bytes)
    }
}

impl From<CapacityRange> for CapacityRangeRepr {
    fn from(r: CapacityRange) -> Self {
        Self {
            required_bytes: r.required_bytes,
            limit_bytes: r.limit_bytes,
        }
    }
}

impl CapacityRange {
    /// A range from its bounds; `Some(0)` counts as unset, as on the wire.
    ///
    /// # Errors
    ///
    /// Every broken rule at once: neither bound set ([`Problem::CapacityRangeEmpty`]), a
    /// bound over `i64::MAX` ([`Problem::TooLong`]), limit below requirement
    /// ([`Problem::LimitBelowRequired`]).
    pub fn new(
        required_bytes: Option<u64>,
        limit_bytes: Option<u64>,
    ) -> Result<Self, ValidationErrors> {
        let required_bytes = required_bytes.filter(|&b| b > 0);
        let limit_bytes = limit_bytes.filter(|&b| b > 0);
        let mut errs = ValidationErrors::new();
        if required_bytes.is_none() && limit_bytes.is_none() {
            errs.push(FieldPath::root(), Problem::CapacityRangeEmpty);
        }
        for (name, value) in [
            ("required_bytes", required_bytes),
            ("limit_bytes", limit_bytes),
        ] {
            if let Some(v) = value.filter(|&v| v > MAX_WIRE_BYTES) {
                errs.push(
                    FieldPath::named(name),
                    Problem::TooLong {
                        size: usize::try_from(v).unwrap_or(usize::MAX),
                        limit: usize::try_from(MAX_WIRE_BYTES).unwrap_or(usize::MAX),
                        unit: SizeUnit::Bytes,
                    },
                );
            }
        }
        if let (Some(r), Some(l)) = (required_bytes, limit_bytes)
            && l < r
        {
            errs.push(
                FieldPath::named("limit_bytes"),
                Problem::LimitBelowRequired {
                    required_bytes: i64::try_from(r).unwrap_or(i64::MAX),
                    limit_bytes: i64::try_from(l).unwrap_or(i64::MAX),
                },
            );
        }
        errs.into_result(Self {
            required_bytes,
            limit_bytes,
        })
    }

    /// At least `bytes`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new) (e.g. `bytes` = 0).
    pub fn at_least(bytes: u64) -> Result<Self, ValidationErrors> {
        Self::new(Some(bytes), None)
    }

    /// At most `bytes`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn at_most(bytes: u64) -> Result<Self, ValidationErrors> {
        Self::new(None, Some(bytes))
    }

    /// Exactly `bytes`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn exactly(bytes: u64) -> Result<Self, ValidationErrors> {
        Self::new(Some(bytes), Some(bytes))
    }

    /// From `required` to `limit` bytes.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn between(required: u64, limit: u64) -> Result<Self, ValidationErrors> {
        Self::new(Some(required), Some(limit))
    }

    /// The smallest acceptable size, if any.
    pub const fn required_bytes(&self) -> Option<u64> {
        self.required_bytes
    }

    /// The largest acceptable size, if any.
    pub const fn limit_bytes(&self) -> Option<u64> {
        self.limit_bytes
    }

    /// Whether a volume of `bytes` satisfies the range.
    pub fn allows(&self, bytes: u64) -> bool {
        self.required_bytes.is_none_or(|r| bytes >= r)
            && self.limit_bytes.is_none_or(|l| bytes <= l)
    }
}

impl fmt::Display for CapacityRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.required_bytes, self.limit_bytes) {
            (Some(r), Some(l)) if r == l => write!(f, "exactly {r} bytes"),
            (Some(r), Some(l)) => write!(f, "{r}..={l} bytes"),
            (Some(r), None) => write!(f, "at least {r} bytes"),
            (None, Some(l)) => write!(f, "at most {l} bytes"),
            (None, None) => f.write_str("unbounded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_table() {
        // required, limit, Ok(bounds) or the problems
        type Case = (
            Option<u64>,
            Option<u64>,
            Result<(Option<u64>, Option<u64>), Vec<Problem>>,
        );
        let cases: Vec<Case> = vec![
            (Some(1), None, Ok((Some(1), None))),
            (None, Some(1), Ok((None, Some(1)))),
            (Some(5), Some(5), Ok((Some(5), Some(5)))),
            (Some(0), Some(7), Ok((None, Some(7)))),
            (None, None, Err(vec![Problem::CapacityRangeEmpty])),
            (Some(0), Some(0), Err(vec![Problem::CapacityRangeEmpty])),
            (
                Some(10),
                Some(5),
                Err(vec![Problem::LimitBelowRequired {
                    required_bytes: 10,
                    limit_bytes: 5,
                }]),
            ),
            (
                Some(u64::MAX),
                Some(1),
                Err(vec![
                    Problem::TooLong {
                        size: usize::try_from(u64::MAX).unwrap_or(usize::MAX),
                        limit: usize::try_from(MAX_WIRE_BYTES).unwrap_or(usize::MAX),
                        unit: SizeUnit::Bytes,
                    },
                    Problem::LimitBelowRequired {
                        required_bytes: i64::MAX,
                        limit_bytes: 1,
                    },
                ]),
            ),
        ];
        for (req, lim, expected) in cases {
            let got = CapacityRange::new(req, lim)
                .map(|r| (r.required_bytes(), r.limit_bytes()))
                .map_err(|e| e.into_iter().map(|v| v.problem).collect::<Vec<_>>());
            assert_eq!(got, expected, "{req:?} {lim:?}");
        }
    }

    #[test]
    fn allows_and_serde() {
        let r = CapacityRange::between(10, 20).unwrap();
        assert!(!r.allows(9) && r.allows(10) && r.allows(20) && !r.allows(21));
        assert!(CapacityRange::at_least(10).unwrap().allows(u64::MAX));
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, r#"{"required_bytes":10,"limit_bytes":20}"#);
        assert_eq!(serde_json::from_str::<CapacityRange>(&json).unwrap(), r);
        assert!(serde_json::from_str::<CapacityRange>("{}").is_err());
        assert_eq!(r.to_string(), "10..=20 bytes");
    }
}
