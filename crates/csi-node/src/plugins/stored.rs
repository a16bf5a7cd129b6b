//! The manager's optional state file: the newest registration of each plugin id, and the
//! next registration number, so that a restarted manager goes on with the registrations it
//! had and never hands out a number twice.
//!
//! Format 1: `{"version": 1, "next": 7, "plugins": {"<plugin>": {"registration": 6,
//! "endpoint": "unix:///...", "source": {"kind": "pushed"}}}}`.

use std::collections::BTreeMap;
use std::path::Path;

use csi_client::Endpoint;
use csi_structs::PluginId;
use serde::{Deserialize, Serialize};

use super::event::{RegistrationId, RegistrationSource};
use crate::state::{StateFileError, load_json, save_json};

const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    next: u64,
    plugins: BTreeMap<String, Stored>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    registration: u64,
    endpoint: String,
    source: RegistrationSource,
}

/// One registration as kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Kept {
    pub(super) plugin: PluginId,
    pub(super) registration: RegistrationId,
    pub(super) endpoint: Endpoint,
    pub(super) source: RegistrationSource,
}

/// Reads the file: the next number and the registrations (none when it does not exist).
pub(super) fn load(path: &Path) -> Result<(u64, Vec<Kept>), StateFileError> {
    let Some(file) = load_json::<File>(path)? else {
        return Ok((1, Vec::new()));
    };
    if file.version != FORMAT {
        return Err(StateFileError::Version {
            path: path.to_owned(),
            found: file.version,
            supported: "1",
        });
    }
    let record = |key: &str, reason: String| StateFileError::Record {
        path: path.to_owned(),
        key: key.to_owned(),
        reason,
    };
    let mut kept = Vec::with_capacity(file.plugins.len());
    for (key, stored) in file.plugins {
        let plugin =
            PluginId::new(key.clone()).map_err(|e| record(&key, format!("plugin id: {e}")))?;
        let endpoint = stored
            .endpoint
            .parse::<Endpoint>()
            .map_err(|e| record(&key, format!("endpoint: {e}")))?;
        if stored.registration >= file.next {
            return Err(record(
                &key,
                format!(
                    "registration {} is not below `next` ({})",
                    stored.registration, file.next
                ),
            ));
        }
        kept.push(Kept {
            plugin,
            registration: RegistrationId(stored.registration),
            endpoint,
            source: stored.source,
        });
    }
    Ok((file.next, kept))
}

/// Writes the file atomically.
pub(super) fn save<'a>(
    path: &Path,
    next: u64,
    kept: impl Iterator<Item = &'a Kept>,
) -> Result<(), StateFileError> {
    let plugins = kept
        .map(|k| {
            (
                k.plugin.to_string(),
                Stored {
                    registration: k.registration.0,
                    endpoint: k.endpoint.to_string(),
                    source: k.source.clone(),
                },
            )
        })
        .collect();
    save_json(
        path,
        &File {
            version: FORMAT,
            next,
            plugins,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_unusable_records() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("plugins.json");
        assert_eq!(load(&path).expect("absent is empty"), (1, Vec::new()));
        let kept = Kept {
            plugin: PluginId::new("mock").expect("id"),
            registration: RegistrationId(4),
            endpoint: "unix:///run/mock.sock".parse().expect("endpoint"),
            source: RegistrationSource::Directory {
                socket: "/run/mock.sock".into(),
                inode: 12,
            },
        };
        save(&path, 5, [&kept].into_iter()).expect("saved");
        assert_eq!(load(&path).expect("loads"), (5, vec![kept]));

        for (text, key) in [
            (
                r#"{"version": 1, "next": 2, "plugins": {"m": {"registration": 2, "endpoint": "unix:///a", "source": {"kind": "pushed"}}}}"#,
                "m",
            ),
            (
                r#"{"version": 1, "next": 3, "plugins": {"m": {"registration": 1, "endpoint": "unix://relative", "source": {"kind": "pushed"}}}}"#,
                "m",
            ),
        ] {
            std::fs::write(&path, text).expect("write");
            match load(&path) {
                Err(StateFileError::Record { key: k, .. }) => assert_eq!(k, key),
                other => panic!("expected a record error, got {other:?}"),
            }
        }
        std::fs::write(&path, r#"{"version": 2, "next": 1, "plugins": {}}"#).expect("write");
        assert!(matches!(
            load(&path),
            Err(StateFileError::Version { found: 2, .. })
        ));
    }
}
