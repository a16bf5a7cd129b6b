//! The durable things a sequence of claims and releases writes, as the agent writes them:
//! csi-claims' [`RedbStore`] (through its [`ClaimsDriver`]), csi-node's usage records (a
//! [`UsageDb`] in the same database file, one record per volume) and the reference agent's
//! volume book (`volumes.json`, csi-control's [`FileCatalog`]). [`run_ops`] applies the operations; [`read_back`] reads what a
//! restart finds.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use csi_claims::driver::{ClaimsDriver, ControllerDetacher, DriverConfig, NodeDetacher};
use csi_claims::store::ClaimStore;
use csi_claims::{
    ClaimMode, ClaimRequest, ControllerDetachRequest, ControllerRequirement, DetachError,
    NodeDetachRequest, RedbStore, VolumeInfo,
};
use csi_control::catalog::{CatalogEntry, FileCatalog, VolumeCatalog};
use csi_node::volumes::usage::{self, StepState, UserEntry, VolumeEntry};
use csi_node::volumes::{UsageDb, UsageStore};
use csi_structs::{
    AccessMode, AccessTypeKind, ExternalVolumeId, NodeId, PluginId, PluginNodeId, VolumeId,
    WorkloadId,
};

use crate::rng::Rng;

/// Volumes and workloads the operations pick from.
const VOLUMES: usize = 3;
const WORKLOADS: usize = 4;
const PLUGIN: &str = "crash.example.com";

/// One acknowledged operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Registers volume `v` in the book.
    Register(usize),
    /// Removes volume `v` (no claims) from the book.
    Unregister(usize),
    /// Workload `w` claims volume `v`: the claim is durable, then the node's usage records it.
    Claim(usize, usize),
    /// Workload `w` releases volume `v`: freed, then the node's usage forgets it.
    Release(usize, usize),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Register(v) => write!(f, "register v{v}"),
            Op::Unregister(v) => write!(f, "unregister v{v}"),
            Op::Claim(v, w) => write!(f, "w{w} claims v{v}"),
            Op::Release(v, w) => write!(f, "w{w} releases v{v}"),
        }
    }
}

/// What the stores hold after some operations: the book's volumes, and the claims (the same
/// pairs in the claim store and in the node's usage records).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Model {
    pub(crate) book: BTreeSet<usize>,
    pub(crate) claims: BTreeSet<(usize, usize)>,
}

impl Model {
    pub(crate) fn apply(&mut self, op: Op) {
        match op {
            Op::Register(v) => {
                self.book.insert(v);
            }
            Op::Unregister(v) => {
                self.book.remove(&v);
            }
            Op::Claim(v, w) => {
                self.claims.insert((v, w));
            }
            Op::Release(v, w) => {
                self.claims.remove(&(v, w));
            }
        }
    }

    /// The state after the first `n` of `ops`.
    pub(crate) fn after(ops: &[Op], n: usize) -> Model {
        let mut m = Model::default();
        for op in ops.iter().take(n) {
            m.apply(*op);
        }
        m
    }
}

/// A sequence of `n` operations, each valid where it stands (claims of registered volumes,
/// releases of held claims, removals of volumes without claims).
pub(crate) fn generate_ops(rng: &mut Rng, n: usize) -> Vec<Op> {
    let mut model = Model::default();
    let mut ops = Vec::with_capacity(n);
    while ops.len() < n {
        let v = rng.index(VOLUMES);
        let w = rng.index(WORKLOADS);
        let op = match rng.weighted(&[2, 5, 4, 1]) {
            0 if !model.book.contains(&v) => Op::Register(v),
            1 if model.book.contains(&v) && !model.claims.contains(&(v, w)) => Op::Claim(v, w),
            2 if !model.claims.is_empty() => {
                let held: Vec<_> = model.claims.iter().copied().collect();
                let (v, w) = held[rng.index(held.len())];
                Op::Release(v, w)
            }
            3 if model.book.contains(&v) && !model.claims.iter().any(|(cv, _)| *cv == v) => {
                Op::Unregister(v)
            }
            _ if !model.book.contains(&v) => Op::Register(v),
            _ => continue,
        };
        model.apply(op);
        ops.push(op);
    }
    ops
}

/// The files under a case's directory.
pub(crate) struct Paths {
    pub(crate) dir: PathBuf,
    pub(crate) claims: PathBuf,
    /// The file of the node's usage records: the claim store's (a table of its own).
    pub(crate) usage: PathBuf,
    pub(crate) book: PathBuf,
}

