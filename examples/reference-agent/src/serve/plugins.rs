//! The dynamic plugin registry: a plugin directory scanned on an interval for
//! `<plugin-id>.sock` sockets; each socket that appears is fingerprinted (retried until it
//! answers) and then probed by csi-client's health watcher; every transition is logged and
//! fed to the shim's [`Registry`]. A socket that disappears removes its plugin; a socket
//! recreated (a new inode at the same path) starts over with a fresh client and fingerprint.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use csi_claims::driver::ClaimsHandle;
use csi_client::{CsiClient, Endpoint, Fingerprint, HealthReason, HealthState};
use csi_rpc_shim::{Health, Instance, Registry, ServiceKind};
use csi_structs::{NodeId, PluginId};
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::ops::api::{PeerPlugin, PluginView};
use csi_node::detach::NodeDetachPolicy;

/// One local plugin.
#[derive(Debug)]
struct Entry {
    socket: PathBuf,
    inode: u64,
    client: CsiClient,
    /// The same plugin for node detach calls, under the [`NodeDetachPolicy`]: its own
    /// connection (dialled on the first detach) with the short socket wait.
    detach: CsiClient,
    fingerprint: Option<Fingerprint>,
    health: Option<HealthState>,
    health_reason: Option<String>,
    last_error: Option<String>,
    task: JoinHandle<()>,
}

/// Fingerprints per plugin id, kept across sockets (how often each was fingerprinted).
type Counts = BTreeMap<PluginId, u64>;

#[derive(Debug, Default)]
struct Table {
    entries: BTreeMap<PluginId, Entry>,
    fingerprints: Counts,
    /// Socket names that are not valid plugin ids, already warned about.
    ignored: std::collections::BTreeSet<String>,
}

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

/// The local plugins. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Plugins {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    me: NodeId,
    dir: PathBuf,
    registry: Arc<Registry>,
    metrics: Metrics,
    health_interval: Duration,
    retry_interval: Duration,
    call_timeout: Duration,
    fingerprint_interval: Duration,
    node_detach: NodeDetachPolicy,
    table: Mutex<Table>,
    claims: OnceLock<ClaimsHandle>,
}

fn health_name(h: Option<HealthState>) -> &'static str {
    match h {
        Some(HealthState::Healthy) => "healthy",
        Some(HealthState::NotReady) => "not_ready",
        Some(HealthState::Unhealthy) => "unhealthy",
        None => "unknown",
    }
}

