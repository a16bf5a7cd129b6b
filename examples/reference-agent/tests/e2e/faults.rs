//! The agent's own disk failing, without root or a small file system: a directory where a
//! state file's temporary file goes makes every write of that file fail, as a full disk does,
//! and removing it is the space coming back. The requests that need the file must be answered
//! at once as the agent's failure (HTTP 503, kind `local_io`), never as the plugin's, and the
//! agent must work again by itself.
//!
//! A disk that stalls instead (a FIFO in the temporary file's place, which blocks the write
//! until the test reads it): the request is answered 503 once the write is given up, the next
//! write of the file is refused at once while the stuck one is under way, and nothing the
//! agent did not acknowledge ends up in the file.

use std::net::SocketAddr;
use std::path::Path;

use csi_agent::ops::api::{
    AgentInfo, ApiError, ClaimVolume, CreateVolume, RegisterVolume, StatusView, VolumeView,
};
use csi_agent::ops::client::{self, ClientError};
use csi_testkit::disk::StalledFile;
use csi_testkit::{MockPlugin, MockServer};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::serve::{GUARD, Serve, eventually, fast_backoff, json, metrics};

/// One control API request; `Err((status, error))` for an error answer.
async fn api<B: Serialize, T: DeserializeOwned>(
    data: &Path,
    method: hyper::Method,
    path: &str,
    body: Option<&B>,
) -> Result<T, (u16, ApiError)> {
    let info: AgentInfo =
        serde_json::from_slice(&std::fs::read(data.join("agent.json")).expect("agent.json"))
            .expect("agent.json parses");
    let addr: SocketAddr = info.http.parse().expect("an address");
    let token = std::fs::read_to_string(data.join("control.token")).expect("the token");
    match client::call(addr, Some(token.trim()), method, path, body, GUARD).await {
        Ok(answer) => Ok(answer),
        Err(ClientError::Api { status, error }) => Err((status, error)),
        Err(other) => panic!("{path}: {other}"),
    }
}

/// An agent serving one mock plugin that holds the pre-provisioned volumes `external_ids`
/// (1 MiB each), with the plugin fingerprinted: ready to take requests about its volumes.
struct Setup {
    data: std::path::PathBuf,
    mock: MockPlugin,
    agent: Serve,
    _server: MockServer,
    _dir: tempfile::TempDir,
}

async fn setup(external_ids: &[&str]) -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    let data = dir.path().join("data");
    let mock = external_ids
        .iter()
        .fold(MockPlugin::builder(), |builder, id| {
            builder.volume(*id, 1 << 20)
        })
        .build()
        .expect("mock with pre-provisioned volumes");
    let server = mock
        .serve_unix(plugins.join("mock.sock"))
        .await
        .expect("mock serves");
    let mut agent = Serve::start(dir.path(), "agent", &data, &fast_backoff(&plugins));
    agent.ready().await;
    eventually("the plugin is fingerprinted", async || {
        let status: StatusView = json(&data, &["status"]).await;
        status
            .plugins
            .iter()
            .any(|p| p.id == "mock" && p.fingerprints >= 1)
            .then_some(())
    })
    .await;
    Setup {
        data,
        mock,
        agent,
        _server: server,
        _dir: dir,
    }
}

/// Registering the plugin's volume `external_id` as `id`.
fn register(id: &str, external_id: &str) -> RegisterVolume {
    RegisterVolume {
        id: id.into(),
        external_id: external_id.into(),
        plugin: "mock".into(),
        access_mode: "single-node-writer".into(),
        attachment: "mount".into(),
        controller_publish: None,
        context: Default::default(),
        secrets: Default::default(),
        accessible_topology: Vec::new(),
    }
}

/// Makes every write of the state file `file` fail (or work again).
fn block(file: &Path, blocked: bool) {
    let tmp = file.with_extension("json.tmp");
    if blocked {
        std::fs::create_dir_all(&tmp).expect("the data directory is writable");
    } else {
        std::fs::remove_dir(&tmp).expect("the blocker is there");
    }
}

fn claim(workload: &str) -> ClaimVolume {
    ClaimVolume {
        workload: workload.to_owned(),
        mode: "write".to_owned(),
    }
}

