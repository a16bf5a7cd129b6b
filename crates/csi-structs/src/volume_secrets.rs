//! [`VolumeSecrets`]: the secrets of one volume, with the set each kind of call gets.
//!
//! Spec §3.6 lets a CO send the same secrets to every call, and many plugins expect that;
//! others want different secrets for provisioning, attaching and mounting (Kubernetes keeps
//! one secret reference per operation). A [`VolumeSecrets`] holds both: entries for every call,
//! and per [`SecretsUse`] entries laid over them. [`VolumeSecrets::for_use`] gives the map one
//! call sends.
//!
//! The text forms, read by [`VolumeSecrets::parse_key_values`] and by serde (JSON):
//!
//! ```text
//! # KEY=VALUE lines: sent with every call
//! username=admin
//! password=hunter2
//! [node-stage]          # only NodeStageVolume gets these (laid over the ones above)
//! keyring=AQBx...
//! ```
//!
//! ```json
//! {"username": "admin", "password": "hunter2", "node-stage": {"keyring": "AQBx..."}}
//! ```
//!
//! Nothing here ever prints or quotes a value: `Debug` shows keys only, and parse errors name
//! the line and the key, never the text of a value.
//!
//! ```
//! use csi_structs::volume_secrets::{SecretsUse, VolumeSecrets};
//!
//! let s = VolumeSecrets::parse_key_values("user=a\npass=b\n[node-stage]\nkeyring=k\n")?;
//! assert_eq!(s.for_use(SecretsUse::NodeStage).expose("keyring"), Some("k"));
//! assert_eq!(s.for_use(SecretsUse::NodeStage).expose("user"), Some("a"));
//! assert!(!s.for_use(SecretsUse::NodePublish).contains_key("keyring"));
//! assert!(!format!("{s:?}").contains("pass=b"));
//! # Ok::<(), csi_structs::volume_secrets::SecretsTextError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;

use csi_proto::Rpc;

use crate::limits::check_map;
use crate::secrets::Secrets;
use crate::validation::{FieldPath, ValidationErrors};

/// The kinds of call that carry a volume's secrets, each with its own set in a
/// [`VolumeSecrets`] (the spec's `secrets` fields, grouped the way orchestrators configure
/// them).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SecretsUse {
    /// `CreateVolume`.
    Create,
    /// `DeleteVolume`.
    Delete,
    /// `ControllerPublishVolume`, and `ControllerUnpublishVolume` (spec: "should be the
    /// ones used for publish").
    ControllerPublish,
    /// `ValidateVolumeCapabilities`.
    Validate,
    /// `ControllerExpandVolume`.
    ControllerExpand,
    /// `NodeStageVolume`.
    NodeStage,
    /// `NodePublishVolume`.
    NodePublish,
    /// `NodeExpandVolume`.
    NodeExpand,
    /// `CreateSnapshot`, `DeleteSnapshot`, `ListSnapshots` and `GetSnapshot`.
    Snapshot,
}

impl SecretsUse {
    /// Every use, in order.
    pub const ALL: [SecretsUse; 9] = [
        SecretsUse::Create,
        SecretsUse::Delete,
        SecretsUse::ControllerPublish,
        SecretsUse::Validate,
        SecretsUse::ControllerExpand,
        SecretsUse::NodeStage,
        SecretsUse::NodePublish,
        SecretsUse::NodeExpand,
        SecretsUse::Snapshot,
    ];

