//! The mock's configuration and its builder.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use csi_proto::Rpc;

use crate::capabilities::{
    self, CONTROLLER_IMPLEMENTED, ControllerCapability, GROUP_CONTROLLER_IMPLEMENTED,
    GroupControllerCapability, NODE_IMPLEMENTED, NodeCapability, PluginCapabilities, PluginService,
    VolumeExpansion,
};
use csi_structs::limits::{MAX_NAME_CHARS, MAX_PLUGIN_NODE_ID_BYTES, MAX_STRING_BYTES};

use crate::plugin::{MockPlugin, Shared, StateFile};
use crate::quirks::{Quirk, Quirks};
use crate::secrets::{SecretRequirementError, SecretRequirements};
use crate::state::State;
use crate::state::persist::{self, StateFileError};

/// One GiB, the size of a volume created without a capacity range.
pub const GIB: i64 = 1 << 30;

/// Which CSI services the mock offers besides Identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Controller (and GroupController) only; node rpcs answer UNIMPLEMENTED.
    Controller,
    /// Node only; controller rpcs answer UNIMPLEMENTED and node rpcs accept any volume id.
    Node,
    /// Both, sharing one state: node rpcs see the volumes the controller created.
    ControllerAndNode,
}

impl Role {
    /// Whether the Controller service is offered.
    pub const fn has_controller(self) -> bool {
        matches!(self, Role::Controller | Role::ControllerAndNode)
    }

    /// Whether the Node service is offered.
    pub const fn has_node(self) -> bool {
        matches!(self, Role::Node | Role::ControllerAndNode)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Controller => "controller only",
            Role::Node => "node only",
            Role::ControllerAndNode => "controller and node",
        })
    }
}

