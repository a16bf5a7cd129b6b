//! The rest of a cluster's state beside its claims: any key space under the store's prefix,
//! mirrored in memory and kept current by a watch ([`Mirror`]), keys held under a lease while
//! an agent lives ([`HeldKey`]), and transactions under the store's deadline and retry rules
//! ([`EtcdStore::txn`]).
//!
//! An agent keeps, say, its volume registry under `<prefix>/volumes/` and its membership under
//! `<prefix>/members/` on the same connection as its claims: the mirror answers reads from
//! memory (one read of the key space at the start, then O(changed) work per change), and every
//! write is a transaction whose conditions make concurrent agents agree.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use etcd_client::{EventType, KeyValue, PutOptions, Txn, TxnResponse, WatchOptions, WatchResponse};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::StoreError;
use super::etcd::EtcdStore;

/// How the mirror's watch backs off while the cluster is unreachable.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// One key of a [`Mirror`].
#[derive(Clone, PartialEq, Eq)]
pub struct MirrorEntry {
    /// The value as stored.
    pub value: Vec<u8>,
    /// The revision of its last change (etcd's `mod_revision`): what a transaction compares to
    /// change it only if nobody else did.
    pub revision: i64,
    /// The lease it is attached to (0: none).
    pub lease: i64,
}

impl fmt::Debug for MirrorEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values are the embedder's; they are not printed.
        f.debug_struct("MirrorEntry")
            .field("value_bytes", &self.value.len())
            .field("revision", &self.revision)
            .field("lease", &self.lease)
            .finish()
    }
}

#[derive(Default)]
struct State {
    /// By name (the key after the mirror's prefix).
    entries: BTreeMap<String, MirrorEntry>,
    /// Deleted names and the revision of their deletion, until the watch is past it: an echo
    /// of an older write must not bring them back.
    tombstones: BTreeMap<String, i64>,
    /// Every change up to this revision has been applied.
    watched: i64,
    /// Why the watch is interrupted, while it is.
    outage: Option<String>,
}

impl State {
    /// Applies one change unless something at least as new is known for the name.
    fn apply(&mut self, name: &str, value: Option<(Vec<u8>, i64)>, revision: i64) -> bool {
        let known = self
            .entries
            .get(name)
            .map(|e| e.revision)
            .or_else(|| self.tombstones.get(name).copied());
        if known.is_some_and(|k| k >= revision) {
            return false;
        }
        match value {
            Some((value, lease)) => {
                self.tombstones.remove(name);
                self.entries.insert(
                    name.to_owned(),
                    MirrorEntry {
                        value,
                        revision,
                        lease,
                    },
                );
            }
            None => {
                self.entries.remove(name);
                self.tombstones.insert(name.to_owned(), revision);
            }
        }
        true
    }

    fn watched_to(&mut self, revision: i64) {
        self.watched = self.watched.max(revision);
        let watched = self.watched;
        self.tombstones.retain(|_, r| *r > watched);
    }
}

struct Inner {
    store: EtcdStore,
    /// `<store prefix>/<name>/`.
    prefix: String,
    state: RwLock<State>,
    changed: watch::Sender<u64>,
    task: Mutex<Option<AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// A key space under the store's prefix, mirrored in memory; see the [module docs](self).
/// Cheap to clone; the watch stops when the last clone is dropped.
///
/// ```no_run
/// use csi_claims::store::{EtcdStore, EtcdStoreConfig};
///
/// # async fn example() -> Result<(), csi_claims::StoreError> {
/// let store = EtcdStore::connect(EtcdStoreConfig::new(vec!["127.0.0.1:2379".into()])).await?;
/// let members = store.mirror("members").await?;
/// for (name, entry) in members.list() {
///     println!("{name}: {} bytes at revision {}", entry.value.len(), entry.revision);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Mirror {
    inner: Arc<Inner>,
}

impl fmt::Debug for Mirror {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mirror")
            .field("prefix", &self.inner.prefix)
            .field("entries", &self.read().entries.len())
            .finish_non_exhaustive()
    }
}

