//! Campaign `api`: a hostile operator against `csi-agent serve`'s control API.
//!
//! One agent runs in-process for the whole campaign (`csi_agent::serve::serve_until`, on a
//! temporary data directory, with csi-testkit's mock plugin in its plugin directory). Each
//! case sends one generated request (module `model`) on a connection of its own: a route with path
//! ids that are valid, hostile but valid, or not ids at all, and for the routes that take one
//! a JSON body whose fields are valid or broken one at a time (a wrong JSON type, a missing
//! required field, an unknown field, a value the rules refuse), or a body that is not the
//! JSON object asked for (empty, not JSON, nested 20,000 deep, not UTF-8, over 1 MiB).
//!
//! Properties: an answer comes (no hang, no dropped connection) and is never a 500; every
//! error answer is the API's JSON error with a kind and a message of at most 2 KiB; a body with
//! one broken field is refused with a 4xx whose message names that field; a body whose fields
//! are all valid is never refused as a bad request; a refused register, create or claim leaves
//! no volume or claim behind; no panic; no secret value sent in a body comes back in an answer
//! or reaches a log line.

mod model;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_agent::config::{AgentConfig, ConfigArgs};
use csi_agent::ops::api::{AgentInfo, ApiError, VolumeView};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tokio::runtime::Runtime;

use self::model::{Case, KEPT_VOLUME, MARKER};
use crate::report::{Plan, Report};
use crate::rng::Rng;
use crate::{logs, panics};

/// The campaign's name on the command line and in its report line.
pub const NAME: &str = "api";

/// What the campaign covers, for `--list` and RELIABILITY.md.
pub const COVERS: &str = "hostile operator -> csi-agent serve's control API (in-process, mock plugin): generated routes and methods, path ids (valid, hostile-but-valid, empty, too long, broken escapes), JSON bodies for every route with one field broken at a time (wrong type, missing, unknown, refused value), and bodies that are not the object asked for (empty, not JSON, deep nesting, not UTF-8, over 1 MiB); secrets in bodies";

const COUNTERS: &[&str] = &[
    "panics",
    "hangs",
    "server_errors",
    "unclear_errors",
    "refused_wrongly",
    "accepted_wrongly",
    "wrote_wrongly",
    "leaked_secrets",
];

/// The longest error message accepted as clear, in bytes.
const MAX_ERROR_BYTES: usize = 2048;

/// How long one request may take before it counts as a hang (claims publish through the mock).
const HANG: Duration = Duration::from_secs(30);

