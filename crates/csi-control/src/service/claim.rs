//! Claim (and publish here), release, and detach a node's claims.

use std::path::PathBuf;

use csi_claims::{Claim, ClaimMode, ClaimRequest};
use csi_node::layout::PublishUsage;
use csi_node::volumes::{ExpandRequest, MountRequest};
use csi_rpc_shim::{ControllerAttach, ControllerQuery};
use csi_structs::topology::check_accessible;
use csi_structs::{NodeId, PluginNodeId, PublishContext, SecretsUse, VolumeId, WorkloadId};

use super::error::{deleting, invalid, no_volume};
use super::{ServiceError, ServiceEvent, VolumeService};
use crate::catalog::CatalogEntry;

/// A claim to take: [`VolumeService::claim`].
#[derive(Clone, Debug)]
pub struct ClaimVolume {
    /// The volume.
    pub volume: VolumeId,
    /// The workload claiming it.
    pub workload: WorkloadId,
    /// Read or write.
    pub mode: ClaimMode,
}

impl ClaimVolume {
    /// A claim of `volume` for `workload` in `mode`. Every field is required; this is the
    /// literal in one call, like the service's other requests.
    pub fn new(volume: VolumeId, workload: WorkloadId, mode: ClaimMode) -> Self {
        ClaimVolume {
            volume,
            workload,
            mode,
        }
    }
}

/// A claim taken and published on this node.
#[derive(Clone, Debug)]
pub struct Claimed {
    /// The claim, as stored.
    pub claim: Claim,
    /// Where the volume is published for the workload.
    pub target_path: PathBuf,
}

/// A detach of a node's claims: [`VolumeService::detach`].
#[derive(Clone, Debug)]
pub struct DetachVolume {
    /// The volume.
    pub volume: VolumeId,
    /// The node whose claims go.
    pub node: NodeId,
    /// The node is gone for good: its claims are released without node steps, and the
    /// controller step runs though its agent is not there.
    pub node_gone: bool,
}

impl DetachVolume {
    /// A detach of `node`'s claims on `volume`, the node not reported gone (its agent runs
    /// the node steps); set [`node_gone`](Self::node_gone) on the result for a node gone for
    /// good (`DetachVolume { node_gone: true, ..DetachVolume::new(volume, node) }`).
    pub fn new(volume: VolumeId, node: NodeId) -> Self {
        DetachVolume {
            volume,
            node,
            node_gone: false,
        }
    }
}

/// What a detach started.
#[derive(Clone, Debug)]
pub struct Detached {
    /// The workloads whose claims on the node are releasing.
    pub releasing: Vec<WorkloadId>,
    /// Whether the node was reported gone for good.
    pub node_gone: bool,
    /// Something the operator should know (the node's agent is not reachable).
    pub note: Option<String>,
}

impl VolumeService {
    /// Claims a volume for a workload on this node and publishes it here: claim (durable),
    /// controller publish through the shim when the volume needs it and is not attached to
    /// this node yet, then stage and publish. `ControllerPublishVolume` goes once per volume
    /// and node, whatever the number of claims there: a claim of a volume this node's usage
    /// records show attached (another claim's, or one from before a restart) reuses the
    /// `publish_context` recorded with it, and claims of one volume on this node take turns
    /// publishing it ([`VolumeManager::attach_turn`](csi_node::volumes::VolumeManager::attach_turn)).
    /// The release pipeline sends `ControllerUnpublishVolume` with the last claim on the node.
    /// When publishing fails after the claim, the claim is released at once so the release
    /// pipeline undoes whatever may have happened (uncertain outcomes included), and the
    /// answer waits for that (up to the call timeout) and says how it ended. A node expansion
    /// left waiting for a claim runs after the publish.
    ///
    /// Refused before anything is recorded or called: a volume being deleted or that may
    /// exist only, a plugin not known to be healthy here, a node outside the volume's
    /// accessible topology, a workload id that cannot name a directory, a node where the
    /// plugin's attach limit (`max_volumes_per_node`) is reached
    /// ([`ClaimError::AttachLimit`](csi_claims::ClaimError::AttachLimit)).
    ///
    /// A claim whose only obstacle is claims being released (the workload's own earlier
    /// claim, restarted on this node; the capacity another workload's releasing claim still
    /// holds; the attach limit held by releasing claims) waits for them to be freed, up to
    /// the service's call timeout, and is then admitted: see
    /// [`claim_until`](Self::claim_until) to give another deadline.
    ///
    /// # Errors
    ///
    /// [`ServiceError`]: the refusals above, the claim layer's, and the publish's.
    pub async fn claim(&self, r: ClaimVolume) -> Result<Claimed, ServiceError> {
        self.claim_until(r, tokio::time::Instant::now() + self.inner.call_timeout)
            .await
    }