/// A configuration the builder refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The plugin name breaks the spec's rule (1 to 63 characters, alphanumeric at both ends,
    /// only `-`, `.` and alphanumerics inside).
    #[error("plugin name {name:?} is invalid: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it: every broken rule, as csi-structs' [`PluginName`] checks it.
        ///
        /// [`PluginName`]: csi_structs::PluginName
        reason: csi_structs::ValidationErrors,
    },
    /// The node id is empty or longer than 256 bytes.
    #[error("node id is {len} bytes; it must be 1 to {limit} bytes")]
    InvalidNodeId {
        /// Its length in bytes.
        len: usize,
        /// The limit, 256.
        limit: usize,
    },
    /// A number that may not be negative was negative.
    #[error("{field} is {value}; it must not be negative")]
    Negative {
        /// Which setting.
        field: &'static str,
        /// The value given.
        value: i64,
    },
    /// A topology key or value is empty or longer than 63 characters.
    #[error("topology {part} {text:?} must be 1 to 63 characters")]
    InvalidTopology {
        /// `key` or `value`.
        part: &'static str,
        /// The text given.
        text: String,
    },
    /// A configured `mutable_parameters` key is empty or longer than the spec's 128 bytes.
    #[error("mutable parameter key {key:?} is {len} bytes; it must be 1 to {limit} bytes")]
    InvalidMutableParameterKey {
        /// The key given.
        key: String,
        /// Its length in bytes.
        len: usize,
        /// The limit, 128.
        limit: usize,
    },
    /// The id tag is empty, too long, or has characters other than ASCII letters, digits, `-`.
    #[error("id tag {tag:?} must be 1 to {limit} ASCII letters, digits or '-'")]
    InvalidIdTag {
        /// The tag given.
        tag: String,
        /// The limit in bytes, 32.
        limit: usize,
    },
    /// The state file could not be read or understood.
    #[error(transparent)]
    StateFile(#[from] StateFileError),
    /// A secret requirement ([`MockPluginBuilder::require_secret`]) that no call could meet:
    /// the rpc takes no secrets, or the key is not a valid secret name.
    #[error(transparent)]
    SecretRequirement(#[from] SecretRequirementError),
    /// The default volume size exceeds the largest volume allowed.
    #[error("default volume size {default} exceeds the maximum volume size {max}")]
    DefaultAboveMax {
        /// The default size.
        default: i64,
        /// The maximum.
        max: i64,
    },
}

/// The mock's configuration; read-only once the plugin is built.
#[derive(Clone, Debug)]
pub struct Config {
    /// `GetPluginInfo.name`.
    pub name: String,
    /// `GetPluginInfo.vendor_version`.
    pub vendor_version: String,
    /// `GetPluginInfo.manifest`.
    pub manifest: BTreeMap<String, String>,
    /// The node id `NodeGetInfo` reports; also a node `ControllerPublishVolume` accepts.
    pub node_id: String,
    /// Further node ids `ControllerPublishVolume` accepts (others answer NOT_FOUND).
    pub other_nodes: BTreeSet<String>,
    /// The node's topology segments (`NodeGetInfo.accessible_topology`).
    pub topology: BTreeMap<String, String>,
    /// `NodeGetInfo.max_volumes_per_node`; `None` reports 0 and enforces no limit.
    pub max_volumes_per_node: Option<i64>,
    /// Total capacity of the pool volumes are carved from, in bytes.
    pub capacity_bytes: i64,
    /// Largest volume `CreateVolume` and the expand rpcs accept, in bytes.
    pub max_volume_bytes: i64,
    /// Size of a volume created without a capacity range, in bytes.
    pub default_volume_bytes: i64,
    /// Which services are offered.
    pub role: Role,
    /// `GetPluginCapabilities`.
    pub plugin_caps: PluginCapabilities,
    /// `ControllerGetCapabilities`; also decides which controller rpcs are served.
    pub controller_caps: BTreeSet<ControllerCapability>,
    /// `NodeGetCapabilities`; also decides which node rpcs are served.
    pub node_caps: BTreeSet<NodeCapability>,
    /// `GroupControllerGetCapabilities`; also decides which group rpcs are served.
    pub group_caps: BTreeSet<GroupControllerCapability>,
    /// Keep at most this many call records (oldest dropped first); `None` keeps all, `Some(0)`
    /// none.
    pub call_log_limit: Option<usize>,
    /// The `mutable_parameters` keys `CreateVolume` and `ControllerModifyVolume` accept; any
    /// other key is refused with INVALID_ARGUMENT naming it. Empty by default: the mock
    /// supports no mutable parameter until told which.
    pub mutable_parameter_keys: BTreeSet<String>,
}

/// A volume that exists before any `CreateVolume`, as a pre-provisioned volume would.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedVolume {
    /// Its id.
    pub volume_id: String,
    /// Its size in bytes.
    pub capacity_bytes: i64,
    /// Its `volume_context`.
    pub volume_context: BTreeMap<String, String>,
}

/// Builds a [`MockPlugin`]. Every setting has a default: a plugin named `mock.csi.example`,
/// node `node-1`, controller and node roles, every capability the mock implements except the
/// v1.12 `VOLUME_CONDITION` ones, which a test opts into (see
/// [`controller_capabilities`](Self::controller_capabilities)).
#[derive(Clone, Debug)]
pub struct MockPluginBuilder {
    config: Config,
    plugin_caps_set: bool,
    expansion: Option<Option<VolumeExpansion>>,
    quirks: Vec<Quirk>,
    seeds: Vec<SeedVolume>,
    state_file: Option<PathBuf>,
    id_tag: Option<String>,
    /// The secret requirements so far, or the first one that was refused (reported by
    /// `build`).
    required_secrets: Result<SecretRequirements, SecretRequirementError>,
}

