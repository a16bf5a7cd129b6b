//! The catalog of a cluster, in etcd beside the claims (cargo feature `etcd`).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use csi_claims::StoreError;
use csi_claims::store::etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use csi_claims::store::{ClaimStore, EtcdStore, Mirror};
use csi_structs::VolumeId;
use serde::{Deserialize, Serialize};

use super::{CatalogEntry, CatalogError, VolumeCatalog};

/// The format of the values written under `volumes/`.
const FORMAT: u32 = 1;
/// How often a delete or an update tries again when the volume (or its claims) change
/// between its read and its write.
const WRITE_ATTEMPTS: usize = 5;

/// The catalog of a cluster: one key per volume, `<prefix>/volumes/<volume>`, beside
/// csi-claims' `<prefix>/claims/<volume>` in the same [`EtcdStore`].
///
/// Reads answer from a [`Mirror`] of `<prefix>/volumes/` (one read, then a watch), so every
/// member sees every volume exactly once. Writes are transactions: an insert only where the
/// key does not exist, an update on the revision it read; a removal or a delete mark compares
/// the volume's key and its claims key in one transaction, so a claim another member makes
/// meanwhile either comes first (and the removal is refused, [`CatalogError::Claimed`]) or
/// finds the mark when it [`confirm`](VolumeCatalog::confirm)s the volume after its claim is
/// durable, and gives it up. A value that does not decode is skipped, logged once per
/// revision with its key.
#[derive(Debug)]
pub struct EtcdCatalog {
    store: EtcdStore,
    mirror: Mirror,
    /// Undecodable values already reported (name, revision), so each is logged once.
    reported: Mutex<BTreeMap<String, i64>>,
}

/// A value under `volumes/`: the entry's fields beside `format`.
#[derive(Serialize, Deserialize)]
struct StoredVolume {
    format: u32,
    #[serde(flatten)]
    entry: CatalogEntry,
}

impl EtcdCatalog {
    /// Mirrors the cluster's volumes (`<prefix>/volumes/` of `store`).
    ///
    /// # Errors
    ///
    /// When etcd cannot be read.
    pub async fn open(store: EtcdStore) -> Result<Self, StoreError> {
        let mirror = store.mirror("volumes").await?;
        Ok(Self {
            store,
            mirror,
            reported: Mutex::new(BTreeMap::new()),
        })
    }

    fn decode(&self, name: &str, value: &[u8], revision: i64) -> Option<CatalogEntry> {
        let problem = match serde_json::from_slice::<StoredVolume>(value) {
            Ok(v) if v.format != FORMAT => {
                format!("format {}; this agent reads {FORMAT}", v.format)
            }
            Ok(v) if v.entry.id.as_str() != name => {
                format!("the value is for volume {:?}", v.entry.id.as_str())
            }
            Ok(v) => return Some(v.entry),
            Err(e) => format!("not a volume record: {e}"),
        };
        let mut reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        if reported.insert(name.to_owned(), revision) != Some(revision) {
            tracing::error!(key = %self.mirror.key(name), %problem, "skipped a volume the agents cannot read");
        }
        None
    }

    /// A store error of `operation` that etcd itself did not report.
    fn failed(&self, operation: String, detail: String) -> CatalogError {
        StoreError::Etcd {
            endpoints: self.store.config().endpoints_text(),
            operation,
            detail,
        }
        .into()
    }

    /// The record of `entry`, within the store's value limit.
    fn encode(&self, entry: &CatalogEntry) -> Result<Vec<u8>, CatalogError> {
        let name = entry.id.as_str();
        let value = serde_json::to_vec(&StoredVolume {
            format: FORMAT,
            entry: entry.clone(),
        })
        .map_err(|e| self.failed(format!("encode volume {name}"), e.to_string()))?;
        let limit = self.store.config().max_value_bytes;
        if value.len() > limit {
            return Err(StoreError::TooLarge {
                volume: entry.id.clone(),
                size: value.len(),
                limit,
            }
            .into());
        }
        Ok(value)
    }

    /// Removes a volume and its claims record whatever that holds (an operator abandoning the
    /// volume): one transaction on the volume key's revision; every agent's driver learns from
    /// its watch that the claims are gone and drops them.
    async fn remove_forced(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        let name = id.as_str();
        let key = self.mirror.key(name);
        let claims_key = self.store.key(id);
        let operation = || format!("deregister volume {name} by force");
        for _ in 0..WRITE_ATTEMPTS {
            let Some(kv) = self.store.read_key(&key).await? else {
                return Ok(None);
            };
            let entry = self.decode(name, kv.value(), kv.mod_revision());
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([
                    TxnOp::delete(key.as_str(), None),
                    TxnOp::delete(claims_key.as_str(), None),
                ]);
            if self.store.txn(operation, txn).await?.succeeded() {
                self.confirm(id).await?;
                return Ok(entry);
            }
        }
        Err(self.failed(
            operation(),
            format!("the volume changed between reading and writing {WRITE_ATTEMPTS} times"),
        ))
    }

