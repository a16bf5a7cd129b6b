//! The hostile plugin: a raw HTTP/2 server on a unix socket that answers every request as its
//! script says, including what no gRPC server would send (an HTTP error page, a message over
//! the decode limit, trailers without a status, a stream reset in the middle of a message,
//! headers and then silence), or a socket that accepts and never reads, or closes at once.

use std::collections::VecDeque;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::Frame;
use http_body_util::BodyExt as _;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

/// How the body of an answer ends once its frames are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The end of the stream.
    End,
    /// Nothing more, ever: the stream stays open.
    Stall,
    /// The stream is reset (RST_STREAM).
    Reset,
}

/// One answer: the HTTP status, the headers, the body's frames (data and trailers) and how
/// the body ends. `None` resets the stream before any header.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(&'static str, http::HeaderValue)>,
    pub(crate) frames: Vec<Frame<Bytes>>,
    pub(crate) finish: Finish,
}

impl Answer {
    /// A gRPC answer: HTTP 200, `application/grpc`, these frames, then the end of the stream.
    pub(crate) fn grpc(frames: Vec<Frame<Bytes>>) -> Answer {
        Answer {
            status: 200,
            headers: vec![(
                "content-type",
                http::HeaderValue::from_static("application/grpc"),
            )],
            frames,
            finish: Finish::End,
        }
    }
}

/// One gRPC message frame: the compression flag, the length, the bytes.
pub(crate) fn frame(flag: u8, message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(flag);
    out.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// Trailers with `grpc-status: code` (any text) and, when given, more headers.
pub(crate) fn trailers(code: &str, more: &[(&'static str, http::HeaderValue)]) -> Frame<Bytes> {
    let mut t = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(code) {
        t.insert("grpc-status", v);
    }
    for (name, value) in more {
        t.insert(*name, value.clone());
    }
    Frame::trailers(t)
}

/// What the plugin does with a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Socket {
    /// Serves HTTP/2, answering each request by the script.
    Serve,
    /// Accepts and never reads a byte.
    NeverRead,
    /// Accepts and closes at once.
    Close,
}

/// The script: the answer to a request, given its path and its body (the gRPC frame).
pub(crate) type Script = Arc<dyn Fn(&str, &[u8]) -> Option<Answer> + Send + Sync>;

/// A response body of scripted frames.
struct Scripted {
    frames: VecDeque<Frame<Bytes>>,
    finish: Finish,
}

impl http_body::Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if let Some(f) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        match this.finish {
            Finish::End => Poll::Ready(None),
            // Never woken: nothing more is ever sent on this stream.
            Finish::Stall => Poll::Pending,
            Finish::Reset => Poll::Ready(Some(Err(std::io::Error::other("reset by the script")))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.finish == Finish::End
    }
}

async fn handle(
    script: Script,
    req: http::Request<Incoming>,
) -> Result<http::Response<Scripted>, String> {
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let Some(answer) = script(&path, &body) else {
        // An error from the service resets the stream before any header.
        return Err("reset before headers".into());
    };
    let mut response = http::Response::builder()
        .status(answer.status)
        .body(Scripted {
            frames: answer.frames.into(),
            finish: answer.finish,
        })
        .map_err(|e| e.to_string())?;
    for (name, value) in answer.headers {
        response.headers_mut().append(name, value);
    }
    Ok(response)
}

/// The plugin of one case; it stops when dropped.
pub(crate) struct Plugin {
    task: JoinHandle<()>,
}

impl Plugin {
    /// Listens on `path` and treats every connection as `socket` says.
    pub(crate) fn start(path: &Path, socket: Socket, script: Script) -> std::io::Result<Plugin> {
        let listener = UnixListener::bind(path)?;
        let task = tokio::spawn(async move {
            // Connections that are never read are held here until the plugin stops.
            let mut held = Vec::new();
            let mut served = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                match socket {
                    Socket::NeverRead => held.push(stream),
                    Socket::Close => drop(stream),
                    Socket::Serve => {
                        let script = script.clone();
                        let service = hyper::service::service_fn(move |req| {
                            let script = script.clone();
                            handle(script, req)
                        });
                        served.spawn(async move {
                            // The client may reset or drop a stream it refused; that ends
                            // nothing here.
                            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .max_header_list_size(1 << 20)
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                }
            }
        });
        Ok(Plugin { task })
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}
