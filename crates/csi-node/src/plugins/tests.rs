use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_client::Endpoint;
use csi_structs::PluginId;
use csi_testkit::{MockPlugin, MockServer};
use tokio::time::Instant;

use super::*;

/// Every event, in order.
#[derive(Default)]
struct Log(Mutex<Vec<PluginEvent>>);

impl PluginObserver for Log {
    fn on_event(&self, event: &PluginEvent) {
        self.0.lock().expect("not poisoned").push(event.clone());
    }
}

impl Log {
    /// `(kind, registration)` of every event so far.
    fn kinds(&self) -> Vec<(&'static str, u64)> {
        self.0
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|e| {
                let kind = match e {
                    PluginEvent::Registered { .. } => "registered",
                    PluginEvent::Fingerprinted { .. } => "fingerprinted",
                    PluginEvent::FingerprintFailed { .. } => "fingerprint_failed",
                    PluginEvent::Healthy { .. } => "healthy",
                    PluginEvent::Unhealthy { .. } => "unhealthy",
                    PluginEvent::Gone { .. } => "gone",
                };
                (kind, e.registration().get())
            })
            .collect()
    }
}

fn fast() -> PluginManagerConfig {
    PluginManagerConfig {
        health_interval: Duration::from_millis(50),
        retry_interval: Duration::from_millis(50),
        fingerprint_interval: Duration::from_secs(60),
        node_detach: NodeDetachPolicy::DEFAULT,
    }
}

/// Only a guard against a hang: a healthy run needs a fraction of it.
const GUARD: Duration = Duration::from_secs(60);

fn guard() -> Instant {
    Instant::now() + GUARD
}

async fn mock(dir: &Path, socket: &str, name: &str, version: &str) -> (MockPlugin, MockServer) {
    let plugin = MockPlugin::builder()
        .name(name, version)
        .build()
        .expect("mock");
    let server = plugin
        .serve_unix(dir.join(socket))
        .await
        .expect("mock serves");
    (plugin, server)
}

fn endpoint(dir: &Path, socket: &str) -> Endpoint {
    Endpoint::unix(dir.join(socket)).expect("endpoint")
}

#[tokio::test]
async fn the_newest_registration_wins_and_survives_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_a, _sa) = mock(dir.path(), "a.sock", "a.csi.example", "1").await;
    let (_b, _sb) = mock(dir.path(), "b.sock", "b.csi.example", "1").await;
    let file = dir.path().join("plugins.json");
    let id = PluginId::new("p").expect("id");
    let log = Arc::new(Log::default());
    let manager = PluginManager::builder(fast())
        .state_file(&file)
        .observer(log.clone())
        .start()
        .expect("starts");
    let first = manager
        .register(id.clone(), endpoint(dir.path(), "a.sock"))
        .expect("registered");
    let second = manager
        .register(id.clone(), endpoint(dir.path(), "b.sock"))
        .expect("registered");
    assert!(second > first);
    // The old instance's late cleanup does not remove the new one.
    assert!(!manager.deregister(first).expect("no write needed"));
    let ready = manager.wait_for(&id, guard()).await.expect("ready");
    assert_eq!(ready.registration, second);
    assert_eq!(ready.fingerprint.plugin.name.as_str(), "b.csi.example");
    assert_eq!(
        log.kinds()[..3],
        [
            ("registered", first.get()),
            ("gone", first.get()),
            ("registered", second.get()),
        ]
    );
    assert!(
        log.kinds()
            .iter()
            .all(|(kind, r)| *kind == "registered" || *kind == "gone" || *r == second.get()),
        "nothing is reported for the replaced registration after it is gone: {:?}",
        log.kinds()
    );

    // A new manager on the same state file starts with the newest registration.
    drop(manager);
    let restarted = PluginManager::builder(fast())
        .state_file(&file)
        .start()
        .expect("restarts");
    let status = restarted.status(&id).expect("restored");
    assert_eq!(status.registration, second);
    assert_eq!(status.endpoint, endpoint(dir.path(), "b.sock"));
    let ready = restarted.wait_for(&id, guard()).await.expect("ready again");
    assert_eq!(ready.fingerprint.plugin.name.as_str(), "b.csi.example");
    // Numbers never repeat across the restart, and the stale one is still a no-op.
    let third = restarted
        .register(
            PluginId::new("q").expect("id"),
            endpoint(dir.path(), "a.sock"),
        )
        .expect("registered");
    assert!(third > second);
    assert!(!restarted.deregister(first).expect("no-op"));
    assert!(restarted.deregister(second).expect("current"));
    assert!(restarted.status(&id).is_none());
}

