//! The load loop: `c` callers sharing one client take call numbers from one counter until `n`
//! calls are done, each timing its own calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use csi_client::CsiClient;

use crate::error::BenchError;
use crate::report::Line;
use crate::rpc::Plan;

/// The `client=` value of lines measured through `csi-client`.
pub const CLIENT: &str = "csi-client";

/// Runs `warmup` unmeasured calls, then `n` measured calls by `c` concurrent callers sharing
/// `client` (one connection, as an orchestrator would), and returns the result line.
///
/// # Errors
///
/// [`BenchError::Call`] for the first failed call (the run stops),
/// [`BenchError::CallerTask`] when a caller task died.
pub async fn run_load(
    client: &CsiClient,
    plan: &mut Plan,
    n: u64,
    c: u32,
    warmup: u64,
) -> Result<Line, BenchError> {
    if warmup > 0 {
        phase(client, plan, warmup, c, "warm-up").await?;
    }
    let started = Instant::now();
    let mut latencies = phase(client, plan, n, c, "measured").await?;
    let wall = started.elapsed();
    Ok(Line::from_run(
        CLIENT,
        plan.rpc().name(),
        c,
        &mut latencies,
        wall,
    ))
}

/// `n` measured calls by `c` concurrent callers sharing `client`, without warm-up: the
/// latencies, unsorted (a batch of a longer, interleaved run).
///
/// # Errors
///
/// As [`run_load`].
pub async fn measure(
    client: &CsiClient,
    plan: &mut Plan,
    n: u64,
    c: u32,
) -> Result<Vec<Duration>, BenchError> {
    phase(client, plan, n, c, "measured").await
}

async fn phase(
    client: &CsiClient,
    plan: &mut Plan,
    n: u64,
    c: u32,
    label: &'static str,
) -> Result<Vec<Duration>, BenchError> {
    let rpc = plan.rpc();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(c as usize);
    for caller in 0..c as usize {
        let client = client.clone();
        let mut mine = plan.for_caller();
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failure = None;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= n {
                    break;
                }
                let start = Instant::now();
                match mine.call(&client, caller).await {
                    Ok(()) => latencies.push(start.elapsed()),
                    Err(e) => {
                        // Stop every caller: no more numbers are handed out.
                        next.store(n, Ordering::Relaxed);
                        failure = Some((index, e));
                        break;
                    }
                }
            }
            (mine, latencies, failure)
        }));
    }
    let mut all = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    let mut first_failure: Option<(u64, csi_client::Error)> = None;
    let mut died = false;
    for task in tasks {
        match task.await {
            Ok((mine, latencies, failure)) => {
                plan.absorb(mine);
                all.extend(latencies);
                if let Some((index, e)) = failure
                    && first_failure.as_ref().is_none_or(|(i, _)| index < *i)
                {
                    first_failure = Some((index, e));
                }
            }
            Err(_) => died = true,
        }
    }
    if let Some((index, source)) = first_failure {
        return Err(BenchError::Call {
            rpc,
            phase: label,
            index,
            source: Box::new(source),
        });
    }
    if died {
        return Err(BenchError::CallerTask { rpc });
    }
    Ok(all)
}
