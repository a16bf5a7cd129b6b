//! The unix socket transport: safe preparation of the socket path, binding with 0600
//! permissions, removal on shutdown, and a client connector.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::Error;

/// The longest socket path Linux accepts (`sun_path` is 108 bytes with the final NUL).
pub(crate) const MAX_SOCKET_PATH_BYTES: usize = 107;

/// Device and inode of the socket file this server created, so it only ever removes its own.
pub(crate) type SocketId = (u64, u64);

fn kind_of(file_type: fs::FileType) -> &'static str {
    if file_type.is_file() {
        "regular file"
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_fifo() {
        "fifo"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "device"
    } else {
        "non-socket file"
    }
}

/// Makes `path` ready to bind: its directory must exist, and whatever is there must be a
/// stale socket (one nothing answers on), which is removed. Anything else is left alone.
pub(crate) fn prepare(path: &Path) -> Result<(), Error> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_BYTES {
        return Err(Error::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
            limit: MAX_SOCKET_PATH_BYTES,
        });
    }
    if !path.parent().is_some_and(Path::is_dir) {
        return Err(Error::SocketDirMissing {
            path: path.to_path_buf(),
        });
    }
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::Inspect {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(Error::NotASocket {
            path: path.to_path_buf(),
            kind: kind_of(meta.file_type()),
        });
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(Error::SocketInUse {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::RemoveStale {
                path: path.to_path_buf(),
                source,
            }),
        },
        Err(source) => Err(Error::Inspect {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Binds `path`, restricts it to its owner (0600) and returns the listener and the file's
/// identity.
pub(crate) fn bind(path: &Path) -> Result<(UnixListener, SocketId), Error> {
    let listener = UnixListener::bind(path).map_err(|source| Error::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(|source| {
        Error::Permissions {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let meta = fs::symlink_metadata(path).map_err(|source| Error::Inspect {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((listener, (meta.dev(), meta.ino())))
}

/// Removes the socket file if it is still the one this server created.
pub(crate) fn remove_own(path: &Path, id: SocketId) {
    let ours = fs::symlink_metadata(path)
        .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == id);
    if ours && let Err(e) = fs::remove_file(path) {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove the mock's socket");
    }
}

fn connector(
    path: PathBuf,
) -> impl tower::Service<
    Uri,
    Response = hyper_util::rt::TokioIo<UnixStream>,
    Error = io::Error,
    Future = impl std::future::Future<Output = io::Result<hyper_util::rt::TokioIo<UnixStream>>> + Send,
> + Send
+ 'static {
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            Ok(hyper_util::rt::TokioIo::new(
                UnixStream::connect(path).await?,
            ))
        }
    })
}

/// A channel to a unix socket, connected now. The request authority is `localhost`.
///
/// # Errors
///
/// [`Error::Connect`] when nothing answers on the socket.
pub async fn connect_unix(path: impl AsRef<Path>) -> Result<Channel, Error> {
    let path = path.as_ref().to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(connector(path.clone()))
        .await
        .map_err(|source| Error::Connect {
            endpoint: format!("unix://{}", path.display()),
            source,
        })
}

/// A channel to a unix socket that connects on first use (and reconnects after a failure).
pub fn connect_unix_lazy(path: impl AsRef<Path>) -> Channel {
    Endpoint::from_static("http://localhost")
        .connect_with_connector_lazy(connector(path.as_ref().to_path_buf()))
}