#[tokio::test(start_paused = true)]
async fn wait_for_ends_at_its_deadline_naming_the_plugin_and_what_is_missing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let manager = PluginManager::builder(fast()).start().expect("starts");
    let ghost = PluginId::new("ghost").expect("id");
    let err = manager
        .wait_for(&ghost, Instant::now() + Duration::from_secs(5))
        .await
        .expect_err("never registered");
    assert_eq!(err.plugin, ghost);
    assert_eq!(err.waited, Duration::from_secs(5));
    assert!(matches!(err.why, NotReady::NotRegistered), "{err}");
    assert_eq!(
        err.to_string(),
        "plugin ghost not ready after waiting 5s: it is not registered"
    );

    // Registered at a socket nobody serves: not fingerprinted when the deadline comes.
    let silent = PluginId::new("silent").expect("id");
    manager
        .register(silent.clone(), endpoint(dir.path(), "nobody.sock"))
        .expect("registered");
    let err = manager
        .wait_for(&silent, Instant::now() + Duration::from_secs(5))
        .await
        .expect_err("nobody answers");
    assert_eq!(err.plugin, silent);
    assert!(
        matches!(err.why, NotReady::NotFingerprinted { .. }),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("plugin silent not ready"),
        "{err}"
    );
}

#[tokio::test]
async fn a_plugin_that_comes_back_is_fingerprinted_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_first, server) = mock(dir.path(), "m.sock", "m.csi.example", "1.0.0").await;
    let log = Arc::new(Log::default());
    let manager = PluginManager::builder(fast())
        .observer(log.clone())
        .start()
        .expect("starts");
    let id = PluginId::new("m").expect("id");
    let mut events = manager.subscribe();
    let registration = manager
        .register(id.clone(), endpoint(dir.path(), "m.sock"))
        .expect("registered");
    manager.wait_for(&id, guard()).await.expect("ready");
    // Probed once: the health watcher has seen the socket, so it reports its removal.
    tokio::time::timeout(GUARD, async {
        while !matches!(events.recv().await, Ok(PluginEvent::Healthy { .. })) {}
    })
    .await
    .expect("probed (hang guard)");

    server
        .shutdown()
        .await
        .expect("stops and removes its socket");
    // A probe in flight may fail first; the socket's absence is the watcher's last word.
    tokio::time::timeout(GUARD, async {
        loop {
            if let Ok(PluginEvent::Unhealthy {
                why: Unhealthy::SocketRemoved,
                ..
            }) = events.recv().await
            {
                break;
            }
        }
    })
    .await
    .expect("the manager notices (hang guard)");
    let err = manager
        .wait_for(&id, Instant::now())
        .await
        .expect_err("not usable while gone");
    assert!(matches!(err.why, NotReady::Unhealthy(_)), "{err}");

    // The plugin restarts, upgraded, on the same socket: same registration, new fingerprint.
    let (_second, _server) = mock(dir.path(), "m.sock", "m.csi.example", "2.0.0").await;
    let (fingerprint, previous) = tokio::time::timeout(GUARD, async {
        loop {
            if let Ok(PluginEvent::Fingerprinted {
                fingerprint,
                previous,
                ..
            }) = events.recv().await
            {
                break (fingerprint, previous);
            }
        }
    })
    .await
    .expect("fingerprinted again (hang guard)");
    assert_eq!(fingerprint.plugin.vendor_version, "2.0.0");
    assert_eq!(
        previous.map(|p| p.plugin.vendor_version.clone()).as_deref(),
        Some("1.0.0")
    );
    let ready = manager.wait_for(&id, guard()).await.expect("usable again");
    assert_eq!(ready.registration, registration);
    let status = manager.status(&id).expect("registered");
    assert_eq!(status.fingerprints, 1, "one registration fingerprinted");
    assert!(log.kinds().iter().all(|(_, r)| *r == registration.get()));
}

