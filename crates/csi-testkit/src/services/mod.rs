//! The tonic service implementations, one file per CSI service. Each handler goes through
//! [`MockPlugin::begin`](crate::plugin::MockPlugin) (log, concurrency guard, faults,
//! capabilities, required secrets), then runs its rpc logic against the state under the one lock.

pub(crate) mod controller;
pub(crate) mod group_controller;
pub(crate) mod identity;
pub(crate) mod node;
pub(crate) mod snapshot_metadata;

use csi_proto::v1::controller_server::ControllerServer;
use csi_proto::v1::group_controller_server::GroupControllerServer;
use csi_proto::v1::identity_server::IdentityServer;
use csi_proto::v1::node_server::NodeServer;
use csi_proto::v1::snapshot_metadata_server::SnapshotMetadataServer;
use tonic::service::Routes;

use crate::plugin::MockPlugin;

/// The mock as a tonic service of its own (one per CSI service, all sharing the plugin).
#[derive(Clone, Debug)]
pub(crate) struct Svc(pub(crate) MockPlugin);

impl MockPlugin {
    /// All five CSI services as tonic [`Routes`], for serving the mock on a transport of your
    /// own. Without the crate's transports a [`FaultStep::DropConnection`](crate::FaultStep)
    /// cannot tear the connection down and answers UNAVAILABLE instead.
    pub fn routes(&self) -> Routes {
        let svc = Svc(self.clone());
        Routes::new(IdentityServer::new(svc.clone()))
            .add_service(ControllerServer::new(svc.clone()))
            .add_service(NodeServer::new(svc.clone()))
            .add_service(GroupControllerServer::new(svc.clone()))
            .add_service(SnapshotMetadataServer::new(svc))
    }
}
