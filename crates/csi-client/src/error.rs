//! The crate's one error type: what failed, where, how often it was tried, and its class.

use std::fmt;
use std::time::Duration;

use csi_proto::Rpc;
use csi_structs::untrusted::escaped;
use csi_structs::{ErrorClass, ExternalVolumeId, PluginNodeId, SnapshotId, ValidationErrors};
use tonic::Code;

use crate::connection::{ConnectError, HandshakeError};
use crate::policy::Failure;

/// Which deadline expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeadlineScope {
    /// The deadline of one attempt.
    Attempt,
    /// The deadline of the whole call, across attempts.
    Call,
}

/// A deadline of ours expired. Only this crate creates it: a timeout is known from our own
/// timer, never guessed from a status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed {
    scope: DeadlineScope,
    limit: Duration,
}

impl Elapsed {
    pub(crate) const fn new(scope: DeadlineScope, limit: Duration) -> Self {
        Elapsed { scope, limit }
    }

    /// Which deadline expired.
    pub const fn scope(&self) -> DeadlineScope {
        self.scope
    }

    /// The deadline that expired.
    pub const fn limit(&self) -> Duration {
        self.limit
    }
}

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scope {
            DeadlineScope::Attempt => write!(
                f,
                "no answer within the client's attempt deadline of {:?}",
                self.limit
            ),
            DeadlineScope::Call => write!(
                f,
                "no answer within the client's call deadline of {:?}",
                self.limit
            ),
        }
    }
}

impl std::error::Error for Elapsed {}

/// The largest answer message this crate decodes: tonic's default decode limit, which the
/// clients keep. A larger one is refused as [`ResponseError::TooLarge`].
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Why the plugin's answer (or a stream message) was unusable: it could not be read, or it
/// breaks the spec. The plugin did not report a failure; we refused what it sent. On a
/// mutation the outcome is therefore unknown ([`Uncertain`](ErrorClass::Uncertain)); on a
/// read the call may be made again ([`Retry`](ErrorClass::Retry)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// A message is larger than we decode.
    #[error("a message of {size} bytes is over the {limit}-byte decode limit")]
    TooLarge {
        /// The message's size, as its length prefix gave it.
        size: u64,
        /// The limit, [`MAX_ANSWER_BYTES`].
        limit: usize,
    },
    /// The answer is not gRPC: an HTTP error status without a `grpc-status` (a proxy's or a
    /// web server's error page, for example).
    #[error("not a gRPC answer: HTTP status {http_status} without a grpc-status")]
    NotGrpc {
        /// The HTTP status of the answer.
        http_status: u16,
    },
    /// The answer could not be decoded: bytes that are not a gRPC message or not the
    /// expected protobuf message, a missing message or status, a `grpc-status` that is not a
    /// number, more than one message in the answer of a unary call.
    #[error("undecodable answer: {}", escaped(detail))]
    Undecodable {
        /// What could not be read, in the decoder's words.
        detail: String,
    },
    /// Fields that are missing, too large or negative; each violation names the field.
    #[error("invalid fields: {0}")]
    Fields(ValidationErrors),
    /// A snapshot-metadata range starts before the previous one ended (ranges must be strictly
    /// ascending and non-overlapping across the whole stream).
    #[error(
        "block_metadata range at byte_offset {byte_offset} overlaps or precedes the previous range ending at {previous_end}"
    )]
    RangeOutOfOrder {
        /// The offending range's start.
        byte_offset: i64,
        /// Where the previous range ended.
        previous_end: i64,
    },
    /// `block_metadata_type` or `volume_capacity_bytes` changed in the middle of a stream.
    #[error("{field} changed mid-stream from {before} to {after}")]
    StreamShapeChanged {
        /// The field that changed.
        field: &'static str,
        /// The value in earlier messages.
        before: i64,
        /// The new value.
        after: i64,
    },
    /// A listing's `next_token` repeats a token an earlier page already gave: following it
    /// would never end.
    #[error(
        "next_token of page {page} repeats a token of an earlier page; the listing would never end"
    )]
    RepeatedToken {
        /// The page (from 1) whose `next_token` repeats.
        page: u32,
    },
    /// A listing went on for more pages than [`MAX_PAGES`](crate::paging::MAX_PAGES).
    #[error("the listing did not end within {limit} pages")]
    TooManyPages {
        /// The page limit.
        limit: u32,
    },
    /// A listing's pages held more entries than
    /// [`MAX_LISTED_ENTRIES`](crate::paging::MAX_LISTED_ENTRIES), or more bytes than
    /// [`MAX_LISTED_BYTES`](crate::paging::MAX_LISTED_BYTES), in all.
    #[error(
        "the listing went past {entries} entries or {bytes} bytes in all (limits {max_entries} entries, {max_bytes} bytes)"
    )]
    ListingTooLarge {
        /// Entries gathered when it was refused.
        entries: usize,
        /// Bytes of the pages (as encoded) gathered when it was refused.
        bytes: usize,
        /// The entry limit.
        max_entries: usize,
        /// The byte limit.
        max_bytes: usize,
    },
    /// A FIXED_LENGTH stream carried ranges of different sizes.
    #[error(
        "FIXED_LENGTH stream has a range of {size_bytes} bytes after ranges of {expected} bytes"
    )]
    UnequalFixedLength {
        /// The first size seen.
        expected: i64,
        /// The differing size.
        size_bytes: i64,
    },
}

