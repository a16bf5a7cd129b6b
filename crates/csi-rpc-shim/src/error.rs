//! [`ShimError`]: every way a routed call fails, each with its [`ErrorClass`], and the
//! conversion to and from the structured error detail that crosses the agent wire.

use std::fmt;

use csi_structs::untrusted::escaped;
use csi_structs::{ErrorClass, NodeId, PluginId};
use prost::Message as _;

use crate::auth::Denied;
use crate::backend::{GrpcCode, PluginError, PluginFailure};
use crate::rpc::{AgentRpc, ServiceKind};
use crate::wire::{InvalidMessage, cap_message, pb};

/// Why one controller instance did not serve a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// Its node is not ready.
    NodeDown,
    /// The registry reports the instance unhealthy.
    Unhealthy {
        /// Why, for people.
        reason: String,
    },
    /// Its node's agent says the controller service is not running there.
    PluginMissing,
    /// Its node's agent says the controller service is unhealthy.
    PluginUnhealthy {
        /// Why, for people.
        reason: String,
    },
    /// This agent has no route (direct or through one relay) to its node.
    NoRoute,
    /// Its node, or the relay in front of it, could not be reached; nothing was sent.
    PeerUnreachable,
    /// The connection broke after the call was sent; it may have run.
    PeerLost,
    /// The plugin answered "retry elsewhere" or `UNAVAILABLE`.
    Plugin(PluginError),
    /// The agent on the way answered that it could not deliver the call (its node is
    /// unknown, down or gone there, or it has no link to it).
    Undeliverable,
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefusalReason::NodeDown => f.write_str("node is not ready"),
            RefusalReason::Unhealthy { reason } => {
                write!(f, "instance is unhealthy: {}", escaped(reason))
            }
            RefusalReason::PluginMissing => f.write_str("controller service is not running there"),
            RefusalReason::PluginUnhealthy { reason } => {
                write!(
                    f,
                    "controller service is unhealthy there: {}",
                    escaped(reason)
                )
            }
            RefusalReason::NoRoute => f.write_str("no route to the node"),
            RefusalReason::PeerUnreachable => f.write_str("agent unreachable"),
            RefusalReason::PeerLost => f.write_str("connection lost after sending"),
            RefusalReason::Plugin(e) => write!(f, "{e}"),
            RefusalReason::Undeliverable => f.write_str("the relay could not deliver the call"),
        }
    }
}

/// One controller instance that did not serve a call, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The instance's node.
    pub node: NodeId,
    /// Why.
    pub reason: RefusalReason,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.reason)
    }
}

struct RefusalList<'a>(&'a [Refusal]);

impl fmt::Display for RefusalList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no instance is registered");
        }
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// What went wrong with a message a peer sent back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolProblem {
    /// An error status without our error detail (not an agent of this protocol, or a
    /// transport failure we cannot place).
    #[error("error status {code} without an error detail")]
    MissingDetail {
        /// The status code.
        code: GrpcCode,
    },
    /// The error detail did not decode, or named no kind or class.
    #[error("undecodable or incomplete error detail")]
    BadDetail,
    /// The answer broke the protocol's rules.
    #[error(transparent)]
    BadResponse(InvalidMessage),
}

