//! Waiting for a plugin to be usable, with a deadline.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use csi_structs::PluginId;
use tokio::time::Instant;

use super::event::{Health, Unhealthy};
use super::{PluginManager, ReadyPlugin};

/// Why a plugin was not usable when a wait ended.
#[derive(Clone, Debug)]
pub enum NotReady {
    /// No registration of the plugin id.
    NotRegistered,
    /// Registered, but no fingerprint yet; the last failed attempt, if any.
    NotFingerprinted {
        /// The last fingerprint error.
        last_error: Option<Arc<csi_client::Error>>,
    },
    /// Fingerprinted, but not probed since: its health is not known yet.
    HealthUnknown,
    /// Fingerprinted, but unhealthy.
    Unhealthy(Unhealthy),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::NotRegistered => f.write_str("it is not registered"),
            NotReady::NotFingerprinted { last_error: None } => {
                f.write_str("it is registered but has not answered its fingerprint yet")
            }
            NotReady::NotFingerprinted {
                last_error: Some(e),
            } => write!(f, "it is registered but its fingerprint failed: {e}"),
            NotReady::HealthUnknown => {
                f.write_str("it is fingerprinted but has not answered a probe yet")
            }
            NotReady::Unhealthy(why) => write!(f, "it is unhealthy: {why}"),
        }
    }
}

/// [`PluginManager::wait_for`] reached its deadline.
#[derive(Clone, Debug, thiserror::Error)]
#[error("plugin {plugin} not ready after waiting {waited:?}: {why}")]
pub struct WaitError {
    /// The plugin waited for.
    pub plugin: PluginId,
    /// How long the wait lasted (from the call to the deadline).
    pub waited: Duration,
    /// What was missing at the deadline.
    pub why: NotReady,
}

impl PluginManager {
    /// Waits until `plugin` is registered, fingerprinted and healthy (its last probe
    /// answered ready), at most until `deadline`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use csi_node::plugins::{NotReady, PluginManager, PluginManagerConfig};
    /// use csi_structs::PluginId;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let plugins = PluginManager::builder(PluginManagerConfig::default()).start()?;
    /// let deadline = tokio::time::Instant::now() + Duration::from_millis(10);
    /// let err = plugins.wait_for(&PluginId::new("ebs")?, deadline).await.unwrap_err();
    /// assert!(matches!(err.why, NotReady::NotRegistered));
    /// assert!(err.to_string().starts_with("plugin ebs not ready after waiting"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WaitError`] at the deadline, naming the plugin, the wait and what was missing.
    pub async fn wait_for(
        &self,
        plugin: &PluginId,
        deadline: Instant,
    ) -> Result<ReadyPlugin, WaitError> {
        let started = Instant::now();
        let mut changes = self.inner.changed.subscribe();
        loop {
            // Marked seen before looking, so a change after the look wakes the wait.
            changes.borrow_and_update();
            let why = match self.status(plugin) {
                None => NotReady::NotRegistered,
                Some(status) => match (&status.fingerprint, &status.health) {
                    (None, _) => NotReady::NotFingerprinted {
                        last_error: status.last_error.clone(),
                    },
                    (Some(_), Health::Unhealthy(why)) => NotReady::Unhealthy(why.clone()),
                    (Some(_), Health::Unknown) => NotReady::HealthUnknown,
                    (Some(_), Health::Healthy) => match self.get(plugin) {
                        Some(ready) if ready.registration == status.registration => {
                            return Ok(ready);
                        }
                        // Replaced between the two looks: look again.
                        _ => continue,
                    },
                },
            };
            let changed = tokio::time::timeout_at(deadline, changes.changed()).await;
            if !matches!(changed, Ok(Ok(()))) {
                return Err(WaitError {
                    plugin: plugin.clone(),
                    waited: deadline.saturating_duration_since(started),
                    why,
                });
            }
        }
    }
}
