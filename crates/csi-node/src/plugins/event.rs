//! What the plugin manager reports: one [`PluginEvent`] per transition, in the order the
//! manager's state changed.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use csi_client::{Endpoint, Fingerprint};
use csi_structs::PluginId;
use csi_structs::untrusted::escaped;
use serde::{Deserialize, Serialize};

/// The number the manager gave one registration. Registrations are numbered in the order
/// they were made, and the numbers never repeat, also across restarts of a manager that
/// keeps a state file: the highest number of a plugin id is its newest registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RegistrationId(pub(super) u64);

impl RegistrationId {
    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for RegistrationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Who registered a plugin instance.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RegistrationSource {
    /// The embedder, with [`PluginManager::register`](super::PluginManager::register) (for
    /// example when its task runner started the plugin).
    Pushed,
    /// A [`DirWatcher`](super::DirWatcher) that found this socket.
    Directory {
        /// The socket.
        socket: PathBuf,
        /// The socket's inode: a socket made again at the same path is another instance.
        inode: u64,
    },
}

/// Why a plugin is not healthy.
#[derive(Clone, Debug)]
pub enum Unhealthy {
    /// `Probe` answered `ready = false`: alive, still starting.
    NotReady,
    /// `Probe` failed; the error has its class and code.
    ProbeFailed(Arc<csi_client::Error>),
    /// The plugin's socket disappeared: the plugin went away. The manager fingerprints it
    /// again when it comes back.
    SocketRemoved,
}

impl fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unhealthy::NotReady => f.write_str("probe answered not ready"),
            Unhealthy::ProbeFailed(e) => write!(f, "probe failed: {e}"),
            Unhealthy::SocketRemoved => f.write_str("socket removed"),
        }
    }
}

/// A plugin's health as last seen.
#[derive(Clone, Debug)]
pub enum Health {
    /// Not probed since the last fingerprint: nothing is published through it yet, but
    /// release steps are sent.
    Unknown,
    /// `Probe` answered ready.
    Healthy,
    /// Not healthy, and why.
    Unhealthy(Unhealthy),
}

impl Health {
    /// Every [`name`](Self::name), e.g. to keep a metric's series for each at zero.
    pub const NAMES: [&'static str; 4] = ["healthy", "not_ready", "unhealthy", "unknown"];

    /// A short name: `unknown`, `healthy`, `not_ready` or `unhealthy`.
    pub fn name(&self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Healthy => "healthy",
            Health::Unhealthy(Unhealthy::NotReady) => "not_ready",
            Health::Unhealthy(_) => "unhealthy",
        }
    }

    /// Whether the last probe answered ready: only then is a volume published through the
    /// plugin. Health is advice, not a gate, for clean-up: release steps are sent whatever
    /// this says.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

impl fmt::Display for Health {
    /// `unknown (not probed since its fingerprint)`, `healthy`, or `unhealthy: <why>` (the
    /// probe's error shows plugin text escaped).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Health::Unknown => f.write_str("unknown (not probed since its fingerprint)"),
            Health::Healthy => f.write_str("healthy"),
            Health::Unhealthy(why) => write!(f, "unhealthy: {why}"),
        }
    }
}

/// Why a registration ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoneReason {
    /// Deregistered (by the embedder, or by a [`DirWatcher`](super::DirWatcher) whose socket
    /// disappeared).
    Deregistered,
    /// A newer registration of the same plugin id took its place.
    Replaced {
        /// The newer registration.
        by: RegistrationId,
    },
}

impl fmt::Display for GoneReason {
    /// `deregistered`, or `replaced by registration #4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GoneReason::Deregistered => f.write_str("deregistered"),
            GoneReason::Replaced { by } => write!(f, "replaced by registration {by}"),
        }
    }
}

impl fmt::Display for RegistrationSource {
    /// `the embedder`, or `socket /run/csi/ebs.sock` (a directory watcher's).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistrationSource::Pushed => f.write_str("the embedder"),
            RegistrationSource::Directory { socket, .. } => {
                write!(f, "socket {}", escaped(&socket.to_string_lossy()))
            }
        }
    }
}

