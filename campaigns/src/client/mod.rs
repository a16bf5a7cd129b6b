//! Campaign `client`: a hostile plugin under csi-client.
//!
//! Every case starts a raw HTTP/2 server on a unix socket of its own (module `plugin`) and a
//! [`CsiClient`] of it, and makes one typed call: probe, plugin info and capabilities,
//! create and delete volume, validate capabilities (the `confirmed` comparison, strict and
//! lenient), controller publish, `list_all_volumes` (every page), node stage, publish and
//! info. The plugin answers with valid messages holding out-of-range or contradictory values
//! (negative sizes, empty and oversized ids, unknown enum numbers, `confirmed` with other
//! capabilities, 100,000 entries on a page (valid, or all without a volume), a `next_token` that repeats or is too long,
//! ABORTED on a later page), or with what no gRPC server sends: undecodable bytes, a message
//! over the decode limit (real, or a length prefix that lies), an HTTP error page, another
//! content type, trailers without a status, no trailers, a compressed flag without an
//! encoding, two messages, a garbled or unknown `grpc-status`, status details that are not
//! base64 (tonic panics on those), a status message with control characters or of 200 KiB, a
//! stream reset before the headers or in the middle of a message, headers (or a message) and
//! then silence, a socket that accepts and never reads, one that closes at once.
//!
//! Properties: no panic anywhere in the process; every call ends by its deadline (hang cases
//! run with attempt deadlines of 30-150 ms, concurrently at the end); the result is the one
//! the answer calls for: the value, or the error kind (the plugin's status with its code and
//! message, an unknown status with its number, an invalid response naming the field, an
//! undecodable answer, over the limit, not gRPC, a lost connection, our deadline with the
//! limit that was set), and the class the kind has for the RPC (an answer we could not use,
//! our deadline and a lost connection are uncertain on a mutation and retryable on a read,
//! never fatal); no secret of a request in an error or a log line; no control character of
//! the plugin's text unescaped in an error's text; an error's text at most 64 KiB, whatever
//! the answer held (a page of 100,000 entries without a volume breaks 100,000 rules).
//!
//! Memory is bounded by the decoding limits: csi-client decodes at most
//! [`csi_client::MAX_ANSWER_BYTES`] (4 MiB) per message, and a listing
//! at most [`MAX_LISTED_BYTES`](csi_client::paging::MAX_LISTED_BYTES) (256 MiB) of pages as
//! encoded and [`MAX_LISTED_ENTRIES`](csi_client::paging::MAX_LISTED_ENTRIES) (a million)
//! entries (a million over four pages is the largest listing sent here); the hostile plugin
//! reads requests of at most the client's own size and its HTTP/2 header lists are capped at
//! 1 MiB.

mod calls;
mod plugin;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use csi_client::{
    Backoff, CallOptions, ConnectOptions, CsiClient, Endpoint, ErrorClass, ErrorKind,
    MAX_ANSWER_BYTES, PolicyTable, ResponseError, RetryBudget,
};
use http_body::Frame;
use hyper::body::Bytes;

use self::calls::{Content, Expect, MARKER, Rpc};
use self::plugin::{Answer, Finish, Plugin, Script, Socket, frame, trailers};
use crate::report::{Plan, Report};
use crate::rng::Rng;
use crate::{logs, panics};

/// The campaign's name on the command line and in its report line.
pub const NAME: &str = "client";

/// What the campaign covers, for `--list` and RELIABILITY.md.
pub const COVERS: &str = "hostile plugin -> csi-client: typed calls (probe, plugin info and capabilities, create/delete volume, validate capabilities, controller publish, list_all_volumes, node stage/publish/info) answered with out-of-range and contradictory values, undecodable and oversized messages, HTTP error pages, wrong content types, missing or garbled status and trailers, undecodable status details, resets, silence, sockets that never read";

/// The violation counters, in the order they print.
const COUNTERS: &[&str] = &[
    "panics",
    "hangs",
    "accepted_wrongly",
    "refused_wrongly",
    "wrong_error",
    "wrong_class",
    "leaked_secrets",
    "unescaped_text",
    "oversized_text",
];

