//! A health watcher: Probe on an interval, report transitions with their reason, and a final
//! report when the plugin goes away.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::connection::Connection;
use crate::error::Error;
use crate::identity::{IdentityClient, Readiness};

/// The health of a plugin, as last probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HealthState {
    /// Probe answered ready (or left `ready` out).
    Healthy,
    /// Probe answered `ready = false`: alive but initialising.
    NotReady,
    /// Probe failed, or the plugin is gone.
    Unhealthy,
}

/// Why the state is what it is.
#[derive(Debug)]
pub enum HealthReason {
    /// Probe said ready.
    Ready,
    /// Probe said `ready = false`.
    ReportedNotReady,
    /// Probe failed with this error (its class and code say how).
    ProbeFailed(Error),
    /// The plugin's socket disappeared after it had existed: the plugin went away. This is
    /// always the last event of a watcher.
    SocketRemoved,
}

/// A change of health.
#[derive(Debug)]
pub struct HealthEvent {
    /// The new state.
    pub state: HealthState,
    /// Why.
    pub reason: HealthReason,
    /// Whether this is the watcher's last event (the plugin went away).
    pub last: bool,
}

/// Probes a plugin on an interval and reports each *transition* (the first observation,
/// then every change of [`HealthState`]) through [`next`](Self::next).
///
/// For unix endpoints, when the socket file disappears after having existed, the watcher
/// sends a final [`HealthState::Unhealthy`] event with [`HealthReason::SocketRemoved`] and
/// stops; `next` then returns `None`. Dropping the watcher stops it.
///
/// ```no_run
/// # async fn f(client: csi_client::CsiClient) {
/// let mut health = client.watch_health(std::time::Duration::from_secs(10));
/// while let Some(event) = health.next().await {
///     println!("plugin is now {:?}: {:?}", event.state, event.reason);
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct HealthWatcher {
    events: mpsc::Receiver<HealthEvent>,
    task: JoinHandle<()>,
}

impl HealthWatcher {
    pub(crate) fn spawn(
        identity: IdentityClient,
        connection: Connection,
        interval: Duration,
    ) -> Self {
        let (tx, events) = mpsc::channel(16);
        let task = tokio::spawn(watch(identity, connection, interval, tx));
        HealthWatcher { events, task }
    }

    /// The next transition; `None` once the watcher stopped (after the final event).
    pub async fn next(&mut self) -> Option<HealthEvent> {
        self.events.recv().await
    }
}

impl Drop for HealthWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn socket_exists(connection: &Connection) -> Option<bool> {
    let path = connection.endpoint().unix_path()?;
    tokio::fs::try_exists(path).await.ok()
}

async fn watch(
    identity: IdentityClient,
    connection: Connection,
    interval: Duration,
    tx: mpsc::Sender<HealthEvent>,
) {
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<HealthState> = None;
    let mut socket_seen = false;
    loop {
        ticker.tick().await;
        match socket_exists(&connection).await {
            Some(true) => socket_seen = true,
            Some(false) if socket_seen => {
                let _ = tx
                    .send(HealthEvent {
                        state: HealthState::Unhealthy,
                        reason: HealthReason::SocketRemoved,
                        last: true,
                    })
                    .await;
                return;
            }
            _ => {}
        }
        let (state, reason) = match identity.probe().await {
            Ok(Readiness::Ready) => (HealthState::Healthy, HealthReason::Ready),
            Ok(Readiness::NotReady) => (HealthState::NotReady, HealthReason::ReportedNotReady),
            Err(e) => (HealthState::Unhealthy, HealthReason::ProbeFailed(e)),
        };
        if last != Some(state) {
            tracing::info!(endpoint = %connection.endpoint(), ?state, "plugin health changed");
            last = Some(state);
            let event = HealthEvent {
                state,
                reason,
                last: false,
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}
