//! The [`ClaimStore`] of a cluster of agents, in etcd.
//!
//! # Layout
//!
//! Every key starts with the configured prefix (default `/csi-agent`):
//!
//! | key | value |
//! |---|---|
//! | `<prefix>/claims/<volume>` | the volume's [`VolumeRecord`], encoded as in every store ([`encode`]) |
//!
//! One key per volume keeps a claim decision one compare-and-swap: the accounting of a volume
//! reads every claim of it from one value, and a write names the `mod_revision` it read, so two
//! agents that decided on the same record cannot both write (etcd's transaction compares the
//! revision and writes atomically). The price is the value's size: etcd refuses a request
//! larger than `--max-request-bytes` (1.5 MiB by default), and a claim takes about 160 bytes
//! encoded, so under the default [`EtcdStoreConfig::max_value_bytes`] one volume holds about
//! 6,000 claims (the tests write 2,000 readers of one volume). A write over
//! [`EtcdStoreConfig::max_value_bytes`] is refused before it is sent
//! ([`StoreError::TooLarge`], naming the volume, the size and the limit).
//!
//! # Versions and the watch
//!
//! A record's [`Version`] is its key's `mod_revision`, which grows across the whole store.
//! [`ClaimStore::load_and_watch`] reads every record at one revision (in pages, so that no
//! answer outgrows a gRPC message) and watches the prefix from the next one, so no change is
//! missed between the two. The watch reports each change as a [`Change`] (O(changed
//! volumes), never a rescan); a broken watch is re-established from the last revision it
//! reported; a watch whose start was compacted away reads everything again
//! ([`Change::Resync`]). A value that does not decode is reported with its key
//! ([`Change::Undecodable`]) and skipped; the other volumes go on.
//!
//! Three things keep the watch from losing its way:
//! - it never waits for its reader: [`Changes`] keeps at most the newest change of each
//!   volume, so etcd never sees a slow watcher;
//! - it asks etcd to split a large batch of changes (a watch catching up after an outage)
//!   into several answers, and takes answers up to twice [`EtcdStoreConfig::max_value_bytes`]:
//!   a batch over gRPC's 4 MiB default would otherwise fail to decode every time the watch is
//!   made again, and the agent would see no other agent's change from then on;
//! - every [`EtcdStoreConfig::resync_interval`] it reads every record again, which bounds how
//!   long a change that etcd itself lost stays unseen (and logs the volumes it finds so).
//!
//! Operators must let etcd compact its history (`--auto-compaction-mode=periodic
//! --auto-compaction-retention=1h`, say): every write keeps a revision until then.
//!
//! # Deadlines
//!
//! Every request carries [`EtcdStoreConfig::request_timeout`]; an unreachable cluster answers
//! [`StoreError::Etcd`] naming the endpoints and the operation, and the release machine retries
//! with its backoff.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Change, ChangeSender, Changes, ClaimStore, StoreError, Stored, Version, codec, encode_for,
};
use crate::duty::Fence;
use crate::model::VolumeRecord;
use csi_structs::VolumeId;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse,
    WatchOptions, WatchResponse,
};

/// How the watch backs off while the cluster is unreachable.
const WATCH_RETRY_MIN: Duration = Duration::from_millis(100);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);

/// How to reach etcd and where to keep claims.
#[derive(Clone)]
pub struct EtcdStoreConfig {
    /// Client URLs (`http://host:port` or `https://host:port`; a bare `host:port` is
    /// `http://`). At least one.
    pub endpoints: Vec<String>,
    /// Every key starts with it; agents of one cluster share it. Default `/csi-agent`.
    pub prefix: String,
    /// The deadline of each request. Default 5 s.
    pub request_timeout: Duration,
    /// The largest encoded record written. Default 1,000,000 bytes (etcd's default request
    /// limit is 1.5 MiB, with room left for the key and the transaction).
    pub max_value_bytes: usize,
    /// A user and password for etcd's authentication, if it is enabled.
    pub user: Option<(String, EtcdPassword)>,
    /// TLS for `https://` endpoints: a CA certificate (PEM) and, for client certificates, a
    /// certificate and key (PEM).
    pub tls: Option<EtcdTls>,
    /// How often the watch of [`ClaimStore::load_and_watch`] reads every record again
    /// ([`Change::Resync`]), as a check that it missed no change; `None`: never (only after a
    /// compaction). Default 2 minutes. etcd releases before 3.4.31 and 3.5.13 (Debian ships
    /// 3.4.23) can lose watch events when a slow watcher meets a compaction; this bounds how
    /// long a lost change stays unseen. Each check costs one read of every claim record.
    pub resync_interval: Option<Duration>,
}