/// Every way a routed call fails. [`ShimError::class`] says what to do about it; match on
/// variants, never on the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShimError {
    /// The plugin answered with an error. The class is the one the plugin client assigned.
    #[error("{rpc} on node {node}: {error}")]
    Plugin {
        /// The call.
        rpc: AgentRpc,
        /// The node whose plugin answered.
        node: NodeId,
        /// The plugin's error.
        #[source]
        error: PluginError,
    },
    /// The plugin's service does not run on the node. Controller calls: retry elsewhere;
    /// node calls: retry later (the plugin may be restarting).
    #[error("{rpc}: the {service} service of plugin {plugin} is not running on node {node}")]
    PluginMissing {
        /// The call.
        rpc: AgentRpc,
        /// The plugin.
        plugin: PluginId,
        /// The node.
        node: NodeId,
        /// Which service.
        service: ServiceKind,
    },
    /// The plugin's service runs on the node but is unhealthy. Classes as
    /// [`PluginMissing`](Self::PluginMissing).
    #[error(
        "{rpc}: the {service} service of plugin {plugin} on node {node} is unhealthy: {}",
        escaped(reason)
    )]
    PluginUnhealthy {
        /// The call.
        rpc: AgentRpc,
        /// The plugin.
        plugin: PluginId,
        /// The node.
        node: NodeId,
        /// Which service.
        service: ServiceKind,
        /// Why, for people.
        reason: String,
    },
    /// The node has left the cluster: nothing on it can be served any more. The claim layer
    /// uses this to stop waiting for a node detach ([`ShimError::is_node_gone`]). Fatal.
    #[error("{rpc}: node {node} has left the cluster")]
    NodeGone {
        /// The call.
        rpc: AgentRpc,
        /// The node.
        node: NodeId,
    },
    /// The node is not known to this agent's registry (yet). Retry: an agent that has just
    /// started must not take "not heard of yet" for "gone".
    #[error("{rpc}: node {node} is not known to the registry")]
    UnknownNode {
        /// The call.
        rpc: AgentRpc,
        /// The node.
        node: NodeId,
    },
    /// The node is known but not ready. Retry.
    #[error("{rpc}: node {node} is not ready")]
    NodeDown {
        /// The call.
        rpc: AgentRpc,
        /// The node.
        node: NodeId,
    },
    /// No controller instance served the call; one entry per instance tried or excluded.
    /// Retry, or uncertain for a mutating call that may have reached one of them.
    #[error(
        "{rpc}: no controller of plugin {plugin} could serve the call: {}",
        RefusalList(refusals)
    )]
    NoController {
        /// The call.
        rpc: AgentRpc,
        /// The plugin.
        plugin: PluginId,
        /// Why each instance was refused, in the order they were considered.
        refusals: Vec<Refusal>,
        /// Whether an attempt may have reached a plugin before its connection broke.
        maybe_sent: bool,
    },
    /// No direct link to the node and no relay that has one. Retry.
    #[error("{rpc}: no route to node {node}")]
    NoRoute {
        /// The call.
        rpc: AgentRpc,
        /// The node.
        node: NodeId,
    },
    /// The call had already taken its one hop and was not addressed to the agent it reached.
    /// Fatal: a correct agent never sends that.
    #[error("{rpc}: node {node} refused a call that had already been relayed once")]
    HopLimit {
        /// The call.
        rpc: AgentRpc,
        /// The agent that refused it.
        node: NodeId,
    },
    /// The node refused our credentials. Fatal until the token is fixed.
    #[error("{rpc}: node {node} did not accept this agent's credentials")]
    Unauthenticated {
        /// The call.
        rpc: AgentRpc,
        /// The agent that refused.
        node: NodeId,
    },
    /// The node refused to let us make this call (acting for another node, or a cluster-wide
    /// call from a node-scoped agent). Fatal.
    #[error("{rpc}: node {node} denied the call")]
    PermissionDenied {
        /// The call.
        rpc: AgentRpc,
        /// The agent that refused.
        node: NodeId,
    },
    /// This agent refused the call before sending it, for the same reasons. Fatal.
    #[error("{rpc}: {denied}")]
    Denied {
        /// The call.
        rpc: AgentRpc,
        /// Why.
        #[source]
        denied: Denied,
    },
    /// The request broke the protocol's rules; nothing was sent. Fatal.
    #[error("{rpc}: {error}")]
    InvalidRequest {
        /// The call.
        rpc: AgentRpc,
        /// Every problem found.
        #[source]
        error: InvalidMessage,
    },
    /// A peer found the request invalid (version skew: we check the same rules before
    /// sending). Fatal.
    #[error("{rpc}: node {node} rejected the request: {}", escaped(&violations.join("; ")))]
    Rejected {
        /// The call.
        rpc: AgentRpc,
        /// The agent that rejected it.
        node: NodeId,
        /// One line per broken rule.
        violations: Vec<String>,
    },
    /// The caller's deadline passed. Uncertain for a mutating call (it may have run), retry
    /// for a read-only one.
    #[error("{rpc}: the caller's deadline passed{}", at_node(node.as_ref()))]
    DeadlineExceeded {
        /// The call.
        rpc: AgentRpc,
        /// The node the call was waiting on, when known.
        node: Option<NodeId>,
    },
    /// The agent could not be reached; nothing was sent. Retry.
    #[error("{rpc}: agent on node {node} unreachable")]
    PeerUnreachable {
        /// The call.
        rpc: AgentRpc,
        /// The agent.
        node: NodeId,
    },
    /// The connection broke after the call was sent. Uncertain for a mutating call.
    #[error("{rpc}: connection to node {node} lost during the call")]
    PeerLost {
        /// The call.
        rpc: AgentRpc,
        /// The agent.
        node: NodeId,
    },
    /// A peer answered outside the protocol. Uncertain for a mutating call.
    #[error("{rpc}: node {node} broke the protocol: {problem}")]
    Protocol {
        /// The call.
        rpc: AgentRpc,
        /// The agent.
        node: NodeId,
        /// What was wrong.
        problem: ProtocolProblem,
    },
}

