//! One registration's task: fingerprint until the plugin answers, then follow its health and
//! fingerprint it again periodically; when its socket goes away, start over.

use std::sync::{Arc, Weak};

use csi_client::{CsiClient, Fingerprint, HealthReason, HealthState};
use csi_structs::PluginId;
use tokio::time::{Instant, MissedTickBehavior};

use super::Inner;
use super::event::{Health, PluginEvent, RegistrationId, Unhealthy};

/// What the task needs to reach its entry.
struct Link {
    inner: Weak<Inner>,
    plugin: PluginId,
    registration: RegistrationId,
}

impl Link {
    /// Applies `change` to the entry; `false` when the registration (or the manager) is
    /// gone, and the task should end.
    fn update(
        &self,
        change: impl FnOnce(
            &mut super::Entry,
            &mut std::collections::BTreeMap<PluginId, u64>,
            &super::Events,
        ),
    ) -> bool {
        match self.inner.upgrade() {
            Some(inner) => inner.update(&self.plugin, self.registration, change),
            None => false,
        }
    }

    fn config(&self) -> Option<super::PluginManagerConfig> {
        self.inner.upgrade().map(|i| i.config)
    }
}

pub(super) async fn run(
    inner: Weak<Inner>,
    plugin: PluginId,
    registration: RegistrationId,
    client: CsiClient,
) {
    let link = Link {
        inner,
        plugin,
        registration,
    };
    let mut last: Option<Arc<Fingerprint>> = None;
    loop {
        let Some(fp) = fingerprint_until_it_answers(&link, &client).await else {
            return;
        };
        let previous = last.replace(Arc::clone(&fp));
        if !record(&link, fp, previous, false) {
            return;
        }
        if !follow_health(&link, &client, &mut last).await {
            return;
        }
        // The socket went away: fingerprint the plugin again when it is back.
    }
}

/// Fingerprints until the plugin answers; `None` when the task should end.
async fn fingerprint_until_it_answers(link: &Link, client: &CsiClient) -> Option<Arc<Fingerprint>> {
    loop {
        // The fingerprint waits for a socket that refuses (a plugin starting), up to its
        // budget; whoever reads the plugin's status learns at once that nobody listens.
        if let Err(e) = client.connection().dial_once().await
            && !unreachable(link, e)
        {
            return None;
        }
        match client.fingerprint().await {
            Ok(fp) => return Some(Arc::new(fp)),
            Err(e) => {
                if !failed(link, e, false) {
                    return None;
                }
                tokio::time::sleep(link.config()?.retry_interval).await;
            }
        }
    }
}

/// Records that nothing accepts connections at the plugin's endpoint, as its last error;
/// reported as a failed fingerprint when it says something new.
fn unreachable(link: &Link, e: csi_client::ConnectError) -> bool {
    let error = Arc::new(csi_client::Error::not_dialled(
        csi_client::Rpc::GetPluginInfo,
        e,
    ));
    link.update(|entry, _, events| {
        let said = entry.last_error.as_ref().map(ToString::to_string);
        entry.last_error = Some(Arc::clone(&error));
        if said != Some(error.to_string()) {
            events.push(PluginEvent::FingerprintFailed {
                plugin: link.plugin.clone(),
                registration: link.registration,
                error,
                periodic: false,
            });
        }
    })
}

/// Records a failed fingerprint (the last good one stays in use).
fn failed(link: &Link, error: csi_client::Error, periodic: bool) -> bool {
    let error = Arc::new(error);
    link.update(|entry, _, events| {
        entry.last_error = Some(Arc::clone(&error));
        events.push(PluginEvent::FingerprintFailed {
            plugin: link.plugin.clone(),
            registration: link.registration,
            error,
            periodic,
        });
    })
}

/// Records a successful fingerprint: the first, one after the plugin came back (its health
/// is unknown again: `probed == false`), or a changed one.
fn record(
    link: &Link,
    fp: Arc<Fingerprint>,
    previous: Option<Arc<Fingerprint>>,
    probed: bool,
) -> bool {
    link.update(|entry, counts, events| {
        if previous.is_none() {
            *counts.entry(link.plugin.clone()).or_default() += 1;
        }
        entry.fingerprint = Some(Arc::clone(&fp));
        entry.last_error = None;
        if !probed {
            entry.health = Health::Unknown;
        }
        events.push(PluginEvent::Fingerprinted {
            plugin: link.plugin.clone(),
            registration: link.registration,
            fingerprint: fp,
            previous,
        });
    })
}

/// Follows the plugin's health until its socket goes away (`true`) or the task should end
/// (`false`), fingerprinting it again on the interval and when it recovers.
async fn follow_health(
    link: &Link,
    client: &CsiClient,
    last: &mut Option<Arc<Fingerprint>>,
) -> bool {
    let Some(config) = link.config() else {
        return false;
    };
    let mut watcher = client.watch_health(config.health_interval);
    let period = config
        .fingerprint_interval
        .max(std::time::Duration::from_millis(1));
    let mut refresh = tokio::time::interval_at(Instant::now() + period, period);
    refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut unhealthy = false;
    loop {
        tokio::select! {
            event = watcher.next() => {
                let Some(event) = event else { return true };
                let why = match event.reason {
                    HealthReason::Ready => None,
                    HealthReason::ReportedNotReady => Some(Unhealthy::NotReady),
                    HealthReason::ProbeFailed(e) => Some(Unhealthy::ProbeFailed(Arc::new(e))),
                    HealthReason::SocketRemoved => Some(Unhealthy::SocketRemoved),
                };
                let why = match (event.state, why) {
                    (HealthState::Healthy, _) => None,
                    (_, Some(why)) => Some(why),
                    // A state other than healthy always comes with its reason; be safe.
                    (_, None) => Some(Unhealthy::NotReady),
                };
                let recovered = unhealthy && why.is_none();
                unhealthy = why.is_some();
                let alive = link.update(|entry, _, events| {
                    let (health, event) = match why {
                        None => (Health::Healthy, PluginEvent::Healthy {
                            plugin: link.plugin.clone(),
                            registration: link.registration,
                        }),
                        Some(why) => (Health::Unhealthy(why.clone()), PluginEvent::Unhealthy {
                            plugin: link.plugin.clone(),
                            registration: link.registration,
                            why,
                        }),
                    };
                    entry.health = health;
                    events.push(event);
                });
                if !alive {
                    return false;
                }
                if event.last {
                    return true;
                }
                // A plugin back from being unhealthy may be another build: look again.
                if recovered && !refresh_fingerprint(link, client, last).await {
                    return false;
                }
            }
            _ = refresh.tick() => {
                if !refresh_fingerprint(link, client, last).await {
                    return false;
                }
            }
        }
    }
}

/// Fingerprints again; a change is recorded and reported, a failure reported with the old
/// fingerprint kept. `false` when the task should end.
async fn refresh_fingerprint(
    link: &Link,
    client: &CsiClient,
    last: &mut Option<Arc<Fingerprint>>,
) -> bool {
    match client.fingerprint().await {
        Ok(fp) if last.as_deref() == Some(&fp) => link.update(|entry, _, _| {
            entry.last_error = None;
        }),
        Ok(fp) => {
            let fp = Arc::new(fp);
            let previous = last.replace(Arc::clone(&fp));
            record(link, fp, previous, true)
        }
        Err(e) => failed(link, e, true),
    }
}