/// Added to a call's total deadline before it counts as a hang: a generous bound for a
/// loaded machine, never a timing target.
const SLACK: Duration = Duration::from_secs(10);

/// The deadlines of a call that should end quickly: far above any answer's time.
const RELAXED: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(20));

/// The longest error text the campaign accepts (bytes); plugin texts are capped well below.
const MAX_ERROR_TEXT: usize = 64 << 10;

/// How many hang cases run at once at the end.
const HANG_BATCH: usize = 64;

/// How the plugin answers a case's call.
#[derive(Clone, Debug)]
enum Reply {
    /// The content, well framed, with status OK.
    Content,
    /// A failure status; in the headers of an empty answer or in trailers after no message.
    Status {
        code: i32,
        message: (&'static str, &'static str),
        details: Option<&'static str>,
        trailers_only: bool,
    },
    /// A `grpc-status` number gRPC does not define.
    UnknownStatus(u32),
    /// A `grpc-status` that is not a decimal number.
    GarbledStatus(&'static str),
    /// An HTTP error page.
    Http(u16),
    /// Well framed bytes that are no protobuf message.
    Undecodable(&'static [u8]),
    /// A message over the decode limit; `real: false` sends only a length prefix that says so.
    Oversized { real: bool },
    /// The content, well framed, under another content type.
    WrongContentType(&'static str),
    /// The content, then trailers without `grpc-status`.
    TrailersWithoutStatus,
    /// The content, then the end of the stream without trailers.
    NoTrailers,
    /// The content with the compressed flag, and no `grpc-encoding`.
    Compressed,
    /// The content twice.
    TwoMessages,
    /// Status OK and no message.
    OkNoMessage,
    /// UNAVAILABLE with a `grpc-message` of this many bytes.
    HugeStatusMessage(usize),
    /// The stream is reset before any header.
    ResetBeforeHeaders,
    /// Half the message, then the stream is reset.
    ResetMidMessage,
    /// Headers, then nothing ever.
    HeadersThenSilence,
    /// Headers and the message, then nothing ever (no trailers).
    MessageThenSilence,
    /// The socket accepts and never reads.
    NeverRead,
    /// The socket accepts and closes at once.
    CloseAtOnce,
}

/// Status messages as sent (percent-encoded, as gRPC carries them) and as decoded.
const MESSAGES: &[(&str, &str)] = &[
    ("plugin says no", "plugin says no"),
    (
        "line%0A2024-01-01 INFO forged%1B[2J%00",
        "line\n2024-01-01 INFO forged\u{1b}[2J\0",
    ),
];

const UNDECODABLE: &[&[u8]] = &[
    // Field 1 with wire type 7, which does not exist.
    &[0x0f],
    // Field 1, 16 bytes long, and only one follows.
    &[0x0a, 0x10, b'x'],
    // A varint that never ends.
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    // Tag 0.
    &[0x00, 0x01],
];

impl Reply {
    fn generate(rng: &mut Rng) -> Reply {
        match rng.weighted(&[40, 8, 3, 3, 4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 2, 2]) {
            0 => Reply::Content,
            1 => Reply::Status {
                code: i32::try_from(rng.range(1, 16)).unwrap_or(2),
                message: rng.pick(MESSAGES),
                details: [None, Some("!!not base64!!"), Some("//79/A=="), Some("*")][rng.index(4)],
                trailers_only: rng.percent(50),
            },
            2 => Reply::UnknownStatus(rng.pick(&[17, 99, 1000, u32::MAX])),
            3 => Reply::GarbledStatus(rng.pick(&["abc", "-1", "", "1.5", "99999999999"])),
            4 => Reply::Http(rng.pick(&[400, 404, 429, 500, 502, 503])),
            5 => Reply::Undecodable(rng.pick(UNDECODABLE)),
            6 => Reply::Oversized {
                real: rng.percent(20),
            },
            7 => Reply::WrongContentType(rng.pick(&["application/json", "text/html", "grpc"])),
            8 => Reply::TrailersWithoutStatus,
            9 => Reply::NoTrailers,
            10 => Reply::Compressed,
            11 => Reply::TwoMessages,
            12 => Reply::OkNoMessage,
            13 => Reply::HugeStatusMessage(rng.pick(&[16 << 10, 200 << 10])),
            14 => Reply::ResetBeforeHeaders,
            15 => Reply::ResetMidMessage,
            16 => Reply::HeadersThenSilence,
            17 => Reply::MessageThenSilence,
            18 => Reply::NeverRead,
            _ => Reply::CloseAtOnce,
        }
    }

    /// Whether the call can only end by its deadline (or may, for a socket that closes):
    /// such cases run with short deadlines, together at the end.
    fn slow(&self) -> bool {
        matches!(
            self,
            Reply::HeadersThenSilence
                | Reply::MessageThenSilence
                | Reply::NeverRead
                | Reply::CloseAtOnce
        )
    }

    fn socket(&self) -> Socket {
        match self {
            Reply::NeverRead => Socket::NeverRead,
            Reply::CloseAtOnce => Socket::Close,
            _ => Socket::Serve,
        }
    }

    /// What the client must make of this reply to a call whose content expects `content`.
    fn expect(&self, content: &Expect) -> Expect {
        match self {
            Reply::Content => content.clone(),
            Reply::Status { code, message, .. } => {
                Expect::Status(tonic::Code::from_i32(*code), message.1.to_owned())
            }
            Reply::UnknownStatus(n) => Expect::UnknownStatus(*n),
            Reply::GarbledStatus(_)
            | Reply::Undecodable(_)
            | Reply::Compressed
            | Reply::OkNoMessage
            | Reply::TrailersWithoutStatus
            | Reply::NoTrailers => Expect::Undecodable,
            Reply::Http(code) => Expect::NotGrpc(*code),
            Reply::Oversized { .. } => Expect::TooLarge,
            // tonic reads a well-framed answer whatever its content type.
            Reply::WrongContentType(_) => Expect::AnyOf(vec![content.clone(), Expect::Undecodable]),
            // Which of the two would be the plugin's answer? Neither.
            Reply::TwoMessages => Expect::Undecodable,
            Reply::HugeStatusMessage(n) => Expect::AnyOf(vec![
                Expect::Status(tonic::Code::Unavailable, "m".repeat(*n)),
                Expect::Lost,
            ]),
            Reply::ResetBeforeHeaders | Reply::ResetMidMessage => Expect::Lost,
            Reply::HeadersThenSilence | Reply::MessageThenSilence => Expect::Deadline,
            Reply::NeverRead => Expect::AnyOf(vec![Expect::Deadline, Expect::Unreachable]),
            Reply::CloseAtOnce => {
                Expect::AnyOf(vec![Expect::Lost, Expect::Unreachable, Expect::Deadline])
            }
        }
    }

    /// The answer carrying `message` (the content of the page asked for).
    fn answer(&self, message: &[u8]) -> Option<Answer> {
        let hv = http::HeaderValue::from_static;
        let ok = || trailers("0", &[]);
        let data = |flag: u8| Frame::data(frame(flag, message));
        let answer = match self {
            Reply::Content => Answer::grpc(vec![data(0), ok()]),
            Reply::Status {
                code,
                message,
                details,
                trailers_only,
            } => {
                let mut more = vec![("grpc-message", hv(message.0))];
                if let Some(d) = details {
                    more.push(("grpc-status-details-bin", hv(d)));
                }
                if *trailers_only {
                    let mut a = Answer::grpc(Vec::new());
                    a.headers.push((
                        "grpc-status",
                        http::HeaderValue::from_str(&code.to_string()).ok()?,
                    ));
                    a.headers.extend(more);
                    a
                } else {
                    Answer::grpc(vec![trailers(&code.to_string(), &more)])
                }
            }
            Reply::UnknownStatus(n) => Answer::grpc(vec![trailers(
                &n.to_string(),
                &[("grpc-message", hv("from the future"))],
            )]),
            Reply::GarbledStatus(s) => Answer::grpc(vec![data(0), trailers(s, &[])]),
            Reply::Http(code) => Answer {
                status: *code,
                headers: vec![("content-type", hv("text/html"))],
                frames: vec![Frame::data(Bytes::from_static(b"<html>error</html>"))],
                finish: Finish::End,
            },
            Reply::Undecodable(bytes) => Answer::grpc(vec![Frame::data(frame(0, bytes)), ok()]),
            Reply::Oversized { real: true } => Answer::grpc(vec![
                Frame::data(frame(0, &vec![0u8; MAX_ANSWER_BYTES + 1])),
                ok(),
            ]),
            Reply::Oversized { real: false } => {
                let mut prefix = vec![0u8];
                prefix.extend_from_slice(&(5u32 << 20).to_be_bytes());
                prefix.extend_from_slice(b"short");
                Answer::grpc(vec![Frame::data(Bytes::from(prefix)), ok()])
            }
            Reply::WrongContentType(ct) => Answer {
                headers: vec![("content-type", hv(ct))],
                ..Answer::grpc(vec![data(0), ok()])
            },
            Reply::TrailersWithoutStatus => {
                let mut t = http::HeaderMap::new();
                t.insert("x-other", hv("1"));
                Answer::grpc(vec![data(0), Frame::trailers(t)])
            }
            Reply::NoTrailers => Answer::grpc(vec![data(0)]),
            Reply::Compressed => Answer::grpc(vec![data(1), ok()]),
            Reply::TwoMessages => Answer::grpc(vec![data(0), data(0), ok()]),
            Reply::OkNoMessage => Answer::grpc(vec![ok()]),
            Reply::HugeStatusMessage(n) => {
                let mut a = Answer::grpc(Vec::new());
                a.headers.push(("grpc-status", hv("14")));
                a.headers.push((
                    "grpc-message",
                    http::HeaderValue::from_str(&"m".repeat(*n)).ok()?,
                ));
                a
            }
            Reply::ResetBeforeHeaders => return None,
            Reply::ResetMidMessage => {
                let framed = frame(0, message);
                let half = framed.slice(..framed.len().div_ceil(2).min(framed.len() - 1));
                Answer {
                    finish: Finish::Reset,
                    ..Answer::grpc(vec![Frame::data(half)])
                }
            }
            Reply::HeadersThenSilence => Answer {
                finish: Finish::Stall,
                ..Answer::grpc(Vec::new())
            },
            Reply::MessageThenSilence => Answer {
                finish: Finish::Stall,
                ..Answer::grpc(vec![data(0)])
            },
            // Never asked: these sockets speak no HTTP/2.
            Reply::NeverRead | Reply::CloseAtOnce => Answer::grpc(Vec::new()),
        };
        Some(answer)
    }
}

/// One case: a call, the plugin's content and how it is sent, and the deadlines.
struct Case {
    rpc: Rpc,
    content: Content,
    reply: Reply,
    /// The page of a listing the reply applies to (pages before it are answered well).
    at: usize,
    attempt: Duration,
    total: Duration,
    /// What the call's own random choices draw from (its secrets).
    rng: Rng,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} answered {:?} (content: {}",
            self.rpc,
            ShortReply(&self.reply),
            self.content.what
        )?;
        if self.rpc == Rpc::ListAll {
            write!(
                f,
                ", {} pages, reply at page {}",
                self.content.pages.len(),
                self.at
            )?;
        }
        write!(f, "; deadlines {:?}/{:?})", self.attempt, self.total)
    }
}

/// A reply's `Debug` without its large payloads.
struct ShortReply<'a>(&'a Reply);

