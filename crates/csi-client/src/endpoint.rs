//! Where a plugin listens: parsing `CSI_ENDPOINT`-style addresses.
//!
//! The spec (§3.1) says plugins listen on `unix:///abs/path.sock`. Operators also write a bare
//! absolute path, and plugins behind a local proxy are reached over `tcp://host:port`. Anything
//! else is refused with an [`EndpointError`] that says what is wrong.
//!
//! The spec asks *plugins* to name their socket `*.sock`; the client does not insist, so a
//! plugin that bends that rule can still be reached.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The environment variable the spec reserves for the plugin's address.
pub const CSI_ENDPOINT_VAR: &str = "CSI_ENDPOINT";

/// Longest unix socket path the kernel accepts in `sockaddr_un.sun_path` (108 bytes, one for NUL).
pub const MAX_UNIX_PATH_BYTES: usize = 107;

/// Longest host name of a tcp endpoint: DNS's limit (RFC 1035) without the trailing dot.
pub const MAX_HOST_BYTES: usize = 253;

/// The address of a CSI plugin: a unix socket at an absolute path, or a TCP `host:port`.
///
/// An `Endpoint` is always checked: the only ways to make one ([`Endpoint::unix`],
/// [`Endpoint::tcp`], parsing with [`FromStr`], [`Endpoint::from_env`]) refuse an empty or
/// relative path, a NUL byte, a path longer than `sun_path` ([`MAX_UNIX_PATH_BYTES`]), a
/// missing or malformed host and port 0, with an [`EndpointError`] naming what is wrong. Its
/// contents are private, so a malformed endpoint cannot reach a dial.
///
/// ```
/// use csi_client::Endpoint;
///
/// let ep: Endpoint = "unix:///run/csi/plugin.sock".parse()?;
/// assert_eq!(ep.unix_path().map(|p| p.to_str()), Some(Some("/run/csi/plugin.sock")));
/// let bare: Endpoint = "/run/csi/plugin.sock".parse()?;
/// assert_eq!(ep, bare);
/// assert!("unix://relative.sock".parse::<Endpoint>().is_err());
/// assert!(Endpoint::unix("").is_err());
/// # Ok::<(), csi_client::EndpointError>(())
/// ```
///
/// There is no way around the checks:
///
/// ```compile_fail
/// let unchecked = csi_client::Endpoint::Unix(std::path::PathBuf::new());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Endpoint(Address);

/// What an [`Endpoint`] holds; only this crate sees it, after the checks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Address {
    /// A unix domain socket at an absolute path.
    Unix(PathBuf),
    /// A TCP address, for plugins behind a local proxy.
    Tcp {
        /// Host name or IP literal (IPv6 without brackets).
        host: String,
        /// TCP port, never 0.
        port: u16,
    },
}