#[tokio::test]
async fn a_socket_nobody_listens_on_is_said_before_the_fingerprint_gives_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Bound and closed: the socket file stays, nobody accepts on it.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("dead.sock")).expect("binds"));
    std::fs::write(dir.path().join("file.sock"), b"").expect("a plain file");
    let manager = PluginManager::builder(fast()).start().expect("starts");
    let mut events = manager.subscribe();
    for name in ["dead", "file"] {
        let id = PluginId::new(name).expect("id");
        let socket = format!("{name}.sock");
        manager
            .register(id, endpoint(dir.path(), &socket))
            .expect("registered");
    }
    // The first failure reported is the one dial, not the fingerprint's wait for the socket
    // (which would say how long it waited).
    let mut said = std::collections::BTreeMap::new();
    tokio::time::timeout(GUARD, async {
        while said.len() < 2 {
            if let Ok(PluginEvent::FingerprintFailed { plugin, error, .. }) = events.recv().await {
                said.entry(plugin.to_string())
                    .or_insert_with(|| error.to_string());
            }
        }
    })
    .await
    .expect("both reported (hang guard)");
    let dead = &said["dead"];
    assert!(
        dead.contains("refused") && !dead.contains("after waiting"),
        "{dead}"
    );
    assert!(said["file"].contains("not a socket"), "{said:?}");
    let status = manager
        .status(&PluginId::new("dead").expect("id"))
        .expect("registered");
    let last = status.last_error.map(|e| e.to_string());
    assert!(
        last.as_ref()
            .is_some_and(|e| e.contains("could not connect")),
        "{last:?}"
    );
}

#[tokio::test]
async fn a_directory_socket_is_registered_once_and_deregistered_when_it_goes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("dir");
    let (_mock, server) = mock(&plugins, "m.sock", "m.csi.example", "1").await;
    std::fs::write(plugins.join("not an id?.sock"), b"").expect("a file, not a socket");
    let manager = PluginManager::builder(fast()).start().expect("starts");
    let watcher = DirWatcher::new(manager.clone(), &plugins);
    let id = PluginId::new("m").expect("id");

    watcher.scan();
    let found = manager.status(&id).expect("registered from the directory");
    assert!(matches!(found.source, RegistrationSource::Directory { .. }));
    assert_eq!(manager.list().len(), 1, "only sockets count");
    // The file is passed over, and the watcher says so.
    let ignored = watcher.ignored();
    assert_eq!(ignored.len(), 1, "{ignored:?}");
    assert_eq!(ignored[0].0, plugins.join("not an id?.sock"));
    assert!(ignored[0].1.contains("not a socket"), "{ignored:?}");
    watcher.scan();
    assert_eq!(
        manager.status(&id).map(|s| s.registration),
        Some(found.registration),
        "the same socket is not registered twice"
    );

    // The embedder registers the plugin more recently: the scan leaves that alone.
    let pushed = manager
        .register(id.clone(), endpoint(&plugins, "m.sock"))
        .expect("registered");
    watcher.scan();
    assert_eq!(manager.status(&id).map(|s| s.registration), Some(pushed));
    assert!(!manager.deregister(found.registration).expect("no-op"));

    // Back to the directory's: the socket goes, and the registration made from it is gone.
    assert!(manager.deregister(pushed).expect("current"));
    let again = DirWatcher::new(manager.clone(), &plugins);
    again.scan();
    assert!(manager.status(&id).is_some());
    server
        .shutdown()
        .await
        .expect("stops and removes its socket");
    again.scan();
    assert!(manager.status(&id).is_none(), "{:?}", manager.list());
}

