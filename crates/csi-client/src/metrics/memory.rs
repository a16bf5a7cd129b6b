//! [`InMemoryMetrics`]: lock-free per-RPC counters and latency histograms.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use csi_proto::Rpc;
use tonic::Code;

use super::{RpcMetrics, RpcOutcome};

/// The upper bounds of the latency histogram buckets (a last `+Inf` bucket is implied).
///
/// From half a millisecond (an Identity call over a local socket) to five minutes (a cloud
/// controller attaching a disk).
pub const LATENCY_BUCKETS: [Duration; 18] = [
    Duration::from_micros(500),
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2_500),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(120),
    Duration::from_secs(300),
];

/// gRPC codes 0..=16, then transport error, no status, dropped.
const OUTCOMES: usize = 20;

fn outcome_index(outcome: RpcOutcome) -> usize {
    match outcome {
        // `Code` is 0..=16 by definition; anything else tonic already maps to Unknown.
        RpcOutcome::Status(code) => (code as usize).min(16),
        RpcOutcome::Transport => 17,
        RpcOutcome::NoStatus => 18,
        RpcOutcome::Dropped => 19,
    }
}

pub(super) fn outcome_at(index: usize) -> RpcOutcome {
    match index {
        17 => RpcOutcome::Transport,
        18 => RpcOutcome::NoStatus,
        19 => RpcOutcome::Dropped,
        n => RpcOutcome::Status(Code::from_i32(n as i32)),
    }
}

fn rpc_index(rpc: Rpc) -> usize {
    // `Rpc::ALL` lists every variant, so the search always finds it; the fallback only keeps
    // this total.
    Rpc::ALL.iter().position(|r| *r == rpc).unwrap_or(0)
}

#[derive(Debug, Default)]
struct Slot {
    outcomes: [AtomicU64; OUTCOMES],
    /// Non-cumulative: one count per bucket, the last one being `+Inf`.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

/// An [`RpcMetrics`] sink kept in memory: per RPC, a counter per [`RpcOutcome`] and a
/// latency histogram over [`LATENCY_BUCKETS`]. Recording is a few relaxed atomic adds, no
/// lock and no allocation. Share it in an `Arc` between the layer and the exporter.
///
/// ```
/// use std::time::Duration;
/// use csi_client::{Code, Rpc};
/// use csi_client::metrics::{InMemoryMetrics, RpcMetrics, RpcOutcome};
///
/// let metrics = InMemoryMetrics::new();
/// metrics.record(Rpc::Probe, RpcOutcome::Status(Code::Ok), Duration::from_millis(2));
/// assert_eq!(metrics.count(Rpc::Probe, RpcOutcome::Status(Code::Ok)), 1);
///
/// let text = metrics.render_prometheus();
/// assert!(text.contains(r#"csi_rpc_duration_seconds_bucket{rpc="Probe",le="0.0025"} 1"#));
/// assert!(text.contains(r#"csi_rpc_total{rpc="Probe",code="Ok"} 1"#));
/// ```
#[derive(Debug)]
pub struct InMemoryMetrics {
    slots: Box<[Slot]>,
}

impl Default for InMemoryMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryMetrics {
    /// Empty metrics for every RPC.
    pub fn new() -> Self {
        InMemoryMetrics {
            slots: Rpc::ALL.iter().map(|_| Slot::default()).collect(),
        }
    }

    fn slot(&self, rpc: Rpc) -> &Slot {
        &self.slots[rpc_index(rpc)]
    }

    /// How many requests of `rpc` ended with `outcome`.
    pub fn count(&self, rpc: Rpc, outcome: RpcOutcome) -> u64 {
        self.slot(rpc).outcomes[outcome_index(outcome)].load(Ordering::Relaxed)
    }

