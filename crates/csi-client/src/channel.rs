//! [`PluginChannel`]: the HTTP/2 service every typed client sends through, and the hook that
//! wraps it in tower layers ([`CsiClientBuilder::layer`](crate::CsiClientBuilder::layer)).
//!
//! Without a layer, a `PluginChannel` is the connection's HTTP/2 link itself (one boxed
//! response future per call, no queue). With layers, it is the layered stack behind one
//! [`BoxCloneSyncService`]; each call then costs a clone of that box and a boxed response
//! future per layer — small next to the HTTP/2 round trip to the plugin.
//!
//! The stack is built once, right after the first dial, and shared by every service client
//! like the link it wraps. Reconnects happen below it (inside the link), so a layer sees every
//! attempt that reached the link — but not the attempts that failed before the very first
//! connection existed (those never reach the link; a [`CallObserver`](crate::CallObserver)
//! sees them).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, Service, ServiceExt as _};

use crate::link::Link;

/// The HTTP/2 service the typed clients send through: the plugin connection's link,
/// possibly wrapped by the layers given to
/// [`CsiClientBuilder::layer`](crate::CsiClientBuilder::layer).
///
/// A layer receives a `PluginChannel` to wrap. It is a
/// `tower::Service<http::Request<tonic::body::Body>>` answering
/// `http::Response<tonic::body::Body>`, with [`tower::BoxError`] errors; cheap to clone.
/// A layer should pass errors through unchanged: the client recognises a lost connection or
/// its own deadline by the error types in the chain.
#[derive(Clone)]
pub struct PluginChannel {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Plain(Link),
    Layered(BoxCloneSyncService<http::Request<Body>, http::Response<Body>, BoxError>),
}

impl PluginChannel {
    pub(crate) fn plain(link: Link) -> Self {
        PluginChannel {
            inner: Inner::Plain(link),
        }
    }

    fn layered<S>(service: S) -> Self
    where
        S: Service<http::Request<Body>, Response = http::Response<Body>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        PluginChannel {
            inner: Inner::Layered(BoxCloneSyncService::new(
                service.map_err(Into::<BoxError>::into),
            )),
        }
    }
}

impl fmt::Debug for PluginChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Plain(_) => f.write_str("PluginChannel(plain)"),
            Inner::Layered(_) => f.write_str("PluginChannel(layered)"),
        }
    }
}

impl Service<http::Request<Body>> for PluginChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match &mut self.inner {
            Inner::Plain(link) => link.poll_ready(cx),
            Inner::Layered(service) => service.poll_ready(cx),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> ResponseFuture {
        ResponseFuture {
            inner: match &mut self.inner {
                Inner::Plain(link) => link.call(request),
                Inner::Layered(service) => service.call(request),
            },
        }
    }
}

/// The response future of [`PluginChannel`].
pub struct ResponseFuture {
    inner: Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send + 'static>>,
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<Body>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().inner.as_mut().poll(cx)
    }
}

/// The layers given to the builder, composed into one function applied once per connection.
#[derive(Clone)]
pub(crate) struct LayerStack {
    wrap: Arc<dyn Fn(PluginChannel) -> PluginChannel + Send + Sync>,
    depth: usize,
}

impl LayerStack {
    /// `previous` (if any) wrapped by `layer`: the new layer is the outermost.
    pub(crate) fn push<L>(previous: Option<LayerStack>, layer: L) -> LayerStack
    where
        L: Layer<PluginChannel> + Send + Sync + 'static,
        L::Service: Service<http::Request<Body>, Response = http::Response<Body>>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as Service<http::Request<Body>>>::Error: Into<BoxError>,
        <L::Service as Service<http::Request<Body>>>::Future: Send + 'static,
    {
        let depth = previous.as_ref().map_or(0, |p| p.depth) + 1;
        let wrap = move |channel: PluginChannel| {
            let inner = match &previous {
                Some(previous) => previous.apply(channel),
                None => channel,
            };
            PluginChannel::layered(layer.layer(inner))
        };
        LayerStack {
            wrap: Arc::new(wrap),
            depth,
        }
    }

    /// Wraps `channel` in every layer.
    pub(crate) fn apply(&self, channel: PluginChannel) -> PluginChannel {
        (self.wrap)(channel)
    }
}

impl fmt::Debug for LayerStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerStack")
            .field("layers", &self.depth)
            .finish()
    }
}
