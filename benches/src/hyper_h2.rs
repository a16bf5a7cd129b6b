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
use std::time::Duration;

use csi_client::proto::identity_client::IdentityClient;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tonic::body::Body;

use crate::error::BenchError;
use crate::raw::{ProbeBatches, timed_probes};

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

/// Probe over one hyper HTTP/2 connection to a unix socket, through the generated Identity
/// client with tonic's codec. The connection is driven by a task that ends when this is
/// dropped.
#[derive(Debug)]
pub struct H2Probe {
    client: IdentityClient<H2Service>,
    driver: tokio::task::JoinHandle<Result<(), hyper::Error>>,
    sent: u64,
}

impl H2Probe {
    /// Connects to the unix socket `path` and sets up HTTP/2.
    ///
    /// # Errors
    ///
    /// [`BenchError::H2Connect`], [`BenchError::H2Handshake`].
    pub async fn connect(path: &Path) -> Result<H2Probe, BenchError> {
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
        let client = IdentityClient::with_origin(
            H2Service { send },
            http::Uri::from_static("http://localhost"),
        );
        Ok(H2Probe {
            client,
            driver,
            sent: 0,
        })
    }
}

impl ProbeBatches for H2Probe {
    async fn probes(&mut self, n: u64) -> Result<Vec<Duration>, BenchError> {
        timed_probes(&mut self.client, &mut self.sent, n).await
    }
}

impl Drop for H2Probe {
    fn drop(&mut self) {
        self.driver.abort();
    }
}