/// A local I/O failure: 503, `local_io`, class `retry`, naming `file`, not the plugin.
fn assert_local(answer: &(u16, ApiError), file: &str) {
    let (status, error) = answer;
    assert_eq!(*status, 503, "{error:?}");
    assert_eq!(error.kind, "local_io", "{error:?}");
    assert_eq!(error.class.as_deref(), Some("retry"), "{error:?}");
    assert!(error.error.contains(file), "{error:?}");
    assert!(!error.error.contains("plugin answered"), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_that_cannot_be_written_fails_requests_at_once_as_our_own_and_recovers() {
    // Bound by name (not `..`), so the plugin and the directory live to the test's end.
    let Setup {
        data,
        mock,
        mut agent,
        _server,
        _dir,
    } = setup(&["ext-2", "ext-3"]).await;
    let create = CreateVolume {
        id: "v1".into(),
        plugin: "mock".into(),
        capacity_bytes: 1 << 20,
        access_mode: "single-node-writer".into(),
        attachment: "mount".into(),
        parameters: Default::default(),
        secrets: Default::default(),
        requisite_topology: Vec::new(),
        preferred_topology: Vec::new(),
        snapshot: None,
        clone: None,
    };
    let _: VolumeView = api(
        &data,
        hyper::Method::POST,
        "/v1/volumes/create",
        Some(&create),
    )
    .await
    .expect("created");

    // The volume book cannot be written: registering fails at once, naming volumes.json.
    let book = data.join("volumes.json");
    block(&book, true);
    let first = register("v2", "ext-2");
    let refused = api::<_, VolumeView>(&data, hyper::Method::POST, "/v1/volumes", Some(&first))
        .await
        .expect_err("volumes.json cannot be written");
    assert_local(&refused, "volumes.json");
    block(&book, false);
    let _: VolumeView = api(&data, hyper::Method::POST, "/v1/volumes", Some(&first))
        .await
        .expect("registered once volumes.json can be written");

    let status: StatusView = json(&data, &["status"]).await;
    assert!(status.failing_files.is_empty(), "{status:?}");

    // It fails again: listed, counted, and logged once more.
    block(&book, true);
    let again = register("v3", "ext-3");
    let refused = api::<_, VolumeView>(&data, hyper::Method::POST, "/v1/volumes", Some(&again))
        .await
        .expect_err("volumes.json cannot be written");
    assert_local(&refused, "volumes.json");
    let status: StatusView = json(&data, &["status"]).await;
    assert!(
        status
            .failing_files
            .iter()
            .any(|f| f.contains("volumes.json")),
        "{status:?}"
    );
    assert_eq!(status.store_failure, None, "the claim store is fine");
    let metrics = metrics(&data);
    assert!(
        metrics.contains("csi_agent_state_files_failing 1"),
        "{metrics}"
    );
    // Claims go on meanwhile: they write no state file (the node's usage records are in its
    // database, beside the claims).
    let view: csi_agent::ops::api::ClaimView = api(
        &data,
        hyper::Method::POST,
        "/v1/volumes/v1/claim",
        Some(&claim("w1")),
    )
    .await
    .expect("a claim needs no state file");
    assert_eq!(view.state, "taken");
    block(&book, false);
    let _: VolumeView = api(&data, hyper::Method::POST, "/v1/volumes", Some(&again))
        .await
        .expect("registered once volumes.json can be written");
    let status: StatusView = json(&data, &["status"]).await;
    assert!(status.failing_files.is_empty(), "{status:?}");
    let _: VolumeView = api(
        &data,
        hyper::Method::POST,
        "/v1/volumes/v1/release",
        Some(&csi_agent::ops::api::ReleaseVolume {
            workload: "w1".into(),
        }),
    )
    .await
    .expect("the release is stored");
    eventually("the release finishes", async || {
        let v: VolumeView = json(&data, &["volume", "status", "v1"]).await;
        v.claims.is_empty().then_some(())
    })
    .await;
    assert!(mock.published().is_empty() && mock.staged().is_empty());

    // Logged once each time the file started failing and once each time it worked again,
    // however many writes failed in between. (Read after the stop, which flushes the log.)
    assert_eq!(agent.terminate(), Some(0));
    let log = agent.log();
    let count = |needle: &str| {
        log.lines()
            .filter(|l| l.contains(needle) && l.contains("volumes.json"))
            .count()
    };
    assert_eq!(count("state file cannot be written"), 2, "{log}");
    assert_eq!(count("state file written again"), 2, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_write_that_hangs_is_given_up_and_the_agent_recovers_when_the_disk_answers() {
    let Setup {
        data,
        mut agent,
        _server,
        _dir,
        ..
    } = setup(&["ext-1", "ext-2"]).await;

    // A FIFO where the book's temporary file goes: opening it for writing blocks until a
    // reader comes, as a write to a stalled disk blocks until the disk answers.
    let book = data.join("volumes.json");
    let stalled = StalledFile::at(&book.with_extension("json.tmp")).expect("a FIFO");

    // The write is given up (after csi-node's WRITE_TIMEOUT): 503, ours, naming the file.
    let refused = api::<_, VolumeView>(
        &data,
        hyper::Method::POST,
        "/v1/volumes",
        Some(&register("v1", "ext-1")),
    )
    .await
    .expect_err("the write of volumes.json hangs");
    assert_local(&refused, "volumes.json");
    assert!(refused.1.error.contains("did not finish"), "{refused:?}");
    // While the stuck write is under way, the next one is refused without touching the file.
    let refused = api::<_, VolumeView>(
        &data,
        hyper::Method::POST,
        "/v1/volumes",
        Some(&register("v2", "ext-2")),
    )
    .await
    .expect_err("an earlier write has not finished");
    assert_local(&refused, "volumes.json");
    assert!(
        refused.1.error.contains("earlier write has not finished"),
        "{refused:?}"
    );

    // The disk answers: the stuck write goes on (and fails: a FIFO cannot be synced).
    let taken = tokio::task::spawn_blocking(move || stalled.answer())
        .await
        .expect("the reader ran")
        .expect("the FIFO reads");
    assert!(
        String::from_utf8_lossy(&taken).contains("ext-1"),
        "the stuck write carried the first registration"
    );
    let registered = eventually("registering works again", async || {
        api::<_, VolumeView>(
            &data,
            hyper::Method::POST,
            "/v1/volumes",
            Some(&register("v2", "ext-2")),
        )
        .await
        .ok()
    })
    .await;
    assert_eq!(registered.id, "v2");
    let status: StatusView = json(&data, &["status"]).await;
    assert!(status.failing_files.is_empty(), "{status:?}");
    // Only what was acknowledged is in the book: v2, not the v1 given up on.
    let stored = std::fs::read_to_string(&book).expect("volumes.json");
    assert!(
        stored.contains("ext-2") && !stored.contains("ext-1"),
        "{stored}"
    );
    assert_eq!(agent.terminate(), Some(0));
}
