//! One lazily dialled, self-healing HTTP/2 connection to a plugin.
//!
//! A [`Connection`] stores the endpoint and dials nothing until the first call. The first call
//! (however many tasks make it at once) performs exactly one dial; everybody else waits for that
//! dial. The dial waits, with bounded exponential backoff, for a socket the plugin has not
//! created yet. Once connected, the link (the h2 crate's HTTP/2 client on our socket, the crate's
//! `link` module) is shared by every service client; when the plugin restarts and recreates
//! its socket, the link dials again on the next call through the same waiting dial, and a
//! request the old connection never took is sent on the new one. The client's tower layers, if
//! any, wrap the link once, right after the first dial, inside that one dial (see
//! [`crate::channel`]).
//!
//! The `:authority` of every request is `localhost` for a unix socket (strict servers reject a
//! socket path as authority) and `host:port` for tcp.

use std::fmt;
use std::io;
use std::os::unix::fs::FileTypeExt as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};
use tokio::sync::OnceCell;

use crate::channel::{LayerStack, PluginChannel};
use crate::endpoint::{Address, Endpoint};
use crate::link::Link;

/// How a [`Connection`] dials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// How long one dial waits for the socket to appear (or to accept) before giving up.
    /// Bounded so a plugin that never starts cannot hold a caller forever; every call is
    /// additionally bounded by its own deadline.
    pub socket_wait: Duration,
    /// First pause between dial attempts while waiting.
    pub initial_backoff: Duration,
    /// Longest pause between dial attempts.
    pub max_backoff: Duration,
    /// HTTP/2 keep-alive ping interval; `None` disables pings. Pings detect a dead connection
    /// while no call is running.
    pub keep_alive: Option<Duration>,
}

impl ConnectOptions {
    /// Defaults: wait up to 30 s for the socket, polling from 10 ms up to 1 s apart (the
    /// Kubernetes sidecars wait 30 s for a driver's socket and cap their backoff at 1 s);
    /// keep-alive every 30 s.
    pub const DEFAULT: ConnectOptions = ConnectOptions {
        socket_wait: Duration::from_secs(30),
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_secs(1),
        keep_alive: Some(Duration::from_secs(30)),
    };
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Why a dial can never succeed while the endpoint and the filesystem stay as they are.
///
/// A socket that is missing or refuses connections is a plugin starting or restarting: the
/// dial waits for it (bounded by [`ConnectOptions::socket_wait`]) and the call retries it.
/// These faults are different: waiting cannot fix them, so the dial gives up at once and the
/// call ends at its first attempt with [`ErrorKind::BadEndpoint`](crate::ErrorKind::BadEndpoint),
/// class [`Fatal`](csi_structs::ErrorClass::Fatal). Someone has to change the endpoint, the
/// file at its path or the permissions; until then, sending the call again fails the same way.
///
/// Other dial errors (a DNS failure, an unreachable network) are not faults: they may pass,
/// and are retried as a plugin that could not be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndpointFault {
    /// The path exists but is not a socket (a regular file, a directory, ...). The kernel
    /// refuses such a connection exactly as it refuses a socket nobody listens on; the client
    /// tells the two apart by the file's type.
    NotASocket,
    /// Permission denied (`EACCES`, `EPERM`): this process may not connect to the socket, or
    /// may not search a directory on its path. The socket's or a directory's owner or mode
    /// must change.
    PermissionDenied,
    /// A component of the socket path is not a directory (`ENOTDIR`).
    NotADirectory,
    /// The system refused the address itself (`EINVAL`).
    InvalidAddress,
    /// The path or one of its components is longer than the filesystem allows
    /// (`ENAMETOOLONG`).
    NameTooLong,
}

impl EndpointFault {
    /// A snake_case name, for metrics and logs: `not_a_socket`, `permission_denied`,
    /// `not_a_directory`, `invalid_address`, `name_too_long`.
    pub const fn as_str(self) -> &'static str {
        match self {
            EndpointFault::NotASocket => "not_a_socket",
            EndpointFault::PermissionDenied => "permission_denied",
            EndpointFault::NotADirectory => "not_a_directory",
            EndpointFault::InvalidAddress => "invalid_address",
            EndpointFault::NameTooLong => "name_too_long",
        }
    }
}

