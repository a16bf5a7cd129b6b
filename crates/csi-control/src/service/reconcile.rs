//! After a restart: the node's usage records confirmed with their plugins, the publications
//! whose claims are still taken published again, and those whose claims were let go while
//! the node was reported gone released.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use csi_claims::{ClaimState, NodeStep};
use csi_node::volumes::{
    ReconcileAction, ReconcileOutcome, Reconciled, Republish, Restore, Restored, Unmounted,
    VolumeEntry,
};
use csi_structs::{PluginId, VolumeId, WorkloadId};

use super::{ServiceEvent, VolumeService};

/// What [`VolumeService::reconcile_node`] found and did.
#[derive(Clone, Debug)]
pub struct NodeReconciled {
    /// The plugins of restored records that were not fingerprinted and healthy in time; their
    /// records are kept (as the report says).
    pub plugins_not_ready: Vec<PluginId>,
    /// One outcome per restored publication or staging.
    pub report: Reconciled,
    /// The publications released because their claims were let go while this node was
    /// reported gone (each is in [`report`](Self::report) too, as released).
    pub released_while_gone: Vec<ReleasedWhileGone>,
}

impl std::fmt::Display for NodeReconciled {
    /// `node's usage records confirmed: 3 record(s): 1 republished, …`, the publications
    /// released while the node was reported gone, and the plugins that were not ready in
    /// time.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node's usage records confirmed: {}", self.report)?;
        if !self.released_while_gone.is_empty() {
            let released: Vec<String> = self
                .released_while_gone
                .iter()
                .map(ToString::to_string)
                .collect();
            write!(
                f,
                "; released while this node was reported gone: {}",
                released.join(", ")
            )?;
        }
        if !self.plugins_not_ready.is_empty() {
            let plugins: Vec<&str> = self.plugins_not_ready.iter().map(|p| p.as_str()).collect();
            write!(f, "; plugins not ready in time: {}", plugins.join(", "))?;
        }
        Ok(())
    }
}

/// A publication restored at start whose claim was let go while this node was reported gone
/// for good (the release skipped its node steps): unpublished, and unstaged with the
/// volume's last publication here, by [`VolumeService::reconcile_node`] before any other
/// record, and its usage record removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleasedWhileGone {
    /// The plugin.
    pub plugin: PluginId,
    /// The volume.
    pub volume: VolumeId,
    /// The workload.
    pub workload: WorkloadId,
    /// How its claim stood.
    pub claim: WhileGone,
    /// What the plugin was asked.
    pub done: Unmounted,
}

impl ReleasedWhileGone {
    /// What the plugin was asked, in words: `unpublished and unstaged`, `unpublished`,
    /// `unstaged` or `nothing left to unpublish`.
    pub const fn done_str(&self) -> &'static str {
        match (self.done.unpublished, self.done.unstaged) {
            (true, true) => "unpublished and unstaged",
            (true, false) => "unpublished",
            (false, true) => "unstaged",
            (false, false) => "nothing left to unpublish",
        }
    }
}

impl std::fmt::Display for ReleasedWhileGone {
    /// `volume v1 for workload w1 (plugin ebs): unpublished and unstaged; its claim was
    /// released meanwhile, its controller step resumed`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "volume {} for workload {} (plugin {}): {}; {}",
            self.volume,
            self.workload,
            self.plugin,
            self.done_str(),
            self.claim
        )
    }
}

/// How the claim of a [`ReleasedWhileGone`] publication stood.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhileGone {
    /// Freed: no longer among the volume's claims.
    Freed,
    /// Released without its node steps, its controller step (`ControllerUnpublishVolume`)
    /// not done yet, typically refused by the plugin while the volume was still staged or
    /// published here. The node steps are now recorded as done by this node, and the
    /// controller step is retried at once, by whichever node performs it.
    ControllerStepResumed,
    /// Released without its node steps, its controller step done (or skipped) already, or
    /// the claim moved on while this node released the publication.
    ControllerStepDone,
}

impl WhileGone {
    /// In a word: `freed`, `controller_step_resumed` or `controller_step_done`.
    pub const fn as_str(self) -> &'static str {
        match self {
            WhileGone::Freed => "freed",
            WhileGone::ControllerStepResumed => "controller_step_resumed",
            WhileGone::ControllerStepDone => "controller_step_done",
        }
    }
}

impl std::fmt::Display for WhileGone {
    /// In words: `its claim was freed meanwhile`, `its claim was released meanwhile, its
    /// controller step resumed`, or `…, its controller step done`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WhileGone::Freed => "its claim was freed meanwhile",
            WhileGone::ControllerStepResumed => {
                "its claim was released meanwhile, its controller step resumed"
            }
            WhileGone::ControllerStepDone => {
                "its claim was released meanwhile, its controller step done"
            }
        })
    }
}