impl Paths {
    pub(crate) fn new(dir: &Path) -> Paths {
        Paths {
            dir: dir.to_owned(),
            claims: dir.join("claims.redb"),
            usage: dir.join("claims.redb"),
            book: dir.join("volumes.json"),
        }
    }
}

fn ids(v: usize, w: usize) -> Result<(VolumeId, WorkloadId), String> {
    Ok((
        VolumeId::new(format!("v{v}")).map_err(|e| e.to_string())?,
        WorkloadId::new(format!("w{w}")).map_err(|e| e.to_string())?,
    ))
}

fn info(v: usize) -> Result<VolumeInfo, String> {
    Ok(VolumeInfo {
        id: VolumeId::new(format!("v{v}")).map_err(|e| e.to_string())?,
        external_id: ExternalVolumeId::new(format!("ext-v{v}")).map_err(|e| e.to_string())?,
        plugin: PluginId::new(PLUGIN).map_err(|e| e.to_string())?,
        controller: ControllerRequirement::Required,
    })
}

fn entry(v: usize) -> Result<CatalogEntry, String> {
    let info = info(v)?;
    Ok(CatalogEntry {
        id: info.id,
        external_id: info.external_id,
        plugin: info.plugin,
        access_mode: AccessMode::MultiNodeMultiWriter,
        attachment: AccessTypeKind::Mount,
        controller_publish: true,
        created: false,
        capacity_bytes: None,
        context: BTreeMap::new(),
        deleting: false,
        // Every other volume has secrets: the book is then written owner-only, the same way.
        secrets: if v.is_multiple_of(2) {
            csi_structs::VolumeSecrets::parse_key_values("password=campaign-value")
                .map_err(|e| e.to_string())?
        } else {
            csi_structs::VolumeSecrets::default()
        },
        accessible_topology: Vec::new(),
        node_expansion: None,
        may_exist: None,
    })
}

/// Detach calls that succeed at once.
struct Detach;

#[async_trait]
impl NodeDetacher for Detach {
    async fn node_unpublish(&self, _: &NodeDetachRequest) -> Result<(), DetachError> {
        Ok(())
    }
    async fn node_unstage(&self, _: &NodeDetachRequest) -> Result<(), DetachError> {
        Ok(())
    }
}

#[async_trait]
impl ControllerDetacher for Detach {
    async fn controller_unpublish(&self, _: &ControllerDetachRequest) -> Result<(), DetachError> {
        Ok(())
    }
}