/// A transition of a plugin instance.
///
/// Every event names the plugin and the registration it is about; events of a registration
/// that was replaced or deregistered stop with its [`Gone`](Self::Gone).
#[derive(Clone, Debug)]
pub enum PluginEvent {
    /// A plugin instance was registered (and will be fingerprinted).
    Registered {
        /// The plugin id.
        plugin: PluginId,
        /// The registration.
        registration: RegistrationId,
        /// Where the plugin listens.
        endpoint: Endpoint,
        /// Who registered it.
        source: RegistrationSource,
    },
    /// The plugin answered every discovery call.
    Fingerprinted {
        /// The plugin id.
        plugin: PluginId,
        /// The registration.
        registration: RegistrationId,
        /// What it is and can do.
        fingerprint: Arc<Fingerprint>,
        /// The registration's fingerprint before this one: `None` for its first; the same
        /// value when a plugin that went away came back unchanged; another value when the
        /// plugin changed (a periodic fingerprint that finds nothing new is not reported).
        previous: Option<Arc<Fingerprint>>,
    },
    /// A fingerprint failed; the manager tries again.
    FingerprintFailed {
        /// The plugin id.
        plugin: PluginId,
        /// The registration.
        registration: RegistrationId,
        /// Why.
        error: Arc<csi_client::Error>,
        /// Whether it was a periodic fingerprint of a plugin already fingerprinted (its
        /// last fingerprint stays in use).
        periodic: bool,
    },
    /// `Probe` answered ready, after the plugin was fingerprinted or unhealthy.
    Healthy {
        /// The plugin id.
        plugin: PluginId,
        /// The registration.
        registration: RegistrationId,
    },
    /// The plugin stopped being healthy.
    Unhealthy {
        /// The plugin id.
        plugin: PluginId,
        /// The registration.
        registration: RegistrationId,
        /// Why.
        why: Unhealthy,
    },
    /// The registration ended; no more events come for it.
    Gone {
        /// The plugin id.
        plugin: PluginId,
        /// The registration.
        registration: RegistrationId,
        /// Why.
        why: GoneReason,
    },
}

impl PluginEvent {
    /// The plugin the event is about.
    pub fn plugin(&self) -> &PluginId {
        match self {
            PluginEvent::Registered { plugin, .. }
            | PluginEvent::Fingerprinted { plugin, .. }
            | PluginEvent::FingerprintFailed { plugin, .. }
            | PluginEvent::Healthy { plugin, .. }
            | PluginEvent::Unhealthy { plugin, .. }
            | PluginEvent::Gone { plugin, .. } => plugin,
        }
    }

    /// The registration the event is about.
    pub fn registration(&self) -> RegistrationId {
        match self {
            PluginEvent::Registered { registration, .. }
            | PluginEvent::Fingerprinted { registration, .. }
            | PluginEvent::FingerprintFailed { registration, .. }
            | PluginEvent::Healthy { registration, .. }
            | PluginEvent::Unhealthy { registration, .. }
            | PluginEvent::Gone { registration, .. } => *registration,
        }
    }
}

impl fmt::Display for PluginEvent {
    /// One line for people, plugin text escaped: `plugin ebs (#3): registered at
    /// unix:///run/csi/ebs.sock by the embedder`, `plugin ebs (#3): fingerprinted, version
    /// 1.2.0`, `plugin ebs (#3): unhealthy: probe answered not ready`, `plugin ebs (#3): gone,
    /// replaced by registration #4`, …
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin {} ({}): ", self.plugin(), self.registration())?;
        match self {
            PluginEvent::Registered {
                endpoint, source, ..
            } => write!(f, "registered at {endpoint} by {source}"),
            PluginEvent::Fingerprinted {
                fingerprint,
                previous,
                ..
            } => {
                let how = match previous {
                    Some(old) if old != fingerprint => "fingerprint changed",
                    _ => "fingerprinted",
                };
                write!(
                    f,
                    "{how}, version {}",
                    escaped(&fingerprint.plugin.vendor_version)
                )
            }
            PluginEvent::FingerprintFailed {
                error, periodic, ..
            } => {
                let which = if *periodic { "periodic " } else { "" };
                write!(
                    f,
                    "{which}fingerprint failed ({}): {error}",
                    error.class().as_str()
                )
            }
            PluginEvent::Healthy { .. } => f.write_str("healthy"),
            PluginEvent::Unhealthy { why, .. } => write!(f, "unhealthy: {why}"),
            PluginEvent::Gone { why, .. } => write!(f, "gone, {why}"),
        }
    }
}

