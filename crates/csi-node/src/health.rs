//! Volume health on this node ([`HealthMonitor`]): for the volumes published here, how full
//! they are and whether their plugin says they are abnormal, polled where the plugin
//! advertises it, with typed events when a condition turns abnormal and when it recovers.
//!
//! Where the condition comes from:
//!
//! | source | the plugin advertises | the call |
//! |---|---|---|
//! | [`ConditionSource::Node`] | node `VOLUME_CONDITION` (and `GET_VOLUME_STATS`) | `NodeGetVolumeStats` of a publication here |
//! | [`ConditionSource::Controller`] | controller `VOLUME_CONDITION` with `GET_VOLUME` | `ControllerGetVolume` |
//! | [`ConditionSource::Controller`] | controller `VOLUME_CONDITION` with `LIST_VOLUMES` | `ListVolumes`, once per plugin |
//!
//! Usage (bytes and inodes) comes from `NodeGetVolumeStats` of a plugin with node
//! `GET_VOLUME_STATS`. The controller is asked when it runs on this node (its plugin's
//! fingerprint here has the controller service); a controller elsewhere reports through its
//! own node's monitor. A poll that fails is logged and changes nothing: a volume is never
//! reported recovered because its plugin did not answer.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use csi_structs::{
    ControllerCapability, ExternalVolumeId, NodeCapability, PluginId, Usage, VolumeCondition,
    VolumeId,
};
use tokio::sync::broadcast;

use crate::plugins::PluginManager;
use crate::volumes::VolumeManager;

/// Who reported a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConditionSource {
    /// The plugin's controller (`ControllerGetVolume` or `ListVolumes`).
    Controller,
    /// The plugin's node service here (`NodeGetVolumeStats`).
    Node,
}

impl ConditionSource {
    /// `controller` or `node`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionSource::Controller => "controller",
            ConditionSource::Node => "node",
        }
    }
}

impl std::fmt::Display for ConditionSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the monitor last learned of one volume published here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeHealth {
    /// Its plugin.
    pub plugin: Option<PluginId>,
    /// The controller's condition, when it reports one.
    pub controller: Option<VolumeCondition>,
    /// The node service's condition, when it reports one.
    pub node: Option<VolumeCondition>,
    /// Bytes used, available and in all, when the plugin reports them.
    pub bytes: Option<Usage>,
    /// Inodes, likewise.
    pub inodes: Option<Usage>,
}

impl VolumeHealth {
    /// The abnormal conditions, by who reported them.
    pub fn abnormal(&self) -> Vec<(ConditionSource, &VolumeCondition)> {
        [
            (ConditionSource::Controller, self.controller.as_ref()),
            (ConditionSource::Node, self.node.as_ref()),
        ]
        .into_iter()
        .filter_map(|(s, c)| c.filter(|c| c.abnormal).map(|c| (s, c)))
        .collect()
    }
}

/// A condition that changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VolumeHealthEvent {
    /// A volume is reported abnormal (or its abnormal condition's message changed).
    Abnormal {
        /// The volume.
        volume: VolumeId,
        /// Its plugin.
        plugin: PluginId,
        /// Who says so.
        source: ConditionSource,
        /// The plugin's words.
        message: String,
    },
    /// A volume reported abnormal is reported normal again.
    Recovered {
        /// The volume.
        volume: VolumeId,
        /// Its plugin.
        plugin: PluginId,
        /// Who says so.
        source: ConditionSource,
    },
}

impl std::fmt::Display for VolumeHealthEvent {
    /// `volume v1 (plugin ebs): abnormal, says its node service: <message>` (the plugin's
    /// words escaped), or `volume v1 (plugin ebs): normal again, says its controller`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VolumeHealthEvent::Abnormal {
                volume,
                plugin,
                source,
                message,
            } => write!(
                f,
                "volume {volume} (plugin {plugin}): abnormal, says its {}: {}",
                says(*source),
                csi_structs::untrusted::escaped(message)
            ),
            VolumeHealthEvent::Recovered {
                volume,
                plugin,
                source,
            } => write!(
                f,
                "volume {volume} (plugin {plugin}): normal again, says its {}",
                says(*source)
            ),
        }
    }
}

fn says(source: ConditionSource) -> &'static str {
    match source {
        ConditionSource::Controller => "controller",
        ConditionSource::Node => "node service",
    }
}

