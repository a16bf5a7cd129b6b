//! [`Topology`] and [`TopologyRequirement`] with the syntax rules of spec §3.12.
//!
//! A topology is a map of domain keys (`[prefix/]name`, e.g. `topology.example.com/zone`) to
//! segment values (e.g. `us-east-1a`). Keys are case-insensitive, so `Zone` and `zone` may not
//! both appear. Names and values: at most 63 characters, alphanumerics at both ends, `-`, `_`,
//! `.` and alphanumerics inside; values non-empty. Prefixes: at most 63 characters in
//! lower-case DNS form.
//!
//! The spec also asks a plugin to use one prefix on every key. Real plugins break that
//! (several report a vendor key and a well-known key side by side), so it is not part of
//! [`Topology::new`]; [`Topology::prefix_violations`] checks it for those who want to.
//!
//! ```
//! use csi_structs::{Topology, TopologyRequirement};
//!
//! let a = Topology::try_from_iter([("topology.example.com/zone", "a")])?;
//! let b = Topology::try_from_iter([("topology.example.com/zone", "b")])?;
//! let req = TopologyRequirement::new(vec![a.clone(), b.clone()], vec![b.clone()])?;
//! assert_eq!(req.preferred(), &[b]);
//! assert!(Topology::try_from_iter([("zone", "")]).is_err());
//! assert!(TopologyRequirement::new(vec![a], vec![Topology::try_from_iter([("x", "y")])?]).is_err());
//! # Ok::<(), csi_structs::ValidationErrors>(())
//! ```

use std::collections::{BTreeMap, HashMap};

use crate::limits::{MAX_NAME_CHARS, check_map};
use crate::validation::{FieldPath, Problem, SizeUnit, Syntax, ValidationErrors};

/// Where a volume is reachable or a node sits: topological domain → segment
/// (`csi.v1.Topology`). Never empty.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(
    try_from = "BTreeMap<String, String>",
    into = "BTreeMap<String, String>"
)]
pub struct Topology(BTreeMap<String, String>);

impl Topology {
    /// Checks every key and value and wraps `segments`.
    ///
    /// # Errors
    ///
    /// Every broken rule at once, each naming `segments["key"]`: an empty map
    /// ([`Problem::Missing`]), bad key or value syntax, over-long parts, keys that differ only
    /// in case, and the 4 KiB map limit.
    pub fn new(segments: BTreeMap<String, String>) -> Result<Self, ValidationErrors> {
        let mut errs = ValidationErrors::new();
        check_segments(&mut errs, &FieldPath::named("segments"), &segments);
        errs.into_result(Self(segments))
    }

    /// Checks and collects the pairs.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn try_from_iter<I, K, V>(pairs: I) -> Result<Self, ValidationErrors>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self::new(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// Checks and converts a wire map (`Topology.segments`).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new), with paths under `at`.
    pub fn from_wire_at(
        segments: &HashMap<String, String>,
        at: &FieldPath,
    ) -> Result<Self, ValidationErrors> {
        let map: BTreeMap<String, String> = segments
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut errs = ValidationErrors::new();
        check_segments(&mut errs, &at.clone().field("segments"), &map);
        errs.into_result(Self(map))
    }

    /// The value of `key`, matched case-insensitively (keys are case-insensitive).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    /// The segments, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// How many segments there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always `false`: a topology has at least one segment.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The segments.
    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }

    /// The segments as the `HashMap` prost uses.
    pub fn to_wire_segments(&self) -> HashMap<String, String> {
        self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Whether a node at `node` lies inside this topology: every segment of `self` appears in
    /// `node` with the same value (keys compared case-insensitively). Extra node segments do
    /// not matter.
    pub fn contains(&self, node: &Topology) -> bool {
        self.0.iter().all(|(k, v)| node.get(k) == Some(v.as_str()))
    }

    /// Keys whose prefix differs from the first prefix seen (spec §3.12 asks for one prefix;
    /// see the module docs for why this is separate from [`new`](Self::new)).
    pub fn prefix_violations(&self) -> ValidationErrors {
        let mut errs = ValidationErrors::new();
        let mut first: Option<&str> = None;
        for key in self.0.keys() {
            let prefix = key.split_once('/').map(|(p, _)| p);
            match (first, prefix) {
                (None, Some(p)) => first = Some(p),
                (Some(expected), Some(p)) if p != expected => errs.push(
                    FieldPath::named("segments").key(key.clone()),
                    Problem::InconsistentPrefix {
                        expected: expected.to_string(),
                        found: p.to_string(),
                    },
                ),
                _ => {}
            }
        }
        errs
    }
}

