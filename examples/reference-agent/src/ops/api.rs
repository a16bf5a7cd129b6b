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
//! | `DELETE /v1/volumes/{id}` | | [`VolumeView`] (as it was) |
//! | `GET /peer/v1/plugins` | | [`PeerPlugins`] (for other agents; cluster token) |
//! | `GET /metrics` | | Prometheus text (no token) |
//!
//! Errors answer a non-2xx status with an [`ApiError`]. No secret ever crosses this API.

use std::collections::BTreeMap;

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

/// An error answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ApiError {
    /// A short machine-readable kind (`not_found`, `bad_request`, `conflict`, …). A failed
    /// plugin call says who said what: `plugin` (the plugin answered an error status),
    /// `plugin_answer` (its answer was unusable), `deadline` (a deadline of ours passed),
    /// `plugin_unreachable`, `plugin_unhealthy` (nothing is published through a plugin not
    /// known to be healthy), `invalid_request` or `agent`.
    pub kind: String,
    /// What went wrong, for people.
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
}

/// Register an existing volume.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
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
}

/// Create a volume through a controller of the plugin, then register it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
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
}

/// Claim a volume for a workload on this agent's node, and publish it there.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClaimVolume {
    /// The workload.
    pub workload: String,
    /// `read` or `write`.
    pub mode: String,
}

/// Release a workload's claim.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
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
    /// What it waits for: `nothing`, `node_detach`, `controller_detach`, `controller_slot`.
    pub pending: String,
    /// The workload of the pending step, if any.
    pub pending_workload: Option<String>,
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
    /// Capacity in bytes, when known.
    pub capacity_bytes: Option<i64>,
    /// Claims not yet freed.
    pub claims: Vec<ClaimView>,
    /// The release, when one is in progress or stuck.
    pub release: Option<ReleaseView>,
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
    /// Uncertain node publications awaiting cleanup.
    pub uncertain: Vec<UncertainView>,
    /// Cluster mode: the store, the members and who drives controller-side releases (`None`:
    /// the embedded store of this node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterView>,
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
    /// The live members (their leases are current), this agent among them.
    pub members: Vec<MemberView>,
    /// Why this agent's view of the cluster may be behind, while etcd is unreachable.
    pub outage: Option<String>,
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

/// One plugin as a peer advertises it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerPlugin {
    /// The plugin id.
    pub id: String,
    /// Controller service health (`None`: no controller here).
    pub controller: Option<bool>,
    /// Node service: the plugin's node id and whether it is healthy.
    pub node: Option<(String, bool)>,
    /// Whether releases need a controller unpublish.
    pub controller_publish: bool,
}

/// `GET /peer/v1/plugins`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerPlugins {
    /// The answering agent's node id.
    pub node: String,
    /// Its fingerprinted plugins.
    pub plugins: Vec<PeerPlugin>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_round_trip() {
        for id in ["db", "a b/c?d#e%f", "ünï", "..", ""] {
            let enc = encode_segment(id);
            assert!(!enc.contains('/') && !enc.contains(' ') && !enc.contains('?'));
            assert_eq!(decode_segment(&enc).as_deref(), Some(id));
        }
        for broken in ["%", "%4", "%zz", "%ff"] {
            assert_eq!(decode_segment(broken), None, "{broken}");
        }
    }
}
