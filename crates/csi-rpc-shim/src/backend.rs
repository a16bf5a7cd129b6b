//! [`LocalPlugins`]: how the shim reaches the plugins on its own node.
//!
//! The shim does not talk to plugins itself. The layer that composes it (the reference agent)
//! implements this trait with `csi-client`; tests implement it with scripted fakes. Each method
//! runs one forwarded operation against the plugin on this node and returns the plugin's
//! answer, or a [`PluginError`] already sorted into an [`ErrorClass`].

use std::fmt;

use async_trait::async_trait;
use csi_structs::untrusted::escaped;
use csi_structs::{ErrorClass, NodeId, PluginId};
use tokio::time::Instant;

use crate::request::{
    ControllerAttach, ControllerAttached, ControllerDetach, ControllerExpand, ControllerExpanded,
    ControllerValidate, CreateSnapshot, CreateVolume, CreatedVolume, DeleteSnapshot, DeleteVolume,
    ListSnapshots, ListVolumes, NodeDetach, NodeExpand, NodeExpanded, SnapshotInfo, SnapshotPage,
    Validated, VolumePage,
};
use crate::rpc::ServiceKind;

/// The canonical gRPC status codes, as a plugin answered them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrpcCode {
    /// 0.
    Ok,
    /// 1.
    Cancelled,
    /// 2, and any number outside 0..=16.
    Unknown,
    /// 3.
    InvalidArgument,
    /// 4.
    DeadlineExceeded,
    /// 5.
    NotFound,
    /// 6.
    AlreadyExists,
    /// 7.
    PermissionDenied,
    /// 8.
    ResourceExhausted,
    /// 9.
    FailedPrecondition,
    /// 10.
    Aborted,
    /// 11.
    OutOfRange,
    /// 12.
    Unimplemented,
    /// 13.
    Internal,
    /// 14.
    Unavailable,
    /// 15.
    DataLoss,
    /// 16.
    Unauthenticated,
}

impl GrpcCode {
    const TABLE: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code for a wire number; numbers outside `0..=16` are [`GrpcCode::Unknown`].
    pub fn from_i32(value: i32) -> Self {
        usize::try_from(value)
            .ok()
            .and_then(|i| Self::TABLE.get(i).copied())
            .unwrap_or(GrpcCode::Unknown)
    }

    /// The wire number.
    pub fn as_i32(self) -> i32 {
        // The table holds every variant exactly once, in wire order.
        Self::TABLE.iter().position(|c| *c == self).unwrap_or(2) as i32
    }
}

impl From<tonic::Code> for GrpcCode {
    /// The same code, for a composing layer mapping a plugin client's error.
    fn from(code: tonic::Code) -> Self {
        GrpcCode::from_i32(code as i32)
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What a failed plugin call came to, as the plugin client saw it: the plugin's own status,
/// or a failure on the calling side that the plugin never reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PluginFailure {
    /// The plugin answered with this gRPC status code.
    Status(GrpcCode),
    /// The plugin answered, but its answer was unusable (too large, undecodable, not gRPC,
    /// or with invalid fields); the plugin reported no failure.
    UnusableAnswer,
    /// A deadline of the calling side passed before the plugin answered; not the plugin's
    /// `DEADLINE_EXCEEDED`.
    Deadline,
    /// The plugin could not be reached, or the connection broke during the call.
    Unreachable,
    /// The request was refused before it was sent.
    NotSent,
    /// The serving agent failed on its own side, before or after the plugin call (a path it
    /// could not derive, a file it could not write, a call it does not serve).
    Agent,
}

impl PluginFailure {
    /// The plugin's status code, when it answered with one.
    pub fn code(self) -> Option<GrpcCode> {
        match self {
            PluginFailure::Status(code) => Some(code),
            _ => None,
        }
    }
}

impl fmt::Display for PluginFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginFailure::Status(code) => write!(f, "plugin answered {code}"),
            PluginFailure::UnusableAnswer => f.write_str("plugin's answer was unusable"),
            PluginFailure::Deadline => f.write_str("no answer before the deadline"),
            PluginFailure::Unreachable => f.write_str("plugin unreachable"),
            PluginFailure::NotSent => f.write_str("request not sent"),
            PluginFailure::Agent => f.write_str("the serving agent failed"),
        }
    }
}

