//! The control API between `csi-agent serve` and the operator commands: HTTP/1.1 with JSON
//! bodies on a loopback address, every `/v1/` call carrying the bearer token the agent wrote
//! to `<data_dir>/control.token` (mode 0600).
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `GET /v1/status` | | [`StatusView`] |
//! | `GET /v1/plugins` | | `Vec<`[`PluginView`]`>` |
//! | `GET /v1/plugins/{id}` | | [`PluginView`] |
//! | `GET /v1/volumes` | | `Vec<`[`VolumeView`]`>` |
//! | `GET /v1/volumes/{id}` | | [`VolumeView`] |
//! | `POST /v1/volumes` | [`RegisterVolume`] | [`VolumeView`] |
//! | `POST /v1/volumes/create` | [`CreateVolume`] | [`VolumeView`] |
//! | `POST /v1/volumes/{id}/claim` | [`ClaimVolume`] | [`ClaimView`] |
//! | `POST /v1/volumes/{id}/release` | [`ReleaseVolume`] | [`VolumeView`] |
//! | `POST /v1/volumes/{id}/expand` | [`ExpandVolume`] | [`ExpandView`] |
//! | `POST /v1/volumes/{id}/detach` | [`DetachVolume`] | [`DetachView`] |
//! | `POST /v1/volumes/{id}/deregister` | [`DeregisterVolume`] | [`DeregisterView`] |
//! | `DELETE /v1/volumes/{id}` | | [`VolumeView`] (as it was) |
//! | `GET /v1/plugins/{id}/volumes` | | `Vec<`[`ExternalVolumeView`]`>` (the plugin's `ListVolumes`) |
//! | `POST /v1/volumes/{id}/snapshots` | [`CreateSnapshot`] | [`SnapshotView`] |
//! | `GET /v1/volumes/{id}/snapshots` | | `Vec<`[`SnapshotView`]`>` |
//! | `GET /v1/plugins/{id}/snapshots` | | `Vec<`[`SnapshotView`]`>` |
//! | `DELETE /v1/volumes/{id}/snapshots/{snapshot}` | | [`SnapshotDeleted`] |
//! | `DELETE /v1/plugins/{id}/snapshots/{snapshot}` | | [`SnapshotDeleted`] |
//! | `GET /peer/v1/plugins` | | [`PeerPlugins`] (for other agents; cluster token) |
//! | `GET /metrics` | | Prometheus text (no token) |
//!
//! Errors answer a non-2xx status with an [`ApiError`]. A body that is not the JSON object
//! asked for is refused with 400 `bad_request` naming the field at fault: a value of the
//! wrong type, a missing field, or a field the request does not have (a misspelt name is
//! refused, never ignored). Secrets go one way only: in, with
//! [`RegisterVolume`] and [`CreateVolume`]; no answer, error or log line carries a value.

use std::collections::BTreeMap;

use csi_structs::VolumeSecrets;
use serde::{Deserialize, Serialize};

