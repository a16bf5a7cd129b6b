//! One generated call of the agent protocol: who presents which credentials, the request's
//! fields, and what the agent under test must answer.
//!
//! The campaign's cluster: agent `b` is under test; agent `c` is reached from `b` directly (a
//! call for `c` is relayed once); `a`, `b` and `c` are node-scoped and `ops` cluster-scoped;
//! `old` had a token that was removed, and every node's first token was rotated away.

use std::collections::BTreeSet;
use std::fmt;

use csi_rpc_shim::AgentRpc;
use csi_rpc_shim::wire::pb;
use prost::Message as _;

use super::fake::{HANG, PLUGIN, SICK_PLUGIN};
use super::fields::{Fields, MARKER};
use crate::rng::Rng;

/// The agent under test.
pub(crate) const SERVER: &str = "b";
/// The agent `b` relays to.
pub(crate) const PEER: &str = "c";
/// Every node with a token, and whether it is cluster-scoped.
pub(crate) const NODES: &[(&str, bool)] =
    &[("a", false), ("b", false), ("c", false), ("ops", true)];
/// A node whose token was removed from the book.
pub(crate) const RETIRED: &str = "old";

/// The token of `node` in generation `generation` (0: rotated away; 1: current). Visible
/// ASCII, 16 bytes or more, and holding [`MARKER`].
pub(crate) fn token_of(node: &str, generation: u8, run: u64) -> String {
    format!("{MARKER}-{node}-{generation}-{run:016x}")
}

/// The plugin node id of `node` in the registry.
pub(crate) fn plugin_node_of(node: &str) -> String {
    format!("i-{node}")
}

/// What credentials a call presents. `Display` names the kind and the node, never a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Creds {
    /// No credential headers.
    None,
    /// The node header only.
    NodeOnly(&'static str),
    /// The token header only (the node's own token).
    TokenOnly(&'static str),
    /// The node's current token.
    Valid(&'static str),
    /// A token the node never had, of a valid shape.
    Forged(&'static str),
    /// Another node's current token, under this node's id (a replay across nodes).
    Borrowed {
        /// The id presented.
        node: &'static str,
        /// Whose token.
        owner: &'static str,
    },
    /// The node's previous token, rotated away.
    Stale(&'static str),
    /// The token of a node removed from the book.
    Retired,
    /// A node header that is not UTF-8.
    NodeNotUtf8,
    /// A node header that is not base64 (binary metadata must be).
    NodeNotBase64,
    /// An empty node id.
    EmptyNode,
    /// A visible-ASCII token far over the longest accepted.
    LongToken(&'static str),
}

impl Creds {
    fn generate(rng: &mut Rng) -> Self {
        let node = NODES[rng.index(NODES.len())].0;
        match rng.weighted(&[70, 3, 3, 5, 4, 3, 2, 2, 2, 2, 2, 2]) {
            0 => Creds::Valid(node),
            1 => Creds::None,
            2 => Creds::NodeOnly(node),
            3 => Creds::Forged(node),
            4 => {
                let others: Vec<&'static str> = NODES
                    .iter()
                    .map(|(n, _)| *n)
                    .filter(|n| *n != node)
                    .collect();
                Creds::Borrowed {
                    node,
                    owner: others[rng.index(others.len())],
                }
            }
            5 => Creds::Stale(node),
            6 => Creds::Retired,
            7 => Creds::TokenOnly(node),
            8 => Creds::NodeNotUtf8,
            9 => Creds::NodeNotBase64,
            10 => Creds::EmptyNode,
            _ => Creds::LongToken(node),
        }
    }

    /// The authenticated caller, when the credentials are good.
    pub(crate) fn principal(&self) -> Option<&'static str> {
        match self {
            Creds::Valid(node) => Some(node),
            _ => None,
        }
    }

    /// The node whose fields a generated request should favour (the one it claims to be).
    fn claimed(&self) -> Option<&'static str> {
        match self {
            Creds::Valid(n)
            | Creds::NodeOnly(n)
            | Creds::TokenOnly(n)
            | Creds::Forged(n)
            | Creds::Stale(n)
            | Creds::LongToken(n)
            | Creds::Borrowed { node: n, .. } => Some(n),
            _ => None,
        }
    }
}

impl fmt::Display for Creds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Creds::None => f.write_str("none"),
            Creds::NodeOnly(n) => write!(f, "node-only({n})"),
            Creds::TokenOnly(n) => write!(f, "token-only({n})"),
            Creds::Valid(n) => write!(f, "valid({n})"),
            Creds::Forged(n) => write!(f, "forged({n})"),
            Creds::Borrowed { node, owner } => write!(f, "borrowed({node} with {owner}'s token)"),
            Creds::Stale(n) => write!(f, "stale({n})"),
            Creds::Retired => write!(f, "retired({RETIRED})"),
            Creds::NodeNotUtf8 => f.write_str("node-not-utf8"),
            Creds::NodeNotBase64 => f.write_str("node-not-base64"),
            Creds::EmptyNode => f.write_str("empty-node"),
            Creds::LongToken(n) => write!(f, "long-token({n})"),
        }
    }
}