/// How a restored publication's claim stands.
enum Standing {
    /// Taken on this node: published again with these fields.
    Taken(Republish),
    /// Let go while this node was reported gone: released.
    LetGo(WhileGone),
    /// Not known, or its release's node step is this node's own to run: kept.
    Unknown,
}

impl VolumeService {
    /// Confirms the node's usage records restored at start against their plugins (csi-node's
    /// [`VolumeManager::reconcile`](csi_node::volumes::VolumeManager::reconcile)), after
    /// waiting up to `wait` for each of their plugins to be fingerprinted and healthy. A
    /// record says what was done before the restart, not what the host has now:
    ///
    /// - a publication whose claim was let go while this node was reported gone for good
    ///   (freed, or released without its node steps: `volume detach --node-gone`) is
    ///   released first, before any other record: unpublished, unstaged with the volume's
    ///   last publication here, and its record removed. The controller step of such a claim
    ///   may be waiting on it (a plugin refuses `ControllerUnpublishVolume` while the
    ///   volume is staged or published on the node): the claim's node steps are then
    ///   recorded as done and the controller step retried at once, wherever it runs
    ///   ([`ClaimsHandle::node_detached_after_return`](csi_claims::driver::ClaimsHandle::node_detached_after_return)).
    ///   [`NodeReconciled::released_while_gone`] lists them;
    /// - a publication whose claim is taken on this node is staged and published again with
    ///   the catalog's capability, context and secrets (read-only as the claim says);
    /// - every other one (its claim releasing with its node step still to run here, or its
    ///   volume unknown to the catalog) is kept for its release.
    pub async fn reconcile_node(&self, wait: Duration) -> NodeReconciled {
        let records = self.inner.volumes.records();
        let deadline = tokio::time::Instant::now() + wait;
        // Which publications were released because their claims were let go while away.
        let let_go: Mutex<BTreeMap<(PluginId, VolumeId, WorkloadId), WhileGone>> =
            Mutex::new(BTreeMap::new());
        let lookup = |p: &Restored| match self.standing(p) {
            Standing::Taken(r) => Restore::Republish(r),
            Standing::LetGo(how) => {
                let key = (p.plugin.clone(), p.volume.clone(), p.workload.clone());
                let_go
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key, how);
                Restore::Release
            }
            Standing::Unknown => Restore::Keep,
        };
        let released = |report: &Reconciled| {
            let let_go = let_go
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            self.resume_controller_steps(report, &let_go)
        };
        // Those first, their plugins waited for first: a controller step may be waiting on
        // them.
        let first: BTreeSet<(PluginId, VolumeId)> = records
            .iter()
            .filter(|r| r.users.keys().any(|w| self.let_go(r, w)))
            .map(|r| (r.plugin.clone(), r.volume.clone()))
            .collect();
        let is_first = |e: &VolumeEntry| first.contains(&(e.plugin.clone(), e.volume.clone()));
        let (early, late): (Vec<&VolumeEntry>, Vec<&VolumeEntry>) =
            records.iter().partition(|r| is_first(r));
        let mut plugins_not_ready = self.wait_for_plugins(&early, &[], deadline).await;
        let mut report = self.inner.volumes.reconcile_where(&lookup, &is_first).await;
        let mut released_while_gone = released(&report);
        // The others (and a claim let go meanwhile, released as the first were).
        plugins_not_ready.extend(
            self.wait_for_plugins(&late, &plugins_not_ready, deadline)
                .await,
        );
        let rest = self
            .inner
            .volumes
            .reconcile_where(&lookup, &|e| !is_first(e))
            .await;
        released_while_gone.extend(released(&rest));
        report.records.extend(rest.records);

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
            released_while_gone = released_while_gone.len(),
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
            released_while_gone,
        }
    }

    /// Waits until `deadline` for the plugins of `records` (but those in `given_up`) to be
    /// fingerprinted and healthy; returns those that were not.
    async fn wait_for_plugins(
        &self,
        records: &[&VolumeEntry],
        given_up: &[PluginId],
        deadline: tokio::time::Instant,
    ) -> Vec<PluginId> {
        let plugins: BTreeSet<&PluginId> = records
            .iter()
            .map(|r| &r.plugin)
            .filter(|p| !given_up.contains(p))
            .collect();
        let mut not_ready = Vec::new();
        for id in plugins {
            if let Err(e) = self.inner.plugins.wait_for(id, deadline).await {
                tracing::warn!(plugin = %id, error = %e, "plugin of restored usage records not ready; their records are kept");
                not_ready.push(id.clone());
            }
        }
        not_ready
    }

    /// The publications of `report` released because their claims were let go while away;
    /// for each claim whose controller step waits, its node steps are recorded as done here
    /// and the step retried at once.
    fn resume_controller_steps(
        &self,
        report: &Reconciled,
        let_go: &BTreeMap<(PluginId, VolumeId, WorkloadId), WhileGone>,
    ) -> Vec<ReleasedWhileGone> {
        let mut out = Vec::new();
        for record in &report.records {
            let (ReconcileOutcome::Released(done), Some(workload)) =
                (&record.outcome, &record.workload)
            else {
                continue;
            };
            let key = (
                record.plugin.clone(),
                record.volume.clone(),
                workload.clone(),
            );
            let Some(&how) = let_go.get(&key) else {
                continue;
            };
            let claim = match how {
                WhileGone::ControllerStepResumed
                    if !self.inner.claims.node_detached_after_return(
                        &record.volume,
                        workload,
                        &self.inner.me,
                        done.unstaged,
                    ) =>
                {
                    WhileGone::ControllerStepDone
                }
                other => other,
            };
            tracing::info!(
                plugin = %record.plugin,
                volume = %record.volume,
                workload = %workload,
                unpublished = done.unpublished,
                unstaged = done.unstaged,
                claim = %claim,
                "publication released: its claim was let go while this node was reported gone"
            );
            out.push(ReleasedWhileGone {
                plugin: record.plugin.clone(),
                volume: record.volume.clone(),
                workload: workload.clone(),
                claim,
                done: *done,
            });
        }
        out
    }

    /// Whether `workload`'s publication in `record` is of a claim let go while away.
    fn let_go(&self, record: &VolumeEntry, workload: &WorkloadId) -> bool {
        self.in_catalog(&record.plugin, &record.volume)
            && matches!(
                self.claim_standing(&record.volume, workload),
                ClaimNow::LetGo(_)
            )
    }

    /// Whether `volume` is in the catalog under `plugin`.
    fn in_catalog(&self, plugin: &PluginId, volume: &VolumeId) -> bool {
        self.inner
            .catalog
            .get(volume)
            .is_some_and(|e| &e.plugin == plugin)
    }

    /// How a restored publication's claim stands, with what a publication needs: its
    /// claim taken on this node and the volume in the catalog.
    fn standing(&self, p: &Restored) -> Standing {
        let Some(entry) = self
            .inner
            .catalog
            .get(&p.volume)
            .filter(|e| e.plugin == p.plugin)
        else {
            return Standing::Unknown;
        };
        match self.claim_standing(&p.volume, &p.workload) {
            ClaimNow::Taken { read_only } => Standing::Taken(Republish {
                capability: entry.capability(),
                read_only,
                volume_context: entry.volume_context(),
                secrets: entry.secrets.clone(),
            }),
            ClaimNow::LetGo(how) => Standing::LetGo(how),
            ClaimNow::Releasing => Standing::Unknown,
        }
    }

    /// How `workload`'s claim of `volume` on this node stands in the claims.
    fn claim_standing(&self, volume: &VolumeId, workload: &WorkloadId) -> ClaimNow {
        let record = self.inner.claims.record(volume);
        let claim = record.as_ref().and_then(|r| {
            r.claims()
                .iter()
                .find(|c| c.workload() == workload && c.node() == &self.inner.me)
        });
        let Some(claim) = claim else {
            // Freed, though its node steps never ran here: they were skipped, the node
            // reported gone for good.
            return ClaimNow::LetGo(WhileGone::Freed);
        };
        let state = claim.state();
        match (state, state.node_step()) {
            (ClaimState::Taken, _) => ClaimNow::Taken {
                read_only: csi_node::attach::read_only(claim),
            },
            (ClaimState::NodeDetached(_), Some(NodeStep::SkippedNodeGone)) => {
                ClaimNow::LetGo(WhileGone::ControllerStepResumed)
            }
            (_, Some(NodeStep::SkippedNodeGone)) => ClaimNow::LetGo(WhileGone::ControllerStepDone),
            _ => ClaimNow::Releasing,
        }
    }
}

/// How the claim of a publication on this node stands: [`VolumeService::claim_standing`].
enum ClaimNow {
    /// Taken: the workload still uses the volume.
    Taken {
        /// Whether it is published read-only.
        read_only: bool,
    },
    /// Let go while this node was reported gone: its node steps were skipped.
    LetGo(WhileGone),
    /// Releasing, its node step still to run here (by this node's release pipeline).
    Releasing,
}
