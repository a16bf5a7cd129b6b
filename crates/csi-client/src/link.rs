//! The HTTP/2 link to a plugin: hyper's HTTP/2 client on a socket we dialled ourselves, redialled
//! when the plugin restarts.
//!
//! A [`Link`] is the bottom of every call's path: the typed client encodes the request (tonic's
//! codec), the client's tower layers (if any) see it, and the link hands it straight to hyper's
//! HTTP/2 sender, which the connection task writes to the socket. There is no queue worker in
//! between and no second timer: the attempt deadline is enforced once, by the attempt loop in
//! `call.rs`, and merely *announced* to the plugin as `grpc-timeout`.
//!
//! When the connection is gone (the plugin exited, or restarted and recreated its socket) the
//! next request finds the sender closed, and the link dials again — one dial, however many
//! callers notice at once. A request that hyper hands back unsent (the connection closed
//! before the request was taken off its queue) is sent again on the new connection, so a
//! plugin restart between two calls costs no failed attempt, even for a mutating RPC. A
//! request that may have reached the socket is never resent here: that is the attempt loop's
//! decision, by class.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{HeaderValue, USER_AGENT};
use http::uri::{Authority, Scheme, Uri};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tonic::body::Body;
use tower::BoxError;

use crate::answer::AnswerWatch;
use crate::connection::{ConnectError, DialFailure, DialTarget, HandshakeError};
use crate::endpoint::{Address, Endpoint};

/// The `user-agent` of every request.
const AGENT: &str = concat!("csi-client/", env!("CARGO_PKG_VERSION"));

/// How long a keep-alive ping may go unanswered before the connection is declared dead.
const KEEP_ALIVE_TIMEOUT_CAP: Duration = Duration::from_secs(20);

/// A self-healing HTTP/2 connection to one plugin, usable as a `tower::Service`. Cheap to
/// clone; every clone shares the connection.
#[derive(Clone, Debug)]
pub(crate) struct Link {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    target: Arc<DialTarget>,
    authority: Authority,
    /// The connection in use, numbered so a caller that saw one die does not tear down the
    /// one another caller has just dialled.
    current: Mutex<Current>,
    /// Held while dialling, so concurrent callers make one dial.
    redial: tokio::sync::Mutex<()>,
}