impl Default for MockPluginBuilder {
    fn default() -> Self {
        MockPluginBuilder {
            config: Config {
                name: "mock.csi.example".into(),
                vendor_version: env!("CARGO_PKG_VERSION").into(),
                manifest: BTreeMap::new(),
                node_id: "node-1".into(),
                other_nodes: BTreeSet::new(),
                topology: BTreeMap::new(),
                max_volumes_per_node: None,
                capacity_bytes: 1 << 40,
                max_volume_bytes: 1 << 40,
                default_volume_bytes: GIB,
                role: Role::ControllerAndNode,
                plugin_caps: capabilities::default_plugin_caps(Role::ControllerAndNode, false),
                controller_caps: CONTROLLER_IMPLEMENTED.iter().copied().collect(),
                node_caps: NODE_IMPLEMENTED.iter().copied().collect(),
                group_caps: GROUP_CONTROLLER_IMPLEMENTED.iter().copied().collect(),
                call_log_limit: None,
                mutable_parameter_keys: BTreeSet::new(),
            },
            plugin_caps_set: false,
            expansion: None,
            quirks: Vec::new(),
            seeds: Vec::new(),
            state_file: None,
            id_tag: None,
            required_secrets: Ok(SecretRequirements::default()),
        }
    }
}

impl MockPluginBuilder {
    /// `GetPluginInfo.name` and `vendor_version`.
    pub fn name(mut self, name: impl Into<String>, vendor_version: impl Into<String>) -> Self {
        self.config.name = name.into();
        self.config.vendor_version = vendor_version.into();
        self
    }

    /// Adds an entry to `GetPluginInfo.manifest`.
    pub fn manifest_entry(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.manifest.insert(key.into(), value.into());
        self
    }

    /// The node id `NodeGetInfo` reports (default `node-1`).
    pub fn node_id(mut self, node_id: impl Into<String>) -> Self {
        self.config.node_id = node_id.into();
        self
    }

    /// Another node `ControllerPublishVolume` accepts (for multi-node scenarios).
    pub fn other_node(mut self, node_id: impl Into<String>) -> Self {
        self.config.other_nodes.insert(node_id.into());
        self
    }

    /// Adds a topology segment for the node. With a topology and default plugin capabilities,
    /// the mock also advertises VOLUME_ACCESSIBILITY_CONSTRAINTS.
    pub fn topology(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.topology.insert(key.into(), value.into());
        self
    }

    /// `NodeGetInfo.max_volumes_per_node`; `ControllerPublishVolume` past it answers
    /// RESOURCE_EXHAUSTED.
    pub fn max_volumes_per_node(mut self, max: i64) -> Self {
        self.config.max_volumes_per_node = Some(max);
        self
    }

    /// Total pool capacity in bytes (`GetCapacity`; `CreateVolume` past it answers
    /// RESOURCE_EXHAUSTED).
    pub fn capacity(mut self, bytes: i64) -> Self {
        self.config.capacity_bytes = bytes;
        self
    }

    /// Largest volume in bytes (`CreateVolume` above it answers OUT_OF_RANGE).
    pub fn max_volume_size(mut self, bytes: i64) -> Self {
        self.config.max_volume_bytes = bytes;
        self
    }

    /// Size of a volume created without a capacity range.
    pub fn default_volume_size(mut self, bytes: i64) -> Self {
        self.config.default_volume_bytes = bytes;
        self
    }

    /// Which services the mock offers.
    pub fn role(mut self, role: Role) -> Self {
        self.config.role = role;
        self
    }

    /// The plugin capabilities (replacing the defaults, which follow the role and topology).
    pub fn plugin_capabilities(
        mut self,
        services: impl IntoIterator<Item = PluginService>,
        expansion: Option<VolumeExpansion>,
    ) -> Self {
        self.config.plugin_caps = PluginCapabilities {
            services: services.into_iter().collect(),
            expansion,
        };
        self.plugin_caps_set = true;
        self
    }

    /// Only the volume expansion mode `GetPluginCapabilities` reports (`None`: no mode),
    /// keeping the services.
    pub fn volume_expansion(mut self, expansion: Option<VolumeExpansion>) -> Self {
        self.expansion = Some(expansion);
        self
    }

