//! The mock plugin: its shared state behind one lock, and the public handle.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use csi_proto::Rpc;
use csi_proto::v1::Volume;
use tokio::sync::{Notify, watch};

use crate::calls::{CallLog, Calls};
use crate::capabilities::unimplemented_reason;
use crate::config::{Config, ConfigError, MockPluginBuilder, check_node_id};
use crate::faults::{FaultTable, Faults};
use crate::quirks::{Quirk, Quirks};
use crate::secrets::{SecretRequirementError, SecretRequirements};
use crate::state::State;
use crate::state::persist::{self, StateFileError};

/// Everything that changes while the mock runs. One lock for all of it; every critical section
/// is short and synchronous (never held across an `.await`).
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) state: State,
    pub(crate) calls: CallLog,
    pub(crate) faults: FaultTable,
    pub(crate) quirks: Quirks,
    /// Keys (`volume:<id>`, `snapshot:<id>`, …) of mutating calls being served right now.
    pub(crate) in_flight: HashSet<String>,
    /// Volume conditions set by the test, by the plugin's volume id (not saved with the state).
    pub(crate) conditions: BTreeMap<String, csi_proto::v1::VolumeCondition>,
    /// The secrets calls must carry (never saved with the state).
    pub(crate) required_secrets: SecretRequirements,
    /// The further nodes this storage model is served as ([`MockPlugin::as_node`]);
    /// `ControllerPublishVolume` accepts them.
    pub(crate) served_nodes: BTreeSet<String>,
}

impl Inner {
    /// What the plugin reports as `volume_condition` of `volume_id`: nothing when
    /// `advertised` (the controller's or the node's `VOLUME_CONDITION`) is false or
    /// [`Quirk::NoVolumeCondition`] is on, else the condition set for it, normal (`abnormal:
    /// false`, empty message) when none is.
    pub(crate) fn volume_condition(
        &self,
        advertised: bool,
        volume_id: &str,
    ) -> Option<csi_proto::v1::VolumeCondition> {
        (advertised && !self.quirks.no_volume_condition)
            .then(|| self.conditions.get(volume_id).cloned().unwrap_or_default())
    }
}

/// What every handle of one plugin shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    /// Why each rpc the configuration does not offer is refused (UNIMPLEMENTED), worked out
    /// once: the configuration never changes, and a call should not rebuild the capability
    /// sets to find out.
    refusals: BTreeMap<Rpc, String>,
    /// Where the state is saved after every call that changed it, if anywhere.
    state_file: Option<StateFile>,
    inner: Mutex<Inner>,
    /// Woken whenever a call is recorded or finishes.
    pub(crate) log_changed: Notify,
    /// Woken to end hung and delayed calls (shutdown, `Faults::release_hung`).
    pub(crate) release: Notify,
    /// How many times held calls were resumed (`Faults::resume_held`): a held call waits
    /// until it grows past what it was when the call was recorded.
    pub(crate) resume: watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn new(
        config: Config,
        quirks: Quirks,
        required_secrets: SecretRequirements,
        state: State,
        state_file: Option<StateFile>,
    ) -> Self {
        let calls = CallLog::new(config.call_log_limit);
        let refusals = Rpc::ALL
            .iter()
            .filter_map(|&rpc| unimplemented_reason(&config, rpc).map(|why| (rpc, why)))
            .collect();
        Shared {
            config,
            refusals,
            state_file,
            inner: Mutex::new(Inner {
                state,
                calls,
                faults: FaultTable::default(),
                quirks,
                in_flight: HashSet::new(),
                conditions: BTreeMap::new(),
                required_secrets,
                served_nodes: BTreeSet::new(),
            }),
            log_changed: Notify::new(),
            release: Notify::new(),
            resume: watch::channel(0).0,
        }
    }

    /// Why `rpc` is refused as UNIMPLEMENTED under this configuration, if it is.
    pub(crate) fn refusal(&self, rpc: Rpc) -> Option<&str> {
        self.refusals.get(&rpc).map(String::as_str)
    }

    /// Saves the state to the state file if it changed since the last save. Writers queue on
    /// the file's own lock (taken before the state's), so saves land in the order their
    /// snapshots were taken.
    pub(crate) fn save_state(&self) -> Result<(), StateFileError> {
        let Some(file) = &self.state_file else {
            return Ok(());
        };
        let mut last = file.last.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = persist::encode(&self.lock().state, &self.config.node_id);
        if *last == bytes {
            return Ok(());
        }
        persist::write_atomically(&file.path, &bytes)?;
        *last = bytes;
        Ok(())
    }

    /// Locks the state. A panic while holding the lock cannot leave it half-updated in a way
    /// that matters to a test double, so a poisoned lock is simply taken over.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The state file and what was last written to it.