/// Whether a volume reachable from `volume_topologies` may be used on a node at `node`.
///
/// An empty list means reachable from everywhere; a node without topology (`None`) is only
/// suitable for volumes reachable from everywhere.
pub fn accessible_from(volume_topologies: &[Topology], node: Option<&Topology>) -> bool {
    if volume_topologies.is_empty() {
        return true;
    }
    node.is_some_and(|n| volume_topologies.iter().any(|t| t.contains(n)))
}

/// A volume that may not be used on a node: none of the topologies it is reachable from
/// contains the node's (see [`accessible_from`]). Its text says both:
/// `reachable from {zone=mars} only; the node is at {zone=earth}`.
///
/// ```
/// use csi_structs::Topology;
/// use csi_structs::topology::check_accessible;
///
/// let mars = Topology::try_from_iter([("zone", "mars")])?;
/// let earth = Topology::try_from_iter([("zone", "earth")])?;
/// let refused = check_accessible(&[mars.clone()], Some(&earth)).unwrap_err();
/// assert_eq!(
///     refused.to_string(),
///     "reachable from {zone=mars} only; the node is at {zone=earth}"
/// );
/// assert!(check_accessible(&[mars.clone()], Some(&mars)).is_ok());
/// assert!(check_accessible(&[], None).is_ok());
/// # Ok::<(), csi_structs::ValidationErrors>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "reachable from {} only; the node is at {}",
    topologies_text(accessible),
    node.as_ref().map_or_else(|| "no topology".to_owned(), ToString::to_string)
)]
pub struct NotAccessible {
    /// The topologies the volume is reachable from (never empty).
    pub accessible: Vec<Topology>,
    /// The node's topology, if it has one.
    pub node: Option<Topology>,
}

/// The rule of [`accessible_from`] as a check: `Ok` when a volume reachable from
/// `volume_topologies` may be used on a node at `node`, otherwise why not. Orchestrators
/// apply it before publishing a volume on a node, so the plugin is never asked for what it
/// could only refuse late.
///
/// # Errors
///
/// [`NotAccessible`], naming both sides.
pub fn check_accessible(
    volume_topologies: &[Topology],
    node: Option<&Topology>,
) -> Result<(), NotAccessible> {
    if accessible_from(volume_topologies, node) {
        Ok(())
    } else {
        Err(NotAccessible {
            accessible: volume_topologies.to_vec(),
            node: node.cloned(),
        })
    }
}

/// `{a=1} or {b=2}`; `everywhere` for none: the topologies a volume is reachable from, for
/// messages.
pub fn topologies_text(list: &[Topology]) -> String {
    if list.is_empty() {
        return "everywhere".into();
    }
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}

/// `{key=value, key=value}`, keys sorted: for messages. A plugin chose these strings; escape
/// them ([`crate::untrusted`]) where a person reads them.
///
/// ```
/// use csi_structs::Topology;
///
/// let t = Topology::try_from_iter([("region", "eu"), ("zone", "eu-1a")])?;
/// assert_eq!(t.to_string(), "{region=eu, zone=eu-1a}");
/// # Ok::<(), csi_structs::ValidationErrors>(())
/// ```
impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}={v}")?;
        }
        f.write_str("}")
    }
}

impl TryFrom<BTreeMap<String, String>> for Topology {
    type Error = ValidationErrors;
    fn try_from(map: BTreeMap<String, String>) -> Result<Self, Self::Error> {
        Self::new(map)
    }
}

