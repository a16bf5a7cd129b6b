//! The Identity service: plugin info, plugin capabilities, Probe.

use csi_proto::v1 as pb;
use csi_proto::v1::identity_client::IdentityClient as Raw;
use csi_structs::{PluginCapabilities, PluginInfo};

use crate::convert;
use crate::error::Error;
use crate::service::service_client;

/// What Probe said about a plugin that answered OK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Readiness {
    /// `ready = true`, or `ready` absent (the spec says absent means ready).
    Ready,
    /// `ready = false`: healthy but still initialising; other calls may fail meanwhile.
    NotReady,
}

impl Readiness {
    /// The readiness a `ProbeResponse` reports.
    pub fn of(response: &pb::ProbeResponse) -> Readiness {
        match response.ready {
            Some(false) => Readiness::NotReady,
            Some(true) | None => Readiness::Ready,
        }
    }

    /// Whether the plugin is ready.
    pub const fn is_ready(self) -> bool {
        matches!(self, Readiness::Ready)
    }
}

service_client!(
    /// Client of the Identity service. Cheap to clone; shares the connection of the
    /// [`CsiClient`](crate::CsiClient) it came from.
    IdentityClient
);

impl IdentityClient {
    /// `GetPluginInfo`: the plugin's name (the provider) and vendor version.
    ///
    /// # Errors
    ///
    /// Any call failure; an invalid name or empty version is an invalid response.
    pub async fn get_plugin_info(&self) -> Result<PluginInfo, Error> {
        self.caller
            .unary(
                &self.options,
                pb::GetPluginInfoRequest {},
                |ch, req| async move { Raw::new(ch).get_plugin_info(req).await },
                convert::wire,
            )
            .await
    }

    /// `GetPluginCapabilities`: the services and expansion modes of the plugin as a whole.
    /// Unknown capability numbers are kept aside and ignored (spec §3.15).
    ///
    /// # Errors
    ///
    /// Any call failure.
    pub async fn get_plugin_capabilities(&self) -> Result<PluginCapabilities, Error> {
        self.caller
            .unary(
                &self.options,
                pb::GetPluginCapabilitiesRequest {},
                |ch, req| async move { Raw::new(ch).get_plugin_capabilities(req).await },
                |resp| Ok(PluginCapabilities::from(resp)),
            )
            .await
    }

    /// `Probe`: never retried (the caller's health loop is the retry loop), short deadline.
    /// An absent `ready` means ready.
    ///
    /// # Errors
    ///
    /// Any call failure; FAILED_PRECONDITION (unhealthy) is classified
    /// [`RetryElsewhere`](csi_structs::ErrorClass::RetryElsewhere).
    pub async fn probe(&self) -> Result<Readiness, Error> {
        self.caller
            .unary(
                &self.options,
                pb::ProbeRequest {},
                |ch, req| async move { Raw::new(ch).probe(req).await },
                |resp| Ok(Readiness::of(&resp)),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_ready_means_ready() {
        assert_eq!(
            Readiness::of(&pb::ProbeResponse { ready: None }),
            Readiness::Ready
        );
        assert_eq!(
            Readiness::of(&pb::ProbeResponse { ready: Some(true) }),
            Readiness::Ready
        );
        assert_eq!(
            Readiness::of(&pb::ProbeResponse { ready: Some(false) }),
            Readiness::NotReady
        );
    }
}
