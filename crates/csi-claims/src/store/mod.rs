//! Where claims are kept: a [`ClaimStore`] with compare-and-swap per volume.
//!
//! The unit of storage is a [`VolumeRecord`]: all not-yet-freed claims on one volume. Every
//! write names the [`Version`] it expects to replace, and a writer holding a stale version is
//! refused with [`StoreError::Conflict`] instead of being merged blindly (a second agent, or an
//! old leader, must not overwrite what it never read).
//!
//! Three stores ship here:
//! - [`MemoryStore`]: a `HashMap` behind a mutex, for tests and for agents that keep claims
//!   elsewhere.
//! - [`RedbStore`]: the durable default, on [redb](https://docs.rs/redb), an embedded,
//!   pure-Rust, ACID key-value store. Why redb: every commit is durable when `commit` returns
//!   (`Durability::Immediate`, its default) and crash-safe by design (copy-on-write B-trees with
//!   checksummed commit slots), it needs no C toolchain or server, it is actively maintained,
//!   and one write transaction gives the read-compare-write of a compare-and-swap for free.
//!   Its calls run on tokio's blocking pool, so a disk flush never stalls the runtime.
//! - `EtcdStore` (cargo feature `etcd`): the claims of a cluster of agents in etcd, one key per
//!   volume, compare-and-swap as a transaction on the key's `mod_revision`, and a watch so that
//!   every agent's driver learns of the volumes another agent changed, and of no others.
//!
//! [`Forgetting`] wraps a store of one writer so that its owner can drop a volume's claims out
//! from under the driver (an operator abandoning a volume whose releases cannot finish).
//!
//! The trait is async (a store across the network waits on it) and object-safe
//! (`Arc<dyn ClaimStore>` works), through `async-trait`.

mod changes;
mod codec;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod etcd_duty;
#[cfg(feature = "etcd")]
mod etcd_mirror;
mod forgetting;
mod memory;
mod redb_store;

use std::num::NonZeroU64;

use csi_structs::VolumeId;

pub use changes::{ChangeSender, Changes};
pub use codec::{DecodeError, Format, decode, encode};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdPassword, EtcdStore, EtcdStoreConfig, EtcdTls};
/// The etcd client crate, for transactions beside the claims ([`EtcdStore::txn`]).
#[cfg(feature = "etcd")]
pub use etcd_client;
#[cfg(feature = "etcd")]
pub use etcd_duty::{ControllerElection, MIN_DUTY_TTL};
#[cfg(feature = "etcd")]
pub use etcd_mirror::{Held, HeldKey, Mirror, MirrorEntry};
pub use forgetting::Forgetting;
pub use memory::MemoryStore;
pub use redb_store::{
    MAX_BATCH, REOPEN_FIRST_DELAY, REOPEN_MAX_DELAY, RedbRecords, RedbStore, STALL_AFTER,
};

use crate::duty::Fence;
use crate::model::VolumeRecord;

/// The version of a stored record: a number that grows with every write of the volume, so a
/// writer can say which record it read. "No record" is `None`, never a zero version.
///
/// [`MemoryStore`] and [`RedbStore`] count each volume's writes from [`Version::FIRST`];
/// `EtcdStore` uses the key's `mod_revision`, which grows across the whole store, so versions of
/// one store can also be ordered across volumes and deletions (what a watch needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(NonZeroU64);

impl Version {
    /// The version of a volume's first write.
    pub const FIRST: Version = Version(NonZeroU64::MIN);

    /// The version as a number (at least 1).
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// The version from a stored number.
    ///
    /// # Errors
    ///
    /// `None` for 0, which no store writes.
    pub const fn from_u64(value: u64) -> Option<Version> {
        match NonZeroU64::new(value) {
            Some(v) => Some(Version(v)),
            None => None,
        }
    }

