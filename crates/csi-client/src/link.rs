//! The HTTP/2 link to a plugin: the `h2` crate's HTTP/2 client on a socket we dialled
//! ourselves, redialled when the plugin restarts.
//!
//! A [`Link`] is the bottom of every call's path: the typed client encodes the request (tonic's
//! codec), the client's tower layers (if any) see it, and the link hands it straight to the
//! HTTP/2 connection: the calling task itself opens the stream and queues its frames, and
//! polls its own answer. The connection's one task only reads and writes the socket. (hyper's
//! client, used before, ran two extra tasks per request — one sending the body, one waiting
//! for the answer — and so paid two spawns and two more wake-ups on every call.) There is no
//! queue worker and no second timer: the attempt deadline is enforced once, by the attempt
//! loop in `call.rs`, and merely *announced* to the plugin as `grpc-timeout`. Dropping the
//! answer's future (a deadline, a cancelled call) resets the stream.
//!
//! Under load the link spreads requests over a few connections: once every open connection
//! has [`GROW_AT`] requests in flight, another is dialled in the background (up to
//! [`MAX_CONNECTIONS`]), and each request goes to the connection with the fewest in flight.
//! One connection's task reads and writes for all of its streams, and so does the plugin's
//! side of it (grpc-go reads each connection on one goroutine, tonic on one task): with one
//! connection the whole exchange was one task's on each side, on one core. The number is not
//! tied to our cores, since it is mostly the plugin's parallelism it buys. A quiet client (an
//! orchestrator's health loop, a test) keeps one connection.
//!
//! On a current-thread runtime a connection's task reads a few answers per turn rather than
//! all the socket holds ([`pace`]), so the callers they wake send again while the rest are read.
//!
//! When the connection is gone (the plugin exited, or restarted and recreated its socket) the
//! next request finds it closed, and the link dials again — one dial, however many callers
//! notice at once. A request that provably never reached the socket — the connection failed
//! and not one byte was written on it since the request was queued, or the plugin refused the
//! stream (`REFUSED_STREAM`, which HTTP/2 defines as "not processed") — is sent again on the
//! new connection, so a plugin restart between two calls costs no failed attempt, even for a
//! mutating RPC. A request that may have reached the socket is never resent here: that is the
//! attempt loop's decision, by class.

use std::future::Future;
use std::io;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use csi_proto::pace::{Pace, PacedIo};
use http::header::{HeaderValue, USER_AGENT};
use http::uri::{Authority, Scheme, Uri};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::body::Body;
use tower::BoxError;

use crate::answer::AnswerWatch;
use crate::connection::{ConnectError, DialFailure, DialTarget, EitherStream, HandshakeError};
use crate::endpoint::{Address, Endpoint};

/// The `user-agent` of every request.
const AGENT: &str = concat!("csi-client/", env!("CARGO_PKG_VERSION"));

/// How long a keep-alive ping may go unanswered before the connection is declared dead.
const KEEP_ALIVE_TIMEOUT_CAP: Duration = Duration::from_secs(20);

/// Flow-control windows and limits, as hyper's HTTP/2 client set them before: 2 MiB per
/// stream, 5 MiB per connection, 16 KiB of header list, 1 MiB of queued send data per stream.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const MAX_HEADER_LIST: u32 = 16 * 1024;
const MAX_SEND_BUFFER: usize = 1024 * 1024;

/// Most HTTP/2 connections one link keeps to its plugin.
const MAX_CONNECTIONS: usize = 4;

/// Requests in flight on every open connection before the link opens another.
const GROW_AT: usize = 8;

/// On a current-thread runtime, each turn of a connection's task reads the answers to this
/// share of the link's requests in flight (see [`pace`]). Of 4, 8 and 16, 4 served 32 callers
/// best, and the three did about as well with fewer.
const ANSWERS_PER_TURN_DIVISOR: NonZeroUsize = NonZeroUsize::new(4).unwrap();

/// A self-healing HTTP/2 connection to one plugin, usable as a `tower::Service`. Cheap to
/// clone; every clone shares the connection.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    target: Arc<DialTarget>,
    /// Requests in flight on all the link's connections.
    in_flight: Arc<AtomicUsize>,
    authority: Authority,
    /// The connections: the first always dialled, the others only under load.
    slots: Box<[Slot]>,
}

