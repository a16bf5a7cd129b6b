//! The plugin manager: which CSI plugin instances this node has, what each is and can do,
//! and whether it is healthy.
//!
//! - **Registration.** An instance is registered with a plugin id and an endpoint, either by
//!   the embedder ([`PluginManager::register`], e.g. from its task runner when it starts a
//!   plugin) or by a [`DirWatcher`] that finds `<plugin-id>.sock` sockets in a directory.
//!   The newest registration of a plugin id wins: it replaces the one before (which is
//!   reported [`Gone`](PluginEvent::Gone)), and deregistering a replaced registration is a
//!   no-op, so a slow cleanup of an old instance cannot remove the new one. With a state file
//!   ([`PluginManagerBuilder::state_file`]) the registrations survive a restart of the
//!   manager: it starts with the newest registration of each plugin id.
//! - **Fingerprint, then health.** Each registration gets its own task: it fingerprints the
//!   plugin with csi-client (every discovery call, retried every
//!   [`retry_interval`](PluginManagerConfig::retry_interval) until it answers), then probes
//!   it every [`health_interval`](PluginManagerConfig::health_interval) and fingerprints it
//!   again every [`fingerprint_interval`](PluginManagerConfig::fingerprint_interval) and
//!   whenever it turns healthy after being unhealthy. When the plugin's socket disappears
//!   the task does not end: it fingerprints the plugin again once it is back, so a restarted
//!   plugin needs nothing from the embedder.
//! - **Events.** Every transition is a [`PluginEvent`] (registered, fingerprinted,
//!   fingerprint failed, healthy, unhealthy with why, gone), delivered in order to the
//!   [`PluginObserver`]s given to the builder (none lost) and to
//!   [`subscribe`](PluginManager::subscribe)rs (a broadcast stream that may lag).
//! - **Waiting.** [`PluginManager::wait_for`] waits, up to a deadline, until a plugin is
//!   fingerprinted and healthy, and otherwise fails naming the plugin, the wait and what was
//!   missing.
//! - **Health is advice, not a gate, for clean-up.** A volume is published only through a
//!   plugin whose last probe answered ready ([`Health::is_healthy`]); release steps go to a
//!   registered plugin whatever its health ([`PluginManager::detach_client`]), so a plugin
//!   whose `Probe` hangs still gets its volumes released.
//!
//! Each instance has two clients: one for every call, and one for node detach calls under a
//! [`NodeDetachPolicy`] (a short socket wait, one attempt: the release driver is the retry
//! loop). [`PluginManagerBuilder::client_builder`] adjusts both (policies, metrics layers).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use csi_node::plugins::{PluginManager, PluginManagerConfig};
//! use csi_structs::PluginId;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let plugins = PluginManager::builder(PluginManagerConfig::default()).start()?;
//! let id = PluginId::new("ebs")?;
//! plugins.register(id.clone(), "unix:///run/csi/ebs.sock".parse()?)?;
//! let ready = plugins
//!     .wait_for(&id, tokio::time::Instant::now() + Duration::from_secs(30))
//!     .await?; // "plugin ebs not ready after 30s: ..." when it does not answer
//! println!("{} stages: {}", ready.fingerprint.plugin.name,
//!     ready.fingerprint.capabilities.node.requires_staging());
//! # Ok(()) }
//! ```

mod deliver;
mod dir;
mod event;
mod instance;
mod stored;
mod wait;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use csi_client::{CsiClient, CsiClientBuilder, Endpoint, Fingerprint, VolumeTurns};
use csi_structs::PluginId;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

pub use dir::DirWatcher;
pub use event::{
    GoneReason, Health, LogEvents, PluginEvent, PluginObserver, RegistrationId, RegistrationSource,
    Unhealthy,
};
pub use wait::{NotReady, WaitError};

use crate::detach::NodeDetachPolicy;
use crate::state::StateFileError;
use deliver::Events;
use stored::Kept;

/// How often the manager probes and fingerprints, and how node detach calls behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginManagerConfig {
    /// Probe interval of each plugin.
    pub health_interval: Duration,
    /// Pause between failed fingerprints of a plugin not fingerprinted yet (or back after
    /// its socket went away).
    pub retry_interval: Duration,
    /// Interval of the periodic fingerprint of a fingerprinted plugin.
    pub fingerprint_interval: Duration,
    /// Socket wait, attempts and deadlines of the node detach client.
    pub node_detach: NodeDetachPolicy,
}

