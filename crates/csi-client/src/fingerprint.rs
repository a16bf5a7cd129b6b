//! Fingerprinting: everything a plugin says about itself, gathered in one pass.

use csi_structs::{Capabilities, NodeInfo, PluginInfo};
use tonic::Code;

use crate::client::CsiClient;
use crate::error::Error;

/// What a plugin is and can do, in one value: the answers of GetPluginInfo,
/// GetPluginCapabilities, ControllerGetCapabilities (when the plugin offers the Controller
/// service), GroupControllerGetCapabilities (when it offers that service),
/// NodeGetCapabilities and NodeGetInfo (when it serves the Node service).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// Provider name and version.
    pub plugin: PluginInfo,
    /// Capabilities of the plugin and its services; sets of services not offered are empty.
    pub capabilities: Capabilities,
    /// The plugin's view of this node (its node id, volume limit — `None` means no limit —
    /// and topology); `None` when the plugin answered UNIMPLEMENTED to the node calls
    /// (a controller-only deployment).
    pub node: Option<NodeInfo>,
}

impl Fingerprint {
    /// Whether the plugin serves the Node service here.
    pub fn serves_node(&self) -> bool {
        self.node.is_some()
    }
}

fn unimplemented(e: &Error) -> bool {
    e.code() == Some(Code::Unimplemented)
}

pub(crate) async fn gather(client: &CsiClient) -> Result<Fingerprint, Error> {
    let identity = client.identity();
    let plugin = identity.get_plugin_info().await?;
    let mut capabilities = Capabilities {
        plugin: identity.get_plugin_capabilities().await?,
        ..Capabilities::default()
    };
    if capabilities.plugin.has_controller_service() {
        capabilities.controller = client.controller().controller_get_capabilities().await?;
    }
    if capabilities.plugin.has_group_controller_service() {
        capabilities.group_controller = client
            .group_controller()
            .group_controller_get_capabilities()
            .await?;
    }
    let node_client = client.node();
    let node = match node_client.node_get_capabilities().await {
        Ok(caps) => {
            capabilities.node = caps;
            match node_client.node_get_info().await {
                Ok(info) => Some(info),
                Err(e) if unimplemented(&e) => None,
                Err(e) => return Err(e),
            }
        }
        Err(e) if unimplemented(&e) => None,
        Err(e) => return Err(e),
    };
    Ok(Fingerprint {
        plugin,
        capabilities,
        node,
    })
}