impl From<Topology> for BTreeMap<String, String> {
    fn from(t: Topology) -> Self {
        t.0
    }
}

pub(crate) fn check_segments(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    map: &BTreeMap<String, String>,
) {
    if map.is_empty() {
        errs.push(at.clone(), Problem::Missing);
    }
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for (key, value) in map {
        let here = at.clone().key(key.clone());
        check_key(errs, &here, key);
        check_name_like(
            errs,
            &here.clone().field("value"),
            value,
            Syntax::TopologyName,
        );
        let folded = key.to_ascii_lowercase();
        if let Some(other) = seen.get(&folded) {
            errs.push(
                here,
                Problem::DuplicateKeyIgnoringCase {
                    other: (*other).to_string(),
                },
            );
        } else {
            seen.insert(folded, key);
        }
    }
    check_map(errs, at, map);
}

fn check_key(errs: &mut ValidationErrors, at: &FieldPath, key: &str) {
    match key.split_once('/') {
        Some((prefix, name)) => {
            check_prefix(errs, &at.clone().field("prefix"), prefix);
            check_name_like(errs, &at.clone().field("name"), name, Syntax::TopologyName);
        }
        None => check_name_like(errs, &at.clone().field("name"), key, Syntax::TopologyName),
    }
}

fn too_many_chars(errs: &mut ValidationErrors, at: &FieldPath, value: &str) -> bool {
    let chars = value.chars().count();
    if chars > MAX_NAME_CHARS {
        errs.push(
            at.clone(),
            Problem::TooLong {
                size: chars,
                limit: MAX_NAME_CHARS,
                unit: SizeUnit::Chars,
            },
        );
        true
    } else {
        false
    }
}

/// Checks a name or value: non-empty, ≤63 characters, alphanumeric ends, inner characters
/// allowed by `syntax`.
pub(crate) fn check_name_like(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    value: &str,
    syntax: Syntax,
) {
    if value.is_empty() {
        errs.push(at.clone(), Problem::Missing);
        return;
    }
    too_many_chars(errs, at, value);
    let inner_ok = |c: char| match syntax {
        Syntax::PluginName => c.is_ascii_alphanumeric() || matches!(c, '-' | '.'),
        _ => c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'),
    };
    if let Some((position, character)) = value.chars().enumerate().find(|(_, c)| !inner_ok(*c)) {
        errs.push(
            at.clone(),
            Problem::InvalidCharacter {
                character,
                position,
                syntax,
            },
        );
    } else if !edges_ok(value, |c| c.is_ascii_alphanumeric()) {
        errs.push(at.clone(), Problem::BadEdge { syntax });
    }
}

fn check_prefix(errs: &mut ValidationErrors, at: &FieldPath, prefix: &str) {
    let syntax = Syntax::TopologyPrefix;
    if prefix.is_empty() {
        errs.push(at.clone(), Problem::Missing);
        return;
    }
    too_many_chars(errs, at, prefix);
    let lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if let Some((position, character)) = prefix
        .chars()
        .enumerate()
        .find(|(_, c)| !(lower_alnum(*c) || matches!(c, '-' | '.')))
    {
        errs.push(
            at.clone(),
            Problem::InvalidCharacter {
                character,
                position,
                syntax,
            },
        );
    } else if !edges_ok(prefix, lower_alnum)
        || !prefix.split('.').all(|label| edges_ok(label, lower_alnum))
    {
        // DNS form: every dot-separated label starts and ends alphanumeric.
        errs.push(at.clone(), Problem::BadEdge { syntax });
    }
}

fn edges_ok(s: &str, ok: impl Fn(char) -> bool) -> bool {
    match (s.chars().next(), s.chars().next_back()) {
        (Some(a), Some(b)) => ok(a) && ok(b),
        _ => false,
    }
}