/// Polls the health of the volumes published on this node (module docs: [`self`]).
#[derive(Debug)]
pub struct HealthMonitor {
    plugins: PluginManager,
    volumes: VolumeManager,
    health: Mutex<BTreeMap<VolumeId, VolumeHealth>>,
    events: broadcast::Sender<VolumeHealthEvent>,
}

impl HealthMonitor {
    /// A monitor of `volumes`' publications, calling the plugins of `plugins`.
    pub fn new(plugins: PluginManager, volumes: VolumeManager) -> Self {
        Self {
            plugins,
            volumes,
            health: Mutex::new(BTreeMap::new()),
            events: broadcast::channel(256).0,
        }
    }

    /// Every [`VolumeHealthEvent`] from now on (a receiver more than 256 behind misses the oldest).
    pub fn subscribe(&self) -> broadcast::Receiver<VolumeHealthEvent> {
        self.events.subscribe()
    }

    /// What the last polls found, by volume (the volumes published here at the last poll).
    pub fn health(&self) -> BTreeMap<VolumeId, VolumeHealth> {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Polls every `interval` until `stop` completes.
    pub async fn run(&self, interval: Duration, stop: impl Future<Output = ()>) {
        crate::every(interval, stop, || self.poll()).await;
    }

    /// One round over the volumes published here. Returns the events it sent.
    pub async fn poll(&self) -> Vec<VolumeHealthEvent> {
        let records = self.volumes.records();
        let mut now: BTreeMap<VolumeId, VolumeHealth> = BTreeMap::new();
        // One listing per plugin whose controller reports conditions only through it.
        let mut listed: BTreeMap<PluginId, Option<BTreeMap<ExternalVolumeId, VolumeCondition>>> =
            BTreeMap::new();
        let before = self.health();
        for record in &records {
            let Some(target) = record.users.values().next().map(|u| u.target.clone()) else {
                continue;
            };
            let mut health = before.get(&record.volume).cloned().unwrap_or_default();
            health.plugin = Some(record.plugin.clone());
            let Some(ready) = self.plugins.get(&record.plugin) else {
                now.insert(record.volume.clone(), health);
                continue;
            };
            let caps = &ready.fingerprint.capabilities;
            if caps.node.can_get_volume_stats() {
                let stats = ready
                    .client
                    .node()
                    .volume_stats(&record.external_id, &target, record.staging.as_deref())
                    .await;
                match stats {
                    Ok(stats) => {
                        health.bytes = stats.bytes;
                        health.inodes = stats.inodes;
                        health.node = stats
                            .condition
                            .filter(|_| caps.node.contains(NodeCapability::VolumeCondition));
                    }
                    Err(e) => {
                        tracing::warn!(volume = %record.volume, plugin = %record.plugin, error = %e, "NodeGetVolumeStats failed; the volume's health is as last seen");
                    }
                }
            }
            let controller = &caps.controller;
            if caps.plugin.has_controller_service()
                && controller.contains(ControllerCapability::VolumeCondition)
            {
                if controller.contains(ControllerCapability::GetVolume) {
                    match ready
                        .client
                        .controller()
                        .get_volume(&record.external_id)
                        .await
                    {
                        Ok(v) => health.controller = v.status.condition,
                        Err(e) => {
                            tracing::warn!(volume = %record.volume, plugin = %record.plugin, error = %e, "ControllerGetVolume failed; the volume's health is as last seen");
                        }
                    }
                } else if controller.contains(ControllerCapability::ListVolumes) {
                    if !listed.contains_key(&record.plugin) {
                        let conditions = list_conditions(&ready.client).await;
                        if let Err(e) = &conditions {
                            tracing::warn!(plugin = %record.plugin, error = %e, "ListVolumes failed; its volumes' health is as last seen");
                        }
                        listed.insert(record.plugin.clone(), conditions.ok());
                    }
                    if let Some(Some(conditions)) = listed.get(&record.plugin) {
                        health.controller = conditions.get(&record.external_id).cloned();
                    }
                }
            }
            now.insert(record.volume.clone(), health);
        }
        let events = changes(&before, &now);
        for e in &events {
            match e {
                VolumeHealthEvent::Abnormal {
                    volume,
                    plugin,
                    source,
                    message,
                } => {
                    tracing::warn!(volume = %volume, plugin = %plugin, source = source.as_str(), message = %message, "volume reported abnormal");
                }
                VolumeHealthEvent::Recovered {
                    volume,
                    plugin,
                    source,
                } => {
                    tracing::info!(volume = %volume, plugin = %plugin, source = source.as_str(), "volume reported normal again");
                }
            }
            let _ = self.events.send(e.clone());
        }
        *self.health.lock().unwrap_or_else(PoisonError::into_inner) = now;
        events
    }
}

/// The conditions `ListVolumes` reports, by the plugin's volume id (a volume listed without
/// a condition is left out).
async fn list_conditions(
    client: &csi_client::CsiClient,
) -> Result<BTreeMap<ExternalVolumeId, VolumeCondition>, csi_client::Error> {
    let volumes = client.controller().list_all_volumes_with_status(0).await?;
    Ok(volumes
        .into_iter()
        .filter_map(|v| Some((v.volume.volume_id, v.status.condition?)))
        .collect())
}

/// What changed between two polls: a condition turning abnormal (or its message changing),
/// and one turning normal again. A volume no longer published here is no event.
fn changes(
    before: &BTreeMap<VolumeId, VolumeHealth>,
    now: &BTreeMap<VolumeId, VolumeHealth>,
) -> Vec<VolumeHealthEvent> {
    let mut out = Vec::new();
    for (volume, health) in now {
        let Some(plugin) = &health.plugin else {
            continue;
        };
        let old = before.get(volume);
        for (source, current, previous) in [
            (
                ConditionSource::Controller,
                health.controller.as_ref(),
                old.and_then(|o| o.controller.as_ref()),
            ),
            (
                ConditionSource::Node,
                health.node.as_ref(),
                old.and_then(|o| o.node.as_ref()),
            ),
        ] {
            let was = previous.filter(|c| c.abnormal);
            match (was, current) {
                (_, Some(c)) if c.abnormal && was != Some(c) => {
                    out.push(VolumeHealthEvent::Abnormal {
                        volume: volume.clone(),
                        plugin: plugin.clone(),
                        source,
                        message: c.message.clone(),
                    })
                }
                (Some(_), Some(c)) if !c.abnormal => out.push(VolumeHealthEvent::Recovered {
                    volume: volume.clone(),
                    plugin: plugin.clone(),
                    source,
                }),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vid(s: &str) -> VolumeId {
        VolumeId::new(s).expect("id")
    }

    fn with(node: Option<(bool, &str)>) -> VolumeHealth {
        VolumeHealth {
            plugin: Some(PluginId::new("p").expect("id")),
            node: node.map(|(abnormal, m)| VolumeCondition {
                abnormal,
                message: m.to_owned(),
            }),
            ..VolumeHealth::default()
        }
    }

    #[test]
    fn abnormal_and_recovered_are_told_once_each_and_a_new_message_again() {
        let at = |h: VolumeHealth| BTreeMap::from([(vid("v"), h)]);
        let none = BTreeMap::new();
        assert!(changes(&none, &at(with(Some((false, ""))))).is_empty());
        let bad = changes(&none, &at(with(Some((true, "disk gone")))));
        assert!(
            matches!(&bad[..], [VolumeHealthEvent::Abnormal { source: ConditionSource::Node, message, .. }] if message == "disk gone"),
            "{bad:?}"
        );
        assert!(
            changes(
                &at(with(Some((true, "disk gone")))),
                &at(with(Some((true, "disk gone"))))
            )
            .is_empty()
        );
        assert_eq!(
            changes(
                &at(with(Some((true, "disk gone")))),
                &at(with(Some((true, "read-only"))))
            )
            .len(),
            1,
            "a new message is told"
        );
        let back = changes(&at(with(Some((true, "x")))), &at(with(Some((false, "")))));
        assert!(
            matches!(
                &back[..],
                [VolumeHealthEvent::Recovered {
                    source: ConditionSource::Node,
                    ..
                }]
            ),
            "{back:?}"
        );
        // No answer is not recovery; a volume gone from here is no event.
        assert!(changes(&at(with(Some((true, "x")))), &at(with(None))).is_empty());
        assert!(changes(&at(with(Some((true, "x")))), &none).is_empty());
        assert_eq!(
            bad[0].to_string(),
            "volume v (plugin p): abnormal, says its node service: disk gone"
        );
        assert_eq!(
            back[0].to_string(),
            "volume v (plugin p): normal again, says its node service"
        );
    }

    #[test]
    fn a_plugin_s_message_is_escaped_for_people() {
        let event = VolumeHealthEvent::Abnormal {
            volume: vid("v"),
            plugin: PluginId::new("p").expect("id"),
            source: ConditionSource::Controller,
            message: "pool degraded\n| forged".into(),
        };
        assert_eq!(
            event.to_string(),
            r"volume v (plugin p): abnormal, says its controller: pool degraded\n| forged"
        );
    }
}