/// The hop count header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hops {
    /// No header: a first hop.
    Absent,
    /// A header with this text.
    Text(&'static str),
}

impl Hops {
    fn generate(rng: &mut Rng) -> Self {
        if rng.percent(50) {
            return Hops::Absent;
        }
        Hops::Text(rng.pick(&[
            "0", "0", "1", "1", "2", "255", "256", "-1", "one", "", "0x1", "1.0",
        ]))
    }

    /// The count the agent must act on: a value that does not parse as a byte counts as
    /// "already relayed".
    pub(crate) fn value(&self) -> u8 {
        match self {
            Hops::Absent => 0,
            Hops::Text(t) => t.parse().unwrap_or(u8::MAX),
        }
    }
}

/// The `grpc-timeout` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Timeout {
    /// None: the agent's own cap applies.
    Absent,
    /// A generous valid one.
    Generous(&'static str),
    /// A text that is not a timeout (the agent's cap applies).
    Garbage(&'static str),
    /// Short enough that the call may run out of time before the plugin answers.
    Tiny(&'static str),
    /// For a call the plugin never answers: this many milliseconds.
    Short(u64),
}

impl Timeout {
    fn generate(rng: &mut Rng) -> Self {
        match rng.weighted(&[35, 40, 15, 10]) {
            0 => Timeout::Absent,
            1 => Timeout::Generous(rng.pick(&["20S", "20000m", "1M", "1H", "99999999S"])),
            2 => Timeout::Garbage(rng.pick(&["", "abc", "10", "-5S", "5X", "123456789S", "1.5S"])),
            _ => Timeout::Tiny(rng.pick(&["1n", "1u", "1m", "0S", "0m"])),
        }
    }

    /// The header's text, when there is one.
    pub(crate) fn header(&self) -> Option<String> {
        match self {
            Timeout::Absent => None,
            Timeout::Generous(t) | Timeout::Garbage(t) | Timeout::Tiny(t) => Some((*t).to_owned()),
            Timeout::Short(ms) => Some(format!("{ms}m")),
        }
    }
}

/// On whose behalf a call acts, as the protocol defines it per call.
#[derive(Clone, Debug)]
enum Acting {
    /// For the node in the request; with the plugin node id it names, for controller calls.
    ForNode {
        node: String,
        plugin_node: Option<String>,
    },
    ReadOnly,
    ClusterWide,
}

/// What the agent must answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    /// `UNAUTHENTICATED`, nothing else looked at.
    Unauthenticated,
    /// `INVALID_ARGUMENT` whose violations name exactly these fields.
    Invalid(BTreeSet<&'static str>),
    /// `PERMISSION_DENIED`.
    Denied,
    /// `FAILED_PRECONDITION`: the plugin is missing or unhealthy there.
    PluginMissing,
    /// `FAILED_PRECONDITION`: relayed already, not for this agent.
    HopLimit,
    /// `UNAVAILABLE`: no route to the target.
    NoRoute,
    /// Served by the plugins of `node`, for `origin`.
    Served {
        /// `b` or `c`.
        node: &'static str,
        /// The authenticated caller.
        origin: &'static str,
    },
    /// Handed to the plugins of `node`, which never answer: a deadline error, and the plugin
    /// call dropped.
    Deadline {
        /// `b` or `c`.
        node: &'static str,
        /// The authenticated caller.
        origin: &'static str,
    },
}

impl Expect {
    /// The node whose plugins the call must reach, if any.
    pub(crate) fn reaches(&self) -> Option<(&'static str, &'static str)> {
        match self {
            Expect::Served { node, origin } | Expect::Deadline { node, origin } => {
                Some((node, origin))
            }
            _ => None,
        }
    }
}

/// A generated call.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    /// Which call.
    pub(crate) rpc: AgentRpc,
    /// The encoded request message.
    pub(crate) body: Vec<u8>,
    /// The credentials presented.
    pub(crate) creds: Creds,
    /// The hop count header.
    pub(crate) hops: Hops,
    /// The timeout header.
    pub(crate) timeout: Timeout,
    /// What the agent must answer.
    pub(crate) expect: Expect,
}

impl Call {
    /// The call without its expected answer, nor any field value (values may be megabytes,
    /// or secrets).
    pub(crate) fn headline(&self) -> String {
        format!(
            "{} creds={} hops={:?} timeout={:?} body={}B",
            self.rpc,
            self.creds,
            self.hops,
            self.timeout.header(),
            self.body.len(),
        )
    }
}

impl fmt::Display for Call {
    /// [`Call::headline`] and the expected answer.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} expect={:?}", self.headline(), self.expect)
    }
}

