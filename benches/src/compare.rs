//! `--compare`: the floor (the raw ping-pong) and sequential Probe through csi-client, with
//! bare tonic and bare hyper HTTP/2 as diagnostics, measured **interleaved**.
//!
//! This machine's latency floor is not stable: a shared 2-vCPU VM flips between a busy regime
//! (a round trip between two processes costs ~3.5 µs) and an idle one (the vCPUs halt and each
//! cross-CPU wake-up costs tens of µs, so the floor is ~70 µs), sometimes within one second.
//! Measured one after the other, the floor could come from one regime and Probe from the
//! other, and their ratio would mean nothing (runs printed 28× and 1.6× minutes apart). So the
//! `-n` calls of every line are split into [`ROUNDS`] batches, and each round runs one batch
//! of every line, starting with a different line each round. Every line then samples the
//! same stretch of time, and the ratio of p50s compares like with like.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_client::CsiClient;
use tokio::runtime::Runtime;

use crate::baseline::{self, PingPong};
use crate::cli::RuntimeFlavor;
use crate::error::BenchError;
use crate::hyper_h2::{self, H2Probe};
use crate::load;
use crate::raw::{self, ProbeBatches, TonicProbe};
use crate::report::Line;
use crate::rpc::{BenchRpc, Given, Plan};
use crate::target::{Target, TargetSpec};

/// How many batches each line's calls are split into.
pub const ROUNDS: u64 = 10;

/// The most the sequential Probe p50 may be, as a multiple of the baseline's p50 (issue 4).
pub const TARGET_RATIO: f64 = 4.0;

/// The lines of one `--compare` run.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The raw ping-pong (`client=baseline rpc=pingpong`).
    pub floor: Line,
    /// Probe through a bare tonic client (unix endpoints only).
    pub tonic: Option<Line>,
    /// Probe through a bare hyper HTTP/2 connection (unix endpoints only).
    pub h2: Option<Line>,
    /// Probe through csi-client.
    pub probe: Line,
}

impl Comparison {
    /// `line`'s p50 as a multiple of the floor's.
    pub fn ratio(&self, line: &Line) -> f64 {
        if self.floor.p50_us > 0.0 {
            line.p50_us / self.floor.p50_us
        } else {
            f64::INFINITY
        }
    }

    /// Whether csi-client's Probe p50 is within [`TARGET_RATIO`] of the floor's.
    pub fn met(&self) -> bool {
        self.ratio(&self.probe) <= TARGET_RATIO
    }

    /// The printed lines: every measured line, then the summary
    /// `compare probe_p50_over_baseline_p50=… [tonic_…] [hyper_h2_…] runtime=… rounds=…
    /// target_max=4 met=…`, where `runtime` is the flavour the Probe lines ran on.
    pub fn lines(&self, runtime: RuntimeFlavor) -> Vec<String> {
        let mut lines = vec![self.floor.to_string()];
        let mut summary = format!(
            "compare probe_p50_over_baseline_p50={:.2}",
            self.ratio(&self.probe)
        );
        if let Some(tonic) = &self.tonic {
            lines.push(tonic.to_string());
            summary.push_str(&format!(
                " tonic_p50_over_baseline_p50={:.2}",
                self.ratio(tonic)
            ));
        }
        if let Some(h2) = &self.h2 {
            lines.push(h2.to_string());
            summary.push_str(&format!(
                " hyper_h2_p50_over_baseline_p50={:.2}",
                self.ratio(h2)
            ));
        }
        lines.push(self.probe.to_string());
        summary.push_str(&format!(
            " runtime={} rounds={ROUNDS} target_max={TARGET_RATIO:.0} met={}",
            runtime.as_str(),
            if self.met() { "yes" } else { "no" }
        ));
        lines.push(summary);
        lines
    }
}

/// Runs the comparison: `warmup` unmeasured then `n` measured calls per line, interleaved in
/// [`ROUNDS`] rounds. `exe` is re-run as the ping-pong peer.
///
/// # Errors
///
/// Whatever stopped a line; see [`BenchError`].
pub fn run_compare(
    rt: &Runtime,
    spec: &TargetSpec,
    exe: &Path,
    n: u64,
    warmup: u64,
) -> Result<Comparison, BenchError> {
    let mut floor = PingPong::start(exe)?;
    let measured = rt.block_on(Lines::start(spec)).and_then(|mut lines| {
        let result = interleave(rt, &mut floor, &mut lines, n, warmup);
        let stopped = rt.block_on(lines.target.stop());
        let comparison = result?;
        stopped?;
        Ok(comparison)
    });
    floor.finish(measured.is_ok())?;
    measured
}

/// The Probe lines' clients, all on one plugin.
struct Lines {
    target: Target,
    client: CsiClient,
    plan: Plan,
    tonic: Option<TonicProbe>,
    h2: Option<H2Probe>,
}