    /// The version after `current` (`None`: nothing stored yet).
    pub fn after(current: Option<Version>) -> Version {
        match current {
            None => Version::FIRST,
            Some(v) => Version(v.0.saturating_add(1)),
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A record as read from a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Its version, to pass back to [`ClaimStore::compare_and_swap`].
    pub version: Version,
    /// The record.
    pub record: VolumeRecord,
    /// Which format it was written in. [`Format::V1`] records are upgraded in memory; the next
    /// checkpoint writes them in the current format.
    pub format: Format,
}

/// Errors from a [`ClaimStore`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The stored version is not the one the writer expected: someone else wrote first.
    #[error(
        "stale write refused for volume {volume}: expected {expected}, found {found}",
        expected = show(*expected),
        found = show(*found)
    )]
    Conflict {
        /// The volume.
        volume: VolumeId,
        /// The version the writer read (`None`: it believed there was no record).
        expected: Option<Version>,
        /// The version actually stored (`None`: there is no record).
        found: Option<Version>,
    },
    /// A record was written under another volume's key.
    #[error("record for volume {record} written under the key of volume {key}")]
    WrongKey {
        /// The key written to.
        key: VolumeId,
        /// The volume the record is about.
        record: VolumeId,
    },
    /// A stored record could not be read.
    #[error("claim store {store}: stored claims of volume key {key:?} cannot be read")]
    Decode {
        /// Which store: `redb` and its file, or `etcd at` its endpoints.
        store: String,
        /// The raw key it is stored under.
        key: String,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// A record could not be encoded.
    #[error("claims of volume {volume} cannot be encoded")]
    Encode {
        /// The volume.
        volume: VolumeId,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The store call did not finish (its task panicked or was cancelled): whether the write
    /// happened is unknown, so the writer must reload before writing again.
    #[error("claim store call for volume {volume} did not finish; its outcome is unknown")]
    Interrupted {
        /// The volume.
        volume: VolumeId,
    },
    /// The store call did not answer within the driver's
    /// [`store_timeout`](crate::driver::DriverConfig::store_timeout) (a stalled disk, a store
    /// that never answers): whether a write happened is unknown, so the writer reloads before
    /// writing again.
    #[error(
        "claim store call for volume {volume} did not answer within {after:?}; its outcome is unknown"
    )]
    TimedOut {
        /// The volume.
        volume: VolumeId,
        /// How long it was given.
        after: std::time::Duration,
    },
    /// Reading every record at startup did not finish (its task panicked or was cancelled).
    #[error("loading every claim record did not finish")]
    LoadInterrupted,
    /// The etcd cluster could not be reached or refused the request. Whether a write in
    /// flight happened is unknown, so the writer reloads before writing again.
    #[error("claim store (etcd at {endpoints}) failed to {operation}: {detail}")]
    Etcd {
        /// The endpoints configured, comma-separated.
        endpoints: String,
        /// What the store was doing, e.g. `compare and swap volume v1`.
        operation: String,
        /// The client's error.
        detail: String,
    },
    /// A record is larger than the store accepts in one request.
    #[error("claims of volume {volume} take {size} bytes encoded; the store's limit is {limit}")]
    TooLarge {
        /// The volume.
        volume: VolumeId,
        /// Encoded size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The redb database failed.
    #[error("claim store {store} failed to {operation}")]
    Redb {
        /// Which store: `redb` and its file.
        store: String,
        /// What the store was doing, e.g. `commit`.
        operation: &'static str,
        /// The database's error.
        #[source]
        source: Box<redb::Error>,
    },
    /// A controller-side write or confirmation was refused because this writer no longer holds
    /// the controller duty: the fence it named (the duty key at its creation revision) is not
    /// what the store holds. Nothing was written; another agent performs the duty now.
    #[error("claim store refused a controller-side step on volume {volume}: {detail}")]
    Fenced {
        /// The volume.
        volume: VolumeId,
        /// What the store holds instead, or why the step was refused before reaching it.
        detail: String,
    },
    /// A table of records ([`RedbStore::records`]) was asked for by a name the store cannot
    /// give one: empty, longer than 255 bytes, or the claims' own table.
    #[error(
        "claim store {store}: a table of records must be named by 1 to 255 bytes other than \
         the claims' own {claims:?}; {table:?} is not"
    )]
    TableName {
        /// Which store: `redb` and its file.
        store: String,
        /// The name asked for.
        table: String,
        /// The claims' own table, which is refused.
        claims: &'static str,
    },
    /// The store failed earlier and refuses calls until it works again (a [`RedbStore`]
    /// closed after an I/O error, until it is opened again): nothing was read or written.
    #[error("claim store {store} is unavailable: {reason}")]
    Unavailable {
        /// Which store: `redb` and its file.
        store: String,
        /// Why, and when it is tried again.
        reason: String,
    },
}