/// The parts of a request that decide where it goes.
struct Parts {
    plugin: String,
    target: String,
    acting: Acting,
    /// A release step (node or controller detach): served by a plugin reported unhealthy too.
    release_step: bool,
    /// The field the fake plugin hangs on, set to a hanging value when the call should hang.
    hang: bool,
}

/// Values a field usually takes: mostly the caller's own, sometimes another node's.
fn nodes_for(caller: Option<&'static str>) -> Vec<&'static str> {
    let mut v = vec!["a", "b", "c", "ops", "zz"];
    if let Some(c) = caller {
        v.extend([c, c, c, c, c, c]);
    }
    v
}

fn query(
    f: &mut Fields<'_>,
    caller: Option<&'static str>,
) -> (Option<pb::ControllerQuery>, String, String) {
    if f.rng().percent(3) {
        f.invalid.insert("query.plugin_id");
        f.invalid.insert("query.target_node");
        return (None, String::new(), String::new());
    }
    let plugin = f.id(
        "query.plugin_id",
        &[PLUGIN, PLUGIN, PLUGIN, PLUGIN, SICK_PLUGIN, "other"],
    );
    let preferred = f.opt_id("query.preferred_node", &nodes_for(caller));
    let target = f.id(
        "query.target_node",
        &[SERVER, SERVER, SERVER, SERVER, PEER, PEER, "a", "zz"],
    );
    let q = pb::ControllerQuery {
        plugin_id: plugin.clone(),
        preferred_node: preferred,
        target_node: target.clone(),
    };
    (Some(q), plugin, target)
}

/// An id that the fake plugin hangs on, or an ordinary generated one.
fn key_id(f: &mut Fields<'_>, field: &'static str, usual: &[&str], hang: bool) -> String {
    if hang {
        format!("{HANG}{}", f.rng().index(1000))
    } else {
        f.id(field, usual)
    }
}

/// A listing token that the fake plugin hangs on, or an ordinary generated one.
fn key_token(f: &mut Fields<'_>, hang: bool) -> String {
    if hang {
        format!("{HANG}{}", f.rng().index(1000))
    } else {
        f.short_string("starting_token")
    }
}

const VOLUMES: &[&str] = &["vol-1", "db-data", "vol-2"];
const EXTERNAL: &[&str] = &["ext-vol-1", "vol-0abc"];

fn build(
    rpc: AgentRpc,
    f: &mut Fields<'_>,
    caller: Option<&'static str>,
    hang: bool,
) -> (Vec<u8>, Parts) {
    let nodes = nodes_for(caller);
    if matches!(rpc, AgentRpc::NodeDetach | AgentRpc::NodeExpand) {
        return build_node(rpc, f, &nodes, hang);
    }
    let own_plugin_node = caller.map(plugin_node_of);
    let mut plugin_nodes = vec!["i-a", "i-b", "i-c", "i-zz"];
    if let Some(p) = &own_plugin_node {
        plugin_nodes.extend([p.as_str(), p.as_str(), p.as_str(), p.as_str()]);
    }
    let (query, plugin, target) = query(f, caller);
    let (body, acting) = match rpc {
        AgentRpc::ControllerAttach | AgentRpc::ControllerDetach => {
            let volume_id = key_id(f, "volume_id", VOLUMES, hang);
            let external_volume_id = f.id("external_volume_id", EXTERNAL);
            let node_id = f.id("node_id", &nodes);
            let plugin_node_id = f.plugin_node_id("plugin_node_id", &plugin_nodes);
            let acting = Acting::ForNode {
                node: node_id.clone(),
                plugin_node: Some(plugin_node_id.clone()),
            };
            let body = if rpc == AgentRpc::ControllerAttach {
                pb::ControllerAttachRequest {
                    query,
                    volume_id,
                    external_volume_id,
                    node_id,
                    plugin_node_id,
                    capability: f.capability("capability", true),
                    read_only: f.rng().percent(30),
                    secrets: f.secrets("secrets"),
                    volume_context: f.map("volume_context"),
                }
                .encode_to_vec()
            } else {
                pb::ControllerDetachRequest {
                    query,
                    volume_id,
                    external_volume_id,
                    node_id,
                    plugin_node_id,
                    secrets: f.secrets("secrets"),
                }
                .encode_to_vec()
            };
            (body, acting)
        }
        AgentRpc::ControllerValidate => {
            let body = pb::ControllerValidateRequest {
                query,
                volume_id: key_id(f, "volume_id", VOLUMES, hang),
                external_volume_id: f.id("external_volume_id", EXTERNAL),
                capabilities: f.capabilities("capabilities"),
                volume_context: f.map("volume_context"),
                parameters: f.map("parameters"),
                secrets: f.secrets("secrets"),
            };
            (body.encode_to_vec(), Acting::ReadOnly)
        }
        AgentRpc::ControllerCreateVolume => {
            let volume_id = key_id(f, "volume_id", VOLUMES, hang);
            let (required_bytes, limit_bytes) = f.capacity();
            let body = pb::ControllerCreateVolumeRequest {
                query,
                volume_id,
                required_bytes,
                limit_bytes,
                capabilities: f.capabilities("capabilities"),
                parameters: f.map("parameters"),
                secrets: f.secrets("secrets"),
                accessibility_requirements: f.requirement("accessibility_requirements"),
                content_source: f.content_source("content_source"),
            };
            (body.encode_to_vec(), Acting::ClusterWide)
        }
        AgentRpc::ControllerDeleteVolume => {
            let body = pb::ControllerDeleteVolumeRequest {
                query,
                volume_id: key_id(f, "volume_id", VOLUMES, hang),
                external_volume_id: f.id("external_volume_id", EXTERNAL),
                secrets: f.secrets("secrets"),
            };
            (body.encode_to_vec(), Acting::ClusterWide)
        }
        AgentRpc::ControllerExpandVolume => {
            let volume_id = key_id(f, "volume_id", VOLUMES, hang);
            let external_volume_id = f.id("external_volume_id", EXTERNAL);
            let (required_bytes, limit_bytes) = f.capacity();
            let body = pb::ControllerExpandVolumeRequest {
                query,
                volume_id,
                external_volume_id,
                required_bytes,
                limit_bytes,
                capability: f.capability("capability", false),
                secrets: f.secrets("secrets"),
            };
            (body.encode_to_vec(), Acting::ClusterWide)
        }
        AgentRpc::ControllerListVolumes => {
            let max_entries = f.max_entries("max_entries");
            let body = pb::ControllerListVolumesRequest {
                query,
                max_entries,
                starting_token: key_token(f, hang),
            };
            (body.encode_to_vec(), Acting::ReadOnly)
        }
        AgentRpc::ControllerCreateSnapshot => {
            let body = pb::ControllerCreateSnapshotRequest {
                query,
                volume_id: key_id(f, "volume_id", VOLUMES, hang),
                source_external_volume_id: f.id("source_external_volume_id", EXTERNAL),
                name: f.name("name"),
                parameters: f.map("parameters"),
                secrets: f.secrets("secrets"),
            };
            (body.encode_to_vec(), Acting::ClusterWide)
        }
        AgentRpc::ControllerDeleteSnapshot => {
            let body = pb::ControllerDeleteSnapshotRequest {
                query,
                snapshot_id: key_id(f, "snapshot_id", &["snap-1", "snap-0ff"], hang),
                secrets: f.secrets("secrets"),
            };
            (body.encode_to_vec(), Acting::ClusterWide)
        }
        // ControllerListSnapshots; the node calls returned above.
        _ => {
            let source_external_volume_id = f.opt_id("source_external_volume_id", EXTERNAL);
            let snapshot_id = f.opt_id("snapshot_id", &["snap-1"]);
            let max_entries = f.max_entries("max_entries");
            let body = pb::ControllerListSnapshotsRequest {
                query,
                source_external_volume_id,
                snapshot_id,
                max_entries,
                starting_token: key_token(f, hang),
                secrets: f.secrets("secrets"),
            };
            (body.encode_to_vec(), Acting::ReadOnly)
        }
    };
    let parts = Parts {
        plugin,
        target,
        acting,
        release_step: rpc == AgentRpc::ControllerDetach,
        hang,
    };
    (body, parts)
}

/// The node calls: routed by their `node_id`, for which they act.
fn build_node(rpc: AgentRpc, f: &mut Fields<'_>, nodes: &[&str], hang: bool) -> (Vec<u8>, Parts) {
    let plugin = f.id(
        "plugin_id",
        &[PLUGIN, PLUGIN, PLUGIN, PLUGIN, SICK_PLUGIN, "other"],
    );
    let volume_id = key_id(f, "volume_id", VOLUMES, hang);
    let external_volume_id = f.id("external_volume_id", EXTERNAL);
    let mut targets = nodes.to_vec();
    targets.extend([SERVER, SERVER, SERVER, PEER]);
    let node_id = f.id("node_id", &targets);
    let workload_id = f.id("workload_id", &["alloc-1", "web-0"]);
    let parts = Parts {
        plugin: plugin.clone(),
        target: node_id.clone(),
        acting: Acting::ForNode {
            node: node_id.clone(),
            plugin_node: None,
        },
        release_step: rpc == AgentRpc::NodeDetach,
        hang,
    };
    let body = if rpc == AgentRpc::NodeDetach {
        pb::NodeDetachRequest {
            plugin_id: plugin,
            volume_id,
            external_volume_id,
            node_id,
            workload_id,
            capability: f.capability("capability", true),
            read_only: f.rng().percent(20),
        }
        .encode_to_vec()
    } else {
        let (required_bytes, limit_bytes) = f.capacity();
        pb::NodeExpandRequest {
            plugin_id: plugin,
            volume_id,
            external_volume_id,
            node_id,
            workload_id,
            required_bytes,
            limit_bytes,
            capability: f.capability("capability", true),
            secrets: f.secrets("secrets"),
        }
        .encode_to_vec()
    };
    (body, parts)
}

/// The agent's rules, in the order it applies them: credentials, then every field, then who
/// may act for whom, then where the call goes.
fn expect(creds: &Creds, invalid: BTreeSet<&'static str>, parts: &Parts, hops: u8) -> Expect {
    let Some(caller) = creds.principal() else {
        return Expect::Unauthenticated;
    };
    if !invalid.is_empty() {
        return Expect::Invalid(invalid);
    }
    let cluster_scoped = NODES.iter().any(|(n, cluster)| *n == caller && *cluster);
    if !cluster_scoped {
        match &parts.acting {
            Acting::ReadOnly => {}
            Acting::ClusterWide => return Expect::Denied,
            Acting::ForNode { node, plugin_node } => {
                if node != caller {
                    return Expect::Denied;
                }
                if let Some(claimed) = plugin_node {
                    // The registry knows the node plugins `ebs` and `sick` of a, b and c only.
                    let known = parts.plugin == PLUGIN || parts.plugin == SICK_PLUGIN;
                    let own = known.then(|| plugin_node_of(node));
                    if own.as_deref() != Some(claimed.as_str()) {
                        return Expect::Denied;
                    }
                }
            }
        }
    }
    let serving = if parts.target == SERVER {
        SERVER
    } else if hops >= 1 {
        return Expect::HopLimit;
    } else if parts.target == PEER {
        PEER
    } else {
        return Expect::NoRoute;
    };
    // Release steps go to a plugin whatever its health: health is advice for clean-up.
    let usable = parts.plugin == PLUGIN || (parts.release_step && parts.plugin == SICK_PLUGIN);
    if !usable {
        return Expect::PluginMissing;
    }
    if parts.hang {
        Expect::Deadline {
            node: serving,
            origin: caller,
        }
    } else {
        Expect::Served {
            node: serving,
            origin: caller,
        }
    }
}

impl Call {
    /// Generates one call.
    pub(crate) fn generate(rng: &mut Rng) -> Call {
        let rpc = rng.pick(AgentRpc::ALL);
        let creds = Creds::generate(rng);
        let hops = Hops::generate(rng);
        let hang = rng.percent(4);
        let timeout = if hang {
            Timeout::Short(rng.range(20, 200))
        } else {
            Timeout::generate(rng)
        };
        let caller = creds.claimed();
        let mut fields = Fields::new(rng);
        let (body, parts) = build(rpc, &mut fields, caller, hang);
        let expect = expect(&creds, fields.invalid, &parts, hops.value());
        Call {
            rpc,
            body,
            creds,
            hops,
            timeout,
            expect,
        }
    }

    /// Whether the answer may instead be a deadline error: the timeout is so short that on a
    /// loaded machine the call may run out before it is answered (the plugin may or may not
    /// have been reached then).
    pub(crate) fn may_time_out(&self) -> bool {
        matches!(self.timeout, Timeout::Tiny(_) | Timeout::Short(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_follows_the_order_of_the_rules() {
        let parts = |acting, target: &str, plugin: &str| Parts {
            plugin: plugin.to_owned(),
            target: target.to_owned(),
            acting,
            release_step: false,
            hang: false,
        };
        let for_node = |n: &str, p: Option<&str>| Acting::ForNode {
            node: n.to_owned(),
            plugin_node: p.map(str::to_owned),
        };
        let bad = BTreeSet::from(["volume_id"]);
        // Bad credentials win over bad fields.
        assert_eq!(
            expect(
                &Creds::Forged("a"),
                bad.clone(),
                &parts(Acting::ReadOnly, "b", PLUGIN),
                0
            ),
            Expect::Unauthenticated
        );
        assert_eq!(
            expect(
                &Creds::Valid("a"),
                bad,
                &parts(Acting::ReadOnly, "b", PLUGIN),
                0
            ),
            Expect::Invalid(BTreeSet::from(["volume_id"]))
        );
        // A node acts only for itself and with its own plugin node id.
        let none = BTreeSet::new();
        assert_eq!(
            expect(
                &Creds::Valid("a"),
                none.clone(),
                &parts(for_node("c", None), "b", PLUGIN),
                0
            ),
            Expect::Denied
        );
        assert_eq!(
            expect(
                &Creds::Valid("a"),
                none.clone(),
                &parts(for_node("a", Some("i-c")), "b", PLUGIN),
                0
            ),
            Expect::Denied
        );
        assert_eq!(
            expect(
                &Creds::Valid("ops"),
                none.clone(),
                &parts(for_node("a", Some("i-c")), "c", PLUGIN),
                0
            ),
            Expect::Served {
                node: "c",
                origin: "ops"
            }
        );
        assert_eq!(
            expect(
                &Creds::Valid("a"),
                none.clone(),
                &parts(Acting::ReadOnly, "c", PLUGIN),
                1
            ),
            Expect::HopLimit
        );
        assert_eq!(
            expect(
                &Creds::Valid("a"),
                none.clone(),
                &parts(Acting::ReadOnly, "zz", PLUGIN),
                0
            ),
            Expect::NoRoute
        );
        assert_eq!(
            expect(
                &Creds::Valid("a"),
                none,
                &parts(Acting::ReadOnly, "b", SICK_PLUGIN),
                255
            ),
            Expect::PluginMissing
        );
    }

    #[test]
    fn every_answer_is_generated() {
        let mut rng = Rng::new(11);
        let mut seen = BTreeSet::new();
        for _ in 0..3000 {
            let name = match Call::generate(&mut rng).expect {
                Expect::Unauthenticated => "unauthenticated",
                Expect::Invalid(_) => "invalid",
                Expect::Denied => "denied",
                Expect::PluginMissing => "plugin missing",
                Expect::HopLimit => "hop limit",
                Expect::NoRoute => "no route",
                Expect::Served { node: SERVER, .. } => "served here",
                Expect::Served { .. } => "relayed",
                Expect::Deadline { .. } => "deadline",
            };
            seen.insert(name);
        }
        assert_eq!(seen.len(), 9, "{seen:?}");
    }

    #[test]
    fn credentials_never_print_a_token() {
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let call = Call::generate(&mut rng);
            assert!(!call.to_string().contains(MARKER), "{call}");
        }
    }
}