#[tokio::test]
async fn a_plugins_two_clients_share_its_volumes_turns() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_m, _s) = mock(dir.path(), "m.sock", "m.csi.example", "1").await;
    let id = PluginId::new("p").expect("id");
    let manager = PluginManager::builder(fast()).start().expect("starts");
    manager
        .register(id.clone(), endpoint(dir.path(), "m.sock"))
        .expect("registered");
    let ready = manager.wait_for(&id, guard()).await.expect("ready");
    let detach = manager.detach_client(&id).expect("registered");
    // A release's node detach waits for a claim's call about the same volume, and the
    // other way round, instead of drawing ABORTED from the plugin.
    assert!(Arc::ptr_eq(
        ready.client.volume_turns(),
        detach.volume_turns()
    ));
    let volume = csi_structs::ExternalVolumeId::new("vol-1").expect("id");
    let _turn = ready.client.volume_turns().take(&volume).await;
    assert_eq!(detach.volume_turns().busy(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_do_not_wait_for_a_stalled_write_of_the_registrations() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_a, _sa) = mock(dir.path(), "a.sock", "a.csi.example", "1").await;
    let file = dir.path().join("plugins.json");
    let p = PluginId::new("p").expect("id");
    let q = PluginId::new("q").expect("id");
    let manager = PluginManager::builder(fast())
        .state_file(&file)
        .start()
        .expect("starts");
    manager
        .register(p.clone(), endpoint(dir.path(), "a.sock"))
        .expect("registered");
    manager.wait_for(&p, guard()).await.expect("ready");

    // The disk stops answering as q registers.
    let stalled =
        csi_testkit::disk::StalledFile::at(&file.with_extension("json.tmp")).expect("a FIFO");
    let registering = tokio::task::spawn_blocking({
        let manager = manager.clone();
        let (q, endpoint) = (q.clone(), endpoint(dir.path(), "a.sock"));
        move || manager.register(q, endpoint)
    });
    let under_way = tokio::task::spawn_blocking({
        let file = file.clone();
        move || {
            let deadline = std::time::Instant::now() + GUARD;
            while !crate::state::writes_under_way()
                .iter()
                .any(|(path, _)| *path == file)
            {
                assert!(std::time::Instant::now() < deadline, "hang guard");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    under_way.await.expect("the waiting task");

    // Had the readers waited for the write, they would have answered only once it was given
    // up (after the state files' write timeout).
    assert!(manager.get(&p).is_some());
    assert!(manager.status(&q).is_none());
    let listed: Vec<_> = manager.list().into_iter().map(|s| s.plugin).collect();
    assert_eq!(listed, std::slice::from_ref(&p));

    // The disk answers: the write fails (a FIFO cannot be synced) rather than having been
    // given up, unless this machine froze for the whole write timeout; nothing changed.
    tokio::task::spawn_blocking(move || stalled.answer())
        .await
        .expect("the disk task")
        .expect("the FIFO reads");
    let err = registering
        .await
        .expect("the registering task")
        .expect_err("the write failed");
    assert!(
        matches!(err, StateFileError::Io { .. }),
        "the write was given up while the readers waited: {err}"
    );
    assert!(manager.status(&q).is_none());
    let restarted = PluginManager::builder(fast())
        .state_file(&file)
        .start()
        .expect("restarts");
    assert!(restarted.status(&p).is_some());
    assert!(restarted.status(&q).is_none());
}

#[test]
fn log_events_writes_one_line_per_transition_naming_the_plugin() {
    let plugin = PluginId::new("ebs").expect("id");
    let log = LogEvents::default();
    let gone = |registration| PluginEvent::Gone {
        plugin: plugin.clone(),
        registration,
        why: GoneReason::Deregistered,
    };
    let lines = csi_testkit::logs::capture(|| {
        log.on_event(&PluginEvent::Registered {
            plugin: plugin.clone(),
            registration: RegistrationId(1),
            endpoint: Endpoint::unix("/run/csi/ebs.sock").expect("endpoint"),
            source: RegistrationSource::Pushed,
        });
        log.on_event(&PluginEvent::Unhealthy {
            plugin: plugin.clone(),
            registration: RegistrationId(1),
            why: Unhealthy::SocketRemoved,
        });
        log.on_event(&PluginEvent::Gone {
            plugin: plugin.clone(),
            registration: RegistrationId(1),
            why: GoneReason::Replaced {
                by: RegistrationId(2),
            },
        });
        log.on_event(&PluginEvent::Registered {
            plugin: plugin.clone(),
            registration: RegistrationId(2),
            endpoint: Endpoint::unix("/plugins/ebs.sock").expect("endpoint"),
            source: RegistrationSource::Directory {
                socket: "/plugins/ebs.sock".into(),
                inode: 7,
            },
        });
        log.on_event(&gone(RegistrationId(2)));
        // Its socket was forgotten with it: told as a plain deregistration.
        log.on_event(&gone(RegistrationId(2)));
    });
    assert_eq!(lines.len(), 6, "{lines:#?}");
    assert!(lines.iter().all(|l| l.contains("plugin=ebs")), "{lines:#?}");
    assert!(lines[0].starts_with(" INFO") && lines[0].contains("plugin registered"));
    assert!(lines[0].contains("/run/csi/ebs.sock"), "{}", lines[0]);
    assert!(
        lines[1].contains("health=\"unhealthy\" reason=socket removed"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("plugin registration replaced"),
        "{}",
        lines[2]
    );
    assert!(
        lines[2].contains("registration=#1 replaced_by=#2"),
        "{}",
        lines[2]
    );
    assert!(lines[3].contains("plugin socket appeared"), "{}", lines[3]);
    assert!(
        lines[4].contains("plugin socket removed or replaced"),
        "{}",
        lines[4]
    );
    assert!(
        lines[4].contains("socket=/plugins/ebs.sock"),
        "{}",
        lines[4]
    );
    assert!(
        lines[5].ends_with("plugin deregistered plugin=ebs registration=#2"),
        "{}",
        lines[5]
    );
    assert!(
        log.sockets().is_empty(),
        "nothing kept for a gone registration"
    );
}

#[test]
fn a_plugin_event_is_one_line_for_people() {
    let plugin = PluginId::new("ebs").expect("id");
    let registered = PluginEvent::Registered {
        plugin: plugin.clone(),
        registration: RegistrationId(3),
        endpoint: Endpoint::unix("/run/csi/ebs.sock").expect("endpoint"),
        source: RegistrationSource::Directory {
            socket: "/run/csi/ebs\n.sock".into(),
            inode: 7,
        },
    };
    assert_eq!(
        registered.to_string(),
        format!(
            "plugin ebs (#3): registered at {} by socket /run/csi/ebs\\n.sock",
            Endpoint::unix("/run/csi/ebs.sock").expect("endpoint")
        )
    );
    let unhealthy = PluginEvent::Unhealthy {
        plugin: plugin.clone(),
        registration: RegistrationId(3),
        why: Unhealthy::NotReady,
    };
    assert_eq!(
        unhealthy.to_string(),
        "plugin ebs (#3): unhealthy: probe answered not ready"
    );
    let gone = PluginEvent::Gone {
        plugin,
        registration: RegistrationId(3),
        why: GoneReason::Replaced {
            by: RegistrationId(4),
        },
    };
    assert_eq!(
        gone.to_string(),
        "plugin ebs (#3): gone, replaced by registration #4"
    );
}