fn at_node(node: Option<&NodeId>) -> String {
    node.map(|n| format!(" waiting on node {n}"))
        .unwrap_or_default()
}

impl ShimError {
    /// The call that failed.
    pub fn rpc(&self) -> AgentRpc {
        match self {
            ShimError::Plugin { rpc, .. }
            | ShimError::PluginMissing { rpc, .. }
            | ShimError::PluginUnhealthy { rpc, .. }
            | ShimError::NodeGone { rpc, .. }
            | ShimError::UnknownNode { rpc, .. }
            | ShimError::NodeDown { rpc, .. }
            | ShimError::NoController { rpc, .. }
            | ShimError::NoRoute { rpc, .. }
            | ShimError::HopLimit { rpc, .. }
            | ShimError::Unauthenticated { rpc, .. }
            | ShimError::PermissionDenied { rpc, .. }
            | ShimError::Denied { rpc, .. }
            | ShimError::InvalidRequest { rpc, .. }
            | ShimError::Rejected { rpc, .. }
            | ShimError::DeadlineExceeded { rpc, .. }
            | ShimError::PeerUnreachable { rpc, .. }
            | ShimError::PeerLost { rpc, .. }
            | ShimError::Protocol { rpc, .. } => *rpc,
        }
    }

    /// What the caller should do about it.
    pub fn class(&self) -> ErrorClass {
        let unknown_outcome = if self.rpc().is_mutating() {
            ErrorClass::Uncertain
        } else {
            ErrorClass::Retry
        };
        match self {
            ShimError::Plugin { error, .. } => error.class,
            ShimError::PluginMissing { service, .. }
            | ShimError::PluginUnhealthy { service, .. } => match service {
                ServiceKind::Controller => ErrorClass::RetryElsewhere,
                ServiceKind::Node => ErrorClass::Retry,
            },
            ShimError::UnknownNode { .. }
            | ShimError::NodeDown { .. }
            | ShimError::NoRoute { .. }
            | ShimError::PeerUnreachable { .. } => ErrorClass::Retry,
            ShimError::NoController { maybe_sent, .. } => {
                if *maybe_sent {
                    unknown_outcome
                } else {
                    ErrorClass::Retry
                }
            }
            ShimError::NodeGone { .. }
            | ShimError::HopLimit { .. }
            | ShimError::Unauthenticated { .. }
            | ShimError::PermissionDenied { .. }
            | ShimError::Denied { .. }
            | ShimError::InvalidRequest { .. }
            | ShimError::Rejected { .. } => ErrorClass::Fatal,
            ShimError::DeadlineExceeded { .. }
            | ShimError::PeerLost { .. }
            | ShimError::Protocol { .. } => unknown_outcome,
        }
    }

    /// Whether the node the call was for has left the cluster.
    pub fn is_node_gone(&self) -> bool {
        matches!(self, ShimError::NodeGone { .. })
    }

    /// Whether the caller's deadline passed.
    pub fn is_deadline(&self) -> bool {
        matches!(self, ShimError::DeadlineExceeded { .. })
    }