impl fmt::Display for EndpointFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EndpointFault::NotASocket => "the path exists but is not a socket",
            EndpointFault::PermissionDenied => {
                "permission denied on the socket or a directory on its path"
            }
            EndpointFault::NotADirectory => "a component of the socket path is not a directory",
            EndpointFault::InvalidAddress => "the system refused the address as invalid",
            EndpointFault::NameTooLong => "the socket path is longer than the filesystem allows",
        })
    }
}

/// A dial that failed: the request never reached the plugin.
///
/// A redial inside a call returns this type through the HTTP/2 service, so the client
/// recognises "never connected" in a failed call by its type, not its text.
#[derive(Debug)]
pub struct ConnectError {
    endpoint: String,
    waited: Duration,
    fault: Option<EndpointFault>,
    source: io::Error,
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fault {
            Some(fault) => write!(
                f,
                "cannot connect to {}: {fault}, which no wait can change: {}",
                self.endpoint, self.source
            ),
            None if self.waited.is_zero() => {
                write!(f, "could not connect to {}: {}", self.endpoint, self.source)
            }
            None => write!(
                f,
                "could not connect to {} after waiting {:?}: {}",
                self.endpoint, self.waited, self.source
            ),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl ConnectError {
    /// The endpoint, as text.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// How long the dial waited before giving up.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The last I/O error of the dial.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }

    /// Why no wait can make this dial succeed, when that is so; `None` for a socket that is
    /// missing, refuses connections or did not accept in time (a plugin that may yet come).
    pub fn fault(&self) -> Option<EndpointFault> {
        self.fault
    }

    /// The dial did not finish within the caller's deadline (the socket is missing or does
    /// not accept).
    pub(crate) fn timed_out(endpoint: &Endpoint, waited: Duration) -> ConnectError {
        ConnectError {
            endpoint: endpoint.to_string(),
            waited,
            fault: None,
            source: io::Error::new(
                io::ErrorKind::TimedOut,
                "the plugin socket did not accept a connection before the deadline",
            ),
        }
    }

    /// A dial of `endpoint` that failed with `source` for a reason no wait can fix.
    pub(crate) fn faulty(
        endpoint: &Endpoint,
        fault: EndpointFault,
        source: io::Error,
    ) -> ConnectError {
        ConnectError {
            endpoint: endpoint.to_string(),
            waited: Duration::ZERO,
            fault: Some(fault),
            source,
        }
    }

    /// The new connection closed before it took the request: nothing was sent.
    pub(crate) fn closed_unsent(endpoint: &Endpoint) -> ConnectError {
        ConnectError {
            endpoint: endpoint.to_string(),
            waited: Duration::ZERO,
            fault: None,
            source: io::Error::new(
                io::ErrorKind::ConnectionReset,
                "the plugin closed a new connection before the request was sent",
            ),
        }
    }

    /// A copy (the I/O error keeps its kind and text, not its OS payload), for taking the
    /// error out of a chain that owns it.
    pub(crate) fn duplicate(&self) -> ConnectError {
        ConnectError {
            endpoint: self.endpoint.clone(),
            waited: self.waited,
            fault: self.fault,
            source: io::Error::new(self.source.kind(), self.source.to_string()),
        }
    }
}

/// The socket opened but the HTTP/2 connection could not be set up on it: nothing was sent.
#[derive(Clone, Debug, thiserror::Error)]
#[error("HTTP/2 handshake with {endpoint} failed: {source}")]
pub struct HandshakeError {
    endpoint: String,
    // Shared, so the error can be taken out of a failed call's source chain.
    #[source]
    source: Arc<h2::Error>,
}

impl HandshakeError {
    pub(crate) fn new(endpoint: &Endpoint, source: h2::Error) -> HandshakeError {
        HandshakeError {
            endpoint: endpoint.to_string(),
            source: Arc::new(source),
        }
    }

    /// The endpoint, as text.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// A lazily dialled connection to one plugin endpoint; cheap to clone, all clones share one
/// HTTP/2 link (wrapped in the client's layers, if any).
#[derive(Clone, Debug)]
pub struct Connection {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    endpoint: Endpoint,
    options: ConnectOptions,
    channel: OnceCell<PluginChannel>,
    dials: Arc<AtomicU64>,
    /// Applied once to the channel right after the first dial.
    layers: Option<LayerStack>,
}

/// Why a dial (the first one, or a redial inside a call) failed. Nothing was sent either way.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialFailure {
    /// The socket could not be opened within the wait.
    #[error(transparent)]
    Connect(ConnectError),
    /// The socket opened but the HTTP/2 connection could not be set up.
    #[error(transparent)]
    Handshake(HandshakeError),
}

impl Connection {
    /// A connection to `endpoint` with [`ConnectOptions::DEFAULT`]. Dials nothing yet.
    pub fn new(endpoint: Endpoint) -> Self {
        Self::with_options(endpoint, ConnectOptions::DEFAULT)
    }

    /// A connection to `endpoint` with explicit options. Dials nothing yet.
    pub fn with_options(endpoint: Endpoint, options: ConnectOptions) -> Self {
        Self::layered(endpoint, options, None)
    }

    /// A connection whose channel is wrapped in `layers` once dialled.
    pub(crate) fn layered(
        endpoint: Endpoint,
        options: ConnectOptions,
        layers: Option<LayerStack>,
    ) -> Self {
        Connection {
            inner: Arc::new(Inner {
                endpoint,
                options,
                channel: OnceCell::new(),
                dials: Arc::new(AtomicU64::new(0)),
                layers,
            }),
        }
    }

    /// The endpoint this connection dials.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.endpoint
    }

    /// How many times a socket was dialled so far (initial dial, every wait-loop try,
    /// reconnects, and the extra connections a busy client opens: at most four, once 8
    /// requests are in flight on each). Useful for diagnostics and tests; not a
    /// health signal.
    pub fn dial_attempts(&self) -> u64 {
        self.inner.dials.load(Ordering::Relaxed)
    }

    /// Dials the endpoint once, without waiting or retrying, and closes what it opened:
    /// whether something accepts connections there now. A call would wait for a socket that
    /// refuses (a plugin starting); this says at once that nobody listens, for an operator.
    /// Not counted in [`dial_attempts`](Self::dial_attempts); the shared channel is untouched.
    ///
    /// # Errors
    ///
    /// The [`ConnectError`] of the dial: its [`fault`](ConnectError::fault) says when no wait
    /// can help (e.g. the path is not a socket).
    pub async fn dial_once(&self) -> Result<(), ConnectError> {
        let uncounted = Arc::new(AtomicU64::new(0));
        let target = DialTarget::new(
            self.inner.endpoint.clone(),
            self.inner.options.clone(),
            uncounted,
        );
        let Err(err) = target.open_once().await else {
            return Ok(());
        };
        Err(match target.fault(&err).await {
            Some(fault) => ConnectError::faulty(&target.endpoint, fault, err),
            None => ConnectError {
                endpoint: target.endpoint.to_string(),
                waited: Duration::ZERO,
                fault: None,
                source: err,
            },
        })
    }

    /// Whether the first dial has completed.
    pub fn is_connected(&self) -> bool {
        self.inner.channel.initialized()
    }

    /// The shared channel (wrapped in the client's layers), dialling once if needed.
    /// Cancel-safe: if the caller's future is dropped mid-dial, the next caller dials.
    pub(crate) async fn channel(&self) -> Result<PluginChannel, DialFailure> {
        self.inner
            .channel
            .get_or_try_init(|| self.dial())
            .await
            .cloned()
    }

    async fn dial(&self) -> Result<PluginChannel, DialFailure> {
        let inner = &self.inner;
        let target = Arc::new(DialTarget::new(
            inner.endpoint.clone(),
            inner.options.clone(),
            Arc::clone(&inner.dials),
        ));
        let channel = PluginChannel::plain(Link::connect(target).await?);
        Ok(match &inner.layers {
            Some(layers) => layers.apply(channel),
            None => channel,
        })
    }
}

/// Where and how to dial: shared by the first dial and every redial of the link.
#[derive(Debug)]
pub(crate) struct DialTarget {
    endpoint: Endpoint,
    options: ConnectOptions,
    dials: Arc<AtomicU64>,
}

/// A stream to the plugin, unix or tcp.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl DialTarget {
    /// Dials `endpoint` with `options`, counting every try in `dials`.
    pub(crate) fn new(endpoint: Endpoint, options: ConnectOptions, dials: Arc<AtomicU64>) -> Self {
        DialTarget {
            endpoint,
            options,
            dials,
        }
    }

