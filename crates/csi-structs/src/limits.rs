//! The spec's size limits (csi-spec §3.4) and the checks that apply them.
//!
//! | item | limit |
//! |---|---|
//! | any string field, id, name, token | [`MAX_STRING_BYTES`] (128 bytes) |
//! | any `map<string,string>`, counted as the sum of key and value bytes | [`MAX_MAP_BYTES`] (4 KiB) |
//! | `mount_flags`, all flags together | [`MAX_MOUNT_FLAGS_BYTES`] (4 KiB) |
//! | the plugin's node id (`NodeGetInfoResponse.node_id`) | [`MAX_PLUGIN_NODE_ID_BYTES`] (256 bytes) |
//! | plugin name, topology key prefix, key name, segment value | [`MAX_NAME_CHARS`] (63 characters) |
//! | path fields (`target_path`, `staging_target_path`, `volume_path`, …) | exempt |
//!
//! The spec does not say how a map's size is counted; like most implementations we count the
//! UTF-8 bytes of every key plus every value.

use std::collections::BTreeMap;

use crate::validation::{FieldPath, Problem, SizeUnit, ValidationErrors};

/// The limit for any string field, id, name or token: 128 bytes.
pub const MAX_STRING_BYTES: usize = 128;

/// The limit for any `map<string,string>` field: 4 KiB of keys plus values.
pub const MAX_MAP_BYTES: usize = 4096;

/// The limit for all of a `MountVolume.mount_flags` together: 4 KiB.
pub const MAX_MOUNT_FLAGS_BYTES: usize = 4096;

/// The limit for the node id a plugin returns from `NodeGetInfo`: 256 bytes.
pub const MAX_PLUGIN_NODE_ID_BYTES: usize = 256;

/// The limit for a plugin name and for each topology key prefix, key name and value:
/// 63 characters.
pub const MAX_NAME_CHARS: usize = 63;

/// The size of a map as this crate counts it: the UTF-8 bytes of every key and value.
pub fn map_size<'a>(entries: impl IntoIterator<Item = (&'a String, &'a String)>) -> usize {
    entries.into_iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// Records a violation when `value` is longer than `limit` bytes.
pub(crate) fn check_len(errs: &mut ValidationErrors, field: &FieldPath, value: &str, limit: usize) {
    if value.len() > limit {
        errs.push(
            field.clone(),
            Problem::TooLong {
                size: value.len(),
                limit,
                unit: SizeUnit::Bytes,
            },
        );
    }
}

/// Records a violation when `value` is empty or longer than `limit` bytes.
pub(crate) fn check_required(
    errs: &mut ValidationErrors,
    field: &FieldPath,
    value: &str,
    limit: usize,
) {
    if value.is_empty() {
        errs.push(field.clone(), Problem::Missing);
    } else {
        check_len(errs, field, value, limit);
    }
}

/// Records a violation when a map is over [`MAX_MAP_BYTES`].
pub(crate) fn check_map(
    errs: &mut ValidationErrors,
    field: &FieldPath,
    map: &BTreeMap<String, String>,
) {
    let size = map_size(map);
    if size > MAX_MAP_BYTES {
        errs.push(
            field.clone(),
            Problem::TooLong {
                size,
                limit: MAX_MAP_BYTES,
                unit: SizeUnit::Bytes,
            },
        );
    }
}

/// Whether the spec bans `c` in a CO-generated `name` (CreateVolume, CreateSnapshot,
/// CreateVolumeGroupSnapshot): U+0000–U+0008, U+000B, U+000C, U+000E–U+001F, U+007F–U+009F.
pub const fn is_banned_in_name(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// Checks a CO-generated `name` (the idempotency key of CreateVolume, CreateSnapshot,
/// CreateVolumeGroupSnapshot): non-empty, at most 128 bytes, none of the banned control
/// characters.
///
/// # Errors
///
/// Every problem at once, under `field`.
pub fn validate_request_name(field: &FieldPath, value: &str) -> Result<(), ValidationErrors> {
    let mut errs = ValidationErrors::new();
    check_required(&mut errs, field, value, MAX_STRING_BYTES);
    check_name_chars(&mut errs, field, value);
    errs.into_result(())
}

/// Records the first banned control character of `value`, if any.
pub(crate) fn check_name_chars(errs: &mut ValidationErrors, field: &FieldPath, value: &str) {
    if let Some((position, character)) = value
        .chars()
        .enumerate()
        .find(|(_, c)| is_banned_in_name(*c))
    {
        errs.push(
            field.clone(),
            Problem::InvalidCharacter {
                character,
                position,
                syntax: crate::validation::Syntax::Name,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_names_table() {
        let f = FieldPath::named("name");
        for ok in ["pvc-1", "名前", "tab\tok", "line\nfeed ok", "cr\rok"] {
            assert!(validate_request_name(&f, ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "",
            "nul\0",
            "bell\u{7}",
            "esc\u{1b}",
            "del\u{7f}",
            "c1\u{85}",
        ] {
            assert!(validate_request_name(&f, bad).is_err(), "{bad:?}");
        }
        assert!(validate_request_name(&f, &"a".repeat(129)).is_err());
    }

    use super::*;

    #[test]
    fn map_size_counts_keys_and_values() {
        let m = BTreeMap::from([
            ("ab".to_string(), "cde".to_string()),
            ("é".into(), "".into()),
        ]);
        assert_eq!(map_size(&m), 2 + 3 + 2);
    }

    #[test]
    fn limits_table() {
        let f = FieldPath::named("x");
        // (value length, limit, required, expected problem)
        let cases: &[(usize, usize, bool, Option<Problem>)] = &[
            (0, 128, false, None),
            (0, 128, true, Some(Problem::Missing)),
            (128, 128, true, None),
            (
                129,
                128,
                true,
                Some(Problem::TooLong {
                    size: 129,
                    limit: 128,
                    unit: SizeUnit::Bytes,
                }),
            ),
            (256, 256, true, None),
        ];
        for (len, limit, required, expected) in cases {
            let mut errs = ValidationErrors::new();
            let value = "a".repeat(*len);
            if *required {
                check_required(&mut errs, &f, &value, *limit);
            } else {
                check_len(&mut errs, &f, &value, *limit);
            }
            let got = errs.violations().first().map(|v| v.problem.clone());
            assert_eq!(
                &got, expected,
                "len {len} limit {limit} required {required}"
            );
        }
    }

    #[test]
    fn map_limit_is_inclusive() {
        let f = FieldPath::named("parameters");
        let mut m = BTreeMap::from([("k".to_string(), "v".repeat(MAX_MAP_BYTES - 1))]);
        let mut errs = ValidationErrors::new();
        check_map(&mut errs, &f, &m);
        assert!(errs.is_empty());
        m.insert("k2".into(), String::new());
        check_map(&mut errs, &f, &m);
        assert_eq!(
            errs.violations()[0].problem,
            Problem::TooLong {
                size: MAX_MAP_BYTES + 2,
                limit: MAX_MAP_BYTES,
                unit: SizeUnit::Bytes
            }
        );
    }
}