    /// The gRPC status and detail this error travels as.
    pub(crate) fn to_status(&self, here: &NodeId) -> tonic::Status {
        use pb::ErrorKind as K;
        let mut detail = pb::ErrorDetail {
            class: class_to_wire(self.class()) as i32,
            ..Default::default()
        };
        let (kind, code, node, message): (K, tonic::Code, &NodeId, String) = match self {
            ShimError::Plugin { node, error, .. } => {
                let (failure, code) = failure_to_wire(error.failure);
                detail.plugin_failure = failure as i32;
                if let Some(plugin_code) = error.code() {
                    detail.plugin_code = plugin_code.as_i32();
                }
                (K::Plugin, code, node, error.message.clone())
            }
            ShimError::PluginMissing { node, .. } => (
                K::PluginMissing,
                tonic::Code::FailedPrecondition,
                node,
                String::new(),
            ),
            ShimError::PluginUnhealthy { node, reason, .. } => (
                K::PluginMissing,
                tonic::Code::FailedPrecondition,
                node,
                reason.clone(),
            ),
            ShimError::NodeGone { node, .. } => {
                (K::NodeGone, tonic::Code::NotFound, node, String::new())
            }
            ShimError::UnknownNode { node, .. } => (
                K::UnknownNode,
                tonic::Code::Unavailable,
                node,
                String::new(),
            ),
            ShimError::NodeDown { node, .. } => {
                (K::NodeDown, tonic::Code::Unavailable, node, String::new())
            }
            // Only the originating agent fails over, so this never crosses the wire; should it,
            // it reads as "this controller cannot serve it".
            ShimError::NoController { .. } => (
                K::PluginMissing,
                tonic::Code::Unavailable,
                here,
                self.to_string(),
            ),
            ShimError::NoRoute { node, .. } => {
                (K::NoRoute, tonic::Code::Unavailable, node, String::new())
            }
            ShimError::HopLimit { node, .. } => (
                K::HopLimit,
                tonic::Code::FailedPrecondition,
                node,
                String::new(),
            ),
            ShimError::Unauthenticated { node, .. } => (
                K::Unauthenticated,
                tonic::Code::Unauthenticated,
                node,
                String::new(),
            ),
            ShimError::PermissionDenied { node, .. } => (
                K::PermissionDenied,
                tonic::Code::PermissionDenied,
                node,
                String::new(),
            ),
            ShimError::Denied { denied, .. } => (
                K::PermissionDenied,
                tonic::Code::PermissionDenied,
                here,
                denied.to_string(),
            ),
            ShimError::InvalidRequest { error, .. } => {
                detail.violations = error.lines().into_iter().map(cap_message).collect();
                (
                    K::InvalidRequest,
                    tonic::Code::InvalidArgument,
                    here,
                    String::new(),
                )
            }
            ShimError::Rejected {
                node, violations, ..
            } => {
                detail.violations = violations.clone();
                (
                    K::InvalidRequest,
                    tonic::Code::InvalidArgument,
                    node,
                    String::new(),
                )
            }
            ShimError::DeadlineExceeded { node, .. } => (
                K::DeadlineExceeded,
                tonic::Code::DeadlineExceeded,
                node.as_ref().unwrap_or(here),
                String::new(),
            ),
            ShimError::PeerUnreachable { node, .. } => (
                K::PeerUnreachable,
                tonic::Code::Unavailable,
                node,
                String::new(),
            ),
            ShimError::PeerLost { node, .. } => {
                (K::PeerLost, tonic::Code::Unavailable, node, String::new())
            }
            ShimError::Protocol { node, problem, .. } => (
                K::PeerLost,
                tonic::Code::Internal,
                node,
                problem.to_string(),
            ),
        };
        detail.kind = kind as i32;
        detail.node_id = node.as_str().to_owned();
        detail.message = cap_message(message);
        tonic::Status::with_details(
            code,
            cap_message(self.to_string()),
            detail.encode_to_vec().into(),
        )
    }

