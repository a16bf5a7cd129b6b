//! Serving the agent protocol: [`AgentService`] plugs a [`Shim`] into tonic.

use std::future::Future;

use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::TcpListenerStream;

use crate::request::{
    ControllerAttach, ControllerDetach, ControllerExpand, ControllerValidate, CreateSnapshot,
    CreateVolume, DeleteSnapshot, DeleteVolume, ListSnapshots, ListVolumes, NodeDetach, NodeExpand,
};
use crate::shim::Shim;
use crate::wire::pb;
use crate::wire::pb::agent_server::{Agent, AgentServer};

/// The tonic service of the agent protocol, backed by a [`Shim`]. Build it with
/// [`Shim::agent_service`].
#[derive(Clone, Debug)]
pub struct AgentService {
    shim: Shim,
}

/// Why [`Shim::serve`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The transport failed (accepting, TLS setup, HTTP/2).
    #[error("agent server on node {node} failed")]
    Transport {
        /// This agent's node.
        node: csi_structs::NodeId,
        /// The transport's error.
        #[source]
        source: tonic::transport::Error,
    },
}

impl Shim {
    /// The tonic service other agents call, with the message size capped at
    /// [`MAX_MESSAGE_BYTES`](crate::wire::MAX_MESSAGE_BYTES). Add it to your own
    /// `tonic::transport::Server` (with TLS if you use it), or use [`Shim::serve`].
    ///
    /// On your own server, also set `Server::timeout` to
    /// [`ShimConfig::max_remote_timeout`](crate::ShimConfig::max_remote_timeout): the shim
    /// bounds a call once its request has arrived, and only the server can bound the wait
    /// for a request that never finishes arriving (a peer that sends headers and then
    /// nothing). [`Shim::serve`] does.
    pub fn agent_service(&self) -> AgentServer<AgentService> {
        AgentServer::new(AgentService { shim: self.clone() })
            .max_decoding_message_size(self.max_message_bytes())
            .max_encoding_message_size(self.max_message_bytes())
    }

    /// Serves the agent protocol on `listener` until `shutdown` completes (with TLS when the
    /// `tls` feature is on and configured). Every call ends within its `grpc-timeout` and
    /// never later than [`ShimConfig::max_remote_timeout`](crate::ShimConfig::max_remote_timeout)
    /// after it arrived, whether or not its request ever finishes arriving; a call read after
    /// its sender's stamped deadline is refused without a plugin call
    /// ([`deadline`](crate::deadline)).
    ///
    /// # Errors
    ///
    /// [`ServeError::Transport`] when the server cannot run.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        // The timeout covers the wait for the request too: a peer that sends headers and then
        // nothing gets an answer (CANCELLED) once the cap has passed.
        #[allow(unused_mut)]
        let mut builder = tonic::transport::Server::builder().timeout(self.max_remote_timeout());
        #[cfg(feature = "tls")]
        if let Some(tls) = self.tls() {
            builder =
                builder
                    .tls_config(tls.server.clone())
                    .map_err(|source| ServeError::Transport {
                        node: self.node_id().clone(),
                        source,
                    })?;
        }
        builder
            .add_service(self.agent_service())
            .serve_with_incoming_shutdown(accept_nodelay(listener), shutdown)
            .await
            .map_err(|source| ServeError::Transport {
                node: self.node_id().clone(),
                source,
            })
    }
}

/// The accepted connections of `listener`, each with `TCP_NODELAY` set.
///
/// `Server::tcp_nodelay` only applies to listeners tonic binds itself; with our own incoming
/// stream each accepted socket must be set here, or small replies wait on Nagle's algorithm
/// (tens of milliseconds at the tail).
fn accept_nodelay(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|stream| {
            // Best effort: a socket that refuses the option still works, only slower.
            let _ = stream.set_nodelay(true);
        })
    })
}

type Reply<T> = Result<tonic::Response<T>, tonic::Status>;

#[tonic::async_trait]
impl Agent for AgentService {
    async fn controller_attach(
        &self,
        request: tonic::Request<pb::ControllerAttachRequest>,
    ) -> Reply<pb::ControllerAttachResponse> {
        self.shim.serve_remote::<ControllerAttach>(request).await
    }

    async fn controller_detach(
        &self,
        request: tonic::Request<pb::ControllerDetachRequest>,
    ) -> Reply<pb::ControllerDetachResponse> {
        self.shim.serve_remote::<ControllerDetach>(request).await
    }

    async fn controller_validate(
        &self,
        request: tonic::Request<pb::ControllerValidateRequest>,
    ) -> Reply<pb::ControllerValidateResponse> {
        self.shim.serve_remote::<ControllerValidate>(request).await
    }

    async fn controller_create_volume(
        &self,
        request: tonic::Request<pb::ControllerCreateVolumeRequest>,
    ) -> Reply<pb::ControllerCreateVolumeResponse> {
        self.shim.serve_remote::<CreateVolume>(request).await
    }

    async fn controller_delete_volume(
        &self,
        request: tonic::Request<pb::ControllerDeleteVolumeRequest>,
    ) -> Reply<pb::ControllerDeleteVolumeResponse> {
        self.shim.serve_remote::<DeleteVolume>(request).await
    }

    async fn controller_expand_volume(
        &self,
        request: tonic::Request<pb::ControllerExpandVolumeRequest>,
    ) -> Reply<pb::ControllerExpandVolumeResponse> {
        self.shim.serve_remote::<ControllerExpand>(request).await
    }

    async fn controller_list_volumes(
        &self,
        request: tonic::Request<pb::ControllerListVolumesRequest>,
    ) -> Reply<pb::ControllerListVolumesResponse> {
        self.shim.serve_remote::<ListVolumes>(request).await
    }

    async fn controller_create_snapshot(
        &self,
        request: tonic::Request<pb::ControllerCreateSnapshotRequest>,
    ) -> Reply<pb::ControllerCreateSnapshotResponse> {
        self.shim.serve_remote::<CreateSnapshot>(request).await
    }

    async fn controller_delete_snapshot(
        &self,
        request: tonic::Request<pb::ControllerDeleteSnapshotRequest>,
    ) -> Reply<pb::ControllerDeleteSnapshotResponse> {
        self.shim.serve_remote::<DeleteSnapshot>(request).await
    }

    async fn controller_list_snapshots(
        &self,
        request: tonic::Request<pb::ControllerListSnapshotsRequest>,
    ) -> Reply<pb::ControllerListSnapshotsResponse> {
        self.shim.serve_remote::<ListSnapshots>(request).await
    }

    async fn node_detach(
        &self,
        request: tonic::Request<pb::NodeDetachRequest>,
    ) -> Reply<pb::NodeDetachResponse> {
        self.shim.serve_remote::<NodeDetach>(request).await
    }

    async fn node_expand(
        &self,
        request: tonic::Request<pb::NodeExpandRequest>,
    ) -> Reply<pb::NodeExpandResponse> {
        self.shim.serve_remote::<NodeExpand>(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("bound address");
        let client = tokio::spawn(tokio::net::TcpStream::connect(addr));
        let mut incoming = std::pin::pin!(accept_nodelay(listener));
        let accepted = tokio::time::timeout(std::time::Duration::from_secs(10), incoming.next())
            .await
            .expect("a connection arrives (hang guard)")
            .expect("the stream yields")
            .expect("accept succeeds");
        assert!(accepted.nodelay().expect("read the option"));
        let _ = client.await;
    }
}