impl Plugins {
    /// A registry over `dir` for node `me`. Every plugin call is bounded by `call_timeout`
    /// (on top of csi-client's per-RPC deadlines, which it can only shorten); a fingerprinted
    /// plugin is fingerprinted again every `fingerprint_interval` and a change is logged and
    /// published.
    pub fn new(
        me: NodeId,
        dir: PathBuf,
        registry: Arc<Registry>,
        metrics: Metrics,
        timings: Timings,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                me,
                dir,
                registry,
                metrics,
                health_interval: timings.health_interval,
                retry_interval: timings.retry_interval,
                call_timeout: timings.call_timeout,
                fingerprint_interval: timings.fingerprint_interval,
                node_detach: timings.node_detach,
                table: Mutex::new(Table::default()),
                claims: OnceLock::new(),
            }),
        }
    }

    /// Lets the registry wake stuck releases when a plugin becomes healthy.
    pub fn set_claims(&self, claims: ClaimsHandle) {
        let _ = self.inner.claims.set(claims);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The client of a fingerprinted local plugin, with its fingerprint.
    pub fn client(&self, plugin: &PluginId) -> Option<(CsiClient, Fingerprint)> {
        let t = self.table();
        let e = t.entries.get(plugin)?;
        Some((e.client.clone(), e.fingerprint.clone()?))
    }

    /// The client for node detach calls (`NodeUnpublishVolume`, `NodeUnstageVolume`) of a
    /// fingerprinted local plugin: the agent's [`NodeDetachPolicy`], so a plugin whose socket
    /// is stale or gone fails the call after about one socket wait instead of minutes.
    pub fn detach_client(&self, plugin: &PluginId) -> Option<CsiClient> {
        let t = self.table();
        let e = t.entries.get(plugin)?;
        e.fingerprint.as_ref()?;
        Some(e.detach.clone())
    }

    /// Whether `plugin`'s `service` is here and healthy, for the shim.
    pub fn status(&self, plugin: &PluginId, service: ServiceKind) -> csi_rpc_shim::LocalStatus {
        use csi_rpc_shim::LocalStatus;
        let t = self.table();
        let Some(e) = t.entries.get(plugin) else {
            return LocalStatus::Missing;
        };
        let Some(fp) = &e.fingerprint else {
            return LocalStatus::Unhealthy {
                reason: "not fingerprinted yet".into(),
            };
        };
        let offered = match service {
            ServiceKind::Controller => fp.capabilities.plugin.has_controller_service(),
            ServiceKind::Node => fp.serves_node(),
        };
        if !offered {
            return LocalStatus::Missing;
        }
        match e.health {
            Some(HealthState::Unhealthy) | Some(HealthState::NotReady) => LocalStatus::Unhealthy {
                reason: e
                    .health_reason
                    .clone()
                    .unwrap_or_else(|| health_name(e.health).into()),
            },
            _ => LocalStatus::Healthy,
        }
    }

    /// Every local plugin, for the control API.
    pub fn views(&self) -> Vec<PluginView> {
        let t = self.table();
        t.entries
            .iter()
            .map(|(id, e)| {
                let fp = e.fingerprint.as_ref();
                PluginView {
                    id: id.to_string(),
                    node: self.inner.me.to_string(),
                    socket: Some(e.socket.display().to_string()),
                    health: health_name(e.health).into(),
                    health_reason: e.health_reason.clone(),
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
                    fingerprints: t.fingerprints.get(id).copied().unwrap_or(0),
                    last_error: e.last_error.clone(),
                    in_use: 0,
                }
            })
            .collect()
    }

    /// What peers learn about this node's plugins.
    pub fn peer_view(&self) -> Vec<PeerPlugin> {
        let t = self.table();
        t.entries
            .iter()
            .filter_map(|(id, e)| {
                let fp = e.fingerprint.as_ref()?;
                let healthy = !matches!(
                    e.health,
                    Some(HealthState::Unhealthy) | Some(HealthState::NotReady)
                );
                Some(PeerPlugin {
                    id: id.to_string(),
                    controller: fp
                        .capabilities
                        .plugin
                        .has_controller_service()
                        .then_some(healthy),
                    node: fp.node.as_ref().map(|n| (n.node_id.to_string(), healthy)),
                    controller_publish: fp
                        .capabilities
                        .lifecycle_requires(csi_client::Rpc::ControllerPublishVolume),
                })
            })
            .collect()
    }

    /// Scans the plugin directory until `stop` is set, every `interval`.
    pub async fn run(self, interval: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        if let Err(e) = std::fs::create_dir_all(&self.inner.dir) {
            tracing::warn!(dir = %self.inner.dir.display(), error = %e, "cannot create the plugin directory");
        }
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => self.scan(),
                _ = stop.changed() => break,
            }
        }
        let mut t = self.table();
        for (_, e) in std::mem::take(&mut t.entries) {
            e.task.abort();
        }
    }

    /// One scan: add new sockets, drop vanished ones, restart recreated ones.
    pub fn scan(&self) {
        let found = list_sockets(&self.inner.dir);
        let mut t = self.table();
        let gone: Vec<PluginId> = t
            .entries
            .iter()
            .filter(|(id, e)| found.get(id.as_str()).map(|(_, ino)| *ino) != Some(e.inode))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(e) = t.entries.remove(&id) {
                e.task.abort();
                self.inner
                    .registry
                    .remove(&self.inner.me, &id, ServiceKind::Controller);
                self.inner
                    .registry
                    .remove(&self.inner.me, &id, ServiceKind::Node);
                tracing::info!(plugin = %id, socket = %e.socket.display(), "plugin socket removed or replaced; plugin deregistered");
            }
        }
        for (name, (path, inode)) in found {
            let id = match PluginId::new(name.clone()) {
                Ok(id) => id,
                Err(e) => {
                    if t.ignored.insert(name.clone()) {
                        tracing::warn!(socket = %path.display(), error = %e, "socket name is not a valid plugin id; ignored");
                    }
                    continue;
                }
            };
            if t.entries.contains_key(&id) {
                continue;
            }
            let endpoint = match Endpoint::unix(&path) {
                Ok(ep) => ep,
                Err(e) => {
                    if t.ignored.insert(name.clone()) {
                        tracing::warn!(socket = %path.display(), error = %e, "unusable socket path; ignored");
                    }
                    continue;
                }
            };
            let mut policies = csi_client::PolicyTable::default();
            let limit = self.inner.call_timeout;
            policies.update_all(|_, p| {
                p.total_budget = p.total_budget.min(limit);
                p.attempt_deadline = p.attempt_deadline.min(limit);
            });
            let detach = self
                .inner
                .metrics
                .instrument(
                    &id,
                    self.inner
                        .node_detach
                        .apply(CsiClient::builder(endpoint.clone()).policies(policies.clone())),
                )
                .build();
            let client = self
                .inner
                .metrics
                .instrument(&id, CsiClient::builder(endpoint).policies(policies))
                .build();
            tracing::info!(plugin = %id, socket = %path.display(), "plugin socket appeared");
            let task = tokio::spawn(self.clone().watch(id.clone(), client.clone()));
            t.entries.insert(
                id,
                Entry {
                    socket: path,
                    inode,
                    client,
                    detach,
                    fingerprint: None,
                    health: None,
                    health_reason: None,
                    last_error: None,
                    task,
                },
            );
        }
    }

    fn update(&self, id: &PluginId, change: impl FnOnce(&mut Entry, &mut Counts)) {
        let mut t = self.table();
        let Table {
            entries,
            fingerprints,
            ..
        } = &mut *t;
        if let Some(e) = entries.get_mut(id) {
            change(e, fingerprints);
        }
    }

    fn publish_registry(&self, id: &PluginId, fp: &Fingerprint, health: Health) {
        let reg = &self.inner.registry;
        if fp.capabilities.plugin.has_controller_service() {
            reg.update(&self.inner.me, id, Instance::Controller(health.clone()));
        }
        if let Some(node) = &fp.node {
            reg.update(
                &self.inner.me,
                id,
                Instance::Node {
                    plugin_node: node.node_id.clone(),
                    health,
                },
            );
        }
    }

    /// Fingerprint until it works, then follow health until the socket goes away.
    async fn watch(self, id: PluginId, client: CsiClient) {
        let fp = loop {
            match client.fingerprint().await {
                Ok(fp) => break fp,
                Err(e) => {
                    tracing::warn!(plugin = %id, error = %e, class = %e.class().as_str(), "fingerprint failed; will retry");
                    self.update(&id, |entry, _| entry.last_error = Some(e.to_string()));
                    tokio::time::sleep(self.inner.retry_interval).await;
                }
            }
        };
        tracing::info!(
            plugin = %id,
            name = %fp.plugin.name.as_str(),
            version = %fp.plugin.vendor_version,
            controller = fp.capabilities.plugin.has_controller_service(),
            node = fp.serves_node(),
            "plugin fingerprinted"
        );
        self.update(&id, |entry, counts| {
            entry.fingerprint = Some(fp.clone());
            entry.last_error = None;
            *counts.entry(id.clone()).or_default() += 1;
        });
        self.publish_registry(&id, &fp, Health::Healthy);
        self.wake(&id);
        let mut fp = fp;
        let mut health = Health::Healthy;
        let mut watcher = client.watch_health(self.inner.health_interval);
        let mut refresh = tokio::time::interval(self.inner.fingerprint_interval);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        refresh.tick().await;
        loop {
            let event = tokio::select! {
                event = watcher.next() => match event {
                    Some(event) => event,
                    None => break,
                },
                _ = refresh.tick() => {
                    if let Some(changed) = self.refresh(&id, &client, &fp).await {
                        fp = changed;
                        self.publish_registry(&id, &fp, health.clone());
                    }
                    continue;
                }
            };
            let reason = match &event.reason {
                HealthReason::Ready => None,
                HealthReason::ReportedNotReady => Some("probe answered not ready".to_owned()),
                HealthReason::ProbeFailed(e) => Some(format!("probe failed: {e}")),
                HealthReason::SocketRemoved => Some("socket removed".to_owned()),
            };
            tracing::info!(plugin = %id, health = health_name(Some(event.state)), reason = reason.as_deref().unwrap_or("-"), "plugin health transition");
            self.update(&id, |entry, _| {
                entry.health = Some(event.state);
                entry.health_reason = reason.clone();
            });
            health = match event.state {
                HealthState::Healthy => Health::Healthy,
                _ => Health::unhealthy(reason.unwrap_or_else(|| "unhealthy".into())),
            };
            self.publish_registry(&id, &fp, health.clone());
            if health == Health::Healthy {
                self.wake(&id);
            }
            if event.last {
                break;
            }
        }
    }

    /// Fingerprints again; returns the new fingerprint when it differs from `current`.
    async fn refresh(
        &self,
        id: &PluginId,
        client: &CsiClient,
        current: &Fingerprint,
    ) -> Option<Fingerprint> {
        match client.fingerprint().await {
            Ok(fp) if &fp == current => {
                self.update(id, |entry, _| entry.last_error = None);
                None
            }
            Ok(fp) => {
                tracing::info!(
                    plugin = %id,
                    version = %fp.plugin.vendor_version,
                    controller = fp.capabilities.plugin.has_controller_service(),
                    node = fp.serves_node(),
                    "plugin fingerprint changed"
                );
                self.update(id, |entry, _| {
                    entry.fingerprint = Some(fp.clone());
                    entry.last_error = None;
                });
                self.inner
                    .registry
                    .remove(&self.inner.me, id, ServiceKind::Controller);
                self.inner
                    .registry
                    .remove(&self.inner.me, id, ServiceKind::Node);
                Some(fp)
            }
            Err(e) => {
                tracing::warn!(plugin = %id, error = %e, class = %e.class().as_str(), "periodic fingerprint failed");
                self.update(id, |entry, _| entry.last_error = Some(e.to_string()));
                None
            }
        }
    }

    fn wake(&self, id: &PluginId) {
        if let Some(claims) = self.inner.claims.get() {
            claims.plugin_available(id, Some(&self.inner.me));
            claims.plugin_available(id, None);
        }
    }
}

/// `<plugin-id>.sock` sockets in `dir`: name → (path, inode).
fn list_sockets(dir: &Path) -> BTreeMap<String, (PathBuf, u64)> {
    let mut out = BTreeMap::new();
    let Ok(read) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in read.flatten() {
        let path = entry.path();
        let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".sock"))
        else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_socket() {
            out.insert(stem.to_owned(), (path.clone(), meta.ino()));
        }
    }
    out
}