impl EtcdStoreConfig {
    /// The defaults with `endpoints`.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: "/csi-agent".to_owned(),
            request_timeout: Duration::from_secs(5),
            max_value_bytes: 1_000_000,
            user: None,
            tls: None,
            resync_interval: Some(Duration::from_secs(120)),
        }
    }

    /// The same with another key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The endpoints as one line, for errors and logs.
    pub fn endpoints_text(&self) -> String {
        self.endpoints.join(",")
    }
}

impl fmt::Debug for EtcdStoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStoreConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("request_timeout", &self.request_timeout)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("tls", &self.tls.is_some())
            .field("resync_interval", &self.resync_interval)
            .finish()
    }
}

/// An etcd password: its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdPassword(String);

impl EtcdPassword {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Self(password.into())
    }

    /// The password itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for EtcdPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EtcdPassword(<redacted>)")
    }
}

/// TLS material for etcd, in PEM.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA that signed the servers' certificates.
    pub ca_pem: Vec<u8>,
    /// This client's certificate and private key, for clusters that ask for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("client_identity", &self.identity.is_some())
            .finish()
    }
}

/// Claims in etcd; see the [module docs](self). Cheap to clone (one connection, shared).
///
/// ```no_run
/// use csi_claims::store::{ClaimStore, EtcdStore, EtcdStoreConfig};
///
/// # async fn example() -> Result<(), csi_claims::StoreError> {
/// let config = EtcdStoreConfig::new(vec!["http://127.0.0.1:2379".into()]).with_prefix("/prod");
/// let store = EtcdStore::connect(config).await?;
/// let (records, changes) = store.load_and_watch().await?;
/// println!("{} volumes with claims; watching: {}", records.len(), changes.is_some());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: EtcdStoreConfig,
    endpoints: String,
    /// `<prefix>/claims/`.
    claims_prefix: String,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the cluster (lazily: an unreachable cluster fails the first request, not
    /// this call, unless authentication is configured, which asks for a token at once).
    ///
    /// # Errors
    ///
    /// [`StoreError::Etcd`] for an endpoint that is not a URL, TLS material that does not
    /// parse, or refused credentials.
    pub async fn connect(config: EtcdStoreConfig) -> Result<Self, StoreError> {
        let endpoints = config.endpoints_text();
        let fail = |operation: &str, e: &dyn fmt::Display| StoreError::Etcd {
            endpoints: endpoints.clone(),
            operation: operation.to_owned(),
            detail: e.to_string(),
        };
        if config.endpoints.is_empty() {
            return Err(fail("connect", &"no endpoint configured"));
        }
        let prefix = config.prefix.trim_end_matches('/');
        if prefix.is_empty() || !prefix.starts_with('/') {
            return Err(fail(
                "connect",
                &format!(
                    "key prefix {:?} must start with '/' and name something",
                    config.prefix
                ),
            ));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.request_timeout)
            .with_keep_alive(Duration::from_secs(10), config.request_timeout);
        if let Some((name, password)) = &config.user {
            options = options.with_user(name.clone(), password.expose().to_owned());
        }
        if let Some(tls) = &config.tls {
            let mut options_tls = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                options_tls = options_tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            options = options.with_tls(options_tls);
        }
        let client = tokio::time::timeout(
            config.request_timeout,
            Client::connect(&config.endpoints, Some(options)),
        )
        .await
        .map_err(|_| {
            fail(
                "connect",
                &format!("no answer within {:?}", config.request_timeout),
            )
        })?
        .map_err(|e| fail("connect", &e))?;
        let claims_prefix = format!("{prefix}/claims/");
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                endpoints,
                claims_prefix,
                config,
            }),
        })
    }

    /// The etcd client, to keep other cluster state (members, volumes) on the same
    /// connection.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdStoreConfig {
        &self.inner.config
    }

    /// The key of a volume's record.
    pub fn key(&self, volume: &VolumeId) -> String {
        format!("{}{}", self.inner.claims_prefix, volume.as_str())
    }

    pub(crate) fn error(
        &self,
        operation: impl Into<String>,
        detail: impl fmt::Display,
    ) -> StoreError {
        StoreError::Etcd {
            endpoints: self.inner.endpoints.clone(),
            operation: operation.into(),
            detail: detail.to_string(),
        }
    }

    /// Runs one request under the configured deadline. A request that no member took (a
    /// member that refuses connections, while the client spreads requests over all of them)
    /// is sent again, once per endpoint; so is a read that failed as unavailable.
    pub(crate) async fn bounded<T, F, Fut>(
        &self,
        operation: impl Fn() -> String,
        idempotent: bool,
        mut call: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let limit = self.inner.config.request_timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let mut last = None;
        for _ in 0..=self.inner.config.endpoints.len() {
            match tokio::time::timeout_at(deadline, call()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if again(&e, idempotent) => last = Some(e),
                Ok(Err(e)) => return Err(self.error(operation(), e)),
                Err(_) => {
                    return Err(self.error(operation(), format!("no answer within {limit:?}")));
                }
            }
        }
        let detail = last.map_or_else(|| "no attempt".to_owned(), |e| e.to_string());
        Err(self.error(operation(), detail))
    }

    /// Decodes one key-value pair under the claims prefix.
    fn decode(&self, kv: &KeyValue) -> Result<Stored, StoreError> {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let decode_err = |source| StoreError::Decode {
            store: format!("etcd at {}", self.inner.endpoints),
            key: key.clone(),
            source,
        };
        let volume = self.volume_of(kv.key()).ok_or_else(|| {
            decode_err(codec::DecodeError::UnsupportedFormat {
                found: "a key that is not a volume id".to_owned(),
            })
        })?;
        let version = u64::try_from(kv.mod_revision())
            .ok()
            .and_then(Version::from_u64)
            .ok_or_else(|| {
                decode_err(codec::DecodeError::UnsupportedFormat {
                    found: format!("mod_revision {}", kv.mod_revision()),
                })
            })?;
        let (record, format) = codec::decode(kv.value()).map_err(decode_err)?;
        if record.info.id != volume {
            return Err(StoreError::WrongKey {
                key: volume,
                record: record.info.id.clone(),
            });
        }
        Ok(Stored {
            version,
            record,
            format,
        })
    }

    fn volume_of(&self, key: &[u8]) -> Option<VolumeId> {
        let key = std::str::from_utf8(key).ok()?;
        let id = key.strip_prefix(&self.inner.claims_prefix)?;
        VolumeId::new(id).ok()
    }

    /// Every record at one revision; records that do not decode are returned apart.
    async fn read_all(&self) -> Result<(Vec<Stored>, Vec<StoreError>, i64), StoreError> {
        let prefix = self.inner.claims_prefix.clone();
        let (kvs, revision) = self.read_prefix(&prefix).await?;
        let (mut good, mut bad) = (Vec::new(), Vec::new());
        for kv in &kvs {
            match self.decode(kv) {
                Ok(stored) => good.push(stored),
                Err(e) => bad.push(e),
            }
        }
        Ok((good, bad, revision))
    }

    /// The largest gRPC message this store decodes: one value at the write limit, with room
    /// for its key and the envelope, and never less than gRPC's usual 4 MiB.
    fn decode_limit(&self) -> usize {
        (self.inner.config.max_value_bytes.saturating_mul(2) + (64 << 10)).max(4 << 20)
    }

    /// A watch client that takes messages up to [`decode_limit`](Self::decode_limit).
    pub(crate) fn watch_client(&self) -> etcd_client::WatchClient {
        self.inner
            .client
            .watch_client()
            .max_decoding_message_size(self.decode_limit())
    }

    /// Every key under `prefix` at one revision, read in pages (one answer holding every
    /// record could exceed what a gRPC message may carry). A page too large to decode is
    /// read again in smaller pages; a revision compacted away between pages starts the read
    /// over at a newer one.
    pub(crate) async fn read_prefix(
        &self,
        prefix: &str,
    ) -> Result<(Vec<KeyValue>, i64), StoreError> {
        let operation = || format!("read every key under {prefix}");
        let end = prefix_end(prefix.as_bytes());
        let mut attempts = 0;
        'read: loop {
            attempts += 1;
            let mut kvs: Vec<KeyValue> = Vec::new();
            let mut revision = 0;
            let mut page = READ_PAGE;
            let mut from = prefix.as_bytes().to_vec();
            loop {
                let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
                if revision > 0 {
                    options = options.with_revision(revision);
                }
                let limit = self.decode_limit();
                let answer = self
                    .bounded(operation, true, || {
                        let mut kv = self
                            .inner
                            .client
                            .kv_client()
                            .max_decoding_message_size(limit);
                        let (from, options) = (from.clone(), options.clone());
                        async move { kv.get(from, Some(options)).await }
                    })
                    .await;
                let mut response = match answer {
                    Ok(r) => r,
                    Err(StoreError::Etcd { detail, .. })
                        if page > 1 && detail.contains("message length too large") =>
                    {
                        page = (page / 2).max(1);
                        continue;
                    }
                    Err(StoreError::Etcd { detail, .. })
                        if revision > 0 && attempts < 5 && detail.contains("compacted") =>
                    {
                        continue 'read;
                    }
                    Err(e) => return Err(e),
                };
                if revision == 0 {
                    revision = response.header().map_or(0, |h| h.revision());
                }
                let more = response.more();
                let batch = response.take_kvs();
                let Some(last) = batch.last() else {
                    return Ok((kvs, revision));
                };
                from = last.key().to_vec();
                from.push(0);
                kvs.extend(batch);
                if !more {
                    return Ok((kvs, revision));
                }
            }
        }
    }
}

