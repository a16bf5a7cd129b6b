//! A tonic channel over a unix socket, with `localhost` as the `:authority`.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use super::Error;

/// Connects to the socket now, so a missing plugin is reported before any check runs.
///
/// The URI is a placeholder: the connector ignores it and dials the socket, and the
/// `:authority` becomes `localhost`, which strict servers accept.
pub(crate) async fn unix_channel(socket: &Path) -> Result<Channel, Error> {
    let path: PathBuf = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|source| Error::Connect {
            socket: socket.to_path_buf(),
            source,
        })
}