/// Where a new volume (or, with snapshot topology, a snapshot) must or should be reachable
/// (`csi.v1.TopologyRequirement`).
///
/// At least one list is non-empty, and when `requisite` is set every `preferred` entry is one
/// of its entries.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "TopologyRequirementRepr", into = "TopologyRequirementRepr")]
pub struct TopologyRequirement {
    requisite: Vec<Topology>,
    preferred: Vec<Topology>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct TopologyRequirementRepr {
    #[serde(default)]
    requisite: Vec<Topology>,
    #[serde(default)]
    preferred: Vec<Topology>,
}

impl TryFrom<TopologyRequirementRepr> for TopologyRequirement {
    type Error = ValidationErrors;
    fn try_from(r: TopologyRequirementRepr) -> Result<Self, Self::Error> {
        Self::new(r.requisite, r.preferred)
    }
}

impl From<TopologyRequirement> for TopologyRequirementRepr {
    fn from(r: TopologyRequirement) -> Self {
        Self {
            requisite: r.requisite,
            preferred: r.preferred,
        }
    }
}

impl TopologyRequirement {
    /// A requirement from its two lists.
    ///
    /// # Errors
    ///
    /// [`Problem::Missing`] when both are empty; [`Problem::PreferredNotInRequisite`] for
    /// each `preferred[i]` missing from a non-empty `requisite`.
    pub fn new(
        requisite: Vec<Topology>,
        preferred: Vec<Topology>,
    ) -> Result<Self, ValidationErrors> {
        let mut errs = ValidationErrors::new();
        check_requirement(&mut errs, &FieldPath::root(), &requisite, &preferred);
        errs.into_result(Self {
            requisite,
            preferred,
        })
    }

    /// Topologies the volume must be reachable from (at least one of, per the spec's rules).
    pub fn requisite(&self) -> &[Topology] {
        &self.requisite
    }