/// An HTTP/2 error code, named as RFC 9113 §7 names it (`INTERNAL_ERROR`, `CANCEL`, …); a
/// code the RFC does not define shows its number.
///
/// ```
/// use csi_client::H2Code;
///
/// assert_eq!(H2Code(2).to_string(), "INTERNAL_ERROR");
/// assert_eq!(H2Code(0x99).to_string(), "code 0x99");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct H2Code(pub u32);

impl H2Code {
    /// The RFC's name of the code, when it defines one.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x0 => "NO_ERROR",
            0x1 => "PROTOCOL_ERROR",
            0x2 => "INTERNAL_ERROR",
            0x3 => "FLOW_CONTROL_ERROR",
            0x4 => "SETTINGS_TIMEOUT",
            0x5 => "STREAM_CLOSED",
            0x6 => "FRAME_SIZE_ERROR",
            0x7 => "REFUSED_STREAM",
            0x8 => "CANCEL",
            0x9 => "COMPRESSION_ERROR",
            0xa => "CONNECT_ERROR",
            0xb => "ENHANCE_YOUR_CALM",
            0xc => "INADEQUATE_SECURITY",
            0xd => "HTTP_1_1_REQUIRED",
            _ => return None,
        })
    }
}

impl fmt::Display for H2Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "code {:#x}", self.0),
        }
    }
}

/// What broke a call on its HTTP/2 connection, in words: what the plugin (or the connection)
/// did. Built from the transport's errors by their kind, never from their text; its
/// `Display` holds no text of the transport library's.
///
/// ```
/// use csi_client::{H2Code, TransportFault};
///
/// let reset = TransportFault::StreamReset { code: H2Code(2), after_headers: false };
/// assert_eq!(
///     reset.to_string(),
///     "the plugin reset the call's stream (HTTP/2 INTERNAL_ERROR)"
/// );
/// let closed = TransportFault::Closed { after_headers: true };
/// assert_eq!(
///     closed.to_string(),
///     "the plugin sent the answer's headers and then nothing: the connection closed"
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportFault {
    /// The plugin reset the call's stream (an HTTP/2 `RST_STREAM` frame).
    StreamReset {
        /// The code the plugin gave.
        code: H2Code,
        /// Whether the answer's headers had arrived before.
        after_headers: bool,
    },
    /// The plugin went away: it sent `GOAWAY`, saying it takes no more streams, and this
    /// call's stream was among those it abandoned.
    GoAway {
        /// The code the plugin gave.
        code: H2Code,
        /// Whether the answer's headers had arrived before.
        after_headers: bool,
    },
    /// The connection closed (end of file, reset by the peer, broken pipe) before the answer
    /// was complete.
    Closed {
        /// Whether the answer's headers had arrived before.
        after_headers: bool,
    },
    /// The plugin broke the HTTP/2 protocol, so this side ended the stream or the connection
    /// with this code.
    Protocol {
        /// The code this side sent.
        code: H2Code,
    },
    /// Another failure of the connection, which the transport did not say more about.
    Other,
}