impl fmt::Debug for ShortReply<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Reply::Status {
                code,
                details,
                trailers_only,
                ..
            } => write!(
                f,
                "Status {{ code: {code}, details: {details:?}, trailers_only: {trailers_only} }}"
            ),
            other => fmt::Debug::fmt(other, f),
        }
    }
}

impl Case {
    fn generate(rng: &mut Rng) -> Case {
        let rpc = Rpc::generate(rng);
        let reply = Reply::generate(rng);
        // A reply that breaks the framing is judged on good content, so the two faults do
        // not mask each other.
        let content = if matches!(reply, Reply::Content) {
            calls::content(rpc, rng, true)
        } else {
            calls::content(rpc, rng, false)
        };
        let at = rng.index(content.pages.len());
        let (attempt, total) = if reply.slow() {
            let attempt = Duration::from_millis(rng.range(30, 150));
            (
                attempt,
                attempt * u32::try_from(rng.range(1, 3)).unwrap_or(1),
            )
        } else {
            RELAXED
        };
        Case {
            rpc,
            content,
            reply,
            at,
            attempt,
            total,
            rng: Rng::new(rng.next_u64()),
        }
    }

    fn expect(&self) -> Expect {
        self.reply.expect(&self.content.expect)
    }

    /// The plugin's script: the answer to each request.
    fn script(&self) -> Script {
        let pages = self.content.pages.clone();
        let reply = self.reply.clone();
        let at = self.at;
        let listing = self.rpc == Rpc::ListAll;
        let abort_at = self.content.abort_once_at;
        let aborted = Arc::new(AtomicBool::new(false));
        let method = self.rpc.path();
        Arc::new(move |path: &str, body: &[u8]| {
            if path != method {
                // The client called another method than the one asked for.
                return Some(Answer::grpc(vec![trailers(
                    "12",
                    &[(
                        "grpc-message",
                        http::HeaderValue::from_static("unexpected method"),
                    )],
                )]));
            }
            let page = if listing {
                calls::page_of(body).unwrap_or(usize::MAX)
            } else {
                0
            };
            let Some(message) = pages.get(page) else {
                return Some(Answer::grpc(vec![trailers(
                    "5",
                    &[(
                        "grpc-message",
                        http::HeaderValue::from_static("no such page"),
                    )],
                )]));
            };
            if abort_at == Some(page) && !aborted.swap(true, Ordering::SeqCst) {
                return Some(Answer::grpc(vec![trailers(
                    "10",
                    &[("grpc-message", http::HeaderValue::from_static("token gone"))],
                )]));
            }
            if page < at {
                Reply::Content.answer(message)
            } else {
                reply.answer(message)
            }
        })
    }
}

