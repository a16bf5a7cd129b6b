//! A retry budget shared by all calls of one client.
//!
//! An attempt limit alone does not stop a retry storm: with a limit of 4, a plugin that fails
//! every call receives four times the normal load exactly when it is least able to serve it.
//! A budget bounds retries *across* calls: every call deposits a fraction of a token, a retry
//! withdraws a whole one, and a small reserve refills over time so a quiet client can still
//! retry. When the budget is empty, calls fail after their first attempt (their error says so)
//! until calls succeed or time refills it.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket of retries, shared (behind an `Arc`) by every call of a client.
///
/// ```
/// use csi_client::RetryBudget;
///
/// let budget = RetryBudget::new(2, 0.0, 0.0);
/// assert!(budget.try_withdraw());
/// assert!(budget.try_withdraw());
/// assert!(!budget.try_withdraw()); // empty: no more retries
/// ```
#[derive(Debug)]
pub struct RetryBudget {
    capacity: f64,
    deposit_per_call: f64,
    refill_per_second: f64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    tokens: f64,
    refilled_at: Option<Instant>,
}

impl RetryBudget {
    /// A full budget of `capacity` retries; each call adds `deposit_per_call` (for example
    /// `0.2`: one retry per five calls) and time adds `refill_per_second`, never above
    /// `capacity`. Negative or non-finite rates count as zero.
    pub fn new(capacity: u32, deposit_per_call: f64, refill_per_second: f64) -> Self {
        let clean = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        RetryBudget {
            capacity: f64::from(capacity),
            deposit_per_call: clean(deposit_per_call),
            refill_per_second: clean(refill_per_second),
            state: Mutex::new(State {
                tokens: f64::from(capacity),
                refilled_at: None,
            }),
        }
    }

    /// A budget that never runs out (for tests that count attempts).
    pub fn unlimited() -> Self {
        RetryBudget {
            capacity: f64::INFINITY,
            deposit_per_call: 0.0,
            refill_per_second: 0.0,
            state: Mutex::new(State {
                tokens: f64::INFINITY,
                refilled_at: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The critical sections below cannot panic half-way; a poisoned lock still holds a
        // consistent number.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refill(&self, state: &mut State) {
        let now = Instant::now();
        if let Some(then) = state.refilled_at {
            let elapsed: Duration = now.saturating_duration_since(then);
            state.tokens =
                (state.tokens + elapsed.as_secs_f64() * self.refill_per_second).min(self.capacity);
        }
        state.refilled_at = Some(now);
    }

    /// Records a call (its first attempt): deposits the per-call fraction.
    pub fn deposit(&self) {
        let mut state = self.lock();
        self.refill(&mut state);
        state.tokens = (state.tokens + self.deposit_per_call).min(self.capacity);
    }

    /// Takes one retry from the budget; `false` when it is empty.
    pub fn try_withdraw(&self) -> bool {
        let mut state = self.lock();
        self.refill(&mut state);
        if state.tokens >= 1.0 {
            state.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Retries currently available (rounded down).
    pub fn available(&self) -> u64 {
        let mut state = self.lock();
        self.refill(&mut state);
        if state.tokens.is_infinite() {
            u64::MAX
        } else {
            // Tokens are kept within 0..=capacity (a u32), so this cannot truncate.
            state.tokens.floor() as u64
        }
    }
}

impl Default for RetryBudget {
    /// 20 retries in reserve, one more per five calls, one more per second.
    fn default() -> Self {
        RetryBudget::new(20, 0.2, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deposits_fill_and_are_capped() {
        let b = RetryBudget::new(1, 0.5, 0.0);
        assert!(b.try_withdraw());
        assert!(!b.try_withdraw());
        b.deposit();
        assert!(!b.try_withdraw(), "half a token is not a retry");
        b.deposit();
        assert!(b.try_withdraw());
        for _ in 0..10 {
            b.deposit();
        }
        assert_eq!(b.available(), 1, "capped at capacity");
    }

    #[tokio::test(start_paused = true)]
    async fn time_refills() {
        let b = RetryBudget::new(3, 0.0, 1.0);
        while b.try_withdraw() {}
        assert_eq!(b.available(), 0);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(b.available(), 2);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(b.available(), 3);
    }

    #[test]
    fn unlimited_never_runs_out() {
        let b = RetryBudget::unlimited();
        for _ in 0..1000 {
            assert!(b.try_withdraw());
        }
        assert_eq!(b.available(), u64::MAX);
    }

    #[test]
    fn bad_rates_count_as_zero() {
        let b = RetryBudget::new(0, f64::NAN, -3.0);
        b.deposit();
        assert!(!b.try_withdraw());
    }
}
