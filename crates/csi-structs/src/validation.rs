//! Validation errors: every violated rule at once, each naming its field, as typed data.
//!
//! Validation in this crate never stops at the first problem. It collects a [`Violation`] per
//! broken rule into [`ValidationErrors`], so a user fixing a volume specification sees the whole
//! list in one round trip. Each violation carries a [`FieldPath`] (for example
//! `volume_capabilities[1].mount.fs_type`) and a [`Problem`] with the measured size and the
//! limit as numbers, never as preformatted text.
//!
//! ```
//! use csi_structs::validation::{FieldPath, Problem};
//! use csi_structs::VolumeId;
//!
//! let err = VolumeId::new("x".repeat(200)).unwrap_err();
//! let v = &err.violations()[0];
//! assert_eq!(v.field.to_string(), "volume_id");
//! assert!(matches!(v.problem, Problem::TooLong { size: 200, limit: 128, .. }));
//! ```

use std::borrow::Cow;
use std::fmt;

/// One step of a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PathSegment {
    /// A named field, e.g. `fs_type`.
    Field(Cow<'static, str>),
    /// A position in a repeated field, e.g. `[1]`.
    Index(usize),
    /// A key of a map field, e.g. `["zone"]`. Map keys are never secret values (secret maps
    /// are keyed by secret *names*), so they may be shown.
    Key(String),
}

/// Where in a message or struct a value lives, e.g. `volume_capabilities[1].mount.fs_type`.
///
/// Built from the outside in with [`FieldPath::field`], [`FieldPath::index`] and
/// [`FieldPath::key`]; printed in the wire's field names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldPath {
    segments: Vec<PathSegment>,
}

impl FieldPath {
    /// The empty path (the value itself).
    pub const fn root() -> Self {
        Self {
            segments: Vec::new(),
        }
    }

    /// A path with one field name.
    pub fn named(name: &'static str) -> Self {
        Self::root().field(name)
    }

    /// This path followed by the field `name`.
    #[must_use]
    pub fn field(mut self, name: &'static str) -> Self {
        self.segments.push(PathSegment::Field(Cow::Borrowed(name)));
        self
    }

    /// This path followed by the position `index` of a repeated field.
    #[must_use]
    pub fn index(mut self, index: usize) -> Self {
        self.segments.push(PathSegment::Index(index));
        self
    }

    /// This path followed by the map key `key`.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.segments.push(PathSegment::Key(key.into()));
        self
    }

    /// `prefix` followed by this path.
    #[must_use]
    pub fn under(mut self, prefix: &FieldPath) -> Self {
        let mut segments = prefix.segments.clone();
        segments.append(&mut self.segments);
        Self { segments }
    }

    /// The steps of this path, outermost first.
    pub fn segments(&self) -> &[PathSegment] {
        &self.segments
    }

    /// Whether this is the empty path.
    pub fn is_root(&self) -> bool {
        self.segments.is_empty()
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.segments.is_empty() {
            return f.write_str("<value>");
        }
        for (i, segment) in self.segments.iter().enumerate() {
            match segment {
                PathSegment::Field(name) if i == 0 => f.write_str(name)?,
                PathSegment::Field(name) => write!(f, ".{name}")?,
                PathSegment::Index(index) => write!(f, "[{index}]")?,
                PathSegment::Key(key) => write!(f, "[{key:?}]")?,
            }
        }
        Ok(())
    }
}

/// Whether a size counts bytes (UTF-8) or characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SizeUnit {
    /// UTF-8 bytes: the spec's limit for strings, ids and maps.
    Bytes,
    /// Characters: the spec's limit for plugin names and topology keys and values.
    Chars,
}

impl fmt::Display for SizeUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeUnit::Bytes => "bytes",
            SizeUnit::Chars => "characters",
        })
    }
}

/// Which syntax rule a string broke, for [`Problem::InvalidCharacter`] and
/// [`Problem::BadEdge`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syntax {
    /// A secret key: ASCII alphanumerics, `-`, `_`, `.` (spec §3.6).
    SecretKey,
    /// A topology key name or segment value: alphanumerics at both ends, `-`, `_`, `.` and
    /// alphanumerics inside (spec §3.12).
    TopologyName,
    /// A topology key prefix: lower-case DNS-name form (spec §3.12).
    TopologyPrefix,
    /// A plugin name: alphanumerics at both ends, `-`, `.` and alphanumerics inside
    /// (spec §2.1).
    PluginName,
    /// A CO-generated `name` (volume or snapshot name): any Unicode except the control
    /// characters the spec bans (spec §2.2 CreateVolume).
    Name,
}

