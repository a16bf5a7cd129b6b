//! The HTTP server of `serve`: the control API (see [`crate::ops::api`]), the peer plugin
//! list and `/metrics`, over HTTP/1.1 on a loopback address.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;

use super::agent::{Agent, AgentError, SnapshotsOf};
use crate::ops::api;

/// The largest request body accepted (bytes).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Who may call what. `Debug` prints neither token.
pub struct Access {
    /// The operator token (`<data_dir>/control.token`).
    pub control_token: String,
    /// The cluster token, for peers (none: the peer endpoint is closed).
    pub cluster_token: Option<String>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("control_token", &"<redacted>")
            .field(
                "cluster_token",
                &self.cluster_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

type Answer = Response<Full<Bytes>>;

fn json<T: Serialize>(status: u16, value: &T) -> Answer {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn error(status: u16, kind: &str, message: String, class: Option<&str>) -> Answer {
    json(
        status,
        &api::ApiError {
            kind: kind.to_owned(),
            error: bounded(message),
            class: class.map(str::to_owned),
        },
    )
}

/// `message`, cut to at most [`api::MAX_ERROR_BYTES`] on a character boundary and saying how
/// long it was. A message may quote what the caller sent (a path, an id), which has no limit.
pub fn bounded(mut message: String) -> String {
    if message.len() <= api::MAX_ERROR_BYTES {
        return message;
    }
    let suffix = format!("… ({} bytes in all)", message.len());
    let mut cut = api::MAX_ERROR_BYTES - suffix.len();
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    message.truncate(cut);
    message.push_str(&suffix);
    message
}

fn agent_error(e: &AgentError) -> Answer {
    let (status, kind, class) = super::agent::parts(e);
    error(status, kind, e.to_string(), class.map(|c| c.as_str()))
}

fn reply<T: Serialize>(r: Result<T, AgentError>) -> Answer {
    match r {
        Ok(v) => json(200, &v),
        Err(e) => agent_error(&e),
    }
}

/// Whether the request presents `expected` as its bearer token, compared in constant time.
fn token_matches(head: &Parts, expected: &str) -> bool {
    let presented = head
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    csi_rpc_shim::auth::constant_time_eq(presented.as_bytes(), expected.as_bytes())
}

/// The request's body, read once: by the route that takes one, else drained after the answer
/// is made (see [`route`]).
type Unread = Option<Incoming>;

async fn body<T: DeserializeOwned>(unread: &mut Unread) -> Result<T, Answer> {
    let Some(incoming) = unread.take() else {
        return Err(error(
            500,
            "agent",
            "the request body was read twice".into(),
            None,
        ));
    };
    let bytes = Limited::new(incoming, MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|e| {
            error(
                400,
                "bad_request",
                format!("cannot read the body: {e}"),
                None,
            )
        })?
        .to_bytes();
    parse_body(&bytes).map_err(|message| error(400, "bad_request", message, None))
}

/// Decodes a request body; the error names the field whose value is wrong (`field
/// \`capacity_bytes\`: invalid type: ...`), or says where the JSON itself breaks.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || inner.is_syntax() || inner.is_eof() {
            format!("invalid JSON body: {inner}")
        } else {
            format!("invalid JSON body: field `{path}`: {inner}")
        }
    })?;
    // Nothing may follow the object.
    json.end().map_err(|e| format!("invalid JSON body: {e}"))?;
    Ok(value)
}

/// Answers `req`. A body no route read (the request was refused first: a broken path, a
/// wrong token, no such route) is read and dropped before the answer goes: a connection
/// closed with unread bytes is reset, and the reset can take the answer with it, so the
/// client would see its write fail instead of being told why. At most [`MAX_BODY_BYTES`] are
/// read so, for at most [`HEADER_TIMEOUT`].
async fn route(agent: Arc<Agent>, access: Arc<Access>, req: Request<Incoming>) -> Answer {
    let (head, incoming) = req.into_parts();
    let mut unread = Some(incoming);
    let answer = answer(&agent, &access, &head, &mut unread).await;
    if let Some(incoming) = unread {
        // A body over the limit, or one that stops coming, is left: the connection closes.
        let _ = tokio::time::timeout(HEADER_TIMEOUT, drain(incoming)).await;
    }
    answer
}

/// Reads and drops a body, a frame at a time, until its end or [`MAX_BODY_BYTES`].
async fn drain(mut incoming: Incoming) {
    let mut left = MAX_BODY_BYTES;
    while let Some(Ok(frame)) = incoming.frame().await {
        if let Ok(data) = frame.into_data() {
            match left.checked_sub(data.len()) {
                Some(rest) => left = rest,
                None => return,
            }
        }
    }
}