    /// The section name in the text forms (`controller-publish`, `node-stage`, …).
    pub const fn name(self) -> &'static str {
        match self {
            SecretsUse::Create => "create",
            SecretsUse::Delete => "delete",
            SecretsUse::ControllerPublish => "controller-publish",
            SecretsUse::Validate => "validate",
            SecretsUse::ControllerExpand => "controller-expand",
            SecretsUse::NodeStage => "node-stage",
            SecretsUse::NodePublish => "node-publish",
            SecretsUse::NodeExpand => "node-expand",
            SecretsUse::Snapshot => "snapshot",
        }
    }

    /// The use named `name` (as [`name`](Self::name) spells it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.name() == name)
    }

    /// Which set `rpc` sends; `None` for calls without secrets and for the ones an
    /// orchestrator's volume secrets do not cover (`ControllerModifyVolume`, the health,
    /// group snapshot and snapshot metadata calls).
    ///
    /// ```
    /// use csi_proto::Rpc;
    /// use csi_structs::volume_secrets::SecretsUse;
    ///
    /// assert_eq!(SecretsUse::of(Rpc::ControllerUnpublishVolume), Some(SecretsUse::ControllerPublish));
    /// assert_eq!(SecretsUse::of(Rpc::NodeUnpublishVolume), None);
    /// ```
    pub const fn of(rpc: Rpc) -> Option<Self> {
        Some(match rpc {
            Rpc::CreateVolume => SecretsUse::Create,
            Rpc::DeleteVolume => SecretsUse::Delete,
            Rpc::ControllerPublishVolume | Rpc::ControllerUnpublishVolume => {
                SecretsUse::ControllerPublish
            }
            Rpc::ValidateVolumeCapabilities => SecretsUse::Validate,
            Rpc::ControllerExpandVolume => SecretsUse::ControllerExpand,
            Rpc::NodeStageVolume => SecretsUse::NodeStage,
            Rpc::NodePublishVolume => SecretsUse::NodePublish,
            Rpc::NodeExpandVolume => SecretsUse::NodeExpand,
            Rpc::CreateSnapshot | Rpc::DeleteSnapshot | Rpc::ListSnapshots | Rpc::GetSnapshot => {
                SecretsUse::Snapshot
            }
            _ => return None,
        })
    }
}

impl fmt::Display for SecretsUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A volume's secrets: entries sent with every call, and per [`SecretsUse`] entries laid over
/// them for that kind of call. `Debug` shows keys only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeSecrets {
    all: Secrets,
    by_use: BTreeMap<SecretsUse, Secrets>,
}

/// Why a secrets text was refused. Never holds a secret value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretsTextError {
    /// A line is not `KEY=VALUE`, `[section]`, a `#` comment or blank (its text is not shown:
    /// it may be a secret).
    #[error("line {line}: not KEY=VALUE, [section] or a # comment")]
    NotKeyValue {
        /// The line, from 1.
        line: usize,
    },
    /// A `[section]` (or a JSON object) names no [`SecretsUse`].
    #[error(
        "line {line}: unknown section [{section}]; the sections are {}",
        section_names()
    )]
    UnknownSection {
        /// The line, from 1 (0 in JSON, which has no lines here).
        line: usize,
        /// The name given.
        section: String,
    },
    /// A key appears twice in one section.
    #[error("line {line}: secret {key:?} appears twice in {}", .section.map_or("the common entries".to_owned(), |s| format!("[{s}]")))]
    Duplicate {
        /// The line, from 1.
        line: usize,
        /// The key.
        key: String,
        /// The section (`None`: the common entries).
        section: Option<SecretsUse>,
    },
    /// A common secret is named like a section, so the JSON form could not tell them apart.
    #[error("secret {key:?} is named like a section; rename it")]
    ReservedKey {
        /// The key.
        key: String,
    },
    /// A JSON value is neither a string nor (for a section) an object of strings.
    #[error("secret {key:?}: {expected}")]
    NotAString {
        /// The key.
        key: String,
        /// What was expected there.
        expected: &'static str,
    },
    /// There is no secret at all.
    #[error("no secrets: the text holds no KEY=VALUE entry")]
    Empty,
    /// A key breaks spec §3.6, or a set is over the 4 KiB map limit (keys named, values
    /// never shown).
    #[error(transparent)]
    Invalid(#[from] ValidationErrors),
}

