//! Serving the mock: start-up on a unix socket or in memory, the running server's handle, and
//! shutdown (graceful, bounded, removing the socket; also on drop).

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{UnboundedReceiverStream, UnixListenerStream};
use tonic::transport::{Channel, Server};

use crate::calls::Calls;
use crate::endpoint::UnixEndpoint;
use crate::error::Error;
use crate::faults::Faults;
use crate::plugin::MockPlugin;
use crate::transport::killable::KillableIo;
use crate::transport::memory::{self, Acceptor};
use crate::transport::paced;
use crate::transport::unix::{self, SocketId};

/// How long [`MockServer::shutdown`] waits for open calls and connections to finish.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The endpoint text of the in-memory transport (not dialable; use [`MockServer::channel`]).
pub const IN_MEMORY_ENDPOINT: &str = "in-memory://csi-mock";

enum Transport {
    Unix {
        endpoint: UnixEndpoint,
        /// Set once the socket is bound (later with [`Quirk::LateSocket`](crate::Quirk)).
        socket: Arc<Mutex<Option<SocketId>>>,
    },
    Memory {
        acceptor: Acceptor,
    },
}

/// A running mock server. Dropping it stops the server (and removes its socket).
pub struct MockServer {
    plugin: MockPlugin,
    transport: Transport,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl fmt::Debug for MockServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockServer")
            .field("endpoint", &self.endpoint())
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
    }
}

async fn serve<S, IO>(
    plugin: MockPlugin,
    incoming: S,
    stop: oneshot::Receiver<()>,
) -> Result<(), Error>
where
    S: tokio_stream::Stream<Item = Result<IO, std::io::Error>>,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    Server::builder()
        .add_routes(plugin.routes())
        .serve_with_incoming_shutdown(incoming, async {
            // A dropped sender also means stop.
            let _ = stop.await;
        })
        .await
        .map_err(Error::Serve)
}

fn lock_socket(socket: &Mutex<Option<SocketId>>) -> Option<SocketId> {
    *socket.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MockPlugin {
    /// Serves the mock on a unix socket at `path` (made absolute). A stale socket left by a
    /// crashed run is removed first, but only if it is a socket and nothing answers on it. The
    /// socket is created with permissions 0600. With [`Quirk::LateSocket`](crate::Quirk) the
    /// socket appears only after the delay; this call returns at once.
    ///
    /// # Errors
    ///
    /// [`Error::NotASocket`] when another kind of file sits at `path` (it is left alone),
    /// [`Error::SocketInUse`] when a live server answers there, [`Error::SocketDirMissing`],
    /// [`Error::SocketPathTooLong`], [`Error::Bind`], [`Error::Permissions`].
    ///
    /// # Example
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use csi_proto::v1::{identity_client::IdentityClient, ProbeRequest};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let plugin = csi_testkit::MockPlugin::builder().build()?;
    /// let server = plugin.serve_unix(dir.path().join("csi.sock")).await?;
    /// assert!(server.endpoint().starts_with("unix:///"));
    ///
    /// let mut identity = IdentityClient::new(server.channel().await?);
    /// assert_eq!(identity.probe(ProbeRequest {}).await?.into_inner().ready, Some(true));
    /// server.shutdown().await?; // also removes the socket
    /// # Ok(())
    /// # }
    /// ```
    pub async fn serve_unix(&self, path: impl AsRef<Path>) -> Result<MockServer, Error> {
        let endpoint = UnixEndpoint::from_path(path)?;
        let path = endpoint.path().to_path_buf();
        unix::prepare(&path)?;
        let late = self.shared.lock().quirks.late_socket;
        let socket = Arc::new(Mutex::new(None));
        let (stop_tx, mut stop_rx) = oneshot::channel();
        let plugin = self.clone();
        let task = match late {
            None => {
                let (listener, id) = unix::bind(&path)?;
                *socket.lock().unwrap_or_else(PoisonError::into_inner) = Some(id);
                tokio::spawn(async move {
                    let incoming = UnixListenerStream::new(listener)
                        .map(|r| r.map(|s| KillableIo::new(paced(s))));
                    let result = serve(plugin, incoming, stop_rx).await;
                    unix::remove_own(&path, id);
                    result
                })
            }
            Some(delay) => {
                let socket = socket.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = &mut stop_rx => return Ok(()),
                    }
                    unix::prepare(&path)?;
                    let (listener, id) = unix::bind(&path)?;
                    *socket.lock().unwrap_or_else(PoisonError::into_inner) = Some(id);
                    let incoming = UnixListenerStream::new(listener)
                        .map(|r| r.map(|s| KillableIo::new(paced(s))));
                    let result = serve(plugin, incoming, stop_rx).await;
                    unix::remove_own(&path, id);
                    result
                })
            }
        };
        tracing::debug!(endpoint = %endpoint, "csi mock plugin serving");
        Ok(MockServer {
            plugin: self.clone(),
            transport: Transport::Unix { endpoint, socket },
            stop: Some(stop_tx),
            task: Some(task),
        })
    }

    /// Serves the mock over in-memory duplex pipes and returns a connected channel. Fast, and
    /// needs no file system; every [`MockServer::channel`] opens a new pipe.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] if the first connection fails.
    pub async fn serve_in_memory(&self) -> Result<(MockServer, Channel), Error> {
        let (acceptor, accepted) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let plugin = self.clone();
        let task = tokio::spawn(async move {
            let incoming = UnboundedReceiverStream::new(accepted)
                .map(|io| Ok::<_, std::io::Error>(KillableIo::new(paced(io))));
            serve(plugin, incoming, stop_rx).await
        });
        let server = MockServer {
            plugin: self.clone(),
            transport: Transport::Memory { acceptor },
            stop: Some(stop_tx),
            task: Some(task),
        };
        let channel = server.channel().await?;
        Ok((server, channel))
    }
}

