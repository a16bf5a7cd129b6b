//! Registering plugins from a directory of sockets.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use csi_client::Endpoint;
use csi_structs::PluginId;
use csi_structs::untrusted::escaped;

use super::PluginManager;
use super::event::{RegistrationId, RegistrationSource};

/// Watches a directory for `<plugin-id>.sock` sockets and keeps a [`PluginManager`]'s
/// registrations in step with it: a socket that appears is registered, one that disappears
/// is deregistered, and one made again at the same path (a new inode: the plugin restarted)
/// is registered anew, replacing the old instance.
///
/// Each socket is registered once: a plugin id that the embedder registered more recently
/// (with [`PluginManager::register`]) keeps that registration until the socket changes. A
/// manager restored from its state file keeps the directory registrations whose socket is
/// still the same. A socket name that is not a valid plugin id is ignored with one warning.
#[derive(Debug)]
pub struct DirWatcher {
    manager: PluginManager,
    dir: PathBuf,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// The sockets registered (or adopted), by plugin id: path, inode, registration.
    sockets: BTreeMap<PluginId, (PathBuf, u64, RegistrationId)>,
    /// Names already warned about.
    ignored: BTreeSet<String>,
    /// What the last scan passed over, and why.
    skipped: BTreeMap<PathBuf, String>,
    /// Whether the manager's directory registrations were adopted.
    adopted: bool,
}

impl DirWatcher {
    /// A watcher of `dir` feeding `manager`. Scans nothing yet.
    pub fn new(manager: PluginManager, dir: impl Into<PathBuf>) -> Self {
        Self {
            manager,
            dir: dir.into(),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the last scan passed over, and why: a `<name>.sock` that is not a socket, a
    /// socket whose name is not a valid plugin id or whose path cannot be dialled. Each is
    /// also logged once.
    pub fn ignored(&self) -> Vec<(PathBuf, String)> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.skipped.clone().into_iter().collect()
    }

    /// One scan: registers new sockets, deregisters vanished ones, registers replaced ones
    /// anew. A registration the state file could not take is logged and tried again at the
    /// next scan.
    pub fn scan(&self) {
        let (found, not_sockets) = list_sockets(&self.dir);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let mut skipped = BTreeMap::new();
        for (name, path) in not_sockets {
            if seen.ignored.insert(name) {
                tracing::warn!(path = %escaped(&path.to_string_lossy()), "a plugin socket's name, but not a socket; ignored");
            }
            skipped.insert(path, "a plugin socket's name, but not a socket".to_owned());
        }
        if !seen.adopted {
            seen.adopted = true;
            for status in self.manager.list() {
                if let RegistrationSource::Directory { socket, inode } = &status.source
                    && socket.parent() == Some(self.dir.as_path())
                {
                    seen.sockets.insert(
                        status.plugin.clone(),
                        (socket.clone(), *inode, status.registration),
                    );
                }
            }
        }
        let gone: Vec<PluginId> = seen
            .sockets
            .iter()
            .filter(|(id, (path, inode, _))| {
                found.get(id.as_str()) != Some(&(path.clone(), *inode))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            let Some((path, _, registration)) = seen.sockets.get(&id).cloned() else {
                continue;
            };
            match self.manager.deregister(registration) {
                Ok(_) => {
                    seen.sockets.remove(&id);
                    tracing::debug!(plugin = %id, socket = %escaped(&path.to_string_lossy()), "plugin socket removed or replaced");
                }
                Err(e) => {
                    tracing::warn!(plugin = %id, error = %e, "cannot deregister the plugin; will retry");
                }
            }
        }
        for (name, (path, inode)) in found {
            let id = match PluginId::new(name.clone()) {
                Ok(id) => id,
                Err(e) => {
                    if seen.ignored.insert(name) {
                        tracing::warn!(socket = %escaped(&path.to_string_lossy()), error = %e, "socket name is not a valid plugin id; ignored");
                    }
                    skipped.insert(path, format!("the name is not a valid plugin id: {e}"));
                    continue;
                }
            };
            if seen.sockets.contains_key(&id) {
                continue;
            }
            let endpoint = match Endpoint::unix(&path) {
                Ok(endpoint) => endpoint,
                Err(e) => {
                    if seen.ignored.insert(name) {
                        tracing::warn!(socket = %escaped(&path.to_string_lossy()), error = %e, "unusable socket path; ignored");
                    }
                    skipped.insert(path, format!("unusable socket path: {e}"));
                    continue;
                }
            };
            let source = RegistrationSource::Directory {
                socket: path.clone(),
                inode,
            };
            match self.manager.register_from(id.clone(), endpoint, source) {
                Ok(registration) => {
                    seen.sockets.insert(id, (path, inode, registration));
                }
                Err(e) => {
                    tracing::warn!(plugin = %id, error = %e, "cannot register the plugin; will retry");
                }
            }
        }
        seen.skipped = skipped;
    }

    /// Creates the directory (a failure is logged: the scans find nothing until it exists),
    /// then scans every `interval` until `stop` completes, then stops the manager's instance
    /// tasks ([`PluginManager::shutdown`]).
    pub async fn run(&self, interval: Duration, stop: impl Future<Output = ()>) {
        if let Err(e) = std::fs::create_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot create the plugin directory");
        }
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(1)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = ticker.tick() => self.scan(),
                () = &mut stop => break,
            }
        }
        self.manager.shutdown();
    }
}

/// `<name>.sock` sockets in `dir`: name → (path, inode); and the `<name>.sock` entries that
/// are not sockets, name → path.
type Listing = (BTreeMap<String, (PathBuf, u64)>, BTreeMap<String, PathBuf>);

fn list_sockets(dir: &Path) -> Listing {
    let (mut out, mut not_sockets) = (BTreeMap::new(), BTreeMap::new());
    let Ok(read) = std::fs::read_dir(dir) else {
        return (out, not_sockets);
    };
    for entry in read.flatten() {
        let path = entry.path();
        let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".sock"))
        else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_socket() {
            out.insert(stem.to_owned(), (path.clone(), meta.ino()));
        } else {
            not_sockets.insert(stem.to_owned(), path);
        }
    }
    (out, not_sockets)
}