impl TransportFault {
    /// Whether the answer's headers had arrived when the call broke.
    pub const fn after_headers(&self) -> bool {
        match self {
            TransportFault::StreamReset { after_headers, .. }
            | TransportFault::GoAway { after_headers, .. }
            | TransportFault::Closed { after_headers } => *after_headers,
            TransportFault::Protocol { .. } | TransportFault::Other => false,
        }
    }
}

impl fmt::Display for TransportFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers = if self.after_headers() {
            "the plugin sent the answer's headers and then nothing: "
        } else {
            ""
        };
        match self {
            TransportFault::StreamReset {
                code,
                after_headers,
            } => {
                if *after_headers {
                    write!(f, "{headers}it reset the call's stream (HTTP/2 {code})")
                } else {
                    write!(f, "the plugin reset the call's stream (HTTP/2 {code})")
                }
            }
            TransportFault::GoAway {
                code,
                after_headers,
            } => {
                if *after_headers {
                    write!(f, "{headers}it went away (HTTP/2 GOAWAY, {code})")
                } else {
                    write!(f, "the plugin went away (HTTP/2 GOAWAY, {code})")
                }
            }
            TransportFault::Closed { after_headers } => {
                if *after_headers {
                    write!(f, "{headers}the connection closed")
                } else {
                    f.write_str("the plugin closed the connection")
                }
            }
            TransportFault::Protocol { code } => write!(
                f,
                "the plugin broke the HTTP/2 protocol, so the connection was ended ({code})"
            ),
            TransportFault::Other => f.write_str("the connection failed"),
        }
    }
}

/// What went wrong, without the call context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The plugin answered with a non-OK gRPC status. The text shows the plugin's message
    /// [escaped](csi_structs::untrusted); [`Error::message`] gives it exactly.
    #[error("plugin returned {code:?}: {}", escaped(message))]
    Status {
        /// The gRPC code.
        code: Code,
        /// The plugin's `status.message`.
        message: String,
    },
    /// The plugin answered with a `grpc-status` number that gRPC does not define (above 16).
    /// It is treated as `UNKNOWN`, and [`Error::code`] says `Unknown`.
    #[error("plugin returned unknown status code {number}: {}", escaped(message))]
    UnknownStatus {
        /// The number the plugin sent.
        number: u32,
        /// The plugin's `status.message`.
        message: String,
    },
    /// One of our deadlines expired (the plugin may still be working on it). Not the
    /// plugin's `DEADLINE_EXCEEDED`, which is a [`Status`](Self::Status).
    #[error(transparent)]
    Timeout(Elapsed),
    /// The connection broke while the call was in flight; the request may have been processed.
    /// The text says what the plugin did, in words ([`TransportFault`]), never the transport
    /// library's own error text.
    #[error("connection to the plugin was lost mid-call: {fault}")]
    ConnectionLost {
        /// What broke the call, as seen on the HTTP/2 connection.
        fault: TransportFault,
    },
    /// The plugin could not be reached (its socket is missing, refuses connections, or did not
    /// accept within the wait); nothing was sent. The plugin may yet come: the call retried
    /// this as far as its policy allows, and the class is
    /// [`RetryElsewhere`](ErrorClass::RetryElsewhere).
    #[error(transparent)]
    NotConnected(ConnectError),
    /// The endpoint can never be dialled as it is: its path is not a socket, permission is
    /// denied, or the system refused the address ([`ConnectError::fault`] says which). Nothing
    /// was sent, and the call ended at its first attempt, because no wait or retry can change
    /// that. The class is [`Fatal`](ErrorClass::Fatal): do not send the call again until the
    /// endpoint, the file at its path or its permissions are fixed (csi-claims' release
    /// driver retries a fatal step only at its backoff cap, and shows the error meanwhile).
    #[error(transparent)]
    BadEndpoint(ConnectError),
    /// The socket opened but the HTTP/2 connection could not be set up; nothing was sent.
    #[error(transparent)]
    Handshake(HandshakeError),
    /// The request breaks the spec and was not sent; each violation names the field.
    #[error("invalid request: {0}")]
    InvalidRequest(ValidationErrors),
    /// The plugin's answer was unusable: too large, undecodable, not gRPC, or breaking the
    /// spec ([`ResponseError`] says which). Never the plugin's status code: the plugin did
    /// not report a failure. Uncertain on a mutation, retry on a read; never retried by the
    /// client itself.
    #[error("the plugin's answer was unusable: {0}")]
    InvalidResponse(ResponseError),
    /// Another call about the same volume was still in flight through this client (or a
    /// client sharing its [`VolumeTurns`](crate::VolumeTurns)) when this call's budget ran
    /// out; nothing was sent. Retry later: the class is [`Retry`](ErrorClass::Retry).
    #[error(
        "another call about this volume was still in flight when the call's budget of {budget:?} ran out; nothing was sent"
    )]
    VolumeBusy {
        /// The call's total budget, all of it spent waiting.
        budget: std::time::Duration,
    },
}