    /// Rebuilds the error a peer sent as a status with our detail. `None` when the status
    /// carries no detail. `sent_to` is the node the call went to; `plugin` and `service` come
    /// from the call itself.
    pub(crate) fn from_detail(
        rpc: AgentRpc,
        plugin: &PluginId,
        sent_to: &NodeId,
        status: &tonic::Status,
    ) -> Option<ShimError> {
        use pb::ErrorKind as K;
        if status.details().is_empty() {
            return None;
        }
        let protocol = |problem| ShimError::Protocol {
            rpc,
            node: sent_to.clone(),
            problem,
        };
        let Ok(detail) = pb::ErrorDetail::decode(status.details()) else {
            return Some(protocol(ProtocolProblem::BadDetail));
        };
        let node = NodeId::new(detail.node_id.clone()).unwrap_or_else(|_| sent_to.clone());
        let message = cap_message(detail.message.clone());
        let service = rpc.service();
        let error = match K::try_from(detail.kind) {
            Ok(K::Plugin) => match class_from_wire(detail.class) {
                Some(class) => ShimError::Plugin {
                    rpc,
                    node,
                    error: PluginError::failed(
                        class,
                        failure_from_wire(detail.plugin_failure, detail.plugin_code),
                        message,
                    ),
                },
                None => protocol(ProtocolProblem::BadDetail),
            },
            Ok(K::PluginMissing) if message.is_empty() => ShimError::PluginMissing {
                rpc,
                plugin: plugin.clone(),
                node,
                service,
            },
            Ok(K::PluginMissing) => ShimError::PluginUnhealthy {
                rpc,
                plugin: plugin.clone(),
                node,
                service,
                reason: message,
            },
            Ok(K::NodeGone) => ShimError::NodeGone { rpc, node },
            Ok(K::UnknownNode) => ShimError::UnknownNode { rpc, node },
            Ok(K::NodeDown) => ShimError::NodeDown { rpc, node },
            Ok(K::NoRoute) => ShimError::NoRoute { rpc, node },
            Ok(K::HopLimit) => ShimError::HopLimit { rpc, node },
            Ok(K::Unauthenticated) => ShimError::Unauthenticated { rpc, node },
            Ok(K::PermissionDenied) => ShimError::PermissionDenied { rpc, node },
            Ok(K::InvalidRequest) => ShimError::Rejected {
                rpc,
                node,
                violations: detail.violations.into_iter().map(cap_message).collect(),
            },
            Ok(K::DeadlineExceeded) => ShimError::DeadlineExceeded {
                rpc,
                node: Some(node),
            },
            Ok(K::PeerUnreachable) => ShimError::PeerUnreachable { rpc, node },
            Ok(K::PeerLost) => ShimError::PeerLost { rpc, node },
            Ok(K::Unspecified) | Err(_) => protocol(ProtocolProblem::BadDetail),
        };
        Some(error)
    }

    /// Why a controller instance is refused after this error, and whether the call may have
    /// reached it; `None` when the error must go straight back to the caller instead of
    /// failing over.
    pub(crate) fn as_refusal(&self) -> Option<(RefusalReason, bool)> {
        match self {
            // The plugin answered, so the request reached it; whether it took effect is what
            // the plugin's class says (an uncertain failure may have attached the volume).
            ShimError::Plugin { error, .. } if error.fails_over() => Some((
                RefusalReason::Plugin(error.clone()),
                error.class == ErrorClass::Uncertain,
            )),
            ShimError::PluginMissing { .. } => Some((RefusalReason::PluginMissing, false)),
            ShimError::PluginUnhealthy { reason, .. } => Some((
                RefusalReason::PluginUnhealthy {
                    reason: reason.clone(),
                },
                false,
            )),
            ShimError::NoRoute { .. } => Some((RefusalReason::NoRoute, false)),
            ShimError::PeerUnreachable { .. } => Some((RefusalReason::PeerUnreachable, false)),
            ShimError::PeerLost { .. } => Some((RefusalReason::PeerLost, true)),
            ShimError::UnknownNode { .. }
            | ShimError::NodeDown { .. }
            | ShimError::NodeGone { .. } => Some((RefusalReason::Undeliverable, false)),
            _ => None,
        }
    }
}

/// How a plugin failure travels, and the code of the status that carries it: the plugin's
/// own code, or one saying what happened on the calling side.
fn failure_to_wire(failure: PluginFailure) -> (pb::PluginFailure, tonic::Code) {
    match failure {
        PluginFailure::Status(code) => (
            pb::PluginFailure::Status,
            tonic::Code::from_i32(code.as_i32()),
        ),
        PluginFailure::UnusableAnswer => (pb::PluginFailure::UnusableAnswer, tonic::Code::Internal),
        PluginFailure::Deadline => (pb::PluginFailure::Deadline, tonic::Code::DeadlineExceeded),
        PluginFailure::Unreachable => (pb::PluginFailure::Unreachable, tonic::Code::Unavailable),
        PluginFailure::NotSent => (pb::PluginFailure::NotSent, tonic::Code::InvalidArgument),
        PluginFailure::Agent => (pb::PluginFailure::Agent, tonic::Code::Internal),
    }
}