    /// The controller capabilities (replacing the defaults,
    /// [`CONTROLLER_IMPLEMENTED`]).
    ///
    /// Any capability may be listed, including the v1.12 `VOLUME_CONDITION` the defaults leave
    /// out: with it, `ControllerGetVolume` and `ListVolumes` report each volume's condition
    /// (see [`MockPlugin::set_volume_condition`]). To add it to the defaults:
    ///
    /// ```
    /// use csi_testkit::capabilities::CONTROLLER_IMPLEMENTED;
    /// use csi_testkit::{ControllerCapability, MockPlugin};
    ///
    /// let plugin = MockPlugin::builder()
    ///     .controller_capabilities(
    ///         CONTROLLER_IMPLEMENTED.iter().copied().chain([ControllerCapability::VolumeCondition]),
    ///     )
    ///     .build()
    ///     .unwrap();
    /// assert!(plugin.config().controller_caps.contains(&ControllerCapability::VolumeCondition));
    /// ```
    pub fn controller_capabilities(
        mut self,
        caps: impl IntoIterator<Item = ControllerCapability>,
    ) -> Self {
        self.config.controller_caps = caps.into_iter().collect();
        self
    }

    /// The node capabilities (replacing the defaults,
    /// [`NODE_IMPLEMENTED`]).
    ///
    /// Any capability may be listed, including the v1.12 `VOLUME_CONDITION` the defaults leave
    /// out: with it, `NodeGetVolumeStats` reports the volume's condition (see
    /// [`MockPlugin::set_volume_condition`]), as in
    /// [`controller_capabilities`](Self::controller_capabilities).
    pub fn node_capabilities(mut self, caps: impl IntoIterator<Item = NodeCapability>) -> Self {
        self.config.node_caps = caps.into_iter().collect();
        self
    }

    /// Adds `VOLUME_CONDITION` to the controller and the node capabilities set so far: the
    /// mock then reports the conditions set with [`MockPlugin::set_volume_condition`]
    /// (`ControllerGetVolume`, `ListVolumes`, `NodeGetVolumeStats`).
    pub fn volume_condition(mut self) -> Self {
        self.config
            .controller_caps
            .insert(ControllerCapability::VolumeCondition);
        self.config
            .node_caps
            .insert(NodeCapability::VolumeCondition);
        self
    }

    /// The group controller capabilities (replacing the defaults).
    pub fn group_controller_capabilities(
        mut self,
        caps: impl IntoIterator<Item = GroupControllerCapability>,
    ) -> Self {
        self.config.group_caps = caps.into_iter().collect();
        self
    }

    /// Every capability set at once, from the domain model: plugin services and expansion
    /// (ONLINE wins when both modes are listed), controller, node and group controller sets.
    /// Capability numbers csi-structs does not know are not advertised.
    ///
    /// ```
    /// use csi_structs::capability_set::{Capabilities, ControllerCapabilities, ControllerCapability};
    /// let caps = Capabilities {
    ///     controller: ControllerCapabilities::from_iter([ControllerCapability::CreateDeleteVolume]),
    ///     ..Capabilities::default()
    /// };
    /// let plugin = csi_testkit::MockPlugin::builder().capabilities(&caps).build().unwrap();
    /// assert_eq!(plugin.config().controller_caps.len(), 1);
    /// assert!(plugin.config().node_caps.is_empty());
    /// ```
    pub fn capabilities(self, caps: &csi_structs::capability_set::Capabilities) -> Self {
        use csi_structs::capability_set::VolumeExpansion as Mode;
        let expansion = if caps.plugin.has_expansion(Mode::Online) {
            Some(VolumeExpansion::Online)
        } else if caps.plugin.has_expansion(Mode::Offline) {
            Some(VolumeExpansion::Offline)
        } else {
            None
        };
        self.plugin_capabilities(caps.plugin.services().map(|s| s.wire()), expansion)
            .controller_capabilities(caps.controller.iter().map(|c| c.wire()))
            .node_capabilities(caps.node.iter().map(|c| c.wire()))
            .group_controller_capabilities(caps.group_controller.iter().map(|c| c.wire()))
    }

    /// Switches a quirk on.
    pub fn quirk(mut self, quirk: Quirk) -> Self {
        self.quirks.push(quirk);
        self
    }

