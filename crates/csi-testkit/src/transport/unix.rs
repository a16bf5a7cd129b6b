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

/// Binds `path` so that it is never reachable by anyone but its owner, and returns the listener
/// and the file's identity.
///
/// `bind(2)` creates the socket file with the process umask, and changing the permissions
/// afterwards leaves a window in which another user could connect. So the socket is bound inside
/// a fresh private directory (0700) beside `path`, restricted to 0600 there, and only then
/// renamed into place; the private directory is removed at once. The rename keeps the inode, so
/// the listener keeps accepting on the final path.
pub(crate) fn bind(path: &Path) -> Result<(UnixListener, SocketId), Error> {
    use std::os::unix::fs::DirBuilderExt as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);

    let bind_err = |source: io::Error| Error::Bind {
        path: path.to_path_buf(),
        source,
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let private = parent.join(format!(
        ".csi-mock-bind-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(bind_err)?;
    let staged = private.join("s.sock");
    let result = (|| -> Result<UnixListener, Error> {
        let listener = UnixListener::bind(&staged).map_err(bind_err)?;
        fs::set_permissions(&staged, fs::Permissions::from_mode(0o600)).map_err(|source| {
            Error::Permissions {
                path: path.to_path_buf(),
                source,
            }
        })?;
        fs::rename(&staged, path).map_err(bind_err)?;
        Ok(listener)
    })();
    // Best effort: the directory is empty after a successful rename; after a failure the
    // staged socket (if any) goes with it.
    let _ = fs::remove_file(&staged);
    let _ = fs::remove_dir(&private);
    let listener = result?;
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
