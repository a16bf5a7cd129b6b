//! The decision side of `serve`: the control API's operations on csi-control's
//! [`VolumeService`], their answers as the API's views, and the agent's status and metrics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use csi_claims::driver::{ClaimsHandle, DriverError};
use csi_claims::machine::{LastError, ReleaseWait};
use csi_claims::{Claim, ClaimMode, ReleaseStatus};
use csi_control::VolumeService;
use csi_control::catalog::{CatalogEntry, VolumeCatalog};
use csi_control::peers::NodePeers;
use csi_control::service::{
    BlockedOn, CallFailure, ClaimVolume, DetachVolume, NewSnapshot, NewVolume, NewVolumeSource,
    NodeReconciled, RegisterVolume, ReleaseWaits, Snapshot, SnapshotsOf as Of, VolumeState,
};
use csi_node::plugins::Health;
use csi_node::volumes::{Reconciliation, StepState, VolumeManager};
use csi_structs::wire::size_to_wire;
use csi_structs::{
    AccessMode, AccessTypeKind, ErrorClass, ExternalVolumeId, NodeId, Parameters, PluginId,
    SnapshotId, Topology, VolumeContext, VolumeId, WorkloadId,
};
use tokio::time::Instant;

use super::plugins::Plugins;
use crate::metrics::{Gauges, Metrics};
use crate::ops::api;

/// A failed control operation: csi-control's error, answered by [`parts`].
pub use csi_control::ServiceError as AgentError;

/// Whose snapshots a snapshot call is about.
#[derive(Clone, Copy, Debug)]
pub enum SnapshotsOf<'a> {
    /// A registered volume's (its plugin, its secrets).
    Volume(&'a str),
    /// A plugin's, any volume (no secrets).
    Plugin(&'a str),
}

/// What `status` shows of the cluster, in cluster mode.
pub trait ClusterStatus: std::fmt::Debug + Send + Sync {
    /// The store, the members and the controller duty's holder.
    fn view(&self) -> api::ClusterView;
}

/// The HTTP status, the kind and the class of an error answer. The agent's own failures
/// (`store`: the claim store, the node's usage records or, in cluster mode, etcd;
/// `local_io`: a state file or directory under the data directory) are 503 with class
/// `retry`, answered at once, and never `plugin`.
pub fn parts(e: &AgentError) -> (u16, &'static str, Option<ErrorClass>) {
    let class = e.class();
    match e {
        AgentError::NotFound { .. } => (404, "not_found", None),
        AgentError::Invalid { .. } => (400, "bad_request", None),
        AgentError::Conflict(_) => (409, "conflict", None),
        AgentError::Unsupported(_) => (409, "unsupported", None),
        AgentError::Claims(DriverError::Stopped) => (503, "stopping", None),
        AgentError::Stopped { .. } => (503, "stopping", class),
        AgentError::Claims(e) if e.is_store_failure() => (503, "store", class),
        AgentError::Denied(_) | AgentError::Claims(_) => (409, "claim", None),
        AgentError::Call { failure, .. } => (502, call_kind(*failure), class),
        AgentError::Local { store: true, .. } => (503, "store", class),
        AgentError::Store(e) if e.is_permanent() => (400, "store", None),
        AgentError::Store(_) => (503, "store", class),
        _ => (503, "local_io", class),
    }
}

/// The control API's kind of a failed plugin call: `plugin` when the plugin answered with
/// an error status, otherwise what happened without one: `plugin_answer` (its answer was
/// unusable), `deadline` (a deadline of ours passed), `plugin_unreachable`,
/// `invalid_request` (refused before sending) or `agent` (the serving agent's own failure);
/// a node operation refused because the plugin is not known to be healthy is
/// `plugin_unhealthy`.
pub fn call_kind(failure: CallFailure) -> &'static str {
    match failure {
        CallFailure::UnusableAnswer => "plugin_answer",
        CallFailure::Deadline => "deadline",
        CallFailure::Unreachable => "plugin_unreachable",
        CallFailure::NotSent => "invalid_request",
        CallFailure::Agent => "agent",
        CallFailure::Unhealthy => "plugin_unhealthy",
        _ => "plugin",
    }
}

