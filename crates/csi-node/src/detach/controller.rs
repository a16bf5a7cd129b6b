//! `ControllerUnpublishVolume` for the release pipeline.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use csi_claims::driver::ControllerDetacher;
use csi_claims::{ControllerDetachRequest, DetachError, DetachRpc};
use csi_client::CsiClient;
use csi_structs::{Secrets, VolumeId};

use super::error::detach_error;

/// Where the controller adapter finds the secrets a volume's calls carry.
pub trait SecretsLookup: Send + Sync + 'static {
    /// The secrets for controller calls about `volume` (empty when it has none).
    fn controller_secrets(&self, volume: &VolumeId) -> Secrets;
}

/// No volume has secrets.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoSecrets;

impl SecretsLookup for NoSecrets {
    fn controller_secrets(&self, _volume: &VolumeId) -> Secrets {
        Secrets::default()
    }
}

/// [`ControllerDetacher`] with a [`CsiClient`]: `ControllerUnpublishVolume` with the plugin's
/// volume id and the plugin's node id from the claim.
///
/// `NOT_FOUND` (volume or node gone) is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone)
/// by csi-client's classification, which the release pipeline counts as success.
#[derive(Clone)]
pub struct ClientControllerDetacher {
    client: CsiClient,
    secrets: Arc<dyn SecretsLookup>,
}

impl fmt::Debug for ClientControllerDetacher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientControllerDetacher")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl ClientControllerDetacher {
    /// An adapter calling the controller behind `client`, with secrets from `secrets`.
    pub fn new(client: CsiClient, secrets: Arc<dyn SecretsLookup>) -> Self {
        Self { client, secrets }
    }
}

#[async_trait]
impl ControllerDetacher for ClientControllerDetacher {
    async fn controller_unpublish(
        &self,
        request: &ControllerDetachRequest,
    ) -> Result<(), DetachError> {
        let secrets = self.secrets.controller_secrets(&request.volume);
        match self
            .client
            .controller()
            .unpublish(
                &request.external_volume,
                Some(&request.plugin_node),
                &secrets,
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => Err(detach_error(DetachRpc::ControllerUnpublish, &e)),
        }
    }
}
