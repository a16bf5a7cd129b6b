//! [`MetricsLayer`] and its service.

use std::sync::Arc;
use std::task::{Context, Poll};

use csi_proto::Rpc;
use tonic::body::Body;
use tower::{Layer, Service};

use super::RpcMetrics;
use super::future::{Pending, ResponseFuture};

/// A tower layer recording latency and final gRPC status per CSI RPC into an
/// [`RpcMetrics`] sink (see the [module docs](super)).
///
/// Requests whose path is not a CSI RPC pass through unrecorded and untouched.
#[derive(Clone, Debug)]
pub struct MetricsLayer {
    metrics: Arc<dyn RpcMetrics>,
}

impl MetricsLayer {
    /// A layer recording into `metrics`.
    pub fn new(metrics: Arc<dyn RpcMetrics>) -> Self {
        MetricsLayer { metrics }
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> MetricsService<S> {
        MetricsService {
            inner,
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// The service of [`MetricsLayer`]: `inner`, timed and recorded per request.
#[derive(Clone, Debug)]
pub struct MetricsService<S> {
    inner: S,
    metrics: Arc<dyn RpcMetrics>,
}

impl<S, B> Service<http::Request<B>> for MetricsService<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let pending = match Rpc::from_path(request.uri().path()) {
            Some(rpc) => Pending::start(Arc::clone(&self.metrics), rpc),
            None => Pending::none(),
        };
        ResponseFuture::new(self.inner.call(request), pending)
    }
}
