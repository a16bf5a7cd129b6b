//! [`Secrets`]: a secret map whose `Debug` and `Display` never show a value.
//!
//! Spec §3.6: keys are secret *names* made of alphanumerics, `-`, `_` and `.`; values are
//! secret data and must never reach a log. This type prints keys only, and hands out values
//! only through methods whose names say so ([`expose`](Secrets::expose),
//! [`iter_exposed`](Secrets::iter_exposed)).
//!
//! Serializing *does* write the values, because an orchestrator must persist the secrets of a
//! registered volume to pass them to later calls. Serialize into storage, never into a log.
//!
//! ```
//! use csi_structs::Secrets;
//!
//! let s = Secrets::try_from_iter([("password", "hunter2")])?;
//! assert_eq!(format!("{s:?}"), r#"Secrets({"password": <redacted>})"#);
//! assert_eq!(s.to_string(), r#"{"password": <redacted>}"#);
//! assert_eq!(s.expose("password"), Some("hunter2"));
//! assert!(Secrets::try_from_iter([("pass word", "x")]).is_err());
//! # Ok::<(), csi_structs::ValidationErrors>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::limits::check_map;
use crate::validation::{FieldPath, Problem, Syntax, ValidationErrors};

/// A map of secret names to secret values (`secrets` in every RPC that carries them).
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(
    try_from = "BTreeMap<String, String>",
    into = "BTreeMap<String, String>"
)]
pub struct Secrets(BTreeMap<String, String>);

impl Secrets {
    /// The field name used in validation errors.
    pub const FIELD: &'static str = "secrets";

    /// No secrets.
    pub const fn new() -> Self {
        Self(BTreeMap::new())
    }

    /// Checks every key (spec §3.6 syntax) and the 4 KiB limit, and wraps `map`.
    ///
    /// # Errors
    ///
    /// Every bad key ([`Problem::Missing`] for an empty key, [`Problem::InvalidCharacter`]
    /// naming the character — keys are names, not secret data) and the size limit, at once.
    /// Values are never checked or quoted.
    pub fn try_new(map: BTreeMap<String, String>) -> Result<Self, ValidationErrors> {
        Self::try_new_at(map, &FieldPath::named(Self::FIELD))
    }

    /// Like [`try_new`](Self::try_new), naming `field` in errors.
    ///
    /// # Errors
    ///
    /// As [`try_new`](Self::try_new).
    pub fn try_new_at(
        map: BTreeMap<String, String>,
        field: &FieldPath,
    ) -> Result<Self, ValidationErrors> {
        let mut errs = ValidationErrors::new();
        for key in map.keys() {
            check_secret_key(&mut errs, &field.clone().key(key.clone()), key);
        }
        check_map(&mut errs, field, &map);
        errs.into_result(Self(map))
    }

    /// Checks and collects the pairs.
    ///
    /// # Errors
    ///
    /// As [`try_new`](Self::try_new).
    pub fn try_from_iter<I, K, V>(pairs: I) -> Result<Self, ValidationErrors>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self::try_new(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// Checks and converts a wire map, naming `field` in errors.
    ///
    /// # Errors
    ///
    /// As [`try_new`](Self::try_new).
    pub fn from_wire_at(
        map: HashMap<String, String>,
        field: &FieldPath,
    ) -> Result<Self, ValidationErrors> {
        Self::try_new_at(map.into_iter().collect(), field)
    }

    /// The map as the `HashMap` prost uses (the wire types' `Debug` redacts it too).
    pub fn to_wire(&self) -> HashMap<String, String> {
        self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// The secret value for `key`. The name says it: the value leaves the wrapper.
    pub fn expose(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Every entry with its value.
    pub fn iter_exposed(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The secret names, sorted. Safe to log.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// How many secrets there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// These secrets with every entry of `overrides` put on top (for a request that supplies
    /// some secrets of its own).
    #[must_use]
    pub fn overlaid_with(&self, overrides: &Secrets) -> Secrets {
        let mut map = self.0.clone();
        map.extend(overrides.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        Secrets(map)
    }

    /// The map, by value.
    pub fn into_exposed(self) -> BTreeMap<String, String> {
        self.0
    }
}

fn check_secret_key(errs: &mut ValidationErrors, field: &FieldPath, key: &str) {
    if key.is_empty() {
        errs.push(field.clone(), Problem::Missing);
        return;
    }
    if let Some((position, character)) = key
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        errs.push(
            field.clone(),
            Problem::InvalidCharacter {
                character,
                position,
                syntax: Syntax::SecretKey,
            },
        );
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Secrets")
            .field(&csi_proto::Redacted(&self.0))
            .finish()
    }
}

impl fmt::Display for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&csi_proto::Redacted(&self.0), f)
    }
}

impl TryFrom<BTreeMap<String, String>> for Secrets {
    type Error = ValidationErrors;
    fn try_from(map: BTreeMap<String, String>) -> Result<Self, Self::Error> {
        Self::try_new(map)
    }
}

impl From<Secrets> for BTreeMap<String, String> {
    fn from(s: Secrets) -> Self {
        s.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKER: &str = "s3cr3t-VALUE-marker";

    #[test]
    fn debug_and_display_never_show_values() {
        let s = Secrets::try_from_iter([("token", MARKER), ("user.name", MARKER)]).unwrap();
        let outputs = [
            format!("{s:?}"),
            format!("{s:#?}"),
            s.to_string(),
            format!("{:?}", Some(&s)),
        ];
        for out in outputs {
            assert!(!out.contains(MARKER), "{out}");
            assert!(out.contains("token") && out.contains("user.name"), "{out}");
        }
    }

    #[test]
    fn key_syntax_table() {
        let cases = [
            ("abc", None),
            ("a-b_c.d9", None),
            ("", Some(Problem::Missing)),
            (
                "a b",
                Some(Problem::InvalidCharacter {
                    character: ' ',
                    position: 1,
                    syntax: Syntax::SecretKey,
                }),
            ),
            (
                "a/b",
                Some(Problem::InvalidCharacter {
                    character: '/',
                    position: 1,
                    syntax: Syntax::SecretKey,
                }),
            ),
            (
                "ключ",
                Some(Problem::InvalidCharacter {
                    character: 'к',
                    position: 0,
                    syntax: Syntax::SecretKey,
                }),
            ),
        ];
        for (key, expected) in cases {
            let got = Secrets::try_from_iter([(key, "v")])
                .err()
                .map(|e| e.violations()[0].problem.clone());
            assert_eq!(got, expected, "key {key:?}");
        }
    }

    #[test]
    fn every_problem_at_once_and_values_never_in_errors() {
        let err = Secrets::try_from_iter([
            ("bad key", MARKER.to_string()),
            ("also/bad", "x".repeat(5000)),
        ])
        .unwrap_err();
        assert_eq!(err.len(), 3, "{err}");
        let text = err.to_string();
        assert!(!text.contains(MARKER), "{text}");
        assert!(text.contains("secrets[\"bad key\"]"), "{text}");
    }

    #[test]
    fn overlay_and_serde() {
        let base = Secrets::try_from_iter([("a", "1"), ("b", "2")]).unwrap();
        let over = Secrets::try_from_iter([("b", "3")]).unwrap();
        let merged = base.overlaid_with(&over);
        assert_eq!(merged.expose("a"), Some("1"));
        assert_eq!(merged.expose("b"), Some("3"));
        let json = serde_json::to_string(&merged).unwrap();
        assert_eq!(serde_json::from_str::<Secrets>(&json).unwrap(), merged);
        assert!(serde_json::from_str::<Secrets>(r#"{"bad key":"v"}"#).is_err());
    }
}