#[derive(Clone, Debug)]
struct Current {
    generation: u64,
    sender: http2::SendRequest<Body>,
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

impl Link {
    /// Dials `target` (waiting for its socket as its options say) and sets up HTTP/2.
    pub(crate) async fn connect(target: Arc<DialTarget>) -> Result<Link, DialFailure> {
        let sender = handshake(&target).await?;
        Ok(Link {
            shared: Arc::new(Shared {
                authority: authority(target.endpoint()),
                target,
                current: Mutex::new(Current {
                    generation: 0,
                    sender,
                }),
                redial: tokio::sync::Mutex::new(()),
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
        let mut current = self.shared.current();
        let mut redialled = false;
        loop {
            if current.sender.is_closed() {
                if redialled {
                    // A connection dialled for this very request closed at once: give up
                    // rather than dial in a loop until the deadline.
                    return Err(self.shared.closed_unsent());
                }
                current = self
                    .shared
                    .redial(current.generation, handover.as_ref())
                    .await?;
                redialled = true;
            }
            if let Some(handover) = &handover {
                handover.handed();
            }
            match current.sender.try_send_request(request).await {
                Ok(response) => {
                    return Ok(match &answer {
                        Some(answer) => answer.watch(response),
                        None => response.map(Body::new),
                    });
                }
                Err(mut failed) => match failed.take_message() {
                    // The connection closed before taking the request: nothing was sent.
                    Some(unsent) if !redialled => {
                        request = unsent;
                        current = self
                            .shared
                            .redial(current.generation, handover.as_ref())
                            .await?;
                        redialled = true;
                    }
                    Some(_) => return Err(self.shared.closed_unsent()),
                    None => return Err(Box::new(failed.into_error())),
                },
            }
        }
    }
}

impl Shared {
    /// The error of a request that a freshly dialled connection closed on before taking it.
    fn closed_unsent(&self) -> BoxError {
        Box::new(DialFailure::Connect(ConnectError::closed_unsent(
            self.target.endpoint(),
        )))
    }

    fn current(&self) -> Current {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A live connection other than generation `dead`: the one another caller dialled
    /// meanwhile, or a new one.
    async fn redial(&self, dead: u64, handover: Option<&Handover>) -> Result<Current, DialFailure> {
        if let Some(handover) = handover {
            handover.waiting();
        }
        let _dialling = self.redial.lock().await;
        let current = self.current();
        if current.generation != dead && !current.sender.is_closed() {
            return Ok(current);
        }
        tracing::debug!(endpoint = %self.target.endpoint(), "plugin connection closed, dialling again");
        let sender = handshake(&self.target).await?;
        let fresh = Current {
            generation: current.generation + 1,
            sender,
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = fresh.clone();
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

/// Opens the socket and sets up HTTP/2 on it; the connection is driven by a task of its own
/// until the plugin closes it or every sender is dropped.
async fn handshake(target: &DialTarget) -> Result<http2::SendRequest<Body>, DialFailure> {
    let io = target.open().await.map_err(DialFailure::Connect)?;
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new());
    if let Some(interval) = target.options().keep_alive {
        builder
            .keep_alive_interval(interval)
            .keep_alive_timeout(interval.min(KEEP_ALIVE_TIMEOUT_CAP))
            .keep_alive_while_idle(false);
    }
    let (sender, connection) = builder
        .handshake(io)
        .await
        .map_err(|source| DialFailure::Handshake(HandshakeError::new(target.endpoint(), source)))?;
    let endpoint = target.endpoint().to_string();
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%endpoint, %error, "plugin connection ended with an error");
        }
    });
    tracing::debug!(endpoint = %target.endpoint(), "connected to plugin");
    Ok(sender)
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
    use hyper_util::rt::TokioIo;

    use super::*;
    use crate::channel::PluginChannel;
    use crate::connection::ConnectOptions;

    /// A sender whose connection is about to die: the peer end is dropped right after the
    /// handshake, and the connection's tasks have not run yet.
    async fn doomed_sender() -> http2::SendRequest<Body> {
        let (ours, theirs) = tokio::io::duplex(4096);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(ours))
            .await
            .expect("test invariant: the preface fits the duplex buffer");
        tokio::spawn(connection);
        drop(theirs);
        sender
    }

    fn link_with(target: Arc<DialTarget>, sender: http2::SendRequest<Body>) -> Link {
        Link {
            shared: Arc::new(Shared {
                authority: authority(target.endpoint()),
                target,
                current: Mutex::new(Current {
                    generation: 0,
                    sender,
                }),
                redial: tokio::sync::Mutex::new(()),
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
        let link = link_with(target, doomed_sender().await);
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
        let link = link_with(target, doomed_sender().await);
        let handover = Handover::new();
        handover.handed();
        let mut request = tonic::Request::new(ProbeRequest {});
        request.extensions_mut().insert(handover.clone());
        let mut identity = IdentityClient::new(PluginChannel::plain(link.clone()));
        // The doomed connection looks open when the request is queued on it; it closes
        // before taking it, hands it back, and the link sends it on a fresh dial.
        identity.probe(request).await.unwrap();
        assert_eq!(dials.load(Ordering::Relaxed), 1, "one new dial");
        assert_eq!(link.shared.current().generation, 1);
        assert!(!handover.is_waiting(), "handed to the new connection");
        assert_eq!(plugin.calls().count(csi_proto::Rpc::Probe), 1);
        server.shutdown().await.unwrap();
    }
}