/// Percent-encodes an id for one path segment: every byte but `A-Z a-z 0-9 - . _ ~`.
pub fn encode_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes a path segment made by [`encode_segment`]; `None` when an escape is broken or the
/// result is not UTF-8.
pub fn decode_segment(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Written by `serve` to `<data_dir>/agent.json` so the operator commands can find it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentInfo {
    /// The agent's node id.
    pub node: String,
    /// The control API address (`IP:PORT`).
    pub http: String,
    /// The shim address, if it serves one.
    pub shim: Option<String>,
    /// The agent's process id.
    pub pid: u32,
}

/// The longest [`ApiError::error`] the agent sends, in bytes: a longer message (one quoting a
/// long path or id, say) is cut and says how long it was.
pub const MAX_ERROR_BYTES: usize = 2048;

/// An error answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ApiError {
    /// A short machine-readable kind (`not_found`, `bad_request`, `conflict`, …). A failed
    /// plugin call says who said what: `plugin` (the plugin answered an error status),
    /// `plugin_answer` (its answer was unusable), `deadline` (a deadline of ours passed),
    /// `plugin_unreachable`, `plugin_unhealthy` (nothing is published through a plugin not
    /// known to be healthy), `invalid_request` or `agent`. The agent's own failures are
    /// `store` (the claim store) and `local_io` (a file under its data directory).
    pub kind: String,
    /// What went wrong, for people; at most [`MAX_ERROR_BYTES`].
    pub error: String,
    /// The error class when a plugin call failed (`retry`, `fatal`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// One plugin as the agent sees it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PluginView {
    /// The plugin id (the socket's file name without `.sock`).
    pub id: String,
    /// The node hosting it.
    pub node: String,
    /// The socket path (local plugins only).
    pub socket: Option<String>,
    /// `healthy`, `not_ready`, `unhealthy` or `unknown` (not probed yet).
    pub health: String,
    /// Why it is not healthy, if it is not.
    pub health_reason: Option<String>,
    /// The plugin's name from `GetPluginInfo`.
    pub name: Option<String>,
    /// The plugin's version.
    pub version: Option<String>,
    /// Whether it serves the Controller service.
    pub controller: bool,
    /// Whether it serves the Node service here.
    pub node_service: bool,
    /// The plugin's id for this node (`NodeGetInfo`).
    pub plugin_node: Option<String>,
    /// Whether releases need `ControllerUnpublishVolume` (`PUBLISH_UNPUBLISH_VOLUME`).
    pub controller_publish: bool,
    /// Whether the node service stages volumes (`STAGE_UNSTAGE_VOLUME`).
    pub staging: bool,
    /// How many times the plugin was fingerprinted successfully (once per socket it served on).
    pub fingerprints: u64,
    /// The last fingerprint error, if the last attempt failed.
    pub last_error: Option<String>,
    /// Publications on this node through this plugin (local plugins): while not zero, the
    /// plugin must keep running, or their releases wait for it.
    #[serde(default)]
    pub in_use: u64,
    /// What it advertises, `service:NAME` ([`Capabilities::advertised`]): e.g.
    /// `expansion:OFFLINE` says volumes are expanded only while unpublished. Empty before the
    /// first fingerprint, and from peers that do not report it.
    ///
    /// [`Capabilities::advertised`]: csi_structs::Capabilities::advertised
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// How many volumes it may publish on its node (`NodeGetInfo`; none: no limit or not
    /// known).
    #[serde(default)]
    pub max_volumes: Option<u64>,
    /// Where its node sits for it (`NodeGetInfo`'s topology segments; local plugins).
    #[serde(default)]
    pub topology: Option<BTreeMap<String, String>>,
}

/// Register an existing volume.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RegisterVolume {
    /// The orchestrator's volume id.
    pub id: String,
    /// The plugin's volume id.
    pub external_id: String,
    /// The plugin id.
    pub plugin: String,
    /// Access mode, e.g. `single-node-writer` or `SINGLE_NODE_WRITER`.
    pub access_mode: String,
    /// `mount` or `block`.
    pub attachment: String,
    /// Whether releases need a controller unpublish; `None`: from the plugin's fingerprint.
    pub controller_publish: Option<bool>,
    /// The volume context to pass to node calls.
    #[serde(default)]
    pub context: BTreeMap<String, String>,
    /// The volume's secrets (common entries and per-call sections), kept by the agent for
    /// every call about the volume. Never shown in an answer.
    #[serde(default, skip_serializing_if = "VolumeSecrets::is_empty")]
    pub secrets: VolumeSecrets,
    /// Where the volume is reachable, each a map of topology segments (empty: from
    /// everywhere); a claim on a node outside all of them is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accessible_topology: Vec<BTreeMap<String, String>>,
}

