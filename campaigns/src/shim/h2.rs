//! A raw HTTP/2 client for the agent protocol: it frames gRPC messages itself, so it can send
//! what a correct client never would (bad frames, headers and then nothing), and it never
//! enforces a deadline of its own, so only the agent can end a call.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::Frame;
use http_body_util::BodyExt as _;
use hyper::body::Bytes;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

/// A message body (a request's or a hostile agent's answer): some bytes, trailers, and then
/// the end of the stream, or silence (the stream stays open: a slow peer).
#[derive(Debug, Default)]
pub(crate) struct Body {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
    stall: bool,
}

impl Body {
    /// `data` (if any), then the end of the stream.
    pub(crate) fn once(data: Option<Bytes>) -> Self {
        Self {
            data,
            ..Self::default()
        }
    }

    /// `data` (if any), then `trailers` (if any), then the end of the stream.
    pub(crate) fn with_trailers(data: Option<Bytes>, trailers: Option<http::HeaderMap>) -> Self {
        Self {
            data,
            trailers,
            stall: false,
        }
    }

    /// `data` (if any), then nothing ever again.
    pub(crate) fn stall(data: Option<Bytes>) -> Self {
        Self {
            data,
            trailers: None,
            stall: true,
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(d) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        if let Some(t) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if this.stall {
            // Never woken: nothing more is ever sent on this stream.
            Poll::Pending
        } else {
            Poll::Ready(None)
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.stall && self.data.is_none() && self.trailers.is_none()
    }
}

/// One gRPC message frame: not compressed, the length, the bytes.
pub(crate) fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(0);
    out.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(message);
    out
}

/// How a call ended, as the client saw it. `Debug` shows the status code and message, never
/// the metadata.
pub(crate) enum Answer {
    /// A gRPC status (from the trailers, or from the headers of a trailers-only answer).
    Status(tonic::Status),
    /// An HTTP answer without a gRPC status.
    Http(http::StatusCode),
    /// The stream or the connection failed (reset, closed, refused by the client library).
    Broken(String),
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Status(s) => write!(f, "status {:?}: {:?}", s.code(), s.message()),
            Answer::Http(code) => write!(f, "HTTP {code} without a gRPC status"),
            Answer::Broken(why) => write!(f, "broken: {why}"),
        }
    }
}

impl Answer {
    /// The gRPC status, when there is one.
    pub(crate) fn status(&self) -> Option<&tonic::Status> {
        match self {
            Answer::Status(s) => Some(s),
            _ => None,
        }
    }

    /// Whether the call was refused in any way (anything but an OK status).
    pub(crate) fn is_refusal(&self) -> bool {
        !matches!(self, Answer::Status(s) if s.code() == tonic::Code::Ok)
    }
}

/// An HTTP/2 connection to an agent.
pub(crate) struct Conn {
    send: http2::SendRequest<Body>,
    authority: String,
}

impl Conn {
    /// Connects to `addr` (HTTP/2 with prior knowledge, as gRPC speaks it).
    pub(crate) async fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (send, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(tcp))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(async move {
            // The connection ends when the agent closes it or the campaign drops the sender.
            let _ = connection.await;
        });
        Ok(Conn {
            send,
            authority: addr.to_string(),
        })
    }

    /// Whether the connection can still take requests.
    pub(crate) fn is_open(&self) -> bool {
        !self.send.is_closed()
    }

    /// A request to `path` with `headers`, ready for a body.
    pub(crate) fn request(
        &self,
        path: &str,
        headers: http::HeaderMap,
        body: Body,
    ) -> Option<http::Request<Body>> {
        let uri = format!("http://{}{}", self.authority, path);
        let mut req = http::Request::builder()
            .method(http::Method::POST)
            .uri(uri)
            .version(http::Version::HTTP_2)
            .body(body)
            .ok()?;
        *req.headers_mut() = headers;
        Some(req)
    }

    /// Sends `req` and reads the whole answer, giving up after `guard` (`None` then: the call
    /// did not end).
    pub(crate) async fn exchange(
        &mut self,
        req: http::Request<Body>,
        guard: Duration,
    ) -> Option<Answer> {
        let send = &mut self.send;
        let work = async move {
            if let Err(e) = send.ready().await {
                return Answer::Broken(format!("connection not ready: {e}"));
            }
            let response = match send.send_request(req).await {
                Ok(r) => r,
                Err(e) => return Answer::Broken(format!("request failed: {e}")),
            };
            let (parts, body) = response.into_parts();
            let trailers_only = tonic::Status::from_header_map(&parts.headers);
            match body.collect().await {
                Ok(collected) => match collected
                    .trailers()
                    .and_then(tonic::Status::from_header_map)
                    .or(trailers_only)
                {
                    Some(status) => Answer::Status(status),
                    None => Answer::Http(parts.status),
                },
                Err(e) => match trailers_only {
                    Some(status) => Answer::Status(status),
                    None => Answer::Broken(format!("body failed: {e}")),
                },
            }
        };
        tokio::time::timeout(guard, work).await.ok()
    }
}

/// The standard request headers of a gRPC call to `path`'s service.
pub(crate) fn grpc_headers(content_type: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        h.insert(http::header::CONTENT_TYPE, v);
    }
    h.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    h
}