impl MockServer {
    /// `unix:///abs/path.sock` for a unix socket; [`IN_MEMORY_ENDPOINT`] in memory.
    pub fn endpoint(&self) -> &str {
        match &self.transport {
            Transport::Unix { endpoint, .. } => endpoint.as_str(),
            Transport::Memory { .. } => IN_MEMORY_ENDPOINT,
        }
    }

    /// The socket path, for a unix socket.
    pub fn socket_path(&self) -> Option<&Path> {
        match &self.transport {
            Transport::Unix { endpoint, .. } => Some(endpoint.path()),
            Transport::Memory { .. } => None,
        }
    }

    /// The plugin being served.
    pub fn plugin(&self) -> &MockPlugin {
        &self.plugin
    }

    /// The plugin's call log.
    pub fn calls(&self) -> Calls {
        self.plugin.calls()
    }

    /// The plugin's fault scripts.
    pub fn faults(&self) -> Faults {
        self.plugin.faults()
    }

    /// A new channel to the server, connected now (authority `localhost`).
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when the server does not answer (yet: see
    /// [`lazy_channel`](Self::lazy_channel) for a late socket).
    pub async fn channel(&self) -> Result<Channel, Error> {
        match &self.transport {
            Transport::Unix { endpoint, .. } => {
                crate::transport::connect_unix(endpoint.path()).await
            }
            Transport::Memory { acceptor } => memory::connect_in_memory(acceptor).await,
        }
    }

    /// A channel that connects on first use and reconnects after failures (unix sockets; in
    /// memory it connects now and so may fail).
    ///
    /// # Errors
    ///
    /// [`Error::Connect`], in memory only.
    pub async fn lazy_channel(&self) -> Result<Channel, Error> {
        match &self.transport {
            Transport::Unix { endpoint, .. } => {
                Ok(crate::transport::connect_unix_lazy(endpoint.path()))
            }
            Transport::Memory { acceptor } => memory::connect_in_memory(acceptor).await,
        }
    }

    /// Whether the socket exists yet (always true in memory).
    pub fn is_bound(&self) -> bool {
        match &self.transport {
            Transport::Unix { socket, .. } => lock_socket(socket).is_some(),
            Transport::Memory { .. } => true,
        }
    }

    /// Stops accepting, ends hung calls with UNAVAILABLE, waits up to [`SHUTDOWN_GRACE`] for
    /// open calls to finish, and removes the socket.
    ///
    /// # Errors
    ///
    /// [`Error::ShutdownTimedOut`] when the grace period ran out (the server was aborted),
    /// [`Error::Serve`] or [`Error::ServerTask`] when the server had failed, and any start-up
    /// error of a late socket.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        self.signal_stop();
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        let result = match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(Error::ServerTask(join)),
            Err(_) => {
                task.abort();
                Err(Error::ShutdownTimedOut(SHUTDOWN_GRACE))
            }
        };
        self.remove_socket();
        result
    }

    fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.plugin.faults().release_hung();
    }

    fn remove_socket(&self) {
        if let Transport::Unix { endpoint, socket } = &self.transport
            && let Some(id) = lock_socket(socket)
        {
            unix::remove_own(endpoint.path(), id);
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.signal_stop();
            self.remove_socket();
        }
    }
}