impl Lines {
    async fn start(spec: &TargetSpec) -> Result<Lines, BenchError> {
        let target = Target::start(spec).await?;
        let client = target.client();
        let plan = Plan::prepare(&client, BenchRpc::Probe, 1, &Given::default()).await?;
        let (tonic, h2) = match target.endpoint().unix_path() {
            Some(path) => (
                Some(TonicProbe::connect(path).await?),
                Some(H2Probe::connect(path).await?),
            ),
            None => (None, None),
        };
        Ok(Lines {
            target,
            client,
            plan,
            tonic,
            h2,
        })
    }
}

/// One line's samples, gathered over the rounds.
#[derive(Default)]
struct Samples {
    latencies: Vec<Duration>,
    wall: Duration,
}

impl Samples {
    /// Times `batch` and keeps its latencies.
    fn take(
        &mut self,
        batch: impl FnOnce() -> Result<Vec<Duration>, BenchError>,
    ) -> Result<(), BenchError> {
        let started = Instant::now();
        let latencies = batch()?;
        self.wall += started.elapsed();
        self.latencies.extend(latencies);
        Ok(())
    }

    fn line(mut self, client: &str, rpc: &str) -> Line {
        Line::from_run(client, rpc, 1, &mut self.latencies, self.wall)
    }
}

/// Runs `future` as a task, as csi-client's callers run (on a multi-thread runtime, the thread
/// blocking on the runtime would add a cross-thread wake-up to every call).
fn on_worker<T: Send + 'static>(
    rt: &Runtime,
    future: impl Future<Output = T> + Send + 'static,
) -> Result<T, BenchError> {
    rt.block_on(rt.spawn(future))
        .map_err(|_| BenchError::CallerTask {
            rpc: BenchRpc::Probe,
        })
}

/// `n` Probes through a bare client (none if the endpoint has no such line), moved to a
/// worker and back.
fn probe_batch<P: ProbeBatches>(
    rt: &Runtime,
    slot: &mut Option<P>,
    n: u64,
) -> Result<Vec<Duration>, BenchError> {
    let Some(mut prober) = slot.take() else {
        return Ok(Vec::new());
    };
    let (prober, batch) = on_worker(rt, async move {
        let batch = prober.probes(n).await;
        (prober, batch)
    })?;
    *slot = Some(prober);
    batch
}

const LINES: usize = 4;

/// How many calls each round makes: `n` split into [`ROUNDS`] batches differing by at most one.
fn batch_sizes(n: u64) -> impl Iterator<Item = u64> {
    (0..ROUNDS).map(move |round| n / ROUNDS + u64::from(round < n % ROUNDS))
}

fn interleave(
    rt: &Runtime,
    floor: &mut PingPong,
    lines: &mut Lines,
    n: u64,
    warmup: u64,
) -> Result<Comparison, BenchError> {
    let mut samples: [Samples; LINES] = Default::default();
    // Warm-up first, unmeasured: connections, caches, the mock's first calls.
    floor.round_trips(warmup)?;
    probe_batch(rt, &mut lines.tonic, warmup)?;
    probe_batch(rt, &mut lines.h2, warmup)?;
    rt.block_on(load::measure(&lines.client, &mut lines.plan, warmup, 1))?;
    for (round, batch) in batch_sizes(n).enumerate() {
        for offset in 0..LINES {
            // Each round starts with a different line.
            let which = (round + offset) % LINES;
            let samples = &mut samples[which];
            match which {
                0 => samples.take(|| floor.round_trips(batch))?,
                1 => samples.take(|| probe_batch(rt, &mut lines.tonic, batch))?,
                2 => samples.take(|| probe_batch(rt, &mut lines.h2, batch))?,
                _ => samples.take(|| {
                    rt.block_on(load::measure(&lines.client, &mut lines.plan, batch, 1))
                })?,
            }
        }
    }
    let [floor, tonic, h2, probe] = samples;
    Ok(Comparison {
        floor: floor.line(baseline::CLIENT, baseline::RPC),
        tonic: lines
            .tonic
            .is_some()
            .then(|| tonic.line(raw::CLIENT, "probe")),
        h2: lines
            .h2
            .is_some()
            .then(|| h2.line(hyper_h2::CLIENT, "probe")),
        probe: probe.line(load::CLIENT, BenchRpc::Probe.name()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_is_in_one_batch_and_batches_are_even() {
        for n in [1, 9, 10, 11, 53, 20_000, 20_009] {
            let sizes: Vec<u64> = batch_sizes(n).collect();
            assert_eq!(sizes.len() as u64, ROUNDS);
            assert_eq!(sizes.iter().sum::<u64>(), n, "n={n}");
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(max - min <= 1, "n={n}: {sizes:?}");
        }
    }
}
