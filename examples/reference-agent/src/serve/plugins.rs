//! The agent's plugins: the control plane's plugin manager (csi-node's [`PluginManager`]) fed
//! by a [`DirWatcher`] over the plugin directory (`<plugin-id>.sock` sockets), with the
//! agent's clients ([`client_customizer`]: the `call_timeout` cap and the metrics layers) and
//! csi-node's `LogEvents`, which logs each transition.

use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use csi_client::{CallsInFlight, CsiClient, Fingerprint};
use csi_node::detach::NodeDetachPolicy;
use csi_node::plugins::{
    ClientCustomizer, DirWatcher, PluginManager, PluginManagerConfig, PluginStatus,
    RegistrationSource,
};
use csi_structs::{NodeId, PluginId};

use crate::metrics::Metrics;
use crate::ops::api::{PeerPlugin, PluginView};

/// How often the registry does what, and how long its calls may take.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// Probe interval of each plugin.
    pub health_interval: Duration,
    /// Delay between failed first fingerprints.
    pub retry_interval: Duration,
    /// Bound of every plugin call.
    pub call_timeout: Duration,
    /// Interval of the periodic fingerprint.
    pub fingerprint_interval: Duration,
    /// Socket wait, attempts and deadlines of node detach calls (within `call_timeout`).
    pub node_detach: NodeDetachPolicy,
}

impl Timings {
    /// The plugin manager's settings.
    pub fn manager_config(&self) -> PluginManagerConfig {
        PluginManagerConfig {
            health_interval: self.health_interval,
            retry_interval: self.retry_interval,
            fingerprint_interval: self.fingerprint_interval,
            node_detach: self.node_detach,
        }
    }
}

/// The agent's plugin clients: every call bounded by `limit` (on top of csi-client's per-RPC
/// deadlines, which it can only shorten) and counted in `metrics`.
pub fn client_customizer(limit: Duration, metrics: Metrics) -> ClientCustomizer {
    Arc::new(move |id, builder| {
        let mut policies = csi_client::PolicyTable::default();
        policies.update_all(|_, p| {
            p.total_budget = p.total_budget.min(limit);
            p.attempt_deadline = p.attempt_deadline.min(limit);
        });
        metrics.instrument(id, builder.policies(policies))
    })
}

/// The local plugins. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Plugins {
    me: NodeId,
    manager: PluginManager,
    watcher: Arc<DirWatcher>,
    /// Every plugin call in flight, of every local plugin.
    calls: Arc<CallsInFlight>,
}

impl Plugins {
    /// The plugins of node `me`: `manager` (the control plane's), fed from the sockets in
    /// `dir`; `calls` lists the calls of every client `manager` built.
    pub fn new(
        me: NodeId,
        manager: PluginManager,
        dir: PathBuf,
        calls: Arc<CallsInFlight>,
    ) -> Self {
        let watcher = Arc::new(DirWatcher::new(manager.clone(), dir));
        Self {
            me,
            manager,
            watcher,
            calls,
        }
    }

    /// Deregisters the registrations of an earlier run that no watcher checks: every one but
    /// the plugin directory's (its first scan checks those); kubelet's registration directory
    /// is scanned again from the start. Writes the registrations' file: call it off the
    /// runtime's workers.
    pub fn forget_unwatched(&self) {
        for status in self.manager.list() {
            let watched = matches!(&status.source, RegistrationSource::Directory { socket, .. }
                if socket.parent() == Some(self.watcher.dir()));
            if !watched && let Err(e) = self.manager.deregister(status.registration) {
                tracing::warn!(plugin = %status.plugin, error = %e, "cannot drop a registration of the previous run");
            }
        }
    }

    /// Every call in flight to a local plugin: what it waits on and since when.
    pub fn calls_in_flight(&self) -> &Arc<CallsInFlight> {
        &self.calls
    }

    /// The plugin manager underneath.
    pub fn manager(&self) -> &PluginManager {
        &self.manager
    }

    /// The client of a fingerprinted local plugin, with its fingerprint.
    pub fn client(&self, plugin: &PluginId) -> Option<(CsiClient, Arc<Fingerprint>)> {
        self.manager
            .get(plugin)
            .map(|ready| (ready.client, ready.fingerprint))
    }

    /// The client for node detach calls (`NodeUnpublishVolume`, `NodeUnstageVolume`) of a
    /// registered local plugin, fingerprinted or not and whatever its health (release steps
    /// are never gated on health): the agent's [`NodeDetachPolicy`], so a plugin whose socket
    /// is stale or gone fails the call after about one socket wait instead of minutes.
    pub fn detach_client(&self, plugin: &PluginId) -> Option<CsiClient> {
        self.manager.detach_client(plugin)
    }

    /// Every local plugin, for the control API.
    pub fn views(&self) -> Vec<PluginView> {
        self.manager
            .list()
            .iter()
            .map(|status| self.view(status))
            .collect()
    }

    fn view(&self, s: &PluginStatus) -> PluginView {
        let fp = s.fingerprint.as_deref();
        let health_reason = match &s.health {
            csi_node::plugins::Health::Unhealthy(why) => Some(why.to_string()),
            _ => None,
        };
        PluginView {
            id: s.plugin.to_string(),
            node: self.me.to_string(),
            socket: match &s.source {
                RegistrationSource::Directory { socket, .. } => Some(socket.display().to_string()),
                RegistrationSource::Pushed => {
                    s.endpoint.unix_path().map(|p| p.display().to_string())
                }
            },
            health: s.health.name().into(),
            health_reason,
            name: fp.map(|f| f.plugin.name.as_str().to_owned()),
            version: fp.map(|f| f.plugin.vendor_version.clone()),
            controller: fp.is_some_and(|f| f.capabilities.plugin.has_controller_service()),
            node_service: fp.is_some_and(Fingerprint::serves_node),
            plugin_node: fp
                .and_then(|f| f.node.as_ref())
                .map(|n| n.node_id.to_string()),
            controller_publish: fp.is_some_and(|f| {
                f.capabilities
                    .lifecycle_requires(csi_client::Rpc::ControllerPublishVolume)
            }),
            staging: fp.is_some_and(|f| f.capabilities.node.requires_staging()),
            fingerprints: s.fingerprints,
            last_error: s.last_error.as_ref().map(|e| e.to_string()),
            in_use: 0,
            capabilities: fp.map(|f| f.capabilities.advertised()).unwrap_or_default(),
            max_volumes: fp
                .and_then(|f| f.node.as_ref()?.max_volumes)
                .map(NonZeroU64::get),
            topology: fp
                .and_then(|f| f.node.as_ref()?.topology.as_ref())
                .map(|t| t.as_map().clone()),
        }
    }

    /// The plugin directory's entries the last scan passed over, `<path>: <why>`.
    pub fn ignored(&self) -> Vec<String> {
        let ignored = self.watcher.ignored().into_iter();
        ignored
            .map(|(path, why)| format!("{}: {why}", path.display()))
            .collect()
    }

    /// What peers learn about this node's plugins.
    pub fn peer_view(&self) -> Vec<PeerPlugin> {
        PeerPlugin::of_node(&self.manager)
    }

    /// Scans the plugin directory until `stop` is set, every `interval`, then stops every
    /// plugin's task.
    pub async fn run(self, interval: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        let stop = async move {
            let _ = stop.changed().await;
        };
        self.watcher.run(interval, stop).await;
    }

    /// One scan: add new sockets, drop vanished ones, restart recreated ones.
    pub fn scan(&self) {
        self.watcher.scan();
    }
}