/// How a case's call ended: its result and how long it took, or `None` when it outlived its
/// deadline by the slack.
type Ended = Option<(Result<String, csi_client::Error>, Duration)>;

fn client_of(path: &Path) -> Result<CsiClient, String> {
    let mut policies = PolicyTable::default();
    policies.update_all(|_, p| {
        p.backoff = Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(5),
            factor: 2.0,
            jitter: false,
        };
    });
    let endpoint = Endpoint::unix(path).map_err(|e| e.to_string())?;
    Ok(CsiClient::builder(endpoint)
        .policies(policies)
        .retry_budget(Arc::new(RetryBudget::unlimited()))
        .connect_options(ConnectOptions {
            socket_wait: Duration::from_secs(2),
            keep_alive: None,
            ..ConnectOptions::DEFAULT
        })
        .build())
}

/// Runs case `index` against a plugin on a socket in `dir`.
async fn run_case(dir: &Path, index: u64, case: &mut Case) -> Result<Ended, String> {
    let path = dir.join(format!("p{index}.sock"));
    let _plugin =
        Plugin::start(&path, case.reply.socket(), case.script()).map_err(|e| e.to_string())?;
    let client = client_of(&path)?;
    let options = CallOptions::new()
        .attempt_deadline(case.attempt)
        .total_budget(case.total);
    let started = Instant::now();
    let call = calls::call(case.rpc, &client, options, &mut case.rng);
    let ended = tokio::time::timeout(case.total + SLACK, call)
        .await
        .ok()
        .map(|r| (r, started.elapsed()));
    let _ = std::fs::remove_file(&path);
    Ok(ended)
}

