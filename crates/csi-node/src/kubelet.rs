//! Kubelet's plugin registration protocol on this node ([`RegistrationWatcher`]): CSI drivers
//! deployed for Kubernetes announce themselves the way kubelet expects, and register with the
//! [`PluginManager`] unchanged.
//!
//! A driver's node DaemonSet runs a `node-driver-registrar` sidecar, which makes a socket in
//! kubelet's registration directory (`/var/lib/kubelet/plugins_registry/` by default) and
//! serves `pluginregistration.v1` on it ([`csi_proto::pluginregistration`]). The watcher does
//! what kubelet does with it:
//!
//! 1. it scans the directory (the sockets already there at start included; names starting
//!    with `.` are left alone) and dials each new socket;
//! 2. `GetInfo` says who is registering: the type (`CSIPlugin`), the driver's name, its CSI
//!    endpoint, and the CSI versions it speaks;
//! 3. the answer is checked: the type, a CSI version this node speaks (major version 1), the
//!    name a valid plugin id, the endpoint an existing unix socket;
//! 4. the plugin is registered with the plugin manager at that endpoint (it is fingerprinted
//!    and health-checked as every plugin is), and `NotifyRegistrationStatus` says so: `true`,
//!    or `false` with the reason, naming the field;
//! 5. when the registration socket goes away (or is made anew), the plugin registered through
//!    it is deregistered.
//!
//! A registration that was refused is not tried again until its socket is made anew; one
//! whose socket did not answer is tried again at the next scan.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use csi_client::Endpoint;
use csi_proto::pluginregistration::registration_client::RegistrationClient;
use csi_proto::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus};
use csi_structs::PluginId;
use hyper_util::rt::TokioIo;

use crate::plugins::{PluginManager, RegistrationId};

/// The plugin type of a CSI driver in kubelet's protocol.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// How long one registration socket may take to answer a call, by default.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Watches a registration directory and registers the CSI drivers that announce themselves
/// there with the plugin manager (module docs: [`self`]).
#[derive(Debug)]
pub struct RegistrationWatcher {
    manager: PluginManager,
    dir: PathBuf,
    call_timeout: Duration,
    known: Mutex<BTreeMap<PathBuf, Known>>,
}

/// What the watcher did with one registration socket.
#[derive(Debug)]
struct Known {
    /// The socket file's identity (device, inode): a socket made anew is a new registration.
    identity: (u64, u64),
    /// The plugin registered through it, if it was taken.
    registered: Option<(PluginId, RegistrationId)>,
}

/// What one scan found in the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Registration {
    /// A driver announced itself and is registered with the plugin manager.
    Registered {
        /// The registration socket.
        socket: PathBuf,
        /// The plugin.
        plugin: PluginId,
        /// Its CSI endpoint.
        endpoint: PathBuf,
    },
    /// A driver's announcement was refused (and told so); tried again when its socket is
    /// made anew.
    Refused {
        /// The registration socket.
        socket: PathBuf,
        /// The field of `PluginInfo` at fault.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The registration socket did not answer (or the plugin manager could not record the
    /// registration); tried again at the next scan.
    Failed {
        /// The registration socket.
        socket: PathBuf,
        /// What went wrong.
        error: String,
    },
    /// The registration socket went away, and the plugin registered through it with it.
    Gone {
        /// The registration socket.
        socket: PathBuf,
        /// The plugin deregistered, if one was registered through it.
        plugin: Option<PluginId>,
    },
}

/// A refusal of a driver's `PluginInfo`: the field and the reason.
#[derive(Debug)]
struct Refusal {
    field: &'static str,
    reason: String,
}

fn refuse(field: &'static str, reason: impl Into<String>) -> Refusal {
    Refusal {
        field,
        reason: reason.into(),
    }
}

impl RegistrationWatcher {
    /// A watcher of `dir` registering with `manager`.
    pub fn new(manager: PluginManager, dir: impl Into<PathBuf>) -> Self {
        Self {
            manager,
            dir: dir.into(),
            call_timeout: CALL_TIMEOUT,
            known: Mutex::new(BTreeMap::new()),
        }
    }

    /// How long each registration socket may take to answer one call (default
    /// [`CALL_TIMEOUT`]).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The directory watched.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Scans the directory every `interval` until `stop` completes.
    pub async fn run(&self, interval: Duration, stop: impl Future<Output = ()>) {
        crate::every(interval, stop, || self.scan()).await;
    }