    /// A volume that exists from the start (pre-provisioned), with no capability limits.
    pub fn volume(mut self, volume_id: impl Into<String>, capacity_bytes: i64) -> Self {
        self.seeds.push(SeedVolume {
            volume_id: volume_id.into(),
            capacity_bytes,
            volume_context: BTreeMap::new(),
        });
        self
    }

    /// A pre-provisioned volume with full control over its fields.
    pub fn seed_volume(mut self, seed: SeedVolume) -> Self {
        self.seeds.push(seed);
        self
    }

    /// A `mutable_parameters` key `CreateVolume` and `ControllerModifyVolume` accept
    /// (repeatable). Other keys are refused with INVALID_ARGUMENT naming the key, as real
    /// plugins refuse what they cannot change; with none configured, every key is refused.
    ///
    /// ```
    /// let plugin = csi_testkit::MockPlugin::builder()
    ///     .mutable_parameter_key("iops")
    ///     .build()
    ///     .unwrap();
    /// assert!(plugin.config().mutable_parameter_keys.contains("iops"));
    /// ```
    pub fn mutable_parameter_key(mut self, key: impl Into<String>) -> Self {
        self.config.mutable_parameter_keys.insert(key.into());
        self
    }

    /// Plays a plugin that needs a secret (spec §3.6): every call of `rpc` whose `secrets` map
    /// lacks `key`, or holds another value under it, is refused with INVALID_ARGUMENT.
    /// Repeatable: all the requirements of an rpc must hold (a second value for the same key
    /// replaces the first); other rpcs are not affected. [`MockPlugin::require_secret`] and
    /// [`MockPlugin::clear_secret_requirements`] change them while the mock runs.
    ///
    /// INVALID_ARGUMENT is what the spec's general error table (§3.7) gives for a missing or
    /// invalid field, and what the mock answers; plugins that authenticate with the secrets
    /// may answer UNAUTHENTICATED instead (use a [fault script](crate::faults) to play that).
    /// The status message names the rpc and each key that is missing or wrong, never a value;
    /// the refused call is in the [call log](MockPlugin::calls) with that failure.
    ///
    /// Where it sits in the order every call goes through: after the call is recorded, the
    /// concurrency guard (ABORTED), the [fault scripts](crate::faults) (a scripted outcome
    /// wins, as it does over UNIMPLEMENTED; a delay is served first) and the capability check
    /// (UNIMPLEMENTED: a plugin does not look at the secrets of a call it does not serve);
    /// before the rpc's own argument checks.
    ///
    /// Only rpcs whose request has a `secrets` field can be given a requirement
    /// ([`takes_secrets`](crate::secrets::takes_secrets)); for any other rpc, or a key that is
    /// not a valid secret name, [`build`](Self::build) fails with
    /// [`ConfigError::SecretRequirement`] naming the rpc.
    ///
    /// ```
    /// use csi_proto::Rpc;
    /// use csi_proto::v1::DeleteVolumeRequest;
    /// use csi_proto::v1::controller_client::ControllerClient;
    /// use csi_testkit::MockPlugin;
    /// use tonic::Code;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let plugin = MockPlugin::builder()
    ///     .volume("vol-1", 1 << 30)
    ///     .require_secret(Rpc::DeleteVolume, "token", "t0k3n")
    ///     .build()?;
    /// let (server, channel) = plugin.serve_in_memory().await?;
    /// let mut controller = ControllerClient::new(channel);
    ///
    /// let mut request = DeleteVolumeRequest { volume_id: "vol-1".into(), ..Default::default() };
    /// let refused = controller.delete_volume(request.clone()).await.unwrap_err();
    /// assert_eq!(refused.code(), Code::InvalidArgument);
    /// assert_eq!(refused.message(), r#"DeleteVolume: missing secret "token""#);
    ///
    /// request.secrets.insert("token".into(), "t0k3n".into());
    /// controller.delete_volume(request).await?;
    ///
    /// // A requirement no call could meet is refused when the mock is built.
    /// let err = MockPlugin::builder()
    ///     .require_secret(Rpc::NodeUnpublishVolume, "token", "t0k3n")
    ///     .build()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("NodeUnpublishVolume"));
    /// server.shutdown().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn require_secret(
        mut self,
        rpc: Rpc,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        if let Ok(required) = &mut self.required_secrets
            && let Err(err) = required.require(rpc, key.into(), value.into())
        {
            self.required_secrets = Err(err);
        }
        self
    }

    /// Keeps the storage state (volumes, snapshots, group snapshots, controller publications,
    /// stagings and node publications) in this file, so that it survives a restart: read by
    /// [`build`](Self::build) if it exists, written atomically (mode 0600) after every call
    /// that changed the state. Id numbering continues where it stopped. Pre-provisioned volumes
    /// ([`volume`](Self::volume)) the file does not have are added.
    ///
    /// A file that cannot be read or understood makes `build` fail with
    /// [`ConfigError::StateFile`] naming it; it is never silently replaced.
    pub fn state_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.state_file = Some(path.into());
        self
    }

    /// Puts `tag` into every id the mock makes (`vol-<tag>-1`, `snap-<tag>-2`), so that two
    /// runs without a shared [state file](Self::state_file) never hand out the same id
    /// (`csi-mock-plugin` tags with its start time). 1 to 32 ASCII letters, digits or `-`.
    ///
    /// ```
    /// let plugin = csi_testkit::MockPlugin::builder().id_tag("run7").build().unwrap();
    /// # let _ = plugin;
    /// ```
    pub fn id_tag(mut self, tag: impl Into<String>) -> Self {
        self.id_tag = Some(tag.into());
        self
    }

    /// Keep at most `limit` call records, dropping the oldest first (for long runs: the log
    /// of a mock that keeps every call grows with every call). 0 keeps no record at all; the
    /// calls are still counted ([`Calls::stats`](crate::Calls::stats)). Without this the
    /// library keeps every record; `csi-mock-plugin` keeps 10,000 unless told otherwise.
    ///
    /// ```
    /// let plugin = csi_testkit::MockPlugin::builder().call_log_limit(100).build().unwrap();
    /// assert_eq!(plugin.calls().stats().limit, Some(100));
    /// ```
    pub fn call_log_limit(mut self, limit: usize) -> Self {
        self.config.call_log_limit = Some(limit);
        self
    }

    /// Checks the configuration and builds the plugin.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the setting that breaks a spec limit.
    pub fn build(mut self) -> Result<MockPlugin, ConfigError> {
        if !self.plugin_caps_set {
            self.config.plugin_caps = capabilities::default_plugin_caps(
                self.config.role,
                !self.config.topology.is_empty(),
            );
        }
        if let Some(expansion) = self.expansion {
            self.config.plugin_caps.expansion = expansion;
        }
        validate(&self.config)?;
        if let Some(tag) = &self.id_tag {
            check_id_tag(tag)?;
        }
        let required_secrets = self.required_secrets?;
        let mut quirks = Quirks::default();
        for quirk in self.quirks {
            quirks.set(quirk);
        }
        let (state, state_file) = match self.state_file {
            None => (State::default(), None),
            Some(path) => {
                let node = &self.config.node_id;
                let loaded = persist::load(&path, node)?;
                let last = loaded
                    .as_ref()
                    .map(|state| persist::encode(state, node))
                    .unwrap_or_default();
                let file = StateFile {
                    path,
                    last: Mutex::new(last),
                };
                (loaded.unwrap_or_default(), Some(file))
            }
        };
        let state = State::with_seeds(state, self.seeds, self.id_tag);
        let shared = Shared::new(self.config, quirks, required_secrets, state, state_file);
        Ok(MockPlugin::from_shared(Arc::new(shared)))
    }
}