fn kind_matches(expect: &Expect, e: &csi_client::Error) -> bool {
    use ResponseError as R;
    let kind = e.kind();
    match expect {
        Expect::AnyOf(all) => all.iter().any(|x| kind_matches(x, e)),
        Expect::Ok(_) => false,
        Expect::Invalid(field) => matches!(kind, ErrorKind::InvalidResponse(R::Fields(errs))
            if errs.violations().iter().any(|v| v.field.to_string().starts_with(field))),
        Expect::Undecodable => matches!(kind, ErrorKind::InvalidResponse(R::Undecodable { .. })),
        Expect::TooLarge => matches!(kind, ErrorKind::InvalidResponse(R::TooLarge { limit, .. })
            if *limit == MAX_ANSWER_BYTES),
        Expect::NotGrpc(code) => {
            matches!(kind, ErrorKind::InvalidResponse(R::NotGrpc { http_status })
            if http_status == code)
        }
        Expect::Status(code, message) => matches!(kind, ErrorKind::Status { code: c, message: m }
            if c == code && m == message),
        Expect::UnknownStatus(n) => {
            matches!(kind, ErrorKind::UnknownStatus { number, .. } if number == n)
        }
        Expect::RepeatedToken => {
            matches!(kind, ErrorKind::InvalidResponse(R::RepeatedToken { .. }))
        }
        Expect::Lost => matches!(kind, ErrorKind::ConnectionLost { .. }),
        Expect::Deadline => matches!(kind, ErrorKind::Timeout(_)),
        Expect::Unreachable => {
            matches!(kind, ErrorKind::NotConnected(_) | ErrorKind::Handshake(_))
        }
    }
}

