//! Watching during the run: the agent's view of every volume and the mock's publications,
//! sampled, must never show two writers on a single-writer volume (nor a writer on a
//! reader-only one); and the mock's call log, drained now and then so that it stays small,
//! counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use csi_agent::ops::api::VolumeView;
use csi_testkit::{MockPlugin, RecordedOutcome};

use super::control::Control;
use super::{Access, Volume};

/// How often the views are sampled.
const SAMPLE: Duration = Duration::from_millis(50);
/// How often the mock's call log is drained.
const DRAIN: Duration = Duration::from_secs(1);

/// The mock's calls, counted.
#[derive(Debug, Default)]
pub(crate) struct MockCalls {
    pub(crate) total: u64,
    /// ABORTED answers per rpc.
    pub(crate) aborted: BTreeMap<&'static str, u64>,
}

impl MockCalls {
    /// Counts and forgets what the mock logged since the last drain. A call still in flight
    /// is counted now, its outcome unknown: the mock decides ABORTED as the call arrives and
    /// records it a moment later, so only a drain landing in those microseconds misses one.
    fn drain(&mut self, mock: &MockPlugin) {
        for record in mock.calls().drain().into_records() {
            self.total += 1;
            if let RecordedOutcome::Failed {
                code: csi_client::Code::Aborted,
                ..
            } = record.outcome
            {
                *self.aborted.entry(record.rpc.name()).or_default() += 1;
            }
        }
    }

    pub(crate) fn aborted_total(&self) -> u64 {
        self.aborted.values().sum()
    }
}

/// What the watcher saw.
#[derive(Debug, Default)]
pub(crate) struct Watched {
    /// Each distinct violation once, with how many samples showed it.
    pub(crate) violations: BTreeMap<String, u64>,
    pub(crate) agent_samples: u64,
    pub(crate) mock_samples: u64,
    pub(crate) calls: MockCalls,
}

impl Watched {
    /// The violations, for the report.
    pub(crate) fn violation_lines(&self) -> Vec<String> {
        self.violations
            .iter()
            .map(|(v, n)| format!("{v} (in {n} sample(s))"))
            .collect()
    }

    /// Drains the rest of the mock's call log.
    pub(crate) fn finish(&mut self, mock: &MockPlugin) {
        self.calls.drain(mock);
    }
}

/// The running watcher.
pub(crate) struct Watcher {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Watched>,
}

impl Watcher {
    pub(crate) fn start(control: Control, mock: MockPlugin, volumes: Arc<[Volume]>) -> Watcher {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut w = Watched::default();
            let mut tick = tokio::time::interval(SAMPLE);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut drained = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {}
                }
                mock_sample(&mock, &volumes, &mut w);
                if let Ok(all) = control.get::<Vec<VolumeView>>("/v1/volumes").await {
                    agent_sample(&all, &volumes, &mut w);
                }
                if drained.elapsed() >= DRAIN {
                    w.calls.drain(&mock);
                    drained = tokio::time::Instant::now();
                }
            }
            w
        });
        Watcher { stop, task }
    }

    pub(crate) async fn stop(self) -> Watched {
        let _ = self.stop.send(true);
        self.task.await.expect("the watcher does not panic")
    }
}

/// The mock's node publications: at most one per single-writer volume (its clients only
/// write, so each publication is a writer's).
fn mock_sample(mock: &MockPlugin, volumes: &[Volume], w: &mut Watched) {
    w.mock_samples += 1;
    let mut by_volume: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in mock.published() {
        by_volume
            .entry(p.volume_id)
            .or_default()
            .insert(p.path.display().to_string());
    }
    for v in volumes.iter().filter(|v| v.access == Access::SingleWriter) {
        if let Some(paths) = by_volume.get(&v.external_id)
            && paths.len() > 1
        {
            *w.violations
                .entry(format!(
                    "the mock published single-writer volume {} ({}) for two writers at once: {paths:?}",
                    v.id, v.external_id
                ))
                .or_default() += 1;
        }
    }
}

/// The agent's claims: at most one writer on a single-writer volume, none on a reader-only.
fn agent_sample(all: &[VolumeView], volumes: &[Volume], w: &mut Watched) {
    w.agent_samples += 1;
    for view in all {
        let Some(volume) = volumes.iter().find(|v| v.id == view.id) else {
            continue;
        };
        let writers: Vec<String> = view
            .claims
            .iter()
            .filter(|c| c.mode == "write")
            .map(|c| format!("{}:{}", c.workload, c.state))
            .collect();
        let allowed = match volume.access {
            Access::SingleWriter => 1,
            Access::ReaderOnly => 0,
            Access::MultiWriter => usize::MAX,
        };
        if writers.len() > allowed {
            *w.violations
                .entry(format!(
                    "the agent shows {} writer(s) on {} volume {}: {writers:?}",
                    writers.len(),
                    volume.access.wire(),
                    volume.id
                ))
                .or_default() += 1;
        }
    }
}

#[test]
fn two_writers_on_a_single_writer_volume_are_seen() {
    use super::check::claim_view;
    let volume = |id: &str, access| Volume {
        id: id.into(),
        external_id: format!("ext-{id}"),
        access,
    };
    let volumes = [
        volume("sw-0", Access::SingleWriter),
        volume("ro-1", Access::ReaderOnly),
        volume("mw-2", Access::MultiWriter),
    ];
    let view = |id: &str, claims: Vec<_>| VolumeView {
        id: id.into(),
        external_id: format!("ext-{id}"),
        plugin: "mock".into(),
        access_mode: "x".into(),
        attachment: "mount".into(),
        controller_publish: true,
        created: true,
        secret_names: Vec::new(),
        capacity_bytes: None,
        accessible_topology: Vec::new(),
        node_expansion_pending: false,
        claims,
        release: None,
        calls_in_flight: Vec::new(),
        may_exist: None,
        health: None,
        waiting: Vec::new(),
    };
    let fine = [
        view(
            "sw-0",
            vec![
                claim_view("sw-0", "a", "write", "taken"),
                claim_view("sw-0", "b", "read", "taken"),
            ],
        ),
        view("ro-1", vec![claim_view("ro-1", "a", "read", "taken")]),
        view(
            "mw-2",
            vec![
                claim_view("mw-2", "a", "write", "taken"),
                claim_view("mw-2", "b", "write", "taken"),
            ],
        ),
    ];
    let mut w = Watched::default();
    agent_sample(&fine, &volumes, &mut w);
    assert!(w.violations.is_empty(), "{:?}", w.violations);

    let bad = [
        view(
            "sw-0",
            vec![
                claim_view("sw-0", "a", "write", "releasing"),
                claim_view("sw-0", "b", "write", "taken"),
            ],
        ),
        view("ro-1", vec![claim_view("ro-1", "a", "write", "taken")]),
    ];
    agent_sample(&bad, &volumes, &mut w);
    agent_sample(&bad, &volumes, &mut w);
    let lines = w.violation_lines();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines.iter().all(|l| l.contains("in 2 sample(s)")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("2 writer(s)") && l.contains("sw-0"))
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("1 writer(s)") && l.contains("ro-1"))
    );
}
