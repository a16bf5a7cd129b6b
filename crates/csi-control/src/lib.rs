//! The control plane's volume service for CSI orchestrators.
//!
//! csi-claims says who holds a volume and releases it, csi-client calls plugins and csi-node
//! is a node's side of them; what an orchestrator's control plane keeps above them is the
//! volumes themselves: which volumes exist, in which plugin, with which access mode,
//! context, topology and secrets, and which of them are being deleted. This crate is that
//! service, as a library, so an embedder does not write it again. An orchestrator sits above
//! it (the reference agent, `csi-agent`, is its first user) and nothing below it depends on
//! it.
//!
//! - [`plane`]: the front door, [`ControlPlane`]: a node and its control plane opened with one
//!   call over one state directory (csi-node's `Node`, the catalog, the routing of plugin
//!   calls and the volume service), with secrets from the catalog on every call that takes
//!   them, the node's records confirmed after a restart, and one close for everything.
//!
//! - [`catalog`]: the volume catalog, [`VolumeCatalog`]: every registered (or created)
//!   volume as a [`CatalogEntry`], each change written before it returns. [`FileCatalog`]
//!   keeps it on one node in `volumes.json` (owner-only: it holds the volumes' secrets);
//!   `EtcdCatalog` (cargo feature `etcd`) keeps it in etcd beside csi-claims' `EtcdStore`,
//!   shared by a cluster, its deletes checked against the volume's claims in the same
//!   transaction. Callers hold an `Arc<dyn VolumeCatalog>` and never branch on the backend.
//!
//! - [`service`]: the operations, [`VolumeService`]: register (validated against the
//!   plugin), create (an uncertain outcome undone before the answer), claim (controller
//!   publish through csi-rpc-shim, then stage and publish here), release, expand,
//!   snapshots, detach, deregister, delete, and the confirmation of a node's usage records
//!   after a restart. Requests are typed, failures are a [`ServiceError`] naming what is in
//!   the way, and what was done goes out as a [`ServiceEvent`].
//!
//! - [`stores`]: the catalog and csi-claims' claim store opened together from one
//!   [`StoreConfig`] (one node's directory, or etcd), with what follows for the release
//!   pipeline, so a caller never branches on where they live.
//!
//! - `cluster` (cargo feature `etcd`): the membership of a cluster of orchestrators sharing
//!   one etcd, `Membership`: each member's record under a lease (its node id checked against
//!   the live members'), the others' records, the nodes reported gone for good, and the
//!   election of the member that performs controller-side release steps.
//!
//! # Example
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Arc;
//!
//! use csi_control::{CatalogEntry, FileCatalog, VolumeCatalog};
//! use csi_structs::{AccessMode, AccessTypeKind, ExternalVolumeId, PluginId, VolumeId};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! // Reads `volumes.json` (if there is one) on Tokio's blocking pool.
//! let catalog: Arc<dyn VolumeCatalog> = Arc::new(FileCatalog::open(dir.path()).await?);
//!
//! let id = VolumeId::new("db-data")?;
//! let entry = CatalogEntry {
//!     id: id.clone(),
//!     external_id: ExternalVolumeId::new("vol-0123")?,
//!     plugin: PluginId::new("ebs")?,
//!     access_mode: AccessMode::SingleNodeWriter,
//!     attachment: AccessTypeKind::Mount,
//!     controller_publish: true,
//!     created: false,
//!     capacity_bytes: Some(10 << 30),
//!     context: BTreeMap::new(),
//!     deleting: false,
//!     secrets: Default::default(),
//!     accessible_topology: Vec::new(),
//!     node_expansion: None,
//!     may_exist: None,
//! };
//! assert!(catalog.insert(entry.clone()).await?); // written to volumes.json
//! assert!(!catalog.insert(entry.clone()).await?, "the id is taken");
//! assert_eq!(catalog.get(&id), Some(entry));
//!
//! let grown = catalog.update(&id, &|e| e.capacity_bytes = Some(20 << 30)).await?;
//! assert_eq!(grown.and_then(|e| e.capacity_bytes), Some(20 << 30));
//! # Ok(())
//! # }
//! ```

// The README is the crate's page on crates.io; its examples run as doctests with these docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod catalog;
#[cfg(feature = "etcd")]
pub mod cluster;
pub mod peers;
pub mod plane;
pub mod service;
pub mod stores;

#[cfg(feature = "etcd")]
pub use catalog::EtcdCatalog;
pub use catalog::{
    CatalogEntry, CatalogError, CatalogSecrets, FileCatalog, MayExist, VolumeCatalog,
};
#[cfg(feature = "etcd")]
pub use cluster::{JoinError, MemberRecord, Membership};
#[cfg(feature = "etcd")]
pub use plane::cluster::ClusterSettings;
pub use plane::{ControlPlane, ControlPlaneBuilder, PlaneError};
pub use service::{NoPeers, Peers, ServiceError, ServiceEvent, VolumeService};
pub use stores::{StoreConfig, Stores, StoresError};