    /// The endpoint dialled.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The dial options.
    pub(crate) fn options(&self) -> &ConnectOptions {
        &self.options
    }

    async fn open_once(&self) -> io::Result<Stream> {
        self.dials.fetch_add(1, Ordering::Relaxed);
        match self.endpoint.address() {
            Address::Unix(path) => UnixStream::connect(path).await.map(Stream::Unix),
            Address::Tcp { host, port } => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Ok(Stream::Tcp(stream))
            }
        }
    }

    /// Why no wait can make a dial that failed with `err` succeed, if that is so.
    async fn fault(&self, err: &io::Error) -> Option<EndpointFault> {
        let unix = self.endpoint.unix_path();
        match err.kind() {
            io::ErrorKind::PermissionDenied => Some(EndpointFault::PermissionDenied),
            io::ErrorKind::NotADirectory => Some(EndpointFault::NotADirectory),
            io::ErrorKind::InvalidFilename => Some(EndpointFault::NameTooLong),
            // For tcp, only the system's own EINVAL: a host that resolved to no address is
            // reported as InvalidInput too, and DNS may yet answer.
            io::ErrorKind::InvalidInput if unix.is_some() || err.raw_os_error().is_some() => {
                Some(EndpointFault::InvalidAddress)
            }
            // A file that is not a socket refuses like a socket nobody listens on: look.
            io::ErrorKind::ConnectionRefused => {
                let found = tokio::fs::metadata(unix?).await.ok()?;
                (!found.file_type().is_socket()).then_some(EndpointFault::NotASocket)
            }
            _ => None,
        }
    }

    /// Dials, waiting with backoff while the socket is missing or refuses connections (a
    /// plugin that is starting, or restarting and recreating its socket). A fault no wait
    /// can fix ([`EndpointFault`]) ends the dial at once.
    pub(crate) async fn open(&self) -> Result<EitherStream, ConnectError> {
        let start = tokio::time::Instant::now();
        let mut pause = self.options.initial_backoff;
        loop {
            match self.open_once().await {
                Ok(stream) => return Ok(EitherStream(stream)),
                Err(err) => {
                    let waited = start.elapsed();
                    if let Some(fault) = self.fault(&err).await {
                        tracing::debug!(endpoint = %self.endpoint, error = %err, fault = fault.as_str(), "plugin endpoint cannot be dialled");
                        return Err(ConnectError {
                            waited,
                            ..ConnectError::faulty(&self.endpoint, fault, err)
                        });
                    }
                    let transient = matches!(
                        err.kind(),
                        io::ErrorKind::NotFound
                            | io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::ConnectionReset
                    );
                    if !transient || waited + pause > self.options.socket_wait {
                        return Err(ConnectError {
                            endpoint: self.endpoint.to_string(),
                            waited,
                            fault: None,
                            source: err,
                        });
                    }
                    tracing::trace!(endpoint = %self.endpoint, error = %err, ?pause, "plugin socket not ready, waiting");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(self.options.max_backoff);
                }
            }
        }
    }
}

