//! [`TlsConfig`]: TLS for agent links (feature `tls`), and building it from PEM files.
//!
//! Agents are both clients and servers of each other, so one configuration holds both sides.
//! [`TlsConfig::from_pem`] builds the usual cluster setup: one certificate authority, and for
//! each agent a certificate signed by it. Both ends of every link prove themselves (mutual
//! TLS); the per-node tokens are still checked on every call on top of it.

use std::fmt;
use std::time::Duration;

use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

/// How long a TLS handshake may take on either side of a link built by
/// [`TlsConfig::from_pem`]. Without it a peer that opens a connection and says nothing would
/// hold a server task forever.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS for agent links (feature `tls`): the client side for calls this agent makes, the server
/// side for [`Shim::serve`](crate::Shim::serve).
///
/// Build it with [`TlsConfig::from_pem`], or fill the fields yourself for another setup. Put
/// it in [`ShimConfig::tls`](crate::ShimConfig::tls); a shim with TLS dials `https://` and
/// serves TLS only.
///
/// `Debug` prints nothing of the configuration: the client side holds the private key.
///
/// ```
/// # fn run(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<(), csi_rpc_shim::TlsConfigError> {
/// use csi_rpc_shim::TlsConfig;
///
/// // The CA every agent trusts, and this agent's certificate and key (PEM, as read from files).
/// let tls = TlsConfig::from_pem(ca, cert, key)?;
/// # let _ = tls;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TlsConfig {
    /// Used when dialling other agents (`https://`).
    pub client: ClientTlsConfig,
    /// Used when serving.
    pub server: ServerTlsConfig,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // tonic's `ClientTlsConfig` prints its identity, private key included.
        f.debug_struct("TlsConfig").finish_non_exhaustive()
    }
}

/// Which PEM input a [`TlsConfigError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PemInput {
    /// The certificate authority that signs every agent's certificate.
    CaCertificate,
    /// This agent's certificate (chain).
    Certificate,
    /// This agent's private key.
    PrivateKey,
}

impl fmt::Display for PemInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PemInput::CaCertificate => "CA certificate",
            PemInput::Certificate => "certificate",
            PemInput::PrivateKey => "private key",
        })
    }
}

/// Why a [`TlsConfig`] could not be built. The messages name the input, never its content.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    /// The input is not well-formed PEM (a section without its end line, bad base64, a
    /// section over the size limit).
    #[error("TLS {input}: malformed PEM")]
    MalformedPem {
        /// Which input.
        input: PemInput,
    },
    /// The input holds no section of the needed kind (`CERTIFICATE` for certificates,
    /// `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` for the key).
    #[error("TLS {input}: no PEM section of the needed kind")]
    NotFound {
        /// Which input.
        input: PemInput,
    },
    /// The server name is neither a DNS name nor an IP address.
    #[error("TLS server name {name:?} is not a valid DNS name or IP address")]
    ServerName {
        /// The name given.
        name: String,
    },
    /// The transport refused the client side (for example a key it cannot use).
    #[error("TLS client configuration refused")]
    Client {
        /// The transport's error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The transport refused the server side (for example a key that does not match the
    /// certificate, or a CA certificate it cannot use).
    #[error("TLS server configuration refused")]
    Server {
        /// The transport's error.
        #[source]
        source: tonic::transport::Error,
    },
}