    /// Topologies to try first, in order.
    pub fn preferred(&self) -> &[Topology] {
        &self.preferred
    }
}

pub(crate) fn check_requirement(
    errs: &mut ValidationErrors,
    at: &FieldPath,
    requisite: &[Topology],
    preferred: &[Topology],
) {
    if requisite.is_empty() && preferred.is_empty() {
        errs.push(at.clone().field("requisite"), Problem::Missing);
    }
    if !requisite.is_empty() {
        for (i, p) in preferred.iter().enumerate() {
            if !requisite.contains(p) {
                errs.push(
                    at.clone().field("preferred").index(i),
                    Problem::PreferredNotInRequisite,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(key: &str, value: &str) -> Vec<(String, Problem)> {
        Topology::try_from_iter([(key, value)])
            .err()
            .map(|e| {
                e.into_iter()
                    .map(|v| (v.field.to_string(), v.problem))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn key_and_value_syntax_table() {
        let ok = [
            ("zone", "a"),
            ("topology.example.com/zone", "us-east-1a"),
            ("ex-1.io/Rack_1", "r.1"),
            ("a", &"v".repeat(63)),
            (&format!("{}/n", "p".repeat(63)), "v"),
        ];
        for (k, v) in ok {
            assert_eq!(problems(k, v), vec![], "{k:?}={v:?}");
        }
        let inv = |c, p, s| Problem::InvalidCharacter {
            character: c,
            position: p,
            syntax: s,
        };
        let bad: Vec<(&str, String, (&str, Problem))> = vec![
            (
                "zone",
                String::new(),
                ("segments[\"zone\"].value", Problem::Missing),
            ),
            (
                "zone",
                "-a".into(),
                (
                    "segments[\"zone\"].value",
                    Problem::BadEdge {
                        syntax: Syntax::TopologyName,
                    },
                ),
            ),
            (
                "zone",
                "a b".into(),
                (
                    "segments[\"zone\"].value",
                    inv(' ', 1, Syntax::TopologyName),
                ),
            ),
            (
                "zone",
                "v".repeat(64),
                (
                    "segments[\"zone\"].value",
                    Problem::TooLong {
                        size: 64,
                        limit: 63,
                        unit: SizeUnit::Chars,
                    },
                ),
            ),
            (
                "_zone",
                "a".into(),
                (
                    "segments[\"_zone\"].name",
                    Problem::BadEdge {
                        syntax: Syntax::TopologyName,
                    },
                ),
            ),
            (
                "Example.com/zone",
                "a".into(),
                (
                    "segments[\"Example.com/zone\"].prefix",
                    inv('E', 0, Syntax::TopologyPrefix),
                ),
            ),
            (
                "example..com/zone",
                "a".into(),
                (
                    "segments[\"example..com/zone\"].prefix",
                    Problem::BadEdge {
                        syntax: Syntax::TopologyPrefix,
                    },
                ),
            ),
            (
                "ex_ample/zone",
                "a".into(),
                (
                    "segments[\"ex_ample/zone\"].prefix",
                    inv('_', 2, Syntax::TopologyPrefix),
                ),
            ),
            (
                "/zone",
                "a".into(),
                ("segments[\"/zone\"].prefix", Problem::Missing),
            ),
            (
                "a/b/c",
                "a".into(),
                (
                    "segments[\"a/b/c\"].name",
                    inv('/', 1, Syntax::TopologyName),
                ),
            ),
        ];
        for (k, v, (path, problem)) in bad {
            assert_eq!(
                problems(k, &v),
                vec![(path.to_string(), problem)],
                "{k:?}={v:?}"
            );
        }
    }

    #[test]
    fn case_insensitive_keys_and_all_problems_at_once() {
        let err =
            Topology::try_from_iter([("Zone", "a"), ("zone", "b"), ("rack", "")]).unwrap_err();
        let got: Vec<Problem> = err.into_iter().map(|v| v.problem).collect();
        assert_eq!(
            got,
            vec![
                Problem::Missing,
                Problem::DuplicateKeyIgnoringCase {
                    other: "Zone".into()
                }
            ]
        );
        assert!(Topology::new(BTreeMap::new()).is_err());
    }

    #[test]
    fn containment_and_accessibility() {
        let vol = Topology::try_from_iter([("zone", "a")]).unwrap();
        let node = Topology::try_from_iter([("Zone", "a"), ("rack", "1")]).unwrap();
        let other = Topology::try_from_iter([("zone", "b")]).unwrap();
        assert!(vol.contains(&node));
        assert!(!vol.contains(&other));
        assert!(accessible_from(&[], None));
        assert!(accessible_from(&[other.clone(), vol.clone()], Some(&node)));
        assert!(!accessible_from(std::slice::from_ref(&vol), None));
        assert!(!accessible_from(&[other], Some(&node)));
    }

    #[test]
    fn prefix_consistency_is_opt_in() {
        let t = Topology::try_from_iter([("a.io/zone", "x"), ("b.io/rack", "y"), ("plain", "z")])
            .unwrap();
        let errs = t.prefix_violations();
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs.violations()[0].problem,
            Problem::InconsistentPrefix {
                expected: "a.io".into(),
                found: "b.io".into()
            }
        );
    }

    #[test]
    fn requirement_rules() {
        let a = Topology::try_from_iter([("zone", "a")]).unwrap();
        let b = Topology::try_from_iter([("zone", "b")]).unwrap();
        assert!(TopologyRequirement::new(vec![a.clone()], vec![]).is_ok());
        assert!(TopologyRequirement::new(vec![], vec![b.clone()]).is_ok());
        let empty = TopologyRequirement::new(vec![], vec![]).unwrap_err();
        assert_eq!(empty.violations()[0].problem, Problem::Missing);
        let not_subset = TopologyRequirement::new(vec![a.clone()], vec![a.clone(), b]).unwrap_err();
        assert_eq!(not_subset.violations()[0].field.to_string(), "preferred[1]");
        let json =
            serde_json::to_string(&TopologyRequirement::new(vec![a.clone()], vec![a]).unwrap())
                .unwrap();
        assert_eq!(
            json,
            r#"{"requisite":[{"zone":"a"}],"preferred":[{"zone":"a"}]}"#
        );
        assert!(serde_json::from_str::<TopologyRequirement>(r#"{"requisite":[]}"#).is_err());
    }
}
