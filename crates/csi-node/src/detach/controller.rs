//! `ControllerUnpublishVolume` for the release pipeline.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use csi_claims::driver::ControllerDetacher;
use csi_claims::{ControllerDetachRequest, DetachError, DetachRpc};
use csi_client::CsiClient;
use csi_structs::{ErrorClass, Secrets, VolumeId};

use crate::plugins::ControllerClients;

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

/// [`ControllerDetacher`] with csi-client: `ControllerUnpublishVolume` with the plugin's
/// volume id, the plugin's node id from the claim and the volume's secrets.
///
/// Over one plugin's [`CsiClient`] ([`new`](Self::new)), or over every plugin a
/// [`PluginManager`](crate::plugins::PluginManager) has ([`over`](Self::over)); a plugin whose
/// controller is not reachable fails the step as
/// [`RetryElsewhere`](csi_structs::ErrorClass::RetryElsewhere), and the release pipeline
/// tries again when the plugin is back.
///
/// `NOT_FOUND` (volume or node gone) is [`AlreadyDone`](csi_structs::ErrorClass::AlreadyDone)
/// by csi-client's classification, which the release pipeline counts as success.
#[derive(Clone)]
pub struct ClientControllerDetacher {
    controllers: Arc<dyn ControllerClients>,
    secrets: Arc<dyn SecretsLookup>,
}

impl fmt::Debug for ClientControllerDetacher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientControllerDetacher")
            .finish_non_exhaustive()
    }
}

impl ClientControllerDetacher {
    /// An adapter calling the controller behind `client`, with secrets from `secrets`.
    pub fn new(client: CsiClient, secrets: Arc<dyn SecretsLookup>) -> Self {
        Self::over(Arc::new(client), secrets)
    }

    /// An adapter calling each plugin's controller where `controllers` says.
    pub fn over(controllers: Arc<dyn ControllerClients>, secrets: Arc<dyn SecretsLookup>) -> Self {
        Self {
            controllers,
            secrets,
        }
    }
}

#[async_trait]
impl ControllerDetacher for ClientControllerDetacher {
    async fn controller_unpublish(
        &self,
        request: &ControllerDetachRequest,
    ) -> Result<(), DetachError> {
        let rpc = DetachRpc::ControllerUnpublish;
        let Some(controller) = self.controllers.controller(&request.plugin) else {
            return Err(DetachError::new(
                rpc,
                ErrorClass::RetryElsewhere,
                format!("plugin {} has no controller here", request.plugin),
            ));
        };
        let secrets = self.secrets.controller_secrets(&request.volume);
        controller
            .unpublish(
                &request.external_volume,
                Some(&request.plugin_node),
                &secrets,
            )
            .await
            .map_err(|e| detach_error(rpc, &e))
    }
}
