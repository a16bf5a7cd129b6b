//! One operation in flight per volume: operations on the same key wait their turn (in the
//! order they asked), operations on different keys run at once. An idle key takes no memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Table = Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>;

/// The table of keys with an operation in flight or waiting.
#[derive(Debug, Default)]
pub(crate) struct Ops {
    table: Table,
}

/// The right to run the one operation of a key; the next waiter runs when it is dropped.
#[derive(Debug)]
pub(crate) struct Turn {
    guard: Option<OwnedMutexGuard<()>>,
    key: String,
    table: Table,
}

impl Ops {
    /// Waits for `key`'s turn.
    pub(crate) async fn turn(&self, key: &str) -> Turn {
        let lock = {
            let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(table.entry(key.to_owned()).or_default())
        };
        Turn {
            guard: Some(lock.lock_owned().await),
            key: key.to_owned(),
            table: Arc::clone(&self.table),
        }
    }

    /// How many keys have an operation in flight or waiting.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        drop(self.guard.take());
        // Waiters hold a clone, taken under the table's lock: none left means idle.
        if table
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            table.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_turn_per_key_and_idle_keys_are_forgotten() {
        let ops = Arc::new(Ops::default());
        let a = ops.turn("a").await;
        let b = ops.turn("b").await;
        assert_eq!(ops.busy(), 2, "different keys run at once");
        let waiting = tokio::spawn({
            let ops = Arc::clone(&ops);
            async move {
                let _turn = ops.turn("a").await;
            }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the second operation on `a` waits");
        drop(a);
        waiting.await.expect("runs once `a` is free");
        drop(b);
        assert_eq!(ops.busy(), 0);
    }
}
