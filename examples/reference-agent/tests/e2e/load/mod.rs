//! Load and crash: N clients loop claim → release (waiting for the release to finish) against
//! one `csi-agent serve` over the in-process mock plugin, while the agent is SIGKILLed K times
//! at moments chosen from a seed and started again on the same data directory. Then the
//! acknowledged operations are checked against what the agent and the mock hold.
//!
//! What must hold (each a check that fails the test, all listed together with the seed):
//!
//! - every acknowledged claim that was not released is there, `taken`, after the run and one
//!   more SIGKILL and restart;
//! - every acknowledged release ends freed, and no refused or failed claim is left behind;
//! - never two writers at once on a single-writer volume, neither in the agent's view
//!   (`GET /v1/volumes`, sampled during the run) nor in the mock's publications (sampled);
//!   never a writer on a reader-only volume;
//! - after the run, the mock publishes each acknowledged claim held at its target path,
//!   stages and attaches its volume, and publishes, stages or attaches nothing without a claim;
//! - after everything still claimed is released and the agent is quiet, the mock holds no
//!   publication, staging or controller attachment, and the agent shows no claim, no stuck
//!   release and no uncertain publication;
//! - a request without an answer (a connection cut) only happens while the agent is killed.
//!
//! A request cut by a kill has an unknown outcome; its client waits for the agent to be back
//! and looks at the volume: a claim found `taken` is held (and released like any other), one
//! found releasing is waited for, one not found was never made. A release found still `taken`
//! is sent again.
//!
//! Printed (run with `--nocapture` to see it): the requests answered and unknown, the kills,
//! the ABORTED answers of the mock (from its call log) and the claim latency p50/p99 per
//! access mode. Latencies and ABORTED answers are measured, never asserted.
//!
//! Small by default, for CI. Environment variables make it longer or harder:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `CSI_LOAD_SECS` | how long the clients run, in seconds | 10 |
//! | `CSI_LOAD_CLIENTS` | concurrent clients | 8 |
//! | `CSI_LOAD_VOLUMES` | volumes, access modes in turn: single-node-writer, multi-node-reader-only, multi-node-multi-writer | 6 |
//! | `CSI_LOAD_KILLS` | SIGKILLs during the run (0: none, and no final one either) | 2 |
//! | `CSI_LOAD_SEED` | the seed of every choice (volumes, modes, kill moments) | from the clock, printed |
//! | `CSI_LOAD_LOG` | the agent's `--log` filter | `warn` |
//!
//! ```sh
//! CSI_LOAD_SECS=120 CSI_LOAD_CLIENTS=16 CSI_LOAD_KILLS=5 \
//!     cargo test -p csi-agent --test e2e load:: -- --nocapture
//! ```

mod check;
mod client;
mod control;
mod report;
mod watch;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_agent::ops::api::{CreateVolume, ReleaseVolume, StatusView, VolumeView};
use csi_testkit::MockPlugin;
use hyper::Method;

use crate::serve::{GUARD, Serve, eventually, fast_backoff};
use client::{Expect, Key, Tally};
use control::{Answer, Control};
use report::{Report, Rng};

/// The run's size, from the environment.
#[derive(Clone, Debug)]
struct Settings {
    secs: u64,
    clients: usize,
    volumes: usize,
    kills: usize,
    seed: u64,
    log: String,
}

impl Settings {
    fn from_env() -> Settings {
        let seed = number("CSI_LOAD_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
        let settings = Settings {
            secs: number("CSI_LOAD_SECS").unwrap_or(10),
            clients: number("CSI_LOAD_CLIENTS").unwrap_or(8),
            volumes: number("CSI_LOAD_VOLUMES").unwrap_or(6),
            kills: number("CSI_LOAD_KILLS").unwrap_or(2),
            seed,
            log: std::env::var("CSI_LOAD_LOG").unwrap_or_else(|_| "warn".to_owned()),
        };
        assert!(
            settings.secs >= 1 && settings.clients >= 1 && settings.volumes >= 1,
            "CSI_LOAD_SECS, CSI_LOAD_CLIENTS and CSI_LOAD_VOLUMES must be at least 1: {settings:?}"
        );
        settings
    }
}

/// An unsigned number from the environment variable `name`, if set.
fn number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a whole number")),
    )
}