impl Default for PluginManagerConfig {
    /// Probes every 5 s, fingerprints again every 30 s, retries a failed fingerprint after
    /// 1 s, and [`NodeDetachPolicy::DEFAULT`].
    fn default() -> Self {
        Self {
            health_interval: Duration::from_secs(5),
            retry_interval: Duration::from_secs(1),
            fingerprint_interval: Duration::from_secs(30),
            node_detach: NodeDetachPolicy::DEFAULT,
        }
    }
}

/// Adjusts the client builders of a plugin's instances (policies, metrics layers,
/// observers): called for both clients of every registration, before the node detach
/// policy is applied to the detach client.
pub type ClientCustomizer =
    Arc<dyn Fn(&PluginId, CsiClientBuilder) -> CsiClientBuilder + Send + Sync>;

/// Configures and starts a [`PluginManager`].
pub struct PluginManagerBuilder {
    config: PluginManagerConfig,
    customize: Option<ClientCustomizer>,
    observers: Vec<Arc<dyn PluginObserver>>,
    state_file: Option<PathBuf>,
    event_capacity: usize,
}

impl fmt::Debug for PluginManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginManagerBuilder")
            .field("config", &self.config)
            .field("observers", &self.observers.len())
            .field("state_file", &self.state_file)
            .finish_non_exhaustive()
    }
}

impl PluginManagerBuilder {
    /// Adjusts every client the manager builds (see [`ClientCustomizer`]).
    #[must_use]
    pub fn client_builder(
        mut self,
        customize: impl Fn(&PluginId, CsiClientBuilder) -> CsiClientBuilder + Send + Sync + 'static,
    ) -> Self {
        self.customize = Some(Arc::new(customize));
        self
    }

    /// Adds an observer of every event.
    #[must_use]
    pub fn observer(mut self, observer: Arc<dyn PluginObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Keeps the registrations in this file (written atomically on every change), and
    /// starts with the ones it holds.
    #[must_use]
    pub fn state_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.state_file = Some(path.into());
        self
    }

    /// How many events a [`subscribe`](PluginManager::subscribe)r may fall behind before it
    /// misses the oldest (default 256; observers never miss any).
    #[must_use]
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity;
        self
    }

    /// Starts the manager, with the registrations of the state file when there is one (each
    /// is reported [`Registered`](PluginEvent::Registered) again and fingerprinted).
    ///
    /// # Errors
    ///
    /// A [`StateFileError`] when the state file exists but cannot be read or holds a record
    /// that cannot be used (it names the plugin).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime when the state file holds registrations (their tasks are
    /// spawned).
    pub fn start(self) -> Result<PluginManager, StateFileError> {
        let (next, kept) = match &self.state_file {
            Some(path) => stored::load(path)?,
            None => (1, Vec::new()),
        };
        let manager = PluginManager {
            inner: Arc::new(Inner {
                config: self.config,
                customize: self.customize,
                state_file: self.state_file,
                state: Mutex::new(State {
                    next,
                    current: BTreeMap::new(),
                    fingerprints: BTreeMap::new(),
                }),
                writer: Mutex::new(()),
                events: Events::new(self.observers, self.event_capacity),
                changed: watch::Sender::new(0),
            }),
        };
        {
            let mut state = manager.inner.lock();
            for k in kept {
                manager.insert(&mut state, k);
            }
        }
        manager.changed();
        Ok(manager)
    }
}

