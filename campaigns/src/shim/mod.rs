//! Campaign `shim`: a hostile peer against csi-rpc-shim's agent server.
//!
//! Two agents run in the process over loopback TCP, each with `CountingPlugins`: `b`, under
//! test, and `c`, which `b` relays to. A raw HTTP/2 client sends `b` generated calls of every
//! RPC of the agent protocol, with good, forged, borrowed, stale and garbled credentials, odd
//! hop counts and timeouts, and field values that are ordinary, hostile but valid, or invalid;
//! undecodable bodies in correct frames; broken frames, unknown paths and encodings, oversized
//! messages and headers; garbage on a raw TCP connection; and slow peers that send headers (or
//! half a frame) and then nothing.
//!
//! For every case, the properties are: the agent answers with the error the protocol
//! prescribes (or serves the call, when everything is right), no panic anywhere in the
//! process, every call ends by its deadline (and a hung plugin call is dropped then), the
//! plugins are reached exactly when the call is served and on the right node for the
//! authenticated caller, and no secret value or token shows up in an answer or a log line.

mod call;
mod fake;
mod fields;
mod h2;
mod odd;
mod peer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_rpc_shim::auth::{NODE_HEADER, TOKEN_HEADER};
use csi_rpc_shim::wire::pb;
use csi_rpc_shim::{
    Credentials, Health, Instance, Registry, Routes, Scope, Shim, ShimConfig, Token, TokenBook,
};
use csi_structs::{NodeId, PluginId, PluginNodeId};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use self::call::{
    Call, Creds, Expect, Hops, NODES, PEER, RETIRED, SERVER, plugin_node_of, token_of,
};
use self::fake::{CountingPlugins, PLUGIN, SICK_PLUGIN};
use self::fields::MARKER;
use self::h2::{Answer, Body, Conn};
use self::odd::{Odd, Slow};
use crate::report::{Plan, Report};
use crate::rng::Rng;
use crate::{logs, panics};

/// The campaign's name on the command line and in its report line.
pub const NAME: &str = "shim";

/// What the campaign covers, for `--list` and RELIABILITY.md.
pub const COVERS: &str = "hostile peer -> csi-rpc-shim's agent server: generated calls of every RPC with forged, replayed, stale and garbled credentials, node-scoped callers acting for other nodes, odd hop counts and timeouts, invalid and hostile-but-valid fields; undecodable bodies; broken gRPC frames, unknown paths, oversized messages and headers; TCP garbage; slow peers";

/// The violation counters, in the order they print.
const COUNTERS: &[&str] = &[
    "panics",
    "hangs",
    "refused_wrongly",
    "accepted_wrongly",
    "reached_plugin_wrongly",
    "leaked_secrets",
];

/// The agents' cap on a call received without a usable `grpc-timeout`.
const MAX_REMOTE: Duration = Duration::from_secs(5);
/// Added to every deadline before a call that has not ended counts as a hang: a generous upper
/// bound for a loaded machine, never a timing target.
const SLACK: Duration = Duration::from_secs(15);