fn show(v: Option<Version>) -> String {
    v.map_or_else(|| "no record".to_owned(), |v| v.to_string())
}

impl StoreError {
    /// Whether this is a [`StoreError::Conflict`].
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }

    /// Whether this is a [`StoreError::Fenced`]: the writer no longer holds the controller
    /// duty.
    pub fn is_fenced(&self) -> bool {
        matches!(self, StoreError::Fenced { .. })
    }

    /// Whether writing the same record again can never succeed (it is too large for the
    /// store, cannot be encoded, or names another volume): the change must be dropped.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            StoreError::TooLarge { .. }
                | StoreError::Encode { .. }
                | StoreError::WrongKey { .. }
                | StoreError::TableName { .. }
        )
    }

    /// Whether the writer must reload the record before writing again (a stale write, or a
    /// write whose outcome is unknown because the store failed) instead of retrying the same
    /// write.
    pub fn needs_reload(&self) -> bool {
        self.is_conflict() || self.is_fenced() || self.is_unavailable()
    }

    /// Whether the store itself failed (its disk, its database, the network to it, a call
    /// that never finished), as opposed to one record that cannot be stored or read
    /// ([`is_permanent`](Self::is_permanent), [`StoreError::Decode`]) or a stale write
    /// ([`StoreError::Conflict`]). While the store fails, every volume's claims and releases
    /// fail with it; when one call succeeds again, the others may be tried again at once.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Redb { .. }
                | StoreError::Unavailable { .. }
                | StoreError::Etcd { .. }
                | StoreError::Interrupted { .. }
                | StoreError::TimedOut { .. }
                | StoreError::LoadInterrupted
        )
    }
}

/// A change of the stored records, as a shared store's watch reports it (see
/// [`ClaimStore::load_and_watch`]). Changes of one volume come in the order the store made
/// them, the writer's own writes included; an older change of a volume may be skipped in
/// favour of a newer one (see [`Changes`]).
#[derive(Debug)]
pub enum Change {
    /// A volume's record as it is now (`record: None`: deleted), written at `version`.
    Volume {
        /// The volume.
        volume: VolumeId,
        /// The version of the change (for a deletion, the version of the delete).
        version: Version,
        /// The record, or `None` when it was deleted.
        record: Option<VolumeRecord>,
    },
    /// Every record read again: after the watch lost its place (the store's history was
    /// compacted past it), and periodically, as a check that the watch missed nothing.
    /// `records` is every record stored at `version`; a volume not in it has no record.
    Resync {
        /// The version of the read.
        version: Version,
        /// Every record.
        records: Vec<Stored>,
    },
    /// A value under the store's keys that cannot be decoded; it is skipped (the other
    /// volumes go on) and named here so that it can be reported.
    Undecodable(StoreError),
    /// The watch broke (the store is unreachable) and is being re-established from the last
    /// change seen; nothing is missed. Reported once per outage.
    Interrupted(StoreError),
    /// The watch is back after an [`Change::Interrupted`].
    Resumed,
}

