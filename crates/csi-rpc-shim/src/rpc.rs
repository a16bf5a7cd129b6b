//! [`AgentRpc`]: the calls of the agent protocol, and [`ServiceKind`]: which plugin service
//! serves them.

use std::fmt;

/// The two plugin services a call can need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceKind {
    /// The controller service: may run on any node (often on a few), serves volume-wide calls.
    Controller,
    /// The node service: runs on every node that mounts volumes, serves that node only.
    Node,
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServiceKind::Controller => "controller",
            ServiceKind::Node => "node",
        })
    }
}

macro_rules! rpcs {
    ($($(#[$doc:meta])* $name:ident => $service:ident, mutating = $mutating:literal;)*) => {
        /// Every call of the agent protocol (`csisdk.agent.v1.Agent`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum AgentRpc {
            $($(#[$doc])* $name,)*
        }

        impl AgentRpc {
            /// Every call, in protocol order.
            pub const ALL: &'static [AgentRpc] = &[$(AgentRpc::$name,)*];

            /// The method name, e.g. `ControllerAttach`.
            pub const fn name(self) -> &'static str {
                match self {
                    $(AgentRpc::$name => stringify!($name),)*
                }
            }

            /// The full gRPC path, e.g. `/csisdk.agent.v1.Agent/ControllerAttach`.
            pub const fn path(self) -> &'static str {
                match self {
                    $(AgentRpc::$name => concat!("/csisdk.agent.v1.Agent/", stringify!($name)),)*
                }
            }

            /// Which plugin service serves the call.
            pub const fn service(self) -> ServiceKind {
                match self {
                    $(AgentRpc::$name => ServiceKind::$service,)*
                }
            }

            /// Whether the call changes state on the storage side. A mutating call whose
            /// outcome is unknown is [`Uncertain`](csi_structs::ErrorClass::Uncertain); a
            /// read-only one is simply retried.
            pub const fn is_mutating(self) -> bool {
                match self {
                    $(AgentRpc::$name => $mutating,)*
                }
            }
        }
    };
}

rpcs! {
    /// `ControllerPublishVolume` on a controller node.
    ControllerAttach => Controller, mutating = true;
    /// `ControllerUnpublishVolume` on a controller node.
    ControllerDetach => Controller, mutating = true;
    /// `ValidateVolumeCapabilities` on a controller node.
    ControllerValidate => Controller, mutating = false;
    /// `CreateVolume` on a controller node.
    ControllerCreateVolume => Controller, mutating = true;
    /// `DeleteVolume` on a controller node.
    ControllerDeleteVolume => Controller, mutating = true;
    /// `ControllerExpandVolume` on a controller node.
    ControllerExpandVolume => Controller, mutating = true;
    /// `ListVolumes` on a controller node.
    ControllerListVolumes => Controller, mutating = false;
    /// `CreateSnapshot` on a controller node.
    ControllerCreateSnapshot => Controller, mutating = true;
    /// `DeleteSnapshot` on a controller node.
    ControllerDeleteSnapshot => Controller, mutating = true;
    /// `ListSnapshots` on a controller node.
    ControllerListSnapshots => Controller, mutating = false;
    /// `NodeUnpublishVolume` then `NodeUnstageVolume` on the node that owns the volume.
    NodeDetach => Node, mutating = true;
    /// `NodeExpandVolume` on the node that owns the volume.
    NodeExpand => Node, mutating = true;
}

impl fmt::Display for AgentRpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