/// A registration as the manager holds it.
struct Entry {
    kept: Kept,
    client: CsiClient,
    detach: CsiClient,
    fingerprint: Option<Arc<Fingerprint>>,
    health: Health,
    last_error: Option<Arc<csi_client::Error>>,
    task: JoinHandle<()>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct State {
    next: u64,
    current: BTreeMap<PluginId, Entry>,
    /// First fingerprints per plugin id, over all its registrations.
    fingerprints: BTreeMap<PluginId, u64>,
}

impl State {
    /// The registrations as the state file keeps them, but `plugin`'s.
    fn kept_except(&self, plugin: &PluginId) -> Vec<Kept> {
        self.current
            .values()
            .filter(|e| e.kept.plugin != *plugin)
            .map(|e| e.kept.clone())
            .collect()
    }
}

struct Inner {
    config: PluginManagerConfig,
    customize: Option<ClientCustomizer>,
    state_file: Option<PathBuf>,
    /// Locked only to read or change the registrations, never across a write of the state
    /// file: a reader does not wait on the disk.
    state: Mutex<State>,
    /// Held by one registration or deregistration at a time, across its write.
    writer: Mutex<()>,
    events: Events,
    /// Bumped after every change, for [`PluginManager::wait_for`].
    changed: watch::Sender<u64>,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The turn to change the registrations kept in the state file. It may be held for as
    /// long as a stalled write (the state files' write timeout): on a runtime worker the wait
    /// hands the worker's other tasks on, as the write itself does.
    fn writer_turn(&self) -> std::sync::MutexGuard<'_, ()> {
        crate::state::wait_off_the_runtime(|| {
            self.writer.lock().unwrap_or_else(PoisonError::into_inner)
        })
    }

    /// Changes the entry of `registration`, if it is still its plugin's current one, then
    /// delivers the events `change` queued. `false` when the registration is gone.
    fn update(
        &self,
        plugin: &PluginId,
        registration: RegistrationId,
        change: impl FnOnce(&mut Entry, &mut BTreeMap<PluginId, u64>, &Events),
    ) -> bool {
        {
            let mut state = self.lock();
            let State {
                current,
                fingerprints,
                ..
            } = &mut *state;
            match current.get_mut(plugin) {
                Some(entry) if entry.kept.registration == registration => {
                    change(entry, fingerprints, &self.events);
                }
                _ => return false,
            }
        }
        self.events.flush();
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        true
    }
}

/// What the manager knows about a plugin's current registration.
#[derive(Clone, Debug)]
pub struct PluginStatus {
    /// The plugin id.
    pub plugin: PluginId,
    /// The registration.
    pub registration: RegistrationId,
    /// Where it listens.
    pub endpoint: Endpoint,
    /// Who registered it.
    pub source: RegistrationSource,
    /// Its fingerprint, once it answered.
    pub fingerprint: Option<Arc<Fingerprint>>,
    /// Its health.
    pub health: Health,
    /// The last failed fingerprint, until one succeeds.
    pub last_error: Option<Arc<csi_client::Error>>,
    /// How many registrations of this plugin id were fingerprinted so far.
    pub fingerprints: u64,
}

impl fmt::Display for PluginStatus {
    /// One line for people, plugin text escaped: `plugin ebs (#3) at unix:///run/csi/ebs.sock:
    /// healthy, version 1.2.0`, or `…: unknown (not probed since its fingerprint), not
    /// fingerprinted yet, last fingerprint error: <error>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plugin {} ({}) at {}: {}",
            self.plugin, self.registration, self.endpoint, self.health
        )?;
        match &self.fingerprint {
            Some(fp) => write!(
                f,
                ", version {}",
                csi_structs::untrusted::escaped(&fp.plugin.vendor_version)
            )?,
            None => f.write_str(", not fingerprinted yet")?,
        }
        if let Some(e) = &self.last_error {
            write!(f, ", last fingerprint error: {e}")?;
        }
        Ok(())
    }
}

/// A fingerprinted, usable plugin: what [`PluginManager::wait_for`] returns.
#[derive(Clone, Debug)]
pub struct ReadyPlugin {
    /// The plugin id.
    pub plugin: PluginId,
    /// The registration.
    pub registration: RegistrationId,
    /// The client for every call.
    pub client: CsiClient,
    /// The client for node detach calls (under the manager's [`NodeDetachPolicy`]).
    pub detach: CsiClient,
    /// What it is and can do.
    pub fingerprint: Arc<Fingerprint>,
    /// Its health when it was looked up: publishing needs [`Health::Healthy`]; release
    /// steps go whatever it is.
    pub health: Health,
}

/// The plugin manager. Cheap to clone; every clone is the same manager.
///
/// Dropping the last clone stops every instance task.
#[derive(Clone)]
pub struct PluginManager {
    inner: Arc<Inner>,
}

impl fmt::Debug for PluginManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plugins: Vec<PluginId> = self.inner.lock().current.keys().cloned().collect();
        f.debug_struct("PluginManager")
            .field("plugins", &plugins)
            .field("state_file", &self.inner.state_file)
            .finish_non_exhaustive()
    }
}