fn section_names() -> String {
    SecretsUse::ALL
        .iter()
        .map(|u| u.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl VolumeSecrets {
    /// Secrets sent with every call.
    pub fn new(all: Secrets) -> Self {
        Self {
            all,
            by_use: BTreeMap::new(),
        }
    }

    /// These secrets with `secrets` laid over the common ones for `use_` (replacing any
    /// earlier set for it).
    #[must_use]
    pub fn with_use(mut self, use_: SecretsUse, secrets: Secrets) -> Self {
        self.by_use.insert(use_, secrets);
        self
    }

    /// The map a call of kind `use_` sends: the common entries with that use's entries on top.
    pub fn for_use(&self, use_: SecretsUse) -> Secrets {
        match self.by_use.get(&use_) {
            Some(own) => self.all.overlaid_with(own),
            None => self.all.clone(),
        }
    }

    /// The entries every call gets.
    pub fn common(&self) -> &Secrets {
        &self.all
    }

    /// The uses with entries of their own.
    pub fn uses(&self) -> impl Iterator<Item = SecretsUse> + '_ {
        self.by_use.keys().copied()
    }

    /// Whether no call gets any secret.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty() && self.by_use.values().all(Secrets::is_empty)
    }

    /// Every secret name, with its section (`None`: common). Safe to show.
    pub fn keys(&self) -> Vec<(Option<SecretsUse>, String)> {
        let common = self.all.keys().map(|k| (None, k.to_owned()));
        let own = self
            .by_use
            .iter()
            .flat_map(|(u, s)| s.keys().map(move |k| (Some(*u), k.to_owned())));
        common.chain(own).collect()
    }

    /// Builds from raw maps, checking every rule at once: key syntax (§3.6), no common key
    /// named like a section, and every call's map within the 4 KiB limit.
    ///
    /// # Errors
    ///
    /// [`SecretsTextError::ReservedKey`] or [`SecretsTextError::Invalid`].
    pub fn try_from_maps(
        all: BTreeMap<String, String>,
        by_use: BTreeMap<SecretsUse, BTreeMap<String, String>>,
    ) -> Result<Self, SecretsTextError> {
        if let Some(key) = all.keys().find(|k| SecretsUse::from_name(k).is_some()) {
            return Err(SecretsTextError::ReservedKey { key: key.clone() });
        }
        let mut errs = ValidationErrors::new();
        let common = Secrets::try_new_at(all, &FieldPath::named(Secrets::FIELD))
            .map_err(|e| errs.extend(e))
            .ok();
        let mut own = BTreeMap::new();
        for (use_, map) in by_use {
            let at = FieldPath::named(Secrets::FIELD).field(use_.name());
            if let Ok(s) = Secrets::try_new_at(map, &at).map_err(|e| errs.extend(e)) {
                own.insert(use_, s);
            }
        }
        if let Some(common) = &common {
            for (use_, s) in &own {
                let merged = common.overlaid_with(s).into_exposed();
                check_map(
                    &mut errs,
                    &FieldPath::named(Secrets::FIELD).field(use_.name()),
                    &merged,
                );
            }
        }
        errs.into_result(())?;
        Ok(Self {
            all: common.unwrap_or_default(),
            by_use: own,
        })
    }

    /// Reads the `KEY=VALUE` form: one entry per line, `[section]` lines (a [`SecretsUse`]
    /// name) starting the entries of one kind of call, blank lines and `#` comments skipped.
    /// Keys and values are trimmed of surrounding whitespace (use the JSON form for a value
    /// that needs it); a value may contain `=`.
    ///
    /// # Errors
    ///
    /// A [`SecretsTextError`] naming the line and the key, never a value.
    pub fn parse_key_values(text: &str) -> Result<Self, SecretsTextError> {
        let mut all = BTreeMap::new();
        let mut by_use: BTreeMap<SecretsUse, BTreeMap<String, String>> = BTreeMap::new();
        let mut section: Option<SecretsUse> = None;
        let mut entries = 0usize;
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if let Some(name) = trimmed
                .strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
            {
                let name = name.trim();
                section = Some(SecretsUse::from_name(name).ok_or_else(|| {
                    SecretsTextError::UnknownSection {
                        line,
                        section: name.to_owned(),
                    }
                })?);
                if let Some(use_) = section {
                    by_use.entry(use_).or_default();
                }
                continue;
            }
            let Some((key, value)) = trimmed.split_once('=') else {
                return Err(SecretsTextError::NotKeyValue { line });
            };
            let key = key.trim().to_owned();
            let target = match section {
                None => &mut all,
                Some(use_) => by_use.entry(use_).or_default(),
            };
            if target.contains_key(&key) {
                return Err(SecretsTextError::Duplicate { line, key, section });
            }
            target.insert(key, value.trim().to_owned());
            entries += 1;
        }
        if entries == 0 {
            return Err(SecretsTextError::Empty);
        }
        Self::try_from_maps(all, by_use)
    }
}