fn validate(config: &Config) -> Result<(), ConfigError> {
    check_plugin_name(&config.name)?;
    check_node_id(&config.node_id)?;
    for (field, value) in [
        ("capacity", config.capacity_bytes),
        ("max volume size", config.max_volume_bytes),
        ("default volume size", config.default_volume_bytes),
        (
            "max volumes per node",
            config.max_volumes_per_node.unwrap_or(0),
        ),
    ] {
        if value < 0 {
            return Err(ConfigError::Negative { field, value });
        }
    }
    if config.default_volume_bytes > config.max_volume_bytes {
        return Err(ConfigError::DefaultAboveMax {
            default: config.default_volume_bytes,
            max: config.max_volume_bytes,
        });
    }
    for key in &config.mutable_parameter_keys {
        if key.is_empty() || key.len() > MAX_STRING_BYTES {
            return Err(ConfigError::InvalidMutableParameterKey {
                key: key.clone(),
                len: key.len(),
                limit: MAX_STRING_BYTES,
            });
        }
    }
    for (key, value) in &config.topology {
        for (part, text) in [("key", key), ("value", value)] {
            if text.is_empty() || text.chars().count() > MAX_NAME_CHARS {
                return Err(ConfigError::InvalidTopology {
                    part,
                    text: text.clone(),
                });
            }
        }
    }
    Ok(())
}

