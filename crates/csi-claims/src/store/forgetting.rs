//! [`Forgetting`]: a store of one writer through which its owner can drop a volume's claims
//! out from under the driver, for an operator who abandons a volume whose releases cannot
//! finish (its node or its plugin gone for good).
//!
//! A driver reads its store once at start and then trusts its own copy; a record deleted
//! behind its back would be written again by its next checkpoint. `Forgetting` wraps a store
//! of one writer ([`MemoryStore`](super::MemoryStore), [`RedbStore`](super::RedbStore)) and
//! gives the driver a watch ([`ClaimStore::load_and_watch`]) on which it reports nothing but
//! the records [`forget`](Forgetting::forget) deletes, the way a shared store reports another
//! writer's delete. The driver then drops the volume's claims at once (a step in flight finishes
//! and its outcome is dropped), and its waiters hear that they are freed.
//!
//! Forgetting is not releasing: whatever the plugin still holds for those claims (a
//! publication, a staging, an attachment) stays there. The caller says so to whoever asked.
//!
//! ```no_run
//! use std::sync::Arc;
//! use csi_claims::driver::{ClaimsDriver, DriverConfig};
//! use csi_claims::store::{Forgetting, RedbStore};
//! # use csi_claims::driver::{ControllerDetacher, NodeDetacher};
//!
//! # async fn run(node: Arc<dyn NodeDetacher>, controller: Arc<dyn ControllerDetacher>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(Forgetting::new(Arc::new(RedbStore::open("/var/lib/agent/claims.redb")?)));
//! let (claims, driver) =
//!     ClaimsDriver::start(Arc::clone(&store), node, controller, DriverConfig::default()).await?;
//! // Later, an operator abandons volume "db" whose node is gone for good:
//! let dropped = store.forget(&csi_structs::VolumeId::new("db")?).await?;
//! println!("dropped {} claim(s)", dropped.map_or(0, |r| r.claims().len()));
//! # drop((claims, driver));
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex, PoisonError};

use csi_structs::VolumeId;

use super::{ChangeSender, Changes, ClaimStore, StoreError, Stored, Version};
use crate::model::VolumeRecord;

/// How often [`Forgetting::forget`] reads and deletes again when the driver wrote the record
/// in between.
const FORGET_ATTEMPTS: usize = 5;

/// A store of one writer whose owner can [`forget`](Self::forget) a volume's claims; see the
/// module docs.
pub struct Forgetting<S: ?Sized> {
    inner: Arc<S>,
    /// The driver's end of the watch, once it asked for it.
    sender: Mutex<Option<ChangeSender>>,
}

impl<S: ?Sized> std::fmt::Debug for Forgetting<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forgetting").finish_non_exhaustive()
    }
}

impl<S: ClaimStore + ?Sized> Forgetting<S> {
    /// Wraps `inner`, a store nobody else writes.
    pub fn new(inner: Arc<S>) -> Self {
        Self {
            inner,
            sender: Mutex::new(None),
        }
    }

    /// Deletes the record of `volume`, whatever its claims' states, and tells the driver
    /// reading this store, which drops them. Returns the record as it was (`None`: the volume
    /// had no claims).
    ///
    /// # Errors
    ///
    /// The store's error, or [`StoreError::Conflict`] when the driver wrote the record every
    /// time between this read and this delete (tried a few times).
    pub async fn forget(&self, volume: &VolumeId) -> Result<Option<VolumeRecord>, StoreError> {
        let mut last = None;
        for _ in 0..FORGET_ATTEMPTS {
            let Some(stored) = self.inner.load(volume).await? else {
                return Ok(None);
            };
            match self
                .inner
                .compare_and_swap(volume, Some(stored.version), None)
                .await
            {
                Ok(_) => {
                    // Newer than anything the driver knows of the volume: it drops its copy.
                    let deleted = Version::after(Some(stored.version));
                    if let Some(sender) = self
                        .sender
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .as_ref()
                    {
                        sender.volume(volume.clone(), deleted, None);
                    }
                    return Ok(Some(stored.record));
                }
                Err(e) if e.is_conflict() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(StoreError::Conflict {
            volume: volume.clone(),
            expected: None,
            found: None,
        }))
    }
}

#[async_trait::async_trait]
impl<S: ClaimStore + ?Sized> ClaimStore for Forgetting<S> {
    async fn load_all(&self) -> Result<Vec<Stored>, StoreError> {
        self.inner.load_all().await
    }

    /// Every record, and a watch that reports the records [`forget`](Forgetting::forget)
    /// deletes (and nothing else: the driver is the only other writer).
    async fn load_and_watch(&self) -> Result<(Vec<Stored>, Option<Changes>), StoreError> {
        let records = self.inner.load_all().await?;
        let (sender, changes) = Changes::channel();
        *self.sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
        Ok((records, Some(changes)))
    }

    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        self.inner.load(volume).await
    }

    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError> {
        self.inner.compare_and_swap(volume, expected, new).await
    }
}
