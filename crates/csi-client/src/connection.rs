//! One lazily dialled, self-healing gRPC connection to a plugin.
//!
//! A [`Connection`] stores the endpoint and dials nothing until the first call. The first call
//! (however many tasks make it at once) performs exactly one dial; everybody else waits for that
//! dial. The dial waits, with bounded exponential backoff, for a socket the plugin has not
//! created yet. Once connected, the tonic `Channel` is shared by every service client; when the
//! plugin restarts and recreates its socket, the channel dials again on the next call through
//! the same waiting connector, so callers see at most one failed attempt (which the retry loop
//! absorbs for retry-safe RPCs). The client's tower layers, if any, wrap the channel once, right
//! after the first dial, inside that one dial (see [`crate::channel`]).
//!
//! The `:authority` of every request is `localhost`: the connector ignores the URI and dials the
//! socket, while the channel's URI is `http://localhost` (strict servers reject a socket path as
//! authority).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::OnceCell;
use tonic::transport::Uri;

use crate::channel::{LayerStack, PluginChannel};
use crate::endpoint::Endpoint;

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

/// A dial that failed: the request never reached the plugin.
///
/// This type is also what the connector hands to tonic, so the client can recognise "never
/// connected" in a failed call by its type, not its text.
#[derive(Debug, thiserror::Error)]
#[error("could not connect to {endpoint} after waiting {waited:?}: {source}")]
pub struct ConnectError {
    endpoint: String,
    waited: Duration,
    #[source]
    source: io::Error,
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

    /// The dial did not finish within the caller's deadline (the socket is missing or does
    /// not accept).
    pub(crate) fn timed_out(endpoint: &Endpoint, waited: Duration) -> ConnectError {
        ConnectError {
            endpoint: endpoint.to_string(),
            waited,
            source: io::Error::new(
                io::ErrorKind::TimedOut,
                "the plugin socket did not accept a connection before the deadline",
            ),
        }
    }

    /// A copy (the I/O error keeps its kind and text, not its OS payload), for taking the
    /// error out of a chain that owns it.
    pub(crate) fn duplicate(&self) -> ConnectError {
        ConnectError {
            endpoint: self.endpoint.clone(),
            waited: self.waited,
            source: io::Error::new(self.source.kind(), self.source.to_string()),
        }
    }
}

/// A lazily dialled connection to one plugin endpoint; cheap to clone, all clones share one
/// HTTP/2 channel (wrapped in the client's layers, if any).
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

/// The error of [`Connection::channel`]: either our own dial failed, or tonic refused the
/// connection after it was opened (for example the HTTP/2 handshake failed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialFailure {
    /// The socket could not be opened within the wait.
    #[error(transparent)]
    Connect(ConnectError),
    /// The socket opened but the HTTP/2 connection could not be set up.
    #[error("HTTP/2 handshake with {endpoint} failed: {source}")]
    Handshake {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
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

    /// How many times a socket was dialled so far (initial dial, every wait-loop try, and
    /// reconnects). Useful for diagnostics and tests; not a health signal.
    pub fn dial_attempts(&self) -> u64 {
        self.inner.dials.load(Ordering::Relaxed)
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
        let uri = match &inner.endpoint {
            Endpoint::Unix(_) => Uri::from_static("http://localhost"),
            Endpoint::Tcp { host, port } => {
                let text = if host.contains(':') {
                    format!("http://[{host}]:{port}")
                } else {
                    format!("http://{host}:{port}")
                };
                // The endpoint parser already refused anything that is not host:port.
                text.parse::<Uri>()
                    .unwrap_or_else(|_| Uri::from_static("http://localhost"))
            }
        };
        let mut builder = tonic::transport::Endpoint::from(uri).tcp_nodelay(true);
        if let Some(interval) = inner.options.keep_alive {
            builder = builder
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(interval.min(Duration::from_secs(20)))
                .keep_alive_while_idle(false);
        }
        let target = Arc::new(DialTarget {
            endpoint: inner.endpoint.clone(),
            options: inner.options.clone(),
            dials: Arc::clone(&inner.dials),
        });
        let connector = tower::service_fn(move |_: Uri| {
            let target = Arc::clone(&target);
            async move { target.open().await }
        });
        match builder.connect_with_connector(connector).await {
            Ok(channel) => {
                tracing::debug!(endpoint = %inner.endpoint, "connected to plugin");
                let channel = PluginChannel::plain(channel);
                Ok(match &inner.layers {
                    Some(layers) => layers.apply(channel),
                    None => channel,
                })
            }
            Err(err) => Err(dial_failure(&inner.endpoint, err)),
        }
    }
}

/// Pulls our own [`ConnectError`] back out of tonic's transport error, if that is what failed.
fn dial_failure(endpoint: &Endpoint, err: tonic::transport::Error) -> DialFailure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(connect) = e.downcast_ref::<ConnectError>() {
            return DialFailure::Connect(connect.duplicate());
        }
        source = e.source();
    }
    DialFailure::Handshake {
        endpoint: endpoint.to_string(),
        source: err,
    }
}

#[derive(Debug)]
struct DialTarget {
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
    async fn open_once(&self) -> io::Result<Stream> {
        self.dials.fetch_add(1, Ordering::Relaxed);
        match &self.endpoint {
            Endpoint::Unix(path) => UnixStream::connect(path).await.map(Stream::Unix),
            Endpoint::Tcp { host, port } => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Ok(Stream::Tcp(stream))
            }
        }
    }

    /// Dials, waiting with backoff while the socket is missing or refuses connections (a
    /// plugin that is starting, or restarting and recreating its socket).
    async fn open(&self) -> Result<TokioIo<EitherStream>, ConnectError> {
        let start = tokio::time::Instant::now();
        let mut pause = self.options.initial_backoff;
        loop {
            match self.open_once().await {
                Ok(stream) => return Ok(TokioIo::new(EitherStream(stream))),
                Err(err) => {
                    let waited = start.elapsed();
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