impl fmt::Display for Syntax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Syntax::SecretKey => "secret key (alphanumerics, '-', '_', '.')",
            Syntax::TopologyName => {
                "topology name or value (alphanumerics at the ends; '-', '_', '.', alphanumerics inside)"
            }
            Syntax::TopologyPrefix => {
                "topology key prefix (lower-case alphanumerics at the ends; '-', '.', lower-case alphanumerics inside)"
            }
            Syntax::PluginName => {
                "plugin name (alphanumerics at the ends; '-', '.', alphanumerics inside)"
            }
            Syntax::Name => "name (no control characters)",
        })
    }
}

/// What is wrong with a value. Sizes and limits are numbers, not text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Problem {
    /// A required value is absent or empty.
    Missing,
    /// A value is larger than the spec allows.
    TooLong {
        /// The value's size.
        size: usize,
        /// The largest size allowed.
        limit: usize,
        /// What `size` and `limit` count.
        unit: SizeUnit,
    },
    /// A character the syntax does not allow at this position.
    InvalidCharacter {
        /// The character.
        character: char,
        /// Its position, in characters from the start.
        position: usize,
        /// The rule broken.
        syntax: Syntax,
    },
    /// The value must start and end with an alphanumeric character.
    BadEdge {
        /// The rule broken.
        syntax: Syntax,
    },
    /// A size or count is negative; the spec never allows that.
    Negative {
        /// The value received.
        value: i64,
    },
    /// `limit_bytes` is smaller than `required_bytes`.
    LimitBelowRequired {
        /// The requested minimum.
        required_bytes: i64,
        /// The requested maximum.
        limit_bytes: i64,
    },
    /// A capacity range sets neither `required_bytes` nor `limit_bytes`.
    CapacityRangeEmpty,
    /// Two map keys differ only in case (topology keys are case-insensitive).
    DuplicateKeyIgnoringCase {
        /// The other key it collides with.
        other: String,
    },
    /// Topology keys in one set carry different prefixes; the spec requires one prefix.
    InconsistentPrefix {
        /// The prefix seen first.
        expected: String,
        /// The prefix found here.
        found: String,
    },
    /// A preferred topology is not one of the requisite topologies.
    PreferredNotInRequisite,
    /// An enum number the spec does not define (not even as `UNKNOWN`).
    UnknownEnumValue {
        /// The number received.
        value: i32,
    },
    /// A timestamp outside what the system clock can represent, or with nanos outside
    /// `0..1_000_000_000`.
    InvalidTimestamp {
        /// Seconds since the Unix epoch.
        seconds: i64,
        /// Nanoseconds.
        nanos: i32,
    },
    /// A value that must not be set in this context.
    NotAllowed,
    /// A path that is not valid UTF-8: CSI carries paths as strings.
    NotUtf8,
    /// Two fields that exclude each other are both set.
    MutuallyExclusive {
        /// The other field.
        other: FieldPath,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => f.write_str("is required but missing or empty"),
            Problem::NotUtf8 => f.write_str("is not valid UTF-8 (CSI carries paths as strings)"),
            Problem::TooLong { size, limit, unit } => {
                write!(f, "is {size} {unit}, over the limit of {limit} {unit}")
            }
            Problem::InvalidCharacter {
                character,
                position,
                syntax,
            } => write!(
                f,
                "has the character {character:?} at position {position}, not allowed in a {syntax}"
            ),
            Problem::BadEdge { syntax } => {
                write!(
                    f,
                    "must start and end with an alphanumeric character ({syntax})"
                )
            }
            Problem::Negative { value } => write!(f, "is negative ({value})"),
            Problem::LimitBelowRequired {
                required_bytes,
                limit_bytes,
            } => write!(
                f,
                "limit_bytes {limit_bytes} is below required_bytes {required_bytes}"
            ),
            Problem::CapacityRangeEmpty => {
                f.write_str("sets neither required_bytes nor limit_bytes")
            }
            Problem::DuplicateKeyIgnoringCase { other } => {
                write!(f, "differs only in case from key {other:?}")
            }
            Problem::InconsistentPrefix { expected, found } => write!(
                f,
                "has key prefix {found:?} but other keys use {expected:?}; one prefix is required"
            ),
            Problem::PreferredNotInRequisite => {
                f.write_str("is preferred but not among the requisite topologies")
            }
            Problem::UnknownEnumValue { value } => {
                write!(f, "has the value {value}, which the spec does not define")
            }
            Problem::InvalidTimestamp { seconds, nanos } => {
                write!(f, "is not a valid timestamp ({seconds}s, {nanos}ns)")
            }
            Problem::NotAllowed => f.write_str("must not be set here"),
            Problem::MutuallyExclusive { other } => {
                write!(f, "cannot be set together with {other}")
            }
        }
    }
}