/// The agent under test.
struct Agent {
    runtime: Runtime,
    _tmp: tempfile::TempDir,
    http: SocketAddr,
    token: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _mock: csi_testkit::MockServer,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// An answer: status and body.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

fn setup() -> Result<Agent, String> {
    let tmp = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let data = tmp.path().join("data");
    let plugins = tmp.path().join("plugins");
    std::fs::create_dir(&plugins).map_err(|e| format!("plugin dir: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let mock = csi_testkit::MockPlugin::builder()
        .node_id("n1")
        .build()
        .map_err(|e| format!("mock: {e}"))?;
    let server = runtime
        .block_on(mock.serve_unix(plugins.join("mock.sock")))
        .map_err(|e| format!("mock socket: {e}"))?;
    let args = ConfigArgs {
        node_id: Some("n1".into()),
        data_dir: Some(data.clone()),
        plugin_dir: Some(plugins),
        listen: Some("127.0.0.1:0".into()),
        scan_interval: Some("100ms".into()),
        health_interval: Some("200ms".into()),
        release_backoff_initial: Some("10ms".into()),
        release_backoff_max: Some("100ms".into()),
        ..ConfigArgs::default()
    };
    let config = AgentConfig::load(&args).map_err(|e| format!("config: {e}"))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    runtime.spawn(async move {
        let stop = async {
            let _ = stopped.await;
            Ok(())
        };
        if let Err(e) = csi_agent::serve::serve_until(config, stop).await {
            eprintln!("campaign api: the agent stopped: {e}");
        }
    });
    let (http, token) = wait_for_agent(&data)?;
    let agent = Agent {
        runtime,
        _tmp: tmp,
        http,
        token,
        stop: Some(stop),
        _mock: server,
    };
    // The plugin fingerprinted and healthy, and the kept volume there.
    let ready = Instant::now() + Duration::from_secs(30);
    loop {
        let plugins = agent.send("GET", "/v1/plugins", None)?;
        let text = String::from_utf8_lossy(&plugins.body);
        if text.contains("\"healthy\"") {
            break;
        }
        if Instant::now() > ready {
            return Err(format!("the mock plugin never became healthy: {text}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.keep_volume()?;
    Ok(agent)
}

fn wait_for_agent(data: &Path) -> Result<(SocketAddr, String), String> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let (Ok(info), Ok(token)) = (
            std::fs::read(data.join("agent.json")),
            std::fs::read_to_string(data.join("control.token")),
        ) && let Ok(info) = serde_json::from_slice::<AgentInfo>(&info)
            && let Ok(http) = info.http.parse()
        {
            return Ok((http, token.trim().to_owned()));
        }
        if Instant::now() > until {
            return Err(format!("no agent.json in {} after 30 s", data.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Agent {
    /// Sends one request on a connection of its own; `Err` when no answer came.
    fn send(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Answer, String> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "localhost")
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                body.map(<[u8]>::to_vec).unwrap_or_default(),
            )))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let http = self.http;
        self.runtime.block_on(async move {
            let exchange = async {
                let stream = tokio::net::TcpStream::connect(http)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .map_err(|e| format!("handshake: {e}"))?;
                tokio::spawn(connection);
                let answer = sender
                    .send_request(request)
                    .await
                    .map_err(|e| format!("no answer: {e}"))?;
                let status = answer.status().as_u16();
                let body = answer
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("answer body cut: {e}"))?
                    .to_bytes()
                    .to_vec();
                Ok(Answer { status, body })
            };
            match tokio::time::timeout(HANG, exchange).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("hang: no answer within {HANG:?}")),
            }
        })
    }

    fn volumes(&self) -> Result<Vec<VolumeView>, String> {
        let answer = self.send("GET", "/v1/volumes", None)?;
        serde_json::from_slice(&answer.body).map_err(|e| format!("GET /v1/volumes: {e}"))
    }

    /// Makes sure the kept volume exists, with no claim (a case may have removed or claimed it).
    fn keep_volume(&self) -> Result<(), String> {
        let volumes = self.volumes()?;
        if let Some(v) = volumes.iter().find(|v| v.id == KEPT_VOLUME) {
            for claim in &v.claims {
                let body = serde_json::json!({ "workload": claim.workload }).to_string();
                let path = format!("/v1/volumes/{KEPT_VOLUME}/release");
                let _ = self.send("POST", &path, Some(body.as_bytes()));
            }
            return Ok(());
        }
        let body = serde_json::json!({
            "id": KEPT_VOLUME,
            "plugin": "mock",
            "capacity_bytes": 1 << 20,
            "access_mode": "multi-node-multi-writer",
            "attachment": "mount",
        })
        .to_string();
        let answer = self.send("POST", "/v1/volumes/create", Some(body.as_bytes()))?;
        if answer.status == 200 {
            Ok(())
        } else {
            Err(format!(
                "cannot create the kept volume: {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ))
        }
    }
}

/// Runs the campaign.
pub fn run(plan: &Plan) -> Report {
    let mut report = Report::new(NAME, plan, COUNTERS);
    panics::install_hook();
    logs::capture();
    let agent = match setup() {
        Ok(a) => a,
        Err(e) => {
            report.violation("server_errors", 0, format!("cannot start the agent: {e}"));
            return report;
        }
    };
    let _ = logs::take();
    for index in plan.indices() {
        if plan.out_of_time() {
            report.stopped_by_budget();
            break;
        }
        let panics_before = panics::count();
        let mut rng = Rng::for_case(plan.seed, index);
        let case = model::case(&mut rng);
        plan.trace(index, format_args!("{} {}", case.method, shown(&case.path)));
        one(&agent, &case, &mut report, index);
        if panics::count() > panics_before {
            report.violation(
                "panics",
                index,
                format_args!("{} {}", case.method, shown(&case.path)),
            );
        }
        let log = logs::take();
        if log.contains(MARKER) {
            report.violation(
                "leaked_secrets",
                index,
                "a secret value sent in a body reached a log line",
            );
        }
        if let Err(e) = agent.keep_volume() {
            report.violation("server_errors", index, e);
            break;
        }
        report.case_done();
    }
    report
}

/// The path as shown in a failure line (at most 120 bytes).
fn shown(path: &str) -> String {
    let mut cut = path.len().min(120);
    while !path.is_char_boundary(cut) {
        cut -= 1;
    }
    if cut < path.len() {
        format!("{}… ({} bytes)", &path[..cut], path.len())
    } else {
        path.to_owned()
    }
}

fn one(agent: &Agent, case: &Case, report: &mut Report, index: u64) {
    let what = format!("{} {}", case.method, shown(&case.path));
    let before = match (&case.creates, &case.claims) {
        (None, None) => None,
        _ => agent.volumes().ok(),
    };
    let answer = match agent.send(case.method, &case.path, case.body.as_deref()) {
        Ok(a) => a,
        Err(e) if e.starts_with("hang") => {
            report.violation("hangs", index, format_args!("{what}: {e}"));
            return;
        }
        Err(e) => {
            report.violation("server_errors", index, format_args!("{what}: {e}"));
            return;
        }
    };
    let text = String::from_utf8_lossy(&answer.body).into_owned();
    if text.contains(MARKER) {
        report.violation(
            "leaked_secrets",
            index,
            format_args!("{what}: an answer holds a secret value sent"),
        );
    }
    if answer.status == 500 {
        report.violation(
            "server_errors",
            index,
            format_args!("{what}: 500 {}", shown(&text)),
        );
        return;
    }
    let ok = (200..300).contains(&answer.status);
    if !ok {
        match serde_json::from_slice::<ApiError>(&answer.body) {
            Ok(e)
                if !e.kind.is_empty()
                    && !e.error.is_empty()
                    && e.error.len() <= MAX_ERROR_BYTES =>
            {
                if let Some(field) = case.broken.as_deref().filter(|f| !f.is_empty())
                    && !e.error.contains(field)
                    && !case.refusable.is_some_and(|r| e.error.contains(r))
                    && answer.status == 400
                    && !path_is_broken(&case.path)
                {
                    report.violation(
                        "unclear_errors",
                        index,
                        format_args!(
                            "{what}: the broken field {field} is not named: {}",
                            shown(&e.error)
                        ),
                    );
                }
                if case.valid_body
                    && answer.status == 400
                    && e.kind == "bad_request"
                    && !path_is_broken(&case.path)
                    && !case.refusable.is_some_and(|r| e.error.contains(r))
                {
                    report.violation(
                        "refused_wrongly",
                        index,
                        format_args!("{what}: a valid body refused: {}", shown(&e.error)),
                    );
                }
            }
            _ => report.violation(
                "unclear_errors",
                index,
                format_args!(
                    "{what}: {} without a clear JSON error: {}",
                    answer.status,
                    shown(&text)
                ),
            ),
        }
    } else if case.broken.is_some() || case.refusable.is_some() {
        report.violation(
            "accepted_wrongly",
            index,
            format_args!(
                "{what}: accepted with broken field {:?} (or the refused combination {:?})",
                case.broken, case.refusable
            ),
        );
    }
    if !ok {
        check_nothing_written(agent, case, before.as_deref(), report, index, &what);
    }
}

/// A path with an id that cannot be decoded, is too long for any id or cannot name a
/// directory: a refusal of the request may be about the path rather than the body.
fn path_is_broken(path: &str) -> bool {
    path.split('/').skip(1).any(|segment| {
        segment.len() > 128
            || csi_agent::ops::api::decode_segment(segment).is_none_or(|s| !model::segment_ok(&s))
    })
}

fn check_nothing_written(
    agent: &Agent,
    case: &Case,
    before: Option<&[VolumeView]>,
    report: &mut Report,
    index: u64,
    what: &str,
) {
    let Some(before) = before else { return };
    let Ok(after) = agent.volumes() else { return };
    if let Some(id) = &case.creates
        && !before.iter().any(|v| &v.id == id)
        && after.iter().any(|v| &v.id == id)
    {
        report.violation(
            "wrote_wrongly",
            index,
            format_args!("{what}: refused, yet volume {} exists", shown(id)),
        );
    }
    if let Some((volume, workload)) = &case.claims {
        let held = |list: &[VolumeView]| {
            list.iter()
                .filter(|v| {
                    csi_agent::ops::api::encode_segment(&v.id) == *volume || &v.id == volume
                })
                .any(|v| v.claims.iter().any(|c| &c.workload == workload))
        };
        if !held(before) && held(&after) {
            report.violation(
                "wrote_wrongly",
                index,
                format_args!(
                    "{what}: refused, yet workload {} holds a claim",
                    shown(workload)
                ),
            );
        }
    }
}