fn bad(field: &'static str, reason: impl std::fmt::Display) -> AgentError {
    AgentError::Invalid {
        field,
        reason: reason.to_string(),
    }
}

fn parse_volume_id(id: &str) -> Result<VolumeId, AgentError> {
    VolumeId::new(id).map_err(|e| bad("id", e))
}

fn parse_plugin(id: &str) -> Result<PluginId, AgentError> {
    PluginId::new(id).map_err(|e| bad("plugin", e))
}

fn parse_workload(id: String) -> Result<WorkloadId, AgentError> {
    WorkloadId::new(id).map_err(|e| bad("workload", e))
}

fn parse_attachment(text: &str) -> Result<AccessTypeKind, AgentError> {
    match text {
        "mount" | "file-system" | "filesystem" => Ok(AccessTypeKind::Mount),
        "block" | "block-device" => Ok(AccessTypeKind::Block),
        other => Err(bad(
            "attachment",
            format!("{other:?} is not `mount` or `block`"),
        )),
    }
}

/// Topologies given as maps of segments, each checked (spec §3.12), naming `field` and the
/// entry.
fn parse_topologies(
    field: &'static str,
    list: Vec<BTreeMap<String, String>>,
) -> Result<Vec<Topology>, AgentError> {
    list.into_iter()
        .enumerate()
        .map(|(i, map)| Topology::new(map).map_err(|e| bad(field, format!("entry {i}: {e}"))))
        .collect()
}

fn parse_access_mode(text: &str) -> Result<AccessMode, AgentError> {
    text.parse::<AccessMode>()
        .map_err(|e| bad("access_mode", e))
}

/// A size of the control API, which must not be negative.
fn parse_size(field: &'static str, bytes: i64, at_least: i64) -> Result<u64, AgentError> {
    match u64::try_from(bytes) {
        Ok(b) if bytes >= at_least => Ok(b),
        _ if at_least > 0 => Err(bad(field, "must be more than 0")),
        _ => Err(bad(field, "must not be negative")),
    }
}

/// The running agent's decision side.
#[derive(Debug)]
pub struct Agent {
    /// This node.
    pub me: NodeId,
    /// The local plugins.
    pub plugins: Plugins,
    /// The volume operations (the control plane's).
    pub service: Arc<VolumeService>,
    /// Call metrics.
    pub metrics: Metrics,
    /// The health of the volumes published here.
    pub health: Arc<csi_node::health::HealthMonitor>,
    /// What peers reported last, by node (the control plane's).
    pub peers: Arc<NodePeers>,
    /// Cluster mode's members and duty, for `status` (`None`: the embedded store).
    pub cluster: Option<Arc<dyn ClusterStatus>>,
    /// The releases that wait for something that is not there, followed over time.
    pub waits: Mutex<ReleaseWaits>,
    /// How the usage records restored at start were confirmed ([`Agent::reconciled`]);
    /// `None` until it finished.
    pub reconciled: Mutex<Option<api::ReconcileView>>,
}

impl Agent {
    /// The claim driver.
    pub fn claims(&self) -> &ClaimsHandle {
        self.service.claims()
    }

    fn book(&self) -> &Arc<dyn VolumeCatalog> {
        self.service.catalog()
    }

    fn volumes_here(&self) -> &VolumeManager {
        self.service.volumes()
    }

    /// Registers an existing volume, validated against its plugin's controller when one is
    /// known ([`VolumeService::register_volume`]).
    ///
    /// # Errors
    ///
    /// [`AgentError`] naming the bad field, a capability the plugin does not confirm, or a
    /// conflict when the id is taken.
    pub async fn register_volume(
        &self,
        r: api::RegisterVolume,
    ) -> Result<api::VolumeView, AgentError> {
        let id = parse_volume_id(&r.id)?;
        let request = RegisterVolume {
            id,
            plugin: parse_plugin(&r.plugin)?,
            context: VolumeContext::try_new(r.context).map_err(|e| bad("context", e))?,
            external_id: ExternalVolumeId::new(r.external_id).map_err(|e| bad("external_id", e))?,
            access_mode: parse_access_mode(&r.access_mode)?,
            attachment: parse_attachment(&r.attachment)?,
            controller_publish: r.controller_publish,
            secrets: r.secrets,
            accessible_topology: parse_topologies("accessible_topology", r.accessible_topology)?,
        };
        let entry = self.service.register_volume(request).await?;
        Ok(self.view_of(entry))
    }