/// Opens the stores in `paths` as the agent does, then applies `ops` one after the other,
/// calling `acked(i)` once operation `i` is acknowledged (every store it changes written).
pub(crate) async fn run_ops(
    paths: &Paths,
    ops: &[Op],
    mut acked: impl FnMut(Option<usize>),
) -> Result<(), String> {
    let store = RedbStore::open(&paths.claims).map_err(|e| e.to_string())?;
    let usage_db = UsageDb::open(&store, &paths.usage, None).map_err(|e| e.to_string())?;
    let mut usage = usage_db.load().map_err(|e| e.to_string())?;
    let store = Arc::new(store);
    let config = DriverConfig::default();
    let (claims, driver) = ClaimsDriver::start(store, Arc::new(Detach), Arc::new(Detach), config)
        .await
        .map_err(|e| e.to_string())?;
    let book = FileCatalog::open(&paths.dir)
        .await
        .map_err(|e| e.to_string())?;
    let plugin = PluginId::new(PLUGIN).map_err(|e| e.to_string())?;
    acked(None);
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Register(v) => {
                book.insert(entry(v)?).await.map_err(|e| e.to_string())?;
            }
            Op::Unregister(v) => {
                let (id, _) = ids(v, 0)?;
                book.remove(&id).await.map_err(|e| e.to_string())?;
            }
            Op::Claim(v, w) => {
                let (volume, workload) = ids(v, w)?;
                let request = ClaimRequest {
                    volume: volume.clone(),
                    workload: workload.clone(),
                    node: NodeId::new("n1").map_err(|e| e.to_string())?,
                    plugin_node: PluginNodeId::new("i-1").map_err(|e| e.to_string())?,
                    mode: ClaimMode::Write,
                    access_mode: AccessMode::MultiNodeMultiWriter,
                    attachment: AccessTypeKind::Mount,
                };
                claims
                    .claim(&info(v)?, request)
                    .await
                    .map_err(|e| e.to_string())?;
                let key = usage::key(&plugin, &volume);
                let external_id =
                    ExternalVolumeId::new(format!("ext-v{v}")).map_err(|e| e.to_string())?;
                let record = usage.entry(key.clone()).or_insert_with(|| VolumeEntry {
                    plugin: plugin.clone(),
                    volume: volume.clone(),
                    external_id,
                    staging: None,
                    stage: None,
                    users: BTreeMap::new(),
                    legacy_stagings: Vec::new(),
                    publish_context: None,
                });
                record.users.insert(
                    workload.clone(),
                    UserEntry {
                        target: PathBuf::from(format!("/pods/{workload}/{volume}")),
                        publish: StepState::Done,
                    },
                );
                usage_db
                    .write(&key, Some(record))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Op::Release(v, w) => {
                let (volume, workload) = ids(v, w)?;
                claims
                    .release_and_wait(&volume, &workload)
                    .await
                    .map_err(|e| e.to_string())?;
                let key = usage::key(&plugin, &volume);
                if let Some(record) = usage.get_mut(&key) {
                    record.users.remove(workload.as_str());
                    let written = if record.users.is_empty() {
                        usage.remove(&key);
                        None
                    } else {
                        Some(&*record)
                    };
                    usage_db
                        .write(&key, written)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        acked(Some(i));
    }
    driver.shutdown().await;
    Ok(())
}

/// What one store held when opened again.
pub(crate) type Read<T> = Result<T, String>;

/// The claim store's claims (volume, workload), each pair once; `Err` with the store's
/// error, or when a record holds one workload twice.
pub(crate) async fn read_claims(path: &Path) -> Read<BTreeSet<(usize, usize)>> {
    let store = RedbStore::open(path).map_err(|e| e.to_string())?;
    let records = store.load_all().await.map_err(|e| e.to_string())?;
    let mut out = BTreeSet::new();
    for stored in records {
        let v = index_of(stored.record.info().id.as_str(), 'v')?;
        for claim in stored.record.claims() {
            let w = index_of(claim.workload().as_str(), 'w')?;
            if !out.insert((v, w)) {
                return Err(format!("DUPLICATE: v{v} holds two claims of w{w}"));
            }
        }
    }
    Ok(out)
}

/// The usage records' publications (volume, workload), from the database at `path`.
pub(crate) fn read_usage(path: &Path) -> Read<BTreeSet<(usize, usize)>> {
    let store = RedbStore::open(path).map_err(|e| e.to_string())?;
    let usage = UsageDb::open(&store, path, None)
        .and_then(|db| db.load())
        .map_err(|e| e.to_string())?;
    let mut out = BTreeSet::new();
    for entry in usage.values() {
        let v = index_of(entry.volume.as_str(), 'v')?;
        for user in entry.users.keys() {
            out.insert((v, index_of(user.as_str(), 'w')?));
        }
    }
    Ok(out)
}

/// The book's volumes.
pub(crate) fn read_book(dir: &Path) -> Read<BTreeSet<usize>> {
    let book = FileCatalog::open_blocking(dir).map_err(|e| e.to_string())?;
    book.list()
        .iter()
        .map(|e| index_of(e.id.as_str(), 'v'))
        .collect()
}

fn index_of(id: &str, prefix: char) -> Result<usize, String> {
    id.strip_prefix(prefix)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("UNKNOWN: an id the campaign never wrote: {id:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_operations_are_valid_where_they_stand() {
        for case in 0..200 {
            let ops = generate_ops(&mut Rng::for_case(5, case), 12);
            assert_eq!(ops.len(), 12);
            let mut m = Model::default();
            for op in &ops {
                match *op {
                    Op::Register(v) => assert!(!m.book.contains(&v), "{ops:?}"),
                    Op::Claim(v, w) => {
                        assert!(
                            m.book.contains(&v) && !m.claims.contains(&(v, w)),
                            "{ops:?}"
                        )
                    }
                    Op::Release(v, w) => assert!(m.claims.contains(&(v, w)), "{ops:?}"),
                    Op::Unregister(v) => {
                        assert!(m.book.contains(&v), "{ops:?}");
                        assert!(!m.claims.iter().any(|(cv, _)| *cv == v), "{ops:?}");
                    }
                }
                m.apply(*op);
            }
            assert_eq!(m, Model::after(&ops, ops.len()));
        }
    }
}