impl ErrorKind {
    /// The kind of a failed dial: [`BadEndpoint`](Self::BadEndpoint) when no wait can fix
    /// it, otherwise [`NotConnected`](Self::NotConnected).
    pub(crate) fn of_dial(error: ConnectError) -> ErrorKind {
        if error.fault().is_some() {
            ErrorKind::BadEndpoint(error)
        } else {
            ErrorKind::NotConnected(error)
        }
    }

    /// The failure as the policy table sees it.
    pub fn failure(&self) -> Failure {
        match self {
            ErrorKind::Status { code, .. } => Failure::Status(*code),
            ErrorKind::UnknownStatus { .. } => Failure::Status(Code::Unknown),
            ErrorKind::Timeout(e) => match e.scope {
                DeadlineScope::Attempt => Failure::AttemptDeadline,
                DeadlineScope::Call => Failure::CallDeadline,
            },
            ErrorKind::ConnectionLost { .. } => Failure::ConnectionLost,
            ErrorKind::NotConnected(_) | ErrorKind::Handshake(_) => Failure::NotConnected,
            ErrorKind::BadEndpoint(_) => Failure::BadEndpoint,
            ErrorKind::InvalidRequest(_) => Failure::InvalidRequest,
            ErrorKind::InvalidResponse(_) => Failure::InvalidResponse,
            ErrorKind::VolumeBusy { .. } => Failure::VolumeBusy,
        }
    }
}

/// A path field of a node request, as [`CallContext`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PathField {
    /// `staging_target_path` (NodeStageVolume, NodeUnstageVolume, NodePublishVolume,
    /// NodeGetVolumeStats, NodeGetVolumeHealth, NodeExpandVolume).
    StagingTargetPath,
    /// `target_path` (NodePublishVolume, NodeUnpublishVolume).
    TargetPath,
    /// `volume_path` (NodeGetVolumeStats, NodeExpandVolume).
    VolumePath,
    /// `volume_publish_path` (NodeGetVolumeHealth).
    VolumePublishPath,
}

impl PathField {
    /// The field's name in the request.
    pub const fn as_str(self) -> &'static str {
        match self {
            PathField::StagingTargetPath => "staging_target_path",
            PathField::TargetPath => "target_path",
            PathField::VolumePath => "volume_path",
            PathField::VolumePublishPath => "volume_publish_path",
        }
    }
}

