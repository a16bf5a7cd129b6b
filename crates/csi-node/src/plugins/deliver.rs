//! Delivering events in order without holding the manager's lock.
//!
//! Events are queued while the state lock is held (so the queue's order is the order of
//! the state changes) and delivered after it is released by whichever thread finds the
//! delivery free; a thread that finds it busy leaves its events to the one delivering.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError, TryLockError};

use tokio::sync::broadcast;

use super::event::{PluginEvent, PluginObserver};

pub(super) struct Events {
    queue: Mutex<VecDeque<PluginEvent>>,
    delivering: Mutex<()>,
    observers: Vec<Arc<dyn PluginObserver>>,
    stream: broadcast::Sender<PluginEvent>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("observers", &self.observers.len())
            .finish_non_exhaustive()
    }
}

impl Events {
    pub(super) fn new(observers: Vec<Arc<dyn PluginObserver>>, capacity: usize) -> Self {
        let (stream, _) = broadcast::channel(capacity.max(1));
        Self {
            queue: Mutex::new(VecDeque::new()),
            delivering: Mutex::new(()),
            observers,
            stream,
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<PluginEvent>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues an event; call with the state lock held, then [`flush`](Self::flush) after
    /// releasing it.
    pub(super) fn push(&self, event: PluginEvent) {
        self.queue().push_back(event);
    }

    /// Delivers every queued event, unless another thread is delivering (it delivers ours).
    pub(super) fn flush(&self) {
        loop {
            let guard = match self.delivering.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            loop {
                let next = self.queue().pop_front();
                let Some(event) = next else { break };
                for observer in &self.observers {
                    observer.on_event(&event);
                }
                // No subscriber is fine.
                let _ = self.stream.send(event);
            }
            drop(guard);
            // An event queued while we let go would otherwise wait for the next change.
            if self.queue().is_empty() {
                return;
            }
        }
    }

    pub(super) fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.stream.subscribe()
    }
}
