//! A hostile agent `d` that the agent under test calls: it answers `ControllerListVolumes`
//! (the only call it expects) with what a correct agent never sends, chosen by the request's
//! `starting_token` (`answer-<n>`), so the choice survives a relay.
//!
//! Both ways `b` can reach it are exercised: relaying a remote caller's call (`target_node =
//! d`), and serving its own local caller, which picks `d` as the only controller of plugin
//! [`REMOTE_PLUGIN`]. Properties: no panic, the call ends by its deadline, the caller gets an
//! error (never a broken stream, never success from a broken answer), no plugin of `b` or `c`
//! is reached.

use std::fmt;
use std::net::SocketAddr;

use csi_rpc_shim::wire::pb;
use http_body_util::BodyExt as _;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use tokio::net::TcpListener;

use super::h2::{self, Body};
use crate::rng::Rng;

/// The hostile agent's node id.
pub(crate) const HOSTILE: &str = "d";
/// A plugin whose only controller is on the hostile agent.
pub(crate) const REMOTE_PLUGIN: &str = "remote";

/// What the hostile agent answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// An error whose `grpc-status-details-bin` is not base64.
    DetailsNotBase64,
    /// An error whose details decode to no known kind.
    DetailsUnknownKind,
    /// An error whose details are not an `ErrorDetail` at all.
    DetailsGarbage,
    /// A well-formed error without details.
    PlainError,
    /// A `grpc-status` that is not a number.
    StatusNotNumeric,
    /// HTTP 200 with no `grpc-status` anywhere.
    NoStatus,
    /// Trailers without `grpc-status`.
    TrailersWithoutStatus,
    /// An HTTP error status.
    Http(u16),
    /// `OK` with bytes that do not decode.
    OkUndecodable,
    /// `OK` with a broken frame (its length says more than follows).
    OkShortFrame,
    /// `OK` and no message.
    OkEmpty,
    /// `OK` with a message that breaks the protocol's rules (an empty listed volume id).
    OkInvalidMessage,
    /// `OK` with a valid message over the protocol's size limit
    /// ([`MAX_MESSAGE_BYTES`](csi_rpc_shim::wire::MAX_MESSAGE_BYTES)).
    OkOversized,
    /// An error with a 64 KiB `grpc-message`.
    HugeMessage,
    /// A non-gRPC content type.
    WrongContentType,
    /// Headers, then nothing ever.
    Silence,
    /// The stream is reset.
    Reset,
}

const REPLIES: &[Reply] = &[
    Reply::DetailsNotBase64,
    Reply::DetailsUnknownKind,
    Reply::DetailsGarbage,
    Reply::PlainError,
    Reply::StatusNotNumeric,
    Reply::NoStatus,
    Reply::TrailersWithoutStatus,
    Reply::Http(500),
    Reply::Http(404),
    Reply::Http(503),
    Reply::Http(429),
    Reply::OkUndecodable,
    Reply::OkShortFrame,
    Reply::OkEmpty,
    Reply::OkInvalidMessage,
    Reply::OkOversized,
    Reply::HugeMessage,
    Reply::WrongContentType,
    Reply::Silence,
    Reply::Reset,
];

impl Reply {
    pub(crate) fn generate(rng: &mut Rng) -> Reply {
        rng.pick(REPLIES)
    }

    /// The `starting_token` that asks the hostile agent for this reply.
    pub(crate) fn token(self) -> String {
        let i = REPLIES.iter().position(|r| *r == self).unwrap_or(0);
        format!("answer-{i}")
    }

