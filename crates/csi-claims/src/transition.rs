//! The pure decision: given a volume's claims, what is the next release step?
//!
//! [`next_step`] reads a [`VolumeRecord`] and the set of nodes known to be gone, and returns
//! one [`Step`]. It never mutates anything; the [machine](crate::machine) applies the step,
//! checkpoints it, and performs nothing else until the checkpoint is durable. Claims are
//! released one at a time per volume, in the order they were made, except that the claim
//! whose step failed last goes after the others (so one claim stuck on an unhealthy node
//! does not hold up the releases of the same volume on healthy nodes).
//!
//! The rules, one arm each:
//! - `Releasing` on a node that is gone for good → record `NodeDetached(SkippedNodeGone)`.
//!   The node is never skipped because it is merely unreachable.
//! - `Releasing` otherwise → node detach; unstage too when no other claim on the same node
//!   still uses the volume.
//! - `NodeDetached` and the plugin has no controller publish step → record
//!   `ControllerDetached(SkippedNotRequired)`.
//! - `NodeDetached` and another claim on the same node still uses the volume → record
//!   `ControllerDetached(SkippedStillUsedOnNode)`: detaching would pull the volume from under
//!   it. The claim being released never counts as "another user" (Nomad #14484).
//! - `NodeDetached` otherwise → controller detach.
//! - `ControllerDetached` → record `ReadyToFree`.
//! - `ReadyToFree` → free (drop the claim from the record; capacity comes back).

use csi_structs::{NodeId, WorkloadId};

use crate::model::{Claim, ControllerRequirement, VolumeRecord};
use crate::state::{ClaimState, ControllerStep, DetachSteps, NodeDetached, NodeStep};

/// The next thing to do for a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// No claim is being released.
    Idle,
    /// Move claim `index` to `to` and checkpoint; no call needed.
    Record {
        /// Position of the claim in [`VolumeRecord::claims`].
        index: usize,
        /// Its new state.
        to: ClaimState,
    },
    /// Call the node plugin for claim `index`.
    NodeDetach {
        /// Position of the claim.
        index: usize,
        /// Whether to unstage as well (last user on the node).
        unstage: bool,
    },
    /// Call the controller for claim `index`.
    ControllerDetach {
        /// Position of the claim.
        index: usize,
    },
    /// Claim `index` is ready to free: drop it from the record and checkpoint.
    Free {
        /// Position of the claim.
        index: usize,
    },
}

/// Decides the next step for `record`. `node_gone` says whether a node is gone for good;
/// `deferred` names the workload whose step failed last, which goes after every other claim
/// with a step to take.
pub fn next_step(
    record: &VolumeRecord,
    node_gone: impl Fn(&NodeId) -> bool,
    deferred: Option<&WorkloadId>,
) -> Step {
    next_step_performed_by(record, node_gone, deferred, |_, _| true)
}

/// [`next_step`] among the steps that `performs` says this agent performs: claims whose next
/// step belongs to another agent (the agent of the claim's node, or the one driving
/// controller-side work) are passed over, so that the steps this agent owns go on.
pub fn next_step_performed_by(
    record: &VolumeRecord,
    node_gone: impl Fn(&NodeId) -> bool,
    deferred: Option<&WorkloadId>,
    performs: impl Fn(&Claim, Side) -> bool,
) -> Step {
    let first = step_for(record, &node_gone, |w| Some(w) != deferred, &performs);
    match (first, deferred) {
        (Step::Idle, Some(d)) => step_for(record, &node_gone, |w| w == d, &performs),
        (step, _) => step,
    }
}

/// Which agent performs a step when several share a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The agent of the claim's node: the node detach calls (`NodeUnpublishVolume`,
    /// `NodeUnstageVolume`) reach the node plugin there.
    Node,
    /// The one agent driving controller-side work: the controller detach call, and every
    /// step that is only a record (skips, ready to free, free), including the skipped node step
    /// of a node that is gone for good.
    Controller,
}

impl Step {
    /// Who performs this step ([`Step::Idle`] counts as [`Side::Controller`]).
    pub fn side(&self) -> Side {
        match self {
            Step::NodeDetach { .. } => Side::Node,
            _ => Side::Controller,
        }
    }
}

fn step_for(
    record: &VolumeRecord,
    node_gone: &impl Fn(&NodeId) -> bool,
    consider: impl Fn(&WorkloadId) -> bool,
    performs: &impl Fn(&Claim, Side) -> bool,
) -> Step {
    for (index, claim) in record.claims.iter().enumerate() {
        if !consider(&claim.workload) {
            continue;
        }
        if let Some(step) = claim_step(record, index, node_gone)
            && performs(claim, step.side())
        {
            return step;
        }
    }
    Step::Idle
}

/// The next step of claim `index` alone, if it has one.
fn claim_step(
    record: &VolumeRecord,
    index: usize,
    node_gone: &impl Fn(&NodeId) -> bool,
) -> Option<Step> {
    let claims = &record.claims;
    let other_user = |index: usize| {
        let me = &claims[index];
        claims
            .iter()
            .enumerate()
            .find(|(j, c)| *j != index && c.node == me.node && c.uses_node())
            .map(|(_, c)| c)
    };
    let claim = &claims[index];
    Some(match &claim.state {
        ClaimState::Taken => return None,
        ClaimState::Releasing if node_gone(&claim.node) => Step::Record {
            index,
            to: ClaimState::NodeDetached(NodeDetached {
                node: NodeStep::SkippedNodeGone,
            }),
        },
        ClaimState::Releasing => Step::NodeDetach {
            index,
            unstage: other_user(index).is_none(),
        },
        ClaimState::NodeDetached(done) => {
            let skip = match record.info.controller {
                ControllerRequirement::NotRequired => Some(ControllerStep::SkippedNotRequired),
                ControllerRequirement::Required => {
                    other_user(index).map(|c| ControllerStep::SkippedStillUsedOnNode {
                        by: c.workload.clone(),
                    })
                }
            };
            match skip {
                Some(controller) => Step::Record {
                    index,
                    to: ClaimState::ControllerDetached(DetachSteps {
                        node: done.node,
                        controller,
                    }),
                },
                None => Step::ControllerDetach { index },
            }
        }
        ClaimState::ControllerDetached(done) => Step::Record {
            index,
            to: ClaimState::ReadyToFree(done.clone()),
        },
        ClaimState::ReadyToFree(_) | ClaimState::Freed(_) => Step::Free { index },
    })
}
