//! The volume manager on a redb database (`UsageDb`): one record per volume, group-committed,
//! a JSON usage file of an older version moved in once, and a disk that fails.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use csi_claims::store::{ClaimStore, RedbStore};
use csi_client::Rpc;
use csi_node::layout::Layout;
use csi_node::state::{StateFileError, save_json};
use csi_node::volumes::{
    MountRequest, StepState, UnmountRequest, UsageDb, UsageJson, UsageStore, VolumeError,
    VolumeManager,
};
use csi_structs::{AccessMode, MountOptions, VolumeCapability};
use csi_testkit::disk::DiskFaults;
use support::{
    GUARD, Made, Plugin, create_and_attach, mock_plugin, mount_request, unmount_request,
};

fn capability() -> VolumeCapability {
    VolumeCapability::mount(AccessMode::SingleNodeMultiWriter, MountOptions::new())
}

fn mount(plugin: &Plugin, made: &Made, workload: &str) -> MountRequest {
    mount_request(plugin, made, workload, &capability())
}

fn unmount(plugin: &Plugin, made: &Made, workload: &str) -> UnmountRequest {
    unmount_request(plugin, made, workload, &capability())
}

/// A manager on the database `db` (file `file`), paths under `<dir>/node`.
fn manager(plugin: &Plugin, db: &RedbStore, file: &Path) -> VolumeManager {
    let root = plugin.dir.path().join("node");
    let usage = UsageDb::open(db, file, Some(&root.join("usage.json"))).expect("usage records");
    VolumeManager::open_with(
        Layout::new(&root),
        Arc::new(usage),
        Arc::new(plugin.plugins.clone()),
    )
    .expect("opens")
}