/// Create a volume through a controller of the plugin, then register it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// The orchestrator's volume id (also the name sent to the plugin).
    pub id: String,
    /// The plugin id.
    pub plugin: String,
    /// Required capacity in bytes (0: the plugin chooses).
    pub capacity_bytes: i64,
    /// Access mode.
    pub access_mode: String,
    /// `mount` or `block`.
    pub attachment: String,
    /// Plugin parameters.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// The volume's secrets, as for [`RegisterVolume::secrets`]; `CreateVolume` sends their
    /// `create` set.
    #[serde(default, skip_serializing_if = "VolumeSecrets::is_empty")]
    pub secrets: VolumeSecrets,
    /// Topologies the volume must be reachable from (`accessibility_requirements.requisite`),
    /// each a map of segments. Only for a plugin with `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requisite_topology: Vec<BTreeMap<String, String>>,
    /// Topologies to try first (`accessibility_requirements.preferred`), in order; each one
    /// of the requisite ones when those are given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_topology: Vec<BTreeMap<String, String>>,
    /// Make it from this snapshot of the plugin (absent: not from a snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Make it a copy of this registered volume (absent: not a clone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<String>,
}

/// Grow a volume (`POST /v1/volumes/{id}/expand`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExpandVolume {
    /// The capacity wanted, in bytes (not below the current one).
    pub capacity_bytes: i64,
}

/// What an expansion did.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExpandView {
    /// The volume, with its new capacity.
    pub volume: VolumeView,
    /// Whether `ControllerExpandVolume` ran (the plugin has controller `EXPAND_VOLUME`).
    pub controller_expanded: bool,
    /// The nodes where `NodeExpandVolume` ran.
    pub nodes_expanded: Vec<String>,
    /// Whether `NodeExpandVolume` is still to run: at the volume's next claim, because it is
    /// published nowhere now.
    pub node_expansion_pending: bool,
}

/// Release every claim of a volume on one node (`POST /v1/volumes/{id}/detach`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DetachVolume {
    /// The orchestrator node whose claims are released.
    pub node: String,
    /// The node is gone for good: its node steps are skipped and the controller step runs
    /// without it (every claim made from it, on every volume, is released).
    #[serde(default)]
    pub node_gone: bool,
}

/// What a detach started.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DetachView {
    /// The volume, its claims in their release states.
    pub volume: VolumeView,
    /// The workloads whose claims on the node are being released.
    pub releasing: Vec<String>,
    /// Whether the node was reported gone for good.
    pub node_gone: bool,
    /// A hint, when the release may not get far on its own (the node's agent is not reachable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Drop a volume from the agent (`POST /v1/volumes/{id}/deregister`); the plugin is not
/// called.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DeregisterVolume {
    /// Drop it even with claims, which are forgotten, not released.
    #[serde(default)]
    pub force: bool,
    /// With `force`: the operator confirms it (without it the answer is an error listing what
    /// would be left behind).
    #[serde(default)]
    pub confirmed: bool,
}

/// What a deregistration dropped and left.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeregisterView {
    /// The volume as it was.
    pub volume: VolumeView,
    /// How many claims were forgotten.
    pub dropped_claims: usize,
    /// What stays in the plugin (and on nodes), each with the call that would remove it.
    pub left_in_plugin: Vec<String>,
}

/// One volume of a plugin's own listing (`ListVolumes`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExternalVolumeView {
    /// The plugin's volume id.
    pub external_id: String,
    /// Its size in bytes (0: unknown).
    pub capacity_bytes: i64,
    /// The plugin node ids it is published to, when the plugin reports them.
    pub published_nodes: Vec<String>,
    /// The agent's id for it, when the agent knows it.
    pub known_as: Option<String>,
}

/// Cut a snapshot of a volume (`POST /v1/volumes/{id}/snapshots`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshot {
    /// The snapshot's name (the plugin's idempotency key: the same name again answers the
    /// same snapshot).
    pub name: String,
    /// Plugin parameters.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// One snapshot.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotView {
    /// The plugin.
    pub plugin: String,
    /// The plugin's snapshot id.
    pub snapshot_id: String,
    /// The plugin's id of the volume it was cut from.
    pub source_external_id: String,
    /// The agent's id of that volume, when the agent knows it.
    pub source_volume: Option<String>,
    /// Its size in bytes (0: unknown).
    pub size_bytes: i64,
    /// Whether it can be used as a volume source yet.
    pub ready_to_use: bool,
}

/// A deleted snapshot.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotDeleted {
    /// The plugin.
    pub plugin: String,
    /// The plugin's snapshot id.
    pub snapshot_id: String,
}

