//! Configuration of a [`ReleaseMachine`](super::ReleaseMachine).

use std::collections::HashMap;
use std::num::NonZeroUsize;

use csi_structs::{NodeId, PluginId};

use crate::backoff::BackoffPolicy;

/// How a [`ReleaseMachine`](super::ReleaseMachine) retries and how many controller calls it
/// runs at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineConfig {
    /// Per-volume retry delays after a failed step or store write.
    pub backoff: BackoffPolicy,
    /// How many `ControllerUnpublishVolume` calls may be in flight per plugin. Default 1:
    /// many plugins rely on the orchestrator to serialize controller calls (Nomad #8336).
    pub controller_calls_per_plugin: NonZeroUsize,
    /// Per-plugin overrides of [`controller_calls_per_plugin`](Self::controller_calls_per_plugin).
    pub controller_calls_by_plugin: HashMap<PluginId, NonZeroUsize>,
    /// Seed of the jitter generator. Give each agent its own (for example from its node id)
    /// so agents do not retry in lockstep; tests fix it to replay exactly.
    pub jitter_seed: u64,
    /// Which release steps this machine performs. Default: all of them (one agent, or a
    /// store of its own). Agents sharing one store split them: each performs the node steps
    /// of its own node, and one at a time the controller-side steps (see
    /// [`ReleaseMachine::set_controller_duty`](super::ReleaseMachine::set_controller_duty)).
    pub duties: Duties,
}

/// Which release steps a machine performs; see [`Side`](crate::transition::Side).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duties {
    /// Node steps of claims on which nodes.
    pub node: NodeDuties,
    /// Whether it performs controller-side steps from the start. Changed at run time with
    /// [`ReleaseMachine::set_controller_duty`](super::ReleaseMachine::set_controller_duty).
    pub controller: bool,
}

impl Duties {
    /// Every step: the default.
    pub const ALL: Duties = Duties {
        node: NodeDuties::All,
        controller: true,
    };

    /// The node steps of `node` only, and controller-side steps while `controller` says so.
    pub fn node(node: NodeId, controller: bool) -> Self {
        Self {
            node: NodeDuties::Only(node),
            controller,
        }
    }
}

impl Default for Duties {
    fn default() -> Self {
        Self::ALL
    }
}

/// Node steps of which nodes' claims a machine performs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeDuties {
    /// Every node's (one agent reaches every node plugin, e.g. through csi-rpc-shim).
    All,
    /// One node's: the agent of that node.
    Only(NodeId),
}

impl MachineConfig {
    /// Defaults with the given jitter seed.
    pub fn with_seed(jitter_seed: u64) -> Self {
        Self {
            jitter_seed,
            ..Self::default()
        }
    }

    /// The controller-call limit for `plugin`.
    pub fn controller_limit(&self, plugin: &PluginId) -> usize {
        self.controller_calls_by_plugin
            .get(plugin)
            .copied()
            .unwrap_or(self.controller_calls_per_plugin)
            .get()
    }
}

impl Default for MachineConfig {
    /// [`BackoffPolicy::DEFAULT`], one controller call per plugin, jitter seed 0, every duty.
    fn default() -> Self {
        Self {
            backoff: BackoffPolicy::DEFAULT,
            controller_calls_per_plugin: NonZeroUsize::MIN,
            controller_calls_by_plugin: HashMap::new(),
            jitter_seed: 0,
            duties: Duties::ALL,
        }
    }
}
