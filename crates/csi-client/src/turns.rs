//! [`VolumeTurns`]: at most one call in flight per volume.
//!
//! The spec asks the orchestrator to keep at most one call in flight per volume; a plugin may
//! answer a second one with `ABORTED`, and the retry behind that answer costs a backoff pause.
//! So every attempt of an RPC about one volume first takes that volume's turn, and gives it
//! back when the attempt ends (before a retry's pause, so another caller goes meanwhile).
//! Callers of the same volume go in the order they asked; calls about other volumes and
//! calls about no volume never wait.
//!
//! The turns belong to a [`CsiClient`](crate::CsiClient) and its clones. Clients of one
//! plugin built separately (say, one with a release policy) share them through
//! [`CsiClientBuilder::volume_turns`](crate::CsiClientBuilder::volume_turns).
//!
//! ```
//! use std::sync::Arc;
//! use csi_client::{CsiClient, VolumeTurns};
//!
//! let endpoint: csi_client::Endpoint = "unix:///run/csi/plugin.sock".parse().unwrap();
//! let turns = Arc::new(VolumeTurns::new());
//! let client = CsiClient::builder(endpoint.clone()).volume_turns(turns.clone()).build();
//! let releases = CsiClient::builder(endpoint).volume_turns(turns.clone()).build();
//! assert!(Arc::ptr_eq(client.volume_turns(), releases.volume_turns()));
//! assert_eq!(turns.busy(), 0);
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use csi_proto::Rpc;
use csi_structs::ExternalVolumeId;
use tokio::sync::{Mutex as TurnLock, OwnedMutexGuard};

/// The volumes with a call in flight, and who waits for each.
#[derive(Debug, Default)]
pub struct VolumeTurns {
    /// A lock per volume with a holder or a waiter, and how many they are; removed when the
    /// last one leaves.
    volumes: Mutex<HashMap<ExternalVolumeId, Entry>>,
}

#[derive(Debug)]
struct Entry {
    lock: Arc<TurnLock<()>>,
    /// The holder and the waiters.
    users: usize,
}

impl VolumeTurns {
    /// No volume busy.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many volumes have a call in flight or waiting now.
    pub fn busy(&self) -> usize {
        self.map().len()
    }

