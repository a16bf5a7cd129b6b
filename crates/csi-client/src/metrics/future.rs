//! The response future and body of [`MetricsService`](super::MetricsService), and the
//! pending record they carry until the final status is known.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use csi_proto::Rpc;
use http::HeaderMap;
use http_body::{Frame, SizeHint};
use tokio::time::Instant;
use tonic::Code;
use tonic::body::Body;

use super::{RpcMetrics, RpcOutcome};

/// A record waiting for its outcome. Recorded exactly once: by [`Pending::finish`], or as
/// [`RpcOutcome::Dropped`] when dropped unfinished.
pub(crate) struct Pending(Option<Started>);

struct Started {
    metrics: Arc<dyn RpcMetrics>,
    rpc: Rpc,
    start: Instant,
}

impl Pending {
    /// Starts timing a request of `rpc` now.
    pub(crate) fn start(metrics: Arc<dyn RpcMetrics>, rpc: Rpc) -> Self {
        Pending(Some(Started {
            metrics,
            rpc,
            start: Instant::now(),
        }))
    }

    /// Nothing to record (not a CSI RPC).
    pub(crate) fn none() -> Self {
        Pending(None)
    }

    fn is_active(&self) -> bool {
        self.0.is_some()
    }

    /// Records `outcome` if nothing was recorded yet.
    fn finish(&mut self, outcome: RpcOutcome) {
        if let Some(started) = self.0.take() {
            started
                .metrics
                .record(started.rpc, outcome, started.start.elapsed());
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.finish(RpcOutcome::Dropped);
    }
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(started) => f.debug_tuple("Pending").field(&started.rpc).finish(),
            None => f.write_str("Pending(none)"),
        }
    }
}

/// The `grpc-status` in `headers`, if any.
fn status_in(headers: &HeaderMap) -> Option<Code> {
    headers
        .get(tonic::Status::GRPC_STATUS)
        .map(|value| Code::from_bytes(value.as_bytes()))
}

pin_project_lite::pin_project! {
    /// The response future of [`MetricsService`](super::MetricsService).
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        pending: Pending,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, pending: Pending) -> Self {
        ResponseFuture { inner, pending }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("pending", &self.pending)
            .finish_non_exhaustive()
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<Body>, E>>,
{
    type Output = Result<http::Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let response = match result {
            Ok(response) => response,
            Err(err) => {
                this.pending.finish(RpcOutcome::Transport);
                return Poll::Ready(Err(err));
            }
        };
        if !this.pending.is_active() {
            return Poll::Ready(Ok(response));
        }
        // A trailers-only answer (most errors) carries its status in the headers.
        if let Some(code) = status_in(response.headers()) {
            this.pending.finish(RpcOutcome::Status(code));
            return Poll::Ready(Ok(response));
        }
        let pending = std::mem::replace(this.pending, Pending::none());
        Poll::Ready(Ok(
            response.map(|inner| Body::new(MetricsBody { inner, pending }))
        ))
    }
}

/// A response body that records the status when its trailers frame goes by.
struct MetricsBody {
    inner: Body,
    pending: Pending,
}

impl http_body::Body for MetricsBody {
    type Data = <Body as http_body::Body>::Data;
    type Error = <Body as http_body::Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        // `Body` is `Unpin`, so is this.
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let outcome =
                        status_in(trailers).map_or(RpcOutcome::NoStatus, RpcOutcome::Status);
                    this.pending.finish(outcome);
                }
            }
            Poll::Ready(Some(Err(_))) => this.pending.finish(RpcOutcome::Transport),
            Poll::Ready(None) => this.pending.finish(RpcOutcome::NoStatus),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    #[derive(Debug, Default)]
    struct Log(Mutex<Vec<(Rpc, RpcOutcome)>>);

    impl RpcMetrics for Log {
        fn record(&self, rpc: Rpc, outcome: RpcOutcome, _: Duration) {
            self.0.lock().unwrap().push((rpc, outcome));
        }
    }

    fn taken(log: &Log) -> Vec<(Rpc, RpcOutcome)> {
        log.0.lock().unwrap().clone()
    }

    #[test]
    fn a_pending_record_is_recorded_once_and_as_dropped_when_unfinished() {
        let log = Arc::new(Log::default());
        let mut finished = Pending::start(log.clone(), Rpc::Probe);
        finished.finish(RpcOutcome::Status(Code::Ok));
        finished.finish(RpcOutcome::NoStatus);
        drop(finished);
        drop(Pending::start(log.clone(), Rpc::NodeGetInfo));
        drop(Pending::none());
        assert_eq!(
            taken(&log),
            vec![
                (Rpc::Probe, RpcOutcome::Status(Code::Ok)),
                (Rpc::NodeGetInfo, RpcOutcome::Dropped)
            ]
        );
    }

    #[test]
    fn the_status_is_read_from_headers_and_unknown_values_are_unknown() {
        let mut headers = HeaderMap::new();
        assert_eq!(status_in(&headers), None);
        headers.insert("grpc-status", http::HeaderValue::from_static("5"));
        assert_eq!(status_in(&headers), Some(Code::NotFound));
        headers.insert("grpc-status", http::HeaderValue::from_static("99"));
        assert_eq!(status_in(&headers), Some(Code::Unknown));
    }
}
