//! What a correct peer never sends: undecodable bodies in correct frames, broken gRPC frames
//! and HTTP/2 requests, garbage on a raw TCP connection ([`Odd`]), and slow peers that send
//! headers or half a frame and then nothing ([`Slow`]). Each must be refused (any error, a
//! reset stream or a closed connection), end by its deadline, and reach no plugin.

use std::fmt;
use std::time::{Duration, Instant};

use csi_rpc_shim::wire::{MAX_MESSAGE_BYTES, pb};
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::call::{Call, Creds, Timeout};
use super::h2::{self, Answer, Body, Conn};
use super::{Judge, MAX_REMOTE, SLACK, World, guard_for, logs};
use crate::report::Report;
use crate::rng::Rng;

/// The HTTP/2 client preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How the request is broken.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A message starting with field number 0, which no protobuf message has.
    ZeroTag,
    /// A varint longer than ten bytes.
    VarintOverflow,
    /// A string field that is not UTF-8.
    BadUtf8,
    /// A length-delimited field longer than what follows.
    Truncated,
    /// Random bytes.
    Random,
    /// The frame's length says more bytes than the stream carries.
    FrameShort,
    /// The frame's length is over the agent's message limit.
    FrameHuge,
    /// The compressed flag without a `grpc-encoding`.
    Compressed,
    /// An encoding the agent does not support.
    UnknownEncoding(&'static str),
    /// A path that is no call of the protocol.
    UnknownPath(&'static str),
    /// No message at all.
    EmptyBody,
    /// A valid message over the agent's message limit.
    Oversized,
    /// Not a gRPC content type (with credentials that do not authenticate).
    WrongContentType(&'static str),
    /// A header of this many KiB (with credentials that do not authenticate).
    HugeHeader(usize),
    /// Random bytes instead of the HTTP/2 preface.
    TcpNoPreface,
    /// The preface, then random bytes.
    TcpGarbageFrames,
    /// The preface, then a SETTINGS frame of a length no SETTINGS frame has.
    TcpBadSettings,
    /// The preface, then HEADERS whose header block does not decode.
    TcpBadHeaderBlock,
    /// Part of the preface, then the end of the connection.
    TcpPartialPreface,
}

/// One odd request.
pub(super) struct Odd {
    kind: Kind,
    call: Call,
    bytes_seed: u64,
}

impl fmt::Display for Odd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "odd {:?} on {}", self.kind, self.call.headline())
    }
}

impl Odd {
    pub(super) fn generate(rng: &mut Rng) -> Odd {
        let kind = match rng.index(19) {
            0 => Kind::ZeroTag,
            1 => Kind::VarintOverflow,
            2 => Kind::BadUtf8,
            3 => Kind::Truncated,
            4 => Kind::Random,
            5 => Kind::FrameShort,
            6 => Kind::FrameHuge,
            7 => Kind::Compressed,
            8 => Kind::UnknownEncoding(rng.pick(&["gzip", "zstd", "br", "identity, gzip", "x"])),
            9 => Kind::UnknownPath(rng.pick(&[
                "/csisdk.agent.v1.Agent/Nope",
                "/csisdk.agent.v2.Agent/ControllerAttach",
                "/csi.v1.Node/NodePublishVolume",
                "/",
                "/csisdk.agent.v1.Agent/",
                "/csisdk.agent.v1.Agent/ControllerAttach/extra",
            ])),
            10 => Kind::EmptyBody,
            11 => Kind::Oversized,
            12 => Kind::WrongContentType(rng.pick(&[
                "application/json",
                "text/plain",
                "",
                "application/grpc-web",
            ])),
            13 => Kind::HugeHeader(rng.pick(&[20, 70, 300])),
            14 => Kind::TcpNoPreface,
            15 => Kind::TcpGarbageFrames,
            16 => Kind::TcpBadSettings,
            17 => Kind::TcpBadHeaderBlock,
            _ => Kind::TcpPartialPreface,
        };
        let mut call = Call::generate(rng);
        if matches!(kind, Kind::WrongContentType(_) | Kind::HugeHeader(_)) {
            // The request itself may be valid: only credentials that never authenticate make
            // "refused" the one right answer, whatever the transport lets through.
            call.creds = Creds::Forged("a");
        }
        if call.may_time_out() {
            call.timeout = Timeout::Absent;
        }
        Odd {
            kind,
            call,
            bytes_seed: rng.next_u64(),
        }
    }
}

