//! After a restart: the node's usage records confirmed with their plugins, and the
//! publications whose claims are still taken published again.

use std::collections::BTreeSet;
use std::time::Duration;

use csi_node::volumes::{ReconcileAction, Reconciled, Republish, Restore, Restored};
use csi_structs::PluginId;

use super::{ServiceEvent, VolumeService};

/// What [`VolumeService::reconcile_node`] found and did.
#[derive(Clone, Debug)]
pub struct NodeReconciled {
    /// The plugins of restored records that were not fingerprinted and healthy in time; their
    /// records are kept (as the report says).
    pub plugins_not_ready: Vec<PluginId>,
    /// One outcome per restored publication or staging.
    pub report: Reconciled,
}

impl std::fmt::Display for NodeReconciled {
    /// `node's usage records confirmed: 3 record(s): 1 republished, …`, and the plugins that
    /// were not ready in time.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node's usage records confirmed: {}", self.report)?;
        if !self.plugins_not_ready.is_empty() {
            let plugins: Vec<&str> = self.plugins_not_ready.iter().map(|p| p.as_str()).collect();
            write!(f, "; plugins not ready in time: {}", plugins.join(", "))?;
        }
        Ok(())
    }
}

impl VolumeService {
    /// Confirms the node's usage records restored at start against their plugins (csi-node's
    /// [`VolumeManager::reconcile`](csi_node::volumes::VolumeManager::reconcile)), after
    /// waiting up to `wait` for each of their plugins to be fingerprinted and healthy. A
    /// record says what was done before the restart, not what the host has now: a
    /// publication whose claim is taken on this node is staged and published again with the
    /// catalog's capability, context and secrets (read-only as the claim says); every other
    /// one (its claim releasing, or unknown) is kept for its release.
    pub async fn reconcile_node(&self, wait: Duration) -> NodeReconciled {
        let records = self.inner.volumes.records();
        let plugins: BTreeSet<PluginId> = records.iter().map(|r| r.plugin.clone()).collect();
        let deadline = tokio::time::Instant::now() + wait;
        let mut plugins_not_ready = Vec::new();
        for id in plugins {
            if let Err(e) = self.inner.plugins.wait_for(&id, deadline).await {
                tracing::warn!(plugin = %id, error = %e, "plugin of restored usage records not ready; their records are kept");
                plugins_not_ready.push(id);
            }
        }
        let lookup = |p: &Restored| self.restore(p);
        let report = self.inner.volumes.reconcile(&lookup).await;
        let count = |action: ReconcileAction| {
            report
                .records
                .iter()
                .filter(|r| r.action() == action)
                .count()
        };
        tracing::info!(
            records = report.records.len(),
            republished = count(ReconcileAction::Republished),
            released = count(ReconcileAction::Released) + count(ReconcileAction::Cleaned),
            kept = count(ReconcileAction::Kept),
            not_confirmed = report.failed().count(),
            "usage records restored at start confirmed with their plugins"
        );
        self.emit(ServiceEvent::NodeReconciled {
            records: report.records.len(),
            republished: count(ReconcileAction::Republished),
            not_confirmed: report.failed().count(),
        });
        NodeReconciled {
            plugins_not_ready,
            report,
        }
    }

    /// What a restored publication needs to be published again: its claim taken on this
    /// node and the volume in the catalog; otherwise it is kept for its release.
    fn restore(&self, p: &Restored) -> Restore {
        let Some(entry) = self
            .inner
            .catalog
            .get(&p.volume)
            .filter(|e| e.plugin == p.plugin)
        else {
            return Restore::Keep;
        };
        let Some(record) = self.inner.claims.record(&p.volume) else {
            return Restore::Keep;
        };
        let Some(claim) = record.claims().iter().find(|c| {
            c.workload() == &p.workload && c.node() == &self.inner.me && !c.state().is_releasing()
        }) else {
            return Restore::Keep;
        };
        Restore::Republish(Republish {
            capability: entry.capability(),
            read_only: csi_node::attach::read_only(claim),
            volume_context: entry.volume_context(),
            secrets: entry.secrets.clone(),
        })
    }
}