/// A plugin failure as a peer sent it; a value this agent does not know reads as the
/// plugin's status, which an agent that predates the field always means.
fn failure_from_wire(failure: i32, plugin_code: i32) -> PluginFailure {
    match pb::PluginFailure::try_from(failure) {
        Ok(pb::PluginFailure::UnusableAnswer) => PluginFailure::UnusableAnswer,
        Ok(pb::PluginFailure::Deadline) => PluginFailure::Deadline,
        Ok(pb::PluginFailure::Unreachable) => PluginFailure::Unreachable,
        Ok(pb::PluginFailure::NotSent) => PluginFailure::NotSent,
        Ok(pb::PluginFailure::Agent) => PluginFailure::Agent,
        Ok(pb::PluginFailure::Status) | Err(_) => {
            PluginFailure::Status(GrpcCode::from_i32(plugin_code))
        }
    }
}

fn class_to_wire(class: ErrorClass) -> pb::ErrorClass {
    match class {
        ErrorClass::AlreadyDone => pb::ErrorClass::AlreadyDone,
        ErrorClass::Retry => pb::ErrorClass::Retry,
        ErrorClass::RetryElsewhere => pb::ErrorClass::RetryElsewhere,
        ErrorClass::Uncertain => pb::ErrorClass::Uncertain,
        ErrorClass::Fatal => pb::ErrorClass::Fatal,
    }
}