    /// [`claim`](Self::claim), waiting at most until `deadline` for the claims being released
    /// in its way ([`ClaimsHandle::claim_until`](csi_claims::driver::ClaimsHandle::claim_until)).
    /// The deadline bounds that wait; the plugin calls after the claim keep their own
    /// deadlines (the call timeout each). A refusal that waiting cannot fix comes at once.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim); a claim still refused by releasing claims at the deadline
    /// is [`DriverError::WaitedForRelease`](csi_claims::driver::DriverError::WaitedForRelease)
    /// (the refusal, how long it waited and for which claims), with the refusal's class.
    pub async fn claim_until(
        &self,
        r: ClaimVolume,
        deadline: tokio::time::Instant,
    ) -> Result<Claimed, ServiceError> {
        let volume = r.volume.clone();
        self.to_the_end("claim", Some(&volume), move |s| async move {
            s.run_claim(r, deadline).await
        })
        .await
    }

    /// [`claim_until`](Self::claim_until), in its task.
    async fn run_claim(
        &self,
        r: ClaimVolume,
        deadline: tokio::time::Instant,
    ) -> Result<Claimed, ServiceError> {
        let entry = self.entry(&r.volume)?;
        if entry.deleting {
            return Err(deleting(&entry.id));
        }
        let workload = r.workload;
        let mode = r.mode;
        // Nothing is published through a plugin whose health is not known to be good:
        // refused (retryably, naming the plugin and its health) before the claim.
        let ready = self
            .inner
            .volumes
            .publishable(&entry.plugin)
            .map_err(|e| ServiceError::node("claim", &e))?;
        let plugin_node = ready
            .fingerprint
            .node
            .as_ref()
            .map(|n| n.node_id.clone())
            .ok_or_else(|| ServiceError::Conflict("node plugin reported no node id".into()))?;
        let node_topology = ready
            .fingerprint
            .node
            .as_ref()
            .and_then(|n| n.topology.as_ref());
        if let Err(refused) = check_accessible(&entry.accessible_topology, node_topology) {
            return Err(ServiceError::Conflict(format!(
                "volume {} is {refused} (plugin {} on node {})",
                entry.id, entry.plugin, self.inner.me,
            )));
        }
        let read_only = mode == ClaimMode::Read || entry.access_mode.is_read_only();
        self.inner
            .volumes
            .layout()
            .target_path(
                &entry.id,
                &workload,
                &PublishUsage::of(&entry.capability(), read_only),
            )
            .map_err(|e| invalid("workload", e))?;
        // The plugin's attach limit counts against every claim on this node, before any call.
        let attach_limit = ready.fingerprint.node.as_ref().and_then(|n| n.max_volumes);
        let claim = self
            .inner
            .claims
            .claim_until(
                &entry.info(),
                ClaimRequest {
                    volume: entry.id.clone(),
                    workload: workload.clone(),
                    node: self.inner.me.clone(),
                    plugin_node: plugin_node.clone(),
                    mode,
                    access_mode: entry.access_mode,
                    attachment: entry.attachment,
                },
                attach_limit,
                deadline,
            )
            .await?;
        tracing::info!(volume = %entry.id, workload = %workload, "claim durable");
        // In a cluster another node may have deleted the volume between our read of the
        // catalog and the claim: its delete compares the claims key, so it either failed (our
        // claim came first) or came first, and then the volume is gone now.
        let refusal = match self.inner.catalog.confirm(&entry.id).await {
            Ok(Some(now)) if !now.deleting => None,
            Ok(Some(_)) => Some(deleting(&entry.id)),
            Ok(None) => Some(no_volume(&entry.id)),
            Err(e) => Some(e.into()),
        };
        if let Some(refusal) = refusal {
            tracing::warn!(volume = %entry.id, workload = %workload, error = %refusal, "claim given up: the volume is being deleted");
            if let Err(r) = self.inner.claims.release(&entry.id, &workload).await {
                tracing::warn!(volume = %entry.id, workload = %workload, error = %r, "release of the given-up claim was refused");
            }
            return Err(refusal);
        }
        match self
            .publish(&entry, &workload, &plugin_node, read_only)
            .await
        {
            Ok(target_path) => {
                self.emit(ServiceEvent::Claimed {
                    volume: entry.id.clone(),
                    workload: workload.clone(),
                    target_path: target_path.clone(),
                });
                self.pending_node_expansion(&entry).await;
                Ok(Claimed { claim, target_path })
            }
            Err(e) => {
                tracing::warn!(volume = %entry.id, workload = %workload, error = %e, "publishing failed; releasing the claim");
                // The release undoes whatever the publish may have done (an uncertain
                // controller publish included); the answer waits for it, up to a call's time.
                let deadline = tokio::time::Instant::now() + self.inner.call_timeout;
                let (undone, note) = match self
                    .inner
                    .claims
                    .release_and_wait_until(&entry.id, &workload, deadline)
                    .await
                {
                    Ok(_) => (
                        true,
                        "the claim is released and whatever the publish may have done is undone"
                            .to_owned(),
                    ),
                    Err(r) => {
                        tracing::warn!(volume = %entry.id, workload = %workload, error = %r, "release after failed publish not finished");
                        (
                            false,
                            format!(
                                "the claim's release, which undoes whatever the publish may have done, is not finished: {r}"
                            ),
                        )
                    }
                };
                self.emit(ServiceEvent::PublishFailed {
                    volume: entry.id.clone(),
                    workload,
                    undone,
                });
                Err(e.with_note(&note))
            }
        }
    }