    /// One scan: registers the drivers of new sockets, deregisters those whose socket went.
    /// Returns what it did, also logged.
    pub async fn scan(&self) -> Vec<Registration> {
        let present = match self.sockets() {
            Ok(present) => present,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "kubelet registration directory unreadable");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        // Gone, or made anew: what was registered through the old socket goes first.
        let stale: Vec<(PathBuf, Known)> = {
            let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            let paths: Vec<PathBuf> = known
                .iter()
                .filter(|(path, k)| present.get(*path) != Some(&k.identity))
                .map(|(path, _)| path.clone())
                .collect();
            paths
                .into_iter()
                .filter_map(|p| known.remove(&p).map(|k| (p, k)))
                .collect()
        };
        for (socket, known) in stale {
            out.push(self.gone(socket, known).await);
        }
        let new: Vec<(PathBuf, (u64, u64))> = {
            let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
            present
                .into_iter()
                .filter(|(path, _)| !known.contains_key(path))
                .collect()
        };
        for (socket, identity) in new {
            out.push(self.register(socket, identity).await);
        }
        out
    }

    /// The sockets in the directory now, by path, with their identity.
    fn sockets(&self) -> std::io::Result<BTreeMap<PathBuf, (u64, u64)>> {
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.file_type().is_socket() {
                out.insert(entry.path(), (meta.dev(), meta.ino()));
            }
        }
        Ok(out)
    }

    async fn gone(&self, socket: PathBuf, known: Known) -> Registration {
        let plugin = match known.registered {
            Some((plugin, registration)) => {
                let manager = self.manager.clone();
                let done =
                    tokio::task::spawn_blocking(move || manager.deregister(registration)).await;
                match done {
                    Ok(Ok(_)) => {
                        tracing::info!(plugin = %plugin, socket = %socket.display(), "kubelet registration socket gone; plugin deregistered");
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(plugin = %plugin, error = %e, "plugin deregistered, but its registrations' file could not be written");
                    }
                    Err(e) => {
                        tracing::warn!(plugin = %plugin, error = %e, "deregistration interrupted");
                    }
                }
                Some(plugin)
            }
            None => None,
        };
        Registration::Gone { socket, plugin }
    }

    async fn register(&self, socket: PathBuf, identity: (u64, u64)) -> Registration {
        let mut client = match self.connect(&socket).await {
            Ok(client) => client,
            Err(error) => return self.failed(socket, error),
        };
        let info =
            match tokio::time::timeout(self.call_timeout, client.get_info(InfoRequest {})).await {
                Ok(Ok(info)) => info.into_inner(),
                Ok(Err(status)) => {
                    return self.failed(socket, format!("GetInfo failed: {}", status.message()));
                }
                Err(_) => {
                    return self.failed(
                        socket,
                        format!("GetInfo did not answer within {:?}", self.call_timeout),
                    );
                }
            };
        let (plugin, endpoint, path) = match check(&info) {
            Ok(checked) => checked,
            Err(refusal) => {
                tracing::warn!(
                    socket = %socket.display(), field = refusal.field, reason = %refusal.reason,
                    "kubelet registration refused"
                );
                let error = format!("field `{}`: {}", refusal.field, refusal.reason);
                self.notify(&mut client, false, error).await;
                self.remember(&socket, identity, None);
                return Registration::Refused {
                    socket,
                    field: refusal.field,
                    reason: refusal.reason,
                };
            }
        };
        let manager = self.manager.clone();
        let id = plugin.clone();
        let registered = tokio::task::spawn_blocking(move || manager.register(id, endpoint)).await;
        let registration = match registered {
            Ok(Ok(registration)) => registration,
            Ok(Err(e)) => {
                let error = format!("the plugin could not be registered: {e}");
                self.notify(&mut client, false, error.clone()).await;
                return self.failed(socket, error);
            }
            Err(e) => return self.failed(socket, format!("registration interrupted: {e}")),
        };
        tracing::info!(
            plugin = %plugin, endpoint = %path.display(), socket = %socket.display(),
            "plugin registered through its kubelet registration socket"
        );
        self.notify(&mut client, true, String::new()).await;
        self.remember(&socket, identity, Some((plugin.clone(), registration)));
        Registration::Registered {
            socket,
            plugin,
            endpoint: path,
        }
    }

    fn failed(&self, socket: PathBuf, error: String) -> Registration {
        tracing::warn!(socket = %socket.display(), error = %error, "kubelet registration socket not registered; tried again at the next scan");
        Registration::Failed { socket, error }
    }

    fn remember(
        &self,
        socket: &Path,
        identity: (u64, u64),
        registered: Option<(PluginId, RegistrationId)>,
    ) {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                socket.to_owned(),
                Known {
                    identity,
                    registered,
                },
            );
    }

    /// Tells the registrar the outcome; a registrar that does not hear it is logged, no more
    /// (the registration stands or was refused either way).
    async fn notify(
        &self,
        client: &mut RegistrationClient<tonic::transport::Channel>,
        registered: bool,
        error: String,
    ) {
        let status = RegistrationStatus {
            plugin_registered: registered,
            error,
        };
        match tokio::time::timeout(self.call_timeout, client.notify_registration_status(status))
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(status)) => {
                tracing::warn!(error = %status.message(), "NotifyRegistrationStatus failed");
            }
            Err(_) => tracing::warn!("NotifyRegistrationStatus did not answer"),
        }
    }

    async fn connect(
        &self,
        socket: &Path,
    ) -> Result<RegistrationClient<tonic::transport::Channel>, String> {
        let path = socket.to_owned();
        // The URI is required by tonic and never dialled: the connector opens the socket.
        let endpoint = tonic::transport::Endpoint::from_static("http://kubelet-registration")
            .connect_timeout(self.call_timeout);
        let channel = tokio::time::timeout(
            self.call_timeout,
            endpoint.connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(TokioIo::new)
                }
            })),
        )
        .await
        .map_err(|_| format!("no connection within {:?}", self.call_timeout))?
        .map_err(|e| format!("cannot connect: {e}"))?;
        Ok(RegistrationClient::new(channel))
    }
}

