//! What the suite needs to know about the plugin under test and the machine it runs on.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Error;

/// Settings of one conformance run.
///
/// Only the socket and a scratch directory are required; the rest has defaults that suit a
/// plugin which accepts any parameters. Secrets are never printed by `Debug`.
///
/// ```
/// use std::time::Duration;
/// use csi_testkit::conformance::Options;
///
/// let options = Options::new("/run/csi/csi.sock", "/tmp/csi-conformance")
///     .secret("token", "s3cr3t")
///     .parameter("tier", "fast")
///     .timeout(Duration::from_secs(30));
/// assert!(!format!("{options:?}").contains("s3cr3t"));
/// ```
#[derive(Clone)]
pub struct Options {
    pub(crate) socket: PathBuf,
    pub(crate) scratch_dir: PathBuf,
    pub(crate) secrets: HashMap<String, String>,
    pub(crate) parameters: HashMap<String, String>,
    pub(crate) mutable_parameters: HashMap<String, String>,
    pub(crate) timeout: Duration,
    pub(crate) volume_size: i64,
    pub(crate) page_volumes: usize,
    pub(crate) existing_volume: Option<String>,
}

/// Default per-call deadline.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default size requested for test volumes: 16 MiB.
pub const DEFAULT_VOLUME_SIZE: i64 = 16 * 1024 * 1024;

impl Options {
    /// A run against the plugin listening on `socket`, creating staging and target directories
    /// below `scratch_dir` (which must be visible to the plugin at the same path).
    pub fn new(socket: impl Into<PathBuf>, scratch_dir: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            scratch_dir: scratch_dir.into(),
            secrets: HashMap::new(),
            parameters: HashMap::new(),
            mutable_parameters: HashMap::new(),
            timeout: DEFAULT_TIMEOUT,
            volume_size: DEFAULT_VOLUME_SIZE,
            page_volumes: 3,
            existing_volume: None,
        }
    }

    /// Like [`Options::new`], from an endpoint written `unix:///absolute/path.sock`.
    ///
    /// # Errors
    ///
    /// [`EndpointError`](crate::EndpointError) when the text is not such an endpoint.
    ///
    /// ```
    /// use csi_testkit::conformance::Options;
    ///
    /// let options = Options::from_endpoint("unix:///run/csi/csi.sock", "/tmp/scratch").unwrap();
    /// assert_eq!(options.socket().to_str(), Some("/run/csi/csi.sock"));
    /// assert!(Options::from_endpoint("tcp://10.0.0.1:9000", "/tmp/scratch").is_err());
    /// ```
    pub fn from_endpoint(
        endpoint: &str,
        scratch_dir: impl Into<PathBuf>,
    ) -> Result<Self, crate::EndpointError> {
        let endpoint = crate::UnixEndpoint::parse(endpoint)?;
        Ok(Self::new(endpoint.path(), scratch_dir))
    }

    /// Adds a secret passed in the `secrets` field of every request that has one.
    #[must_use]
    pub fn secret(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.secrets.insert(key.into(), value.into());
        self
    }

    /// Replaces all secrets.
    #[must_use]
    pub fn secrets(mut self, secrets: HashMap<String, String>) -> Self {
        self.secrets = secrets;
        self
    }

    /// Adds a `parameters` entry for CreateVolume, ValidateVolumeCapabilities and GetCapacity.
    #[must_use]
    pub fn parameter(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.parameters.insert(key.into(), value.into());
        self
    }

    /// Adds a `mutable_parameters` entry for ControllerModifyVolume. Without any, the
    /// ControllerModifyVolume checks that need a valid change are skipped.
    #[must_use]
    pub fn mutable_parameter(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.mutable_parameters.insert(key.into(), value.into());
        self
    }

    /// The deadline of each call (sent as `grpc-timeout` and enforced locally). Default 10 s.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The `required_bytes` of test volumes. Default 16 MiB. Expansion asks for twice this.
    #[must_use]
    pub fn volume_size(mut self, bytes: i64) -> Self {
        self.volume_size = bytes;
        self
    }

    /// How many volumes (and snapshots) the pagination checks create. Default 3, at least 2.
    #[must_use]
    pub fn page_volumes(mut self, count: usize) -> Self {
        self.page_volumes = count.max(2);
        self
    }

    /// A volume that already exists on the backend, for the node lifecycle of a plugin that
    /// cannot create volumes (no CREATE_DELETE_VOLUME, e.g. node-only). It is never deleted.
    #[must_use]
    pub fn existing_volume(mut self, volume_id: impl Into<String>) -> Self {
        self.existing_volume = Some(volume_id.into());
        self
    }

    /// The plugin's socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The scratch directory.
    pub fn scratch_dir(&self) -> &Path {
        &self.scratch_dir
    }
}

impl Options {
    /// Checks the options against the suite's and the spec's limits.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.volume_size < 1 {
            return Err(Error::InvalidOption {
                option: "volume_size",
                value: self.volume_size.to_string(),
                limit: "must be at least 1 byte",
            });
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidOption {
                option: "timeout",
                value: format!("{:?}", self.timeout),
                limit: "must be longer than zero",
            });
        }
        let valid_key = |key: &str| {
            !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if let Some(key) = self.secrets.keys().find(|key| !valid_key(key)) {
            return Err(Error::InvalidOption {
                option: "secret key",
                value: format!("{key:?}"),
                limit: "secret keys are non-empty and use only letters, digits, '-', '_' and '.' (spec 3.6)",
            });
        }
        Ok(())
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("socket", &self.socket)
            .field("scratch_dir", &self.scratch_dir)
            .field("secrets", &csi_proto::Redacted(&self.secrets))
            .field("parameters", &self.parameters)
            .field("mutable_parameters", &self.mutable_parameters)
            .field("timeout", &self.timeout)
            .field("volume_size", &self.volume_size)
            .field("page_volumes", &self.page_volumes)
            .field("existing_volume", &self.existing_volume)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options::new("/tmp/csi.sock", "/tmp/scratch")
    }

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        assert!(options().validate().is_ok());
        let err = options().volume_size(0).validate().unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidOption {
                    option: "volume_size",
                    ..
                }
            ),
            "{err}"
        );
        let err = options().timeout(Duration::ZERO).validate().unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidOption {
                    option: "timeout",
                    ..
                }
            ),
            "{err}"
        );
        let err = options()
            .secret("bad key", "hunter2")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("\"bad key\""), "{err}");
        assert!(!err.to_string().contains("hunter2"));
    }
}
