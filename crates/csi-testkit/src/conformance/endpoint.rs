//! Parsing the plugin endpoint (`unix:///path/csi.sock` or a bare absolute path).

use std::path::PathBuf;

/// Why an endpoint string is not a usable unix socket path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The endpoint was empty.
    #[error("endpoint is empty; expected unix:///path/to/csi.sock")]
    Empty,
    /// The endpoint names a transport other than a unix socket (for example `tcp://`).
    #[error(
        "endpoint {endpoint:?} uses scheme {scheme:?}; only unix sockets are supported (unix:///path)"
    )]
    UnsupportedScheme {
        /// The endpoint as given.
        endpoint: String,
        /// The scheme it used.
        scheme: String,
    },
    /// The socket path is not absolute.
    #[error("endpoint {endpoint:?}: socket path {path:?} is not absolute")]
    RelativePath {
        /// The endpoint as given.
        endpoint: String,
        /// The path part that is not absolute.
        path: String,
    },
}

/// Turns `unix:///abs/path`, `unix:/abs/path` or `/abs/path` into the socket path.
///
/// # Errors
///
/// [`EndpointError`] when the string is empty, uses another scheme, or the path is relative.
///
/// ```
/// use csi_testkit::conformance::parse_endpoint;
///
/// assert_eq!(parse_endpoint("unix:///run/csi.sock").unwrap().to_str(), Some("/run/csi.sock"));
/// assert!(parse_endpoint("tcp://127.0.0.1:10000").is_err());
/// ```
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, EndpointError> {
    let trimmed = endpoint.trim();
    if trimmed.is_empty() {
        return Err(EndpointError::Empty);
    }
    let path = match trimmed.split_once("://") {
        Some(("unix", rest)) => rest,
        Some((scheme, _)) => {
            return Err(EndpointError::UnsupportedScheme {
                endpoint: endpoint.to_owned(),
                scheme: scheme.to_owned(),
            });
        }
        None => trimmed.strip_prefix("unix:").unwrap_or(trimmed),
    };
    if !path.starts_with('/') {
        return Err(EndpointError::RelativePath {
            endpoint: endpoint.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_unix_forms_and_bare_paths() {
        for input in [
            "unix:///tmp/a.sock",
            "unix:/tmp/a.sock",
            "/tmp/a.sock",
            " unix:///tmp/a.sock ",
        ] {
            assert_eq!(
                parse_endpoint(input),
                Ok(PathBuf::from("/tmp/a.sock")),
                "{input}"
            );
        }
    }

    #[test]
    fn rejects_other_schemes_relative_paths_and_empty() {
        assert!(matches!(
            parse_endpoint("tcp://127.0.0.1:9000"),
            Err(EndpointError::UnsupportedScheme { scheme, .. }) if scheme == "tcp"
        ));
        assert!(matches!(
            parse_endpoint("unix://relative/a.sock"),
            Err(EndpointError::RelativePath { .. })
        ));
        assert!(matches!(
            parse_endpoint("csi.sock"),
            Err(EndpointError::RelativePath { .. })
        ));
        assert_eq!(parse_endpoint("  "), Err(EndpointError::Empty));
    }
}