/// A well-formed frame around an undecodable message, or the broken frame itself.
fn body_bytes(kind: Kind, call: &Call, rng: &mut Rng) -> Vec<u8> {
    let message = &call.body;
    let with_tail = |tail: &[u8]| {
        let mut m = message.clone();
        m.extend_from_slice(tail);
        h2::frame(&m)
    };
    match kind {
        Kind::ZeroTag => {
            let n = rng.index(64);
            let mut m = vec![0u8];
            m.extend(rng.bytes(n));
            h2::frame(&m)
        }
        Kind::VarintOverflow => h2::frame(&[0xff; 11]),
        // Field 2 (a string in every request but ListVolumes, where it is an int32 and the
        // wire type is wrong instead).
        Kind::BadUtf8 => with_tail(&[0x12, 0x03, 0xff, 0xfe, 0xfd]),
        Kind::Truncated => with_tail(&[0x12, 0x05, b'a', b'b']),
        Kind::Random => {
            let n = 1 + rng.index(300);
            h2::frame(&rng.bytes(n))
        }
        Kind::FrameShort => {
            let mut f = h2::frame(message);
            let claimed = u32::try_from(message.len() + 1 + rng.index(100)).unwrap_or(u32::MAX);
            f[1..5].copy_from_slice(&claimed.to_be_bytes());
            f
        }
        Kind::FrameHuge => {
            let claimed = MAX_MESSAGE_BYTES + 1 + rng.index(1 << 20);
            let mut f = vec![0u8];
            f.extend_from_slice(&u32::try_from(claimed).unwrap_or(u32::MAX).to_be_bytes());
            f.extend(rng.bytes(100));
            f
        }
        Kind::Compressed | Kind::UnknownEncoding(_) => {
            let mut f = h2::frame(message);
            f[0] = 1;
            f
        }
        Kind::EmptyBody => Vec::new(),
        Kind::Oversized => {
            let big = pb::ControllerValidateRequest {
                parameters: [("pad".to_owned(), "p".repeat(MAX_MESSAGE_BYTES + 10))].into(),
                ..Default::default()
            };
            h2::frame(&big.encode_to_vec())
        }
        _ => h2::frame(message),
    }
}