impl PluginManager {
    /// A builder with `config`.
    pub fn builder(config: PluginManagerConfig) -> PluginManagerBuilder {
        PluginManagerBuilder {
            config,
            customize: None,
            observers: Vec::new(),
            state_file: None,
            event_capacity: 256,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PluginManagerConfig {
        &self.inner.config
    }

    /// Registers an instance of `plugin` listening at `endpoint`; it replaces the plugin's
    /// current registration, if any. Returns the new registration's number.
    ///
    /// With a state file, the registration is written before this returns: it may wait for
    /// the disk (at most [`WRITE_TIMEOUT`](crate::state::WRITE_TIMEOUT)) and for a
    /// registration or deregistration whose write is under way. Readers ([`get`](Self::get),
    /// [`list`](Self::list), [`status`](Self::status)) never wait for either.
    ///
    /// # Errors
    ///
    /// [`StateFileError`] when the state file cannot be written; nothing changed then.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (the instance's task is spawned).
    pub fn register(
        &self,
        plugin: PluginId,
        endpoint: Endpoint,
    ) -> Result<RegistrationId, StateFileError> {
        self.register_from(plugin, endpoint, RegistrationSource::Pushed)
    }

    fn register_from(
        &self,
        plugin: PluginId,
        endpoint: Endpoint,
        source: RegistrationSource,
    ) -> Result<RegistrationId, StateFileError> {
        let registration = {
            let _turn = self.inner.writer_turn();
            let (registration, others) = {
                let state = self.inner.lock();
                (RegistrationId(state.next), state.kept_except(&plugin))
            };
            let kept = Kept {
                plugin: plugin.clone(),
                registration,
                endpoint,
                source,
            };
            // Written before anything changes: on failure the old registration stays.
            if let Some(path) = &self.inner.state_file {
                stored::save(path, registration.0 + 1, others.iter().chain([&kept]))?;
            }
            let mut state = self.inner.lock();
            state.next = registration.0 + 1;
            self.insert(&mut state, kept);
            registration
        };
        self.changed();
        Ok(registration)
    }

    /// Puts `kept` in place of its plugin's current registration and starts its task.
    fn insert(&self, state: &mut State, kept: Kept) {
        let plugin = kept.plugin.clone();
        let registration = kept.registration;
        // The two clients of one plugin share its volumes' turns: a release's node detach
        // never overlaps a claim's call about the same volume.
        let turns = Arc::new(VolumeTurns::new());
        let builder = || {
            let b = CsiClient::builder(kept.endpoint.clone());
            match &self.inner.customize {
                Some(customize) => customize(&plugin, b),
                None => b,
            }
            .volume_turns(turns.clone())
        };
        let client = builder().build();
        let detach = self.inner.config.node_detach.apply(builder()).build();
        let task = tokio::spawn(instance::run(
            Arc::downgrade(&self.inner),
            plugin.clone(),
            registration,
            client.clone(),
        ));
        let event = PluginEvent::Registered {
            plugin: plugin.clone(),
            registration,
            endpoint: kept.endpoint.clone(),
            source: kept.source.clone(),
        };
        let entry = Entry {
            kept,
            client,
            detach,
            fingerprint: None,
            health: Health::Unknown,
            last_error: None,
            task,
        };
        // The old instance's end is reported first: its services go before the new ones come.
        if let Some(old) = state.current.insert(plugin.clone(), entry) {
            self.inner.events.push(PluginEvent::Gone {
                plugin,
                registration: old.kept.registration,
                why: GoneReason::Replaced { by: registration },
            });
        }
        self.inner.events.push(event);
    }

    /// Delivers queued events and wakes waiters.
    fn changed(&self) {
        self.inner.events.flush();
        self.inner.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Ends `registration` if it is still its plugin's current one; `Ok(false)` when it was
    /// replaced or deregistered already (nothing changes then).
    ///
    /// # Errors
    ///
    /// [`StateFileError`] when the state file cannot be written; nothing changed then.
    pub fn deregister(&self, registration: RegistrationId) -> Result<bool, StateFileError> {
        let gone = {
            let _turn = self.inner.writer_turn();
            let (plugin, next, rest) = {
                let state = self.inner.lock();
                let Some(plugin) = state
                    .current
                    .iter()
                    .find(|(_, e)| e.kept.registration == registration)
                    .map(|(p, _)| p.clone())
                else {
                    return Ok(false);
                };
                let rest = state.kept_except(&plugin);
                (plugin, state.next, rest)
            };
            if let Some(path) = &self.inner.state_file {
                stored::save(path, next, rest.iter())?;
            }
            let mut state = self.inner.lock();
            // Gone already only if the manager was shut down meanwhile (no events then).
            let entry = state.current.remove(&plugin);
            if entry.is_some() {
                self.inner.events.push(PluginEvent::Gone {
                    plugin,
                    registration,
                    why: GoneReason::Deregistered,
                });
            }
            entry
        };
        // The task is aborted outside the lock.
        drop(gone);
        self.changed();
        Ok(true)
    }

    /// Stops every instance task and forgets the registrations in memory; the state file
    /// keeps them for the next manager. No events.
    pub fn shutdown(&self) {
        let entries = std::mem::take(&mut self.inner.lock().current);
        drop(entries);
        self.changed();
    }

    /// The current registration of `plugin`.
    pub fn status(&self, plugin: &PluginId) -> Option<PluginStatus> {
        let state = self.inner.lock();
        let entry = state.current.get(plugin)?;
        Some(status(&state, entry))
    }

    /// Every current registration, by plugin id.
    pub fn list(&self) -> Vec<PluginStatus> {
        let state = self.inner.lock();
        state.current.values().map(|e| status(&state, e)).collect()
    }

    /// The plugin's clients, fingerprint and health, when it is fingerprinted (whatever its
    /// health: callers that publish check [`ReadyPlugin::health`] or use
    /// [`wait_for`](Self::wait_for)).
    pub fn get(&self, plugin: &PluginId) -> Option<ReadyPlugin> {
        let state = self.inner.lock();
        let entry = state.current.get(plugin)?;
        Some(ReadyPlugin {
            plugin: plugin.clone(),
            registration: entry.kept.registration,
            client: entry.client.clone(),
            detach: entry.detach.clone(),
            fingerprint: entry.fingerprint.clone()?,
            health: entry.health.clone(),
        })
    }

    /// The client for node detach calls of `plugin`'s current registration, fingerprinted
    /// or not and whatever its health: release steps are attempted on any plugin that is
    /// registered (health is advice for them, not a gate).
    pub fn detach_client(&self, plugin: &PluginId) -> Option<CsiClient> {
        let state = self.inner.lock();
        state.current.get(plugin).map(|entry| entry.detach.clone())
    }

    /// Every event from now on (a receiver that falls behind the builder's
    /// [`event_capacity`](PluginManagerBuilder::event_capacity) misses the oldest; use a
    /// [`PluginObserver`] to miss none).
    pub fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.inner.events.subscribe()
    }
}

/// How callers reach a plugin's Controller service (the attach path's controller publish,
/// the release pipeline's controller unpublish).
pub trait ControllerClients: Send + Sync + 'static {
    /// A client of `plugin`'s controller, or `None` when none is reachable (yet).
    fn controller(&self, plugin: &PluginId) -> Option<csi_client::ControllerClient>;
}

/// The plugin's own controller, once it is fingerprinted with a Controller service.
impl ControllerClients for PluginManager {
    fn controller(&self, plugin: &PluginId) -> Option<csi_client::ControllerClient> {
        self.get(plugin)
            .filter(|ready| {
                ready
                    .fingerprint
                    .capabilities
                    .plugin
                    .has_controller_service()
            })
            .map(|ready| ready.client.controller())
    }
}

/// One plugin's client, whatever the plugin id asked for.
impl ControllerClients for CsiClient {
    fn controller(&self, _plugin: &PluginId) -> Option<csi_client::ControllerClient> {
        Some(CsiClient::controller(self))
    }
}

fn status(state: &State, entry: &Entry) -> PluginStatus {
    PluginStatus {
        plugin: entry.kept.plugin.clone(),
        registration: entry.kept.registration,
        endpoint: entry.kept.endpoint.clone(),
        source: entry.kept.source.clone(),
        fingerprint: entry.fingerprint.clone(),
        health: entry.health.clone(),
        last_error: entry.last_error.clone(),
        fingerprints: state
            .fingerprints
            .get(&entry.kept.plugin)
            .copied()
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests;
