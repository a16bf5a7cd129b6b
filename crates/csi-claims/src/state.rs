//! Claim states: a claim is taken, then released step by step, then freed.
//!
//! ```text
//! Taken ──release──▶ Releasing ──node step──▶ NodeDetached ──controller step──▶
//!     ControllerDetached ──▶ ReadyToFree ──▶ Freed
//! ```
//!
//! Each variant carries what is true in it and nothing else: a [`NodeDetached`] claim records
//! how its node step ended ([`NodeStep`]), later states add how the controller step ended
//! ([`ControllerStep`]). There is no `Default`: no zero value means "taken".
//!
//! `Releasing` is the durable record that a release was asked for (Nomad's "unpublishing"):
//! it is written before any detach call, so a restart resumes the release instead of
//! forgetting it. Capacity is only given back in `Freed`.

use csi_structs::WorkloadId;
use serde::{Deserialize, Serialize};

/// Where a claim is in its life. See the [module docs](self) for the order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ClaimState {
    /// The workload holds and uses the volume.
    Taken,
    /// A release was asked for; the node step (unpublish, then unstage when last) is next.
    Releasing,
    /// The node step is done or was skipped by rule; the controller step is next.
    NodeDetached(NodeDetached),
    /// The controller step is done or was skipped by rule.
    ControllerDetached(DetachSteps),
    /// Both steps are settled; the claim is freed by the next checkpoint.
    ReadyToFree(DetachSteps),
    /// Terminal: the claim is gone from the store and its capacity is back. Only seen in
    /// [`Event::Freed`](crate::Event::Freed); never stored.
    Freed(DetachSteps),
}

impl ClaimState {
    /// A short name: `taken`, `releasing`, `node_detached`, `controller_detached`,
    /// `ready_to_free`, `freed`.
    pub const fn name(&self) -> &'static str {
        match self {
            ClaimState::Taken => "taken",
            ClaimState::Releasing => "releasing",
            ClaimState::NodeDetached(_) => "node_detached",
            ClaimState::ControllerDetached(_) => "controller_detached",
            ClaimState::ReadyToFree(_) => "ready_to_free",
            ClaimState::Freed(_) => "freed",
        }
    }

    /// Whether a release was asked for (any state after [`Taken`](Self::Taken)).
    pub const fn is_releasing(&self) -> bool {
        !matches!(self, ClaimState::Taken)
    }

    /// How the node step ended, once it has.
    pub const fn node_step(&self) -> Option<NodeStep> {
        match self {
            ClaimState::Taken | ClaimState::Releasing => None,
            ClaimState::NodeDetached(d) => Some(d.node),
            ClaimState::ControllerDetached(d)
            | ClaimState::ReadyToFree(d)
            | ClaimState::Freed(d) => Some(d.node),
        }
    }

    /// How the controller step ended, once it has.
    pub fn controller_step(&self) -> Option<&ControllerStep> {
        match self {
            ClaimState::Taken | ClaimState::Releasing | ClaimState::NodeDetached(_) => None,
            ClaimState::ControllerDetached(d)
            | ClaimState::ReadyToFree(d)
            | ClaimState::Freed(d) => Some(&d.controller),
        }
    }
}

impl std::fmt::Display for ClaimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Data of [`ClaimState::NodeDetached`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDetached {
    /// How the node step ended.
    pub node: NodeStep,
}

/// Data of the states after the controller step: how both steps ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetachSteps {
    /// How the node step ended.
    pub node: NodeStep,
    /// How the controller step ended.
    pub controller: ControllerStep,
}

/// How a claim's node step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "node_step", rename_all = "snake_case")]
pub enum NodeStep {
    /// `NodeUnpublishVolume` succeeded (or answered "already done"), followed by
    /// `NodeUnstageVolume` when `unstaged` (the claim was the last user on its node).
    Detached {
        /// Whether the volume was also unstaged from the node.
        unstaged: bool,
    },
    /// The node is gone for good (explicitly reported through
    /// [`ReleaseMachine::node_gone`](crate::ReleaseMachine::node_gone)); there is nothing
    /// left to unpublish on it. Recorded before the controller step runs.
    SkippedNodeGone,
    /// Another agent sharing the store performed it; this one learned only that the claim was
    /// freed. Only seen in [`Event::Freed`](crate::Event::Freed); never stored.
    DoneElsewhere,
}

impl std::fmt::Display for NodeStep {
    /// `unpublished`, `unpublished and unstaged`, `skipped: node gone for good` or
    /// `done by another agent`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeStep::Detached { unstaged: false } => "unpublished",
            NodeStep::Detached { unstaged: true } => "unpublished and unstaged",
            NodeStep::SkippedNodeGone => "skipped: node gone for good",
            NodeStep::DoneElsewhere => "done by another agent",
        })
    }
}

/// How a claim's controller step ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "controller_step", rename_all = "snake_case")]
pub enum ControllerStep {
    /// `ControllerUnpublishVolume` succeeded or answered "already done".
    Detached,
    /// The plugin has no controller publish step for this volume.
    SkippedNotRequired,
    /// Another claim on the same node still uses the volume, so it stays attached there;
    /// the last claim on the node detaches it.
    SkippedStillUsedOnNode {
        /// The workload still using the volume on that node.
        by: WorkloadId,
    },
    /// Another agent sharing the store performed it; this one learned only that the claim was
    /// freed. Only seen in [`Event::Freed`](crate::Event::Freed); never stored.
    DoneElsewhere,
}

impl std::fmt::Display for ControllerStep {
    /// `detached`, `skipped: no controller publish`, `skipped: still used on the node by
    /// <workload>` or `done by another agent`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControllerStep::Detached => f.write_str("detached"),
            ControllerStep::SkippedNotRequired => f.write_str("skipped: no controller publish"),
            ControllerStep::SkippedStillUsedOnNode { by } => {
                write!(f, "skipped: still used on the node by {by}")
            }
            ControllerStep::DoneElsewhere => f.write_str("done by another agent"),
        }
    }
}

#[cfg(test)]
mod step_display_tests {
    use super::*;

    #[test]
    fn steps_read_as_words() {
        assert_eq!(
            NodeStep::Detached { unstaged: true }.to_string(),
            "unpublished and unstaged"
        );
        assert_eq!(
            NodeStep::SkippedNodeGone.to_string(),
            "skipped: node gone for good"
        );
        let by = WorkloadId::new("web-2").expect("id");
        assert_eq!(
            ControllerStep::SkippedStillUsedOnNode { by }.to_string(),
            "skipped: still used on the node by web-2"
        );
        assert_eq!(
            ControllerStep::DoneElsewhere.to_string(),
            "done by another agent"
        );
    }
}