    /// How many requests of `rpc` were recorded, whatever their outcome.
    pub fn requests(&self, rpc: Rpc) -> u64 {
        self.slot(rpc)
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    /// Every non-zero counter, as (RPC, outcome, count), in [`Rpc::ALL`] order.
    pub fn counts(&self) -> Vec<(Rpc, RpcOutcome, u64)> {
        let mut out = Vec::new();
        for (rpc, slot) in Rpc::ALL.iter().zip(self.slots.iter()) {
            for (index, counter) in slot.outcomes.iter().enumerate() {
                let n = counter.load(Ordering::Relaxed);
                if n > 0 {
                    out.push((*rpc, outcome_at(index), n));
                }
            }
        }
        out
    }

    /// The histogram of `rpc`: cumulative counts per bucket of [`LATENCY_BUCKETS`] and a
    /// last one for `+Inf` (the total), and the sum of all latencies.
    pub fn histogram(&self, rpc: Rpc) -> Histogram {
        let slot = self.slot(rpc);
        let mut total = 0;
        let cumulative = slot
            .buckets
            .iter()
            .map(|b| {
                total += b.load(Ordering::Relaxed);
                total
            })
            .collect();
        Histogram {
            cumulative,
            sum: Duration::from_nanos(slot.sum_nanos.load(Ordering::Relaxed)),
        }
    }

    /// The whole content in the Prometheus text format (see [`write_prometheus`](super::write_prometheus)
    /// for the families and labels).
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        // No extra labels, so there is no label to refuse.
        let _ = super::write_prometheus(&mut out, [(&[][..], self)]);
        out
    }
}

/// A snapshot of one RPC's latency histogram (see [`InMemoryMetrics::histogram`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    /// Cumulative counts, one per bucket of [`LATENCY_BUCKETS`], then `+Inf`.
    pub cumulative: Vec<u64>,
    /// The sum of all recorded latencies.
    pub sum: Duration,
}

impl Histogram {
    /// Requests recorded (the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}

impl RpcMetrics for InMemoryMetrics {
    fn record(&self, rpc: Rpc, outcome: RpcOutcome, latency: Duration) {
        let slot = self.slot(rpc);
        slot.outcomes[outcome_index(outcome)].fetch_add(1, Ordering::Relaxed);
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| latency <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        slot.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        slot.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_indices_round_trip() {
        for index in 0..OUTCOMES {
            assert_eq!(outcome_index(outcome_at(index)), index);
        }
    }

    #[test]
    fn records_land_in_their_counter_and_bucket() {
        let m = InMemoryMetrics::new();
        m.record(
            Rpc::NodeGetInfo,
            RpcOutcome::Status(Code::Ok),
            Duration::from_millis(1),
        );
        m.record(
            Rpc::NodeGetInfo,
            RpcOutcome::Status(Code::Unavailable),
            Duration::from_secs(3),
        );
        m.record(
            Rpc::NodeGetInfo,
            RpcOutcome::Dropped,
            Duration::from_secs(999),
        );
        assert_eq!(m.count(Rpc::NodeGetInfo, RpcOutcome::Status(Code::Ok)), 1);
        assert_eq!(m.count(Rpc::NodeGetInfo, RpcOutcome::Dropped), 1);
        assert_eq!(m.count(Rpc::Probe, RpcOutcome::Status(Code::Ok)), 0);
        assert_eq!(m.requests(Rpc::NodeGetInfo), 3);

        let h = m.histogram(Rpc::NodeGetInfo);
        // 1 ms is in the "<= 1 ms" bucket (index 1), inclusive upper bound.
        assert_eq!(h.cumulative[0], 0);
        assert_eq!(h.cumulative[1], 1);
        // 3 s lands in "<= 5 s" (index 12).
        assert_eq!(h.cumulative[11], 1);
        assert_eq!(h.cumulative[12], 2);
        // 999 s only in +Inf.
        assert_eq!(h.cumulative[LATENCY_BUCKETS.len() - 1], 2);
        assert_eq!(h.count(), 3);
        assert_eq!(h.sum, Duration::from_millis(1_002_001));

        assert_eq!(
            m.counts(),
            vec![
                (Rpc::NodeGetInfo, RpcOutcome::Status(Code::Ok), 1),
                (Rpc::NodeGetInfo, RpcOutcome::Status(Code::Unavailable), 1),
                (Rpc::NodeGetInfo, RpcOutcome::Dropped, 1),
            ]
        );
    }
}