/// How many keys one page of [`EtcdStore::read_prefix`] asks for at first.
const READ_PAGE: i64 = 512;

/// The first key after every key that starts with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: "\0" means "to the end of the key space" in etcd.
    vec![0]
}

#[async_trait::async_trait]
impl ClaimStore for EtcdStore {
    /// Every record that decodes; one that does not is logged with its key and skipped, so
    /// that one damaged value does not stop the other volumes.
    async fn load_all(&self) -> Result<Vec<Stored>, StoreError> {
        let (good, bad, _) = self.read_all().await?;
        for e in bad {
            tracing::error!(error = %crate::error::error_chain(&e), "claim store: skipped a record");
        }
        Ok(good)
    }

    async fn load_and_watch(&self) -> Result<(Vec<Stored>, Option<Changes>), StoreError> {
        let (good, bad, revision) = self.read_all().await?;
        let (tx, rx) = Changes::channel();
        for e in bad {
            tx.note(Change::Undecodable(e));
        }
        let seen = good
            .iter()
            .map(|r| (r.record.info.id.clone(), r.version))
            .collect();
        tokio::spawn(watch(self.clone(), revision, seen, tx));
        Ok((good, Some(rx)))
    }

    async fn load(&self, volume: &VolumeId) -> Result<Option<Stored>, StoreError> {
        let key = self.key(volume);
        let response = self
            .bounded(
                || format!("read the claims of volume {volume}"),
                true,
                || {
                    let mut kv = self.inner.client.kv_client();
                    let key = key.as_str();
                    async move { kv.get(key, None).await }
                },
            )
            .await?;
        response.kvs().first().map(|kv| self.decode(kv)).transpose()
    }