/// A plugin's failure, classified where it happened.
///
/// `message` is the plugin client's text (which quotes the plugin's message); it is shown
/// [escaped](csi_structs::untrusted), never parsed. Plugins must not put secrets in it (spec §3.6); the shim caps its length
/// when it crosses the wire.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{failure} ({class}): {}", escaped(message))]
pub struct PluginError {
    /// What the caller should do.
    pub class: ErrorClass,
    /// The plugin's status, or the failure on the calling side.
    pub failure: PluginFailure,
    /// The plugin client's message.
    pub message: String,
}

impl PluginError {
    /// The plugin answered `code`; `class` and `message` as the plugin client gave them.
    pub fn new(class: ErrorClass, code: GrpcCode, message: impl Into<String>) -> Self {
        Self::failed(class, PluginFailure::Status(code), message)
    }

    /// A failure of any kind, [`PluginFailure::Status`] included.
    pub fn failed(class: ErrorClass, failure: PluginFailure, message: impl Into<String>) -> Self {
        Self {
            class,
            failure,
            message: message.into(),
        }
    }

    /// The plugin's status code, when it answered with one.
    pub fn code(&self) -> Option<GrpcCode> {
        self.failure.code()
    }

    /// Whether the shim should try another controller instance after this failure.
    ///
    /// The class decides: [`ErrorClass::RetryElsewhere`] always fails over; a retryable or
    /// uncertain failure fails over when the instance answered `UNAVAILABLE` or gave no
    /// usable answer at all (it cannot serve right now, and every CSI mutation is
    /// idempotent); a fatal or already-done answer never does, whatever code a composer
    /// attached to it.
    pub fn fails_over(&self) -> bool {
        match self.class {
            ErrorClass::RetryElsewhere => true,
            ErrorClass::Retry | ErrorClass::Uncertain => !matches!(
                self.failure,
                PluginFailure::Status(code) if code != GrpcCode::Unavailable
            ),
            ErrorClass::Fatal | ErrorClass::AlreadyDone => false,
        }
    }
}

/// Whether a plugin service is present and healthy on this node, as the local plugin manager
/// knows it right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalStatus {
    /// Present and healthy: calls may go to it.
    Healthy,
    /// Present but failing its health checks (or its health is not known yet). Release
    /// steps (node detach, controller detach) are still served; other calls are refused.
    Unhealthy {
        /// Why, for people.
        reason: String,
    },
    /// Not running on this node.
    Missing,
}

/// What the shim tells the local plugins about a call it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShimContext {
    /// The latest moment the answer is still useful: the original caller's deadline, carried
    /// across every hop (for a call from another agent, the sooner of its `grpc-timeout` and
    /// its stamped wall-clock deadline less the clock-skew margin; see
    /// [`deadline`](crate::deadline)). Set the plugin call's own timeout from it.
    pub deadline: Instant,
    /// The node on whose behalf the call is made (authenticated).
    pub origin: NodeId,
    /// How many agents the call passed through before reaching this one (0 or 1).
    pub hops: u8,
}