/// The three access modes the clients exercise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Access {
    SingleWriter,
    ReaderOnly,
    MultiWriter,
}

impl Access {
    const ALL: [Access; 3] = [
        Access::SingleWriter,
        Access::ReaderOnly,
        Access::MultiWriter,
    ];

    /// The name the control API takes.
    fn wire(self) -> &'static str {
        match self {
            Access::SingleWriter => "single-node-writer",
            Access::ReaderOnly => "multi-node-reader-only",
            Access::MultiWriter => "multi-node-multi-writer",
        }
    }
}

/// One volume of the run.
#[derive(Clone, Debug)]
pub(crate) struct Volume {
    id: String,
    external_id: String,
    access: Access,
}

/// How a run ended: the agent still running, its clients' tallies and the kills made.
struct Ran {
    agent: Serve,
    tallies: Vec<Tally>,
    kills: Vec<Duration>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_claims_and_releases_survive_load_and_sigkills() {
    let settings = Settings::from_env();
    println!(
        "load: seed={} secs={} clients={} volumes={} kills={} (CSI_LOAD_SEED={} repeats the choices)",
        settings.seed,
        settings.secs,
        settings.clients,
        settings.volumes,
        settings.kills,
        settings.seed
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.path().join("data");
    let mock = MockPlugin::builder().build().expect("default mock");
    let _server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("mock serves");
    let mut args = fast_backoff(&plugins);
    args.extend(["--log".to_owned(), settings.log.clone()]);
    let mut agent = Serve::start(dir.path(), "agent-0", &data, &args);
    agent.ready().await;
    let control = Control::new(&data);
    fingerprinted(&control).await;
    let volumes = create_volumes(&control, settings.volumes).await;

    let watcher = watch::Watcher::start(control.clone(), mock.clone(), volumes.clone());
    let started = Instant::now();
    let ran = run(&settings, dir.path(), &args, agent, &control, &volumes).await;
    let run_time = started.elapsed();
    let Ran {
        mut agent,
        tallies,
        kills,
    } = ran;

    // One more crash: what was acknowledged must be in the store, not only in memory.
    let final_kill = settings.kills > 0;
    if final_kill {
        control.life.killing();
        agent.kill();
        agent = Serve::start(dir.path(), "agent-final", &data, &args);
        agent.ready().await;
        control.life.ready();
    }
    let (settled, mut violations) = check::quiet(&control).await;
    let mut watched = watcher.stop().await;
    violations.extend(watched.violation_lines());
    for t in &tallies {
        violations.extend(t.violations.iter().cloned());
    }
    let ledger: Vec<(Key, Expect)> = tallies.iter().flat_map(|t| t.ledger.clone()).collect();
    violations.extend(check::against_ledger(&ledger, &settled));
    let mock_view = check::MockView::of(&mock, &volumes);
    violations.extend(check::against_mock(&ledger, &settled, &mock_view, &volumes));

    // Release everything still held; then nothing may be left anywhere.
    let held: Vec<&Key> = ledger
        .iter()
        .filter(|(_, e)| e.is_held())
        .map(|(k, _)| k)
        .collect();
    for key in &held {
        let path = format!("/v1/volumes/{}/release", key.volume);
        let body = ReleaseVolume {
            workload: key.workload.clone(),
        };
        let answer: Answer<VolumeView> = control.call(Method::POST, &path, Some(&body)).await;
        if !matches!(answer, Answer::Ok(_)) {
            violations.push(format!("the release of held claim {key}: {answer:?}"));
        }
    }
    let (_, unsettled) = check::quiet(&control).await;
    violations.extend(unsettled);
    let status: StatusView = control.get("/v1/status").await.expect("status");
    violations.extend(check::agent_leftovers(&status));
    let mock_view = check::MockView::of(&mock, &volumes);
    violations.extend(check::against_mock(&[], &[], &mock_view, &volumes));
    watched.finish(&mock);
    assert_eq!(agent.terminate(), Some(0), "the agent stops cleanly");

    Report {
        settings_line: format!(
            "seed={} secs={} clients={} volumes={} kills={}",
            settings.seed, settings.secs, settings.clients, settings.volumes, settings.kills
        ),
        run_time,
        tallies: &tallies,
        kills: &kills,
        final_kill,
        held_at_end: held.len(),
        watched: &watched,
        volumes: &volumes,
    }
    .print();
    assert!(
        violations.is_empty(),
        "{} violation(s) (CSI_LOAD_SEED={} repeats the choices):\n{}",
        violations.len(),
        settings.seed,
        violations.join("\n")
    );
}

/// Waits for the mock to be fingerprinted by the agent.
async fn fingerprinted(control: &Control) {
    eventually("the plugin is fingerprinted", async || {
        let status: StatusView = control.get("/v1/status").await.ok()?;
        status
            .plugins
            .iter()
            .any(|p| p.id == "mock" && p.fingerprints >= 1)
            .then_some(())
    })
    .await;
}

/// Creates `count` volumes, the access modes in turn.
async fn create_volumes(control: &Control, count: usize) -> Arc<[Volume]> {
    let mut volumes = Vec::with_capacity(count);
    for i in 0..count {
        let access = Access::ALL[i % Access::ALL.len()];
        let id = format!("{}-{i}", short(access));
        let create = CreateVolume {
            id: id.clone(),
            plugin: "mock".into(),
            capacity_bytes: 1 << 20,
            access_mode: access.wire().into(),
            attachment: "mount".into(),
            parameters: Default::default(),
            secrets: Default::default(),
            requisite_topology: Vec::new(),
            preferred_topology: Vec::new(),
            snapshot: None,
            clone: None,
        };
        let created: VolumeView = match control
            .call(Method::POST, "/v1/volumes/create", Some(&create))
            .await
        {
            Answer::Ok(v) => v,
            other => panic!("creating {id}: {other:?}"),
        };
        volumes.push(Volume {
            id,
            external_id: created.external_id,
            access,
        });
    }
    volumes.into()
}

fn short(access: Access) -> &'static str {
    match access {
        Access::SingleWriter => "sw",
        Access::ReaderOnly => "ro",
        Access::MultiWriter => "mw",
    }
}

/// Runs the clients and, beside them, the kills; returns when every client stopped.
async fn run(
    settings: &Settings,
    dir: &Path,
    args: &[String],
    agent: Serve,
    control: &Control,
    volumes: &Arc<[Volume]>,
) -> Ran {
    let length = Duration::from_secs(settings.secs);
    let start = tokio::time::Instant::now();
    let deadline = start + length;
    let mut rng = Rng::new(settings.seed);
    // Kill moments between 10 % and 90 % of the run, in order.
    let mut moments: Vec<Duration> = (0..settings.kills)
        .map(|_| length.mul_f64(0.1 + 0.8 * rng.unit()))
        .collect();
    moments.sort();

    let clients: Vec<_> = (0..settings.clients)
        .map(|i| {
            let client = client::Client {
                id: i,
                rng: Rng::new(settings.seed ^ (i as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
                volumes: volumes.clone(),
                control: control.clone(),
                deadline,
            };
            tokio::spawn(client.run())
        })
        .collect();

    let killer = {
        let control = control.clone();
        let dir = dir.to_owned();
        let args = args.to_vec();
        let data = control.data().to_owned();
        let moments = moments.clone();
        tokio::spawn(async move {
            let mut agent = agent;
            for (n, moment) in moments.iter().enumerate() {
                tokio::time::sleep_until(start + *moment).await;
                control.life.killing();
                agent.kill();
                agent = Serve::start(&dir, &format!("agent-{}", n + 1), &data, &args);
                agent.ready().await;
                control.life.ready();
            }
            agent
        })
    };

    let mut tallies = Vec::with_capacity(clients.len());
    for c in clients {
        tallies.push(c.await.expect("a client task does not panic"));
    }
    let agent = killer.await.expect("the killer task does not panic");
    Ran {
        agent,
        tallies,
        kills: moments,
    }
}

/// How long to wait between polls of a release; only paces the polling.
pub(crate) const RELEASE_POLL: Duration = Duration::from_millis(10);

/// Hang guard of one client's wait for its release.
pub(crate) const RELEASE_GUARD: Duration = GUARD;