/// Why an endpoint string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The string was empty.
    #[error("endpoint is empty")]
    Empty,
    /// The environment variable is not set (or not valid unicode).
    #[error("environment variable {var} is not set")]
    MissingVar {
        /// The variable that was read.
        var: &'static str,
    },
    /// The scheme is neither `unix` nor `tcp`.
    #[error("endpoint {endpoint:?}: unsupported scheme {scheme:?} (expected unix:// or tcp://)")]
    UnsupportedScheme {
        /// The endpoint as given.
        endpoint: String,
        /// The scheme found before `://`.
        scheme: String,
    },
    /// A unix endpoint whose path is not absolute (`unix://x.sock` has two slashes, not three).
    #[error(
        "endpoint {endpoint:?}: unix socket path {path:?} is not absolute (use unix:///abs/path.sock)"
    )]
    RelativePath {
        /// The endpoint as given.
        endpoint: String,
        /// The path found.
        path: String,
    },
    /// A unix socket path longer than the kernel allows.
    #[error("endpoint {endpoint:?}: unix socket path is {len} bytes, the limit is {limit}")]
    PathTooLong {
        /// The endpoint as given.
        endpoint: String,
        /// The path's length in bytes.
        len: usize,
        /// [`MAX_UNIX_PATH_BYTES`].
        limit: usize,
    },
    /// A unix socket path that contains a NUL byte.
    #[error("endpoint {endpoint:?}: unix socket path contains a NUL byte")]
    NulInPath {
        /// The endpoint as given.
        endpoint: String,
    },
    /// A `tcp://` endpoint without a host.
    #[error("endpoint {endpoint:?}: tcp endpoint has no host")]
    MissingHost {
        /// The endpoint as given.
        endpoint: String,
    },
    /// A tcp host that is neither an IP literal nor a host name (letters, digits, `-`, `.`
    /// and `_`).
    #[error(
        "endpoint {endpoint:?}: host {host:?} is neither an IP address nor a host name (letters, digits, '-', '.', '_')"
    )]
    InvalidHost {
        /// The endpoint as given.
        endpoint: String,
        /// The host found.
        host: String,
    },
    /// A tcp host name longer than DNS allows.
    #[error("endpoint {endpoint:?}: host is {len} bytes, the limit is {limit}")]
    HostTooLong {
        /// The endpoint as given.
        endpoint: String,
        /// The host's length in bytes.
        len: usize,
        /// [`MAX_HOST_BYTES`].
        limit: usize,
    },
    /// A `tcp://` endpoint without `:port`.
    #[error("endpoint {endpoint:?}: tcp endpoint has no port")]
    MissingPort {
        /// The endpoint as given.
        endpoint: String,
    },
    /// A port that is not a number in 1..=65535.
    #[error("endpoint {endpoint:?}: port {port:?} is not a number in 1..=65535")]
    InvalidPort {
        /// The endpoint as given.
        endpoint: String,
        /// The port text found.
        port: String,
    },
    /// Text after `host:port` (a path, query or user info) that a tcp endpoint cannot carry.
    #[error("endpoint {endpoint:?}: unexpected {extra:?} after host:port")]
    TrailingGarbage {
        /// The endpoint as given.
        endpoint: String,
        /// The unexpected part.
        extra: String,
    },
}

impl Endpoint {
    /// A unix socket endpoint.
    ///
    /// # Errors
    ///
    /// [`EndpointError::Empty`], [`EndpointError::RelativePath`],
    /// [`EndpointError::PathTooLong`] or [`EndpointError::NulInPath`] when the path cannot
    /// name a socket.
    pub fn unix(path: impl AsRef<Path>) -> Result<Self, EndpointError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        check_unix_path(&shown, path)?;
        Ok(Endpoint(Address::Unix(path.to_path_buf())))
    }

    /// A tcp endpoint, for a plugin behind a local proxy. `host` is a host name or an IP
    /// literal (IPv6 without brackets).
    ///
    /// ```
    /// use csi_client::Endpoint;
    ///
    /// let ep = Endpoint::tcp("::1", 9000)?;
    /// assert_eq!(ep.to_string(), "tcp://[::1]:9000");
    /// assert_eq!(ep.tcp_address(), Some(("::1", 9000)));
    /// assert!(Endpoint::tcp("", 9000).is_err());
    /// assert!(Endpoint::tcp("localhost", 0).is_err());
    /// # Ok::<(), csi_client::EndpointError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`EndpointError::MissingHost`], [`EndpointError::InvalidHost`],
    /// [`EndpointError::HostTooLong`] or [`EndpointError::InvalidPort`] (port 0).
    pub fn tcp(host: &str, port: u16) -> Result<Self, EndpointError> {
        let shown = if host.contains(':') {
            format!("tcp://[{host}]:{port}")
        } else {
            format!("tcp://{host}:{port}")
        };
        check_host(&shown, host)?;
        if port == 0 {
            return Err(EndpointError::InvalidPort {
                endpoint: shown,
                port: port.to_string(),
            });
        }
        Ok(Endpoint(Address::Tcp {
            host: host.to_owned(),
            port,
        }))
    }

    /// Reads the endpoint from `CSI_ENDPOINT`.
    ///
    /// # Errors
    ///
    /// [`EndpointError::MissingVar`] when the variable is unset, otherwise whatever parsing its
    /// value gives.
    pub fn from_env() -> Result<Self, EndpointError> {
        Self::from_env_var(CSI_ENDPOINT_VAR)
    }

    /// Reads the endpoint from the named environment variable.
    ///
    /// # Errors
    ///
    /// As [`Endpoint::from_env`].
    pub fn from_env_var(var: &'static str) -> Result<Self, EndpointError> {
        let value = std::env::var(var).map_err(|_| EndpointError::MissingVar { var })?;
        value.parse()
    }

    /// The socket path, for a unix endpoint.
    pub fn unix_path(&self) -> Option<&Path> {
        match &self.0 {
            Address::Unix(path) => Some(path),
            Address::Tcp { .. } => None,
        }
    }

    /// The host (IPv6 without brackets) and port, for a tcp endpoint.
    pub fn tcp_address(&self) -> Option<(&str, u16)> {
        match &self.0 {
            Address::Unix(_) => None,
            Address::Tcp { host, port } => Some((host, *port)),
        }
    }

    /// What the endpoint holds, for the dial.
    pub(crate) fn address(&self) -> &Address {
        &self.0
    }
}