    /// Waits for `volume`'s turn; the turn is held until the returned value is dropped.
    /// Callers of one volume get it in the order they asked. Cancel-safe: dropping the
    /// future gives up the place in line.
    pub async fn take(self: &Arc<Self>, volume: &ExternalVolumeId) -> Turn {
        let lock = {
            let mut map = self.map();
            let entry = map.entry(volume.clone()).or_insert_with(|| Entry {
                lock: Arc::new(TurnLock::new(())),
                users: 0,
            });
            entry.users += 1;
            Arc::clone(&entry.lock)
        };
        // From here on this caller counts as a user of the entry until it leaves: as a
        // `Turn` once the turn came, or through `place` if this future is dropped before.
        let place = Place {
            turns: Arc::clone(self),
            volume: volume.clone(),
        };
        let guard = lock.lock_owned().await;
        Turn {
            _guard: guard,
            place,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ExternalVolumeId, Entry>> {
        self.volumes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One user of `volume` left; the entry goes with the last.
    fn leave(&self, volume: &ExternalVolumeId) {
        let mut map = self.map();
        if let Some(entry) = map.get_mut(volume) {
            entry.users = entry.users.saturating_sub(1);
            if entry.users == 0 {
                map.remove(volume);
            }
        }
    }
}

/// A user of a volume's entry (waiting or holding); leaves when dropped.
#[derive(Debug)]
struct Place {
    turns: Arc<VolumeTurns>,
    volume: ExternalVolumeId,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.turns.leave(&self.volume);
    }
}

/// One volume's turn; the next caller of the volume goes when it is dropped.
#[derive(Debug)]
pub struct Turn {
    // Fields drop in order: the lock goes to the next waiter first, then this caller leaves
    // the entry (which goes with its last user).
    _guard: OwnedMutexGuard<()>,
    place: Place,
}

impl Turn {
    /// The volume whose turn this is.
    pub fn volume(&self) -> &ExternalVolumeId {
        &self.place.volume
    }
}

/// The volume whose turn an attempt of `rpc` takes: the volume the call is about, for every
/// RPC that acts on or reads one volume. A listing (`ListSnapshots` filtered by its source
/// volume) is about no volume.
pub(crate) fn volume_of(rpc: Rpc, volume: Option<&ExternalVolumeId>) -> Option<&ExternalVolumeId> {
    match rpc {
        Rpc::ListSnapshots => None,
        _ => volume,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn vol(id: &str) -> ExternalVolumeId {
        ExternalVolumeId::new(id).expect("valid id")
    }

    #[tokio::test]
    async fn a_second_caller_of_a_volume_waits_and_others_do_not() {
        let turns = Arc::new(VolumeTurns::new());
        let first = turns.take(&vol("a")).await;
        let other = tokio::time::timeout(Duration::from_secs(5), turns.take(&vol("b")))
            .await
            .expect("another volume never waits");
        assert_eq!(turns.busy(), 2);
        let second = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(&vol("a")).await }
        });
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !second.is_finished(),
            "waits while the first holds the turn"
        );
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("goes once the first is done")
            .expect("task");
        assert_eq!(second.volume(), &vol("a"));
        drop((second, other));
        assert_eq!(turns.busy(), 0, "nothing kept for volumes nobody uses");
    }

    #[tokio::test]
    async fn callers_go_in_the_order_they_asked() {
        let turns = Arc::new(VolumeTurns::new());
        let first = turns.take(&vol("a")).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..5 {
            let (turns, order) = (turns.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _turn = turns.take(&vol("a")).await;
                order.lock().expect("lock").push(i);
                tokio::task::yield_now().await;
            }));
            // Each waiter queues before the next one starts.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        for w in waiters {
            w.await.expect("task");
        }
        assert_eq!(*order.lock().expect("lock"), vec![0, 1, 2, 3, 4]);
        assert_eq!(turns.busy(), 0);
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_waiting_leaves_nothing_behind() {
        let turns = Arc::new(VolumeTurns::new());
        let first = turns.take(&vol("a")).await;
        let gave_up = tokio::time::timeout(Duration::from_millis(10), turns.take(&vol("a"))).await;
        assert!(gave_up.is_err(), "the turn was held");
        assert_eq!(turns.busy(), 1);
        drop(first);
        assert_eq!(turns.busy(), 0);
        // A waiter that gives up while another still waits keeps the entry for that one.
        let first = turns.take(&vol("a")).await;
        let stays = tokio::spawn({
            let turns = turns.clone();
            async move { turns.take(&vol("a")).await }
        });
        let _ = tokio::time::timeout(Duration::from_millis(10), turns.take(&vol("a"))).await;
        drop(first);
        let stays = stays.await.expect("task");
        assert_eq!(turns.busy(), 1);
        drop(stays);
        assert_eq!(turns.busy(), 0);
    }

    #[tokio::test]
    async fn a_waiter_cancelled_once_its_turn_came_leaves_nothing_behind() {
        let turns = Arc::new(VolumeTurns::new());
        let first = turns.take(&vol("a")).await;
        let waiter = tokio::spawn({
            let turns = turns.clone();
            async move {
                let _turn = turns.take(&vol("a")).await;
                std::future::pending::<()>().await;
            }
        });
        // Let the waiter queue, then hand it the turn and cancel it before it runs again.
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(turns.busy(), 0);
        // The volume's turn is free again.
        let again = tokio::time::timeout(Duration::from_secs(5), turns.take(&vol("a"))).await;
        assert!(again.is_ok());
    }

    #[test]
    fn listings_take_no_turn() {
        let v = vol("a");
        assert_eq!(volume_of(Rpc::ControllerPublishVolume, Some(&v)), Some(&v));
        assert_eq!(volume_of(Rpc::ListSnapshots, Some(&v)), None);
        assert_eq!(volume_of(Rpc::Probe, None), None);
    }
}