/// The raw bytes of a TCP-level case.
fn tcp_bytes(kind: Kind, rng: &mut Rng) -> Vec<u8> {
    let n = 1 + rng.index(400);
    let mut out = Vec::new();
    match kind {
        Kind::TcpNoPreface => {
            let mut b = rng.bytes(n);
            // Never the preface by chance.
            if b.first() == Some(&b'P') {
                b[0] = b'Q';
            }
            out = b;
        }
        Kind::TcpGarbageFrames => {
            out.extend_from_slice(PREFACE);
            out.extend(rng.bytes(n));
        }
        Kind::TcpBadSettings => {
            out.extend_from_slice(PREFACE);
            // length 5 (SETTINGS must be a multiple of 6), type 4, flags 0, stream 0
            out.extend_from_slice(&[0, 0, 5, 4, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&[0, 3, 0, 0, 0]);
        }
        Kind::TcpBadHeaderBlock => {
            out.extend_from_slice(PREFACE);
            out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS
            let block = [0xffu8; 12];
            // HEADERS, END_STREAM | END_HEADERS, stream 1
            out.extend_from_slice(&[0, 0, 12, 1, 0x5, 0, 0, 0, 1]);
            out.extend_from_slice(&block);
        }
        _ => {
            let k = 1 + rng.index(PREFACE.len() - 1);
            out.extend_from_slice(&PREFACE[..k]);
        }
    }
    out
}

/// Writes `bytes` on a new connection, closes our side, and waits for the agent to close its
/// side. `false`: it kept the connection open past the guard.
async fn tcp_case(world: &World, bytes: &[u8]) -> Result<bool, String> {
    let mut tcp = TcpStream::connect(world.b.addr)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    // The agent may close while we write: that is a fine answer too.
    let _ = tcp.write_all(bytes).await;
    let _ = tcp.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    Ok(tokio::time::timeout(SLACK, drain).await.is_ok())
}

/// Runs one odd case and checks it.
pub(super) async fn run(world: &World, conn: &mut Option<Conn>, odd: &Odd, judge: &mut Judge<'_>) {
    let mut rng = Rng::new(odd.bytes_seed);
    let before = world.counts();
    let answer = match odd.kind {
        Kind::TcpNoPreface
        | Kind::TcpGarbageFrames
        | Kind::TcpBadSettings
        | Kind::TcpBadHeaderBlock
        | Kind::TcpPartialPreface => {
            match tcp_case(world, &tcp_bytes(odd.kind, &mut rng)).await {
                Ok(true) => {}
                Ok(false) => judge.fail(
                    "hangs",
                    "the agent kept the connection open after the peer closed its side",
                ),
                Err(e) => judge.fail("refused_wrongly", e),
            }
            None
        }
        kind => {
            let mut headers = world.headers(
                &odd.call,
                match kind {
                    Kind::WrongContentType(ct) => ct,
                    _ => "application/grpc",
                },
            );
            if let Kind::UnknownEncoding(enc) = kind {
                headers.insert("grpc-encoding", http::HeaderValue::from_static(enc));
            }
            if let Kind::HugeHeader(kib) = kind
                && let Ok(v) = http::HeaderValue::from_str(&"h".repeat(kib * 1024))
            {
                headers.insert("x-pad", v);
            }
            let path = match kind {
                Kind::UnknownPath(p) => p,
                Kind::Oversized => csi_rpc_shim::AgentRpc::ControllerValidate.path(),
                _ => odd.call.rpc.path(),
            };
            let frame = body_bytes(kind, &odd.call, &mut rng);
            let body = if frame.is_empty() {
                Body::once(None)
            } else {
                Body::once(Some(frame.into()))
            };
            match super::exchange(world, conn, path, headers, body, guard_for(&odd.call)).await {
                None => {
                    judge.fail("hangs", "the call did not end by its deadline");
                    None
                }
                Some(answer) => {
                    if !answer.is_refusal() {
                        judge.fail("accepted_wrongly", "answered OK");
                    }
                    Some(answer)
                }
            }
        }
    };
    let after = world.counts();
    if after.iter().zip(before.iter()).any(|(a, b)| a.0 != b.0) {
        judge.fail("reached_plugin_wrongly", "a plugin was reached");
    }
    judge.leaks(answer.as_ref(), &logs::take());
}

/// How a slow peer stalls.
#[derive(Clone, Copy, Debug)]
enum SlowKind {
    /// Request headers, then nothing: no message, no end of stream.
    HeadersOnly,
    /// Headers and the first bytes of a frame, then nothing.
    PartialFrame(usize),
    /// An HTTP/2 connection with no request at all, held open while the others run.
    IdleConnection,
}

/// One slow peer.
pub(super) struct Slow {
    kind: SlowKind,
    call: Call,
}

impl fmt::Display for Slow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slow {:?} on {}", self.kind, self.call.headline())
    }
}

