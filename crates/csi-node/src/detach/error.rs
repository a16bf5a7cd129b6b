//! A csi-client error as a csi-claims detach error, class unchanged.

use csi_claims::{DetachError, DetachRpc};

/// The [`DetachError`] for a failed `rpc`: the class is the one csi-client assigned
/// ([`csi_client::Error::class`]), the detail is the error's text (which names the RPC,
/// volume and node, and never a secret).
pub fn detach_error(rpc: DetachRpc, error: &csi_client::Error) -> DetachError {
    DetachError::new(rpc, error.class(), error.to_string())
}