/// Claim a volume for a workload on this agent's node, and publish it there.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClaimVolume {
    /// The workload.
    pub workload: String,
    /// `read` or `write`.
    pub mode: String,
}

/// Release a workload's claim.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ReleaseVolume {
    /// The workload.
    pub workload: String,
}

/// One claim.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClaimView {
    /// The volume.
    pub volume: String,
    /// The workload.
    pub workload: String,
    /// The orchestrator node.
    pub node: String,
    /// The plugin's node id.
    pub plugin_node: String,
    /// `read` or `write`.
    pub mode: String,
    /// The access mode.
    pub access_mode: String,
    /// The claim state (`taken`, `releasing`, `node_detached`, …, `freed`).
    pub state: String,
    /// Where the volume is published for the workload (claims made on this node).
    pub target_path: Option<String>,
}

/// A volume's release, explained.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReleaseView {
    /// The volume.
    pub volume: String,
    /// What it waits for: `nothing`, `node_detach`, `controller_detach`, `controller_slot`,
    /// or `backoff` (a step failed and is retried in `next_retry_ms`; `backoff_step` names
    /// it).
    pub pending: String,
    /// The workload of the pending step, if any (none for a `store_read` backoff).
    pub pending_workload: Option<String>,
    /// While `pending` is `backoff`: the step that failed and waits to be retried,
    /// `node_detach`, `controller_detach` or `store_read` (reading the volume's claims again
    /// after the claim store failed). Absent otherwise, and from agents before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_step: Option<String>,
    /// Failed attempts of the current step.
    pub attempts: u32,
    /// The last error.
    pub last_error: Option<String>,
    /// Its class (`retry`, `retry_elsewhere`, `uncertain`, `fatal`, or `store`).
    pub last_error_class: Option<String>,
    /// Milliseconds until the next attempt, when backing off.
    pub next_retry_ms: Option<u64>,
    /// Whether every change is durable.
    pub durable: bool,
    /// The claims, each with its state.
    pub claims: Vec<ClaimView>,
}

/// One registered volume.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeView {
    /// The orchestrator's id.
    pub id: String,
    /// The plugin's id.
    pub external_id: String,
    /// The plugin.
    pub plugin: String,
    /// The access mode.
    pub access_mode: String,
    /// `mount` or `block`.
    pub attachment: String,
    /// Whether releases need a controller unpublish.
    pub controller_publish: bool,
    /// Whether the agent created it (and `volume delete` deletes it in the plugin).
    pub created: bool,
    /// The names of the volume's secrets, `section/name` for a per-call one (never a value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_names: Vec<String>,
    /// Capacity in bytes, when known.
    pub capacity_bytes: Option<i64>,
    /// Where the volume is reachable, each a map of topology segments (empty: from
    /// everywhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accessible_topology: Vec<BTreeMap<String, String>>,
    /// An expansion waits for `NodeExpandVolume` at the volume's next claim.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_expansion_pending: bool,
    /// Claims not yet freed.
    pub claims: Vec<ClaimView>,
    /// The release, when one is in progress or stuck.
    pub release: Option<ReleaseView>,
    /// This agent's plugin calls about the volume in flight now, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls_in_flight: Vec<CallInFlightView>,
    /// Not a volume yet: a `CreateVolume` of this id had an uncertain outcome that could not
    /// be undone, so a volume may exist in the plugin under its name. Kept until a later
    /// `volume create` of the id resolves it, or `volume deregister` clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_exist: Option<MayExistView>,
    /// What the plugin last said of the volume's health on this agent's node (its conditions
    /// and usage), when the agent polls any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<VolumeHealthView>,
    /// Releases of the volume's claims that wait for something that is not there (a node
    /// that is down), past the agent's threshold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitingView>,
}

/// A claim's release that waits for something that is not there.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WaitingView {
    /// The volume.
    pub volume: String,
    /// The claim's workload.
    pub workload: String,
    /// The node the release waits for, when it waits for a node.
    pub node: Option<String>,
    /// What it waits for, in words.
    pub waiting_for: String,
    /// How long it has waited, as this agent saw it, in seconds.
    pub waited_s: u64,
}