    /// Creates a volume through a controller of its plugin (here or on a peer) and registers
    /// it ([`VolumeService::create`]: an uncertain outcome is undone before the answer).
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn create(&self, r: api::CreateVolume) -> Result<api::VolumeView, AgentError> {
        let request = NewVolume {
            id: parse_volume_id(&r.id)?,
            plugin: parse_plugin(&r.plugin)?,
            access_mode: parse_access_mode(&r.access_mode)?,
            attachment: parse_attachment(&r.attachment)?,
            capacity_bytes: parse_size("capacity_bytes", r.capacity_bytes, 0)?,
            parameters: Parameters::try_new(r.parameters).map_err(|e| bad("parameters", e))?,
            secrets: r.secrets,
            requisite_topology: parse_topologies("requisite_topology", r.requisite_topology)?,
            preferred_topology: parse_topologies("preferred_topology", r.preferred_topology)?,
            source: match (r.snapshot, r.clone) {
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "clone",
                        "a volume is made from a snapshot or a clone, not both",
                    ));
                }
                (Some(snapshot), None) => Some(NewVolumeSource::Snapshot(
                    SnapshotId::new(snapshot).map_err(|e| bad("snapshot", e))?,
                )),
                (None, Some(clone)) => Some(NewVolumeSource::Clone(
                    VolumeId::new(clone).map_err(|e| bad("clone", e))?,
                )),
                (None, None) => None,
            },
        };
        let entry = self.service.create(request).await?;
        Ok(self.view_of(entry))
    }

    /// Claims a volume for a workload on this node and publishes it here
    /// ([`VolumeService::claim`]).
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn claim(&self, id: &str, r: api::ClaimVolume) -> Result<api::ClaimView, AgentError> {
        let volume = parse_volume_id(id)?;
        let workload = parse_workload(r.workload)?;
        let mode = match r.mode.as_str() {
            "read" => ClaimMode::Read,
            "write" => ClaimMode::Write,
            other => return Err(bad("mode", format!("{other:?} is not `read` or `write`"))),
        };
        let claimed = self
            .service
            .claim(ClaimVolume::new(volume, workload, mode))
            .await?;
        Ok(claim_view(
            &claimed.claim,
            Some(claimed.target_path.display().to_string()),
        ))
    }

    /// Grows a volume, on the controller and then on the nodes where it is published
    /// ([`VolumeService::expand`]).
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn expand(
        &self,
        id: &str,
        r: api::ExpandVolume,
    ) -> Result<api::ExpandView, AgentError> {
        let volume = parse_volume_id(id)?;
        let capacity = parse_size("capacity_bytes", r.capacity_bytes, 1)?;
        let expanded = self.service.expand(&volume, capacity).await?;
        let volume = self.volume(id)?;
        Ok(api::ExpandView {
            node_expansion_pending: volume.node_expansion_pending,
            volume,
            controller_expanded: expanded.controller_expanded,
            nodes_expanded: expanded
                .nodes_expanded
                .iter()
                .map(ToString::to_string)
                .collect(),
        })
    }

    /// Releases every claim of a volume on one node ([`VolumeService::detach`]).
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn detach(
        &self,
        id: &str,
        r: api::DetachVolume,
    ) -> Result<api::DetachView, AgentError> {
        let detached = self
            .service
            .detach(DetachVolume {
                volume: parse_volume_id(id)?,
                node: NodeId::new(r.node).map_err(|e| bad("node", e))?,
                node_gone: r.node_gone,
            })
            .await?;
        Ok(api::DetachView {
            volume: self.volume(id)?,
            releasing: detached.releasing.iter().map(ToString::to_string).collect(),
            node_gone: detached.node_gone,
            note: detached.note,
        })
    }

    /// Drops a volume from the agent without calling the plugin
    /// ([`VolumeService::deregister_volume`]); the answer shows the volume as it was.
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn deregister_volume(
        &self,
        id: &str,
        r: api::DeregisterVolume,
    ) -> Result<api::DeregisterView, AgentError> {
        let volume = parse_volume_id(id)?;
        let view = self.volume(id)?;
        let done = self
            .service
            .deregister_volume(&volume, r.force, r.confirmed)
            .await?;
        Ok(api::DeregisterView {
            volume: view,
            dropped_claims: done.dropped_claims,
            left_in_plugin: done.left_behind.iter().map(ToString::to_string).collect(),
        })
    }

    /// The plugin's own listing, each volume with the agent's id for it when the agent knows
    /// it ([`VolumeService::list_external`]).
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn list_external(
        &self,
        plugin: &str,
    ) -> Result<Vec<api::ExternalVolumeView>, AgentError> {
        let listed = self.service.list_external(&parse_plugin(plugin)?).await?;
        Ok(listed
            .into_iter()
            .map(|v| api::ExternalVolumeView {
                known_as: v.known_as.map(VolumeId::into_inner),
                external_id: v.external_id.to_string(),
                capacity_bytes: size_to_wire(v.capacity_bytes),
                published_nodes: v.published_nodes.iter().map(ToString::to_string).collect(),
            })
            .collect())
    }

    /// Cuts a snapshot of a volume ([`VolumeService::create_snapshot`]).
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn create_snapshot(
        &self,
        id: &str,
        r: api::CreateSnapshot,
    ) -> Result<api::SnapshotView, AgentError> {
        let volume = parse_volume_id(id)?;
        let request = NewSnapshot {
            name: r.name,
            parameters: Parameters::try_new(r.parameters).map_err(|e| bad("parameters", e))?,
        };
        let snapshot = self.service.create_snapshot(&volume, request).await?;
        Ok(snapshot_view(snapshot))
    }

    /// Every snapshot of a volume, or of a plugin ([`VolumeService::list_snapshots`]).
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn list_snapshots(
        &self,
        of: SnapshotsOf<'_>,
    ) -> Result<Vec<api::SnapshotView>, AgentError> {
        let listed = self.service.list_snapshots(&snapshots_of(of)?).await?;
        Ok(listed.into_iter().map(snapshot_view).collect())
    }

    /// Deletes a snapshot of a volume or of a plugin ([`VolumeService::delete_snapshot`]).
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn delete_snapshot(
        &self,
        of: SnapshotsOf<'_>,
        snapshot: &str,
    ) -> Result<api::SnapshotDeleted, AgentError> {
        let of = snapshots_of(of)?;
        let snapshot = SnapshotId::new(snapshot).map_err(|e| bad("snapshot", e))?;
        let plugin = self.service.delete_snapshot(&of, &snapshot).await?;
        Ok(api::SnapshotDeleted {
            plugin: plugin.into_inner(),
            snapshot_id: snapshot.into_inner(),
        })
    }

    /// Starts releasing a claim; returns once the release is durable.
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn release(
        &self,
        id: &str,
        r: api::ReleaseVolume,
    ) -> Result<api::VolumeView, AgentError> {
        let volume = parse_volume_id(id)?;
        let workload = parse_workload(r.workload)?;
        self.service.release(&volume, &workload).await?;
        self.volume(id)
    }

    /// Deletes a volume with no claims ([`VolumeService::delete`]); the answer shows the
    /// volume as it was.
    ///
    /// # Errors
    ///
    /// [`AgentError`].
    pub async fn delete(&self, id: &str) -> Result<api::VolumeView, AgentError> {
        let volume = parse_volume_id(id)?;
        let view = self.volume(id)?;
        self.service.delete(&volume).await?;
        Ok(view)
    }

    /// One volume with its claims and release.
    ///
    /// # Errors
    ///
    /// [`AgentError::NotFound`].
    pub fn volume(&self, id: &str) -> Result<api::VolumeView, AgentError> {
        let state = self.service.volume(&parse_volume_id(id)?)?;
        Ok(self.view(state))
    }

    /// The view of a volume the service just wrote.
    fn view_of(&self, entry: CatalogEntry) -> api::VolumeView {
        self.view(self.service.state(entry))
    }

    fn view(&self, state: VolumeState) -> api::VolumeView {
        let VolumeState {
            entry,
            claims,
            release,
        } = state;
        api::VolumeView {
            id: entry.id.to_string(),
            external_id: entry.external_id.to_string(),
            plugin: entry.plugin.to_string(),
            access_mode: entry.access_mode.wire_name().to_owned(),
            attachment: entry.attachment.to_string(),
            controller_publish: entry.controller_publish,
            created: entry.created,
            secret_names: entry.secret_names(),
            capacity_bytes: entry.capacity_bytes.and_then(|c| i64::try_from(c).ok()),
            accessible_topology: entry
                .accessible_topology
                .iter()
                .map(|t| t.as_map().clone())
                .collect(),
            node_expansion_pending: entry.node_expansion.is_some(),
            claims: claims
                .iter()
                .map(|(c, target)| claim_view(c, target.as_ref().map(|t| t.display().to_string())))
                .collect(),
            release: release.as_ref().map(release_view),
            calls_in_flight: self.calls_in_flight(&entry.external_id),
            may_exist: entry.may_exist.as_ref().map(|may| api::MayExistView {
                plugin: entry.plugin.to_string(),
                name: entry.id.to_string(),
                why: may.why.clone(),
                error: may.error.clone(),
            }),
            health: self.health.health().get(&entry.id).map(health_view),
            waiting: self
                .waiting()
                .into_iter()
                .filter(|w| w.volume == entry.id.as_str())
                .collect(),
        }
    }

    /// Looks again at the releases that wait for something that is not there
    /// ([`ReleaseWaits::check`]: each logged once when it passes the threshold).
    pub fn check_waits(&self) {
        self.waits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check(&self.service);
    }

    /// The releases waiting past the threshold at the last [`check_waits`](Self::check_waits).
    pub fn waiting(&self) -> Vec<api::WaitingView> {
        let now = Instant::now();
        let waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        waits
            .current()
            .into_iter()
            .map(|b| api::WaitingView {
                volume: b.volume.to_string(),
                workload: b.workload.to_string(),
                node: match &b.on {
                    BlockedOn::NodeAway(node) => Some(node.to_string()),
                    _ => None,
                },
                waiting_for: b.on.to_string(),
                waited_s: now.saturating_duration_since(b.since).as_secs(),
            })
            .collect()
    }

    /// This agent's plugin calls about a volume in flight now.
    fn calls_in_flight(&self, volume: &ExternalVolumeId) -> Vec<api::CallInFlightView> {
        let now = Instant::now();
        self.plugins
            .calls_in_flight()
            .for_volume(volume)
            .into_iter()
            .map(|call| api::CallInFlightView {
                rpc: call.rpc.name().to_owned(),
                waiting: match call.waiting {
                    csi_client::Waiting::Turn => "turn",
                    csi_client::Waiting::Backoff => "backoff",
                    _ => "answer",
                }
                .to_owned(),
                attempt: call.attempt,
                max_attempts: call.max_attempts,
                attempt_deadline_ms: u64::try_from(call.attempt_deadline.as_millis())
                    .unwrap_or(u64::MAX),
                elapsed_ms: u64::try_from(call.elapsed_at(now).as_millis()).unwrap_or(u64::MAX),
                summary: call.to_string(),
            })
            .collect()
    }

    /// Every registered volume.
    pub fn volumes(&self) -> Vec<api::VolumeView> {
        self.service
            .volume_states()
            .into_iter()
            .map(|s| self.view(s))
            .collect()
    }

    /// Local plugins, then the plugins peers reported.
    pub fn plugin_views(&self) -> Vec<api::PluginView> {
        let mut out = self.plugins.views();
        let in_use = self.volumes_here().in_use();
        for v in &mut out {
            v.in_use = in_use.get(v.id.as_str()).copied().unwrap_or(0);
        }
        for (node, peer) in &self.peers.reports() {
            for p in &peer.plugins {
                let healthy = p.controller.unwrap_or(true) && p.node.as_ref().is_none_or(|n| n.1);
                out.push(api::PluginView {
                    id: p.id.clone(),
                    node: node.to_string(),
                    socket: None,
                    health: if !peer.reachable {
                        "unknown".into()
                    } else if healthy {
                        "healthy".into()
                    } else {
                        "unhealthy".into()
                    },
                    health_reason: None,
                    name: None,
                    version: None,
                    controller: p.controller.is_some(),
                    node_service: p.node.is_some(),
                    plugin_node: p.node.as_ref().map(|n| n.0.clone()),
                    controller_publish: p.controller_publish,
                    staging: false,
                    fingerprints: 0,
                    last_error: None,
                    in_use: 0,
                    capabilities: p
                        .capabilities
                        .as_ref()
                        .map(|c| c.advertised())
                        .unwrap_or_default(),
                    max_volumes: None,
                    topology: None,
                });
            }
        }
        out
    }

    /// `csi-agent status`.
    pub fn status(&self) -> api::StatusView {
        let claims = self.claims();
        api::StatusView {
            node: self.me.to_string(),
            plugins: self.plugin_views(),
            peers: self
                .peers
                .reports()
                .iter()
                .map(|(n, p)| api::PeerView {
                    node: n.to_string(),
                    reachable: p.reachable,
                    plugins: p.plugins.len(),
                    last_error: p.last_error.clone(),
                })
                .collect(),
            volumes: self.book().list().len(),
            claims: self.service.claim_counts(),
            stuck: claims.stuck().iter().map(release_view).collect(),
            waiting: self.waiting(),
            uncertain: self
                .volumes_here()
                .uncertain()
                .into_iter()
                .map(|p| api::UncertainView {
                    volume: p.volume.into_inner(),
                    workload: p
                        .workload
                        .map_or_else(|| "-".into(), WorkloadId::into_inner),
                    step: p.step.as_str().into(),
                    path: p.path.display().to_string(),
                })
                .collect(),
            cluster: self.cluster.as_ref().map(|c| c.view()),
            store_failure: claims.store_failure(),
            failing_files: failing_files(),
            reconcile: self
                .reconciled
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            abnormal: self
                .health
                .health()
                .iter()
                .flat_map(|(volume, h)| {
                    h.abnormal()
                        .into_iter()
                        .map(|(source, c)| api::AbnormalView {
                            volume: volume.to_string(),
                            source: source.as_str().to_owned(),
                            message: c.message.clone(),
                        })
                })
                .collect(),
            ignored_plugin_files: self.plugins.ignored(),
        }
    }

    /// Keeps for `status` how the node's usage records restored at start were confirmed
    /// against their plugins (the control plane's [`reconciled`](
    /// csi_control::ControlPlane::reconciled)).
    pub fn reconciled(&self, done: &NodeReconciled) -> api::ReconcileView {
        let done = done.clone();
        let view = api::ReconcileView {
            plugins_not_ready: done
                .plugins_not_ready
                .into_iter()
                .map(PluginId::into_inner)
                .collect(),
            records: done.report.records.iter().map(reconciled_view).collect(),
            released_while_gone: done
                .released_while_gone
                .iter()
                .map(|r| api::ReleasedWhileGoneView {
                    plugin: r.plugin.to_string(),
                    volume: r.volume.to_string(),
                    workload: r.workload.to_string(),
                    done: r.done_str().to_owned(),
                    claim: r.claim.as_str().to_owned(),
                })
                .collect(),
        };
        *self
            .reconciled
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(view.clone());
        view
    }

    /// The metrics page.
    pub fn metrics_text(&self) -> String {
        // Every health has its series, at zero when no plugin has it, so an alert on it
        // does not go blind when the last plugin goes.
        let mut plugins: BTreeMap<String, u64> =
            Health::NAMES.map(|name| (name.to_owned(), 0)).into();
        for v in self.plugin_views() {
            *plugins.entry(v.health).or_default() += 1;
        }
        self.metrics.render(&Gauges {
            claims: self.service.claim_counts(),
            stuck_releases: self.claims().stuck().len() as u64,
            waiting_releases: self
                .waits
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .current()
                .len() as u64,
            plugins,
            store_failing: self.claims().store_failure().is_some(),
            failing_files: failing_files().len() as u64,
            volumes: self.health.health(),
            cluster: self.cluster.as_ref().map(|c| c.view()),
        })
    }
}