/// A host name or an IP literal that a connect and an HTTP/2 `:authority` can carry.
fn check_host(endpoint: &str, host: &str) -> Result<(), EndpointError> {
    if host.is_empty() {
        return Err(EndpointError::MissingHost {
            endpoint: endpoint.to_owned(),
        });
    }
    let invalid = || EndpointError::InvalidHost {
        endpoint: endpoint.to_owned(),
        host: host.to_owned(),
    };
    if host.contains(':') {
        // Only an IPv6 literal has colons.
        return host
            .parse::<std::net::Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| invalid());
    }
    if host.len() > MAX_HOST_BYTES {
        return Err(EndpointError::HostTooLong {
            endpoint: endpoint.to_owned(),
            len: host.len(),
            limit: MAX_HOST_BYTES,
        });
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(invalid());
    }
    Ok(())
}

fn check_unix_path(endpoint: &str, path: &Path) -> Result<(), EndpointError> {
    let text = path.as_os_str().as_encoded_bytes();
    if text.is_empty() {
        return Err(EndpointError::Empty);
    }
    if !path.is_absolute() {
        return Err(EndpointError::RelativePath {
            endpoint: endpoint.to_owned(),
            path: path.display().to_string(),
        });
    }
    if text.contains(&0) {
        return Err(EndpointError::NulInPath {
            endpoint: endpoint.to_owned(),
        });
    }
    if text.len() > MAX_UNIX_PATH_BYTES {
        return Err(EndpointError::PathTooLong {
            endpoint: endpoint.to_owned(),
            len: text.len(),
            limit: MAX_UNIX_PATH_BYTES,
        });
    }
    Ok(())
}