impl fmt::Display for PathField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest path a [`CallContext`] keeps: Linux's `PATH_MAX`. A longer one is left out of the
/// context, so an error stays small whatever the request held.
pub const MAX_CONTEXT_PATH_BYTES: usize = 4096;

/// Which RPC a failure belongs to, and the objects it names: the volume, node and snapshot
/// ids, and a node request's paths (staging, target, volume path), so that an error such as
/// NodeStageVolume's ALREADY_EXISTS ("staged at this path with another capability") shows the
/// path.
///
/// ```
/// use csi_client::{CallContext, PathField, Rpc};
///
/// let ctx = CallContext::new(Rpc::NodeStageVolume)
///     .volume("vol-1")
///     .with_path(PathField::StagingTargetPath, "/var/lib/csi/staging/vol-1");
/// assert_eq!(ctx.staging_target_path(), Some("/var/lib/csi/staging/vol-1"));
/// assert_eq!(
///     ctx.to_string(),
///     r#"NodeStageVolume volume vol-1 staging_target_path "/var/lib/csi/staging/vol-1""#
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallContext {
    rpc: Rpc,
    volume_id: Option<ExternalVolumeId>,
    node_id: Option<PluginNodeId>,
    snapshot_id: Option<SnapshotId>,
    /// At most one entry per field, in the order they were named.
    paths: Vec<(PathField, String)>,
}

impl CallContext {
    /// A context for `rpc` naming nothing yet.
    pub const fn new(rpc: Rpc) -> Self {
        CallContext {
            rpc,
            volume_id: None,
            node_id: None,
            snapshot_id: None,
            paths: Vec::new(),
        }
    }

    /// Names the volume (an empty or oversized id is left out; validation reports it).
    #[must_use]
    pub fn volume(mut self, id: &str) -> Self {
        self.volume_id = ExternalVolumeId::new(id).ok();
        self
    }

    /// Names the plugin's node (an empty or oversized id is left out).
    #[must_use]
    pub fn node(mut self, id: &str) -> Self {
        self.node_id = PluginNodeId::new(id).ok();
        self
    }

    /// Names the snapshot (an empty or oversized id is left out).
    #[must_use]
    pub fn snapshot(mut self, id: &str) -> Self {
        self.snapshot_id = SnapshotId::new(id).ok();
        self
    }

    /// Names a path of the request; naming a field again replaces its path. An empty path,
    /// or one longer than [`MAX_CONTEXT_PATH_BYTES`], is left out (validation reports a
    /// missing one).
    #[must_use]
    pub fn with_path(mut self, field: PathField, path: &str) -> Self {
        self.paths.retain(|(f, _)| *f != field);
        if !path.is_empty() && path.len() <= MAX_CONTEXT_PATH_BYTES {
            self.paths.push((field, path.to_owned()));
        }
        self
    }

    /// The path the request gave for `field`, if the context names it.
    pub fn path(&self, field: PathField) -> Option<&str> {
        self.paths
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, p)| p.as_str())
    }

    /// Every path the context names, in the order they were named.
    pub fn paths(&self) -> impl Iterator<Item = (PathField, &str)> {
        self.paths.iter().map(|(f, p)| (*f, p.as_str()))
    }

    /// The request's `staging_target_path`, where it has one.
    pub fn staging_target_path(&self) -> Option<&str> {
        self.path(PathField::StagingTargetPath)
    }

    /// The request's `target_path`, where it has one.
    pub fn target_path(&self) -> Option<&str> {
        self.path(PathField::TargetPath)
    }

    /// The RPC.
    pub const fn rpc(&self) -> Rpc {
        self.rpc
    }

    /// The plugin's volume id, where the request has one.
    pub fn volume_id(&self) -> Option<&ExternalVolumeId> {
        self.volume_id.as_ref()
    }

    /// The plugin's node id, where the request has one.
    pub fn node_id(&self) -> Option<&PluginNodeId> {
        self.node_id.as_ref()
    }

    /// The snapshot id, where the request has one.
    pub fn snapshot_id(&self) -> Option<&SnapshotId> {
        self.snapshot_id.as_ref()
    }
}