async fn answer(agent: &Arc<Agent>, access: &Access, head: &Parts, unread: &mut Unread) -> Answer {
    let method = head.method.clone();
    let path = head.uri.path().to_owned();
    let Some(decoded) = path
        .trim_matches('/')
        .split('/')
        .map(api::decode_segment)
        .collect::<Option<Vec<String>>>()
    else {
        return error(
            400,
            "bad_request",
            format!("path {path:?} has a broken percent escape"),
            None,
        );
    };
    let parts: Vec<&str> = decoded.iter().map(String::as_str).collect();
    if parts.first() == Some(&"metrics") && method == Method::GET {
        return Response::builder()
            .header(hyper::header::CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(agent.metrics_text())))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
    }
    if parts.first() == Some(&"peer") {
        let allowed = access
            .cluster_token
            .as_deref()
            .is_some_and(|t| token_matches(head, t));
        if !allowed {
            return error(
                401,
                "unauthorized",
                "peer token missing or wrong".into(),
                None,
            );
        }
        if parts == ["peer", "v1", "plugins"] && method == Method::GET {
            return json(
                200,
                &api::PeerPlugins {
                    node: agent.me.to_string(),
                    plugins: agent.plugins.peer_view(),
                },
            );
        }
        return error(404, "not_found", format!("no route {method} {path}"), None);
    }
    if !token_matches(head, &access.control_token) {
        return error(
            401,
            "unauthorized",
            "control token missing or wrong (see <data_dir>/control.token)".into(),
            None,
        );
    }
    match (method.clone(), parts.as_slice()) {
        (Method::GET, ["v1", "status"]) => json(200, &agent.status()),
        (Method::GET, ["v1", "plugins"]) => json(200, &agent.plugin_views()),
        (Method::GET, ["v1", "plugins", id]) => {
            match agent.plugin_views().into_iter().find(|p| p.id == *id) {
                Some(p) => json(200, &p),
                None => error(404, "not_found", format!("no plugin {id:?}"), None),
            }
        }
        (Method::GET, ["v1", "volumes"]) => json(200, &agent.volumes()),
        (Method::GET, ["v1", "volumes", id]) => reply(agent.volume(id)),
        (Method::POST, ["v1", "volumes"]) => match body(unread).await {
            Ok(r) => reply(agent.register_volume(r).await),
            Err(a) => a,
        },
        (Method::POST, ["v1", "volumes", "create"]) => match body(unread).await {
            Ok(r) => reply(agent.create(r).await),
            Err(a) => a,
        },
        (Method::POST, ["v1", "volumes", id, "claim"]) => {
            let id = (*id).to_owned();
            match body(unread).await {
                Ok(r) => reply(agent.claim(&id, r).await),
                Err(a) => a,
            }
        }
        (Method::POST, ["v1", "volumes", id, "release"]) => {
            let id = (*id).to_owned();
            match body(unread).await {
                Ok(r) => reply(agent.release(&id, r).await),
                Err(a) => a,
            }
        }
        (Method::POST, ["v1", "volumes", id, "expand"]) => {
            let id = (*id).to_owned();
            match body(unread).await {
                Ok(r) => reply(agent.expand(&id, r).await),
                Err(a) => a,
            }
        }
        (Method::POST, ["v1", "volumes", id, "detach"]) => {
            let id = (*id).to_owned();
            match body(unread).await {
                Ok(r) => reply(agent.detach(&id, r).await),
                Err(a) => a,
            }
        }
        (Method::POST, ["v1", "volumes", id, "deregister"]) => {
            let id = (*id).to_owned();
            match body(unread).await {
                Ok(r) => reply(agent.deregister_volume(&id, r).await),
                Err(a) => a,
            }
        }
        (Method::DELETE, ["v1", "volumes", id]) => reply(agent.delete(id).await),
        (Method::GET, ["v1", "plugins", id, "volumes"]) => reply(agent.list_external(id).await),
        (Method::POST, ["v1", "volumes", id, "snapshots"]) => {
            let id = (*id).to_owned();
            match body(unread).await {
                Ok(r) => reply(agent.create_snapshot(&id, r).await),
                Err(a) => a,
            }
        }
        (Method::GET, ["v1", "volumes", id, "snapshots"]) => {
            reply(agent.list_snapshots(SnapshotsOf::Volume(id)).await)
        }
        (Method::GET, ["v1", "plugins", id, "snapshots"]) => {
            reply(agent.list_snapshots(SnapshotsOf::Plugin(id)).await)
        }
        (Method::DELETE, ["v1", "volumes", id, "snapshots", snapshot]) => reply(
            agent
                .delete_snapshot(SnapshotsOf::Volume(id), snapshot)
                .await,
        ),
        (Method::DELETE, ["v1", "plugins", id, "snapshots", snapshot]) => reply(
            agent
                .delete_snapshot(SnapshotsOf::Plugin(id), snapshot)
                .await,
        ),
        _ => error(404, "not_found", format!("no route {method} {path}"), None),
    }
}

/// Serves until `stop` is set, then lets every open connection finish the request it is
/// serving (graceful shutdown) and returns once they all closed. A client gets
/// [`HEADER_TIMEOUT`] to send its request headers.
pub async fn serve(
    listener: TcpListener,
    agent: Arc<Agent>,
    access: Arc<Access>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, _) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "control API accept failed");
                continue;
            }
        };
        let agent = Arc::clone(&agent);
        let access = Arc::clone(&access);
        let mut stop = stop.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let agent = Arc::clone(&agent);
                let access = Arc::clone(&access);
                async move { Ok::<_, Infallible>(route(agent, access, req).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                r = connection.as_mut() => r,
                _ = stop.changed() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "control API connection ended with an error");
            }
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// How long a client has to send its request headers.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