/// One place for a connection.
#[derive(Debug)]
struct Slot {
    /// The connection in use, numbered so a caller that saw one die does not tear down the
    /// one another caller has just dialled; `None` until first needed (never for the first).
    current: Mutex<Option<Current>>,
    /// Held while dialling, so concurrent callers make one dial.
    redial: tokio::sync::Mutex<()>,
    /// A background dial for this slot is under way.
    growing: AtomicBool,
}

impl Slot {
    fn new(current: Option<Current>) -> Slot {
        Slot {
            current: Mutex::new(current),
            redial: tokio::sync::Mutex::new(()),
            growing: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self) -> Option<Current> {
        self.lock().clone()
    }
}

/// The slots of a link whose first connection is `first`.
fn slots(first: Current) -> Box<[Slot]> {
    std::iter::once(Slot::new(Some(first)))
        .chain((1..MAX_CONNECTIONS).map(|_| Slot::new(None)))
        .collect()
}

#[derive(Clone, Debug)]
struct Current {
    generation: u64,
    sender: h2::client::SendRequest<Bytes>,
    state: Arc<ConnState>,
}

/// What the link knows of one connection, shared with its task and its socket.
#[derive(Debug, Default)]
struct ConnState {
    /// Requests in flight on all the link's connections (the link's count, shared).
    link_in_flight: Arc<AtomicUsize>,
    /// The connection's task has ended: the connection is gone.
    closed: AtomicBool,
    /// Bytes written to the socket so far: a request queued when this read `n` and failed
    /// with the connection while it still reads `n` never reached the socket.
    written: AtomicU64,
    /// Requests sent whose answer is not finished (keep-alive pings only while some are).
    in_flight: AtomicUsize,
}

impl ConnState {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// How far one attempt's request got, shared between the attempt loop and the link through
/// the request's extensions. When the attempt deadline expires, it tells "nothing was sent:
/// the plugin could not be reached" from "the plugin may be working on it".
#[derive(Clone, Debug, Default)]
pub(crate) struct Handover(Arc<AtomicU8>);

const WAITING: u8 = 0;
const HANDED: u8 = 1;

impl Handover {
    /// A fresh marker: the request is waiting for a connection.
    pub(crate) fn new() -> Handover {
        Handover(Arc::new(AtomicU8::new(WAITING)))
    }

    /// The request is waiting for a connection (a dial is in progress); nothing was sent.
    pub(crate) fn waiting(&self) {
        self.0.store(WAITING, Ordering::Relaxed);
    }

    /// The request is given to the connection (or to the client's layers on the way there):
    /// from now on the plugin may receive it.
    pub(crate) fn handed(&self) {
        self.0.store(HANDED, Ordering::Relaxed);
    }

    /// Whether the request was still waiting for a connection.
    pub(crate) fn is_waiting(&self) -> bool {
        self.0.load(Ordering::Relaxed) == WAITING
    }
}

/// Why one send on one connection failed.
enum Failed {
    /// The request provably never reached the plugin.
    Unsent,
    /// It may have.
    Sent(h2::Error),
}

impl Link {
    /// Dials `target` (waiting for its socket as its options say) and sets up HTTP/2.
    pub(crate) async fn connect(target: Arc<DialTarget>) -> Result<Link, DialFailure> {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (sender, state) = handshake(&target, &in_flight).await?;
        Ok(Link {
            shared: Arc::new(Shared {
                in_flight,
                authority: authority(target.endpoint()),
                target,
                slots: slots(Current {
                    generation: 0,
                    sender,
                    state,
                }),
            }),
        })
    }