fn class_from_wire(value: i32) -> Option<ErrorClass> {
    match pb::ErrorClass::try_from(value).ok()? {
        pb::ErrorClass::Unspecified => None,
        pb::ErrorClass::AlreadyDone => Some(ErrorClass::AlreadyDone),
        pb::ErrorClass::Retry => Some(ErrorClass::Retry),
        pb::ErrorClass::RetryElsewhere => Some(ErrorClass::RetryElsewhere),
        pb::ErrorClass::Uncertain => Some(ErrorClass::Uncertain),
        pb::ErrorClass::Fatal => Some(ErrorClass::Fatal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn every_wire_kind_round_trips_with_its_class() {
        let p = PluginId::new("ebs").unwrap();
        let here = n("here");
        let rpc = AgentRpc::ControllerAttach;
        let cases = vec![
            ShimError::Plugin {
                rpc,
                node: n("c"),
                error: PluginError::new(ErrorClass::Retry, GrpcCode::Aborted, "busy"),
            },
            ShimError::Plugin {
                rpc,
                node: n("c"),
                error: PluginError::failed(
                    ErrorClass::Uncertain,
                    PluginFailure::UnusableAnswer,
                    "too large",
                ),
            },
            ShimError::Plugin {
                rpc,
                node: n("c"),
                error: PluginError::failed(ErrorClass::Uncertain, PluginFailure::Deadline, "late"),
            },
            ShimError::Plugin {
                rpc,
                node: n("c"),
                error: PluginError::failed(
                    ErrorClass::Uncertain,
                    PluginFailure::Unreachable,
                    "reset",
                ),
            },
            ShimError::Plugin {
                rpc,
                node: n("c"),
                error: PluginError::failed(ErrorClass::Fatal, PluginFailure::NotSent, "bad id"),
            },
            ShimError::Plugin {
                rpc,
                node: n("c"),
                error: PluginError::failed(ErrorClass::Retry, PluginFailure::Agent, "disk full"),
            },
            ShimError::PluginMissing {
                rpc,
                plugin: p.clone(),
                node: n("c"),
                service: ServiceKind::Controller,
            },
            ShimError::PluginUnhealthy {
                rpc,
                plugin: p.clone(),
                node: n("c"),
                service: ServiceKind::Controller,
                reason: "probe failed".into(),
            },
            ShimError::NodeGone { rpc, node: n("c") },
            ShimError::UnknownNode { rpc, node: n("c") },
            ShimError::NodeDown { rpc, node: n("c") },
            ShimError::NoRoute { rpc, node: n("c") },
            ShimError::HopLimit { rpc, node: n("c") },
            ShimError::Unauthenticated { rpc, node: n("c") },
            ShimError::PermissionDenied { rpc, node: n("c") },
            ShimError::Rejected {
                rpc,
                node: n("c"),
                violations: vec!["volume_id is required but missing or empty".into()],
            },
            ShimError::DeadlineExceeded {
                rpc,
                node: Some(n("c")),
            },
            ShimError::PeerUnreachable { rpc, node: n("c") },
            ShimError::PeerLost { rpc, node: n("c") },
        ];
        for e in cases {
            let status = e.to_status(&here);
            let back = ShimError::from_detail(rpc, &p, &n("c"), &status).unwrap();
            assert_eq!(back, e);
            assert_eq!(back.class(), e.class());
        }
    }

    #[test]
    fn a_peers_text_cannot_forge_a_line() {
        let p = PluginId::new("ebs").unwrap();
        let rpc = AgentRpc::ControllerAttach;
        let sent = ShimError::Plugin {
            rpc,
            node: n("c"),
            error: PluginError::new(
                ErrorClass::Fatal,
                GrpcCode::Internal,
                "x\nINFO forged\u{1b}[2J",
            ),
        }
        .to_status(&n("here"));
        let back = ShimError::from_detail(rpc, &p, &n("c"), &sent).unwrap();
        let ShimError::Plugin { error, .. } = &back else {
            panic!("{back:?}");
        };
        assert_eq!(error.message, "x\nINFO forged\u{1b}[2J", "kept exactly");
        let unhealthy = ShimError::PluginUnhealthy {
            rpc,
            plugin: p,
            node: n("c"),
            service: ServiceKind::Controller,
            reason: "probe\rfailed".into(),
        };
        for text in [back.to_string(), unhealthy.to_string()] {
            assert!(
                !text.chars().any(csi_structs::untrusted::needs_escape),
                "{text:?}"
            );
        }
        assert!(
            back.to_string().contains(r"x\nINFO forged\u{1b}[2J"),
            "{back}"
        );
    }

    #[test]
    fn classes_follow_the_call() {
        let p = PluginId::new("ebs").unwrap();
        let missing = |rpc: AgentRpc| ShimError::PluginMissing {
            rpc,
            plugin: p.clone(),
            node: n("c"),
            service: rpc.service(),
        };
        assert_eq!(
            missing(AgentRpc::ControllerAttach).class(),
            ErrorClass::RetryElsewhere
        );
        assert_eq!(missing(AgentRpc::NodeDetach).class(), ErrorClass::Retry);
        let late = |rpc| ShimError::DeadlineExceeded { rpc, node: None };
        assert_eq!(late(AgentRpc::NodeDetach).class(), ErrorClass::Uncertain);
        // Our deadline, in words no one takes for a plugin's DEADLINE_EXCEEDED.
        assert_eq!(
            late(AgentRpc::NodeDetach).to_string(),
            "NodeDetach: the caller's deadline passed"
        );
        assert_eq!(
            late(AgentRpc::ControllerListVolumes).class(),
            ErrorClass::Retry
        );
        assert!(
            ShimError::NodeGone {
                rpc: AgentRpc::NodeDetach,
                node: n("c")
            }
            .is_node_gone()
        );
    }

    #[test]
    fn a_status_without_or_with_garbage_detail() {
        let p = PluginId::new("ebs").unwrap();
        let rpc = AgentRpc::NodeExpand;
        let plain = tonic::Status::unavailable("x");
        assert_eq!(ShimError::from_detail(rpc, &p, &n("c"), &plain), None);
        let junk = tonic::Status::with_details(tonic::Code::Internal, "x", vec![0xff, 0xff].into());
        assert!(matches!(
            ShimError::from_detail(rpc, &p, &n("c"), &junk),
            Some(ShimError::Protocol {
                problem: ProtocolProblem::BadDetail,
                ..
            })
        ));
        let no_class = pb::ErrorDetail {
            kind: pb::ErrorKind::Plugin as i32,
            ..Default::default()
        };
        let s = tonic::Status::with_details(
            tonic::Code::Internal,
            "x",
            no_class.encode_to_vec().into(),
        );
        assert!(matches!(
            ShimError::from_detail(rpc, &p, &n("c"), &s),
            Some(ShimError::Protocol { .. })
        ));
    }

    #[test]
    fn no_controller_lists_every_refusal() {
        let e = ShimError::NoController {
            rpc: AgentRpc::ControllerDetach,
            plugin: PluginId::new("ebs").unwrap(),
            refusals: vec![
                Refusal {
                    node: n("a"),
                    reason: RefusalReason::PeerUnreachable,
                },
                Refusal {
                    node: n("b"),
                    reason: RefusalReason::PeerLost,
                },
            ],
            maybe_sent: true,
        };
        let text = e.to_string();
        assert!(text.contains("a: agent unreachable") && text.contains("b: connection lost"));
        assert_eq!(e.class(), ErrorClass::Uncertain);
    }
}