/// A volume that may exist in a plugin, though the agent cannot name it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MayExistView {
    /// The plugin.
    pub plugin: String,
    /// The name `CreateVolume` was sent with.
    pub name: String,
    /// Why its outcome is unknown, e.g. `CreateVolume's answer was unusable`.
    pub why: String,
    /// The failure, as it was answered.
    pub error: String,
}

impl MayExistView {
    /// `may exist in plugin P under name N (CreateVolume's answer was unusable)`.
    pub fn line(&self) -> String {
        format!(
            "may exist in plugin {} under name {} ({})",
            self.plugin, self.name, self.why
        )
    }
}

/// A plugin call in flight: what it waits on and since when.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CallInFlightView {
    /// The RPC, e.g. `NodeStageVolume`.
    pub rpc: String,
    /// What it waits on: `turn` (another call about the volume is in flight), `answer` (the
    /// plugin's) or `backoff` (the pause before the next attempt).
    pub waiting: String,
    /// The attempt under way (from 1; 0 before the first).
    pub attempt: u32,
    /// The most attempts its policy allows.
    pub max_attempts: u32,
    /// The attempt's deadline, in milliseconds.
    pub attempt_deadline_ms: u64,
    /// How long the call has been going, in milliseconds.
    pub elapsed_ms: u64,
    /// All of it in words, for people (ids escaped).
    pub summary: String,
}

/// A publication whose outcome was uncertain, kept until cleaned up.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct UncertainView {
    /// The volume.
    pub volume: String,
    /// The workload, or `-` for a staging.
    pub workload: String,
    /// `stage` or `publish`.
    pub step: String,
    /// The path concerned.
    pub path: String,
}

/// A peer agent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerView {
    /// Its node id.
    pub node: String,
    /// Whether its last poll answered.
    pub reachable: bool,
    /// How many plugins it reported.
    pub plugins: usize,
    /// The last poll error.
    pub last_error: Option<String>,
}

/// `csi-agent status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatusView {
    /// The agent's node id.
    pub node: String,
    /// Plugins, local and on peers.
    pub plugins: Vec<PluginView>,
    /// Peer agents.
    pub peers: Vec<PeerView>,
    /// Registered volumes.
    pub volumes: usize,
    /// Claims per state.
    pub claims: BTreeMap<String, u64>,
    /// Every stuck release, explained.
    pub stuck: Vec<ReleaseView>,
    /// Releases that wait for something that is not there (a node that is down), past the
    /// agent's threshold (`call_timeout`), oldest first; absent from agents before it.
    #[serde(default)]
    pub waiting: Vec<WaitingView>,
    /// Uncertain node publications awaiting cleanup.
    pub uncertain: Vec<UncertainView>,
    /// Cluster mode: the store, the members and who drives controller-side releases (`None`:
    /// the embedded store of this node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterView>,
    /// Why the claim store fails, while it does (naming the store and its file); claims and
    /// releases fail at once with it meanwhile (`503`, kind `store`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_failure: Option<String>,
    /// The state files under the data directory whose last write failed, each error naming
    /// its file; what changes them fails at once meanwhile (`503`, kind `local_io`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing_files: Vec<String>,
    /// The confirmation of the node's usage records at start (`None`: it has not finished
    /// yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<ReconcileView>,
    /// The volumes published here that their plugin reports abnormal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub abnormal: Vec<AbnormalView>,
    /// Entries of the plugin directory passed over, `<path>: <why>` (a `<name>.sock` that is
    /// not a socket, a socket whose name is not a plugin id).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored_plugin_files: Vec<String>,
}

/// A volume's health on this node, as its plugin last reported it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeHealthView {
    /// The controller's condition (`ControllerGetVolume`, `ListVolumes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<ConditionView>,
    /// The node service's condition (`NodeGetVolumeStats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<ConditionView>,
    /// Bytes: used, available, in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<UsageView>,
    /// Inodes: used, available, in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<UsageView>,
}

/// A volume condition.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConditionView {
    /// Whether the plugin says the volume is abnormal.
    pub abnormal: bool,
    /// The plugin's words.
    pub message: String,
}

