//! The volume manager's usage records: which volumes are staged on this node, at which path,
//! and which workloads have them published. This module is their JSON file's format
//! ([`UsageJson`](super::UsageJson)); the records in a node's database
//! ([`UsageDb`](super::UsageDb), where the reference agent and [`Node`](crate::Node) keep
//! them) are the same records, one per key, and a file of either format below is moved into
//! it once.
//!
//! One record per volume (per plugin) on this node, keyed `<plugin>/<volume>`: a volume is
//! staged once, at one path, and every publication of it (read or write, any workload) uses
//! that staging path (CSI spec, `NodeStageVolume`: `staging_target_path`).
//!
//! # Formats
//!
//! - **2** (written now): `{"version": 2, "volumes": {"<plugin>/<volume>": {...}}}`.
//! - **1** (no `version`): one record per volume *and usage* (`<plugin>/<volume>/<usage>`),
//!   each with its own staging path, so a read and a write publication of one volume were
//!   staged twice. Read by merging the records of each volume into one: the first keeps its
//!   staging path (still staged there, so publications keep using it until it is unstaged),
//!   every other staging still in place is kept in [`VolumeEntry::legacy_stagings`] and
//!   unstaged with it when the volume's last publication here is gone. The next write stores
//!   format 2.
//!
//! A record that cannot be read this way (ids that are not ids, a key that does not match its
//! record, two records of one volume that disagree about the plugin's volume id or both list
//! one workload, a format from a newer version) is a [`StateFileError::Record`] or
//! [`StateFileError::Version`] naming the file and the key; the volume manager does not open
//! on it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use csi_structs::{ExternalVolumeId, PluginId, PublishContext, VolumeId, WorkloadId};
use serde::{Deserialize, Serialize};

use crate::state::{StateFileError, load_json};

/// The format written.
pub const USAGE_FORMAT: u32 = 2;

/// Where a step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// The call succeeded.
    Done,
    /// The call's outcome is unknown (deadline, lost connection): it may have happened.
    Uncertain,
    /// The call is about to be made (recorded first, so a crash leaves a trace).
    Started,
}

impl StepState {
    /// `done`, `uncertain` or `started` (the words of the records' JSON).
    pub const fn as_str(self) -> &'static str {
        match self {
            StepState::Done => "done",
            StepState::Uncertain => "uncertain",
            StepState::Started => "started",
        }
    }
}

impl std::fmt::Display for StepState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One workload's publication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserEntry {
    /// The target path.
    pub target: PathBuf,
    /// How the publish call ended.
    pub publish: StepState,
}

/// A staging of the volume at a per-usage path, made by a version that wrote format 1; it is
/// unstaged together with the volume's staging.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyStaging {
    /// The staging path it was staged at.
    pub path: PathBuf,
    /// How its stage call ended.
    pub stage: StepState,
}

/// One volume (per plugin) on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeEntry {
    /// The plugin.
    pub plugin: PluginId,
    /// The orchestrator's volume id.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_id: ExternalVolumeId,
    /// The staging path, when the plugin stages: the one every publication of the volume uses.
    pub staging: Option<PathBuf>,
    /// How the stage call ended (`None`: no staging, or not staged).
    pub stage: Option<StepState>,
    /// Workloads using the volume here.
    pub users: BTreeMap<WorkloadId, UserEntry>,
    /// Further stagings of this volume from format 1 records, still to be unstaged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub legacy_stagings: Vec<LegacyStaging>,
    /// What `ControllerPublishVolume` returned for this node, given to every stage and
    /// publish of the volume here (absent when none was recorded, or it was empty; older
    /// files have none).
    #[serde(default, skip_serializing_if = "no_context")]
    pub publish_context: Option<PublishContext>,
}

fn no_context(context: &Option<PublishContext>) -> bool {
    context.as_ref().is_none_or(PublishContext::is_empty)
}

/// The key of a volume's record.
pub fn key(plugin: &PluginId, volume: &VolumeId) -> String {
    format!("{plugin}/{volume}")
}

/// The usage file as kept in memory and written.
#[derive(Debug, Serialize)]
pub struct UsageFile {
    /// Always [`USAGE_FORMAT`] when written.
    pub version: u32,
    /// Records by [`key`].
    pub volumes: BTreeMap<String, VolumeEntry>,
}