    /// Sends `request` on the current connection, dialling again first if it is gone.
    pub(crate) async fn send(
        self,
        mut request: http::Request<Body>,
    ) -> Result<http::Response<Body>, BoxError> {
        self.shared.address(&mut request)?;
        let handover = request.extensions().get::<Handover>().cloned();
        let answer = request.extensions().get::<AnswerWatch>().cloned();
        let (head, body) = request.into_parts();
        // A CSI request is one message (no RPC streams requests): tonic's body holds it
        // already encoded, and it goes out with the headers in one write.
        let data = body.collect().await?.to_bytes();
        let Some((slot, mut current)) = self.pick() else {
            return Err(self.shared.closed_unsent());
        };
        let mut redialled = false;
        loop {
            if current.state.is_closed() {
                if redialled {
                    // A connection dialled for this very request closed at once: give up
                    // rather than dial in a loop until the deadline.
                    return Err(self.shared.closed_unsent());
                }
                current = self
                    .shared
                    .redial(slot, current.generation, handover.as_ref())
                    .await?;
                redialled = true;
            }
            if let Some(handover) = &handover {
                handover.handed();
            }
            match current.send_once(&head, &data).await {
                Ok((response, in_flight)) => {
                    let response = response.map(|recv| H2Body {
                        recv,
                        data_done: false,
                        _in_flight: in_flight,
                    });
                    return Ok(match &answer {
                        Some(answer) => answer.watch(response),
                        None => response.map(Body::new),
                    });
                }
                // Nothing reached the plugin: once more on a new connection.
                Err(Failed::Unsent) if !redialled => {
                    current = self
                        .shared
                        .redial(slot, current.generation, handover.as_ref())
                        .await?;
                    redialled = true;
                }
                Err(Failed::Unsent) => return Err(self.shared.closed_unsent()),
                Err(Failed::Sent(error)) => return Err(Box::new(error)),
            }
        }
    }
}

impl Link {
    /// The open connection with the fewest requests in flight (and its slot); when even that
    /// one has [`GROW_AT`], another connection is dialled in the background for later
    /// requests. With every connection closed, the first, for the caller to dial again.
    fn pick(&self) -> Option<(usize, Current)> {
        let mut best: Option<(usize, usize)> = None;
        let mut vacant = None;
        for (index, slot) in self.shared.slots.iter().enumerate() {
            match slot.lock().as_ref() {
                Some(current) if !current.state.is_closed() => {
                    let load = current.state.in_flight.load(Ordering::Relaxed);
                    if best.is_none_or(|(_, least)| load < least) {
                        best = Some((index, load));
                    }
                }
                _ if index > 0 => {
                    vacant.get_or_insert(index);
                }
                _ => {}
            }
        }
        let (index, load) = best.unwrap_or((0, 0));
        if load >= GROW_AT
            && let Some(vacant) = vacant
        {
            self.grow(vacant);
        }
        // The first slot always holds a connection, so this is `None` only for a slot
        // emptied since it was looked at.
        Some((index, self.shared.slots[index].get()?))
    }

