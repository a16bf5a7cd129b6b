//! CSI endpoints: `unix:///absolute/path.sock` (csi-spec §3.1), the only kind the mock serves.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// An endpoint that is not a unix socket path the mock can serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The endpoint is empty.
    #[error("the endpoint is empty; expected unix:///absolute/path.sock")]
    Empty,
    /// The scheme is not `unix://`.
    #[error(
        "endpoint {endpoint:?} is not a unix socket endpoint; expected unix:///absolute/path.sock"
    )]
    NotUnix {
        /// The endpoint given.
        endpoint: String,
    },
    /// The path after `unix://` is not absolute.
    #[error(
        "endpoint {endpoint:?}: the socket path must be absolute (note the three slashes in unix:///path)"
    )]
    NotAbsolute {
        /// The endpoint given.
        endpoint: String,
    },
    /// The path does not end in `.sock`, as the spec requires of unix endpoints.
    #[error("endpoint {endpoint:?}: a unix socket endpoint must end in .sock")]
    NoSockSuffix {
        /// The endpoint given.
        endpoint: String,
    },
    /// The path is not valid UTF-8, so it cannot be written as an endpoint URI.
    #[error("socket path {path:?} is not valid UTF-8")]
    NotUtf8 {
        /// The path given.
        path: PathBuf,
    },
    /// A relative path could not be made absolute.
    #[error("cannot make socket path {path:?} absolute: the current directory is unknown")]
    NoCurrentDir {
        /// The path given.
        path: PathBuf,
    },
}

/// The absolute path of a unix socket, printed as `unix:///abs/path.sock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnixEndpoint {
    path: PathBuf,
    uri: String,
}

impl UnixEndpoint {
    /// Parses `unix:///absolute/path.sock`.
    ///
    /// # Errors
    ///
    /// [`EndpointError`] saying what is wrong with the text.
    pub fn parse(endpoint: &str) -> Result<Self, EndpointError> {
        if endpoint.is_empty() {
            return Err(EndpointError::Empty);
        }
        let Some(path) = endpoint.strip_prefix("unix://") else {
            return Err(EndpointError::NotUnix {
                endpoint: endpoint.to_string(),
            });
        };
        if !path.starts_with('/') {
            return Err(EndpointError::NotAbsolute {
                endpoint: endpoint.to_string(),
            });
        }
        // The socket needs a name: `/run/csi/.sock` ends in `.sock` but names nothing.
        let nameless = Path::new(path)
            .file_name()
            .is_none_or(|name| name == ".sock");
        if !path.ends_with(".sock") || nameless {
            return Err(EndpointError::NoSockSuffix {
                endpoint: endpoint.to_string(),
            });
        }
        Ok(UnixEndpoint {
            path: PathBuf::from(path),
            uri: endpoint.to_string(),
        })
    }

    /// The endpoint of a socket path; a relative path is taken from the current directory.
    /// Any file name is accepted here (tests often use their own).
    ///
    /// # Errors
    ///
    /// [`EndpointError::NotUtf8`] or [`EndpointError::NoCurrentDir`].
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, EndpointError> {
        let path = path.as_ref();
        let path = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|_| EndpointError::NoCurrentDir {
                    path: path.to_path_buf(),
                })?
                .join(path)
        };
        let text = path
            .to_str()
            .ok_or_else(|| EndpointError::NotUtf8 { path: path.clone() })?;
        let uri = format!("unix://{text}");
        Ok(UnixEndpoint { path, uri })
    }

    /// The socket's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The endpoint as text, `unix:///abs/path.sock`.
    pub fn as_str(&self) -> &str {
        &self.uri
    }
}

impl FromStr for UnixEndpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UnixEndpoint::parse(s)
    }
}

impl fmt::Display for UnixEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_three_slash_unix_endpoints_only() {
        let e = UnixEndpoint::parse("unix:///run/csi/csi.sock").unwrap();
        assert_eq!(e.path(), Path::new("/run/csi/csi.sock"));
        assert_eq!(e.to_string(), "unix:///run/csi/csi.sock");
        assert_eq!(UnixEndpoint::parse(""), Err(EndpointError::Empty));
        assert!(matches!(
            UnixEndpoint::parse("tcp://127.0.0.1:10000"),
            Err(EndpointError::NotUnix { .. })
        ));
        assert!(matches!(
            UnixEndpoint::parse("/run/csi.sock"),
            Err(EndpointError::NotUnix { .. })
        ));
        assert!(matches!(
            UnixEndpoint::parse("unix://run/csi.sock"),
            Err(EndpointError::NotAbsolute { .. })
        ));
        assert!(matches!(
            UnixEndpoint::parse("unix:///run/csi"),
            Err(EndpointError::NoSockSuffix { .. })
        ));
        for nameless in ["unix:///.sock", "unix:///run/csi/.sock"] {
            assert!(
                matches!(
                    UnixEndpoint::parse(nameless),
                    Err(EndpointError::NoSockSuffix { .. })
                ),
                "{nameless} names no socket"
            );
        }
        assert!(UnixEndpoint::parse("unix:///run/csi/a.sock").is_ok());
    }

    #[test]
    fn from_path_makes_relative_paths_absolute() {
        let e = UnixEndpoint::from_path("x.sock").unwrap();
        assert!(e.path().is_absolute());
        assert!(e.as_str().starts_with("unix:///"));
    }
}
