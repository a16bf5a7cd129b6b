//! Claims: state transitions of the pure release machine in memory (issue 5: over one million
//! per second on one core), and commits per second of the durable redb store.
//!
//! `cargo bench -p csi-benches --bench claims`. Releasing 10,000 claims across 100 volumes
//! against the mock plugin, and memory per 10,000 claims, are one-shot measurements of
//! `csi-bench` (`--claims-release`, `--claims-memory`): see `benches/README.md`.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use csi_benches::claims::{Cycle, claim_request, plugin_node, volume_info};
use csi_claims::store::{ClaimStore, RedbStore, Version};
use csi_claims::{Action, MachineConfig, ReleaseMachine};
use csi_structs::AccessMode;
use tokio::time::Instant;

/// Volumes per cycle: each gets one claim, which is made durable, released and freed.
const VOLUMES: usize = 100;

fn machine(c: &mut Criterion) {
    let cycle = Cycle::new(VOLUMES).expect("bench set-up: valid ids");
    let mut m = ReleaseMachine::new(MachineConfig::with_seed(7));
    let now = Instant::now();
    let inputs = cycle
        .run(&mut m, now)
        .expect("bench set-up: claims on free volumes are admitted");
    let mut group = c.benchmark_group("claims_machine");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(inputs));
    group.bench_function(
        format!("cycle_{VOLUMES}_volumes_{inputs}_transitions"),
        |b| {
            b.iter(|| {
                cycle
                    .run(&mut m, now)
                    .expect("every volume is free again after a cycle")
            });
        },
    );
    group.finish();
}

fn redb(c: &mut Criterion) {
    // A real record (one claim), as the machine asks it to be written.
    let info = volume_info(0).expect("bench set-up: valid ids");
    let node = plugin_node("node-1").expect("bench set-up: valid id");
    let request = claim_request(&info, 0, 0, &node, AccessMode::SingleNodeWriter)
        .expect("bench set-up: valid ids");
    let mut m = ReleaseMachine::new(MachineConfig::with_seed(7));
    m.claim(&info, request, Instant::now())
        .expect("bench set-up: a claim on a free volume is admitted");
    let Some(Action::Persist(write)) = m.poll_action() else {
        panic!("bench set-up: a new claim is first written to the store");
    };
    let record = write
        .record
        .expect("bench set-up: a new claim's write carries its record");

    let dir = tempfile::tempdir().expect("bench set-up: a temporary directory");
    let store = RedbStore::open(dir.path().join("claims.redb"))
        .expect("bench set-up: a new redb database opens");
    let mut version: Option<Version> = None;
    // The store's calls are async (each commit runs on the blocking pool, as in the driver).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("bench set-up: a tokio runtime");
    let mut group = c.benchmark_group("claims_redb");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(1));
    group.bench_function("compare_and_swap_commit", |b| {
        b.iter(|| {
            version = runtime
                .block_on(store.compare_and_swap(&info.id, version, Some(&record)))
                .expect("only this bench writes the store, so the version always matches");
        });
    });
    group.finish();
}

criterion_group!(benches, machine, redb);
criterion_main!(benches);