    /// Dials a connection into slot `index` in the background, unless one is under way.
    fn grow(&self, index: usize) {
        let shared = Arc::clone(&self.shared);
        if shared.slots[index].growing.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(async move {
            let slot = &shared.slots[index];
            match handshake(&shared.target, &shared.in_flight).await {
                Ok((sender, state)) => {
                    let mut current = slot.lock();
                    let generation = current.as_ref().map_or(0, |c| c.generation + 1);
                    *current = Some(Current {
                        generation,
                        sender,
                        state,
                    });
                }
                Err(error) => {
                    tracing::debug!(endpoint = %shared.target.endpoint(), %error, "extra plugin connection not dialled");
                }
            }
            slot.growing.store(false, Ordering::Release);
        });
    }
}

/// A request in flight on one connection; counted while its answer is read.
#[derive(Debug)]
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn new(state: &Arc<ConnState>) -> InFlight {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        state.link_in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(state))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.link_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Current {
    /// Opens a stream for the request and waits for the answer's headers.
    async fn send_once(
        &self,
        head: &http::request::Parts,
        data: &Bytes,
    ) -> Result<(http::Response<h2::RecvStream>, InFlight), Failed> {
        let in_flight = InFlight::new(&self.state);
        let mark = self.state.written.load(Ordering::Acquire);
        let failed = |error: h2::Error| {
            let refused = error.reason() == Some(h2::Reason::REFUSED_STREAM) && error.is_remote();
            // Not one byte was written since the request was queued, and the connection,
            // not the plugin, ended the stream: the request never reached the socket.
            let unwritten = !error.is_reset()
                && !error.is_remote()
                && self.state.written.load(Ordering::Acquire) == mark;
            if refused || unwritten {
                Failed::Unsent
            } else {
                Failed::Sent(error)
            }
        };
        // Before the stream opens, a failure means the connection is unusable and nothing
        // was queued.
        let mut sender = self
            .sender
            .clone()
            .ready()
            .await
            .map_err(|_| Failed::Unsent)?;
        let mut request = http::Request::new(());
        *request.method_mut() = head.method.clone();
        *request.uri_mut() = head.uri.clone();
        *request.headers_mut() = head.headers.clone();
        let (response, mut stream) = sender
            .send_request(request, data.is_empty())
            .map_err(|_| Failed::Unsent)?;
        if !data.is_empty() {
            stream.send_data(data.clone(), true).map_err(failed)?;
        }
        let response = response.await.map_err(failed)?;
        Ok((response, in_flight))
    }
}

/// An answer's body: the stream's data, then its trailers (where gRPC puts its status).
struct H2Body {
    recv: h2::RecvStream,
    data_done: bool,
    _in_flight: InFlight,
}

impl http_body::Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if !this.data_done {
            match this.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(data))) => {
                    // Read: the plugin may send as much again.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(None) => this.data_done = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        match this.recv.poll_trailers(cx) {
            Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(error)) => Poll::Ready(Some(Err(error))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Shared {
    /// The error of a request that a freshly dialled connection closed on before taking it.
    fn closed_unsent(&self) -> BoxError {
        Box::new(DialFailure::Connect(ConnectError::closed_unsent(
            self.target.endpoint(),
        )))
    }

    /// A live connection in slot `index` other than generation `dead`: the one another
    /// caller dialled meanwhile, or a new one.
    async fn redial(
        &self,
        index: usize,
        dead: u64,
        handover: Option<&Handover>,
    ) -> Result<Current, DialFailure> {
        if let Some(handover) = handover {
            handover.waiting();
        }
        let slot = &self.slots[index];
        let _dialling = slot.redial.lock().await;
        let generation = match slot.get() {
            Some(current) if current.generation != dead && !current.state.is_closed() => {
                return Ok(current);
            }
            Some(current) => current.generation + 1,
            None => dead + 1,
        };
        tracing::debug!(endpoint = %self.target.endpoint(), "plugin connection closed, dialling again");
        let (sender, state) = handshake(&self.target, &self.in_flight).await?;
        let fresh = Current {
            generation,
            sender,
            state,
        };
        *slot.lock() = Some(fresh.clone());
        Ok(fresh)
    }

    /// Gives a request from a generated client (which carries only the path) its scheme and
    /// `:authority`.
    fn address(&self, request: &mut http::Request<Body>) -> Result<(), http::Error> {
        if request.uri().scheme().is_none() {
            let mut parts = std::mem::take(request.uri_mut()).into_parts();
            parts.scheme = Some(Scheme::HTTP);
            parts.authority = Some(self.authority.clone());
            *request.uri_mut() = Uri::from_parts(parts)?;
        }
        request
            .headers_mut()
            .entry(USER_AGENT)
            .or_insert(HeaderValue::from_static(AGENT));
        Ok(())
    }
}

/// The `:authority` of every request: `localhost` for a unix socket (strict servers refuse a
/// socket path there), `host:port` for tcp.
fn authority(endpoint: &Endpoint) -> Authority {
    let text = match endpoint.address() {
        Address::Unix(_) => return Authority::from_static("localhost"),
        Address::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
        Address::Tcp { host, port } => format!("{host}:{port}"),
    };
    // Every way to make an endpoint already refused anything that is not host:port.
    text.parse()
        .unwrap_or_else(|_| Authority::from_static("localhost"))
}

/// The socket, counting the bytes written to it.
struct Counted {
    io: EitherStream,
    state: Arc<ConnState>,
}

impl Counted {
    fn count(&self, written: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = &written {
            self.state.written.fetch_add(*n as u64, Ordering::Release);
        }
        written
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        this.count(written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.count(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Opens the socket and sets up HTTP/2 on it; the connection is driven by a task of its own
/// until the plugin closes it, a keep-alive ping goes unanswered, or every sender is dropped.
async fn handshake(
    target: &DialTarget,
    link_in_flight: &Arc<AtomicUsize>,
) -> Result<(h2::client::SendRequest<Bytes>, Arc<ConnState>), DialFailure> {
    let io = target.open().await.map_err(DialFailure::Connect)?;
    let (sender, state) = start(io, target.options().keep_alive, link_in_flight)
        .await
        .map_err(|source| DialFailure::Handshake(HandshakeError::new(target.endpoint(), source)))?;
    tracing::debug!(endpoint = %target.endpoint(), "connected to plugin");
    Ok((sender, state))
}

/// Sets up HTTP/2 on `io` and spawns the connection's task.
async fn start(
    io: EitherStream,
    keep_alive: Option<Duration>,
    link_in_flight: &Arc<AtomicUsize>,
) -> Result<(h2::client::SendRequest<Bytes>, Arc<ConnState>), h2::Error> {
    let state = Arc::new(ConnState {
        link_in_flight: Arc::clone(link_in_flight),
        ..ConnState::default()
    });
    let io = PacedIo::client(
        Counted {
            io,
            state: Arc::clone(&state),
        },
        pace(link_in_flight),
    );
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .enable_push(false)
        .handshake::<_, Bytes>(io)
        .await?;
    let task_state = Arc::clone(&state);
    tokio::spawn(async move {
        let ended = drive(connection, keep_alive, &task_state).await;
        task_state.closed.store(true, Ordering::Release);
        if let Err(error) = ended {
            tracing::debug!(%error, "plugin connection ended with an error");
        }
    });
    Ok((sender, state))
}

/// How the connection's answers are read. On a current-thread runtime, a quarter of the
/// link's requests in flight per turn (at least one), so that the callers the first answers
/// wake send their next requests while the rest are still being read. Every task shares the
/// one thread there, so reading all the answers first would hold those requests back until
/// the whole batch is handled, and the plugin would wait for them (measured on two cores
/// against the csi-testkit mock: about 2.5 times the calls per second at 4 callers, the same
/// at 32). On a multi-thread runtime, where callers already run beside the connection's task,
/// pacing cost up to half the calls per second at 4–8 callers, so the answers are read as
/// they come.
fn pace(link_in_flight: &Arc<AtomicUsize>) -> Pace {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => Pace::InFlight {
            in_flight: Arc::clone(link_in_flight),
            divisor: ANSWERS_PER_TURN_DIVISOR,
        },
        _ => Pace::Off,
    }
}

/// Drives the connection until it ends; with `keep_alive`, pings the plugin every interval
/// while requests are in flight, and ends the connection when a ping goes unanswered.
async fn drive(
    mut connection: h2::client::Connection<PacedIo<Counted>, Bytes>,
    keep_alive: Option<Duration>,
    state: &ConnState,
) -> Result<(), BoxError> {
    let Some(interval) = keep_alive else {
        return Ok(connection.await?);
    };
    let Some(mut pings) = connection.ping_pong() else {
        return Ok(connection.await?);
    };
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            ended = &mut connection => return Ok(ended?),
            _ = ticks.tick() => {}
        }
        if state.in_flight.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let ping = tokio::time::timeout(
            interval.min(KEEP_ALIVE_TIMEOUT_CAP),
            pings.ping(h2::Ping::opaque()),
        );
        tokio::select! {
            ended = &mut connection => return Ok(ended?),
            answered = ping => match answered {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => return Err(error.into()),
                Err(_) => return Err("keep-alive ping unanswered".into()),
            },
        }
    }
}

impl tower::Service<http::Request<Body>> for Link {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = LinkFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is decided per request, in `send`: a closed connection is redialled there.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> LinkFuture {
        Box::pin(self.clone().send(request))
    }
}

/// The response future of a [`Link`].
pub(crate) type LinkFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send + 'static>>;

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use csi_proto::v1::ProbeRequest;
    use csi_proto::v1::identity_client::IdentityClient;

    use super::*;
    use crate::channel::PluginChannel;
    use crate::connection::ConnectOptions;

    /// A connection about to die: a socket pair whose peer end is dropped right after the
    /// HTTP/2 preface went out, before the connection's task has run.
    async fn doomed() -> Current {
        let (ours, theirs) = tokio::net::UnixStream::pair().expect("test invariant: socket pairs");
        let io = EitherStream::unix(ours);
        let (sender, state) = start(io, None, &Arc::default())
            .await
            .expect("test invariant: the preface fits the socket buffer");
        drop(theirs);
        Current {
            generation: 0,
            sender,
            state,
        }
    }

    fn link_with(target: Arc<DialTarget>, current: Current) -> Link {
        Link {
            shared: Arc::new(Shared {
                authority: authority(target.endpoint()),
                in_flight: Arc::clone(&current.state.link_in_flight),
                target,
                slots: slots(current),
            }),
        }
    }

    #[tokio::test]
    async fn a_plugin_that_drops_every_connection_is_not_dialled_in_a_loop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        // Accepts and hangs up at once, like a plugin crashing on every connection.
        let dropper = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        });
        let dials = Arc::new(AtomicU64::new(0));
        let target = Arc::new(DialTarget::new(
            Endpoint::unix(&path).unwrap(),
            ConnectOptions::DEFAULT,
            Arc::clone(&dials),
        ));
        let link = link_with(target, doomed().await);
        let mut identity = IdentityClient::new(PluginChannel::plain(link));
        let status = tokio::time::timeout(Duration::from_secs(30), identity.probe(ProbeRequest {}))
            .await
            .expect("hang guard: the link gave up instead of redialling forever")
            .unwrap_err();
        // Nothing was sent: the new connection closed before taking the request (or, had the
        // hang-up beaten the handshake, the handshake failed).
        let kind = crate::call::kind_of_status(status, &AnswerWatch::new());
        assert!(
            matches!(
                kind,
                crate::error::ErrorKind::NotConnected(_) | crate::error::ErrorKind::Handshake(_)
            ),
            "{kind:?}"
        );
        assert_eq!(
            dials.load(Ordering::Relaxed),
            1,
            "one redial, then the error"
        );
        dropper.abort();
    }

    #[tokio::test]
    async fn a_request_handed_back_unsent_goes_out_on_a_new_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let plugin = csi_testkit::MockPlugin::builder().build().unwrap();
        let server = plugin.serve_unix(&path).await.unwrap();
        let dials = Arc::new(AtomicU64::new(0));
        let target = Arc::new(DialTarget::new(
            Endpoint::unix(&path).unwrap(),
            ConnectOptions::DEFAULT,
            Arc::clone(&dials),
        ));
        let link = link_with(target, doomed().await);
        let handover = Handover::new();
        handover.handed();
        let mut request = tonic::Request::new(ProbeRequest {});
        request.extensions_mut().insert(handover.clone());
        let mut identity = IdentityClient::new(PluginChannel::plain(link.clone()));
        // The doomed connection looks open when the request is queued on it; it closes
        // before taking it, hands it back, and the link sends it on a fresh dial.
        identity.probe(request).await.unwrap();
        assert_eq!(dials.load(Ordering::Relaxed), 1, "one new dial");
        assert_eq!(link.shared.slots[0].get().map(|c| c.generation), Some(1));
        assert!(!handover.is_waiting(), "handed to the new connection");
        assert_eq!(plugin.calls().count(csi_proto::Rpc::Probe), 1);
        server.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn a_quiet_link_keeps_one_connection_and_a_busy_one_opens_more() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let plugin = csi_testkit::MockPlugin::builder().build().unwrap();
        let server = plugin.serve_unix(&path).await.unwrap();
        let dials = Arc::new(AtomicU64::new(0));
        let target = Arc::new(DialTarget::new(
            Endpoint::unix(&path).unwrap(),
            ConnectOptions::DEFAULT,
            Arc::clone(&dials),
        ));
        let link = Link::connect(target).await.unwrap();
        let identity = IdentityClient::new(PluginChannel::plain(link.clone()));
        for _ in 0..50 {
            identity.clone().probe(ProbeRequest {}).await.unwrap();
        }
        assert_eq!(
            dials.load(Ordering::Relaxed),
            1,
            "one caller at a time: one connection"
        );

        // Every Probe now hangs until released, so the callers pile up in flight.
        plugin
            .faults()
            .on(csi_proto::Rpc::Probe)
            .forever(csi_testkit::FaultStep::Hang)
            .install();
        let callers: Vec<_> = (0..2 * GROW_AT)
            .map(|_| {
                let mut identity = identity.clone();
                tokio::spawn(async move { identity.probe(ProbeRequest {}).await })
            })
            .collect();
        let want = 2;
        tokio::time::timeout(Duration::from_secs(30), async {
            while dials.load(Ordering::Relaxed) < want
                || plugin.calls().count(csi_proto::Rpc::Probe) < 50 + 2 * GROW_AT
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("hang guard: the callers reached the plugin");
        plugin.faults().release_hung();
        for caller in callers {
            let _ = caller.await;
        }
        assert_eq!(
            dials.load(Ordering::Relaxed),
            want,
            "with {} calls in flight a second connection",
            2 * GROW_AT
        );
        let open = link
            .shared
            .slots
            .iter()
            .filter(|slot| slot.get().is_some())
            .count();
        assert_eq!(open as u64, want);
        server.shutdown().await.unwrap();
    }
}