/// A volume's health for the API.
fn health_view(h: &csi_node::health::VolumeHealth) -> api::VolumeHealthView {
    let condition = |c: &csi_structs::VolumeCondition| api::ConditionView {
        abnormal: c.abnormal,
        message: c.message.clone(),
    };
    let usage = |u: &csi_structs::Usage| api::UsageView {
        used: u.used,
        available: u.available,
        total: u.total,
    };
    api::VolumeHealthView {
        controller: h.controller.as_ref().map(condition),
        node: h.node.as_ref().map(condition),
        bytes: h.bytes.as_ref().map(usage),
        inodes: h.inodes.as_ref().map(usage),
    }
}

/// The service's snapshot call target from the API's.
fn snapshots_of(of: SnapshotsOf<'_>) -> Result<Of, AgentError> {
    Ok(match of {
        SnapshotsOf::Volume(id) => Of::Volume(parse_volume_id(id)?),
        SnapshotsOf::Plugin(plugin) => Of::Plugin(parse_plugin(plugin)?),
    })
}

fn snapshot_view(s: Snapshot) -> api::SnapshotView {
    api::SnapshotView {
        plugin: s.plugin.into_inner(),
        snapshot_id: s.id.into_inner(),
        source_external_id: s.source.into_inner(),
        source_volume: s.source_volume.map(VolumeId::into_inner),
        size_bytes: size_to_wire(s.size_bytes),
        ready_to_use: s.ready_to_use,
    }
}

