//! The opaque string maps of CSI: [`Parameters`], [`MutableParameters`], [`VolumeContext`]
//! and [`PublishContext`].
//!
//! Each is a sorted map limited to 4 KiB of keys plus values (spec §3.4). They are distinct
//! types because the spec gives them distinct rules: parameters are fixed at creation,
//! mutable parameters may change through `ControllerModifyVolume`, the volume context comes
//! from the plugin and must be passed back unchanged, the publish context comes from
//! `ControllerPublishVolume` and feeds the node calls. None of them is meant to hold
//! secrets, so their `Debug` shows values; secrets live in [`Secrets`](crate::Secrets).
//!
//! ```
//! use csi_structs::Parameters;
//!
//! let p = Parameters::try_from_iter([("type", "gp3"), ("iops", "3000")])?;
//! assert_eq!(p.get("type"), Some("gp3"));
//! assert!(Parameters::try_from_iter([("k", "v".repeat(5000))]).is_err());
//! # Ok::<(), csi_structs::ValidationErrors>(())
//! ```

use std::collections::{BTreeMap, HashMap};

use crate::limits::check_map;
use crate::validation::{FieldPath, ValidationErrors};

macro_rules! string_map {
    ($(#[$doc:meta])* $name:ident, field = $field:literal) => {
        $(#[$doc])*
        ///
        /// Deserializing checks the 4 KiB limit.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "BTreeMap<String, String>", into = "BTreeMap<String, String>")]
        pub struct $name(BTreeMap<String, String>);

        impl $name {
            /// The field name used in validation errors.
            pub const FIELD: &'static str = $field;

            /// The empty map.
            pub const fn new() -> Self {
                Self(BTreeMap::new())
            }

            /// Checks the size limit and wraps `map`.
            ///
            /// # Errors
            ///
            /// [`Problem::TooLong`](crate::Problem::TooLong) when keys plus values exceed
            /// 4 KiB.
            pub fn try_new(map: BTreeMap<String, String>) -> Result<Self, ValidationErrors> {
                Self::try_new_at(map, &FieldPath::named($field))
            }

            /// Like [`try_new`](Self::try_new), naming `field` in the error.
            ///
            /// # Errors
            ///
            /// As [`try_new`](Self::try_new).
            pub fn try_new_at(
                map: BTreeMap<String, String>,
                field: &FieldPath,
            ) -> Result<Self, ValidationErrors> {
                let mut errs = ValidationErrors::new();
                check_map(&mut errs, field, &map);
                errs.into_result(Self(map))
            }

            /// Checks the size limit of the pairs and collects them.
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
                Self::try_new(pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
            }

            /// The value for `key`.
            pub fn get(&self, key: &str) -> Option<&str> {
                self.0.get(key).map(String::as_str)
            }

            /// The entries, sorted by key.
            pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
                self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
            }

            /// How many entries there are.
            pub fn len(&self) -> usize {
                self.0.len()
            }

            /// Whether there are no entries.
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            /// The map.
            pub fn as_map(&self) -> &BTreeMap<String, String> {
                &self.0
            }

            /// The map, by value.
            pub fn into_inner(self) -> BTreeMap<String, String> {
                self.0
            }

            /// The map as the `HashMap` prost uses.
            pub fn to_wire(&self) -> HashMap<String, String> {
                self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
            }

            /// Checks and converts a wire map, naming `field` in the error.
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
        }

        impl TryFrom<BTreeMap<String, String>> for $name {
            type Error = ValidationErrors;
            fn try_from(map: BTreeMap<String, String>) -> Result<Self, Self::Error> {
                Self::try_new(map)
            }
        }

        impl From<$name> for BTreeMap<String, String> {
            fn from(map: $name) -> Self {
                map.0
            }
        }
    };
}

string_map!(
    /// Opaque creation parameters for the plugin (`parameters`). Fixed once the volume exists.
    Parameters, field = "parameters"
);
string_map!(
    /// Opaque parameters that `ControllerModifyVolume` may change later (`mutable_parameters`,
    /// needs the controller's `MODIFY_VOLUME`). They win over [`Parameters`] on key clashes.
    MutableParameters, field = "mutable_parameters"
);
string_map!(
    /// What the plugin said about a volume when it created it (`volume_context`): opaque,
    /// immutable, and passed unchanged to validation and publishing calls.
    VolumeContext, field = "volume_context"
);
string_map!(
    /// What `ControllerPublishVolume` returned for one node (`publish_context`): opaque, and
    /// passed unchanged to that node's stage and publish calls.
    PublishContext, field = "publish_context"
);
string_map!(
    /// Free-form facts a plugin reports about itself (`GetPluginInfoResponse.manifest`).
    Manifest, field = "manifest"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::{Problem, SizeUnit};

    #[test]
    fn limit_and_field_name() {
        let ok = VolumeContext::try_from_iter([("k", "v".repeat(4095))]);
        assert!(ok.is_ok());
        let err = PublishContext::try_from_iter([("k", "v".repeat(4096))]).unwrap_err();
        let v = &err.violations()[0];
        assert_eq!(v.field.to_string(), "publish_context");
        assert_eq!(
            v.problem,
            Problem::TooLong {
                size: 4097,
                limit: 4096,
                unit: SizeUnit::Bytes
            }
        );
    }

    #[test]
    fn serde_validates() {
        let p = MutableParameters::try_from_iter([("iops", "100")]).unwrap();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, r#"{"iops":"100"}"#);
        assert_eq!(serde_json::from_str::<MutableParameters>(&json).unwrap(), p);
        let big = format!(r#"{{"k":"{}"}}"#, "x".repeat(5000));
        assert!(serde_json::from_str::<Parameters>(&big).is_err());
    }

    #[test]
    fn wire_round_trip() {
        let p = Parameters::try_from_iter([("a", "1"), ("b", "2")]).unwrap();
        let back = Parameters::from_wire_at(p.to_wire(), &FieldPath::named("parameters")).unwrap();
        assert_eq!(back, p);
    }
}