/// One agent of the campaign's cluster.
struct Agent {
    shim: Shim,
    plugins: Arc<CountingPlugins>,
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

/// The cluster: `b` under test and `c`, which `b` relays to.
struct World {
    b: Agent,
    c: Agent,
    run: u64,
}

fn node(id: &str) -> Result<NodeId, String> {
    NodeId::new(id).map_err(|e| e.to_string())
}

fn token(node: &str, generation: u8, run: u64) -> Result<Token, String> {
    Token::new(token_of(node, generation, run)).map_err(|e| e.to_string())
}

impl World {
    async fn start(run: u64) -> Result<World, String> {
        let registry = Arc::new(Registry::new());
        let plugin = PluginId::new(PLUGIN).map_err(|e| e.to_string())?;
        let sick = PluginId::new(SICK_PLUGIN).map_err(|e| e.to_string())?;
        for n in ["a", "b", "c"] {
            let plugin_node = PluginNodeId::new(plugin_node_of(n)).map_err(|e| e.to_string())?;
            for p in [&plugin, &sick] {
                registry.update(
                    &node(n)?,
                    p,
                    Instance::Node {
                        plugin_node: plugin_node.clone(),
                        health: Health::Healthy,
                    },
                );
            }
            registry.update(&node(n)?, &plugin, Instance::Controller(Health::Healthy));
        }
        // Every node's first token, and a node that will leave; then the rotation.
        let mut book = TokenBook::new();
        for (n, cluster) in NODES {
            let scope = if *cluster {
                Scope::Cluster
            } else {
                Scope::Node
            };
            book.insert(node(n)?, token(n, 0, run)?, scope);
        }
        book.insert(node(RETIRED)?, token(RETIRED, 1, run)?, Scope::Cluster);
        let mut rotated = book.clone();
        for (n, cluster) in NODES {
            let scope = if *cluster {
                Scope::Cluster
            } else {
                Scope::Node
            };
            rotated.insert(node(n)?, token(n, 1, run)?, scope);
        }
        rotated.remove(&node(RETIRED)?);

        // The hostile agent: the only controller of its plugin, reached from `b` directly.
        let hostile = peer::start().await.map_err(|e| e.to_string())?;
        registry.update(
            &node(peer::HOSTILE)?,
            &PluginId::new(peer::REMOTE_PLUGIN).map_err(|e| e.to_string())?,
            Instance::Controller(Health::Healthy),
        );

        let lb = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let lc = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let (ab, ac) = (
            lb.local_addr().map_err(|e| e.to_string())?,
            lc.local_addr().map_err(|e| e.to_string())?,
        );
        let mut agents = Vec::new();
        for (me, listener, addr, other, other_addr) in
            [(SERVER, lb, ab, PEER, ac), (PEER, lc, ac, SERVER, ab)]
        {
            let mut config = ShimConfig::new(
                Credentials {
                    node: node(me)?,
                    token: token(me, 1, run)?,
                },
                Scope::Node,
            );
            config.max_remote_timeout = MAX_REMOTE;
            config.connect_timeout = Duration::from_secs(5);
            let plugins = Arc::new(CountingPlugins::default());
            let mut routes = Routes::new().with_direct(node(other)?, other_addr);
            if me == SERVER {
                routes.set_direct(node(peer::HOSTILE)?, hostile);
            }
            let shim = Shim::new(
                config,
                registry.clone(),
                plugins.clone(),
                book.clone(),
                routes,
            );
            let current = rotated.clone();
            shim.update_tokens(move |b| *b = current);
            let (stop, stopped) = oneshot::channel::<()>();
            let server = shim.clone();
            tokio::spawn(async move {
                let _ = server
                    .serve(listener, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
            agents.push(Agent {
                shim,
                plugins,
                addr,
                _stop: stop,
            });
        }
        let c = agents.pop().ok_or("agent c")?;
        let b = agents.pop().ok_or("agent b")?;
        Ok(World { b, c, run })
    }

    fn agent(&self, name: &str) -> &Agent {
        if name == PEER { &self.c } else { &self.b }
    }

    /// The credential, hop and timeout headers of `call`, and the gRPC ones.
    fn headers(&self, call: &Call, content_type: &str) -> http::HeaderMap {
        let mut md = tonic::metadata::MetadataMap::new();
        let own = |n: &str| token_of(n, 1, self.run);
        let (node_bytes, token): (Option<Vec<u8>>, Option<String>) = match &call.creds {
            Creds::None => (None, None),
            Creds::NodeOnly(n) => (Some(n.as_bytes().to_vec()), None),
            Creds::TokenOnly(n) => (None, Some(own(n))),
            Creds::Valid(n) => (Some(n.as_bytes().to_vec()), Some(own(n))),
            Creds::Forged(n) => (
                Some(n.as_bytes().to_vec()),
                Some(format!("{MARKER}-forged-{n}-{:016x}", !self.run)),
            ),
            Creds::Borrowed { node, owner } => (Some(node.as_bytes().to_vec()), Some(own(owner))),
            Creds::Stale(n) => (Some(n.as_bytes().to_vec()), Some(token_of(n, 0, self.run))),
            Creds::Retired => (Some(RETIRED.as_bytes().to_vec()), Some(own(RETIRED))),
            Creds::NodeNotUtf8 => (Some(vec![0xff, 0xfe, b'a']), Some(own("a"))),
            Creds::NodeNotBase64 => (None, Some(own("a"))),
            Creds::EmptyNode => (Some(Vec::new()), Some(own("a"))),
            Creds::LongToken(n) => (
                Some(n.as_bytes().to_vec()),
                Some(format!("{MARKER}{}", "x".repeat(300))),
            ),
        };
        if let Some(bytes) = node_bytes {
            md.insert_bin(
                NODE_HEADER,
                tonic::metadata::BinaryMetadataValue::from_bytes(&bytes),
            );
        }
        if let Some(t) = token.and_then(|t| tonic::metadata::AsciiMetadataValue::try_from(t).ok()) {
            md.insert(TOKEN_HEADER, t);
        }
        let mut headers = h2::grpc_headers(content_type);
        headers.extend(md.into_headers());
        if call.creds == Creds::NodeNotBase64 {
            headers.insert(
                http::HeaderName::from_static(NODE_HEADER),
                http::HeaderValue::from_static("!!not base64!!"),
            );
        }
        if let Hops::Text(t) = &call.hops
            && let Ok(v) = http::HeaderValue::from_str(t)
        {
            headers.insert(csi_rpc_shim::auth::HOPS_HEADER, v);
        }
        if let Some(t) = call.timeout.header()
            && let Ok(v) = http::HeaderValue::from_str(&t)
        {
            headers.insert("grpc-timeout", v);
        }
        headers
    }

    /// How many calls reached each agent's plugins, and how many hung ones were dropped.
    fn counts(&self) -> [(usize, u64); 2] {
        [
            (self.b.plugins.reached_count(), self.b.plugins.dropped()),
            (self.c.plugins.reached_count(), self.c.plugins.dropped()),
        ]
    }
}

/// What one case checks after its call ended: the answer, who was reached, what leaked.
struct Judge<'a> {
    report: &'a mut Report,
    index: u64,
    what: String,
}

impl Judge<'_> {
    fn fail(&mut self, counter: &'static str, why: impl std::fmt::Display) {
        let mut why = why.to_string();
        // An answer that leaked a secret must not leak it again through this line.
        if why.contains(MARKER) {
            why = "(withheld: the text holds a secret value or token)".to_owned();
        }
        self.report
            .violation(counter, self.index, format!("{why} [{}]", self.what));
    }

    /// Looks for the marker every secret value and token holds.
    fn leaks(&mut self, answer: Option<&Answer>, logged: &str) {
        let mut shown = String::new();
        if let Some(status) = answer.and_then(Answer::status) {
            shown.push_str(status.message());
            if let Ok(d) = pb::ErrorDetail::decode(status.details()) {
                shown.push_str(&d.message);
                shown.push_str(&d.violations.join("\n"));
            }
            for kv in status.metadata().iter() {
                shown.push_str(&format!("{kv:?}"));
            }
        }
        if let Some(Answer::Broken(e)) = answer {
            shown.push_str(e);
        }
        if shown.contains(MARKER) {
            self.fail(
                "leaked_secrets",
                "a secret value or token came back in the answer",
            );
        }
        if logged.contains(MARKER) {
            self.fail(
                "leaked_secrets",
                "a secret value or token reached a log line",
            );
        }
    }
}

/// Whether the field names of `violations` are exactly `fields`: each line starts with one of
/// them (followed by its end, a space, `.` or `[`), and each has a line.
fn names_exactly(violations: &[String], fields: &std::collections::BTreeSet<&'static str>) -> bool {
    let names = |line: &str, field: &str| {
        line.strip_prefix(field)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '.', '[']))
    };
    violations
        .iter()
        .all(|l| fields.iter().any(|f| names(l, f)))
        && fields
            .iter()
            .all(|f| violations.iter().any(|l| names(l, f)))
}

