//! A minimal HTTP/1.1 JSON client for the control API (one connection per request).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::api::ApiError;

/// The largest answer accepted (bytes).
pub const MAX_ANSWER_BYTES: usize = 8 << 20;

/// Why a control API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection to the agent.
    #[error("cannot reach the agent at {addr}: {source}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("HTTP exchange with the agent at {addr} failed: {detail}")]
    Http {
        /// The address.
        addr: SocketAddr,
        /// What failed.
        detail: String,
    },
    /// No answer in time. An operation the agent accepted is not cancelled by the client
    /// giving up: it runs to its end there.
    #[error(
        "the agent at {addr} did not answer within {limit:?}; an operation it accepted runs on \
         to its end there (`csi-agent volume status` shows it)"
    )]
    Timeout {
        /// The address.
        addr: SocketAddr,
        /// The limit.
        limit: Duration,
    },
    /// The agent answered with an error.
    #[error("agent: {}{}", .error.error, .error.class.as_ref().map(|c| format!(" (class {c})")).unwrap_or_default())]
    Api {
        /// The HTTP status.
        status: u16,
        /// The error.
        error: ApiError,
    },
    /// The answer was not the expected JSON.
    #[error("the agent's answer to {path} is not valid: {detail}")]
    BadAnswer {
        /// The path asked.
        path: String,
        /// What is wrong.
        detail: String,
    },
}

/// Sends one request and decodes the JSON answer.
///
/// # Errors
///
/// A [`ClientError`].
pub async fn call<B: Serialize, T: DeserializeOwned>(
    addr: SocketAddr,
    token: Option<&str>,
    method: hyper::Method,
    path: &str,
    body: Option<&B>,
    limit: Duration,
) -> Result<T, ClientError> {
    tokio::time::timeout(limit, call_inner(addr, token, method, path, body))
        .await
        .map_err(|_| ClientError::Timeout { addr, limit })?
}

async fn call_inner<B: Serialize, T: DeserializeOwned>(
    addr: SocketAddr,
    token: Option<&str>,
    method: hyper::Method,
    path: &str,
    body: Option<&B>,
) -> Result<T, ClientError> {
    let http = |detail: String| ClientError::Http { addr, detail };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| ClientError::Connect { addr, source })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| http(e.to_string()))?;
    let driver = tokio::spawn(conn);
    let bytes = match body {
        Some(b) => serde_json::to_vec(b).map_err(|e| http(e.to_string()))?,
        None => Vec::new(),
    };
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let request = request
        .body(Full::new(Bytes::from(bytes)))
        .map_err(|e| http(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| http(e.to_string()))?;
    let status = response.status();
    let collected = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| http(format!("reading the answer: {e}")))?
        .to_bytes();
    driver.abort();
    if !status.is_success() {
        let error = serde_json::from_slice::<ApiError>(&collected).unwrap_or_else(|_| ApiError {
            kind: "http".into(),
            error: format!("HTTP {status}"),
            class: None,
        });
        return Err(ClientError::Api {
            status: status.as_u16(),
            error,
        });
    }
    serde_json::from_slice(&collected).map_err(|e| ClientError::BadAnswer {
        path: path.to_owned(),
        detail: e.to_string(),
    })
}