impl fmt::Display for CallContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Ids a plugin chose are escaped: a newline in one cannot forge a log line.
        f.write_str(self.rpc.name())?;
        if let Some(v) = &self.volume_id {
            write!(f, " volume {}", escaped(v.as_str()))?;
        }
        if let Some(s) = &self.snapshot_id {
            write!(f, " snapshot {}", escaped(s.as_str()))?;
        }
        if let Some(n) = &self.node_id {
            write!(f, " node {}", escaped(n.as_str()))?;
        }
        // Quoted and escaped: a path may hold spaces or control characters.
        for (field, path) in &self.paths {
            write!(f, " {field} {path:?}")?;
        }
        Ok(())
    }
}

/// A failed CSI call: the RPC and the volume/node/snapshot and paths it named, what went
/// wrong, how many attempts were made, and the [`ErrorClass`] telling the caller what to do.
///
/// Secrets never appear: requests are not stored, and no field holds request data other than
/// ids and a node request's paths.
///
/// ```no_run
/// # async fn f(node: csi_client::NodeClient, req: csi_client::proto::NodeUnpublishVolumeRequest) {
/// use csi_client::ErrorClass;
///
/// match node.node_unpublish_volume(req).await {
///     Ok(()) => {}
///     Err(e) if e.class() == ErrorClass::AlreadyDone => {} // gone already: success
///     Err(e) if e.class().is_uncertain() => { /* retry to completion later */ }
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    context: CallContext,
    kind: ErrorKind,
    class: ErrorClass,
    attempts: u32,
    budget_exhausted: bool,
}

impl Error {
    pub(crate) fn new(
        context: CallContext,
        kind: ErrorKind,
        class: ErrorClass,
        attempts: u32,
    ) -> Self {
        Error {
            inner: Box::new(Inner {
                context,
                kind,
                class,
                attempts,
                budget_exhausted: false,
            }),
        }
    }

    /// The failure of a call of `rpc` whose one dial failed with `error`, nothing sent: for
    /// a caller that dials ahead of the call ([`Connection::dial_once`]) and reports the
    /// dial as the call's failure. Classed as the client classes such a dial.
    ///
    /// [`Connection::dial_once`]: crate::Connection::dial_once
    pub fn not_dialled(rpc: Rpc, error: ConnectError) -> Self {
        let kind = ErrorKind::of_dial(error);
        let class = crate::policy::classify_failure(rpc, kind.failure());
        Error::new(CallContext::new(rpc), kind, class, 1)
    }

    pub(crate) fn with_budget_exhausted(mut self) -> Self {
        self.inner.budget_exhausted = true;
        self
    }

    /// What to do about it.
    pub fn class(&self) -> ErrorClass {
        self.inner.class
    }

    /// The RPC that failed.
    pub fn rpc(&self) -> Rpc {
        self.inner.context.rpc
    }

    /// The RPC and the objects it named.
    pub fn context(&self) -> &CallContext {
        &self.inner.context
    }

    /// The plugin's volume id, where the request had one.
    pub fn volume_id(&self) -> Option<&ExternalVolumeId> {
        self.inner.context.volume_id()
    }

    /// The plugin's node id, where the request had one.
    pub fn node_id(&self) -> Option<&PluginNodeId> {
        self.inner.context.node_id()
    }

    /// The snapshot id, where the request had one.
    pub fn snapshot_id(&self) -> Option<&SnapshotId> {
        self.inner.context.snapshot_id()
    }

    /// The request's `staging_target_path`, where it had one (node calls).
    pub fn staging_target_path(&self) -> Option<&str> {
        self.inner.context.staging_target_path()
    }

    /// The request's `target_path`, where it had one (node publish and unpublish).
    pub fn target_path(&self) -> Option<&str> {
        self.inner.context.target_path()
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.inner.kind
    }

