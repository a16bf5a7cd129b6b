//! The in-memory transport: every connection is a fresh `tokio::io::duplex` pipe handed to
//! the server through a channel.

use std::io;

use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::Error;

/// Bytes buffered in each direction of an in-memory connection.
const BUFFER_BYTES: usize = 256 * 1024;

/// The end of an in-memory transport the server listens on.
pub(crate) type Acceptor = mpsc::UnboundedSender<DuplexStream>;

/// A channel whose every connection is a new duplex pipe sent to `acceptor`.
///
/// # Errors
///
/// [`Error::Connect`] when the server behind `acceptor` has stopped.
pub(crate) async fn connect_in_memory(acceptor: &Acceptor) -> Result<Channel, Error> {
    let acceptor = acceptor.clone();
    let connector = tower::service_fn(move |_: Uri| {
        let acceptor = acceptor.clone();
        async move {
            let (client, server) = tokio::io::duplex(BUFFER_BYTES);
            acceptor.send(server).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the in-memory mock server has stopped",
                )
            })?;
            Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(client))
        }
    });
    Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .map_err(|source| Error::Connect {
            endpoint: "in-memory".into(),
            source,
        })
}