fn is_deadline(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::DeadlineExceeded => true,
        // tonic's own timer (the `grpc-timeout` header, or the server's cap) answers with
        // CANCELLED and no detail.
        tonic::Code::Cancelled => status.details().is_empty(),
        _ => false,
    }
}

/// Checks an answer against the expectation; `Err` says what was wrong.
fn check_answer(expect: &Expect, status: &tonic::Status) -> Result<(), String> {
    use pb::ErrorKind as K;
    let detail = pb::ErrorDetail::decode(status.details()).ok();
    let kind = detail.as_ref().map(|d| d.kind);
    let want = |code: tonic::Code, k: K| -> Result<(), String> {
        if status.code() == code && kind == Some(k as i32) {
            Ok(())
        } else {
            Err(format!(
                "expected {code:?} with detail {k:?}, got {:?} with detail kind {kind:?}: {}",
                status.code(),
                status.message()
            ))
        }
    };
    match expect {
        Expect::Unauthenticated => want(tonic::Code::Unauthenticated, K::Unauthenticated),
        Expect::Denied => want(tonic::Code::PermissionDenied, K::PermissionDenied),
        Expect::PluginMissing => want(tonic::Code::FailedPrecondition, K::PluginMissing),
        Expect::HopLimit => want(tonic::Code::FailedPrecondition, K::HopLimit),
        Expect::NoRoute => want(tonic::Code::Unavailable, K::NoRoute),
        Expect::Invalid(fields) => {
            want(tonic::Code::InvalidArgument, K::InvalidRequest)?;
            let lines = detail.map(|d| d.violations).unwrap_or_default();
            if names_exactly(&lines, fields) {
                Ok(())
            } else {
                Err(format!(
                    "violations {lines:?} do not name exactly {fields:?}"
                ))
            }
        }
        Expect::Served { .. } if status.code() == tonic::Code::Ok => Ok(()),
        Expect::Served { .. } => Err(format!(
            "expected OK, got {:?}: {}",
            status.code(),
            status.message()
        )),
        Expect::Deadline { .. } if is_deadline(status) => Ok(()),
        Expect::Deadline { .. } => Err(format!(
            "expected a deadline error, got {:?}: {}",
            status.code(),
            status.message()
        )),
    }
}