/// One record's confirmation for the API.
fn reconciled_view(r: &Reconciliation) -> api::ReconciledView {
    let state = |s: Option<StepState>| s.map_or("-", StepState::as_str);
    let error = r.error();
    api::ReconciledView {
        plugin: r.plugin.to_string(),
        volume: r.volume.to_string(),
        workload: r
            .workload
            .as_ref()
            .map_or_else(|| "-".to_owned(), ToString::to_string),
        found: format!(
            "stage {}, publish {}",
            state(r.found.stage),
            state(r.found.publish)
        ),
        action: r.action().as_str().to_owned(),
        error: error.map(ToString::to_string),
        class: error.map(|e| e.class().as_str().to_owned()),
    }
}

/// The state files whose last write failed, as `<file>: <error>`.
fn failing_files() -> Vec<String> {
    csi_node::state::failing()
        .into_iter()
        .map(|(_, error)| error)
        .collect()
}

/// A claim for the API.
pub fn claim_view(c: &Claim, target_path: Option<String>) -> api::ClaimView {
    api::ClaimView {
        volume: c.volume().to_string(),
        workload: c.workload().to_string(),
        node: c.node().to_string(),
        plugin_node: c.plugin_node().to_string(),
        mode: c.mode().as_str().to_owned(),
        access_mode: c.access_mode().wire_name().to_owned(),
        state: c.state().name().to_owned(),
        target_path,
    }
}

