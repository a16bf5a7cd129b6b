//! Sending one call to another agent, and reading what came back.

use std::time::SystemTime;

use csi_structs::{NodeId, PluginId};
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, BinaryMetadataValue};
use tonic::transport::Channel;

use crate::auth::{HOPS_HEADER, NODE_HEADER, TOKEN_HEADER};
use crate::backend::GrpcCode;
use crate::deadline::{self, DEADLINE_HEADER};
use crate::details::Checked;
use crate::error::{ProtocolProblem, ShimError};
use crate::ops::Op;
use crate::wire::MAX_MESSAGE_BYTES;

/// The credentials a call carries: this agent's own, or the original caller's when relaying.
/// `Debug` hides the token.
#[derive(Clone)]
pub(crate) struct Presented {
    pub(crate) node: String,
    pub(crate) token: String,
}

impl std::fmt::Debug for Presented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presented")
            .field("node", &self.node)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl Presented {
    /// The credentials in a request's metadata; `None` when either is missing or unreadable.
    pub(crate) fn from_metadata(md: &tonic::metadata::MetadataMap) -> Option<Self> {
        let node = md.get_bin(NODE_HEADER)?.to_bytes().ok()?;
        let node = String::from_utf8(node.to_vec()).ok()?;
        let token = md.get(TOKEN_HEADER)?.to_str().ok()?.to_owned();
        Some(Self { node, token })
    }
}

/// Sends one unary call of `O` on `channel`, with the credentials, the hop count, the time
/// left until `deadline` as `grpc-timeout` (the channel also enforces it) and `stamp`, the
/// same deadline in wall-clock time, as [`DEADLINE_HEADER`].
pub(crate) async fn unary<O: Op>(
    channel: Channel,
    wire: O::Wire,
    creds: &Presented,
    hops: u8,
    deadline: Instant,
    stamp: Option<SystemTime>,
) -> Result<O::WireOut, tonic::Status> {
    let mut request = tonic::Request::new(wire);
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err(tonic::Status::deadline_exceeded(
            "deadline passed before sending",
        ));
    }
    request.set_timeout(remaining);
    let md = request.metadata_mut();
    md.insert_bin(
        NODE_HEADER,
        BinaryMetadataValue::from_bytes(creds.node.as_bytes()),
    );
    // A token that is not valid metadata cannot authenticate anyway; send none and let the
    // peer refuse the call, rather than failing differently here.
    if let Ok(token) = AsciiMetadataValue::try_from(creds.token.as_str()) {
        md.insert(TOKEN_HEADER, token);
    }
    md.insert(HOPS_HEADER, AsciiMetadataValue::from(u32::from(hops)));
    if let Some(value) = stamp.and_then(deadline::to_header) {
        md.insert(DEADLINE_HEADER, value);
    }

    // An answer is capped like a request: another agent cannot make this one buffer more.
    let mut grpc = tonic::client::Grpc::new(Checked(channel))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::from_error(Box::new(e)))?;
    let codec = tonic_prost::ProstCodec::<O::Wire, O::WireOut>::default();
    let path = http::uri::PathAndQuery::from_static(O::RPC.path());
    grpc.unary(request, path, codec)
        .await
        .map(tonic::Response::into_inner)
}

/// Turns a failed call into our error. `sent_to` is the agent we dialled, `target` the node
/// the call was for (the same unless relayed).
pub(crate) fn classify(
    rpc: crate::AgentRpc,
    plugin: &PluginId,
    sent_to: &NodeId,
    target: &NodeId,
    status: &tonic::Status,
    deadline: Instant,
) -> ShimError {
    if let Some(e) = ShimError::from_detail(rpc, plugin, sent_to, status) {
        return e;
    }
    if Instant::now() >= deadline
        || matches!(
            status.code(),
            tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
        )
    {
        return ShimError::DeadlineExceeded {
            rpc,
            node: Some(target.clone()),
        };
    }
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown if never_connected(status) => {
            ShimError::PeerUnreachable {
                rpc,
                node: sent_to.clone(),
            }
        }
        tonic::Code::Unavailable => ShimError::PeerLost {
            rpc,
            node: sent_to.clone(),
        },
        // Not an answer: our own transport broke under the call (for example the peer closed
        // the connection, or refused our TLS certificate after the handshake).
        tonic::Code::Unknown if broke_locally(status) => ShimError::PeerLost {
            rpc,
            node: sent_to.clone(),
        },
        code => ShimError::Protocol {
            rpc,
            node: sent_to.clone(),
            problem: ProtocolProblem::MissingDetail {
                code: GrpcCode::from_i32(code as i32),
            },
        },
    }
}

/// Whether the failure happened while connecting, so nothing was sent: the transport's
/// [`tonic::ConnectError`] (the TCP connect or the TLS handshake failed), or an I/O error of a
/// connect-time kind, somewhere in the source chain (typed, never the text).
fn never_connected(status: &tonic::Status) -> bool {
    use std::io::ErrorKind as K;
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::AddrNotAvailable
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::NotConnected
            );
        }
        source = err.source();
    }
    false
}

/// Whether tonic made this status from this side's transport error (it keeps the error as the
/// source), rather than receiving it from the peer: a `tonic::transport::Error` in the chain.
fn broke_locally(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::transport::Error>() {
            return true;
        }
        source = err.source();
    }
    false
}