impl Slow {
    pub(super) fn generate(rng: &mut Rng) -> Slow {
        let kind = match rng.weighted(&[45, 45, 10]) {
            0 => SlowKind::HeadersOnly,
            1 => SlowKind::PartialFrame(1 + rng.index(40)),
            _ => SlowKind::IdleConnection,
        };
        let mut call = Call::generate(rng);
        call.timeout = if rng.percent(50) {
            Timeout::Short(rng.range(50, 800))
        } else {
            Timeout::Absent
        };
        Slow { kind, call }
    }
}

/// Runs every slow peer at once (and, meanwhile, a call that must be served), then checks
/// each. Returns how many ran.
pub(super) async fn run_slow(world: &World, slow: &[(u64, Slow)], report: &mut Report) -> u64 {
    if slow.is_empty() {
        return 0;
    }
    let before = world.counts();
    let mut tasks = Vec::new();
    for (index, s) in slow {
        let addr = world.b.addr;
        let kind = s.kind;
        let path = s.call.rpc.path();
        let headers = world.headers(&s.call, "application/grpc");
        let frame = h2::frame(&s.call.body);
        let guard = guard_for(&s.call);
        let index = *index;
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let outcome: Result<Option<Answer>, String> = match kind {
                SlowKind::IdleConnection => match TcpStream::connect(addr).await {
                    Ok(mut tcp) => {
                        let mut hello = PREFACE.to_vec();
                        hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
                        let _ = tcp.write_all(&hello).await;
                        tokio::time::sleep(MAX_REMOTE + Duration::from_secs(1)).await;
                        Ok(Some(Answer::Broken("idle connection closed by us".into())))
                    }
                    Err(e) => Err(format!("cannot connect: {e}")),
                },
                SlowKind::HeadersOnly | SlowKind::PartialFrame(_) => match Conn::open(addr).await {
                    Ok(mut conn) => {
                        let body = match kind {
                            SlowKind::PartialFrame(n) => {
                                let n = n.min(frame.len());
                                Body::stall(Some(frame[..n].to_vec().into()))
                            }
                            _ => Body::stall(None),
                        };
                        match conn.request(path, headers, body) {
                            Some(req) => Ok(conn.exchange(req, guard).await),
                            None => Err("the client library refused the request".into()),
                        }
                    }
                    Err(e) => Err(format!("cannot connect: {e}")),
                },
            };
            (index, outcome, started.elapsed())
        }));
    }
    // While the slow peers hold their streams and connections, a good call is still served.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let last = slow.last().map_or(0, |(i, _)| *i);
    {
        let mut judge = Judge {
            report: &mut *report,
            index: last,
            what: "a call served while slow peers stall".into(),
        };
        let mut conn = None;
        super::run_call(world, &mut conn, &super::probe(), &mut judge).await;
    }
    let probe_reached = 1;
    let mut ran = 0;
    for (task, (index, s)) in tasks.into_iter().zip(slow) {
        ran += 1;
        let mut judge = Judge {
            report: &mut *report,
            index: *index,
            what: s.to_string(),
        };
        match task.await {
            Err(_) => judge.fail("refused_wrongly", "the slow peer's task failed"),
            Ok((_, Err(e), _)) => judge.fail("refused_wrongly", e),
            Ok((_, Ok(None), waited)) => judge.fail(
                "hangs",
                format!("the agent did not end the call within {waited:?}"),
            ),
            Ok((_, Ok(Some(answer)), _)) => {
                if !answer.is_refusal() {
                    judge.fail("accepted_wrongly", "answered OK");
                }
                judge.leaks(Some(&answer), "");
            }
        }
    }
    let after = world.counts();
    let reached: usize = after
        .iter()
        .zip(before.iter())
        .map(|(a, b)| a.0 - b.0)
        .sum();
    let mut judge = Judge {
        report,
        index: last,
        what: "slow peers".into(),
    };
    if reached != probe_reached {
        judge.fail(
            "reached_plugin_wrongly",
            format!("{reached} plugin calls during the slow peers, expected only the probe's"),
        );
    }
    judge.leaks(None, &logs::take());
    ran
}
