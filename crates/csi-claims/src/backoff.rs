//! Capped exponential backoff with jitter, as a pure value.
//!
//! The release machine keeps one attempt counter per volume and asks the policy for the
//! delay before the next attempt. Jitter comes from a [`JitterRng`] seeded by the caller, so
//! tests are deterministic. Delays double from [`initial`](BackoffPolicy::initial) up to
//! [`max`](BackoffPolicy::max); jitter only *shortens* a delay (by up to
//! [`jitter_percent`](BackoffPolicy::jitter_percent)), so the cap is a hard cap.
//!
//! Why not `backon` (the workspace's retry crate)? `backon` drives retries of a future, and
//! its exponential jitter *adds* up to one whole delay on top, landing above the cap. Here
//! there is no future to retry, only a deadline to compute inside a state machine, and the
//! cap must hold.
//!
//! ```
//! use std::time::Duration;
//! use csi_claims::backoff::{BackoffPolicy, JitterRng};
//!
//! let policy = BackoffPolicy::new(Duration::from_secs(1), Duration::from_secs(8))
//!     .unwrap()
//!     .with_jitter_percent(0)
//!     .unwrap();
//! let mut rng = JitterRng::from_seed(7);
//! let delays: Vec<_> = (1..=5).map(|a| policy.delay(a, &mut rng).as_secs()).collect();
//! assert_eq!(delays, [1, 2, 4, 8, 8]);
//! ```

use std::time::Duration;

/// A backoff policy that cannot be built with nonsense values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffPolicy {
    initial: Duration,
    max: Duration,
    jitter_percent: u8,
}

/// Why a [`BackoffPolicy`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackoffPolicyError {
    /// `initial` was zero: retries would spin in a tight loop.
    #[error("backoff initial delay must be greater than zero")]
    ZeroInitial,
    /// `max` was below `initial`.
    #[error("backoff max delay {max:?} is below the initial delay {initial:?}")]
    MaxBelowInitial {
        /// The initial delay given.
        initial: Duration,
        /// The max delay given.
        max: Duration,
    },
    /// The jitter was above 100 percent.
    #[error("backoff jitter {percent}% is above the limit of 100%")]
    JitterTooLarge {
        /// The jitter given.
        percent: u8,
    },
}

impl BackoffPolicy {
    /// One second doubling up to one minute, with 20 % jitter: the shape of Nomad's client-side
    /// unmount retry (1 s, ×2, 1 min cap), plus the jitter it lacked.
    pub const DEFAULT: BackoffPolicy = BackoffPolicy {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(60),
        jitter_percent: 20,
    };

    /// Delays from `initial` doubling up to `max`, with the default 20 % jitter.
    ///
    /// # Errors
    ///
    /// [`BackoffPolicyError::ZeroInitial`] or [`BackoffPolicyError::MaxBelowInitial`].
    pub const fn new(initial: Duration, max: Duration) -> Result<Self, BackoffPolicyError> {
        if initial.is_zero() {
            return Err(BackoffPolicyError::ZeroInitial);
        }
        if max.as_nanos() < initial.as_nanos() {
            return Err(BackoffPolicyError::MaxBelowInitial { initial, max });
        }
        Ok(Self {
            initial,
            max,
            jitter_percent: Self::DEFAULT.jitter_percent,
        })
    }

    /// The same policy with jitter of up to `percent` of each delay (0 to 100).
    ///
    /// # Errors
    ///
    /// [`BackoffPolicyError::JitterTooLarge`] above 100.
    pub const fn with_jitter_percent(mut self, percent: u8) -> Result<Self, BackoffPolicyError> {
        if percent > 100 {
            return Err(BackoffPolicyError::JitterTooLarge { percent });
        }
        self.jitter_percent = percent;
        Ok(self)
    }

    /// The first delay.
    pub const fn initial(&self) -> Duration {
        self.initial
    }

    /// The cap.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// The most a delay is shortened by jitter, in percent.
    pub const fn jitter_percent(&self) -> u8 {
        self.jitter_percent
    }