/// Checks a driver's `PluginInfo`: the type, a CSI version we speak, the name a plugin id,
/// the endpoint an existing unix socket.
fn check(info: &PluginInfo) -> Result<(PluginId, Endpoint, PathBuf), Refusal> {
    if info.r#type != CSI_PLUGIN_TYPE {
        return Err(refuse(
            "type",
            format!(
                "{:?} is not {CSI_PLUGIN_TYPE:?}: this node registers CSI drivers only",
                info.r#type
            ),
        ));
    }
    let speaks = |v: &str| {
        let v = v.trim().trim_start_matches('v');
        v.split('.').next() == Some("1")
    };
    if !info.supported_versions.iter().any(|v| speaks(v)) {
        let offered: BTreeSet<&str> = info.supported_versions.iter().map(String::as_str).collect();
        return Err(refuse(
            "supported_versions",
            format!("{offered:?} has no CSI version 1.x, the only one this node speaks"),
        ));
    }
    let plugin = PluginId::new(info.name.clone()).map_err(|e| refuse("name", e.to_string()))?;
    let path = PathBuf::from(info.endpoint.trim_start_matches("unix://"));
    if !path.is_absolute() {
        return Err(refuse(
            "endpoint",
            format!(
                "{:?} is not an absolute path of a unix socket",
                info.endpoint
            ),
        ));
    }
    match std::fs::metadata(&path) {
        Ok(meta) if meta.file_type().is_socket() => {}
        Ok(_) => {
            return Err(refuse(
                "endpoint",
                format!("{} is not a unix socket", path.display()),
            ));
        }
        Err(e) => {
            return Err(refuse("endpoint", format!("{}: {e}", path.display())));
        }
    }
    let endpoint = Endpoint::unix(&path).map_err(|e| refuse("endpoint", e.to_string()))?;
    Ok((plugin, endpoint, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(kind: &str, name: &str, endpoint: &str, versions: &[&str]) -> PluginInfo {
        PluginInfo {
            r#type: kind.to_owned(),
            name: name.to_owned(),
            endpoint: endpoint.to_owned(),
            supported_versions: versions.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    #[test]
    fn a_plugin_info_is_checked_field_by_field() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("csi.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let file = dir.path().join("file");
        std::fs::write(&file, "").expect("file");
        let at = socket.to_str().expect("utf-8");
        let (plugin, _, path) =
            check(&info("CSIPlugin", "ebs.csi.aws.com", at, &["1.0.0"])).expect("good");
        assert_eq!(
            (plugin.as_str(), path.as_path()),
            ("ebs.csi.aws.com", socket.as_path())
        );
        check(&info(
            "CSIPlugin",
            "d",
            &format!("unix://{at}"),
            &["0.3.0", "v1.2.0"],
        ))
        .expect("a unix:// endpoint and a v-prefixed version");
        let field = |i: PluginInfo| check(&i).expect_err("refused").field;
        assert_eq!(field(info("DevicePlugin", "d", at, &["1.0.0"])), "type");
        assert_eq!(
            field(info("CSIPlugin", "d", at, &["0.3.0"])),
            "supported_versions"
        );
        assert_eq!(field(info("CSIPlugin", "d", at, &[])), "supported_versions");
        assert_eq!(field(info("CSIPlugin", "", at, &["1.0.0"])), "name");
        assert_eq!(
            field(info("CSIPlugin", "d", "csi.sock", &["1.0.0"])),
            "endpoint"
        );
        let not_socket = file.to_str().expect("utf-8");
        assert_eq!(
            field(info("CSIPlugin", "d", not_socket, &["1.0.0"])),
            "endpoint"
        );
        let missing = dir.path().join("none.sock");
        let missing = missing.to_str().expect("utf-8");
        assert_eq!(
            field(info("CSIPlugin", "d", missing, &["1.0.0"])),
            "endpoint"
        );
    }
}