    async fn publish(
        &self,
        entry: &CatalogEntry,
        workload: &WorkloadId,
        plugin_node: &PluginNodeId,
        read_only: bool,
    ) -> Result<PathBuf, ServiceError> {
        // One attach of the volume at a time on this node: a claim that comes while another
        // publishes the volume here waits, then finds what that one recorded.
        let _turn = self
            .inner
            .volumes
            .attach_turn(&entry.plugin, &entry.id)
            .await;
        let recorded = entry
            .controller_publish
            .then(|| self.inner.volumes.publish_context(&entry.plugin, &entry.id))
            .flatten();
        let publish_context = if let Some(context) = recorded {
            // Attached here already (for another claim, or before a restart): one
            // ControllerPublishVolume per volume and node, whatever the claims there.
            tracing::debug!(volume = %entry.id, "controller publish to this node known done; its publish_context reused");
            context
        } else if entry.controller_publish {
            self.inner
                .shim
                .controller_attach(
                    ControllerAttach {
                        query: ControllerQuery::new(entry.plugin.clone()),
                        volume: entry.id.clone(),
                        external_volume: entry.external_id.clone(),
                        node: self.inner.me.clone(),
                        plugin_node: plugin_node.clone(),
                        capability: entry.capability(),
                        // The attachment is the volume's on this node, shared by every claim
                        // here (read or write), so it is read-only only when the access mode
                        // is; a read claim is read-only at its own NodePublishVolume. A
                        // per-claim value would make a write claim after a read claim on the
                        // same node an ALREADY_EXISTS (published with another readonly). The
                        // backend that calls the plugin sends it only with PUBLISH_READONLY.
                        read_only: entry.access_mode.is_read_only(),
                        secrets: entry.secrets.for_use(SecretsUse::ControllerPublish),
                        volume_context: entry.volume_context(),
                    },
                    self.inner.call_timeout,
                )
                .await
                .map_err(|e| ServiceError::shim("ControllerPublishVolume", &e))?
                .publish_context
        } else {
            PublishContext::default()
        };
        self.inner
            .volumes
            .mount(&MountRequest {
                plugin: entry.plugin.clone(),
                volume: entry.id.clone(),
                external_id: entry.external_id.clone(),
                capability: entry.capability(),
                read_only,
                workload: workload.clone(),
                publish_context,
                volume_context: entry.volume_context(),
                secrets: entry.secrets.clone(),
            })
            .await
            .map_err(|e| ServiceError::node("mount", &e))
    }

