//! [`RegistryFeed`]: this node's plugins, as csi-rpc-shim's [`Registry`] must know them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use csi_claims::driver::ClaimsHandle;
use csi_client::Fingerprint;
use csi_rpc_shim::{Health, Instance, Registry, ServiceKind};
use csi_structs::{NodeId, PluginId};

use super::NOT_PROBED;
use crate::plugins::{PluginEvent, PluginObserver};

/// A [`PluginObserver`] that keeps csi-rpc-shim's [`Registry`] in step with this node's
/// plugin manager, and wakes the releases that wait for a plugin when it is back.
///
/// - A plugin fingerprinted is published as a controller and/or node instance of this node
///   (the plugin node id from its fingerprint), unhealthy ([`NOT_PROBED`]) until its first
///   probe answers: nothing but release steps is routed to it before that.
/// - Health transitions update the instances; a fingerprint that changed drops the services
///   the plugin no longer offers and keeps the health of the rest.
/// - A plugin gone (its registration removed or replaced) leaves the registry.
/// - When the plugin is fingerprinted or healthy again, the claim driver given with
///   [`wake`](Self::wake) is told, so releases backing off on it retry now.
///
/// Add it to the plugin manager with
/// [`PluginManagerBuilder::observer`](crate::plugins::PluginManagerBuilder::observer).
#[derive(Debug)]
pub struct RegistryFeed {
    me: NodeId,
    registry: Arc<Registry>,
    claims: OnceLock<ClaimsHandle>,
    known: Mutex<BTreeMap<PluginId, Known>>,
}

/// What the registry was told about one plugin.
#[derive(Debug)]
struct Known {
    fingerprint: Option<Arc<Fingerprint>>,
    health: Health,
}

impl RegistryFeed {
    /// A feed of node `me`'s plugins into `registry`.
    pub fn new(me: NodeId, registry: Arc<Registry>) -> Self {
        Self {
            me,
            registry,
            claims: OnceLock::new(),
            known: Mutex::new(BTreeMap::new()),
        }
    }

    /// Wakes `claims`' releases waiting for a plugin when it is fingerprinted or healthy
    /// again (the driver starts after the plugin manager, so it is given here). Returns
    /// `false`, changing nothing, when a driver was given before.
    pub fn wake(&self, claims: ClaimsHandle) -> bool {
        self.claims.set(claims).is_ok()
    }

    /// Records `change` for `id` and publishes the plugin's services with what it then knows.
    fn set(&self, id: &PluginId, change: impl FnOnce(&mut Known)) {
        let (fingerprint, health) = {
            let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            let k = known.entry(id.clone()).or_insert(Known {
                fingerprint: None,
                health: Health::Healthy,
            });
            change(k);
            (k.fingerprint.clone(), k.health.clone())
        };
        let Some(fp) = fingerprint else { return };
        if fp.capabilities.plugin.has_controller_service() {
            self.registry
                .update(&self.me, id, Instance::Controller(health.clone()));
        }
        if let Some(node) = &fp.node {
            self.registry.update(
                &self.me,
                id,
                Instance::Node {
                    plugin_node: node.node_id.clone(),
                    health,
                },
            );
        }
    }

    fn remove(&self, id: &PluginId) {
        self.registry.remove(&self.me, id, ServiceKind::Controller);
        self.registry.remove(&self.me, id, ServiceKind::Node);
    }

    fn wake_releases(&self, id: &PluginId) {
        if let Some(claims) = self.claims.get() {
            claims.plugin_available(id, Some(&self.me));
            claims.plugin_available(id, None);
        }
    }
}

impl PluginObserver for RegistryFeed {
    fn on_event(&self, event: &PluginEvent) {
        match event {
            PluginEvent::Fingerprinted {
                plugin,
                fingerprint: fp,
                previous,
                ..
            } => {
                if previous.as_ref().is_some_and(|old| old != fp) {
                    // Services the plugin no longer offers go; the rest keep their health.
                    self.remove(plugin);
                    self.set(plugin, |k| k.fingerprint = Some(Arc::clone(fp)));
                    return;
                }
                self.set(plugin, |k| {
                    k.fingerprint = Some(Arc::clone(fp));
                    k.health = Health::unhealthy(NOT_PROBED);
                });
                self.wake_releases(plugin);
            }
            PluginEvent::Healthy { plugin, .. } => {
                self.set(plugin, |k| k.health = Health::Healthy);
                self.wake_releases(plugin);
            }
            PluginEvent::Unhealthy { plugin, why, .. } => {
                self.set(plugin, |k| k.health = Health::unhealthy(why.to_string()));
            }
            PluginEvent::Gone { plugin, .. } => {
                self.known
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(plugin);
                self.remove(plugin);
            }
            _ => {}
        }
    }
}
