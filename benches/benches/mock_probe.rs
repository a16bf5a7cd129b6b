//! Probe against the csi-testkit mock over a real unix socket, through csi-client: one caller,
//! and 32 concurrent callers sharing one client (issue 3: at least 25,000 Probe/s at 32
//! callers on two cores).
//!
//! `cargo bench -p csi-benches --bench mock_probe`. The mock runs in this process, on the same
//! runtime as the callers, as `csi-bench --mock` does.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use csi_benches::target::{Target, TargetSpec};

fn probe(c: &mut Criterion) {
    let rt = csi_benches::runtime().expect("bench set-up: a tokio runtime starts");
    let target = rt
        .block_on(Target::start(&TargetSpec::Mock))
        .expect("bench set-up: the mock plugin starts on a temporary socket");
    let client = target.client();
    rt.block_on(client.identity().probe())
        .expect("bench set-up: the mock answers Probe");

    let mut group = c.benchmark_group("mock_probe");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(1));
    for callers in [1u64, 32] {
        group.bench_function(format!("callers_{callers}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let next = Arc::new(AtomicU64::new(0));
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..callers)
                        .map(|_| {
                            let client = client.clone();
                            let next = Arc::clone(&next);
                            tokio::spawn(async move {
                                while next.fetch_add(1, Ordering::Relaxed) < iters {
                                    client
                                        .identity()
                                        .probe()
                                        .await
                                        .expect("the mock answers every Probe");
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("a caller task finishes");
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();
    drop(client);
    rt.block_on(target.stop())
        .expect("the mock plugin stops cleanly");
}

criterion_group!(benches, probe);
criterion_main!(benches);
