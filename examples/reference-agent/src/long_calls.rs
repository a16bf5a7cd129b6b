//! When to say again that a plugin call is still going: once when it has run for a while,
//! then at intervals (the demo's plain lines, `serve`'s log).

use std::collections::HashMap;
use std::time::Duration;

/// Which long calls are due a reminder, by their [`CallInFlight`](csi_client::CallInFlight)
/// id.
#[derive(Debug)]
pub(crate) struct Reminders {
    /// A call's age at its first reminder.
    first: Duration,
    /// The time between two reminders of the same call.
    every: Duration,
    /// Per call, the age at which its next reminder is due.
    due: HashMap<u64, Duration>,
}

impl Reminders {
    /// A reminder at `first`, then every `every`.
    pub(crate) fn new(first: Duration, every: Duration) -> Reminders {
        Reminders {
            first,
            every: every.max(Duration::from_secs(1)),
            due: HashMap::new(),
        }
    }

    /// The ids due a reminder, given every call in flight with its age; calls no longer in
    /// flight are forgotten. A call seen late (a busy machine) gets one reminder, not one per
    /// interval it missed.
    pub(crate) fn due(&mut self, ages: &[(u64, Duration)]) -> Vec<u64> {
        self.due.retain(|id, _| ages.iter().any(|(c, _)| c == id));
        let mut ids = Vec::new();
        for (id, age) in ages {
            let next = self.due.entry(*id).or_insert(self.first);
            if age >= next {
                ids.push(*id);
                while *next <= *age {
                    *next += self.every;
                }
            }
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_call_is_reminded_once_and_then_at_intervals() {
        let secs = Duration::from_secs;
        let mut reminders = Reminders::new(secs(3), secs(15));
        assert!(reminders.due(&[(1, secs(2))]).is_empty());
        assert_eq!(reminders.due(&[(1, secs(3))]), [1]);
        assert!(reminders.due(&[(1, secs(4))]).is_empty());
        assert!(reminders.due(&[(1, secs(17))]).is_empty());
        assert_eq!(reminders.due(&[(1, secs(18))]), [1]);
        // A second call has its own turn; the first, ended, is forgotten.
        assert_eq!(reminders.due(&[(2, secs(40))]), [2]);
        assert!(!reminders.due.contains_key(&1));
        // A long pause gives one reminder, not one per missed interval.
        assert_eq!(reminders.due(&[(2, secs(100))]), [2]);
        assert!(reminders.due(&[(2, secs(101))]).is_empty());
    }
}