/// A release for the API.
pub fn release_view(s: &ReleaseStatus) -> api::ReleaseView {
    let (pending, pending_workload) = match &s.pending {
        ReleaseWait::Nothing => ("nothing", None),
        ReleaseWait::NodeDetach(w) => ("node_detach", Some(w.to_string())),
        ReleaseWait::ControllerDetach(w) => ("controller_detach", Some(w.to_string())),
        ReleaseWait::ControllerSlot(w) => ("controller_slot", Some(w.to_string())),
        ReleaseWait::Backoff { step, .. } => ("backoff", step.workload().map(ToString::to_string)),
    };
    let backoff_step = match &s.pending {
        ReleaseWait::Backoff { step, .. } => Some(step.name().to_owned()),
        _ => None,
    };
    let (last_error, last_error_class) = match &s.last_error {
        Some(LastError::Detach { error, .. }) => (
            Some(error.to_string()),
            Some(error.class.as_str().to_owned()),
        ),
        Some(LastError::Store { detail, .. }) => (Some(detail.clone()), Some("store".to_owned())),
        None => (None, None),
    };
    let now = Instant::now();
    api::ReleaseView {
        volume: s.volume.to_string(),
        pending: pending.to_owned(),
        pending_workload,
        backoff_step,
        attempts: s.attempts,
        last_error,
        last_error_class,
        next_retry_ms: s.next_retry.map(|at| {
            u64::try_from(at.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
        }),
        durable: s.durable,
        claims: s.claims.iter().map(|c| claim_view(c, None)).collect(),
    }
}