fn parse_tcp(endpoint: &str, rest: &str) -> Result<Endpoint, EndpointError> {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, extra) = rest.split_at(authority_end);
    // A lone trailing slash is harmless; anything else after host:port is not.
    if !(extra.is_empty() || extra == "/") {
        return Err(EndpointError::TrailingGarbage {
            endpoint: endpoint.to_owned(),
            extra: extra.to_owned(),
        });
    }
    if authority.contains('@') {
        return Err(EndpointError::TrailingGarbage {
            endpoint: endpoint.to_owned(),
            extra: authority.to_owned(),
        });
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Err(EndpointError::MissingPort {
                endpoint: endpoint.to_owned(),
            });
        };
        let Some(port) = after.strip_prefix(':') else {
            return Err(EndpointError::MissingPort {
                endpoint: endpoint.to_owned(),
            });
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, port),
            None if authority.is_empty() => {
                return Err(EndpointError::MissingHost {
                    endpoint: endpoint.to_owned(),
                });
            }
            None => {
                return Err(EndpointError::MissingPort {
                    endpoint: endpoint.to_owned(),
                });
            }
        }
    };
    check_host(endpoint, host)?;
    let port = match port.parse::<u16>() {
        Ok(p) if p != 0 => p,
        _ => {
            return Err(EndpointError::InvalidPort {
                endpoint: endpoint.to_owned(),
                port: port.to_owned(),
            });
        }
    };
    Ok(Endpoint(Address::Tcp {
        host: host.to_owned(),
        port,
    }))
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Err(EndpointError::Empty);
        }
        if trimmed.starts_with('/') {
            return Endpoint::unix(trimmed);
        }
        let Some((scheme, rest)) = trimmed.split_once("://") else {
            // Neither a scheme nor an absolute path: a relative path.
            return Err(EndpointError::RelativePath {
                endpoint: trimmed.to_owned(),
                path: trimmed.to_owned(),
            });
        };
        match scheme.to_ascii_lowercase().as_str() {
            "unix" => {
                let path = Path::new(rest);
                check_unix_path(trimmed, path)?;
                Ok(Endpoint(Address::Unix(path.to_path_buf())))
            }
            "tcp" => parse_tcp(trimmed, rest),
            _ => Err(EndpointError::UnsupportedScheme {
                endpoint: trimmed.to_owned(),
                scheme: scheme.to_owned(),
            }),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Address::Unix(path) => write!(f, "unix://{}", path.display()),
            Address::Tcp { host, port } if host.contains(':') => {
                write!(f, "tcp://[{host}]:{port}")
            }
            Address::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Endpoint")
            .field(&format_args!("{self}"))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Endpoint {
        match s.parse() {
            Ok(ep) => ep,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    fn err(s: &str) -> EndpointError {
        match s.parse::<Endpoint>() {
            Ok(ep) => panic!("{s:?} should fail, got {ep:?}"),
            Err(e) => e,
        }
    }

    fn unix(path: &str) -> Endpoint {
        match Endpoint::unix(path) {
            Ok(ep) => ep,
            Err(e) => panic!("{path:?} should be a unix endpoint: {e}"),
        }
    }

    fn tcp(host: &str, port: u16) -> Endpoint {
        match Endpoint::tcp(host, port) {
            Ok(ep) => ep,
            Err(e) => panic!("{host:?}:{port} should be a tcp endpoint: {e}"),
        }
    }

    #[test]
    fn unix_forms() {
        assert_eq!(ok("unix:///run/p.sock"), unix("/run/p.sock"));
        assert_eq!(ok("/run/p.sock"), unix("/run/p.sock"));
        assert_eq!(ok("  UNIX:///run/p.sock\n"), unix("/run/p.sock"));
        assert_eq!(ok("unix:///run/p.sock").to_string(), "unix:///run/p.sock");
        assert_eq!(
            unix("/run/p.sock").unix_path(),
            Some(Path::new("/run/p.sock"))
        );
        assert_eq!(unix("/run/p.sock").tcp_address(), None);
        assert_eq!(
            format!("{:?}", unix("/run/p.sock")),
            "Endpoint(unix:///run/p.sock)"
        );
    }

    #[test]
    fn tcp_forms() {
        assert_eq!(ok("tcp://127.0.0.1:10000"), tcp("127.0.0.1", 10000));
        assert_eq!(ok("tcp://localhost:1/"), tcp("localhost", 1));
        assert_eq!(
            ok("tcp://plugin_proxy.local:1"),
            tcp("plugin_proxy.local", 1)
        );
        let v6 = ok("tcp://[::1]:9000");
        assert_eq!(v6, tcp("::1", 9000));
        assert_eq!(v6.to_string(), "tcp://[::1]:9000");
        assert_eq!(v6.tcp_address(), Some(("::1", 9000)));
        assert_eq!(v6.unix_path(), None);
    }

    #[test]
    fn constructors_check_like_the_parser() {
        assert_eq!(Endpoint::unix(""), Err(EndpointError::Empty));
        assert!(matches!(
            Endpoint::unix("run/p.sock"),
            Err(EndpointError::RelativePath { path, .. }) if path == "run/p.sock"
        ));
        assert!(matches!(
            Endpoint::unix("/a\0b.sock"),
            Err(EndpointError::NulInPath { .. })
        ));
        let long = format!("/{}", "a".repeat(MAX_UNIX_PATH_BYTES));
        assert!(matches!(
            Endpoint::unix(&long),
            Err(EndpointError::PathTooLong { len, limit: MAX_UNIX_PATH_BYTES, .. })
                if len == MAX_UNIX_PATH_BYTES + 1
        ));
        // One byte under the limit is fine.
        assert!(Endpoint::unix(&long[..MAX_UNIX_PATH_BYTES]).is_ok());

        assert!(matches!(
            Endpoint::tcp("", 80),
            Err(EndpointError::MissingHost { .. })
        ));
        assert!(matches!(
            Endpoint::tcp("localhost", 0),
            Err(EndpointError::InvalidPort { endpoint, port }) if endpoint == "tcp://localhost:0" && port == "0"
        ));
        for bad in ["ho st", "u@host", "host/x", "[::1]", "::g", "h%1"] {
            assert!(
                matches!(Endpoint::tcp(bad, 80), Err(EndpointError::InvalidHost { ref host, .. }) if host == bad),
                "{bad:?}: {:?}",
                Endpoint::tcp(bad, 80)
            );
        }
        let long_host = "a".repeat(MAX_HOST_BYTES + 1);
        assert!(matches!(
            Endpoint::tcp(&long_host, 80),
            Err(EndpointError::HostTooLong { len, limit: MAX_HOST_BYTES, .. }) if len == MAX_HOST_BYTES + 1
        ));
        assert!(Endpoint::tcp(&long_host[..MAX_HOST_BYTES], 80).is_ok());
    }

    #[test]
    fn malformed_endpoints_name_the_problem() {
        assert_eq!(err(""), EndpointError::Empty);
        assert!(
            matches!(err("unix://run/p.sock"), EndpointError::RelativePath { path, .. } if path == "run/p.sock")
        );
        assert!(matches!(err("p.sock"), EndpointError::RelativePath { .. }));
        assert!(
            matches!(err("http://x:1"), EndpointError::UnsupportedScheme { scheme, .. } if scheme == "http")
        );
        assert!(matches!(
            err("tcp://:80"),
            EndpointError::MissingHost { .. }
        ));
        assert!(matches!(err("tcp://"), EndpointError::MissingHost { .. }));
        assert!(
            matches!(err("tcp://ho st:80"), EndpointError::InvalidHost { host, .. } if host == "ho st")
        );
        assert!(matches!(
            err("tcp://[::g]:80"),
            EndpointError::InvalidHost { .. }
        ));
        assert!(matches!(
            err("tcp://host"),
            EndpointError::MissingPort { .. }
        ));
        assert!(
            matches!(err("tcp://host:0"), EndpointError::InvalidPort { port, .. } if port == "0")
        );
        assert!(matches!(
            err("tcp://host:99999"),
            EndpointError::InvalidPort { .. }
        ));
        assert!(
            matches!(err("tcp://host:80/x"), EndpointError::TrailingGarbage { extra, .. } if extra == "/x")
        );
        assert!(matches!(
            err("tcp://u@host:80"),
            EndpointError::TrailingGarbage { .. }
        ));
        let long = format!("/{}.sock", "a".repeat(200));
        assert!(matches!(
            err(&long),
            EndpointError::PathTooLong {
                len: 206,
                limit: MAX_UNIX_PATH_BYTES,
                ..
            }
        ));
        assert!(matches!(err("/a\0b.sock"), EndpointError::NulInPath { .. }));
    }

    #[test]
    fn from_env_var_reports_the_missing_variable() {
        let e = Endpoint::from_env_var("CSI_CLIENT_TEST_SURELY_UNSET_VAR");
        assert_eq!(
            e,
            Err(EndpointError::MissingVar {
                var: "CSI_CLIENT_TEST_SURELY_UNSET_VAR"
            })
        );
    }
}
