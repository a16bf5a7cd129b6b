//! A diagnostic for `--compare`: Probe through a bare tonic client on the same socket, without
//! csi-client's deadlines, retries, classification or checks. Its p50 sits between the raw
//! socket floor and csi-client's, and shows which part of the gap is gRPC itself.

use std::path::Path;
use std::time::{Duration, Instant};

use csi_client::proto::ProbeRequest;
use csi_client::proto::identity_client::IdentityClient;
use tonic::codegen::Body;
use tonic::transport::Channel;

use crate::error::BenchError;

/// The `client=` value of the bare tonic line.
pub const CLIENT: &str = "tonic";

/// A bare tonic Identity client on one unix socket.
#[derive(Clone, Debug)]
pub struct TonicProbe {
    client: IdentityClient<Channel>,
    sent: u64,
}

impl TonicProbe {
    /// Connects to the unix socket `path`.
    ///
    /// # Errors
    ///
    /// [`BenchError::RawConnect`].
    pub async fn connect(path: &Path) -> Result<TonicProbe, BenchError> {
        let channel = csi_testkit::transport::connect_unix(path)
            .await
            .map_err(BenchError::RawConnect)?;
        Ok(TonicProbe {
            client: IdentityClient::new(channel),
            sent: 0,
        })
    }
}

impl ProbeBatches for TonicProbe {
    async fn probes(&mut self, n: u64) -> Result<Vec<Duration>, BenchError> {
        timed_probes(&mut self.client, &mut self.sent, n).await
    }
}

/// A bare Probe client that runs timed batches (the diagnostic lines of `--compare`).
pub trait ProbeBatches: Send + 'static {
    /// `n` sequential Probes, each timed.
    ///
    /// # Errors
    ///
    /// [`BenchError::RawCall`] for the first failed Probe.
    fn probes(
        &mut self,
        n: u64,
    ) -> impl std::future::Future<Output = Result<Vec<Duration>, BenchError>> + Send;
}

/// `n` sequential Probes through a generated Identity client over any HTTP/2 service, each
/// timed; `sent` numbers the calls across batches (for the error of a failed one).
pub(crate) async fn timed_probes<T>(
    client: &mut IdentityClient<T>,
    sent: &mut u64,
    n: u64,
) -> Result<Vec<Duration>, BenchError>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut latencies = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for _ in 0..n {
        let start = Instant::now();
        client
            .probe(ProbeRequest {})
            .await
            .map_err(|status| BenchError::RawCall {
                index: *sent,
                code: status.code(),
                message: status.message().to_owned(),
            })?;
        latencies.push(start.elapsed());
        *sent += 1;
    }
    Ok(latencies)
}
