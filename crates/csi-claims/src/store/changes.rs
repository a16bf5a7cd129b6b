//! The queue between a shared store's watch and its reader.
//!
//! A watch that waits for a slow reader falls behind the store: etcd then holds its events in
//! a buffer of its own, marks the watcher slow, and (in the releases Debian ships) may lose
//! events when its history is compacted meanwhile. So the watch never waits here. A change
//! that finds an older change of the same volume still waiting replaces it (the reader only
//! needs the newest record of each volume), and a re-read of every record replaces everything
//! that waits. What waits is thus at most one change per volume, one re-read and a few notes.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use csi_structs::VolumeId;
use tokio::sync::{Notify, watch};

use super::{Change, Stored, Version};
use crate::model::VolumeRecord;

/// How many notes ([`Change::Undecodable`], [`Change::Interrupted`], [`Change::Resumed`]) may
/// wait; more are dropped, and the count of dropped notes is logged by the sender.
const NOTE_LIMIT: usize = 256;

/// The changes of a shared store, from the moment of the read they were asked with (the
/// receiving end; see [`ClaimStore::load_and_watch`](super::ClaimStore::load_and_watch)).
///
/// Changes of one volume come in the order the store made them, but a change may replace an
/// older one of the same volume that was not received yet, and a [`Change::Resync`] replaces
/// every change made before it. Changes of different volumes may come in any order.
///
/// ```
/// # use csi_claims::store::{Change, Changes, Version};
/// # use csi_structs::VolumeId;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (sender, mut changes) = Changes::channel();
/// let v = VolumeId::new("v").unwrap();
/// sender.volume(v.clone(), Version::FIRST, None);
/// sender.volume(v.clone(), Version::from_u64(2).unwrap(), None);
/// // Only the newest change of the volume waited.
/// let Some(Change::Volume { version, .. }) = changes.recv().await else { panic!() };
/// assert_eq!(version.get(), 2);
/// drop(sender);
/// assert!(changes.recv().await.is_none());
/// # }
/// ```
pub struct Changes {
    shared: Arc<Shared>,
    /// Dropped with the receiver: the sender sees it closed.
    _alive: watch::Receiver<()>,
}

/// The sending end of [`Changes`], for a store's watch. Sending never waits.
pub struct ChangeSender {
    shared: Arc<Shared>,
    alive: watch::Sender<()>,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Notify,
}

#[derive(Default)]
struct Queue {
    resync: Option<(Version, Vec<Stored>)>,
    /// Volumes with a change waiting, in the order their first waiting change came.
    order: VecDeque<VolumeId>,
    volumes: HashMap<VolumeId, (Version, Option<VolumeRecord>)>,
    notes: VecDeque<Change>,
    dropped_notes: u64,
    sender_gone: bool,
}

