//! A diagnostic for `--compare`: Probe through a bare tonic client on the same socket, without
//! csi-client's deadlines, retries, classification or checks. Its p50 sits between the raw
//! socket floor and csi-client's, and shows which part of the gap is gRPC itself.

use std::path::Path;
use std::time::{Duration, Instant};

use csi_client::proto::ProbeRequest;
use csi_client::proto::identity_client::IdentityClient;

use crate::error::BenchError;
use crate::report::Line;

/// The `client=` value of the bare tonic line.
pub const CLIENT: &str = "tonic";

/// `warmup` then `n` sequential Probes through a bare tonic client on the unix socket `path`.
///
/// # Errors
///
/// [`BenchError::RawConnect`], [`BenchError::RawCall`].
pub async fn raw_probe(path: &Path, n: u64, warmup: u64) -> Result<Line, BenchError> {
    let channel = csi_testkit::transport::connect_unix(path)
        .await
        .map_err(BenchError::RawConnect)?;
    let mut client = IdentityClient::new(channel);
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
    Ok(Line::from_run(
        CLIENT,
        "probe",
        1,
        &mut latencies,
        measured_from.elapsed(),
    ))
}
