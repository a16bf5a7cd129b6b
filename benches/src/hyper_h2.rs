//! A diagnostic for `--compare`: Probe over a bare hyper HTTP/2 connection on the same socket,
//! with tonic's codec but without tonic's `Channel`.
//!
//! tonic's `Channel` queues every request to a worker task (a `tower` buffer) before hyper sees
//! it. Here the generated Identity client sends straight into hyper's cloneable
//! `SendRequest`, so the line shows what that queue costs per call.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use csi_client::proto::ProbeRequest;
use csi_client::proto::identity_client::IdentityClient;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tonic::body::Body;

use crate::error::BenchError;
use crate::report::Line;

/// The `client=` value of the bare hyper line.
pub const CLIENT: &str = "hyper-h2";

/// hyper's HTTP/2 request sender as a `tower::Service`, answering tonic bodies.
#[derive(Clone, Debug)]
struct H2Service {
    send: http2::SendRequest<Body>,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, hyper::Error>> + Send>>;

impl tower::Service<http::Request<Body>> for H2Service {
    type Response = http::Response<Body>;
    type Error = hyper::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> ResponseFuture {
        let sent = self.send.send_request(request);
        Box::pin(async move { Ok(sent.await?.map(Body::new)) })
    }
}

/// `warmup` then `n` sequential Probes over one hyper HTTP/2 connection to the unix socket
/// `path`.
///
/// # Errors
///
/// [`BenchError::H2Connect`], [`BenchError::H2Handshake`], [`BenchError::RawCall`].
pub async fn h2_probe(path: &Path, n: u64, warmup: u64) -> Result<Line, BenchError> {
    let stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|source| BenchError::H2Connect {
            path: path.to_path_buf(),
            source,
        })?;
    let (send, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .map_err(BenchError::H2Handshake)?;
    let driver = tokio::spawn(connection);
    let mut client = IdentityClient::with_origin(
        H2Service { send },
        http::Uri::from_static("http://localhost"),
    );
    let mut latencies: Vec<Duration> = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    let started = Instant::now();
    let mut measured_from = started;
    for i in 0..warmup + n {
        if i == warmup {
            measured_from = Instant::now();
        }
        let start = Instant::now();
        client
            .probe(ProbeRequest {})
            .await
            .map_err(|status| BenchError::RawCall {
                index: i,
                code: status.code(),
                message: status.message().to_owned(),
            })?;
        if i >= warmup {
            latencies.push(start.elapsed());
        }
    }
    let wall = measured_from.elapsed();
    drop(client);
    driver.abort();
    Ok(Line::from_run(CLIENT, "probe", 1, &mut latencies, wall))
}
