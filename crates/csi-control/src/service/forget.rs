//! Deregister (forget without the plugin) and delete (in the plugin too).

use std::collections::BTreeSet;

use csi_claims::{Claim, NodeStep};
use csi_rpc_shim::{ControllerQuery, DeleteVolume};
use csi_structs::{SecretsUse, VolumeId};

use super::error::{invalid, no_volume};
use super::{ServiceError, ServiceEvent, VolumeService};
use crate::catalog::CatalogEntry;

/// What a deregistration did.
#[derive(Clone, Debug)]
pub struct Deregistered {
    /// The volume's entry as it was.
    pub entry: CatalogEntry,
    /// How many claims were forgotten without being released (a forced deregistration).
    pub dropped_claims: usize,
    /// What stays in the plugin and on nodes, each with the call that would remove it.
    pub left_behind: Vec<Leftover>,
}

/// Something a deregistration leaves behind (its `Display` says what, and which call
/// removes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover(String);

impl std::fmt::Display for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl VolumeService {
    /// Drops a volume from the catalog without calling the plugin. Without `force` it must
    /// have no claims; with `force` (and `confirmed`) its claims are forgotten, not released.
    /// The answer lists what stays in the plugin and on nodes, with the call that would
    /// remove each. A volume that may exist only (an uncertain create) is deregistered too.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Conflict`] for claims without `force`, [`ServiceError::Invalid`]
    /// (field `confirmed`, listing what would be left) for `force` without `confirmed`,
    /// [`ServiceError::Unsupported`] for `force` when the claims cannot be forgotten (no
    /// [`forgetting`](super::VolumeServiceBuilder::forgetting) store, and claims not shared).
    pub async fn deregister_volume(
        &self,
        volume: &VolumeId,
        force: bool,
        confirmed: bool,
    ) -> Result<Deregistered, ServiceError> {
        self.to_the_end("deregister_volume", Some(volume), |s| {
            let volume = volume.clone();
            async move { s.run_deregister_volume(&volume, force, confirmed).await }
        })
        .await
    }