    /// The gRPC code, when the plugin answered with a status (`Unknown` for a number gRPC
    /// does not define). `None` for every failure the plugin did not report: our deadline,
    /// a lost connection, an unusable answer, a request refused before sending.
    pub fn code(&self) -> Option<Code> {
        match &self.inner.kind {
            ErrorKind::Status { code, .. } => Some(*code),
            ErrorKind::UnknownStatus { .. } => Some(Code::Unknown),
            _ => None,
        }
    }

    /// The plugin's status message, when it answered with a status.
    pub fn message(&self) -> Option<&str> {
        match &self.inner.kind {
            ErrorKind::Status { message, .. } | ErrorKind::UnknownStatus { message, .. } => {
                Some(message)
            }
            _ => None,
        }
    }

    /// Attempts made (0 when the request was refused before sending).
    pub fn attempts(&self) -> u32 {
        self.inner.attempts
    }

    /// Whether retries stopped because the client's shared retry budget was empty.
    pub fn retry_budget_exhausted(&self) -> bool {
        self.inner.budget_exhausted
    }

    /// Whether one of our deadlines expired (and which).
    pub fn timeout(&self) -> Option<&Elapsed> {
        match &self.inner.kind {
            ErrorKind::Timeout(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        write!(
            f,
            "{}: {} ({}, {} attempt{}",
            i.context,
            i.kind,
            i.class,
            i.attempts,
            if i.attempts == 1 { "" } else { "s" }
        )?;
        if i.budget_exhausted {
            f.write_str(", retry budget exhausted")?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("Error")
            .field("context", &i.context)
            .field("kind", &i.kind)
            .field("class", &i.class)
            .field("attempts", &i.attempts)
            .field("budget_exhausted", &i.budget_exhausted)
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.inner.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_rpc_ids_code_class_and_attempts() {
        let ctx = CallContext::new(Rpc::NodePublishVolume)
            .volume("vol-1")
            .node("n-9");
        let e = Error::new(
            ctx,
            ErrorKind::Status {
                code: Code::NotFound,
                message: "no such volume".into(),
            },
            ErrorClass::Fatal,
            2,
        );
        let text = e.to_string();
        for part in [
            "NodePublishVolume",
            "vol-1",
            "n-9",
            "NotFound",
            "no such volume",
            "fatal",
            "2 attempts",
        ] {
            assert!(text.contains(part), "{text:?} lacks {part:?}");
        }
        assert_eq!(e.code(), Some(Code::NotFound));
        assert_eq!(e.volume_id().map(|v| v.as_str()), Some("vol-1"));
        assert!(e.timeout().is_none());
    }

    #[test]
    fn display_names_the_paths_of_a_node_call() {
        let ctx = CallContext::new(Rpc::NodePublishVolume)
            .volume("vol-1")
            .with_path(PathField::StagingTargetPath, "/var/lib/csi/staging/vol-1")
            .with_path(PathField::TargetPath, "/var/lib/pods/p 1/vol-1");
        let e = Error::new(
            ctx,
            ErrorKind::Status {
                code: Code::AlreadyExists,
                message: "published at this path with another capability".into(),
            },
            ErrorClass::Fatal,
            1,
        );
        assert_eq!(
            e.to_string(),
            "NodePublishVolume volume vol-1 staging_target_path \"/var/lib/csi/staging/vol-1\" \
             target_path \"/var/lib/pods/p 1/vol-1\": plugin returned AlreadyExists: published at \
             this path with another capability (fatal, 1 attempt)"
        );
        assert_eq!(e.staging_target_path(), Some("/var/lib/csi/staging/vol-1"));
        assert_eq!(e.target_path(), Some("/var/lib/pods/p 1/vol-1"));
        assert_eq!(e.context().path(PathField::VolumePath), None);
    }

    #[test]
    fn paths_are_escaped_replaced_and_bounded() {
        let ctx = CallContext::new(Rpc::NodeUnpublishVolume)
            .with_path(PathField::TargetPath, "/old")
            .with_path(PathField::TargetPath, "/a\nb");
        assert_eq!(ctx.target_path(), Some("/a\nb"));
        assert_eq!(ctx.paths().count(), 1, "naming a field again replaces it");
        // A newline cannot forge a second log line.
        assert_eq!(
            ctx.to_string(),
            r#"NodeUnpublishVolume target_path "/a\nb""#
        );

        let at_limit = format!("/{}", "p".repeat(MAX_CONTEXT_PATH_BYTES - 1));
        let ctx = CallContext::new(Rpc::NodeStageVolume)
            .with_path(PathField::StagingTargetPath, &at_limit);
        assert_eq!(ctx.staging_target_path(), Some(at_limit.as_str()));
        let over = format!("{at_limit}p");
        let ctx = CallContext::new(Rpc::NodeStageVolume)
            .with_path(PathField::StagingTargetPath, &over)
            .with_path(PathField::TargetPath, "");
        assert_eq!(ctx.paths().count(), 0);
        assert_eq!(ctx.to_string(), "NodeStageVolume");
    }

    #[test]
    fn plugin_text_cannot_forge_a_line_in_the_error() {
        let ctx = CallContext::new(Rpc::NodeGetVolumeStats)
            .volume("vol\n2024-01-01 INFO forged")
            .node("n\u{1b}[2J");
        let message = "boom\r\nERROR forged\0";
        let e = Error::new(
            ctx,
            ErrorKind::Status {
                code: Code::Internal,
                message: message.into(),
            },
            ErrorClass::Retry,
            1,
        );
        let text = e.to_string();
        assert!(
            !text.chars().any(csi_structs::untrusted::needs_escape),
            "{text:?}"
        );
        assert!(
            text.contains(r"volume vol\n2024-01-01 INFO forged")
                && text.contains(r"node n\u{1b}[2J")
                && text.contains(r"boom\r\nERROR forged\0"),
            "{text}"
        );
        // The exact message stays available.
        assert_eq!(e.message(), Some(message));
    }

    #[test]
    fn invalid_ids_are_left_out_of_the_context() {
        let ctx = CallContext::new(Rpc::DeleteVolume).volume("");
        assert!(ctx.volume_id().is_none());
        assert_eq!(ctx.to_string(), "DeleteVolume");
    }

    #[test]
    fn error_stays_one_pointer_wide() {
        assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
    }

    #[test]
    fn kinds_map_to_failures() {
        let t = ErrorKind::Timeout(Elapsed::new(DeadlineScope::Attempt, Duration::from_secs(1)));
        assert_eq!(t.failure(), Failure::AttemptDeadline);
        let c = ErrorKind::Timeout(Elapsed::new(DeadlineScope::Call, Duration::from_secs(1)));
        assert_eq!(c.failure(), Failure::CallDeadline);
        assert_eq!(
            ErrorKind::InvalidRequest(ValidationErrors::new()).failure(),
            Failure::InvalidRequest
        );
        let busy = ErrorKind::VolumeBusy {
            budget: Duration::from_secs(1),
        };
        assert_eq!(busy.failure(), Failure::VolumeBusy);
        assert!(busy.to_string().contains("nothing was sent"), "{busy}");
    }

    #[test]
    fn a_dial_is_a_bad_endpoint_only_with_a_fault() {
        let endpoint: crate::Endpoint = "/run/none.sock".parse().unwrap();
        let waiting = ConnectError::timed_out(&endpoint, Duration::from_millis(5));
        assert_eq!(ErrorKind::of_dial(waiting).failure(), Failure::NotConnected);
        let faulty = ConnectError::faulty(
            &endpoint,
            crate::EndpointFault::NotASocket,
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        );
        let kind = ErrorKind::of_dial(faulty);
        assert_eq!(kind.failure(), Failure::BadEndpoint);
        let text = kind.to_string();
        assert!(
            text.contains("unix:///run/none.sock") && text.contains("not a socket"),
            "{text}"
        );
    }
}