#[derive(Debug)]
pub(crate) struct StateFile {
    pub(crate) path: PathBuf,
    /// The bytes last written (or read at start-up); a save that would write the same is
    /// skipped.
    pub(crate) last: Mutex<Vec<u8>>,
}

/// A stateful mock CSI plugin. Cheap to clone: clones share state, call log and faults.
///
/// Build one with [`MockPlugin::builder`], serve it with
/// [`serve_unix`](MockPlugin::serve_unix) or [`serve_in_memory`](MockPlugin::serve_in_memory),
/// script faults with [`faults`](MockPlugin::faults) and read the call log with
/// [`calls`](MockPlugin::calls). [`as_node`](MockPlugin::as_node) serves the same storage as
/// the plugin's instance on another node.
#[derive(Clone)]
pub struct MockPlugin {
    pub(crate) shared: Arc<Shared>,
    /// The node this handle answers as (`NodeGetInfo`, and where its node calls stage and
    /// publish).
    node: Arc<str>,
}

impl fmt::Debug for MockPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockPlugin")
            .field("name", &self.shared.config.name)
            .field("node_id", &self.node)
            .field("role", &self.shared.config.role)
            .finish_non_exhaustive()
    }
}

/// Where a volume is staged or published on a node of the mock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePath {
    /// The volume.
    pub volume_id: String,
    /// The staging or target path.
    pub path: PathBuf,
}

impl MockPlugin {
    /// A builder with every default (see [`MockPluginBuilder`]).
    pub fn builder() -> MockPluginBuilder {
        MockPluginBuilder::default()
    }

    pub(crate) fn from_shared(shared: Arc<Shared>) -> Self {
        let node = Arc::from(shared.config.node_id.as_str());
        MockPlugin { shared, node }
    }

    /// The configuration the plugin was built with. Its `node_id` is the first node's; a
    /// handle from [`as_node`](Self::as_node) answers as [`node_id`](Self::node_id).
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The node this handle answers as: the one `NodeGetInfo` reports and where its node
    /// calls stage and publish. The configured [`Config::node_id`], unless the handle came
    /// from [`as_node`](Self::as_node).
    pub fn node_id(&self) -> &str {
        &self.node
    }

    /// The same storage served as the plugin's instance on another node, `node_id`: the
    /// handle shares this plugin's volumes, snapshots, controller publications, call log,
    /// faults and quirks, and answers as `node_id`: `NodeGetInfo` reports it, its node calls
    /// stage and publish on that node (each node has staging and target paths of its own, and
    /// the spec's rules of one node apply per node), and the call log names it for them.
    /// From now on `ControllerPublishVolume` accepts `node_id` through any handle, and
    /// refuses to publish a `SINGLE_NODE_*` volume to it while another node has it (and the
    /// reverse) with FAILED_PRECONDITION, as a plugin with one backend for many hosts does.
    ///
    /// Serve the handle on a socket of its own ([`serve_unix`](Self::serve_unix)) to stand
    /// for the plugin on a second host; its Controller service is the same controller.
    /// `as_node` with the handle's own node id gives a handle like this one.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidNodeId`] for an empty id or one over 256 bytes.
    ///
    /// ```
    /// use csi_testkit::MockPlugin;
    ///
    /// let plugin = MockPlugin::builder().volume("vol-a", 1 << 30).build().unwrap();
    /// let second = plugin.as_node("node-2").unwrap();
    /// assert_eq!(plugin.node_id(), "node-1");
    /// assert_eq!(second.node_id(), "node-2");
    /// assert_eq!(second.volumes().len(), 1); // one storage model: the same volumes
    /// ```
    pub fn as_node(&self, node_id: impl Into<String>) -> Result<MockPlugin, ConfigError> {
        let node_id = node_id.into();
        check_node_id(&node_id)?;
        if node_id != self.shared.config.node_id {
            self.shared.lock().served_nodes.insert(node_id.clone());
        }
        Ok(MockPlugin {
            shared: Arc::clone(&self.shared),
            node: Arc::from(node_id.as_str()),
        })
    }

