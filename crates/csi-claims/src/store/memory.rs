//! An in-memory [`ClaimStore`].

use std::collections::HashMap;
use std::sync::Mutex;

use csi_structs::VolumeId;

use super::{ClaimStore, Format, StoreError, Stored, Version, check_key};
use crate::model::VolumeRecord;

/// A [`ClaimStore`] in a `HashMap` behind a mutex. Nothing survives the process; a clone of
/// an `Arc<MemoryStore>` does survive a restarted driver, which is what tests use it for.
///
/// The lock is a std `Mutex`: each call holds it for a map lookup and a clone, never across
/// an `.await`.
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<HashMap<VolumeId, (Version, VolumeRecord)>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<VolumeId, (Version, VolumeRecord)>> {
        // A poisoned lock only means another thread panicked mid-call; every call leaves the
        // map consistent (one insert or remove), so the data is still valid.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl ClaimStore for MemoryStore {
    async fn load_all(&self) -> Result<Vec<Stored>, StoreError> {
        Ok(self.load_all_now())
    }

    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        Ok(self.load_now(volume))
    }

    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError> {
        self.compare_and_swap_now(volume, expected, new)
    }
}

/// The same calls without `async`, for code that drives a machine by hand (tests).
impl MemoryStore {
    /// [`ClaimStore::load_all`], answered at once.
    pub fn load_all_now(&self) -> Vec<Stored> {
        self.lock()
            .values()
            .map(|(version, record)| Stored {
                version: *version,
                record: record.clone(),
                format: Format::V2,
            })
            .collect()
    }

    /// [`ClaimStore::load`], answered at once.
    pub fn load_now(&self, volume: &VolumeId) -> Option<Stored> {
        self.lock().get(volume).map(|(version, record)| Stored {
            version: *version,
            record: record.clone(),
            format: Format::V2,
        })
    }

    /// [`ClaimStore::compare_and_swap`], answered at once.
    ///
    /// # Errors
    ///
    /// As [`ClaimStore::compare_and_swap`].
    pub fn compare_and_swap_now(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError> {
        check_key(volume, new)?;
        let mut records = self.lock();
        let found = records.get(volume).map(|(v, _)| *v);
        if found != expected {
            return Err(StoreError::Conflict {
                volume: volume.clone(),
                expected,
                found,
            });
        }
        Ok(match new {
            Some(record) => {
                let version = Version::after(found);
                records.insert(volume.clone(), (version, record.clone()));
                Some(version)
            }
            None => {
                records.remove(volume);
                None
            }
        })
    }
}