impl TlsConfig {
    /// Mutual TLS for a cluster whose agents' certificates are signed by one CA: this agent
    /// trusts only certificates signed by `ca_pem` (no system roots), presents `cert_pem` with
    /// `key_pem` on both sides, and its server refuses clients without a certificate signed by
    /// the CA. Handshakes are bounded by [`TLS_HANDSHAKE_TIMEOUT`].
    ///
    /// The dialled peer's certificate must name the IP address this agent dials it at (the
    /// address in [`Routes`](crate::Routes)) as a subject alternative name; use
    /// [`with_server_name`](Self::with_server_name) when every agent's certificate carries one
    /// shared DNS name instead.
    ///
    /// Every input is checked here, so a bad file fails at start-up and not on the first call.
    ///
    /// # Errors
    ///
    /// [`TlsConfigError::MalformedPem`] or [`TlsConfigError::NotFound`] naming the input;
    /// [`TlsConfigError::Client`] or [`TlsConfigError::Server`] when the transport refuses the
    /// result (a key that does not match the certificate, an unusable key or CA).
    pub fn from_pem(
        ca_pem: impl AsRef<[u8]>,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<Self, TlsConfigError> {
        let (ca_pem, cert_pem, key_pem) = (ca_pem.as_ref(), cert_pem.as_ref(), key_pem.as_ref());
        check_certificates(ca_pem, PemInput::CaCertificate)?;
        check_certificates(cert_pem, PemInput::Certificate)?;
        check_key(key_pem)?;

        let ca = Certificate::from_pem(ca_pem);
        let identity = Identity::from_pem(cert_pem, key_pem);
        let config = Self {
            client: ClientTlsConfig::new()
                .ca_certificate(ca.clone())
                .identity(identity.clone())
                .timeout(TLS_HANDSHAKE_TIMEOUT),
            server: ServerTlsConfig::new()
                .identity(identity)
                .client_ca_root(ca)
                .timeout(TLS_HANDSHAKE_TIMEOUT),
        };
        config.check()?;
        Ok(config)
    }

    /// Expects `name` (a DNS name or an IP address) in every dialled peer's certificate,
    /// instead of the IP address dialled. For clusters where all agents share one certificate
    /// name, such as `agents.cluster.internal`.
    ///
    /// # Errors
    ///
    /// [`TlsConfigError::ServerName`] when `name` is neither a DNS name nor an IP address.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Result<Self, TlsConfigError> {
        let name = name.into();
        if ServerName::try_from(name.as_str()).is_err() {
            return Err(TlsConfigError::ServerName { name });
        }
        self.client = self.client.domain_name(name);
        self.check_client()?;
        Ok(self)
    }

    /// Builds both sides once, as the transport will, so that errors show up here.
    fn check(&self) -> Result<(), TlsConfigError> {
        self.check_client()?;
        Server::builder()
            .tls_config(self.server.clone())
            .map(drop)
            .map_err(|source| TlsConfigError::Server { source })
    }

    fn check_client(&self) -> Result<(), TlsConfigError> {
        Endpoint::from_static("https://127.0.0.1:1")
            .tls_config(self.client.clone())
            .map(drop)
            .map_err(|source| TlsConfigError::Client { source })
    }
}

/// At least one well-formed `CERTIFICATE` section. (tonic skips CA certificates it cannot
/// parse, which would leave an agent trusting nobody without saying why.)
fn check_certificates(pem: &[u8], input: PemInput) -> Result<(), TlsConfigError> {
    let mut found = false;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| pem_error(&e, input))?;
        found = true;
    }
    if found {
        Ok(())
    } else {
        Err(TlsConfigError::NotFound { input })
    }
}

fn check_key(pem: &[u8]) -> Result<(), TlsConfigError> {
    PrivateKeyDer::from_pem_slice(pem)
        .map(drop)
        .map_err(|e| pem_error(&e, PemInput::PrivateKey))
}

/// The PEM error without its content: its text can quote a line of the input, which for the
/// key is secret.
fn pem_error(error: &pem::Error, input: PemInput) -> TlsConfigError {
    match error {
        pem::Error::NoItemsFound => TlsConfigError::NotFound { input },
        _ => TlsConfigError::MalformedPem { input },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOT_PEM: &[u8] = b"hello";
    const CUT_SHORT: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIB\n";
    const KEY_WITH_SECRET_LINE: &[u8] =
        b"-----BEGIN PRIVATE KEY-----\n!!secret-material!!\n-----END PRIVATE KEY-----\n";

    #[test]
    fn each_bad_input_is_named() {
        let err = TlsConfig::from_pem(NOT_PEM, NOT_PEM, NOT_PEM).unwrap_err();
        assert!(
            matches!(
                err,
                TlsConfigError::NotFound {
                    input: PemInput::CaCertificate
                }
            ),
            "{err:?}"
        );
        let err = TlsConfig::from_pem(CUT_SHORT, NOT_PEM, NOT_PEM).unwrap_err();
        assert!(
            matches!(
                err,
                TlsConfigError::MalformedPem {
                    input: PemInput::CaCertificate
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "TLS CA certificate: malformed PEM");
    }

    #[test]
    fn a_bad_key_is_named_without_its_content() {
        let err = check_key(KEY_WITH_SECRET_LINE).unwrap_err();
        assert!(
            matches!(
                err,
                TlsConfigError::MalformedPem {
                    input: PemInput::PrivateKey
                }
            ),
            "{err:?}"
        );
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains("secret-material"), "{shown}");
        }
        let err = check_key(NOT_PEM).unwrap_err();
        assert!(
            matches!(
                err,
                TlsConfigError::NotFound {
                    input: PemInput::PrivateKey
                }
            ),
            "{err:?}"
        );
    }
}