    /// The `NodeExpandVolume` an expansion left for the volume's next claim, run here now
    /// that it is published (the spec's order for offline expansion: controller expand,
    /// stage and publish, then node expand). A failure is logged and the expansion stays
    /// pending for the next claim or expansion.
    async fn pending_node_expansion(&self, entry: &CatalogEntry) {
        let Some(wanted) = entry.node_expansion else {
            return;
        };
        let Ok(capacity) = csi_structs::CapacityRange::new(Some(wanted), None) else {
            return;
        };
        let request = ExpandRequest {
            plugin: entry.plugin.clone(),
            volume: entry.id.clone(),
            external_id: entry.external_id.clone(),
            capacity,
            capability: Some(entry.capability()),
            secrets: entry.secrets.for_use(SecretsUse::NodeExpand),
        };
        let done = match self.inner.volumes.expand(&request).await {
            Ok(_) => {
                tracing::info!(volume = %entry.id, capacity_bytes = wanted, "pending node expansion done");
                if let Err(e) = self
                    .inner
                    .catalog
                    .update(&entry.id, &|e| e.node_expansion = None)
                    .await
                {
                    tracing::warn!(volume = %entry.id, error = %e, "the done node expansion could not be recorded; it runs again");
                }
                true
            }
            Err(e) => {
                tracing::warn!(volume = %entry.id, error = %e, "pending node expansion failed; it stays pending");
                false
            }
        };
        self.emit(ServiceEvent::PendingNodeExpansion {
            volume: entry.id.clone(),
            capacity_bytes: wanted,
            done,
        });
    }

    /// Starts releasing a claim; returns once the release is durable (the release pipeline
    /// runs the steps, and its progress goes out as [`ServiceEvent::ReleaseStarted`],
    /// [`ServiceEvent::ReleaseStepFailed`], … [`ServiceEvent::Freed`]).
    ///
    /// # Errors
    ///
    /// [`ServiceError::NotFound`], and the claim layer's refusal.
    pub async fn release(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
    ) -> Result<(), ServiceError> {
        let workload = workload.clone();
        self.to_the_end("release", Some(volume), |s| {
            let volume = volume.clone();
            async move { s.run_release(&volume, &workload).await }
        })
        .await
    }

    /// [`release`](Self::release), in its task.
    async fn run_release(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
    ) -> Result<(), ServiceError> {
        let entry = self.entry(volume)?;
        self.inner.claims.release(&entry.id, workload).await?;
        tracing::info!(volume = %entry.id, workload = %workload, "release durable");
        Ok(())
    }

