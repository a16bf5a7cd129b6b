//! A registrar of kubelet's plugin registration protocol (`pluginregistration.v1`), the part a
//! `node-driver-registrar` sidecar plays: it serves on a socket in a registration directory,
//! answers `GetInfo` with the plugin it announces, and keeps every `NotifyRegistrationStatus`
//! it is told, for a test of the watching side.
//!
//! ```no_run
//! use csi_testkit::registrar::Registrar;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let registrar = Registrar::csi("ebs.csi.aws.com", "/run/csi/ebs.sock".as_ref(), &["1.0.0"]);
//! let serving = registrar.serve("/var/lib/kubelet/plugins_registry/ebs-reg.sock".as_ref())?;
//! // ... the node under test registers the plugin ...
//! assert!(registrar.told().iter().any(|s| s.plugin_registered));
//! drop(serving); // stops serving (the socket file stays, as a killed sidecar's does)
//! # Ok(()) }
//! ```

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use csi_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use csi_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// A registrar announcing one plugin; clones share what they were asked and told.
#[derive(Clone, Debug, Default)]
pub struct Registrar {
    info: PluginInfo,
    asked: Arc<Mutex<usize>>,
    told: Arc<Mutex<Vec<RegistrationStatus>>>,
}

/// A registrar serving; dropping it stops serving.
#[derive(Debug)]
pub struct Serving {
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Registrar {
    /// Announces `info` as it is (any type, name, endpoint or versions).
    pub fn new(info: PluginInfo) -> Self {
        Registrar {
            info,
            ..Registrar::default()
        }
    }

    /// Announces a CSI driver (`CSIPlugin`) named `name` at `endpoint`, speaking `versions`.
    pub fn csi(name: &str, endpoint: &Path, versions: &[&str]) -> Self {
        Self::new(PluginInfo {
            r#type: "CSIPlugin".to_owned(),
            name: name.to_owned(),
            endpoint: endpoint.display().to_string(),
            supported_versions: versions.iter().map(|v| (*v).to_owned()).collect(),
        })
    }

    /// Serves on a new unix socket at `socket` (in the current Tokio runtime) until the
    /// returned [`Serving`] is dropped.
    ///
    /// # Errors
    ///
    /// When the socket cannot be bound.
    pub fn serve(&self, socket: &Path) -> std::io::Result<Serving> {
        let listener = tokio::net::UnixListener::bind(socket)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = RegistrationServer::new(self.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Serving { _stop: stop })
    }

    /// Every status the registrar was told, oldest first.
    pub fn told(&self) -> Vec<RegistrationStatus> {
        self.told
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many times `GetInfo` was asked.
    pub fn asked(&self) -> usize {
        *self.asked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        *self.asked.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        status: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.told
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(status.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
