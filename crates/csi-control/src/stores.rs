//! The volume catalog and the claim store of a control plane, opened from one setting.
//!
//! A control plane keeps two things durable: its [`VolumeCatalog`] and csi-claims'
//! [`ClaimStore`]. They live together, either on one node's disk or shared by a cluster in
//! etcd, and what the release pipeline may do follows from which: [`Stores::open`] opens both
//! from a [`StoreConfig`] and says what follows, so the caller never branches on the backend.
//!
//! | [`StoreConfig`] | catalog | claims | the release driver performs |
//! |---|---|---|---|
//! | `Embedded` | `<dir>/volumes.json` ([`FileCatalog`]) | `<dir>/claims.redb` ([`RedbStore`]), claims forgettable | every step |
//! | `Etcd` (feature `etcd`) | `EtcdCatalog` | csi-claims' `EtcdStore` | this node's node steps; controller steps once it holds the duty |
//!
//! A build without the `etcd` feature still accepts `StoreConfig::Etcd` and refuses it at
//! [`Stores::open`] with [`StoresError::NoEtcd`], so a configuration parses the same in every
//! build.
//!
//! ```
//! use csi_control::stores::{StoreConfig, Stores};
//! use csi_structs::NodeId;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let stores = Stores::open(&StoreConfig::Embedded, dir.path(), &NodeId::new("node-1")?).await?;
//! assert!(stores.catalog.list().is_empty());
//! assert!(!stores.shared, "the claims are this node's alone");
//! assert!(stores.forgetting.is_some(), "and can be forgotten through the store");
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_claims::StoreError;
use csi_claims::machine::Duties;
use csi_claims::store::{ClaimStore, Forgetting, RedbStore};
use csi_node::state::StateFileError;
use csi_structs::NodeId;

use crate::catalog::{FileCatalog, VolumeCatalog};

/// The embedded claim store's file in the data directory.
pub const CLAIMS_FILE: &str = "claims.redb";

/// Where the catalog and the claims live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreConfig {
    /// One node's data directory: `volumes.json` and [`CLAIMS_FILE`].
    Embedded,
    /// A cluster sharing one etcd (boxed: the settings are large and made once).
    Etcd(Box<EtcdConfig>),
}

/// How to reach a cluster's etcd. The files are read by [`Stores::open`], never before, and
/// their contents are never shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs: `http://HOST:PORT`, or `https://` with a CA file.
    pub endpoints: Vec<String>,
    /// The key prefix of the cluster (`/name[/name...]`).
    pub prefix: String,
    /// The CA certificate (PEM) that signed etcd's server certificates; TLS when set.
    pub ca_file: Option<PathBuf>,
    /// The client certificate and its private key (PEM), sent over TLS only.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The etcd user and the file holding its password.
    pub user: Option<(String, PathBuf)>,
}

impl EtcdConfig {
    /// The store as an operator writes it: `etcd://HOST:PORT,...`, and ` (TLS)` when a CA
    /// file is set.
    ///
    /// ```
    /// use csi_control::stores::EtcdConfig;
    ///
    /// let config = EtcdConfig {
    ///     endpoints: vec!["http://10.0.0.1:2379".into(), "http://etcd-b:2379".into()],
    ///     prefix: "/orchestrator".into(),
    ///     ca_file: None,
    ///     identity: None,
    ///     user: None,
    /// };
    /// assert_eq!(config.display(), "etcd://10.0.0.1:2379,etcd-b:2379");
    /// ```
    pub fn display(&self) -> String {
        let hosts: Vec<&str> = self
            .endpoints
            .iter()
            .map(|e| {
                e.trim_start_matches("https://")
                    .trim_start_matches("http://")
            })
            .collect();
        let tls = if self.ca_file.is_some() { " (TLS)" } else { "" };
        format!("etcd://{}{tls}", hosts.join(","))
    }
}