impl Default for UsageFile {
    fn default() -> Self {
        Self {
            version: USAGE_FORMAT,
            volumes: BTreeMap::new(),
        }
    }
}

/// The file as found: any format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredUsage {
    #[serde(default)]
    version: Option<u32>,
    #[serde(default)]
    volumes: BTreeMap<String, serde_json::Value>,
}

impl UsageFile {
    /// Reads `path` (absent: empty), migrating format 1. The flag says whether it was
    /// migrated, so the caller can write format 2 back.
    ///
    /// # Errors
    ///
    /// A [`StateFileError`] when the file cannot be read, is not JSON of either format, or
    /// holds a record that cannot be used (see the module docs).
    pub fn load(path: &Path) -> Result<(UsageFile, bool), StateFileError> {
        let Some(stored) = load_json::<StoredUsage>(path)? else {
            return Ok((UsageFile::default(), false));
        };
        let decode = |volumes: BTreeMap<String, serde_json::Value>| {
            volumes
                .into_iter()
                .map(|(k, value)| {
                    let entry = decode_record(path, &k, value)?;
                    Ok((k, entry))
                })
                .collect::<Result<BTreeMap<_, _>, StateFileError>>()
        };
        match stored.version {
            None | Some(1) => Ok((migrate_v1(path, decode(stored.volumes)?)?, true)),
            Some(USAGE_FORMAT) => {
                let volumes = decode(stored.volumes)?;
                for (k, entry) in &volumes {
                    check_record(path, k, entry)?;
                }
                Ok((
                    UsageFile {
                        version: USAGE_FORMAT,
                        volumes,
                    },
                    false,
                ))
            }
            Some(found) => Err(StateFileError::Version {
                path: path.to_owned(),
                found,
                supported: "1 and 2",
            }),
        }
    }
}

/// Decodes the record stored under `k` in `path`; its ids are checked as ids on the way
/// (empty or too long, the error names which).
///
/// # Errors
///
/// [`StateFileError::Record`] naming `path` and `k`.
pub(crate) fn decode_record(
    path: &Path,
    k: &str,
    value: serde_json::Value,
) -> Result<VolumeEntry, StateFileError> {
    serde_json::from_value(value).map_err(|e| record(path, k, e.to_string()))
}

/// Checks a format-2 record read from `path`: it is under its own key.
///
/// # Errors
///
/// [`StateFileError::Record`] naming `path` and `k`.
pub(crate) fn check_record(
    path: &Path,
    k: &str,
    entry: &VolumeEntry,
) -> Result<(), StateFileError> {
    let want = key(&entry.plugin, &entry.volume);
    if k != want {
        return Err(record(path, k, format!("the key is not `{want}`")));
    }
    Ok(())
}

fn record(path: &Path, key: &str, reason: String) -> StateFileError {
    StateFileError::Record {
        path: path.to_owned(),
        key: key.to_owned(),
        reason,
    }
}