/// A unix or tcp stream behind one type, so one connector serves both endpoint kinds.
pub(crate) struct EitherStream(Stream);

impl EitherStream {
    /// A unix stream made elsewhere (a socket pair in tests).
    #[cfg(test)]
    pub(crate) fn unix(stream: UnixStream) -> EitherStream {
        EitherStream(Stream::Unix(stream))
    }
}

impl tokio::io::AsyncRead for EitherStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Stream::Unix(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for EitherStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            Stream::Unix(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Stream::Unix(s) => std::pin::Pin::new(s).poll_flush(cx),
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match &mut self.get_mut().0 {
            Stream::Unix(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        match &mut self.get_mut().0 {
            Stream::Unix(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tcp(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.0 {
            Stream::Unix(s) => s.is_write_vectored(),
            Stream::Tcp(s) => s.is_write_vectored(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(endpoint: &str) -> DialTarget {
        let endpoint = endpoint
            .parse()
            .expect("test invariant: the endpoint is well formed");
        DialTarget::new(endpoint, ConnectOptions::DEFAULT, Arc::default())
    }

    fn os(kind: io::ErrorKind) -> io::Error {
        io::Error::from(kind)
    }

    #[tokio::test]
    async fn errors_no_wait_can_fix_are_faults() {
        let unix = target("unix:///run/csi/none.sock");
        for (kind, want) in [
            (
                io::ErrorKind::PermissionDenied,
                EndpointFault::PermissionDenied,
            ),
            (io::ErrorKind::NotADirectory, EndpointFault::NotADirectory),
            (io::ErrorKind::InvalidFilename, EndpointFault::NameTooLong),
            (io::ErrorKind::InvalidInput, EndpointFault::InvalidAddress),
        ] {
            assert_eq!(unix.fault(&os(kind)).await, Some(want), "{kind:?}");
        }
        // A plugin starting or restarting: the dial waits.
        for kind in [
            io::ErrorKind::NotFound,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut,
        ] {
            assert_eq!(unix.fault(&os(kind)).await, None, "{kind:?}");
        }
        // Refused, and there is nothing at the path to look at: a socket may yet appear.
        assert_eq!(
            unix.fault(&os(io::ErrorKind::ConnectionRefused)).await,
            None
        );
    }

    #[tokio::test]
    async fn a_refusal_is_a_fault_only_when_the_path_is_not_a_socket() {
        let dir = tempfile::tempdir().expect("test invariant: temp dirs can be made");
        let file = dir.path().join("file.sock");
        std::fs::write(&file, b"").expect("test invariant: temp files can be written");
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("test invariant: fresh path"));
        let refused = || os(io::ErrorKind::ConnectionRefused);
        let at = |path: &std::path::Path| {
            DialTarget::new(
                Endpoint::unix(path).expect("test invariant: temp paths are short"),
                ConnectOptions::DEFAULT,
                Arc::default(),
            )
        };
        assert_eq!(
            at(&file).fault(&refused()).await,
            Some(EndpointFault::NotASocket)
        );
        assert_eq!(
            at(dir.path()).fault(&refused()).await,
            Some(EndpointFault::NotASocket)
        );
        assert_eq!(at(&stale).fault(&refused()).await, None, "a stale socket");
    }

    #[tokio::test]
    async fn tcp_faults_are_the_systems_own() {
        let tcp = target("tcp://127.0.0.1:9");
        assert_eq!(
            tcp.fault(&os(io::ErrorKind::PermissionDenied)).await,
            Some(EndpointFault::PermissionDenied)
        );
        // A name that resolved to no address: DNS may yet answer.
        let unresolved = io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        );
        assert_eq!(tcp.fault(&unresolved).await, None);
        // EINVAL is 22 on every unix.
        let einval = io::Error::from_raw_os_error(22);
        assert_eq!(einval.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            tcp.fault(&einval).await,
            Some(EndpointFault::InvalidAddress)
        );
        // Refused over tcp: nothing to look at, a proxy may yet listen.
        assert_eq!(tcp.fault(&os(io::ErrorKind::ConnectionRefused)).await, None);
    }
}