/// One broken rule: which field, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Violation {
    /// Where the value lives.
    pub field: FieldPath,
    /// What is wrong.
    pub problem: Problem,
}

impl Violation {
    /// A violation of `problem` at `field`.
    pub fn new(field: FieldPath, problem: Problem) -> Self {
        Self { field, problem }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.problem)
    }
}

/// The most violations a [`ValidationErrors`] keeps; further ones are only counted.
///
/// A value from outside (a plugin's answer, say) can break one rule per element of a list:
/// a listing of two-byte entries within the 4 MiB decode limit holds two million of them.
/// Kept whole, their violations would take hundreds of megabytes and their text megabytes
/// per log line; the first hundred say what is wrong.
pub const MAX_VIOLATIONS: usize = 100;

/// Every rule a value broke, collected in one pass.
///
/// An `Err(ValidationErrors)` returned by this crate always holds at least one
/// [`Violation`]. It keeps the first [`MAX_VIOLATIONS`] and counts the rest
/// ([`omitted`](Self::omitted)); `Display` lists the kept ones and says how many more there
/// were.
///
/// ```
/// use csi_structs::validation::MAX_VIOLATIONS;
/// use csi_structs::{FieldPath, Problem, ValidationErrors};
///
/// let mut errs = ValidationErrors::new();
/// for i in 0..MAX_VIOLATIONS + 5 {
///     errs.push(FieldPath::named("entries").index(i), Problem::Missing);
/// }
/// assert_eq!(errs.len(), MAX_VIOLATIONS + 5);
/// assert_eq!(errs.violations().len(), MAX_VIOLATIONS);
/// assert_eq!(errs.omitted(), 5);
/// assert!(errs.to_string().ends_with("; and 5 more"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
#[error("{}", DisplayList(self))]
pub struct ValidationErrors {
    violations: Vec<Violation>,
    /// Violations recorded beyond [`MAX_VIOLATIONS`]: counted, not kept.
    omitted: usize,
}

struct DisplayList<'a>(&'a ValidationErrors);

impl fmt::Display for DisplayList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} validation error{}: ", if n == 1 { "" } else { "s" })?;
        for (i, v) in self.0.violations.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{v}")?;
        }
        if self.0.omitted > 0 {
            write!(f, "; and {} more", self.0.omitted)?;
        }
        Ok(())
    }
}

impl ValidationErrors {
    /// An empty collector.
    pub const fn new() -> Self {
        Self {
            violations: Vec::new(),
            omitted: 0,
        }
    }

    /// Keeps `violation`, or counts it once [`MAX_VIOLATIONS`] are kept.
    fn keep(&mut self, violation: Violation) {
        if self.violations.len() < MAX_VIOLATIONS {
            self.violations.push(violation);
        } else {
            self.omitted = self.omitted.saturating_add(1);
        }
    }

    /// Records a violation.
    pub fn push(&mut self, field: FieldPath, problem: Problem) {
        self.keep(Violation { field, problem });
    }

    /// Records every violation of `other`.
    pub fn extend(&mut self, other: ValidationErrors) {
        for v in other.violations {
            self.keep(v);
        }
        self.omitted = self.omitted.saturating_add(other.omitted);
    }

    /// Records every violation of `other`, with `prefix` put in front of each field path.
    pub fn extend_under(&mut self, prefix: &FieldPath, other: ValidationErrors) {
        for v in other.violations {
            self.keep(Violation {
                field: v.field.under(prefix),
                problem: v.problem,
            });
        }
        self.omitted = self.omitted.saturating_add(other.omitted);
    }

    /// The same violations with `prefix` put in front of each field path.
    #[must_use]
    pub fn under(self, prefix: &FieldPath) -> Self {
        let mut out = Self::new();
        out.extend_under(prefix, self);
        out
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.violations.is_empty()
    }