    /// Releases a claim and waits until its release has finished (the claim freed: node and
    /// controller steps done), or until `deadline`.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release), and the claim layer's
    /// [`StillReleasing`](csi_claims::driver::DriverError::StillReleasing) at the deadline,
    /// saying where the release stands; it goes on.
    pub async fn release_and_wait(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
        deadline: tokio::time::Instant,
    ) -> Result<Claim, ServiceError> {
        let workload = workload.clone();
        self.to_the_end("release", Some(volume), |s| {
            let volume = volume.clone();
            async move { s.run_release_and_wait(&volume, &workload, deadline).await }
        })
        .await
    }

    /// [`release_and_wait`](Self::release_and_wait), in its task.
    async fn run_release_and_wait(
        &self,
        volume: &VolumeId,
        workload: &WorkloadId,
        deadline: tokio::time::Instant,
    ) -> Result<Claim, ServiceError> {
        let entry = self.entry(volume)?;
        let freed = self
            .inner
            .claims
            .release_and_wait_until(&entry.id, workload, deadline)
            .await?;
        Ok(freed)
    }

    /// Releases every claim of a volume on one node (the node steps through that node's
    /// agent, then the controller step). With `node_gone` the node is reported gone for good
    /// first: every claim made from it (on every volume) is released without node steps, and
    /// the controller step runs even though its agent is not there. Should the node come back
    /// after all, its [`reconcile_node`](Self::reconcile_node) unpublishes and unstages what
    /// those claims left there, and a controller step the plugin refused meanwhile is retried.
    ///
    /// # Errors
    ///
    /// [`ServiceError::Conflict`] when the volume has no claim on the node,
    /// [`ServiceError::Invalid`] for `node_gone` on this service's own node.
    pub async fn detach(&self, r: DetachVolume) -> Result<Detached, ServiceError> {
        let volume = r.volume.clone();
        self.to_the_end("detach", Some(&volume), move |s| async move {
            s.run_detach(r).await
        })
        .await
    }

    /// [`detach`](Self::detach), in its task.
    async fn run_detach(&self, r: DetachVolume) -> Result<Detached, ServiceError> {
        let entry = self.entry(&r.volume)?;
        let node = r.node;
        if r.node_gone && node == self.inner.me {
            return Err(invalid(
                "node_gone",
                format!("node {node} is this agent's own node, not gone; detach without it"),
            ));
        }
        let on_node: Vec<Claim> = self
            .claims_of(&entry.id)
            .into_iter()
            .filter(|c| c.node() == &node)
            .collect();
        if on_node.is_empty() {
            let hint = if !self.inner.peers.shares_claims() && node != self.inner.me {
                " (without a cluster store each agent keeps the claims of its own node: run \
                 this on that node's agent)"
            } else {
                ""
            };
            return Err(ServiceError::Conflict(format!(
                "volume {} has no claim on node {node} here{hint}",
                entry.id
            )));
        }
        if r.node_gone {
            if !self.inner.peers.report_node_gone(&node).await? {
                self.inner.claims.node_gone(&node);
            }
            tracing::warn!(node = %node, volume = %entry.id, "node reported gone for good by an operator");
        }
        let mut releasing = Vec::new();
        for claim in &on_node {
            if !claim.state().is_releasing() {
                self.inner
                    .claims
                    .release(&entry.id, claim.workload())
                    .await?;
            }
            releasing.push(claim.workload().clone());
        }
        tracing::info!(volume = %entry.id, node = %node, claims = releasing.len(), node_gone = r.node_gone, "detach of a node's claims durable");
        let note = (!r.node_gone && self.node_reachable(&node) == Some(false)).then(|| {
            format!(
                "node {node}'s agent is not reachable now: its node steps wait for it; if the \
                 node is gone for good, detach again with --node-gone"
            )
        });
        self.emit(ServiceEvent::Detached {
            volume: entry.id,
            node,
            node_gone: r.node_gone,
            releasing: releasing.clone(),
        });
        Ok(Detached {
            releasing,
            node_gone: r.node_gone,
            note,
        })
    }
}