/// The plugins on this agent's node, as the shim needs them.
///
/// An implementation over `csi-client` maps each client error to a [`PluginError`] with the
/// client's class, the plugin's gRPC code when it answered one (`GrpcCode::from(code)`), or
/// else the [`PluginFailure`] the client saw (an unusable answer, its own deadline, a lost
/// socket), and the client's message. The class is never re-derived here.
///
/// Every method serves one call of the agent protocol against the local plugin and must
/// respect `ctx.deadline` (the shim also drops the future when the deadline passes).
/// `status` must be cheap: it is asked before every call.
#[async_trait]
pub trait LocalPlugins: Send + Sync + 'static {
    /// Whether `plugin`'s `service` runs on this node and is healthy. An unhealthy service
    /// still gets the release steps.
    fn status(&self, plugin: &PluginId, service: ServiceKind) -> LocalStatus;

    /// `ControllerPublishVolume`.
    async fn controller_attach(
        &self,
        ctx: &ShimContext,
        req: ControllerAttach,
    ) -> Result<ControllerAttached, PluginError>;

    /// `ControllerUnpublishVolume`.
    async fn controller_detach(
        &self,
        ctx: &ShimContext,
        req: ControllerDetach,
    ) -> Result<(), PluginError>;

    /// `ValidateVolumeCapabilities`.
    async fn controller_validate(
        &self,
        ctx: &ShimContext,
        req: ControllerValidate,
    ) -> Result<Validated, PluginError>;

    /// `CreateVolume`.
    async fn create_volume(
        &self,
        ctx: &ShimContext,
        req: CreateVolume,
    ) -> Result<CreatedVolume, PluginError>;

    /// `DeleteVolume`.
    async fn delete_volume(&self, ctx: &ShimContext, req: DeleteVolume) -> Result<(), PluginError>;

    /// `ControllerExpandVolume`.
    async fn controller_expand(
        &self,
        ctx: &ShimContext,
        req: ControllerExpand,
    ) -> Result<ControllerExpanded, PluginError>;

    /// `ListVolumes`, one page.
    async fn list_volumes(
        &self,
        ctx: &ShimContext,
        req: ListVolumes,
    ) -> Result<VolumePage, PluginError>;

    /// `CreateSnapshot`.
    async fn create_snapshot(
        &self,
        ctx: &ShimContext,
        req: CreateSnapshot,
    ) -> Result<SnapshotInfo, PluginError>;

    /// `DeleteSnapshot`.
    async fn delete_snapshot(
        &self,
        ctx: &ShimContext,
        req: DeleteSnapshot,
    ) -> Result<(), PluginError>;

    /// `ListSnapshots`, one page.
    async fn list_snapshots(
        &self,
        ctx: &ShimContext,
        req: ListSnapshots,
    ) -> Result<SnapshotPage, PluginError>;

    /// `NodeUnpublishVolume` for the workload's target path, then `NodeUnstageVolume`.
    async fn node_detach(&self, ctx: &ShimContext, req: NodeDetach) -> Result<(), PluginError>;

    /// `NodeExpandVolume`.
    async fn node_expand(
        &self,
        ctx: &ShimContext,
        req: NodeExpand,
    ) -> Result<NodeExpanded, PluginError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_numbers_fold() {
        for (i, code) in GrpcCode::TABLE.iter().enumerate() {
            assert_eq!(GrpcCode::from_i32(i as i32), *code);
            assert_eq!(code.as_i32(), i as i32);
        }
        assert_eq!(GrpcCode::from_i32(17), GrpcCode::Unknown);
        assert_eq!(GrpcCode::from_i32(-1), GrpcCode::Unknown);
        assert_eq!(
            GrpcCode::from(tonic::Code::Unavailable),
            GrpcCode::Unavailable
        );
    }

    #[test]
    fn failover_rule() {
        let e = |class, code| PluginError::new(class, code, "x");
        assert!(e(ErrorClass::RetryElsewhere, GrpcCode::FailedPrecondition).fails_over());
        assert!(e(ErrorClass::Retry, GrpcCode::Unavailable).fails_over());
        assert!(!e(ErrorClass::Retry, GrpcCode::Aborted).fails_over());
        assert!(!e(ErrorClass::Fatal, GrpcCode::InvalidArgument).fails_over());
        let without_status = |class, failure| PluginError::failed(class, failure, "x");
        assert!(without_status(ErrorClass::Uncertain, PluginFailure::Deadline).fails_over());
        assert!(without_status(ErrorClass::Retry, PluginFailure::UnusableAnswer).fails_over());
        assert!(!without_status(ErrorClass::Fatal, PluginFailure::NotSent).fails_over());
    }

    #[test]
    fn only_a_status_reads_as_the_plugins_answer() {
        let answered = PluginError::new(ErrorClass::Fatal, GrpcCode::NotFound, "no such volume");
        assert_eq!(answered.code(), Some(GrpcCode::NotFound));
        assert_eq!(
            answered.to_string(),
            "plugin answered NotFound (fatal): no such volume"
        );
        let refused = PluginError::failed(
            ErrorClass::Uncertain,
            PluginFailure::UnusableAnswer,
            "too large",
        );
        assert_eq!(refused.code(), None);
        assert_eq!(
            refused.to_string(),
            "plugin's answer was unusable (uncertain): too large"
        );
        let late = PluginError::failed(ErrorClass::Uncertain, PluginFailure::Deadline, "late");
        assert!(!late.to_string().contains("DeadlineExceeded"), "{late}");
    }
}

#[cfg(test)]
mod fails_over_tests {
    use super::*;

    #[test]
    fn the_class_decides_failover() {
        let cases = [
            (
                ErrorClass::RetryElsewhere,
                GrpcCode::FailedPrecondition,
                true,
            ),
            (ErrorClass::Retry, GrpcCode::Unavailable, true),
            (ErrorClass::Uncertain, GrpcCode::Unavailable, true),
            (ErrorClass::Retry, GrpcCode::Aborted, false),
            (ErrorClass::Fatal, GrpcCode::Unavailable, false),
            (ErrorClass::AlreadyDone, GrpcCode::Unavailable, false),
        ];
        for (class, code, expected) in cases {
            assert_eq!(
                PluginError::new(class, code, "x").fails_over(),
                expected,
                "{class:?} with {code:?}"
            );
        }
    }
}