    async fn compare_and_swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
    ) -> Result<Option<Version>, StoreError> {
        self.swap(volume, expected, new, None).await
    }

    async fn compare_and_swap_fenced(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
        fence: &Fence,
    ) -> Result<Option<Version>, StoreError> {
        self.swap(volume, expected, new, Some(fence)).await
    }

    async fn confirm_fenced(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let key = self.key(volume);
        // Read-only: etcd answers it as a linearizable read, without a write to its log. What
        // fences the call that follows is the comparison, which a write would not make any
        // stronger.
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.as_str(), CompareOp::Equal, revision_of(expected)),
                fence_compare(fence),
            ])
            .or_else([
                TxnOp::get(key.as_str(), None),
                TxnOp::get(fence.key.as_str(), None),
            ]);
        let response = self
            .run_txn(
                || format!("confirm the claims of volume {volume} and the controller duty"),
                true,
                txn,
            )
            .await?;
        if response.succeeded() {
            return Ok(());
        }
        Err(self.refusal(volume, expected, Some(fence), &response))
    }
}

impl EtcdStore {
    /// Compare-and-swap of a volume's record, comparing `fence` too when given.
    async fn swap(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        new: Option<&VolumeRecord>,
        fence: Option<&Fence>,
    ) -> Result<Option<Version>, StoreError> {
        let key = self.key(volume);
        let encoded = encode_for(volume, new)?;
        let limit = self.inner.config.max_value_bytes;
        if let Some(body) = &encoded
            && body.len() > limit
        {
            return Err(StoreError::TooLarge {
                volume: volume.clone(),
                size: body.len(),
                limit,
            });
        }
        let write = match encoded {
            Some(body) => TxnOp::put(key.as_str(), body, None),
            None => TxnOp::delete(key.as_str(), None),
        };
        let mut compares = vec![Compare::mod_revision(
            key.as_str(),
            CompareOp::Equal,
            revision_of(expected),
        )];
        let mut otherwise = vec![TxnOp::get(key.as_str(), None)];
        if let Some(fence) = fence {
            compares.push(fence_compare(fence));
            otherwise.push(TxnOp::get(fence.key.as_str(), None));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([write])
            .or_else(otherwise);
        let response = self
            .run_txn(
                || format!("compare and swap the claims of volume {volume}"),
                false,
                txn,
            )
            .await?;
        if response.succeeded() {
            if new.is_none() {
                return Ok(None);
            }
            let revision = response.header().map_or(0, |h| h.revision());
            let version = u64::try_from(revision).ok().and_then(Version::from_u64);
            return match version {
                Some(v) => Ok(Some(v)),
                None => Err(self.error(
                    format!("compare and swap the claims of volume {volume}"),
                    format!("answer carries revision {revision}"),
                )),
            };
        }
        Err(self.refusal(volume, expected, fence, &response))
    }

    /// One transaction under the store's deadline ([`bounded`](Self::bounded)).
    async fn run_txn(
        &self,
        operation: impl Fn() -> String,
        idempotent: bool,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, StoreError> {
        self.bounded(operation, idempotent, || {
            let mut kv = self.inner.client.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Why a transaction comparing the volume's key (and `fence`) failed: the fence first
    /// (a deposed holder is told so, whatever its copy), then the version.
    fn refusal(
        &self,
        volume: &VolumeId,
        expected: Option<Version>,
        fence: Option<&Fence>,
        response: &etcd_client::TxnResponse,
    ) -> StoreError {
        let mut gets = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get),
                _ => None,
            });
        let record = gets.next();
        let duty = gets.next();
        if let (Some(fence), Some(duty)) = (fence, duty) {
            let holder = duty.kvs().first();
            if holder.is_none_or(|kv| kv.create_revision() != fence.revision) {
                let now = holder.map_or_else(
                    || "the key is gone".to_owned(),
                    |kv| {
                        format!(
                            "it was created again at revision {} by {}",
                            kv.create_revision(),
                            csi_structs::untrusted::escape(&String::from_utf8_lossy(kv.value()))
                        )
                    },
                );
                return StoreError::Fenced {
                    volume: volume.clone(),
                    detail: format!(
                        "this agent no longer holds the controller duty ({fence}; now {now})"
                    ),
                };
            }
        }
        let found = record
            .and_then(|get| get.kvs().first().map(|kv| kv.mod_revision()))
            .and_then(|r| u64::try_from(r).ok())
            .and_then(Version::from_u64);
        StoreError::Conflict {
            volume: volume.clone(),
            expected,
            found,
        }
    }
}

/// The `mod_revision` a compare expects for `expected` (0: no key).
fn revision_of(expected: Option<Version>) -> i64 {
    expected.map_or(0, |v| i64::try_from(v.get()).unwrap_or(i64::MAX))
}

/// "The duty key still has the creation revision of this holder's put."
fn fence_compare(fence: &Fence) -> Compare {
    Compare::create_revision(fence.key.as_str(), CompareOp::Equal, fence.revision)
}

/// Feeds `tx` with every change after `revision` until the receiver is dropped; reads every
/// record again when the history was compacted past the watch, and every
/// [`EtcdStoreConfig::resync_interval`].
async fn watch(
    store: EtcdStore,
    mut revision: i64,
    seen: Vec<(VolumeId, Version)>,
    tx: ChangeSender,
) {
    let mut delay = WATCH_RETRY_MIN;
    let mut broken = false;
    let every = store.inner.config.resync_interval;
    let mut next_read = every.map(|d| tokio::time::Instant::now() + d);
    // The version of each volume's record as the watch last reported it: a re-read that finds
    // another one at a revision the watch had passed shows a lost event.
    let mut seen: HashMap<VolumeId, Version> = seen.into_iter().collect();
    loop {
        let outcome = watch_once(
            &store,
            &mut revision,
            &tx,
            &mut broken,
            next_read,
            &mut seen,
        )
        .await;
        if tx.is_closed() {
            return;
        }
        match outcome {
            WatchEnd::Receiver => return,
            WatchEnd::Compacted | WatchEnd::ReadAgain => match store.read_all().await {
                Ok((records, bad, at)) => {
                    if matches!(outcome, WatchEnd::Compacted) {
                        tracing::info!(
                            revision = at,
                            "claim store watch fell behind a \
                            compaction; read every record again"
                        );
                    } else {
                        report_missed(&records, revision, &seen);
                    }
                    seen = records
                        .iter()
                        .map(|r| (r.record.info.id.clone(), r.version))
                        .collect();
                    next_read = every.map(|d| tokio::time::Instant::now() + d);
                    revision = at;
                    for e in bad {
                        tx.note(Change::Undecodable(e));
                    }
                    let Some(version) = u64::try_from(at).ok().and_then(Version::from_u64) else {
                        continue;
                    };
                    tx.resync(version, records);
                    delay = WATCH_RETRY_MIN;
                }
                Err(e) => interrupted(&tx, &mut broken, &mut delay, e).await,
            },
            WatchEnd::Broken(e) => interrupted(&tx, &mut broken, &mut delay, e).await,
        }
        // A watch that delivered something, or was created, resets the backoff.
        if !broken {
            delay = WATCH_RETRY_MIN;
        }
    }
}

/// Logs the records a re-read found at a version the watch had passed (`watched`) without
/// reporting it: events the watch lost.
fn report_missed(records: &[Stored], watched: i64, seen: &HashMap<VolumeId, Version>) {
    let watched = u64::try_from(watched).unwrap_or(0);
    let missed: Vec<&VolumeId> = records
        .iter()
        .filter(|r| r.version.get() <= watched && seen.get(&r.record.info.id) != Some(&r.version))
        .map(|r| &r.record.info.id)
        .collect();
    if let Some(first) = missed.first() {
        tracing::warn!(missed = missed.len(), first = %first, watched,
            "claim store watch missed changes that the periodic re-read found; they are taken \
            from the re-read (etcd before 3.4.31 and 3.5.13 can lose watch events when a \
            compaction meets a slow watcher)");
    }
}

/// Reports the first failure of an outage, then waits out the backoff.
async fn interrupted(
    tx: &ChangeSender,
    broken: &mut bool,
    delay: &mut Duration,
    error: StoreError,
) {
    if !*broken {
        *broken = true;
        tx.note(Change::Interrupted(error));
    }
    tokio::select! {
        () = tokio::time::sleep(*delay) => {}
        () = tx.closed() => {}
    }
    *delay = (*delay * 2).min(WATCH_RETRY_MAX);
}

enum WatchEnd {
    /// The driver is gone.
    Receiver,
    /// The start revision was compacted away: read everything again.
    Compacted,
    /// Time for the periodic check: read everything again.
    ReadAgain,
    /// The stream failed or ended: watch again from the last revision.
    Broken(StoreError),
}

async fn watch_once(
    store: &EtcdStore,
    revision: &mut i64,
    tx: &ChangeSender,
    broken: &mut bool,
    read_at: Option<tokio::time::Instant>,
    seen: &mut HashMap<VolumeId, Version>,
) -> WatchEnd {
    // Fragmented: a batch of changes larger than one message comes as several answers.
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(*revision + 1)
        .with_progress_notify()
        .with_fragment();
    let prefix = store.inner.claims_prefix.as_str();
    let stream = store
        .bounded(
            || "watch the claim records".to_owned(),
            true,
            || {
                let mut client = store.watch_client();
                let options = options.clone();
                async move { client.watch(prefix, Some(options)).await }
            },
        )
        .await;
    let mut stream = match stream {
        Ok(s) => s,
        Err(e) => return WatchEnd::Broken(e),
    };
    let read_again = async {
        match read_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(read_again);
    loop {
        let message = tokio::select! {
            m = stream.message() => m,
            () = tx.closed() => return WatchEnd::Receiver,
            () = &mut read_again => return WatchEnd::ReadAgain,
        };
        let response = match message {
            Ok(Some(r)) => r,
            Ok(None) => {
                return WatchEnd::Broken(store.error("watch the claim records", "stream ended"));
            }
            Err(e) => return WatchEnd::Broken(store.error("watch the claim records", e)),
        };
        if response.compact_revision() > 0 {
            return WatchEnd::Compacted;
        }
        if response.canceled() {
            let reason = response.cancel_reason().to_owned();
            return WatchEnd::Broken(
                store.error("watch the claim records", format!("cancelled: {reason}")),
            );
        }
        if *broken {
            *broken = false;
            tx.note(Change::Resumed);
        }
        deliver(store, &response, revision, tx, seen);
    }
}

/// Queues the changes of one watch response, advancing `revision` past each.
fn deliver(
    store: &EtcdStore,
    response: &WatchResponse,
    revision: &mut i64,
    tx: &ChangeSender,
    seen: &mut HashMap<VolumeId, Version>,
) {
    for event in response.events() {
        let Some(kv) = event.kv() else { continue };
        *revision = (*revision).max(kv.mod_revision());
        match event.event_type() {
            etcd_client::EventType::Put => match store.decode(kv) {
                Ok(stored) => {
                    let volume = stored.record.info.id.clone();
                    seen.insert(volume.clone(), stored.version);
                    tx.volume(volume, stored.version, Some(stored.record));
                }
                Err(e) => {
                    tx.note(Change::Undecodable(e));
                }
            },
            etcd_client::EventType::Delete => {
                let volume = store.volume_of(kv.key());
                let version = u64::try_from(kv.mod_revision())
                    .ok()
                    .and_then(Version::from_u64);
                if let (Some(volume), Some(version)) = (volume, version) {
                    seen.remove(&volume);
                    tx.volume(volume, version, None);
                }
            }
        }
    }
    // A progress notification (no events, not the creation answer, which comes before the
    // replayed events) says every change up to its revision was sent.
    if response.events().is_empty()
        && !response.created()
        && let Some(h) = response.header()
    {
        *revision = (*revision).max(h.revision());
    }
}

/// Whether a failed request may be sent again: it never reached a member (the connection was
/// refused or could not be made), or it is a read and the member was unavailable.
fn again(error: &etcd_client::Error, idempotent: bool) -> bool {
    match error {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable
                && (idempotent || status.message().contains("connect"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_ends_at_the_next_key_after_all_keys_under_it() {
        assert_eq!(prefix_end(b"/p/claims/"), b"/p/claims0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