/// Durable storage for volume records, with compare-and-swap per volume.
///
/// # Contract
///
/// - [`compare_and_swap`](Self::compare_and_swap) writes only if the stored version equals
///   `expected` (`None`: no record stored) and returns the new version; when it returns `Ok`
///   the write is durable (it survives a crash of the process).
/// - Versions of one volume only grow while its record exists. After a delete, a store may
///   start over at [`Version::FIRST`] (memory, redb: the expected `None` protects that case)
///   or keep growing (etcd's `mod_revision`).
/// - Implementations are internally synchronized; calls may come from several tasks.
/// - A store shared by several writers (agents) answers
///   [`load_and_watch`](Self::load_and_watch) with the changes after its read, so that each
///   writer's view follows the others'.
#[async_trait::async_trait]
pub trait ClaimStore: Send + Sync + 'static {
    /// Every stored record.
    ///
    /// # Errors
    ///
    /// A backend failure or a record that cannot be decoded.
    async fn load_all(&self) -> Result<Vec<Stored>, StoreError>;

    /// Every stored record, and for a store that other writers share, every change made after
    /// that read ([`Changes`]), without a gap. `None` (the default): this writer is the
    /// store's only one.
    ///
    /// # Errors
    ///
    /// As [`load_all`](Self::load_all).
    async fn load_and_watch(&self) -> Result<(Vec<Stored>, Option<Changes>), StoreError> {
        Ok((self.load_all().await?, None))
    }

    /// The record of one volume, if any.
    ///
    /// # Errors
    ///
    /// A backend failure or a record that cannot be decoded.
    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError>;

    /// Replaces the record of `volume` if its version is still `expected`; `new = None`
    /// deletes it. Returns the new version (`None` after a delete).
    ///
    /// # Errors
    ///
    /// [`StoreError::Conflict`] for a stale writer, [`StoreError::WrongKey`] when the record is
    /// about another volume, or a backend failure.
    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError>;

    /// [`compare_and_swap`](Self::compare_and_swap) that also requires `fence` to hold, in the
    /// same transaction: the write of a controller-side step, which only the holder of the
    /// controller duty may make (see [`crate::duty`]).
    ///
    /// The default ignores the fence: a store of one writer has nobody to fence off. A store
    /// that several agents share must compare it.
    ///
    /// # Errors
    ///
    /// As [`compare_and_swap`](Self::compare_and_swap), and [`StoreError::Fenced`] when the
    /// fence does not hold.
    async fn compare_and_swap_fenced(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
        fence: &Fence,
    ) -> Result<Option<Version>, StoreError> {
        let _ = fence;
        self.compare_and_swap(volume, expected, new).await
    }

    /// Confirms, in one atomic read, that `volume`'s record is still at `expected` and that
    /// `fence` holds: what the driver asks before a controller call, so that the call is
    /// decided on the record the store holds, by the agent that holds the duty.
    ///
    /// The default reads the record and compares its version (a store of one writer has
    /// nobody to fence off). A store that several agents share must compare the fence in the
    /// same read.
    ///
    /// # Errors
    ///
    /// [`StoreError::Conflict`] when the record changed, [`StoreError::Fenced`] when the fence
    /// does not hold, or a backend failure.
    async fn confirm_fenced(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let _ = fence;
        let found = self.load(volume).await?.map(|s| s.version);
        if found == expected {
            Ok(())
        } else {
            Err(StoreError::Conflict {
                volume: volume.clone(),
                expected,
                found,
            })
        }
    }
}

#[async_trait::async_trait]
impl<S: ClaimStore + ?Sized> ClaimStore for std::sync::Arc<S> {
    async fn load_all(&self) -> Result<Vec<Stored>, StoreError> {
        (**self).load_all().await
    }

    async fn load_and_watch(&self) -> Result<(Vec<Stored>, Option<Changes>), StoreError> {
        (**self).load_and_watch().await
    }

    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        (**self).load(volume).await
    }

    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError> {
        (**self).compare_and_swap(volume, expected, new).await
    }

    async fn compare_and_swap_fenced(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
        fence: &Fence,
    ) -> Result<Option<Version>, StoreError> {
        (**self)
            .compare_and_swap_fenced(volume, expected, new, fence)
            .await
    }

    async fn confirm_fenced(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        (**self).confirm_fenced(volume, expected, fence).await
    }
}

/// The stored bytes of `new` for `volume` (`None`: a delete), after [`check_key`].
pub(crate) fn encode_for(
    volume: &VolumeId,
    new: Option<&VolumeRecord>,
) -> Result<Option<Vec<u8>>, StoreError> {
    check_key(volume, new)?;
    new.map(|record| {
        encode(record).map_err(|source| StoreError::Encode {
            volume: volume.clone(),
            source,
        })
    })
    .transpose()
}

pub(crate) fn check_key(volume: &VolumeId, new: Option<&VolumeRecord>) -> Result<(), StoreError> {
    match new {
        Some(record) if &record.info.id != volume => Err(StoreError::WrongKey {
            key: volume.clone(),
            record: record.info.id.clone(),
        }),
        _ => Ok(()),
    }
}