/// Why the stores could not be opened. None shows a file's content.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoresError {
    /// The embedded catalog (`volumes.json`) could not be read; the error names the file.
    #[error(transparent)]
    Catalog(#[from] StateFileError),
    /// The claim store could not be opened or read (etcd: reached).
    #[error("claim store: {0}")]
    Claims(#[from] StoreError),
    /// A file of [`EtcdConfig`] could not be used.
    #[error("{setting} {path}: {reason}")]
    File {
        /// The [`EtcdConfig`] setting: `ca_file`, `cert_file`, `key_file` or
        /// `password_file`.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The configuration names etcd, and this build has no etcd support.
    #[error("{store}: this build has no etcd support (cargo feature `etcd`)")]
    NoEtcd {
        /// The store, as [`EtcdConfig::display`] writes it.
        store: String,
    },
    /// Opening on Tokio's blocking pool did not finish (the runtime is shutting down).
    #[error("opening the stores did not finish: {0}")]
    Interrupted(String),
}

/// The catalog and the claim store, open, and what follows from where they live. Made by
/// [`Stores::open`] only (`#[non_exhaustive]`: more may follow).
#[non_exhaustive]
pub struct Stores {
    /// The volume catalog.
    pub catalog: Arc<dyn VolumeCatalog>,
    /// The claim store, for csi-claims' `ClaimsDriver`.
    pub claims: Arc<dyn ClaimStore>,
    /// The same store, through which claims can be forgotten (a forced deregistration): only
    /// a store this node alone writes; `None` when the claims are shared.
    pub forgetting: Option<Arc<Forgetting<dyn ClaimStore>>>,
    /// The release steps this node's driver performs (see the module's table).
    pub duties: Duties,
    /// Whether other control planes share the claims (etcd): then this node's driver does not
    /// perform every step, and a controller a step needs may be another node's.
    pub shared: bool,
    /// The embedded claim store and its file: a node's usage records may share its commits
    /// (csi-node's `UsageDb`). `None` with etcd: the node keeps a database of its own.
    pub database: Option<(RedbStore, PathBuf)>,
    /// Where the stores are, for a log line: `embedded <dir>/claims.redb` or `etcd://...
    /// prefix /...`.
    pub description: String,
    /// The etcd client, for the cluster's membership (`cluster::Membership`).
    #[cfg(feature = "etcd")]
    pub etcd: Option<csi_claims::store::EtcdStore>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("description", &self.description)
            .field("duties", &self.duties)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl Stores {
    /// Opens the catalog and the claim store: in `dir` (created by the caller), or in etcd
    /// (its files read now). `node` is this node: with etcd, its driver performs the node
    /// steps of its own claims, and controller steps only once elected.
    ///
    /// # Errors
    ///
    /// A [`StoresError`] naming the file, the setting or the store that failed.
    pub async fn open(
        config: &StoreConfig,
        dir: &Path,
        node: &NodeId,
    ) -> Result<Stores, StoresError> {
        match config {
            StoreConfig::Embedded => Self::embedded(dir).await,
            StoreConfig::Etcd(etcd) => Self::etcd(etcd, node).await,
        }
    }

    async fn embedded(dir: &Path) -> Result<Stores, StoresError> {
        let catalog: Arc<dyn VolumeCatalog> = Arc::new(FileCatalog::open(dir).await?);
        let path = dir.join(CLAIMS_FILE);
        let opened = path.clone();
        let db = tokio::task::spawn_blocking(move || RedbStore::open(opened))
            .await
            .map_err(|e| StoresError::Interrupted(e.to_string()))??;
        let own: Arc<dyn ClaimStore> = Arc::new(db.clone());
        let forgetting = Arc::new(Forgetting::new(own));
        Ok(Stores {
            catalog,
            claims: Arc::clone(&forgetting) as Arc<dyn ClaimStore>,
            forgetting: Some(forgetting),
            duties: Duties::ALL,
            shared: false,
            description: format!("embedded {}", path.display()),
            database: Some((db, path)),
            #[cfg(feature = "etcd")]
            etcd: None,
        })
    }

    #[cfg(feature = "etcd")]
    async fn etcd(config: &EtcdConfig, node: &NodeId) -> Result<Stores, StoresError> {
        let store = csi_claims::store::EtcdStore::connect(client_config(config)?).await?;
        let catalog = Arc::new(crate::catalog::EtcdCatalog::open(store.clone()).await?);
        Ok(Stores {
            catalog,
            claims: Arc::new(store.clone()),
            forgetting: None,
            duties: Duties::node(node.clone(), false),
            shared: true,
            description: format!("{} prefix {}", config.display(), config.prefix),
            database: None,
            etcd: Some(store),
        })
    }

    #[cfg(not(feature = "etcd"))]
    async fn etcd(config: &EtcdConfig, _node: &NodeId) -> Result<Stores, StoresError> {
        Err(StoresError::NoEtcd {
            store: config.display(),
        })
    }
}

/// The etcd client's configuration, with the files of `config` read.
#[cfg(feature = "etcd")]
fn client_config(config: &EtcdConfig) -> Result<csi_claims::store::EtcdStoreConfig, StoresError> {
    use csi_claims::store::{EtcdPassword, EtcdStoreConfig, EtcdTls};
    let mut client =
        EtcdStoreConfig::new(config.endpoints.clone()).with_prefix(config.prefix.clone());
    if let Some(ca) = &config.ca_file {
        let identity = match &config.identity {
            Some((cert, key)) => Some((read("cert_file", cert)?, read("key_file", key)?)),
            None => None,
        };
        client.tls = Some(EtcdTls {
            ca_pem: read("ca_file", ca)?,
            identity,
        });
    }
    if let Some((user, file)) = &config.user {
        client.user = Some((user.clone(), EtcdPassword::new(password(file)?)));
    }
    Ok(client)
}

fn file_error(setting: &'static str, path: &Path, reason: impl Into<String>) -> StoresError {
    StoresError::File {
        setting,
        path: path.to_owned(),
        reason: reason.into(),
    }
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, StoresError> {
    std::fs::read(path).map_err(|e| file_error(setting, path, format!("cannot read the file: {e}")))
}

/// The password in `file`: UTF-8, its line ending dropped, not empty. An error names the file,
/// never what is in it.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
fn password(file: &Path) -> Result<String, StoresError> {
    let text = String::from_utf8(read("password_file", file)?)
        .map_err(|_| file_error("password_file", file, "the password is not UTF-8"))?;
    let password = text.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err(file_error("password_file", file, "the file is empty"));
    }
    Ok(password.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeId {
        NodeId::new("node-1").expect("valid")
    }

    fn etcd_at(endpoint: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints: vec![endpoint.to_owned()],
            prefix: "/test".into(),
            ca_file: None,
            identity: None,
            user: None,
        }
    }

    #[tokio::test]
    async fn the_embedded_stores_are_one_node_s_and_survive_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stores = Stores::open(&StoreConfig::Embedded, dir.path(), &node())
            .await
            .expect("opened");
        assert!(!stores.shared);
        assert_eq!(stores.duties, Duties::ALL);
        let (_, file) = stores.database.as_ref().expect("embedded database");
        assert_eq!(file, &dir.path().join(CLAIMS_FILE));
        assert!(stores.description.starts_with("embedded "));
        assert!(stores.description.ends_with(CLAIMS_FILE));
        drop(stores);
        // The database was closed with the last handle, so it opens again.
        let again = Stores::open(&StoreConfig::Embedded, dir.path(), &node()).await;
        assert!(again.is_ok(), "{again:?}");
    }

    #[tokio::test]
    async fn a_damaged_catalog_is_refused_naming_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("volumes.json"), b"{ not json").expect("write");
        let e = Stores::open(&StoreConfig::Embedded, dir.path(), &node())
            .await
            .expect_err("damaged");
        assert!(matches!(e, StoresError::Catalog(_)), "{e:?}");
        assert!(e.to_string().contains("volumes.json"), "{e}");
    }

    #[test]
    fn the_display_drops_schemes_and_says_tls() {
        let mut config = etcd_at("https://a:2379");
        config.endpoints.push("https://b:2379".into());
        assert_eq!(config.display(), "etcd://a:2379,b:2379");
        config.ca_file = Some("/ca.pem".into());
        assert_eq!(config.display(), "etcd://a:2379,b:2379 (TLS)");
    }

    #[test]
    fn a_password_file_is_read_without_its_line_ending_and_never_shown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("password");
        std::fs::write(&file, b"s3cret-value\r\n").expect("write");
        assert_eq!(password(&file).expect("read"), "s3cret-value");

        std::fs::write(&file, b"\n").expect("write");
        let empty = password(&file).expect_err("empty").to_string();
        assert!(
            empty.contains("password_file") && empty.contains("empty"),
            "{empty}"
        );

        std::fs::write(&file, [0xff, 0xfe, b's', b'3']).expect("write");
        let bad = password(&file).expect_err("not UTF-8").to_string();
        assert!(bad.contains("not UTF-8"), "{bad}");
        assert!(!bad.contains("s3"), "{bad}");

        let missing = password(&dir.path().join("none")).expect_err("missing");
        let StoresError::File { setting, path, .. } = &missing else {
            panic!("{missing:?}");
        };
        assert_eq!(
            (*setting, path.file_name()),
            ("password_file", Some("none".as_ref()))
        );
    }

    #[cfg(not(feature = "etcd"))]
    #[tokio::test]
    async fn without_the_feature_etcd_is_refused_naming_the_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = StoreConfig::Etcd(Box::new(etcd_at("http://127.0.0.1:2379")));
        let e = Stores::open(&config, dir.path(), &node())
            .await
            .expect_err("no etcd support");
        assert!(matches!(e, StoresError::NoEtcd { .. }), "{e:?}");
        assert!(e.to_string().contains("etcd://127.0.0.1:2379"), "{e}");
    }

    #[cfg(feature = "etcd")]
    #[tokio::test]
    async fn an_unreadable_ca_file_is_refused_before_etcd_is_called() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = etcd_at("https://127.0.0.1:1");
        config.ca_file = Some(dir.path().join("missing-ca.pem"));
        let e = Stores::open(&StoreConfig::Etcd(Box::new(config)), dir.path(), &node())
            .await
            .expect_err("no CA file");
        assert!(
            matches!(
                e,
                StoresError::File {
                    setting: "ca_file",
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