    /// Whether `ControllerPublishVolume` knows `node_id`: the configured node, one of
    /// [`Config::other_nodes`], or a node this storage is served as.
    pub(crate) fn knows_node(&self, inner: &Inner, node_id: &str) -> bool {
        let config = self.config();
        node_id == config.node_id
            || config.other_nodes.contains(node_id)
            || inner.served_nodes.contains(node_id)
    }

    /// The call log.
    pub fn calls(&self) -> Calls {
        Calls::new(self.shared.clone())
    }

    /// The fault scripts.
    pub fn faults(&self) -> Faults {
        Faults::new(self.shared.clone())
    }

    /// Switches a quirk on while the plugin runs. ([`Quirk::LateSocket`] only matters before
    /// the server starts.)
    pub fn set_quirk(&self, quirk: Quirk) {
        self.shared.lock().quirks.set(quirk);
    }

    /// Switches every quirk off.
    pub fn clear_quirks(&self) {
        self.shared.lock().quirks = Quirks::default();
    }

    /// While the plugin runs, as [`MockPluginBuilder::require_secret`]: from the next call on,
    /// a call of `rpc` whose `secrets` lack `key` with exactly `value` is refused with
    /// INVALID_ARGUMENT. Adds to the requirements set so far (a new value for a key already
    /// required replaces the old one).
    ///
    /// ```
    /// use csi_proto::Rpc;
    ///
    /// let plugin = csi_testkit::MockPlugin::builder().build()?;
    /// plugin.require_secret(Rpc::NodePublishVolume, "token", "t0k3n")?;
    /// assert!(plugin.require_secret(Rpc::NodeUnpublishVolume, "token", "t0k3n").is_err());
    /// plugin.clear_secret_requirements();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SecretRequirementError::NoSecretsField`] when `rpc`'s request has no `secrets` field
    /// ([`takes_secrets`](crate::secrets::takes_secrets)), and
    /// [`SecretRequirementError::Invalid`] for a key that is not a valid secret name; the
    /// requirements are then unchanged.
    pub fn require_secret(
        &self,
        rpc: Rpc,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<(), SecretRequirementError> {
        self.shared
            .lock()
            .required_secrets
            .require(rpc, key.into(), value.into())
    }

    /// Drops every secret requirement (those of the builder too): from the next call on, no
    /// call is refused for its secrets.
    pub fn clear_secret_requirements(&self) {
        self.shared.lock().required_secrets = SecretRequirements::default();
    }

    /// Every volume the plugin knows, ordered by id.
    pub fn volumes(&self) -> Vec<Volume> {
        let inner = self.shared.lock();
        inner.state.volumes.values().map(|v| v.to_wire()).collect()
    }

    /// The nodes a volume is controller-published to.
    pub fn published_nodes(&self, volume_id: &str) -> Vec<String> {
        self.shared.lock().state.published_nodes(volume_id)
    }

    /// Where volumes are staged on this handle's node ([`node_id`](Self::node_id)), ordered by
    /// path.
    pub fn staged(&self) -> Vec<NodePath> {
        let inner = self.shared.lock();
        inner
            .state
            .staged
            .iter()
            .filter(|((node, _), _)| **node == *self.node)
            .map(|((_, path), s)| NodePath {
                volume_id: s.volume_id.clone(),
                path: PathBuf::from(path),
            })
            .collect()
    }

    /// Where volumes are published on this handle's node ([`node_id`](Self::node_id)), ordered
    /// by path.
    pub fn published(&self) -> Vec<NodePath> {
        let inner = self.shared.lock();
        inner
            .state
            .published
            .iter()
            .filter(|((node, _), _)| **node == *self.node)
            .map(|((_, path), p)| NodePath {
                volume_id: p.volume_id.clone(),
                path: PathBuf::from(path),
            })
            .collect()
    }

    /// The ids of every snapshot, ordered.
    pub fn snapshot_ids(&self) -> Vec<String> {
        self.shared.lock().state.snapshots.keys().cloned().collect()
    }

    /// Sets the condition of volume `volume_id` (the plugin's own id, as `CreateVolume`
    /// returned it): from the next call on, the plugin reports `abnormal` and `message` as the
    /// volume's `VolumeCondition` wherever it advertises `VOLUME_CONDITION` (a v1.12 capability
    /// the default mock does not advertise; opt in with
    /// [`MockPluginBuilder::controller_capabilities`](crate::MockPluginBuilder::controller_capabilities)
    /// and [`node_capabilities`](crate::MockPluginBuilder::node_capabilities)):
    ///
    /// - controller `VOLUME_CONDITION`: `ControllerGetVolume`'s `status.volume_condition`
    ///   and, in `ListVolumes`, each entry's `status.volume_condition`;
    /// - node `VOLUME_CONDITION`: `NodeGetVolumeStats`' `volume_condition`.
    ///
    /// A volume with no condition set is reported normal there (`abnormal: false`, empty
    /// message); without the capability (or with [`Quirk::NoVolumeCondition`]) nothing is
    /// reported, whatever is set. Works while the plugin is serving, for any id (also one the
    /// plugin does not know yet, e.g. on a node-only mock); setting it again replaces it.
    /// Conditions are not saved in the [state file](crate::MockPluginBuilder::state_file). The
    /// control socket's `condition` command does the same from outside the process.
    ///
    /// ```
    /// use csi_proto::v1::controller_client::ControllerClient;
    /// use csi_proto::v1::{ControllerGetVolumeRequest, VolumeCondition};
    /// use csi_testkit::capabilities::CONTROLLER_IMPLEMENTED;
    /// use csi_testkit::{ControllerCapability, MockPlugin};
    /// use tonic::transport::Channel;
    ///
    /// async fn condition(channel: &Channel) -> Result<Option<VolumeCondition>, tonic::Status> {
    ///     let request = ControllerGetVolumeRequest { volume_id: "vol-a".into() };
    ///     let answer = ControllerClient::new(channel.clone()).controller_get_volume(request).await?;
    ///     Ok(answer.into_inner().status.and_then(|status| status.volume_condition))
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let plugin = MockPlugin::builder()
    ///     .controller_capabilities(
    ///         CONTROLLER_IMPLEMENTED.iter().copied().chain([ControllerCapability::VolumeCondition]),
    ///     )
    ///     .volume("vol-a", 1 << 30)
    ///     .build()?;
    /// let (server, channel) = plugin.serve_in_memory().await?;
    /// let normal = VolumeCondition { abnormal: false, message: String::new() };
    /// assert_eq!(condition(&channel).await?, Some(normal.clone()));
    ///
    /// plugin.set_volume_condition("vol-a", true, "disk detached");
    /// let detached = VolumeCondition { abnormal: true, message: "disk detached".into() };
    /// assert_eq!(condition(&channel).await?, Some(detached));
    ///
    /// plugin.clear_volume_condition("vol-a");
    /// assert_eq!(condition(&channel).await?, Some(normal));
    /// server.shutdown().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_volume_condition(&self, volume_id: &str, abnormal: bool, message: &str) {
        self.shared.lock().conditions.insert(
            volume_id.to_owned(),
            csi_proto::v1::VolumeCondition {
                abnormal,
                message: message.to_owned(),
            },
        );
    }

    /// Forgets the condition set for volume `volume_id` with
    /// [`set_volume_condition`](Self::set_volume_condition): from the next call on, the plugin
    /// reports the volume normal (`abnormal: false`, empty message) where it advertises
    /// `VOLUME_CONDITION`. Clearing a volume with no condition set does nothing.
    pub fn clear_volume_condition(&self, volume_id: &str) {
        self.shared.lock().conditions.remove(volume_id);
    }
}