/// Format 1 → 2: one record per volume (see the module docs).
fn migrate_v1(
    path: &Path,
    old: BTreeMap<String, VolumeEntry>,
) -> Result<UsageFile, StateFileError> {
    let mut volumes: BTreeMap<String, VolumeEntry> = BTreeMap::new();
    for (k, entry) in old {
        let (plugin, volume) = (entry.plugin.clone(), entry.volume.clone());
        let new_key = key(&plugin, &volume);
        let usage = k.strip_prefix(&new_key).and_then(|r| r.strip_prefix('/'));
        if usage.is_none_or(|u| u.is_empty() || u.contains('/')) {
            return Err(record(
                path,
                &k,
                format!("a format 1 key is `{new_key}/<usage>`"),
            ));
        }
        let Some(merged) = volumes.get_mut(&new_key) else {
            volumes.insert(new_key, entry);
            continue;
        };
        if merged.external_id != entry.external_id {
            return Err(record(
                path,
                &k,
                format!(
                    "volume {volume} has plugin volume id {:?} here and {:?} in another record",
                    entry.external_id, merged.external_id
                ),
            ));
        }
        for (workload, user) in entry.users {
            if merged.users.contains_key(&workload) {
                return Err(record(
                    path,
                    &k,
                    format!("workload {workload} uses volume {volume} in two records"),
                ));
            }
            merged.users.insert(workload, user);
        }
        // A staging known to be done becomes the volume's one staging path, whichever record
        // it came from: a new publication reuses it instead of staging a path that never was.
        let other = if merged.stage != Some(StepState::Done) && entry.stage == Some(StepState::Done)
        {
            let kept = (merged.staging.take(), merged.stage.take());
            merged.staging = entry.staging;
            merged.stage = entry.stage;
            kept
        } else {
            (entry.staging, entry.stage)
        };
        if let (Some(staging), Some(stage)) = other {
            merged.legacy_stagings.push(LegacyStaging {
                path: staging,
                stage,
            });
        }
        merged.legacy_stagings.extend(entry.legacy_stagings);
    }
    Ok(UsageFile {
        version: USAGE_FORMAT,
        volumes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("usage.json");
        std::fs::write(&p, text).expect("write");
        p
    }

    /// A format 1 file as the previous version wrote it: one volume published read-only for
    /// `reader` and read-write for `writer`, staged at two paths.
    const V1: &str = r#"{
      "volumes": {
        "mock/db/ro-mount-single-node-multi-writer": {
          "plugin": "mock", "volume": "db", "external_id": "ext-db",
          "staging": "/d/node/staging/db/ro-mount-single-node-multi-writer",
          "stage": "done",
          "users": {"reader": {"target": "/d/node/per-workload/reader/db/ro-mount-single-node-multi-writer", "publish": "done"}}
        },
        "mock/db/rw-mount-single-node-multi-writer": {
          "plugin": "mock", "volume": "db", "external_id": "ext-db",
          "staging": "/d/node/staging/db/rw-mount-single-node-multi-writer",
          "stage": "uncertain",
          "users": {"writer": {"target": "/d/node/per-workload/writer/db/rw-mount-single-node-multi-writer", "publish": "done"}}
        },
        "mock/logs/rw-mount-single-node-writer": {
          "plugin": "mock", "volume": "logs", "external_id": "ext-logs",
          "staging": null, "stage": null, "users": {}
        }
      }
    }"#;

    #[test]
    fn format_1_merges_into_one_record_per_volume() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (file, migrated) = UsageFile::load(&write(dir.path(), V1)).expect("migrates");
        assert!(migrated);
        assert_eq!(
            file.volumes.keys().collect::<Vec<_>>(),
            ["mock/db", "mock/logs"]
        );
        let db = &file.volumes["mock/db"];
        assert_eq!(
            db.users.keys().collect::<Vec<_>>(),
            ["reader", "writer"],
            "both publications are kept"
        );
        assert_eq!(
            db.staging.as_deref(),
            Some(Path::new(
                "/d/node/staging/db/ro-mount-single-node-multi-writer"
            )),
            "the first staging stays the volume's staging path"
        );
        assert_eq!(
            db.legacy_stagings,
            [LegacyStaging {
                path: "/d/node/staging/db/rw-mount-single-node-multi-writer".into(),
                stage: StepState::Uncertain,
            }],
            "the second staging is kept, to be unstaged later"
        );
        // Written back, it is format 2 and loads as such.
        let text = serde_json::to_string(&file).expect("serializes");
        let (again, migrated) = UsageFile::load(&write(dir.path(), &text)).expect("loads");
        assert!(!migrated);
        assert_eq!(again.volumes, file.volumes);
    }

    #[test]
    fn the_staging_that_was_done_stays_the_volume_s_whatever_its_key() {
        // The reader's record sorts first but its staging never finished; the writer's did.
        let text = V1
            .replace(r#""stage": "done""#, r#""stage": "started""#)
            .replace(r#""stage": "uncertain""#, r#""stage": "done""#);
        let dir = tempfile::tempdir().expect("temp dir");
        let (file, _) = UsageFile::load(&write(dir.path(), &text)).expect("migrates");
        let db = &file.volumes["mock/db"];
        assert_eq!(
            db.staging.as_deref(),
            Some(Path::new(
                "/d/node/staging/db/rw-mount-single-node-multi-writer"
            ))
        );
        assert_eq!(db.stage, Some(StepState::Done));
        assert_eq!(
            db.legacy_stagings,
            [LegacyStaging {
                path: "/d/node/staging/db/ro-mount-single-node-multi-writer".into(),
                stage: StepState::Started,
            }]
        );
    }

    #[test]
    fn unusable_records_are_errors_naming_the_key() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cases = [
            // The same workload in two records of one volume.
            (
                r#"{"volumes": {
                  "p/v/ro-x": {"plugin": "p", "volume": "v", "external_id": "e", "staging": null, "stage": null,
                               "users": {"w": {"target": "/a", "publish": "done"}}},
                  "p/v/rw-x": {"plugin": "p", "volume": "v", "external_id": "e", "staging": null, "stage": null,
                               "users": {"w": {"target": "/b", "publish": "done"}}}}}"#,
                "p/v/rw-x",
            ),
            // Two plugin volume ids for one volume.
            (
                r#"{"volumes": {
                  "p/v/ro-x": {"plugin": "p", "volume": "v", "external_id": "e1", "staging": null, "stage": null, "users": {}},
                  "p/v/rw-x": {"plugin": "p", "volume": "v", "external_id": "e2", "staging": null, "stage": null, "users": {}}}}"#,
                "p/v/rw-x",
            ),
            // A key that is not its record's.
            (
                r#"{"volumes": {"q/v/rw-x": {"plugin": "p", "volume": "v", "external_id": "e", "staging": null, "stage": null, "users": {}}}}"#,
                "q/v/rw-x",
            ),
            (
                r#"{"version": 2, "volumes": {"p/v/rw-x": {"plugin": "p", "volume": "v", "external_id": "e", "staging": null, "stage": null, "users": {}}}}"#,
                "p/v/rw-x",
            ),
            // Ids that are not ids: each is refused naming the id's field.
            (
                r#"{"version": 2, "volumes": {"p/": {"plugin": "p", "volume": "", "external_id": "e", "staging": null, "stage": null, "users": {}}}}"#,
                "p/",
            ),
            (
                r#"{"version": 2, "volumes": {"p/v": {"plugin": "p", "volume": "v", "external_id": "", "staging": null, "stage": null, "users": {}}}}"#,
                "p/v",
            ),
            (
                r#"{"version": 2, "volumes": {"p/v": {"plugin": "p", "volume": "v", "external_id": "e", "staging": null, "stage": null,
                    "users": {"": {"target": "/a", "publish": "done"}}}}}"#,
                "p/v",
            ),
            // A record of the wrong shape.
            (r#"{"volumes": {"p/v/x": {"plugin": 1}}}"#, "p/v/x"),
        ];
        for (text, want) in cases {
            match UsageFile::load(&write(dir.path(), text)) {
                Err(StateFileError::Record { key, .. }) => assert_eq!(key, want, "{text}"),
                other => panic!("expected a record error for {want}, got {other:?}"),
            }
        }
        let named = [
            (
                "volume_id",
                r#"{"plugin": "p", "volume": "", "external_id": "e", "staging": null, "stage": null, "users": {}}"#,
            ),
            (
                "external_volume_id",
                r#"{"plugin": "p", "volume": "v", "external_id": "", "staging": null, "stage": null, "users": {}}"#,
            ),
            (
                "workload_id",
                r#"{"plugin": "p", "volume": "v", "external_id": "e", "staging": null, "stage": null, "users": {"": {"target": "/a", "publish": "done"}}}"#,
            ),
        ];
        for (field, record) in named {
            let text = format!(r#"{{"version": 2, "volumes": {{"p/v": {record}}}}}"#);
            match UsageFile::load(&write(dir.path(), &text)) {
                Err(e @ StateFileError::Record { .. }) => {
                    assert!(e.to_string().contains(field), "{field}: {e}")
                }
                other => panic!("expected a record error naming {field}, got {other:?}"),
            }
        }
        let newer = write(dir.path(), r#"{"version": 3, "volumes": {}}"#);
        assert!(matches!(
            UsageFile::load(&newer),
            Err(StateFileError::Version { found: 3, .. })
        ));
        let damaged = write(dir.path(), r#"{"volumes": {"p/v/x": "#);
        assert!(matches!(
            UsageFile::load(&damaged),
            Err(StateFileError::Damaged { .. })
        ));
    }
}
