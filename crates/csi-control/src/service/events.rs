//! What the volume service did, as typed events: [`ServiceEvent`].

use std::fmt;
use std::path::PathBuf;

use csi_claims::Event;
use csi_structs::untrusted::escaped;
use csi_structs::{
    ErrorClass, ExternalVolumeId, NodeId, PluginId, SnapshotId, VolumeId, WorkloadId,
};

/// One thing the [`VolumeService`](super::VolumeService) did, sent to every subscriber
/// ([`VolumeService::subscribe`](super::VolumeService::subscribe)) once it is durable,
/// including the release pipeline's progress (a release started, a step failed and when it
/// is retried, a step recovered, a claim freed): one stream for everything a volume goes
/// through. `Display` writes it as one line for people, plugin text escaped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceEvent {
    /// A volume entered the catalog: registered, or created in its plugin.
    VolumeRegistered {
        /// The volume.
        volume: VolumeId,
        /// Its plugin.
        plugin: PluginId,
        /// Whether the service created it.
        created: bool,
    },
    /// A volume a `CreateVolume` with an uncertain outcome may have made was found by name
    /// and deleted.
    CreateUndone {
        /// The id it was created under.
        volume: VolumeId,
        /// The plugin.
        plugin: PluginId,
        /// The plugin's id of the deleted volume.
        external_id: ExternalVolumeId,
    },
    /// An uncertain `CreateVolume` could not be undone: the catalog keeps that a volume may
    /// exist under the id until a create of it resolves it or a deregistration clears it.
    MayExist {
        /// The id.
        volume: VolumeId,
        /// The plugin.
        plugin: PluginId,
        /// Why, for people.
        why: &'static str,
    },
    /// A claim is durable and the volume published on this node.
    Claimed {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// Where it is published.
        target_path: PathBuf,
    },
    /// Publishing failed after the claim; the claim was released to undo it.
    PublishFailed {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// Whether the release finished within the call timeout.
        undone: bool,
    },
    /// A node expansion left for the volume's next claim ran.
    PendingNodeExpansion {
        /// The volume.
        volume: VolumeId,
        /// The size asked for.
        capacity_bytes: u64,
        /// Whether it succeeded (otherwise it stays pending).
        done: bool,
    },
    /// A volume grew.
    Expanded {
        /// The volume.
        volume: VolumeId,
        /// Its capacity now.
        capacity_bytes: u64,
        /// Whether the controller expanded it.
        controller_expanded: bool,
        /// The nodes that expanded it.
        nodes_expanded: Vec<NodeId>,
        /// Whether a node expansion waits for its next claim.
        node_expansion_pending: bool,
    },
    /// A claim's release is durable: the release pipeline runs its steps from now on, whoever
    /// asked (a [`release`](super::VolumeService::release), a detach, a failed publish
    /// undone). Its progress follows: [`ReleaseStepFailed`](Self::ReleaseStepFailed),
    /// [`ReleaseStepRecovered`](Self::ReleaseStepRecovered), then [`Freed`](Self::Freed).
    ReleaseStarted {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
    },
    /// A release step failed and waits out a backoff before it is tried again (one event per
    /// failed attempt; the pipeline never gives a release up).
    ReleaseStepFailed(ReleaseStepFailed),
    /// A release step that had failed succeeded; the release goes on.
    ReleaseStepRecovered {
        /// The volume.
        volume: VolumeId,
        /// The workload whose claim the step is for (`None`: a read of the claim store).
        workload: Option<WorkloadId>,
        /// The step: `node_detach`, `controller_detach` or `store_read`.
        step: &'static str,
        /// How many attempts had failed before this one.
        failed_attempts: u32,
    },
    /// A claim is freed: its release finished (node and controller steps done, or skipped
    /// for a node gone for good) and its capacity is back.
    Freed {
        /// The volume.
        volume: VolumeId,
        /// The workload.
        workload: WorkloadId,
        /// The node the claim was made from.
        node: NodeId,
    },
    /// A node's claims on a volume are releasing.
    Detached {
        /// The volume.
        volume: VolumeId,
        /// The node.
        node: NodeId,
        /// Whether the node was reported gone for good.
        node_gone: bool,
        /// The workloads whose claims are releasing.
        releasing: Vec<WorkloadId>,
    },
    /// A volume left the catalog without its plugin being called.
    VolumeDeregistered {
        /// The volume.
        volume: VolumeId,
        /// The claims forgotten, not released.
        dropped_claims: usize,
    },
    /// A snapshot was cut.
    SnapshotCut {
        /// The source volume.
        volume: VolumeId,
        /// The snapshot.
        snapshot: SnapshotId,
        /// Whether it is ready to use.
        ready_to_use: bool,
    },
    /// A snapshot was deleted.
    SnapshotDeleted {
        /// Its plugin.
        plugin: PluginId,
        /// The snapshot.
        snapshot: SnapshotId,
    },
    /// A volume was deleted.
    VolumeDeleted {
        /// The volume.
        volume: VolumeId,
        /// Whether it was deleted in its plugin too (the service had created it).
        in_plugin: bool,
    },
    /// The node's usage records restored at start were confirmed with their plugins.
    NodeReconciled {
        /// How many records.
        records: usize,
        /// How many publications were published again.
        republished: usize,
        /// How many could not be confirmed (kept).
        not_confirmed: usize,
    },
}