/// A node id `NodeGetInfo` may report: 1 to 256 bytes.
pub(crate) fn check_node_id(node_id: &str) -> Result<(), ConfigError> {
    if node_id.is_empty() || node_id.len() > MAX_PLUGIN_NODE_ID_BYTES {
        return Err(ConfigError::InvalidNodeId {
            len: node_id.len(),
            limit: MAX_PLUGIN_NODE_ID_BYTES,
        });
    }
    Ok(())
}

/// The longest [`MockPluginBuilder::id_tag`]: ids stay far below the spec's 128 bytes.
const MAX_ID_TAG_BYTES: usize = 32;

fn check_id_tag(tag: &str) -> Result<(), ConfigError> {
    let valid = !tag.is_empty()
        && tag.len() <= MAX_ID_TAG_BYTES
        && tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if valid {
        Ok(())
    } else {
        Err(ConfigError::InvalidIdTag {
            tag: tag.to_string(),
            limit: MAX_ID_TAG_BYTES,
        })
    }
}

/// The plugin name rule is csi-structs' ([`PluginName::new`](csi_structs::PluginName::new)).
fn check_plugin_name(name: &str) -> Result<(), ConfigError> {
    csi_structs::PluginName::new(name)
        .map(drop)
        .map_err(|reason| ConfigError::InvalidName {
            name: name.to_string(),
            reason,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_names_and_node_ids() {
        assert!(matches!(
            MockPluginBuilder::default().name("-bad", "1").build(),
            Err(ConfigError::InvalidName { .. })
        ));
        let long = MockPluginBuilder::default()
            .name("a".repeat(64), "1")
            .build();
        assert!(matches!(long, Err(ConfigError::InvalidName { .. })));
        let text = long.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("64") && text.contains("63"), "{text}");
        assert!(matches!(
            MockPluginBuilder::default().node_id("").build(),
            Err(ConfigError::InvalidNodeId { len: 0, .. })
        ));
        assert!(matches!(
            MockPluginBuilder::default()
                .max_volumes_per_node(-1)
                .build(),
            Err(ConfigError::Negative { .. })
        ));
    }

    #[test]
    fn expansion_override_keeps_services() {
        let plugin = MockPluginBuilder::default()
            .volume_expansion(Some(VolumeExpansion::Offline))
            .build()
            .unwrap();
        let caps = &plugin.config().plugin_caps;
        assert_eq!(caps.expansion, Some(VolumeExpansion::Offline));
        assert!(caps.services.contains(&PluginService::ControllerService));
    }

    #[test]
    fn node_role_drops_controller_service_by_default() {
        let plugin = MockPluginBuilder::default()
            .role(Role::Node)
            .build()
            .unwrap();
        let caps = &plugin.config().plugin_caps.services;
        assert!(!caps.contains(&PluginService::ControllerService));
        let plugin = MockPluginBuilder::default()
            .topology("zone", "a")
            .build()
            .unwrap();
        assert!(
            plugin
                .config()
                .plugin_caps
                .services
                .contains(&PluginService::VolumeAccessibilityConstraints)
        );
    }
}
