//! Per-RPC latency and gRPC status metrics, as a tower layer on the plugin channel.
//!
//! [`MetricsLayer`] goes into [`CsiClientBuilder::layer`](crate::CsiClientBuilder::layer).
//! For every HTTP/2 request to the plugin whose path is a CSI RPC it measures the time from
//! sending the request to the final gRPC status and hands both to an [`RpcMetrics`] sink:
//!
//! - the status code of a unary answer travels in the HTTP/2 trailers, so the layer wraps the
//!   response body and reads the trailers frame as the client reads it (or the headers, for a
//!   "trailers-only" answer such as most errors);
//! - a request that failed below gRPC (connection refused or lost, a redial that failed),
//!   a body that ended without a status, and a response dropped before its status arrived
//!   (our attempt deadline, a cancelled call) are outcomes of their own ([`RpcOutcome`]).
//!
//! The layer sits below the retry loop: a call that took two attempts is two records.
//! For a server-streaming RPC the record is taken when the stream ends.
//!
//! [`InMemoryMetrics`] is a ready sink: lock-free counters per RPC and outcome and a latency
//! histogram per RPC with fixed buckets ([`LATENCY_BUCKETS`]), rendered in the Prometheus
//! text format by [`InMemoryMetrics::render_prometheus`] (or [`write_prometheus`] for several
//! plugins in one exposition). [`PluginMetrics`] keeps one per plugin, with the calls that
//! never reached a plugin ([`Unsent`]), for a node that talks to many.
//!
//! # Layer or observer?
//!
//! A [`CallObserver`](crate::CallObserver) sees what the *client* decided: each attempt and
//! each call, with the client's failure kind and [`ErrorClass`](crate::ErrorClass), including
//! requests refused before sending and dials that never connected. The metrics layer sees
//! what happened *on the wire*: each HTTP/2 request that reached the channel, its gRPC code
//! and latency, independent of how the client classifies it. Use the observer for "how many
//! calls ended uncertain"; use the layer for "latency and codes per RPC", the numbers a
//! plugin's own server-side metrics would show.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use csi_client::CsiClient;
//! use csi_client::metrics::{InMemoryMetrics, MetricsLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let metrics = Arc::new(InMemoryMetrics::new());
//! let client = CsiClient::builder("unix:///run/csi/plugin.sock".parse()?)
//!     .layer(MetricsLayer::new(metrics.clone()))
//!     .build();
//!
//! client.identity().probe().await?;
//!
//! // For the agent's metrics endpoint:
//! let text = metrics.render_prometheus();
//! assert!(text.contains(r#"csi_rpc_total{rpc="Probe",code="Ok"} 1"#));
//! # Ok(()) }
//! ```

mod future;
mod layer;
mod memory;
mod plugins;
mod prometheus;

use std::fmt;
use std::time::Duration;

use csi_proto::Rpc;
use tonic::Code;

use crate::observe::code_name;

pub use future::ResponseFuture;
pub use layer::{MetricsLayer, MetricsService};
pub use memory::{Histogram, InMemoryMetrics, LATENCY_BUCKETS};
pub use plugins::{PluginMetrics, UNSENT_TOTAL, Unsent};
pub use prometheus::{LabelError, write_prometheus};

/// How one request to the plugin ended, as the metrics layer saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RpcOutcome {
    /// The plugin's final gRPC status (`Ok` included), from the trailers or, for a
    /// trailers-only answer, the headers.
    Status(Code),
    /// The request failed below gRPC: no response (connection refused or lost, a redial that
    /// failed) or an error while reading the body.
    Transport,
    /// The response ended without a `grpc-status` (a broken or non-gRPC server).
    NoStatus,
    /// The response (or the request future) was dropped before the status arrived: the
    /// client's deadline expired or the call was cancelled.
    Dropped,
}

impl RpcOutcome {
    /// The gRPC code, when the plugin sent one.
    pub fn code(self) -> Option<Code> {
        match self {
            RpcOutcome::Status(code) => Some(code),
            RpcOutcome::Transport | RpcOutcome::NoStatus | RpcOutcome::Dropped => None,
        }
    }

    /// A label for metrics: the code name (`Ok`, `NotFound`, …) or `transport_error`,
    /// `no_status`, `dropped`.
    pub fn label(self) -> &'static str {
        match self {
            RpcOutcome::Status(code) => code_name(code),
            RpcOutcome::Transport => "transport_error",
            RpcOutcome::NoStatus => "no_status",
            RpcOutcome::Dropped => "dropped",
        }
    }
}

impl fmt::Display for RpcOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Receives one record per request to the plugin; implement it to feed your own metrics.
///
/// `record` runs inline on the task that polls the response: keep it short and
/// non-blocking (an atomic increment, a histogram bucket).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::time::Duration;
/// use csi_client::Rpc;
/// use csi_client::metrics::{RpcMetrics, RpcOutcome};
///
/// #[derive(Debug, Default)]
/// struct SlowProbes(AtomicU64);
///
/// impl RpcMetrics for SlowProbes {
///     fn record(&self, rpc: Rpc, _outcome: RpcOutcome, latency: Duration) {
///         if rpc == Rpc::Probe && latency > Duration::from_secs(1) {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait RpcMetrics: fmt::Debug + Send + Sync + 'static {
    /// One request of `rpc` ended with `outcome`, `latency` after it was sent.
    fn record(&self, rpc: Rpc, outcome: RpcOutcome, latency: Duration);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_codes_and_labels() {
        assert_eq!(RpcOutcome::Status(Code::Ok).label(), "Ok");
        assert_eq!(
            RpcOutcome::Status(Code::NotFound).code(),
            Some(Code::NotFound)
        );
        assert_eq!(RpcOutcome::Transport.code(), None);
        assert_eq!(RpcOutcome::Dropped.to_string(), "dropped");
        assert_eq!(RpcOutcome::NoStatus.label(), "no_status");
    }
}