fn result_matches(expect: &Expect, result: &Result<String, csi_client::Error>) -> bool {
    match (expect, result) {
        (Expect::AnyOf(all), r) => all.iter().any(|x| result_matches(x, r)),
        (Expect::Ok(want), Ok(got)) => want == got,
        (_, Ok(_)) => false,
        (x, Err(e)) => kind_matches(x, e),
    }
}

/// The class an error of `kind` must have on `rpc`: the plugin's status by the policy
/// table; what the plugin did not report (an answer we could not use, our deadline, a lost
/// connection) uncertain on a mutation and retryable on a read.
fn class_for(rpc: Rpc, kind: &ErrorKind) -> ErrorClass {
    match kind {
        ErrorKind::Status { code, .. } => csi_client::classify(rpc.csi(), *code),
        ErrorKind::UnknownStatus { .. } => csi_client::classify(rpc.csi(), tonic::Code::Unknown),
        ErrorKind::InvalidResponse(_)
        | ErrorKind::Timeout(_)
        | ErrorKind::ConnectionLost { .. } => {
            if rpc.mutating() {
                ErrorClass::Uncertain
            } else {
                ErrorClass::Retry
            }
        }
        ErrorKind::NotConnected(_) => ErrorClass::RetryElsewhere,
        other => csi_client::classify_failure(rpc.csi(), other.failure()),
    }
}

/// Checks how case `index` ended.
fn judge(report: &mut Report, verbose: bool, index: u64, case: &Case, ended: Ended) {
    let what = case.to_string();
    let mut fail = |counter: &'static str, why: String| {
        let why = if why.contains(MARKER) {
            "(withheld: the text holds a secret value)".to_owned()
        } else {
            why
        };
        report.violation(counter, index, format!("{why} [{what}]"));
    };
    let Some((result, _took)) = ended else {
        fail(
            "hangs",
            format!("the call did not end by its deadline of {:?}", case.total),
        );
        return;
    };
    let expect = case.expect();
    if verbose {
        let got = match &result {
            Ok(s) => format!("Ok({s})"),
            Err(e) => format!("{:?}, class {:?}: {e}", e.kind().failure(), e.class()),
        };
        if !got.contains(MARKER) {
            eprintln!(
                "case={index} ended: {}",
                got.chars().take(400).collect::<String>()
            );
        }
    }
    if !result_matches(&expect, &result) {
        let counter = match (&expect, &result) {
            (_, Ok(_)) => "accepted_wrongly",
            (Expect::Ok(_), Err(_)) => "refused_wrongly",
            _ => "wrong_error",
        };
        let got = match &result {
            Ok(s) => format!("Ok({s})"),
            Err(e) => format!("{:?}: {e}", e.kind().failure()),
        };
        let got: String = got.chars().take(400).collect();
        fail(counter, format!("expected {}, got {got}", short(&expect)));
    }
    let Err(e) = result else { return };
    if e.rpc() != case.rpc.csi() {
        fail("wrong_error", format!("the error names {:?}", e.rpc()));
    }
    let want = class_for(case.rpc, e.kind());
    if e.class() != want {
        fail(
            "wrong_class",
            format!(
                "{:?} has class {:?}, expected {want:?}",
                e.kind().failure(),
                e.class()
            ),
        );
    }
    if let Some(t) = e.timeout()
        && t.limit() != case.attempt
        && t.limit() != case.total
    {
        fail(
            "wrong_error",
            format!(
                "a deadline of {:?} expired, but the call set {:?}/{:?}",
                t.limit(),
                case.attempt,
                case.total
            ),
        );
    }
    let text = e.to_string();
    if text.contains(MARKER) || format!("{e:?}").contains(MARKER) {
        fail("leaked_secrets", "the error shows a secret".into());
    }
    if text.chars().any(csi_structs::untrusted::needs_escape) {
        fail(
            "unescaped_text",
            "the error's text holds a control character".into(),
        );
    }
    // The plugin's answers are at most 4 MiB, but an error's text goes to logs and to
    // people: it must stay readable whatever the answer held.
    if text.len() > MAX_ERROR_TEXT {
        fail(
            "oversized_text",
            format!(
                "the error's text is {} bytes, over {MAX_ERROR_TEXT}",
                text.len()
            ),
        );
    }
}