/// A failed release step: [`ServiceEvent::ReleaseStepFailed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseStepFailed {
    /// The volume.
    pub volume: VolumeId,
    /// The workload whose claim the step is for (`None`: a read of the claim store).
    pub workload: Option<WorkloadId>,
    /// The step: `node_detach`, `controller_detach` or `store_read`.
    pub step: &'static str,
    /// The CSI call that failed (`NodeUnpublishVolume`, `NodeUnstageVolume`,
    /// `ControllerUnpublishVolume`); `None` for a store read.
    pub rpc: Option<&'static str>,
    /// What to do about it; a fatal error is retried too, at the backoff's cap.
    pub class: ErrorClass,
    /// What went wrong: the plugin's (or the store's) message as it came, never a secret.
    /// `Display` escapes it.
    pub message: String,
    /// The failed attempts so far, this one included.
    pub attempt: u32,
    /// When the step is tried again (sooner when its plugin or node comes back).
    pub next_retry: tokio::time::Instant,
}

impl ServiceEvent {
    /// The service's event for a claim driver's event, if it has one: a release started, a
    /// step failed or recovered, a claim freed. Claims becoming durable are announced by the
    /// service's own operations ([`ServiceEvent::Claimed`]), not here.
    pub fn from_claims(event: &Event) -> Option<ServiceEvent> {
        Some(match event {
            Event::ReleaseDurable { volume, workload } => ServiceEvent::ReleaseStarted {
                volume: volume.clone(),
                workload: workload.clone(),
            },
            Event::StepFailed(f) => ServiceEvent::ReleaseStepFailed(ReleaseStepFailed {
                volume: f.volume.clone(),
                workload: f.workload().cloned(),
                step: f.step.name(),
                rpc: f.rpc.map(|r| r.name()),
                class: f.class,
                message: f.detail.clone(),
                attempt: f.attempt,
                next_retry: f.next_retry,
            }),
            Event::StepRecovered {
                volume,
                step,
                failed_attempts,
            } => ServiceEvent::ReleaseStepRecovered {
                volume: volume.clone(),
                workload: step.workload().cloned(),
                step: step.name(),
                failed_attempts: *failed_attempts,
            },
            Event::Freed(claim) => ServiceEvent::Freed {
                volume: claim.volume().clone(),
                workload: claim.workload().clone(),
                node: claim.node().clone(),
            },
            _ => return None,
        })
    }
}

impl fmt::Display for ReleaseStepFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "volume {}: {}", self.volume, self.step)?;
        if let Some(w) = &self.workload {
            write!(f, " of {w}")?;
        }
        if let Some(rpc) = self.rpc {
            write!(f, " ({rpc})")?;
        }
        let retry_in = self
            .next_retry
            .saturating_duration_since(tokio::time::Instant::now());
        write!(
            f,
            " failed, attempt {} ({}): {}; retried in {:.1}s",
            self.attempt,
            self.class.as_str(),
            escaped(&self.message),
            retry_in.as_secs_f64()
        )
    }
}

