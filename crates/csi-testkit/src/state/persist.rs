//! The state file: the mock's storage state as JSON, so that volumes, snapshots, group
//! snapshots, publications and stagings survive a restart of the mock.
//!
//! A staging or node publication names its node only when it is not the mock's own
//! (configured) node, one it was served as with `MockPlugin::as_node`; without one it is the
//! own node's, so a file of a mock on one node reads as it always did.
//!
//! The file is written after every call that changed the state, atomically (a temporary file
//! beside it, flushed to disk, then renamed over it) and readable by its owner only (0600). A
//! file that cannot be read or understood is an error naming the file and what is wrong with
//! it, never a silent fresh start. Wire sub-messages (capabilities, content sources,
//! topology) are kept as their protobuf encoding in hex, so nothing of them is lost.
//!
//! The state holds no secrets: the mock never stores the `secrets` of a request.

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use serde::{Deserialize, Serialize};

use super::{GroupRec, PublicationRec, PublishedRec, SnapshotRec, StagedRec, State, VolumeRec};

/// The format this mock writes and reads.
pub const STATE_FILE_VERSION: u32 = 1;

/// A state file that could not be read, understood or written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    /// The file exists but could not be read.
    #[error("state file {path}: cannot read it: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        message: String,
    },
    /// The file is not the JSON this mock writes (damaged, truncated, or another file).
    #[error("state file {path} is damaged: {message} (line {line}, column {column})")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where the JSON stops making sense.
        line: usize,
        /// The column on that line.
        column: usize,
        /// What the parser expected.
        message: String,
    },
    /// The file was written by a mock with another format version.
    #[error("state file {path} has format version {found}; this mock reads version {supported}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this mock reads.
        supported: u32,
    },
    /// A field of the file holds something the mock cannot use.
    #[error("state file {path} is damaged: {field}: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Which field, e.g. `volumes[2].capabilities[0]`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The file (or its temporary sibling) could not be written.
    #[error("state file {path}: cannot write it: {message}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        message: String,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    version: u32,
    next_id: u64,
    next_snapshot_seq: u64,
    volumes: Vec<SavedVolume>,
    snapshots: Vec<SavedSnapshot>,
    groups: Vec<SavedGroup>,
    publications: Vec<SavedPublication>,
    staged: Vec<SavedStaged>,
    published: Vec<SavedPublished>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedVolume {
    id: String,
    name: Option<String>,
    capacity: i64,
    /// Each a hex-encoded `VolumeCapability`.
    capabilities: Vec<String>,
    parameters: BTreeMap<String, String>,
    mutable_parameters: BTreeMap<String, String>,
    context: BTreeMap<String, String>,
    /// A hex-encoded `VolumeContentSource`.
    content_source: Option<String>,
    /// A hex-encoded `TopologyRequirement`.
    requirements: Option<String>,
    /// Each a hex-encoded `Topology`.
    accessible_topology: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedSnapshot {
    id: String,
    name: Option<String>,
    source_volume_id: String,
    size: i64,
    created_unix_nanos: u128,
    seq: u64,
    group_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedGroup {
    id: String,
    name: String,
    source_volume_ids: Vec<String>,
    snapshot_ids: Vec<String>,
    parameters: BTreeMap<String, String>,
    created_unix_nanos: u128,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedPublication {
    volume_id: String,
    node_id: String,
    capability: String,
    readonly: bool,
    publish_context: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedStaged {
    /// The node, when not the mock's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    staging_path: String,
    volume_id: String,
    capability: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedPublished {
    /// The node, when not the mock's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    target_path: String,
    volume_id: String,
    capability: String,
    readonly: bool,
    staging_path: String,
    block: bool,
}

fn sorted(map: &HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn unsorted(map: BTreeMap<String, String>) -> HashMap<String, String> {
    map.into_iter().collect()
}

fn hex<M: Message>(message: &M) -> String {
    use std::fmt::Write as _;
    let bytes = message.encode_to_vec();
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

fn nanos(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// The node a record names in the file: none for the mock's own node.
fn other_node(node: &str, own_node: &str) -> Option<String> {
    (node != own_node).then(|| node.to_owned())
}

/// Encodes the state as the file's bytes; `own_node` is the mock's configured node id.
pub(crate) fn encode(state: &State, own_node: &str) -> Vec<u8> {
    let saved = Saved {
        version: STATE_FILE_VERSION,
        next_id: state.next_id,
        next_snapshot_seq: state.next_snapshot_seq,
        volumes: state
            .volumes
            .values()
            .map(|v| SavedVolume {
                id: v.id.clone(),
                name: v.name.clone(),
                capacity: v.capacity,
                capabilities: v.capabilities.iter().map(hex).collect(),
                parameters: sorted(&v.parameters),
                mutable_parameters: sorted(&v.mutable_parameters),
                context: sorted(&v.context),
                content_source: v.content_source.as_ref().map(hex),
                requirements: v.requirements.as_ref().map(hex),
                accessible_topology: v.accessible_topology.iter().map(hex).collect(),
            })
            .collect(),
        snapshots: state
            .snapshots
            .values()
            .map(|s| SavedSnapshot {
                id: s.id.clone(),
                name: s.name.clone(),
                source_volume_id: s.source_volume_id.clone(),
                size: s.size,
                created_unix_nanos: nanos(s.created),
                seq: s.seq,
                group_id: s.group_id.clone(),
            })
            .collect(),
        groups: state
            .groups
            .values()
            .map(|g| SavedGroup {
                id: g.id.clone(),
                name: g.name.clone(),
                source_volume_ids: g.source_volume_ids.clone(),
                snapshot_ids: g.snapshot_ids.clone(),
                parameters: sorted(&g.parameters),
                created_unix_nanos: nanos(g.created),
            })
            .collect(),
        publications: state
            .publications
            .iter()
            .map(|((volume_id, node_id), p)| SavedPublication {
                volume_id: volume_id.clone(),
                node_id: node_id.clone(),
                capability: hex(&p.capability),
                readonly: p.readonly,
                publish_context: sorted(&p.publish_context),
            })
            .collect(),
        staged: state
            .staged
            .iter()
            .map(|((node, path), s)| SavedStaged {
                node_id: other_node(node, own_node),
                staging_path: path.clone(),
                volume_id: s.volume_id.clone(),
                capability: hex(&s.capability),
            })
            .collect(),
        published: state
            .published
            .iter()
            .map(|((node, path), p)| SavedPublished {
                node_id: other_node(node, own_node),
                target_path: path.clone(),
                volume_id: p.volume_id.clone(),
                capability: hex(&p.capability),
                readonly: p.readonly,
                staging_path: p.staging_path.clone(),
                block: p.block,
            })
            .collect(),
    };
    // Plain structs of strings, numbers and maps with string keys always serialize.
    let mut bytes = serde_json::to_vec_pretty(&saved).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Reads the state file at `path`: `Ok(None)` when there is none yet. Records that name no
/// node are `own_node`'s.
pub(crate) fn load(path: &Path, own_node: &str) -> Result<Option<State>, StateFileError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(StateFileError::Read {
                path: path.to_owned(),
                message: err.to_string(),
            });
        }
    };
    decode(path, &bytes, own_node).map(Some)
}

/// Decodes the file's bytes; `path` only names the file in errors. Records that name no node
/// are `own_node`'s.
pub(crate) fn decode(path: &Path, bytes: &[u8], own_node: &str) -> Result<State, StateFileError> {
    let saved: Saved = serde_json::from_slice(bytes).map_err(|err| StateFileError::Parse {
        path: path.to_owned(),
        line: err.line(),
        column: err.column(),
        message: err.to_string(),
    })?;
    if saved.version != STATE_FILE_VERSION {
        return Err(StateFileError::Version {
            path: path.to_owned(),
            found: saved.version,
            supported: STATE_FILE_VERSION,
        });
    }
    Decoder { path, own_node }.state(saved)
}

struct Decoder<'p> {
    path: &'p Path,
    own_node: &'p str,
}

impl Decoder<'_> {
    fn invalid(&self, field: impl Into<String>, problem: impl Into<String>) -> StateFileError {
        StateFileError::Invalid {
            path: self.path.to_owned(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    fn message<M: Message + Default>(&self, field: &str, text: &str) -> Result<M, StateFileError> {
        if !text.len().is_multiple_of(2) {
            return Err(self.invalid(field, "odd number of hex digits"));
        }
        let bytes = (0..text.len())
            .step_by(2)
            .map(|i| {
                text.get(i..i + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| self.invalid(field, "not hex"))?;
        M::decode(bytes.as_slice())
            .map_err(|err| self.invalid(field, format!("not a protobuf message: {err}")))
    }

    fn time(&self, field: &str, nanos: u128) -> Result<SystemTime, StateFileError> {
        let secs = u64::try_from(nanos / 1_000_000_000)
            .map_err(|_| self.invalid(field, "time out of range"))?;
        let sub = u32::try_from(nanos % 1_000_000_000).unwrap_or_default();
        UNIX_EPOCH
            .checked_add(Duration::new(secs, sub))
            .ok_or_else(|| self.invalid(field, "time out of range"))
    }

    fn unique<K: Ord>(
        &self,
        field: String,
        seen: &mut std::collections::BTreeSet<K>,
        key: K,
    ) -> Result<(), StateFileError> {
        if seen.insert(key) {
            Ok(())
        } else {
            Err(self.invalid(field, "appears twice"))
        }
    }

    fn state(&self, saved: Saved) -> Result<State, StateFileError> {
        let mut state = State {
            next_id: saved.next_id,
            next_snapshot_seq: saved.next_snapshot_seq,
            ..State::default()
        };
        let mut ids = std::collections::BTreeSet::new();
        for (i, v) in saved.volumes.into_iter().enumerate() {
            let at = format!("volumes[{i}]");
            self.unique(format!("{at}.id {:?}", v.id), &mut ids, v.id.clone())?;
            let capabilities = v
                .capabilities
                .iter()
                .enumerate()
                .map(|(j, c)| self.message(&format!("{at}.capabilities[{j}]"), c))
                .collect::<Result<_, _>>()?;
            let accessible_topology = v
                .accessible_topology
                .iter()
                .enumerate()
                .map(|(j, t)| self.message(&format!("{at}.accessible_topology[{j}]"), t))
                .collect::<Result<_, _>>()?;
            let content_source = v
                .content_source
                .as_deref()
                .map(|c| self.message(&format!("{at}.content_source"), c))
                .transpose()?;
            let requirements = v
                .requirements
                .as_deref()
                .map(|r| self.message(&format!("{at}.requirements"), r))
                .transpose()?;
            if let Some(name) = &v.name
                && state
                    .volume_names
                    .insert(name.clone(), v.id.clone())
                    .is_some()
            {
                return Err(self.invalid(format!("{at}.name {name:?}"), "appears twice"));
            }
            state.volumes.insert(
                v.id.clone(),
                VolumeRec {
                    id: v.id,
                    name: v.name,
                    capacity: v.capacity,
                    capabilities,
                    parameters: unsorted(v.parameters),
                    mutable_parameters: unsorted(v.mutable_parameters),
                    context: unsorted(v.context),
                    content_source,
                    requirements,
                    accessible_topology,
                },
            );
        }
        for (i, s) in saved.snapshots.into_iter().enumerate() {
            let at = format!("snapshots[{i}]");
            self.unique(format!("{at}.id {:?}", s.id), &mut ids, s.id.clone())?;
            if let Some(name) = &s.name
                && state
                    .snapshot_names
                    .insert(name.clone(), s.id.clone())
                    .is_some()
            {
                return Err(self.invalid(format!("{at}.name {name:?}"), "appears twice"));
            }
            let created = self.time(&format!("{at}.created_unix_nanos"), s.created_unix_nanos)?;
            state.snapshots.insert(
                s.id.clone(),
                SnapshotRec {
                    id: s.id,
                    name: s.name,
                    source_volume_id: s.source_volume_id,
                    size: s.size,
                    created,
                    seq: s.seq,
                    group_id: s.group_id,
                },
            );
        }
        for (i, g) in saved.groups.into_iter().enumerate() {
            let at = format!("groups[{i}]");
            self.unique(format!("{at}.id {:?}", g.id), &mut ids, g.id.clone())?;
            if let Some(missing) = g
                .snapshot_ids
                .iter()
                .find(|id| !state.snapshots.contains_key(*id))
            {
                return Err(self.invalid(
                    format!("{at}.snapshot_ids"),
                    format!("snapshot {missing:?} is not in snapshots"),
                ));
            }
            if state
                .group_names
                .insert(g.name.clone(), g.id.clone())
                .is_some()
            {
                return Err(self.invalid(format!("{at}.name {:?}", g.name), "appears twice"));
            }
            let created = self.time(&format!("{at}.created_unix_nanos"), g.created_unix_nanos)?;
            state.groups.insert(
                g.id.clone(),
                GroupRec {
                    id: g.id,
                    name: g.name,
                    source_volume_ids: g.source_volume_ids,
                    snapshot_ids: g.snapshot_ids,
                    parameters: unsorted(g.parameters),
                    created,
                },
            );
        }
        for (i, p) in saved.publications.into_iter().enumerate() {
            let at = format!("publications[{i}]");
            let capability = self.message(&format!("{at}.capability"), &p.capability)?;
            let key = (p.volume_id, p.node_id);
            if state.publications.contains_key(&key) {
                return Err(self.invalid(at, "appears twice"));
            }
            state.publications.insert(
                key,
                PublicationRec {
                    capability,
                    readonly: p.readonly,
                    publish_context: unsorted(p.publish_context),
                },
            );
        }
        for (i, s) in saved.staged.into_iter().enumerate() {
            let at = format!("staged[{i}]");
            let capability = self.message(&format!("{at}.capability"), &s.capability)?;
            let key = (
                s.node_id.unwrap_or_else(|| self.own_node.to_owned()),
                s.staging_path,
            );
            if state.staged.contains_key(&key) {
                return Err(self.invalid(at, "appears twice"));
            }
            state.staged.insert(
                key,
                StagedRec {
                    volume_id: s.volume_id,
                    capability,
                },
            );
        }
        for (i, p) in saved.published.into_iter().enumerate() {
            let at = format!("published[{i}]");
            let capability = self.message(&format!("{at}.capability"), &p.capability)?;
            let key = (
                p.node_id.unwrap_or_else(|| self.own_node.to_owned()),
                p.target_path,
            );
            if state.published.contains_key(&key) {
                return Err(self.invalid(at, "appears twice"));
            }
            state.published.insert(
                key,
                PublishedRec {
                    volume_id: p.volume_id,
                    capability,
                    readonly: p.readonly,
                    staging_path: p.staging_path,
                    block: p.block,
                },
            );
        }
        Ok(state)
    }
}

/// Writes `bytes` to `path` atomically: a temporary file beside it (0600), flushed, renamed.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StateFileError> {
    let failed = |err: std::io::Error| StateFileError::Write {
        path: path.to_owned(),
        message: err.to_string(),
    };
    let file_name = path.file_name().ok_or_else(|| StateFileError::Write {
        path: path.to_owned(),
        message: "the path names no file".into(),
    })?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(file_name);
    temporary_name.push(".tmp");
    let temporary = path.with_file_name(temporary_name);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(failed)?;
    // `mode` applies only to a new file; a temporary left over from a crash keeps its own.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(failed)?;
    file.write_all(bytes).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(failed)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = std::fs::File::open(dir)
    {
        // Makes the rename itself durable; a failure here loses nothing already written.
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
    use csi_proto::v1::{Topology, VolumeCapability};

    fn capability() -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode {
                mode: access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..MountVolume::default()
            })),
        }
    }

    fn sample() -> State {
        let mut state = State::default();
        let id = state.new_id("vol");
        state.volumes.insert(
            id.clone(),
            VolumeRec {
                id: id.clone(),
                name: Some("data".into()),
                capacity: 1 << 30,
                capabilities: vec![capability()],
                parameters: HashMap::from([("tier".into(), "fast".into())]),
                mutable_parameters: HashMap::new(),
                context: HashMap::new(),
                content_source: None,
                requirements: None,
                accessible_topology: vec![Topology {
                    segments: HashMap::from([("zone".into(), "a".into())]),
                }],
            },
        );
        state.volume_names.insert("data".into(), id.clone());
        state.staged.insert(
            ("node-1".into(), "/staging/data".into()),
            StagedRec {
                volume_id: id.clone(),
                capability: capability(),
            },
        );
        // The same path on the other node the storage is served as.
        state.staged.insert(
            ("node-2".into(), "/staging/data".into()),
            StagedRec {
                volume_id: id,
                capability: capability(),
            },
        );
        state
    }

    #[test]
    fn a_state_survives_encode_and_decode() {
        let state = sample();
        let back = decode(Path::new("s.json"), &encode(&state, "node-1"), "node-1").unwrap();
        assert_eq!(encode(&back, "node-1"), encode(&state, "node-1"));
        assert_eq!(back.volumes["vol-1"].capabilities, vec![capability()]);
        assert_eq!(back.volume_names["data"], "vol-1");
        assert_eq!(back.next_id, state.next_id);
        assert_eq!(back.staged.len(), 2, "one staging per node");
    }

    #[test]
    fn records_of_the_own_node_name_no_node() {
        let text = String::from_utf8(encode(&sample(), "node-1")).unwrap();
        assert_eq!(text.matches("\"node_id\": \"node-2\"").count(), 1, "{text}");
        assert!(!text.contains("\"node_id\": \"node-1\""), "{text}");
        // Read by a mock configured as another node, the unnamed records are that node's.
        let back = decode(Path::new("s.json"), text.as_bytes(), "node-7").unwrap();
        let nodes: Vec<&str> = back.staged.keys().map(|(n, _)| n.as_str()).collect();
        assert_eq!(nodes, ["node-2", "node-7"]);
    }

    #[test]
    fn damage_is_named() {
        let path = Path::new("/run/mock/state.json");
        let err = decode(path, b"{\"version\": 1, \"next_id\": ", "node-1").unwrap_err();
        assert!(matches!(err, StateFileError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("/run/mock/state.json"), "{err}");

        let text = String::from_utf8(encode(&sample(), "node-1")).unwrap();
        let err = decode(
            path,
            text.replace("\"version\": 1", "\"version\": 9").as_bytes(),
            "node-1",
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                StateFileError::Version {
                    found: 9,
                    supported: 1,
                    ..
                }
            ),
            "{err}"
        );

        let capability = hex(&capability());
        let err = decode(path, text.replace(&capability, "zz").as_bytes(), "node-1").unwrap_err();
        assert!(
            err.to_string().contains("volumes[0].capabilities[0]"),
            "{err}"
        );
    }

    #[test]
    fn writes_are_private_and_leave_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }
}