impl Changes {
    /// A new queue: the sender for a store's watch, the receiver for its reader (usually a
    /// [`ClaimsDriver`](crate::driver::ClaimsDriver)).
    pub fn channel() -> (ChangeSender, Changes) {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
        });
        let (alive, receiver) = watch::channel(());
        (
            ChangeSender {
                shared: Arc::clone(&shared),
                alive,
            },
            Changes {
                shared,
                _alive: receiver,
            },
        )
    }

    /// The next change; `None` once the sender is gone and nothing waits.
    ///
    /// Cancel-safe: a change is taken from the queue only when it is returned.
    pub async fn recv(&mut self) -> Option<Change> {
        loop {
            let notified = self.shared.ready.notified();
            tokio::pin!(notified);
            // Registered before the queue is looked at, so a change sent in between wakes us.
            notified.as_mut().enable();
            {
                let mut queue = self.shared.lock();
                if let Some(change) = queue.pop() {
                    return Some(change);
                }
                if queue.sender_gone {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// The next change if one waits now.
    pub fn try_recv(&mut self) -> Option<Change> {
        self.shared.lock().pop()
    }

    /// How many changes wait (volume changes, a re-read and notes).
    pub fn len(&self) -> usize {
        let queue = self.shared.lock();
        queue.volumes.len() + usize::from(queue.resync.is_some()) + queue.notes.len()
    }

    /// Whether no change waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changes")
            .field("waiting", &self.len())
            .finish()
    }
}

impl ChangeSender {
    /// A volume's record as written at `version` (`None`: deleted). Replaces a waiting change
    /// of the same volume that is not newer.
    pub fn volume(&self, volume: VolumeId, version: Version, record: Option<VolumeRecord>) {
        {
            let mut queue = self.shared.lock();
            match queue.volumes.get_mut(&volume) {
                Some(waiting) => {
                    if waiting.0 <= version {
                        *waiting = (version, record);
                    }
                }
                None => {
                    queue.order.push_back(volume.clone());
                    queue.volumes.insert(volume, (version, record));
                }
            }
        }
        self.shared.ready.notify_one();
    }

    /// Every record at `version`, read again: replaces every change still waiting (they are
    /// all older than the read).
    pub fn resync(&self, version: Version, records: Vec<Stored>) {
        {
            let mut queue = self.shared.lock();
            queue.order.clear();
            queue.volumes.clear();
            queue.resync = Some((version, records));
        }
        self.shared.ready.notify_one();
    }

    /// A note: [`Change::Undecodable`], [`Change::Interrupted`] or [`Change::Resumed`] (a
    /// volume change or a re-read given here is queued as by [`volume`](Self::volume) and
    /// [`resync`](Self::resync)). Returns `false` when the note was dropped because too many
    /// wait.
    pub fn note(&self, change: Change) -> bool {
        match change {
            Change::Volume {
                volume,
                version,
                record,
            } => self.volume(volume, version, record),
            Change::Resync { version, records } => self.resync(version, records),
            note => {
                {
                    let mut queue = self.shared.lock();
                    if queue.notes.len() >= NOTE_LIMIT {
                        queue.dropped_notes += 1;
                        return false;
                    }
                    queue.notes.push_back(note);
                }
                self.shared.ready.notify_one();
            }
        }
        true
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.alive.is_closed()
    }

    /// Resolves once the receiver is gone.
    pub async fn closed(&self) {
        self.alive.closed().await;
    }

    /// How many notes were dropped because too many waited.
    pub fn dropped_notes(&self) -> u64 {
        self.shared.lock().dropped_notes
    }
}

impl fmt::Debug for ChangeSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeSender")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Drop for ChangeSender {
    fn drop(&mut self) {
        self.shared.lock().sender_gone = true;
        self.shared.ready.notify_one();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Queue {
    /// A re-read first (every waiting volume change came after it), then notes, then volume
    /// changes in the order they first came.
    fn pop(&mut self) -> Option<Change> {
        if let Some((version, records)) = self.resync.take() {
            return Some(Change::Resync { version, records });
        }
        if let Some(note) = self.notes.pop_front() {
            return Some(note);
        }
        let volume = self.order.pop_front()?;
        let (version, record) = self
            .volumes
            .remove(&volume)
            .expect("invariant: every volume in `order` has a waiting change");
        Some(Change::Volume {
            volume,
            version,
            record,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ControllerRequirement, VolumeInfo};
    use csi_structs::{ExternalVolumeId, PluginId};

    fn v(name: &str) -> VolumeId {
        VolumeId::new(name).unwrap()
    }

    fn version(n: u64) -> Version {
        Version::from_u64(n).unwrap()
    }

    fn record(name: &str) -> VolumeRecord {
        VolumeRecord::new(VolumeInfo {
            id: v(name),
            external_id: ExternalVolumeId::new("x").unwrap(),
            plugin: PluginId::new("p").unwrap(),
            controller: ControllerRequirement::NotRequired,
        })
    }

    fn volume_of(change: Change) -> (VolumeId, u64) {
        match change {
            Change::Volume {
                volume, version, ..
            } => (volume, version.get()),
            other => panic!("expected a volume change, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_burst_waits_as_one_change_per_volume_with_the_newest_record() {
        let (tx, mut rx) = Changes::channel();
        for n in 1..=10_000u64 {
            let name = if n % 2 == 0 { "even" } else { "odd" };
            tx.volume(v(name), version(n), Some(record(name)));
        }
        assert_eq!(rx.len(), 2);
        assert_eq!(volume_of(rx.recv().await.unwrap()), (v("odd"), 9_999));
        assert_eq!(volume_of(rx.recv().await.unwrap()), (v("even"), 10_000));
        assert!(rx.try_recv().is_none());
    }

    #[tokio::test]
    async fn an_older_change_never_replaces_a_newer_one() {
        let (tx, mut rx) = Changes::channel();
        tx.volume(v("a"), version(5), None);
        tx.volume(v("a"), version(3), Some(record("a")));
        assert_eq!(volume_of(rx.recv().await.unwrap()), (v("a"), 5));
    }

    #[tokio::test]
    async fn a_reread_replaces_what_waits_and_comes_before_later_changes() {
        let (tx, mut rx) = Changes::channel();
        tx.volume(v("a"), version(1), Some(record("a")));
        tx.resync(version(7), Vec::new());
        tx.volume(v("b"), version(8), Some(record("b")));
        match rx.recv().await.unwrap() {
            Change::Resync { version, .. } => assert_eq!(version.get(), 7),
            other => panic!("expected the re-read first, got {other:?}"),
        }
        assert_eq!(volume_of(rx.recv().await.unwrap()), (v("b"), 8));
        assert!(rx.is_empty());
    }

    #[tokio::test]
    async fn notes_are_bounded_and_the_dropped_ones_counted() {
        let (tx, rx) = Changes::channel();
        for _ in 0..NOTE_LIMIT + 3 {
            tx.note(Change::Resumed);
        }
        assert_eq!(rx.len(), NOTE_LIMIT);
        assert_eq!(tx.dropped_notes(), 3);
    }

    #[tokio::test]
    async fn the_reader_wakes_for_a_change_and_ends_with_the_sender() {
        let (tx, mut rx) = Changes::channel();
        let reader = tokio::spawn(async move {
            let first = rx.recv().await.map(volume_of);
            let end = rx.recv().await.is_none();
            (first, end)
        });
        tokio::task::yield_now().await;
        tx.volume(v("a"), version(1), None);
        drop(tx);
        let (first, end) = reader.await.unwrap();
        assert_eq!(first, Some((v("a"), 1)));
        assert!(end, "the receiver ends once the sender is gone");
    }

    #[tokio::test]
    async fn the_sender_sees_the_receiver_go() {
        let (tx, rx) = Changes::channel();
        assert!(!tx.is_closed());
        drop(rx);
        tx.closed().await;
        assert!(tx.is_closed());
    }
}