    /// Runs `ops` on a volume that exists and has no claims, in one transaction that compares
    /// both keys with what was read; tries again when either changed in between.
    async fn unclaimed(
        &self,
        id: &VolumeId,
        operation: &str,
        ops: impl Fn(&str, &str, &CatalogEntry) -> Vec<TxnOp> + Send + Sync,
    ) -> Result<Option<CatalogEntry>, CatalogError> {
        let name = id.as_str();
        let key = self.mirror.key(name);
        let claims_key = self.store.key(id);
        let operation = || operation.replace("{}", name);
        for _ in 0..WRITE_ATTEMPTS {
            let Some(kv) = self.store.read_key(&key).await? else {
                return Ok(None);
            };
            let Some(entry) = self.decode(name, kv.value(), kv.mod_revision()) else {
                return Err(
                    self.failed(operation(), format!("the value under {key} cannot be read"))
                );
            };
            let claims = self.store.load(id).await?;
            let claimed = claims.as_ref().map_or(0, |s| s.record.claims().len());
            if claimed > 0 {
                return Err(CatalogError::Claimed {
                    volume: id.clone(),
                    claims: claimed,
                });
            }
            let claims_revision = claims
                .as_ref()
                .map_or(0, |s| i64::try_from(s.version.get()).unwrap_or(i64::MAX));
            let writes = ops(&key, &claims_key, &entry);
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision()),
                    Compare::mod_revision(claims_key.as_str(), CompareOp::Equal, claims_revision),
                ])
                .and_then(writes.clone());
            let answer = self.store.txn(operation, txn).await?;
            if answer.succeeded() {
                // The mirror learns the outcome from its watch; read it now for this process.
                self.confirm(id).await?;
                return Ok(Some(entry));
            }
        }
        Err(self.failed(
            operation(),
            format!(
                "the volume or its claims changed between reading and writing {WRITE_ATTEMPTS} times"
            ),
        ))
    }
}

#[async_trait::async_trait]
impl VolumeCatalog for EtcdCatalog {
    fn get(&self, id: &VolumeId) -> Option<CatalogEntry> {
        let entry = self.mirror.get(id.as_str())?;
        self.decode(id.as_str(), &entry.value, entry.revision)
    }

    fn list(&self) -> Vec<CatalogEntry> {
        self.mirror
            .list()
            .into_iter()
            .filter_map(|(name, e)| self.decode(&name, &e.value, e.revision))
            .collect()
    }

    /// Adds a volume unless its id exists in the cluster (`false`).
    async fn insert(&self, entry: CatalogEntry) -> Result<bool, CatalogError> {
        let name = entry.id.as_str();
        let key = self.mirror.key(name);
        let value = self.encode(&entry)?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), value.clone(), None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let answer = self
            .store
            .txn(|| format!("register volume {name}"), txn)
            .await?;
        if answer.succeeded() {
            let revision = answer.header().map_or(0, |h| h.revision());
            self.mirror.note(name, Some((value, 0)), revision);
            return Ok(true);
        }
        for op in answer.op_responses() {
            if let TxnOpResponse::Get(get) = op
                && let Some(kv) = get.kvs().first()
            {
                let found = (kv.value().to_vec(), kv.lease());
                self.mirror.note(name, Some(found), kv.mod_revision());
            }
        }
        Ok(false)
    }

    /// Removes a volume (and its empty claims record), only if the cluster holds no claim of
    /// it.
    async fn remove(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        self.unclaimed(id, "delete volume {}", |key, claims_key, _| {
            vec![TxnOp::delete(key, None), TxnOp::delete(claims_key, None)]
        })
        .await
    }

    /// Changes a volume's record with `change`, in a transaction that compares the key with
    /// what was read (tried again, `change` run again, when another member changed it in
    /// between).
    async fn update(
        &self,
        id: &VolumeId,
        change: &(dyn for<'e> Fn(&'e mut CatalogEntry) + Send + Sync),
    ) -> Result<Option<CatalogEntry>, CatalogError> {
        let name = id.as_str();
        let key = self.mirror.key(name);
        let operation = || format!("update volume {name}");
        for _ in 0..WRITE_ATTEMPTS {
            let Some(kv) = self.store.read_key(&key).await? else {
                return Ok(None);
            };
            let Some(mut entry) = self.decode(name, kv.value(), kv.mod_revision()) else {
                return Err(
                    self.failed(operation(), format!("the value under {key} cannot be read"))
                );
            };
            change(&mut entry);
            entry.id = id.clone();
            let value = self.encode(&entry)?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(key.as_str(), value.clone(), None)]);
            let answer = self.store.txn(operation, txn).await?;
            if answer.succeeded() {
                let revision = answer.header().map_or(0, |h| h.revision());
                self.mirror.note(name, Some((value, 0)), revision);
                return Ok(Some(entry));
            }
        }
        Err(self.failed(
            operation(),
            format!("the volume changed between reading and writing {WRITE_ATTEMPTS} times"),
        ))
    }

    /// Removes the volume and its claims record in one transaction, whatever the claims.
    async fn forget(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        self.remove_forced(id).await
    }

    /// Marks a volume as being deleted, only if the cluster holds no claim of it (both keys
    /// compared in one transaction).
    async fn mark_deleting(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        self.unclaimed(id, "mark volume {} as being deleted", |key, _, entry| {
            let mut marked = entry.clone();
            marked.deleting = true;
            let value = serde_json::to_vec(&StoredVolume {
                format: FORMAT,
                entry: marked,
            })
            .unwrap_or_default();
            vec![TxnOp::put(key, value, None)]
        })
        .await
    }

    /// The volume as etcd holds it now (a linearizable read); the mirror learns it too.
    async fn confirm(&self, id: &VolumeId) -> Result<Option<CatalogEntry>, CatalogError> {
        let name = id.as_str();
        let (value, revision) = self.store.read_key_at(&self.mirror.key(name)).await?;
        match value {
            Some(kv) => {
                let found = (kv.value().to_vec(), kv.lease());
                self.mirror.note(name, Some(found), kv.mod_revision());
                Ok(self.decode(name, kv.value(), kv.mod_revision()))
            }
            None => {
                self.mirror.note(name, None, revision);
                Ok(None)
            }
        }
    }
}