/// Receives every [`PluginEvent`], in the order the manager's state changed, none lost.
///
/// Called synchronously by whichever task made the change, without the manager's lock
/// held: it may read the manager, but should be quick (update a table, a metric, wake a
/// task) because the next events wait for it.
pub trait PluginObserver: Send + Sync + 'static {
    /// One event.
    fn on_event(&self, event: &PluginEvent);
}

/// A [`PluginObserver`] that writes one `tracing` line per event: a plugin registered (or
/// its socket found), its fingerprint (and a change of it), a failed fingerprint, each
/// health transition, and its end. Failures are `warn`, the rest `info`; the plugin's own
/// texts go in fields, never in the message.
///
/// ```
/// use std::sync::Arc;
/// use csi_node::plugins::{LogEvents, PluginManager, PluginManagerConfig};
///
/// # fn run() -> Result<(), csi_node::state::StateFileError> {
/// let manager = PluginManager::builder(PluginManagerConfig::default())
///     .observer(Arc::new(LogEvents::default()))
///     .start()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct LogEvents {
    /// The sockets of the live registrations a directory watcher made, so that their end
    /// can be told as the socket's.
    sockets: std::sync::Mutex<std::collections::HashMap<RegistrationId, PathBuf>>,
}

impl PluginObserver for LogEvents {
    fn on_event(&self, event: &PluginEvent) {
        match event {
            PluginEvent::Registered {
                plugin,
                registration,
                endpoint,
                source,
            } => match source {
                RegistrationSource::Directory { socket, .. } => {
                    tracing::info!(plugin = %plugin, socket = %socket.display(), "plugin socket appeared");
                    self.sockets().insert(*registration, socket.clone());
                }
                RegistrationSource::Pushed => {
                    tracing::info!(plugin = %plugin, endpoint = %endpoint, "plugin registered");
                }
            },
            PluginEvent::Fingerprinted {
                plugin,
                fingerprint: fp,
                previous,
                ..
            } => {
                let changed = previous.as_ref().is_some_and(|old| old != fp);
                let (controller, node) = (
                    fp.capabilities.plugin.has_controller_service(),
                    fp.serves_node(),
                );
                if changed {
                    tracing::info!(plugin = %plugin, version = %fp.plugin.vendor_version, controller, node, "plugin fingerprint changed");
                } else {
                    tracing::info!(plugin = %plugin, name = %fp.plugin.name.as_str(), version = %fp.plugin.vendor_version, controller, node, "plugin fingerprinted");
                }
            }
            PluginEvent::FingerprintFailed {
                plugin,
                error,
                periodic,
                ..
            } => {
                let class = error.class().as_str();
                if *periodic {
                    tracing::warn!(plugin = %plugin, error = %error, class = %class, "periodic fingerprint failed");
                } else {
                    tracing::warn!(plugin = %plugin, error = %error, class = %class, "fingerprint failed; will retry");
                }
            }
            PluginEvent::Healthy { plugin, .. } => {
                tracing::info!(plugin = %plugin, health = "healthy", reason = "-", "plugin health transition");
            }
            PluginEvent::Unhealthy { plugin, why, .. } => {
                let name = Health::Unhealthy(why.clone()).name();
                tracing::info!(plugin = %plugin, health = name, reason = %why, "plugin health transition");
            }
            PluginEvent::Gone {
                plugin,
                registration,
                why,
            } => {
                let socket = self.sockets().remove(registration);
                match (why, socket) {
                    (GoneReason::Replaced { by }, _) => {
                        tracing::info!(plugin = %plugin, %registration, replaced_by = %by, "plugin registration replaced");
                    }
                    // A directory watcher deregisters a plugin whose socket went away or
                    // was made again (another instance, registered anew).
                    (GoneReason::Deregistered, Some(socket)) => {
                        tracing::info!(plugin = %plugin, %registration, socket = %socket.display(), "plugin socket removed or replaced; plugin deregistered");
                    }
                    (GoneReason::Deregistered, None) => {
                        tracing::info!(plugin = %plugin, %registration, "plugin deregistered");
                    }
                }
            }
        }
    }
}

impl LogEvents {
    pub(super) fn sockets(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<RegistrationId, PathBuf>> {
        self.sockets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