    /// The delay before retry number `attempt` (1 for the first retry) without jitter:
    /// `initial × 2^(attempt−1)`, capped at `max`.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(63);
        let nanos = self.initial.as_nanos().saturating_mul(1u128 << doublings);
        if nanos >= self.max.as_nanos() {
            self.max
        } else {
            duration_from_nanos(nanos)
        }
    }

    /// The delay before retry number `attempt`, shortened by a random jitter.
    /// Never above [`max`](Self::max), never below `(100 − jitter)%` of the base delay.
    pub fn delay(&self, attempt: u32, rng: &mut JitterRng) -> Duration {
        self.jittered(self.base_delay(attempt), rng)
    }

    /// The capped delay with jitter, for failures that will not heal soon (a fatal answer).
    pub fn delay_at_cap(&self, rng: &mut JitterRng) -> Duration {
        self.jittered(self.max, rng)
    }

    fn jittered(&self, base: Duration, rng: &mut JitterRng) -> Duration {
        let base = base.as_nanos();
        let span = base * u128::from(self.jitter_percent) / 100;
        let cut = (span * u128::from(rng.next_u64())) >> 64;
        duration_from_nanos(base - cut)
    }
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

fn duration_from_nanos(nanos: u128) -> Duration {
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    // The remainder of a division by 10^9 always fits in a u32.
    let sub = u32::try_from(nanos % 1_000_000_000).unwrap_or(0);
    Duration::new(secs, sub)
}

/// A small deterministic random source for jitter (SplitMix64).
///
/// Not for anything secret: it only spreads retries apart. Seed it from the caller so that
/// tests replay exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JitterRng {
    state: u64,
}

impl JitterRng {
    /// A generator whose sequence is fixed by `seed`.
    pub const fn from_seed(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next pseudo-random value.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(jitter: u8) -> BackoffPolicy {
        BackoffPolicy::new(Duration::from_millis(100), Duration::from_secs(3))
            .unwrap()
            .with_jitter_percent(jitter)
            .unwrap()
    }

    #[test]
    fn doubles_then_caps() {
        let p = policy(0);
        let mut rng = JitterRng::from_seed(1);
        let got: Vec<u128> = (1..=8).map(|a| p.delay(a, &mut rng).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 3000, 3000, 3000]);
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(3));
        assert_eq!(p.base_delay(0), Duration::from_millis(100));
    }

    #[test]
    fn jitter_stays_within_bounds_and_varies() {
        let p = policy(50);
        let mut rng = JitterRng::from_seed(42);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let d = p.delay(20, &mut rng);
            assert!(d <= Duration::from_secs(3), "{d:?} above the cap");
            assert!(d >= Duration::from_millis(1500), "{d:?} below half the cap");
            seen.insert(d);
        }
        assert!(
            seen.len() > 100,
            "jitter should spread delays, got {}",
            seen.len()
        );
    }

    #[test]
    fn same_seed_same_delays() {
        let p = policy(20);
        let (mut a, mut b) = (JitterRng::from_seed(9), JitterRng::from_seed(9));
        for attempt in 1..10 {
            assert_eq!(p.delay(attempt, &mut a), p.delay(attempt, &mut b));
        }
        let mut c = JitterRng::from_seed(10);
        let mut a = JitterRng::from_seed(9);
        let differs = (1..10).any(|n| p.delay(n, &mut a) != p.delay(n, &mut c));
        assert!(differs);
    }

    #[test]
    fn bad_policies_are_refused() {
        assert_eq!(
            BackoffPolicy::new(Duration::ZERO, Duration::from_secs(1)),
            Err(BackoffPolicyError::ZeroInitial)
        );
        assert!(matches!(
            BackoffPolicy::new(Duration::from_secs(2), Duration::from_secs(1)),
            Err(BackoffPolicyError::MaxBelowInitial { .. })
        ));
        assert_eq!(
            policy(0).with_jitter_percent(101),
            Err(BackoffPolicyError::JitterTooLarge { percent: 101 })
        );
    }
}