async fn guarded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f)
        .await
        .expect("hang guard: the volume manager answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_mounts_each_keep_their_own_record_and_a_reopen_restores_them() {
    let plugin = mock_plugin().await;
    let file = plugin.dir.path().join("node.redb");
    let db = RedbStore::open(&file).expect("db");
    let volumes = manager(&plugin, &db, &file);
    let mut made = Vec::new();
    for i in 0..12 {
        made.push(
            create_and_attach(&plugin.plugins, &plugin.id, &format!("v{i}"), &capability()).await,
        );
    }
    let mounts: Vec<_> = made
        .iter()
        .map(|v| {
            let (volumes, request) = (volumes.clone(), mount(&plugin, v, "w"));
            tokio::spawn(async move { volumes.mount(&request).await })
        })
        .collect();
    for m in mounts {
        guarded(m).await.expect("task").expect("mounted");
    }
    // One of them goes again: its record is removed, the others stay.
    guarded(volumes.unmount(&unmount(&plugin, &made[0], "w")))
        .await
        .expect("unmounted");
    assert_eq!(volumes.records().len(), 11);
    // The claims' own table is untouched by the records.
    assert!(db.load_all().await.expect("claims").is_empty());

    drop(volumes);
    let again = manager(&plugin, &db, &file);
    let mut records = again.records();
    records.sort_by(|a, b| a.volume.cmp(&b.volume));
    assert_eq!(records.len(), 11, "{records:?}");
    for r in &records {
        assert_eq!(r.stage, Some(StepState::Done), "{r:?}");
        assert_eq!(r.users["w"].publish, StepState::Done, "{r:?}");
    }
    assert!(records.iter().all(|r| r.volume != "v0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_usage_file_of_an_older_version_moves_into_the_database_once() {
    let plugin = mock_plugin().await;
    let root = plugin.dir.path().join("node");
    let v = create_and_attach(&plugin.plugins, &plugin.id, "db", &capability()).await;
    // An older version's manager wrote its records to the JSON file.
    {
        let old = VolumeManager::open(
            Layout::new(&root),
            root.join("usage.json"),
            Arc::new(plugin.plugins.clone()),
        )
        .expect("opens");
        guarded(old.mount(&mount(&plugin, &v, "w")))
            .await
            .expect("mounted");
    }
    let json = UsageJson::new(root.join("usage.json"));
    let before = json.load().expect("the file");
    assert_eq!(before.len(), 1);

    let file = plugin.dir.path().join("node.redb");
    let db = RedbStore::open(&file).expect("db");
    let volumes = manager(&plugin, &db, &file);
    let records = volumes.records();
    assert_eq!(records, before.values().cloned().collect::<Vec<_>>());
    assert!(!root.join("usage.json").exists(), "the file is moved away");
    assert!(root.join("usage.json.migrated").exists());

    // The records now live in the database: a change there is what a reopen sees.
    guarded(volumes.unmount(&unmount(&plugin, &v, "w")))
        .await
        .expect("unmounted");
    drop(volumes);
    assert!(manager(&plugin, &db, &file).records().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_in_the_database_that_cannot_be_used_is_named_and_the_manager_does_not_open() {
    let plugin = mock_plugin().await;
    let file = plugin.dir.path().join("node.redb");
    let db = RedbStore::open(&file).expect("db");
    let usage = UsageDb::open(&db, &file, None).expect("usage");
    let records = db.records(csi_node::volumes::USAGE_TABLE).expect("table");
    records
        .put("mock/db", Some(b"{not json".to_vec()))
        .await
        .expect("written");
    let err = usage.load().expect_err("damaged");
    let text = err.to_string();
    assert!(matches!(err, StateFileError::Record { .. }), "{text}");
    assert!(
        text.contains("node.redb") && text.contains("mock/db"),
        "{text}"
    );
    // A record under another volume's key.
    let good = serde_json::json!({
        "plugin": "mock", "volume": "db", "external_id": "x", "staging": null,
        "stage": null, "users": {}
    });
    records
        .put("mock/other", Some(serde_json::to_vec(&good).expect("json")))
        .await
        .expect("written");
    records.put("mock/db", None).await.expect("removed");
    let err = usage.load().expect_err("wrong key");
    assert!(err.to_string().contains("mock/other"), "{err}");
    // The JSON file's own errors are kept, too: a damaged one is not moved in.
    records.put("mock/other", None).await.expect("removed");
    let legacy = plugin.dir.path().join("usage.json");
    save_json(&legacy, &serde_json::json!({"version": 9})).expect("written");
    let err = UsageDb::open(&db, &file, Some(&legacy)).expect_err("a newer format");
    assert!(err.to_string().contains("usage.json"), "{err}");
    assert!(legacy.exists(), "a file that was not moved in stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_mount_before_any_stage_naming_the_file_and_it_works_again() {
    let plugin = mock_plugin().await;
    let file = plugin.dir.path().join("node.redb");
    let disk = DiskFaults::default();
    let db =
        RedbStore::with_opener(format!("redb {}", file.display()), disk.opener(&file)).expect("db");
    let volumes = manager(&plugin, &db, &file);
    let v = create_and_attach(&plugin.plugins, &plugin.id, "db", &capability()).await;

    disk.full.store(true, Ordering::SeqCst);
    let err = guarded(volumes.mount(&mount(&plugin, &v, "w")))
        .await
        .expect_err("the user cannot be recorded");
    let text = err.to_string();
    assert!(
        matches!(&err, VolumeError::Usage { source, .. } if matches!(**source, StateFileError::Store { .. })),
        "{err:?}"
    );
    assert!(text.contains("node.redb"), "{text}");
    assert!(
        plugin
            .mock
            .calls()
            .all()
            .iter()
            .all(|c| c.rpc != Rpc::NodeStageVolume && c.rpc != Rpc::NodePublishVolume),
        "a call went out without its record"
    );
    assert!(volumes.records().is_empty(), "nothing changed");

    // Space comes back: the store opens its file again, and the mount goes through.
    disk.full.store(false, Ordering::SeqCst);
    let mut mounted = None;
    for _ in 0..200 {
        match guarded(volumes.mount(&mount(&plugin, &v, "w"))).await {
            Ok(target) => {
                mounted = Some(target);
                break;
            }
            Err(VolumeError::Usage { .. }) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(
        mounted.is_some(),
        "the mount works again once the disk does"
    );
    assert_eq!(volumes.records().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_do_not_wait_for_a_stalled_commit_of_the_usage_records() {
    let plugin = mock_plugin().await;
    let file = plugin.dir.path().join("node.redb");
    let disk = DiskFaults::default();
    let db =
        RedbStore::with_opener(format!("redb {}", file.display()), disk.opener(&file)).expect("db");
    let volumes = manager(&plugin, &db, &file);
    let db_volume = create_and_attach(&plugin.plugins, &plugin.id, "db", &capability()).await;
    let logs = create_and_attach(&plugin.plugins, &plugin.id, "logs", &capability()).await;
    guarded(volumes.mount(&mount(&plugin, &db_volume, "w")))
        .await
        .expect("mounted");

    // The disk stalls as logs' mount records its user.
    disk.stalls.store(true, Ordering::SeqCst);
    let before = disk.syncs.load(Ordering::SeqCst);
    let mounting = tokio::spawn({
        let (volumes, request) = (volumes.clone(), mount(&plugin, &logs, "w"));
        async move { volumes.mount(&request).await }
    });
    guarded(async {
        while disk.syncs.load(Ordering::SeqCst) == before {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    // The readers answer from what was last written, without waiting for the commit.
    let records = volumes.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].volume, "db");
    let w = csi_structs::WorkloadId::new("w").expect("id");
    assert!(volumes.published(&db_volume.0, &w).is_some());
    assert!(volumes.published(&logs.0, &w).is_none());
    assert!(
        plugin
            .mock
            .calls()
            .all()
            .iter()
            .all(|c| c.rpc != Rpc::NodeStageVolume
                || c.volume_id.as_deref() != Some(logs.1.as_str())),
        "logs was staged before its record was durable"
    );

    // The disk answers: the mount goes on and its record is there.
    disk.stalls.store(false, Ordering::SeqCst);
    guarded(mounting)
        .await
        .expect("the mount task")
        .expect("mounted");
    assert_eq!(volumes.records().len(), 2);
}