impl Mirror {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.inner
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.inner
            .state
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The full etcd key of `name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.inner.prefix)
    }

    /// The key prefix this mirror watches (ends with `/`).
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// One name's entry, as far as this mirror knows.
    pub fn get(&self, name: &str) -> Option<MirrorEntry> {
        self.read().entries.get(name).cloned()
    }

    /// Every name and entry, by name.
    pub fn list(&self) -> Vec<(String, MirrorEntry)> {
        self.read()
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// How many names there are.
    pub fn len(&self) -> usize {
        self.read().entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.read().entries.is_empty()
    }

    /// Why the watch is interrupted (the cluster is unreachable), while it is: the mirror may
    /// be behind meanwhile.
    pub fn outage(&self) -> Option<String> {
        self.read().outage.clone()
    }

    /// Wakes on every change the mirror applies (the value counts them).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Applies a write this agent made and etcd confirmed at `revision` (`None`: a delete), so
    /// that reads see it at once rather than when the watch brings it. A change older than
    /// what the mirror holds for the name is ignored.
    pub fn note(&self, name: &str, value: Option<(Vec<u8>, i64)>, revision: i64) {
        let applied = self.write().apply(name, value, revision);
        if applied {
            self.inner.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn name_of<'k>(&self, key: &'k [u8]) -> Option<&'k str> {
        std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.inner.prefix)
    }

    /// Reads the whole key space; replaces the mirror's content with it, keeping only what
    /// this agent noted after that read.
    async fn load(&self) -> Result<i64, StoreError> {
        let (kvs, at) = self.inner.store.read_prefix(&self.inner.prefix).await?;
        {
            let mut state = self.write();
            state.entries.retain(|_, e| e.revision > at);
            state.tombstones.retain(|_, r| *r > at);
            for kv in &kvs {
                if let Some(name) = self.name_of(kv.key()) {
                    state.apply(name, Some(entry_of(kv)), kv.mod_revision());
                }
            }
            state.watched_to(at);
        }
        self.inner.changed.send_modify(|n| *n = n.wrapping_add(1));
        Ok(at)
    }

    fn deliver(&self, response: &WatchResponse) {
        let mut state = self.write();
        let mut top = 0;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            top = top.max(kv.mod_revision());
            let Some(name) = self.name_of(kv.key()) else {
                continue;
            };
            match event.event_type() {
                EventType::Put => state.apply(name, Some(entry_of(kv)), kv.mod_revision()),
                EventType::Delete => state.apply(name, None, kv.mod_revision()),
            };
        }
        if response.events().is_empty()
            && !response.created()
            && let Some(h) = response.header()
        {
            top = top.max(h.revision());
        }
        state.watched_to(top);
        drop(state);
        if !response.events().is_empty() {
            self.inner.changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn set_outage(&self, outage: Option<String>) {
        self.write().outage = outage;
    }
}

fn entry_of(kv: &KeyValue) -> (Vec<u8>, i64) {
    (kv.value().to_vec(), kv.lease())
}

/// Follows the key space from `revision` until the last [`Mirror`] clone is dropped.
async fn follow(mirror: Weak<Inner>, mut revision: i64) {
    let mut delay = RETRY_MIN;
    loop {
        let Some(inner) = mirror.upgrade() else {
            return;
        };
        let this = Mirror { inner };
        let mut streamed = false;
        let outcome = match follow_once(&this, &mut revision, &mut streamed).await {
            Ok(Compacted) => this.load().await.map(|at| revision = at),
            Err(e) => Err(e),
        };
        if streamed {
            delay = RETRY_MIN;
        }
        if let Err(e) = outcome {
            if this.outage().is_none() {
                tracing::warn!(prefix = %this.inner.prefix, error = %e, "cluster watch interrupted");
            }
            this.set_outage(Some(e.to_string()));
        }
        drop(this);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// The history the watch asked for was compacted away.
struct Compacted;

/// Watches until the stream fails or history is compacted; `streamed` says whether the watch
/// was established (so the next one starts its backoff over).
async fn follow_once(
    mirror: &Mirror,
    revision: &mut i64,
    streamed: &mut bool,
) -> Result<Compacted, StoreError> {
    let store = &mirror.inner.store;
    let prefix = mirror.inner.prefix.as_str();
    let operation = || format!("watch the keys under {prefix}");
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(*revision + 1)
        .with_progress_notify()
        .with_fragment();
    let mut stream = store
        .bounded(operation, true, || {
            let mut client = store.watch_client();
            let options = options.clone();
            async move { client.watch(prefix, Some(options)).await }
        })
        .await?;
    loop {
        let response = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(store.error(operation(), "stream ended")),
            Err(e) => return Err(store.error(operation(), e)),
        };
        if response.compact_revision() > 0 {
            return Ok(Compacted);
        }
        if response.canceled() {
            let reason = format!("cancelled: {}", response.cancel_reason());
            return Err(store.error(operation(), reason));
        }
        *streamed = true;
        if mirror.outage().is_some() {
            tracing::info!(prefix = %prefix, "cluster watch resumed");
            mirror.set_outage(None);
        }
        mirror.deliver(&response);
        *revision = (*revision).max(mirror.read().watched);
    }
}

impl EtcdStore {
    /// Revokes the lease held in `lease` (taking it out), under the request deadline: what a
    /// holder that stops on purpose does, so that its keys go now rather than at expiry.
    pub(crate) async fn revoke_taken_lease(&self, lease: &Mutex<Option<i64>>) {
        let taken = lease.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(id) = taken {
            let mut leases = self.client().lease_client();
            let limit = self.config().request_timeout;
            let _ = tokio::time::timeout(limit, leases.revoke(id)).await;
        }
    }

    /// Mirrors the keys under `<prefix>/<name>/` in memory and keeps them current with a
    /// watch; returns once the first read is done. `name` is one path segment (`volumes`,
    /// `members`); `claims` and `leader` are this store's own.
    ///
    /// # Errors
    ///
    /// [`StoreError::Etcd`] when the first read fails or `name` is not one segment.
    pub async fn mirror(&self, name: &str) -> Result<Mirror, StoreError> {
        if name.is_empty() || name.contains('/') || matches!(name, "claims" | "leader") {
            return Err(self.error(
                format!("mirror {name:?}"),
                "the name must be one path segment other than `claims` and `leader`",
            ));
        }
        let (changed, _) = watch::channel(0);
        let mirror = Mirror {
            inner: Arc::new(Inner {
                prefix: format!("{}/{name}/", self.config().prefix.trim_end_matches('/')),
                store: self.clone(),
                state: RwLock::new(State::default()),
                changed,
                task: Mutex::new(None),
            }),
        };
        let at = mirror.load().await?;
        let task = tokio::spawn(follow(Arc::downgrade(&mirror.inner), at));
        *mirror
            .inner
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(task.abort_handle());
        Ok(mirror)
    }

    /// Runs one transaction under the store's deadline. It is sent again only when no member
    /// took it; `operation` names it in errors ("delete volume v1").
    ///
    /// # Errors
    ///
    /// [`StoreError::Etcd`] naming the endpoints and `operation`.
    pub async fn txn(
        &self,
        operation: impl Fn() -> String,
        txn: Txn,
    ) -> Result<TxnResponse, StoreError> {
        self.bounded(operation, false, || {
            let mut kv = self.client().kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Reads one key (linearizable: what the cluster holds now, not what a watch delivered).
    ///
    /// # Errors
    ///
    /// [`StoreError::Etcd`].
    pub async fn read_key(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        Ok(self.read_key_at(key).await?.0)
    }

    /// [`read_key`](Self::read_key), with the cluster's revision at the read (what a
    /// [`Mirror::note`] of the key's absence needs).
    ///
    /// # Errors
    ///
    /// [`StoreError::Etcd`].
    pub async fn read_key_at(&self, key: &str) -> Result<(Option<KeyValue>, i64), StoreError> {
        let response = self
            .bounded(
                || format!("read {key}"),
                true,
                || {
                    let mut kv = self.client().kv_client();
                    async move { kv.get(key, None).await }
                },
            )
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        Ok((response.kvs().first().cloned(), revision))
    }

    /// Keeps `key` = `value` in the cluster under a lease of `ttl` (at least
    /// [`MIN_DUTY_TTL`](super::MIN_DUTY_TTL)) for as long as the returned [`HeldKey`] lives: an
    /// agent's membership. When the lease is lost (the cluster was unreachable for longer than
    /// the TTL) a new one is granted and the key written again.
    pub fn hold_key(&self, key: impl Into<String>, value: Vec<u8>, ttl: Duration) -> HeldKey {
        let (value_tx, value_rx) = watch::channel(value);
        let (state_tx, state_rx) = watch::channel(Held::Pending);
        let lease = Arc::new(Mutex::new(None));
        let holder = Holder {
            store: self.clone(),
            key: key.into(),
            ttl: ttl.max(super::MIN_DUTY_TTL),
            value: value_rx,
            state: state_tx,
            lease: Arc::clone(&lease),
        };
        let task = tokio::spawn(holder.run());
        HeldKey {
            value: value_tx,
            state: state_rx,
            task: task.abort_handle(),
            store: self.clone(),
            lease,
        }
    }
}

/// Whether a [`HeldKey`] is in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// Not written yet.
    Pending,
    /// Written under a live lease.
    Held {
        /// The lease.
        lease: i64,
    },
    /// The cluster could not be reached or refused; trying again.
    Failing(String),
}

/// A key kept under a lease; see [`EtcdStore::hold_key`]. Dropping it stops the keep-alives
/// (the key goes when the lease expires, as after a crash); [`release`](Self::release) deletes
/// it at once.
#[derive(Debug)]
pub struct HeldKey {
    value: watch::Sender<Vec<u8>>,
    state: watch::Receiver<Held>,
    task: AbortHandle,
    store: EtcdStore,
    lease: Arc<Mutex<Option<i64>>>,
}

impl HeldKey {
    /// Writes a new value (under the same lease).
    pub fn set(&self, value: Vec<u8>) {
        self.value.send_if_modified(|v| {
            let changed = *v != value;
            *v = value;
            changed
        });
    }

    /// Whether the key is held now.
    pub fn state(&self) -> Held {
        self.state.borrow().clone()
    }

    /// Changes of [`state`](Self::state).
    pub fn subscribe(&self) -> watch::Receiver<Held> {
        self.state.clone()
    }

    /// Stops holding the key and revokes its lease, which deletes it.
    pub async fn release(self) {
        self.task.abort();
        self.store.revoke_taken_lease(&self.lease).await;
    }
}

impl Drop for HeldKey {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Holder {
    store: EtcdStore,
    key: String,
    ttl: Duration,
    value: watch::Receiver<Vec<u8>>,
    state: watch::Sender<Held>,
    lease: Arc<Mutex<Option<i64>>>,
}

impl Holder {
    async fn run(mut self) {
        let mut delay = RETRY_MIN;
        loop {
            let error = self.hold_once().await;
            *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = None;
            if !matches!(*self.state.borrow(), Held::Failing(_)) {
                tracing::warn!(key = %self.key, error = %error, "lost the lease of a held key; writing it again");
            }
            let _ = self.state.send(Held::Failing(error));
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(self.ttl);
        }
    }

    fn limit(&self) -> Duration {
        self.store.config().request_timeout.min(self.ttl / 2)
    }

    /// Grants a lease, writes the key and keeps both alive; returns why it stopped.
    async fn hold_once(&mut self) -> String {
        let limit = self.limit();
        let mut leases = self.store.client().lease_client();
        let ttl_secs = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        let id = match tokio::time::timeout(limit, leases.grant(ttl_secs, None)).await {
            Ok(Ok(g)) => g.id(),
            Ok(Err(e)) => return format!("grant a lease: {e}"),
            Err(_) => return format!("grant a lease: no answer within {limit:?}"),
        };
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(id);
        let Ok(Ok((mut keeper, mut answers))) =
            tokio::time::timeout(limit, leases.keep_alive(id)).await
        else {
            return "keep the lease alive: no stream".to_owned();
        };
        let every = self.ttl / 3;
        let mut dirty = true;
        loop {
            if dirty {
                let value = self.value.borrow_and_update().clone();
                let mut kv = self.store.client().kv_client();
                let put = kv.put(
                    self.key.as_str(),
                    value,
                    Some(PutOptions::new().with_lease(id)),
                );
                match tokio::time::timeout(limit, put).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return format!("write {}: {e}", self.key),
                    Err(_) => return format!("write {}: no answer within {limit:?}", self.key),
                }
                let _ = self.state.send(Held::Held { lease: id });
            }
            dirty = tokio::select! {
                () = tokio::time::sleep(every) => false,
                changed = self.value.changed() => match changed {
                    Ok(()) => true,
                    // The HeldKey is gone (its task is being aborted).
                    Err(_) => return "released".to_owned(),
                },
            };
            if !dirty {
                let confirmed = tokio::time::timeout(every, async {
                    keeper.keep_alive().await.ok()?;
                    answers.message().await.ok().flatten()
                })
                .await;
                match confirmed {
                    Ok(Some(answer)) if answer.ttl() > 0 => {}
                    Ok(Some(_)) => return "the lease expired".to_owned(),
                    _ => return format!("keep-alive not confirmed within {every:?}"),
                }
            }
        }
    }
}