/// An expectation's `Debug`, with long strings cut.
fn short(expect: &Expect) -> String {
    let s = format!("{expect:?}");
    if s.chars().count() > 200 {
        format!("{}...", s.chars().take(200).collect::<String>())
    } else {
        s
    }
}

fn note_logs(report: &mut Report, index: u64) {
    if logs::take().contains(MARKER) {
        report.violation("leaked_secrets", index, "a secret value reached a log line");
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
    let dir = match tempfile::Builder::new().prefix("csi-camp").tempdir() {
        Ok(d) => d,
        Err(e) => {
            report.violation(
                "refused_wrongly",
                0,
                format!("cannot make a directory: {e}"),
            );
            return report;
        }
    };
    runtime.block_on(campaign(plan, dir.path(), &mut report));
    runtime.shutdown_timeout(Duration::from_secs(5));
    report
}

async fn campaign(plan: &Plan, dir: &Path, report: &mut Report) {
    let _ = logs::take();
    // Hang cases run together at the end; keep time for them.
    let sequential_deadline = plan
        .deadline
        .checked_sub(Duration::from_secs(2))
        .unwrap_or(plan.deadline);
    let mut slow = Vec::new();
    for index in plan.indices() {
        if Instant::now() >= sequential_deadline {
            report.stopped_by_budget();
            break;
        }
        let mut case = Case::generate(&mut Rng::for_case(plan.seed, index));
        if case.reply.slow() {
            plan.trace(
                index,
                format_args!("{case} (run with the other slow cases at the end)"),
            );
            slow.push((index, case));
            continue;
        }
        plan.trace(index, &case);
        let before = panics::count();
        match run_case(dir, index, &mut case).await {
            Ok(ended) => judge(report, plan.verbose, index, &case, ended),
            Err(e) => report.violation("refused_wrongly", index, format!("cannot run: {e}")),
        }
        panics::note(report, index, before);
        note_logs(report, index);
        report.case_done();
    }
    while !slow.is_empty() {
        let batch: Vec<(u64, Case)> = slow.drain(..slow.len().min(HANG_BATCH)).collect();
        let before = panics::count();
        let first = batch.first().map_or(0, |(i, _)| *i);
        let mut set = tokio::task::JoinSet::new();
        for (index, mut case) in batch {
            let dir = dir.to_owned();
            set.spawn(async move {
                let ended = run_case(&dir, index, &mut case).await;
                (index, case, ended)
            });
        }
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((index, case, Ok(ended))) => judge(report, plan.verbose, index, &case, ended),
                Ok((index, _, Err(e))) => {
                    report.violation("refused_wrongly", index, format!("cannot run: {e}"))
                }
                Err(_) => report.violation("panics", first, "a case's task failed"),
            }
            report.case_done();
        }
        panics::note(report, first, before);
        note_logs(report, first);
    }
}