impl From<Secrets> for VolumeSecrets {
    fn from(all: Secrets) -> Self {
        Self::new(all)
    }
}

impl serde::Serialize for VolumeSecrets {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        for (k, v) in self.all.iter_exposed() {
            map.serialize_entry(k, v)?;
        }
        for (use_, s) in &self.by_use {
            let inner: BTreeMap<&str, &str> = s.iter_exposed().collect();
            map.serialize_entry(use_.name(), &inner)?;
        }
        map.end()
    }
}

/// One value of the JSON form: a secret (string) or a section (object of strings). Its
/// visitor never puts what it saw into an error (serde's own messages quote values).
enum Entry {
    Secret(String),
    Section(BTreeMap<String, String>),
}

struct EntryVisitor;

fn not_string<E: serde::de::Error>() -> E {
    E::custom("a secret must be a string, and a section an object of strings")
}

impl<'de> serde::de::Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, or an object of strings")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Entry, E> {
        Ok(Entry::Secret(v.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Entry, E> {
        Ok(Entry::Secret(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut access: A) -> Result<Entry, A::Error> {
        let mut map = BTreeMap::new();
        while let Some(key) = access.next_key::<String>()? {
            let value = access.next_value_seed(StringOnly)?;
            if map.insert(key.clone(), value).is_some() {
                return Err(serde::de::Error::custom(format!(
                    "secret {key:?} appears twice in one section"
                )));
            }
        }
        Ok(Entry::Section(map))
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Entry, E> {
        Err(not_string())
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Entry, E> {
        Err(not_string())
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Entry, E> {
        Err(not_string())
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Entry, E> {
        Err(not_string())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Entry, E> {
        Err(not_string())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<Entry, A::Error> {
        Err(not_string())
    }
}

impl<'de> serde::Deserialize<'de> for Entry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EntryVisitor)
    }
}

/// A string value inside a section; anything else is refused without quoting it.
struct StringOnly;

impl<'de> serde::de::DeserializeSeed<'de> for StringOnly {
    type Value = String;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        match d.deserialize_any(EntryVisitor)? {
            Entry::Secret(s) => Ok(s),
            Entry::Section(_) => Err(serde::de::Error::custom(
                "a section holds strings, not another section",
            )),
        }
    }
}

struct SecretsVisitor;

impl<'de> serde::de::Visitor<'de> for SecretsVisitor {
    type Value = VolumeSecrets;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of secrets and sections")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut access: A,
    ) -> Result<Self::Value, A::Error> {
        use serde::de::Error as _;
        let mut all = BTreeMap::new();
        let mut by_use = BTreeMap::new();
        while let Some(key) = access.next_key::<String>()? {
            match access.next_value::<Entry>()? {
                Entry::Secret(value) => {
                    if all.insert(key.clone(), value).is_some() {
                        return Err(A::Error::custom(format!("secret {key:?} appears twice")));
                    }
                }
                Entry::Section(map) => {
                    let Some(use_) = SecretsUse::from_name(&key) else {
                        return Err(A::Error::custom(SecretsTextError::UnknownSection {
                            line: 0,
                            section: key,
                        }));
                    };
                    if by_use.insert(use_, map).is_some() {
                        return Err(A::Error::custom(format!("section {key:?} appears twice")));
                    }
                }
            }
        }
        VolumeSecrets::try_from_maps(all, by_use).map_err(A::Error::custom)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(VolumeSecrets::default())
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(not_an_object())
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(not_an_object())
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(not_an_object())
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(not_an_object())
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(not_an_object())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(not_an_object())
    }
}

fn not_an_object<E: serde::de::Error>() -> E {
    E::custom("secrets must be an object of secrets and sections")
}

impl<'de> serde::Deserialize<'de> for VolumeSecrets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `deserialize_any`, not `deserialize_map`: a format's own "invalid type" error
        // quotes the value it found, and that value may be a secret.
        d.deserialize_any(SecretsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKER: &str = "s3cr3t-VALUE-marker";

    #[test]
    fn sections_lay_over_the_common_entries() {
        let s = VolumeSecrets::parse_key_values(&format!(
            "# comment\n user = a \npass={MARKER}=x\n\n[node-stage]\nkeyring=k\npass=p2\n[controller-publish]\nattach=t\n"
        ))
        .unwrap();
        assert_eq!(s.for_use(SecretsUse::Create).expose("user"), Some("a"));
        assert_eq!(
            s.for_use(SecretsUse::Create).expose("pass"),
            Some(format!("{MARKER}=x").as_str())
        );
        let stage = s.for_use(SecretsUse::NodeStage);
        assert_eq!(stage.expose("pass"), Some("p2"));
        assert_eq!(stage.expose("keyring"), Some("k"));
        assert!(!s.for_use(SecretsUse::NodePublish).contains_key("keyring"));
        assert!(
            s.for_use(SecretsUse::ControllerPublish)
                .contains_key("attach")
        );
        assert!(!format!("{s:?}").contains(MARKER));
        assert_eq!(s.keys().len(), 5);
    }

    #[test]
    fn key_value_errors_name_the_line_never_the_value() {
        let cases: [(&str, &str); 6] = [
            ("a=1\njust-a-secret-value\n", "line 2"),
            ("[node-mount]\na=1\n", "unknown section [node-mount]"),
            ("a=1\na=2\n", "line 2: secret \"a\" appears twice"),
            ("# nothing\n\n", "no secrets"),
            ("bad key=1\n", "secrets[\"bad key\"]"),
            ("node-stage=1\n", "named like a section"),
        ];
        for (text, expected) in cases {
            let err = VolumeSecrets::parse_key_values(text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
            assert!(!err.contains("just-a-secret-value"), "{err}");
        }
        let big = format!(
            "a={}\n[node-stage]\nb={}\n",
            "x".repeat(3000),
            "y".repeat(2000)
        );
        let err = VolumeSecrets::parse_key_values(&big)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("secrets.node-stage") && err.contains("4096"),
            "{err}"
        );
    }

    #[test]
    fn json_round_trip_and_errors_without_values() {
        let json = format!(r#"{{"user":"a","pass":"{MARKER}","node-stage":{{"keyring":"k"}}}}"#);
        let s: VolumeSecrets = serde_json::from_str(&json).unwrap();
        assert_eq!(
            s.for_use(SecretsUse::NodeStage).expose("keyring"),
            Some("k")
        );
        let back = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<VolumeSecrets>(&back).unwrap(), s);
        assert_eq!(
            serde_json::from_str::<VolumeSecrets>("{}").unwrap(),
            VolumeSecrets::default()
        );
        for bad in [
            r#"{"pass": 12345678}"#.to_owned(),
            format!(r#"{{"pass": ["{MARKER}"]}}"#),
            r#"{"node-stage": {"k": 12345678}}"#.to_owned(),
            format!(r#"{{"mount": {{"k": "{MARKER}"}}}}"#),
            format!(r#"{{"bad key": "{MARKER}"}}"#),
            format!(r#""{MARKER}""#),
        ] {
            let err = serde_json::from_str::<VolumeSecrets>(&bad)
                .unwrap_err()
                .to_string();
            assert!(!err.contains(MARKER) && !err.contains("12345678"), "{err}");
        }
    }

    #[test]
    fn every_rpc_with_volume_secrets_has_a_use() {
        for use_ in SecretsUse::ALL {
            assert_eq!(SecretsUse::from_name(use_.name()), Some(use_));
        }
        assert_eq!(
            SecretsUse::of(Rpc::NodeStageVolume),
            Some(SecretsUse::NodeStage)
        );
        assert_eq!(
            SecretsUse::of(Rpc::ListSnapshots),
            Some(SecretsUse::Snapshot)
        );
        assert_eq!(SecretsUse::of(Rpc::ListVolumes), None);
    }
}