/// One kind of usage.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UsageView {
    /// In use.
    pub used: u64,
    /// Available.
    pub available: u64,
    /// In all.
    pub total: u64,
}

/// A volume its plugin reports abnormal.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AbnormalView {
    /// The volume.
    pub volume: String,
    /// Who says so: `controller` or `node`.
    pub source: String,
    /// The plugin's words.
    pub message: String,
}

/// How the usage records restored at start were confirmed against their plugins (csi-node's
/// `VolumeManager::reconcile`): one entry per publication, and per staging with no
/// publication left.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReconcileView {
    /// Plugins of the records that were not healthy when the wait for them ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugins_not_ready: Vec<String>,
    /// The records.
    pub records: Vec<ReconciledView>,
    /// The publications released because their claims were let go (freed, or released
    /// without their node steps: `volume detach --node-gone`) while this node was reported
    /// gone for good; each is among `records` too, as `released`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released_while_gone: Vec<ReleasedWhileGoneView>,
}

/// A publication released at start because its claim was let go while this node was
/// reported gone for good.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReleasedWhileGoneView {
    /// The plugin.
    pub plugin: String,
    /// The volume.
    pub volume: String,
    /// The workload.
    pub workload: String,
    /// What the plugin was asked: `unpublished and unstaged`, `unpublished`, `unstaged` or
    /// `nothing left to unpublish`.
    pub done: String,
    /// How its claim stood: `freed`, `controller_step_resumed` (released, its controller
    /// step waiting: retried at once) or `controller_step_done`.
    pub claim: String,
}

/// One usage record's confirmation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReconciledView {
    /// The plugin.
    pub plugin: String,
    /// The volume.
    pub volume: String,
    /// The workload, or `-` for a staging with no publication left.
    pub workload: String,
    /// What the record said: `stage <state>, publish <state>` (`done`, `uncertain`,
    /// `started`, `-`).
    pub found: String,
    /// What was done: `already_confirmed`, `republished`, `released`, `cleaned`, `kept`
    /// (the claim is not taken: left to its release), `plugin_missing` or `failed`.
    pub action: String,
    /// Why it could not be confirmed (the record is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The error's class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// The cluster an agent in cluster mode belongs to.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterView {
    /// The store, `etcd://HOST:PORT,...`.
    pub store: String,
    /// The key prefix.
    pub prefix: String,
    /// The agent that performs controller-side release steps (`None`: nobody now, or not
    /// known while etcd is unreachable).
    pub controller_duty: Option<String>,
    /// This agent's own hold on the controller duty (`None`: it does not hold it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_duty: Option<DutyView>,
    /// The live members (their leases are current), this agent among them.
    pub members: Vec<MemberView>,
    /// Why this agent's view of the cluster may be behind, while etcd is unreachable.
    pub outage: Option<String>,
}

/// The controller duty as the agent holding it knows it (see `csi_claims::duty`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DutyView {
    /// Whether it may start controller-side steps now: the local deadline its last confirmed
    /// keep-alive set (that keep-alive's send time, plus `lease_ttl`, minus `lease_margin`)
    /// has not passed. `false` after a pause longer than the margin, until a keep-alive is
    /// confirmed again (or the duty is given up).
    pub holds: bool,
    /// Milliseconds until that deadline (0 once it passed).
    pub confirmed_for_ms: u64,
    /// Its fence: the etcd revision at which this agent took the duty key.
    pub revision: i64,
}

/// One live member of the cluster.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberView {
    /// Its node id.
    pub node: String,
    /// Whether it is the agent answering.
    pub me: bool,
    /// Its control API address (loopback on its host).
    pub http: String,
    /// Its agent-to-agent address.
    pub shim: String,
    /// The ids of its fingerprinted plugins.
    pub plugins: Vec<String>,
}

/// One plugin as a peer advertises it (csi-control's wire form, in member records and in
/// `GET /peer/v1/plugins`).
pub use csi_control::peers::HostedPlugin as PeerPlugin;

/// `GET /peer/v1/plugins`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerPlugins {
    /// The answering agent's node id.
    pub node: String,
    /// Its fingerprinted plugins.
    pub plugins: Vec<PeerPlugin>,
}