    /// How many violations were recorded, those kept and those only counted.
    pub fn len(&self) -> usize {
        self.violations.len().saturating_add(self.omitted)
    }

    /// How many violations were recorded beyond the [`MAX_VIOLATIONS`] kept.
    pub fn omitted(&self) -> usize {
        self.omitted
    }

    /// The violations kept (the first [`MAX_VIOLATIONS`]), in the order they were found.
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// The violations kept, by value.
    pub fn into_violations(self) -> Vec<Violation> {
        self.violations
    }

    /// `Ok(value)` when nothing was recorded, else `Err(self)`.
    ///
    /// # Errors
    ///
    /// Returns `self` when at least one violation was recorded.
    pub fn into_result<T>(self, value: T) -> Result<T, ValidationErrors> {
        if self.violations.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }

    /// A single violation.
    pub fn single(field: FieldPath, problem: Problem) -> Self {
        Self {
            violations: vec![Violation { field, problem }],
            omitted: 0,
        }
    }
}

impl IntoIterator for ValidationErrors {
    type Item = Violation;
    type IntoIter = std::vec::IntoIter<Violation>;
    fn into_iter(self) -> Self::IntoIter {
        self.violations.into_iter()
    }
}

impl<'a> IntoIterator for &'a ValidationErrors {
    type Item = &'a Violation;
    type IntoIter = std::slice::Iter<'a, Violation>;
    fn into_iter(self) -> Self::IntoIter {
        self.violations.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_renders_like_the_wire() {
        let p = FieldPath::named("volume_capabilities")
            .index(1)
            .field("mount")
            .field("fs_type");
        assert_eq!(p.to_string(), "volume_capabilities[1].mount.fs_type");
        let k = FieldPath::named("parameters").key("zone");
        assert_eq!(k.to_string(), "parameters[\"zone\"]");
        let nested = FieldPath::named("fs_type").under(&FieldPath::named("mount"));
        assert_eq!(nested.to_string(), "mount.fs_type");
    }

    #[test]
    fn a_hundred_thousand_violations_keep_a_hundred_and_a_short_text() {
        // Found by the client campaign: a listing of 100,000 entries without a volume gave a
        // 5.6 MB error text, one line per entry.
        let mut page = ValidationErrors::new();
        for i in 0..100_000 {
            page.push(
                FieldPath::named("entries").index(i).field("volume"),
                Problem::Missing,
            );
        }
        assert_eq!(page.len(), 100_000);
        assert_eq!(page.violations().len(), MAX_VIOLATIONS);
        assert_eq!(page.omitted(), 100_000 - MAX_VIOLATIONS);
        let mut all = ValidationErrors::new();
        all.push(FieldPath::named("next_token"), Problem::Missing);
        all.extend_under(&FieldPath::named("page"), page);
        assert_eq!(all.len(), 100_001, "every violation is counted");
        assert_eq!(all.violations().len(), MAX_VIOLATIONS);
        let text = all.to_string();
        assert!(text.len() < 16 << 10, "{} bytes", text.len());
        assert!(
            text.starts_with("100001 validation errors: next_token is required"),
            "{text}"
        );
        assert!(
            text.contains("page.entries[0].volume is required"),
            "{text}"
        );
        assert!(text.ends_with("; and 99901 more"), "{text}");
    }

    #[test]
    fn display_lists_every_violation() {
        let mut errs = ValidationErrors::new();
        errs.push(FieldPath::named("a"), Problem::Missing);
        errs.push(
            FieldPath::named("b"),
            Problem::TooLong {
                size: 200,
                limit: 128,
                unit: SizeUnit::Bytes,
            },
        );
        let text = errs.to_string();
        assert!(text.starts_with("2 validation errors: "), "{text}");
        assert!(text.contains("a is required"), "{text}");
        assert!(
            text.contains("b is 200 bytes, over the limit of 128 bytes"),
            "{text}"
        );
        assert!(errs.into_result(()).is_err());
        assert_eq!(ValidationErrors::new().into_result(7), Ok(7));
    }

    #[test]
    fn under_prefixes_every_path() {
        let errs = ValidationErrors::single(FieldPath::named("fs_type"), Problem::Missing)
            .under(&FieldPath::named("volume_capability").field("mount"));
        assert_eq!(
            errs.violations()[0].field.to_string(),
            "volume_capability.mount.fs_type"
        );
    }
}