    /// [`deregister_volume`](Self::deregister_volume), in its task.
    async fn run_deregister_volume(
        &self,
        volume: &VolumeId,
        force: bool,
        confirmed: bool,
    ) -> Result<Deregistered, ServiceError> {
        let entry = self.any_entry(volume)?;
        let claims = self.claims_of(&entry.id);
        let left = self.leftovers(&entry, &claims);
        if !claims.is_empty() && !force {
            return Err(ServiceError::Conflict(format!(
                "volume {volume} still has {} claim(s); release them (or `volume detach` a gone \
                 node's), or deregister with --force to forget them",
                claims.len()
            )));
        }
        if force
            && !claims.is_empty()
            && self.inner.forgetting.is_none()
            && !self.inner.peers.shares_claims()
        {
            return Err(ServiceError::Unsupported(format!(
                "volume {volume}'s {} claim(s) cannot be forgotten: this service has no claim \
                 store to forget them through; release them (or `volume detach` a gone \
                 node's) instead",
                claims.len()
            )));
        }
        if force && !confirmed {
            return Err(invalid(
                "confirmed",
                format!(
                    "a forced deregistration forgets {} claim(s) of volume {volume} without \
                     releasing them, and leaves: {}; confirm it (--yes) to go ahead",
                    claims.len(),
                    left.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            ));
        }
        if claims.is_empty() {
            // As `delete`: no claim is admitted from here on.
            if self.inner.catalog.mark_deleting(&entry.id).await?.is_none() {
                return Err(no_volume(volume));
            }
            self.inner.catalog.remove(&entry.id).await?;
        } else {
            if let Some(store) = &self.inner.forgetting {
                store.forget(&entry.id).await?;
            }
            self.inner.catalog.forget(&entry.id).await?;
            tracing::warn!(volume = %entry.id, claims = claims.len(), "volume deregistered by force: its claims are forgotten, not released");
        }
        tracing::info!(volume = %entry.id, "volume deregistered; the plugin keeps it");
        self.emit(ServiceEvent::VolumeDeregistered {
            volume: entry.id.clone(),
            dropped_claims: claims.len(),
        });
        Ok(Deregistered {
            entry,
            dropped_claims: claims.len(),
            left_behind: left,
        })
    }

    /// What stays behind when the service forgets `entry` with `claims`: the volume in the
    /// plugin; this node's publications and staging of it, from its usage records; the
    /// other nodes' publications whose node steps were not done (or skipped, the node
    /// reported gone for good), from the claims; and the attachments not undone.
    fn leftovers(&self, entry: &CatalogEntry, claims: &[Claim]) -> Vec<Leftover> {
        if let Some(may) = &entry.may_exist {
            return vec![Leftover(format!(
                "a volume that may exist in plugin {} under name {} ({}): CreateVolume by that \
                 name, then DeleteVolume of the id it gives, removes it",
                entry.plugin, entry.id, may.why
            ))];
        }
        let mut out = vec![Leftover(format!(
            "volume {} in plugin {}{}: DeleteVolume removes it",
            entry.external_id,
            entry.plugin,
            if entry.created {
                " (created by this agent)"
            } else {
                ""
            }
        ))];
        // This node's publications and staging, from its usage records (whatever its
        // claims say: a claim released while this node was reported gone keeps its mounts).
        let records: Vec<_> = self
            .inner
            .volumes
            .records()
            .into_iter()
            .filter(|r| r.volume == entry.id)
            .collect();
        let kept = "its usage record stays in this node's database";
        let mut attached = BTreeSet::new();
        for c in claims {
            let on_me = c.node() == &self.inner.me;
            let recorded = on_me && records.iter().any(|r| r.users.contains_key(c.workload()));
            match c.state().node_step() {
                _ if recorded => {}
                None => out.push(Leftover(format!(
                    "publication for workload {} on node {}: NodeUnpublishVolume (and \
                     NodeUnstageVolume with the node's last one) not done",
                    c.workload(),
                    c.node()
                ))),
                Some(NodeStep::SkippedNodeGone) if !on_me => out.push(Leftover(format!(
                    "publication for workload {} on node {}, reported gone for good: \
                     NodeUnpublishVolume (and NodeUnstageVolume with the node's last one) \
                     skipped; if the node comes back, its mounts stay there (its agent no \
                     longer knows the volume)",
                    c.workload(),
                    c.node()
                ))),
                Some(_) => {}
            }
            if entry.controller_publish
                && c.state().controller_step().is_none()
                && attached.insert(c.node().clone())
            {
                out.push(Leftover(format!(
                    "attachment to node {} (plugin node {}): ControllerUnpublishVolume not done",
                    c.node(),
                    c.plugin_node()
                )));
            }
        }
        for r in &records {
            for (workload, user) in &r.users {
                out.push(Leftover(format!(
                    "publication for workload {workload} on node {} at {} (plugin {}): \
                     NodeUnpublishVolume not done; {kept}",
                    self.inner.me,
                    user.target.display(),
                    r.plugin
                )));
            }
            let stagings = r
                .staging
                .iter()
                .filter(|_| r.stage.is_some())
                .chain(r.legacy_stagings.iter().map(|l| &l.path));
            for staging in stagings {
                out.push(Leftover(format!(
                    "staging on node {} at {} (plugin {}): NodeUnstageVolume not done; {kept}",
                    self.inner.me,
                    staging.display(),
                    r.plugin
                )));
            }
        }
        out
    }

    /// Deletes a volume with no claims: `DeleteVolume` when the orchestrator created it, then
    /// out of the catalog. From its start no claim is admitted; in a cluster, a claim another
    /// node made a moment before makes the delete fail instead.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Conflict`] while claims remain, and the call's error (the volume
    /// stays in the catalog, marked deleting, and a delete again finishes it).
    pub async fn delete(&self, volume: &VolumeId) -> Result<CatalogEntry, ServiceError> {
        self.to_the_end("delete", Some(volume), |s| {
            let volume = volume.clone();
            async move { s.run_delete(&volume).await }
        })
        .await
    }

    /// [`delete`](Self::delete), in its task.
    async fn run_delete(&self, volume: &VolumeId) -> Result<CatalogEntry, ServiceError> {
        let entry = self.entry(volume)?;
        let claims = self
            .inner
            .claims
            .stored_record(&entry.id)
            .map_or(0, |r| r.claims().len());
        if claims > 0 {
            return Err(ServiceError::Conflict(format!(
                "volume {volume} still has {claims} claim(s); release them first"
            )));
        }
        let Some(entry) = self.inner.catalog.mark_deleting(&entry.id).await? else {
            return Err(no_volume(volume));
        };
        if entry.created {
            self.inner
                .shim
                .delete_volume(
                    DeleteVolume {
                        query: ControllerQuery::new(entry.plugin.clone()),
                        volume: entry.id.clone(),
                        external_volume: entry.external_id.clone(),
                        secrets: entry.secrets.for_use(SecretsUse::Delete),
                    },
                    self.inner.call_timeout,
                )
                .await
                .map_err(|e| ServiceError::shim("DeleteVolume", &e))?;
        }
        self.inner.catalog.remove(&entry.id).await?;
        tracing::info!(volume = %entry.id, "volume deleted");
        self.emit(ServiceEvent::VolumeDeleted {
            volume: entry.id.clone(),
            in_plugin: entry.created,
        });
        Ok(entry)
    }
}