/// The longest a call with this timeout header may take before it counts as a hang.
fn guard_for(call: &Call) -> Duration {
    let deadline = match &call.timeout {
        call::Timeout::Short(ms) => Duration::from_millis(*ms),
        call::Timeout::Tiny(_) => Duration::ZERO,
        _ => MAX_REMOTE,
    };
    deadline.min(MAX_REMOTE) + SLACK
}

/// Runs one generated call on `conn` and checks everything about it.
async fn run_call(world: &World, conn: &mut Option<Conn>, call: &Call, judge: &mut Judge<'_>) {
    let before = world.counts();
    let Some(answer) = send(world, conn, call, h2::frame(&call.body), "application/grpc").await
    else {
        judge.fail("hangs", "the call did not end by its deadline");
        return;
    };
    let after = world.counts();
    let reached: Vec<(&'static str, usize)> = [SERVER, PEER]
        .into_iter()
        .zip(before.iter().zip(after.iter()))
        .map(|(n, ((b0, _), (b1, _)))| (n, b1 - b0))
        .collect();
    let timed_out = answer.status().is_some_and(is_deadline);
    let lenient = call.may_time_out() && timed_out;
    match (&answer, lenient) {
        (_, true) => {}
        (Answer::Status(status), false) => {
            if let Err(why) = check_answer(&call.expect, status) {
                let counter = if status.code() == tonic::Code::Ok {
                    "accepted_wrongly"
                } else {
                    "refused_wrongly"
                };
                judge.fail(counter, why);
            }
        }
        (other, false) => judge.fail("refused_wrongly", format!("no gRPC status: {other:?}")),
    }
    // Who the plugins saw.
    let expected = call.expect.reaches();
    for (n, count) in &reached {
        let want = usize::from(expected.is_some_and(|(e, _)| e == *n));
        let ok = if lenient {
            *count <= want
        } else {
            *count == want
        };
        if !ok {
            judge.fail(
                "reached_plugin_wrongly",
                format!("the plugins of {n} were reached {count} times, expected {want}"),
            );
        }
    }
    if let Some((n, origin)) = expected
        && let Some(last) = world.agent(n).plugins.reached().last()
        && reached.iter().any(|(m, c)| *m == n && *c == 1)
        && (last.origin.as_str() != origin || last.rpc != call.rpc)
    {
        judge.fail(
            "reached_plugin_wrongly",
            format!(
                "the plugins of {n} got {} for {}, expected {} for {origin}",
                last.rpc, last.origin, call.rpc
            ),
        );
    }
    // A hung plugin call must be dropped once the call is over.
    if let Expect::Deadline { node: n, .. } = call.expect
        && reached.iter().any(|(m, c)| *m == n && *c == 1)
    {
        let idx = usize::from(n == PEER);
        let dropped_before = before[idx].1;
        let start = Instant::now();
        while world.counts()[idx].1 <= dropped_before {
            if start.elapsed() > SLACK {
                judge.fail(
                    "hangs",
                    format!("the hung plugin call on {n} was never dropped"),
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    judge.leaks(Some(&answer), &logs::take());
}

/// Sends `call`'s headers with `frame` as the body on `conn` (opened again when closed).
/// `None`: it did not end within its guard.
async fn send(
    world: &World,
    conn: &mut Option<Conn>,
    call: &Call,
    frame: Vec<u8>,
    content_type: &str,
) -> Option<Answer> {
    let headers = world.headers(call, content_type);
    let body = Body::once(Some(frame.into()));
    exchange(world, conn, call.rpc.path(), headers, body, guard_for(call)).await
}

async fn exchange(
    world: &World,
    conn: &mut Option<Conn>,
    path: &str,
    headers: http::HeaderMap,
    body: Body,
    guard: Duration,
) -> Option<Answer> {
    if !conn.as_ref().is_some_and(Conn::is_open) {
        *conn = match Conn::open(world.b.addr).await {
            Ok(c) => Some(c),
            Err(e) => return Some(Answer::Broken(format!("cannot connect: {e}"))),
        };
    }
    let c = conn.as_mut()?;
    let Some(req) = c.request(path, headers, body) else {
        return Some(Answer::Broken(
            "the client library refused the request".into(),
        ));
    };
    c.exchange(req, guard).await
}

/// One case of the campaign.
enum Case {
    /// A well-formed call.
    Call(Call),
    /// Something a correct peer never sends; it must be refused without reaching a plugin.
    Odd(Odd),
    /// A call that `b` sends on to the hostile agent, which answers it badly.
    Peer(peer::Reply, PeerPath),
    /// A slow peer, run with the others at the end, concurrently.
    Slow(Slow),
}

/// How a call reaches the hostile agent through `b`.
#[derive(Clone, Copy, Debug)]
enum PeerPath {
    /// A remote caller's call, relayed by `b`, with this timeout in milliseconds (or none).
    Relayed(Option<u64>),
    /// `b`'s own local caller, with this timeout in milliseconds.
    Local(u64),
}

fn generate(rng: &mut Rng) -> Case {
    match rng.weighted(&[70, 16, 10, 4]) {
        0 => Case::Call(Call::generate(rng)),
        1 => Case::Odd(Odd::generate(rng)),
        2 => {
            let reply = peer::Reply::generate(rng);
            let ms = rng.range(100, 800);
            let path = match rng.index(3) {
                // Without a timeout a silent agent holds the call for the whole cap (5 s):
                // a few such cases are enough.
                0 if reply != peer::Reply::Silence || rng.percent(10) => PeerPath::Relayed(None),
                0 | 1 => PeerPath::Relayed(Some(ms)),
                _ => PeerPath::Local(ms),
            };
            Case::Peer(reply, path)
        }
        _ => Case::Slow(Slow::generate(rng)),
    }
}

/// Runs one call that `b` sends on to the hostile agent, and checks it.
async fn run_peer(
    world: &World,
    conn: &mut Option<Conn>,
    reply: peer::Reply,
    path: PeerPath,
    judge: &mut Judge<'_>,
) {
    let before = world.counts();
    match path {
        PeerPath::Relayed(ms) => {
            let body = pb::ControllerListVolumesRequest {
                query: Some(pb::ControllerQuery {
                    plugin_id: peer::REMOTE_PLUGIN.into(),
                    preferred_node: String::new(),
                    target_node: peer::HOSTILE.into(),
                }),
                max_entries: 0,
                starting_token: reply.token(),
            }
            .encode_to_vec();
            let call = Call {
                rpc: csi_rpc_shim::AgentRpc::ControllerListVolumes,
                body,
                creds: Creds::Valid("a"),
                hops: Hops::Absent,
                timeout: ms.map_or(call::Timeout::Absent, call::Timeout::Short),
                expect: Expect::NoRoute,
            };
            match send(
                world,
                conn,
                &call,
                h2::frame(&call.body),
                "application/grpc",
            )
            .await
            {
                None => judge.fail("hangs", "the relayed call did not end by its deadline"),
                Some(Answer::Status(s)) if s.code() == tonic::Code::Ok => {
                    // A relay passes a well-formed answer on; its caller checks the content.
                    if reply != peer::Reply::OkInvalidMessage {
                        judge.fail(
                            "accepted_wrongly",
                            "the relay answered OK to a broken answer",
                        );
                    }
                }
                Some(Answer::Status(_)) => {}
                Some(other) => judge.fail(
                    "refused_wrongly",
                    format!("the relay's caller got no gRPC status: {other:?}"),
                ),
            }
        }
        PeerPath::Local(ms) => {
            let shim = world.b.shim.clone();
            let list = csi_rpc_shim::ListVolumes {
                query: csi_rpc_shim::ControllerQuery::new(
                    match PluginId::new(peer::REMOTE_PLUGIN) {
                        Ok(p) => p,
                        Err(e) => return judge.fail("refused_wrongly", e),
                    },
                ),
                max_entries: 0,
                starting_token: reply.token(),
            };
            let timeout = Duration::from_millis(ms);
            let task = tokio::spawn(async move { shim.list_volumes(list, timeout).await });
            match tokio::time::timeout(timeout + SLACK, task).await {
                Err(_) => judge.fail("hangs", "the local call did not end by its deadline"),
                // The payload is not shown: it may hold anything the call carried.
                Ok(Err(e)) if e.is_panic() => {
                    judge.fail("refused_wrongly", "the local caller's task panicked")
                }
                Ok(Err(_)) => {
                    judge.fail("refused_wrongly", "the local caller's task was cancelled")
                }
                Ok(Ok(Ok(_))) => {
                    judge.fail("accepted_wrongly", "a broken answer was taken as success")
                }
                Ok(Ok(Err(e))) => {
                    if e.to_string().contains(MARKER) || format!("{e:?}").contains(MARKER) {
                        judge.fail("leaked_secrets", "the error shows a secret");
                    }
                }
            }
        }
    }
    let after = world.counts();
    if after.iter().zip(before.iter()).any(|(a, b)| a.0 != b.0) {
        judge.fail("reached_plugin_wrongly", "a plugin of b or c was reached");
    }
    judge.leaks(None, &logs::take());
}

/// A call that must be served: `ops` lists volumes on `b`. Run after the hostile cases to
/// check the agent still serves.
fn probe() -> Call {
    let body = pb::ControllerListVolumesRequest {
        query: Some(pb::ControllerQuery {
            plugin_id: PLUGIN.into(),
            preferred_node: String::new(),
            target_node: SERVER.into(),
        }),
        max_entries: 0,
        starting_token: String::new(),
    }
    .encode_to_vec();
    Call {
        rpc: csi_rpc_shim::AgentRpc::ControllerListVolumes,
        body,
        creds: Creds::Valid("ops"),
        hops: Hops::Absent,
        timeout: call::Timeout::Generous("20S"),
        expect: Expect::Served {
            node: SERVER,
            origin: "ops",
        },
    }
}

/// Runs the campaign.
pub fn run(plan: &Plan) -> Report {
    let mut report = Report::new(NAME, plan, COUNTERS);
    panics::install_hook();
    logs::capture();
    let runtime = match crate::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            report.violation("refused_wrongly", 0, format!("cannot start a runtime: {e}"));
            return report;
        }
    };
    runtime.block_on(campaign(plan, &mut report));
    // Stop the agents and their tasks before the report is read.
    runtime.shutdown_timeout(Duration::from_secs(5));
    report
}

async fn campaign(plan: &Plan, report: &mut Report) {
    let world = match World::start(plan.seed).await {
        Ok(w) => w,
        Err(e) => {
            report.violation(
                "refused_wrongly",
                0,
                format!("cannot start the agents: {e}"),
            );
            return;
        }
    };
    let _ = logs::take();
    // Slow peers run together at the end; keep time for them.
    let sequential_deadline = plan
        .deadline
        .checked_sub(MAX_REMOTE + Duration::from_secs(3))
        .unwrap_or(plan.deadline);
    let mut conn = None;
    let mut slow = Vec::new();
    let mut last = 0;
    for index in plan.indices() {
        if Instant::now() >= sequential_deadline {
            report.stopped_by_budget();
            break;
        }
        last = index;
        let mut rng = Rng::for_case(plan.seed, index);
        let case = generate(&mut rng);
        let panics_before = panics::count();
        match case {
            Case::Call(call) => {
                plan.trace(index, &call);
                let mut judge = Judge {
                    report,
                    index,
                    what: call.to_string(),
                };
                run_call(&world, &mut conn, &call, &mut judge).await;
            }
            Case::Odd(odd) => {
                plan.trace(index, &odd);
                let mut judge = Judge {
                    report,
                    index,
                    what: odd.to_string(),
                };
                // On a connection of its own: the agent may rightly close it afterwards.
                odd::run(&world, &mut None, &odd, &mut judge).await;
            }
            Case::Peer(reply, path) => {
                let what = format!("hostile agent answers {reply} to a call {path:?}");
                plan.trace(index, &what);
                let mut judge = Judge {
                    report,
                    index,
                    what,
                };
                run_peer(&world, &mut conn, reply, path, &mut judge).await;
            }
            Case::Slow(s) => {
                plan.trace(
                    index,
                    format_args!("{s} (run with the other slow peers at the end)"),
                );
                slow.push((index, s));
                continue;
            }
        }
        panics::note(report, index, panics_before);
        report.case_done();
    }
    let panics_before = panics::count();
    let ran = odd::run_slow(&world, &slow, report).await;
    panics::note(report, last, panics_before);
    for _ in 0..ran {
        report.case_done();
    }
    // The agent still serves after everything it was sent.
    let mut judge = Judge {
        report,
        index: last,
        what: "liveness probe after the campaign".into(),
    };
    run_call(&world, &mut None, &probe(), &mut judge).await;
}