impl fmt::Display for ServiceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceEvent::VolumeRegistered {
                volume,
                plugin,
                created,
            } => {
                let how = if *created {
                    "created in"
                } else {
                    "registered with"
                };
                write!(f, "volume {volume}: {how} plugin {plugin}")
            }
            ServiceEvent::CreateUndone {
                volume,
                plugin,
                external_id,
            } => write!(
                f,
                "volume {volume}: uncertain create undone (plugin {plugin} volume {} deleted)",
                escaped(external_id.as_str())
            ),
            ServiceEvent::MayExist {
                volume,
                plugin,
                why,
            } => write!(
                f,
                "volume {volume}: may exist in plugin {plugin} (uncertain create not undone: {why})"
            ),
            ServiceEvent::Claimed {
                volume,
                workload,
                target_path,
            } => write!(
                f,
                "volume {volume}: claimed by {workload}, published at {}",
                target_path.display()
            ),
            ServiceEvent::PublishFailed {
                volume,
                workload,
                undone,
            } => {
                let how = if *undone {
                    "released and undone"
                } else {
                    "its release goes on"
                };
                write!(
                    f,
                    "volume {volume}: publish for {workload} failed; the claim is {how}"
                )
            }
            ServiceEvent::PendingNodeExpansion {
                volume,
                capacity_bytes,
                done,
            } => {
                let how = if *done { "done" } else { "still pending" };
                write!(
                    f,
                    "volume {volume}: node expansion to {capacity_bytes} bytes {how}"
                )
            }
            ServiceEvent::Expanded {
                volume,
                capacity_bytes,
                nodes_expanded,
                node_expansion_pending,
                ..
            } => {
                write!(f, "volume {volume}: expanded to {capacity_bytes} bytes")?;
                if !nodes_expanded.is_empty() {
                    let nodes: Vec<&str> = nodes_expanded.iter().map(|n| n.as_str()).collect();
                    write!(f, " (on nodes {})", nodes.join(", "))?;
                }
                if *node_expansion_pending {
                    f.write_str(", node expansion at its next claim")?;
                }
                Ok(())
            }
            ServiceEvent::ReleaseStarted { volume, workload } => {
                write!(f, "volume {volume}: release of {workload} started")
            }
            ServiceEvent::ReleaseStepFailed(failed) => failed.fmt(f),
            ServiceEvent::ReleaseStepRecovered {
                volume,
                workload,
                step,
                failed_attempts,
            } => {
                write!(f, "volume {volume}: {step}")?;
                if let Some(w) = workload {
                    write!(f, " of {w}")?;
                }
                write!(f, " succeeded after {failed_attempts} failed attempt(s)")
            }
            ServiceEvent::Freed {
                volume,
                workload,
                node,
            } => write!(
                f,
                "volume {volume}: claim of {workload} on node {node} freed"
            ),
            ServiceEvent::Detached {
                volume,
                node,
                node_gone,
                releasing,
            } => {
                let gone = if *node_gone { " (gone for good)" } else { "" };
                write!(
                    f,
                    "volume {volume}: {} claim(s) on node {node}{gone} releasing",
                    releasing.len()
                )
            }
            ServiceEvent::VolumeDeregistered {
                volume,
                dropped_claims,
            } => write!(
                f,
                "volume {volume}: deregistered, {dropped_claims} claim(s) forgotten"
            ),
            ServiceEvent::SnapshotCut {
                volume,
                snapshot,
                ready_to_use,
            } => {
                let ready = if *ready_to_use {
                    "ready"
                } else {
                    "not ready yet"
                };
                write!(f, "volume {volume}: snapshot {snapshot} cut ({ready})")
            }
            ServiceEvent::SnapshotDeleted { plugin, snapshot } => {
                write!(f, "plugin {plugin}: snapshot {snapshot} deleted")
            }
            ServiceEvent::VolumeDeleted { volume, in_plugin } => {
                let how = if *in_plugin {
                    " (and in its plugin)"
                } else {
                    ""
                };
                write!(f, "volume {volume}: deleted{how}")
            }
            ServiceEvent::NodeReconciled {
                records,
                republished,
                not_confirmed,
            } => write!(
                f,
                "node's usage records confirmed: {records} record(s), {republished} republished, \
                 {not_confirmed} not confirmed"
            ),
        }
    }
}