    fn from_token(token: &str) -> Option<Reply> {
        let i: usize = token.strip_prefix("answer-")?.parse().ok()?;
        REPLIES.get(i).copied()
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

fn status_trailers(code: &str, details: Option<&str>) -> http::HeaderMap {
    let mut t = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(code) {
        t.insert("grpc-status", v);
    }
    t.insert("grpc-message", http::HeaderValue::from_static("hostile"));
    if let Some(d) = details.and_then(|d| http::HeaderValue::from_str(d).ok()) {
        t.insert("grpc-status-details-bin", d);
    }
    t
}

/// Base64 (standard alphabet, padded) of `bytes`, for a details header.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn respond(reply: Reply) -> Result<http::Response<Body>, String> {
    let grpc = |status: u16, ct: &str, body: Body| {
        http::Response::builder()
            .status(status)
            .header("content-type", ct)
            .body(body)
            .map_err(|e| e.to_string())
    };
    let ok_frame = |message: &[u8]| Some(Bytes::from(h2::frame(message)));
    let error = |details: Option<String>| {
        Body::with_trailers(None, Some(status_trailers("14", details.as_deref())))
    };
    match reply {
        Reply::DetailsNotBase64 => grpc(
            200,
            "application/grpc",
            error(Some("!!not base64!!".into())),
        ),
        Reply::DetailsUnknownKind => {
            let d = pb::ErrorDetail {
                class: 2,
                kind: 99,
                ..Default::default()
            };
            grpc(
                200,
                "application/grpc",
                error(Some(base64(&d.encode_to_vec()))),
            )
        }
        Reply::DetailsGarbage => grpc(200, "application/grpc", error(Some(base64(&[0xff; 9])))),
        Reply::PlainError => grpc(200, "application/grpc", error(None)),
        Reply::StatusNotNumeric => grpc(
            200,
            "application/grpc",
            Body::with_trailers(None, Some(status_trailers("abc", None))),
        ),
        Reply::NoStatus => grpc(200, "application/grpc", Body::with_trailers(None, None)),
        Reply::TrailersWithoutStatus => {
            let mut t = http::HeaderMap::new();
            t.insert("x-other", http::HeaderValue::from_static("1"));
            grpc(200, "application/grpc", Body::with_trailers(None, Some(t)))
        }
        Reply::Http(code) => grpc(
            code,
            "text/html",
            Body::with_trailers(Some(Bytes::from_static(b"<html>")), None),
        ),
        Reply::OkUndecodable => grpc(
            200,
            "application/grpc",
            Body::with_trailers(ok_frame(&[0xff; 11]), Some(status_trailers("0", None))),
        ),
        Reply::OkShortFrame => {
            let mut f = h2::frame(b"\x12\x01x");
            f[4] = 50;
            grpc(
                200,
                "application/grpc",
                Body::with_trailers(Some(Bytes::from(f)), Some(status_trailers("0", None))),
            )
        }
        Reply::OkEmpty => grpc(
            200,
            "application/grpc",
            Body::with_trailers(None, Some(status_trailers("0", None))),
        ),
        Reply::OkInvalidMessage => {
            let page = pb::ControllerListVolumesResponse {
                entries: vec![pb::ListedVolume {
                    external_volume_id: String::new(),
                    capacity_bytes: -5,
                    published_plugin_node_ids: vec![String::new()],
                }],
                next_token: String::new(),
            };
            grpc(
                200,
                "application/grpc",
                Body::with_trailers(
                    ok_frame(&page.encode_to_vec()),
                    Some(status_trailers("0", None)),
                ),
            )
        }
        Reply::OkOversized => {
            let entry = |i: usize| pb::ListedVolume {
                external_volume_id: format!("vol-{i:0>100}"),
                capacity_bytes: 1,
                published_plugin_node_ids: Vec::new(),
            };
            let n = csi_rpc_shim::wire::MAX_MESSAGE_BYTES / 100 + 1;
            let page = pb::ControllerListVolumesResponse {
                entries: (0..n).map(entry).collect(),
                next_token: String::new(),
            };
            grpc(
                200,
                "application/grpc",
                Body::with_trailers(
                    ok_frame(&page.encode_to_vec()),
                    Some(status_trailers("0", None)),
                ),
            )
        }
        Reply::HugeMessage => {
            let mut t = status_trailers("14", None);
            if let Ok(v) = http::HeaderValue::from_str(&"m".repeat(64 * 1024)) {
                t.insert("grpc-message", v);
            }
            grpc(200, "application/grpc", Body::with_trailers(None, Some(t)))
        }
        Reply::WrongContentType => grpc(
            200,
            "application/json",
            Body::with_trailers(
                Some(Bytes::from_static(b"{}")),
                Some(status_trailers("0", None)),
            ),
        ),
        Reply::Silence => grpc(200, "application/grpc", Body::stall(None)),
        Reply::Reset => Err("reset".into()),
    }
}

async fn handle(req: http::Request<Incoming>) -> Result<http::Response<Body>, String> {
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let message = body.get(5..).unwrap_or_default();
    let reply = pb::ControllerListVolumesRequest::decode(message)
        .ok()
        .and_then(|r| Reply::from_token(&r.starting_token))
        .unwrap_or(Reply::PlainError);
    respond(reply)
}

/// Starts the hostile agent; it serves until the runtime stops.
pub(crate) async fn start() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service_fn(handle))
                    .await;
            });
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn every_reply_round_trips_through_its_token() {
        for r in REPLIES {
            assert_eq!(Reply::from_token(&r.token()), Some(*r));
        }
    }
}
