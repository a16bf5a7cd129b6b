//! The controller duty as its holder knows it: a fence the store checks and a local deadline.
//!
//! When agents share a store, one of them at a time performs the controller-side release
//! steps (`ControllerUnpublishVolume`, and every step that is only a record). Holding a lease
//! in the store is not enough to act on: an agent paused past its lease (a long GC pause, a
//! stopped VM, a swapped-out process) wakes believing it still leads, while another agent has
//! taken over. Two checks keep a deposed holder from acting, and each covers what the other
//! cannot:
//!
//! 1. **A local deadline** ([`Duty::holds`]): the monotonic time at which the last *confirmed*
//!    keep-alive of the lease was *sent*, plus the lease's TTL, minus a safety margin. The store
//!    cannot expire the lease before that time (it renewed the lease after the keep-alive was
//!    sent), so an agent that checks the deadline immediately before a step never starts one
//!    after its lease could have expired, however long it was paused before the check. The
//!    driver checks it after every wait: before a step starts, after the store confirmed it,
//!    and immediately before the plugin call.
//! 2. **A fence** ([`Fence`]): every controller-side write is a transaction that also
//!    compares the duty key's creation revision, and every controller call is preceded by a
//!    read-only transaction that compares it together with the volume's version. A store
//!    refuses both once another agent holds the duty, whatever this agent's clock says. The
//!    deadline alone would not do: the monotonic clock does not count the time a host spent
//!    suspended (Linux's `CLOCK_MONOTONIC`, which tokio's `Instant` reads), so an agent on a
//!    machine suspended and resumed wakes with a clock that missed the pause; and a duty key
//!    can go for reasons the holder never hears of in time (an operator deletes it, the
//!    cluster is restored from a backup). The fence alone would not do either: an agent
//!    paused after the store confirmed a step would wake and make the call.
//!
//! Because the confirmation compares the volume's version together with the fence, a newly
//! elected holder acts only on the record the store holds at a moment it holds the duty, never
//! on an older copy in its memory: a step decided on a stale copy is refused as stale, the
//! volume is read again and the step decided again on what was read.
//!
//! **What remains.** Between the last check and the moment the request is written to the
//! plugin's (or the forwarding agent's) socket there is no further check: a pause there longer
//! than the margin can let a call leave after the lease expired. That stretch is one poll of
//! the call and the connection task's write of the request it queued: normally well under a
//! millisecond, longer only by the runtime's scheduling delay under load. The margin bounds
//! it; pick one above the longest stall expected of the process there. Even then, the call
//! only harms a live workload if, within that pause, another agent has taken the duty,
//! finished the release, and the volume was claimed and attached again on the same node.
//!
//! A call under way when the duty lapses is abandoned, with whatever retries it had left
//! (csi-client retries a retryable failure within one call, csi-rpc-shim fails over between
//! controllers): the driver races the call against the lapse and looks at the lapse first
//! whenever the holder wakes, so a holder woken from a pause drops the call before it sends a
//! retry. A call handed to another agent carries the holder's deadline
//! ([`ControllerDetachRequest::duty_deadline`](crate::ControllerDetachRequest::duty_deadline)),
//! so that agent stops retrying by then even if the holder, paused, cannot cancel it. A step cut
//! short is taken again by whoever holds the duty. A request already written is not recalled:
//! `ControllerUnpublishVolume` is idempotent, and its outcome is recorded by a
//! compare-and-swap write that fails for a writer whose copy is stale.
//!
//! A driver without a [`Duty`] (one agent, or duties handed out by
//! [`ClaimsHandle::set_controller_duty`](crate::driver::ClaimsHandle::set_controller_duty))
//! performs controller steps without either check: with one writer there is nobody to fence.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// The smallest [`DutyTiming::margin`]: the margin also absorbs a clock that runs slightly
/// faster on the store's host than on the agent's, and the scheduling delay between the last
/// check and the socket write.
pub const MIN_DUTY_MARGIN: Duration = Duration::from_millis(100);

/// The lease's TTL and the safety margin that the local deadline keeps under it.
///
/// The margin must be at least [`MIN_DUTY_MARGIN`] and less than a third of the TTL:
/// keep-alives go out every third of the TTL and each may take up to a third to be answered,
/// so a larger margin would let the deadline lapse between two keep-alives of a healthy
/// holder. The default is a fifth of the TTL (at least the minimum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DutyTiming {
    ttl: Duration,
    margin: Duration,
}

/// Why a [`DutyTiming`] was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DutyTimingError {
    /// The margin is below [`MIN_DUTY_MARGIN`].
    #[error("the duty margin {margin:?} is below the minimum of {MIN_DUTY_MARGIN:?}")]
    MarginTooSmall {
        /// The margin asked for.
        margin: Duration,
    },
    /// The margin is not less than a third of the TTL.
    #[error(
        "the duty margin {margin:?} must be less than a third of the lease TTL {ttl:?} \
         (keep-alives go out every third of it)"
    )]
    MarginTooLarge {
        /// The margin asked for.
        margin: Duration,
        /// The TTL.
        ttl: Duration,
    },
}

impl DutyTiming {
    /// `ttl` with the default margin (a fifth of it, at least [`MIN_DUTY_MARGIN`]).
    ///
    /// # Errors
    ///
    /// [`DutyTimingError::MarginTooLarge`] when the TTL is so short that even the minimum
    /// margin is a third of it or more (under 300 ms).
    pub fn new(ttl: Duration) -> Result<Self, DutyTimingError> {
        Self::with_margin(ttl, (ttl / 5).max(MIN_DUTY_MARGIN))
    }

    /// `ttl` with an explicit `margin`.
    ///
    /// # Errors
    ///
    /// [`DutyTimingError`] when the margin is below [`MIN_DUTY_MARGIN`] or not less than a
    /// third of the TTL.
    ///
    /// ```
    /// use std::time::Duration;
    /// use csi_claims::duty::DutyTiming;
    ///
    /// let timing = DutyTiming::with_margin(Duration::from_secs(10), Duration::from_secs(2)).unwrap();
    /// assert_eq!(timing.margin(), Duration::from_secs(2));
    /// assert!(DutyTiming::with_margin(Duration::from_secs(3), Duration::from_secs(1)).is_err());
    /// ```
    pub fn with_margin(ttl: Duration, margin: Duration) -> Result<Self, DutyTimingError> {
        if margin < MIN_DUTY_MARGIN {
            return Err(DutyTimingError::MarginTooSmall { margin });
        }
        if margin.saturating_mul(3) >= ttl {
            return Err(DutyTimingError::MarginTooLarge { margin, ttl });
        }
        Ok(Self { ttl, margin })
    }

    /// The lease's TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The safety margin.
    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// The deadline a keep-alive sent at `sent` and confirmed with `remaining` TTL gives:
    /// `sent + min(remaining, ttl) - margin`.
    pub fn deadline(&self, sent: Instant, remaining: Duration) -> Instant {
        let kept = remaining.min(self.ttl).saturating_sub(self.margin);
        sent + kept
    }
}

/// What a store compares to tell the duty's holder from a deposed one: the duty key and the
/// revision at which the holder created it. A key deleted and created again (by the next
/// holder) has another creation revision, so a comparison with the old one fails.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The duty key, as the store names it.
    pub key: String,
    /// The store revision at which this holder created the key.
    pub revision: i64,
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} created at revision {}", self.key, self.revision)
    }
}

/// The controller duty as its holder knows it: who holds it, its [`Fence`], and the local
/// deadline up to which the holder may start a step. Cheap to clone; clones share the
/// deadline, which the keep-alive loop extends ([`extend`](Self::extend)) and a loss ends
/// ([`lapse`](Self::lapse)).
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use csi_claims::duty::{Duty, Fence};
///
/// let now = Instant::now();
/// let duty = Duty::new("n1", Fence { key: "/leader".into(), revision: 7 }, now + Duration::from_secs(3));
/// assert!(duty.holds(now));
/// assert!(!duty.holds(now + Duration::from_secs(3)));
/// duty.extend(now + Duration::from_secs(6));
/// assert!(duty.holds(now + Duration::from_secs(4)));
/// duty.lapse();
/// assert!(!duty.holds(now));
/// ```
#[derive(Clone)]
pub struct Duty {
    inner: Arc<DutyInner>,
}

struct DutyInner {
    holder: String,
    fence: Fence,
    /// `None` once lapsed for good.
    until: Mutex<Option<Instant>>,
}

impl Duty {
    /// The duty held by `holder` under `fence`, until `until` unless extended.
    pub fn new(holder: impl Into<String>, fence: Fence, until: Instant) -> Self {
        Self {
            inner: Arc::new(DutyInner {
                holder: holder.into(),
                fence,
                until: Mutex::new(Some(until)),
            }),
        }
    }

    /// Who holds it.
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// The fence a store compares.
    pub fn fence(&self) -> &Fence {
        &self.inner.fence
    }

    /// Whether a step may start at `now`: before the deadline, and not lapsed.
    pub fn holds(&self, now: Instant) -> bool {
        self.until().is_some_and(|until| now < until)
    }

    /// The deadline (`None`: lapsed for good).
    pub fn until(&self) -> Option<Instant> {
        *self.inner.until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the deadline to `until` if that is later (a keep-alive confirmed). Does nothing
    /// once [`lapse`](Self::lapse)d.
    pub fn extend(&self, until: Instant) {
        let mut current = self.inner.until.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = current.as_mut()
            && until > *at
        {
            *at = until;
        }
    }

    /// Ends the duty for good (the lease was lost or given up): no step starts under it again.
    pub fn lapse(&self) {
        *self.inner.until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether `other` is the same duty (a clone of it).
    pub fn same_as(&self, other: &Duty) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for Duty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Duty")
            .field("holder", &self.inner.holder)
            .field("fence", &self.inner.fence)
            .field("until", &self.until())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_margin_is_a_fifth_of_the_ttl_and_never_below_the_minimum() {
        let t = DutyTiming::new(Duration::from_secs(10)).unwrap();
        assert_eq!(t.margin(), Duration::from_secs(2));
        let t = DutyTiming::new(Duration::from_millis(400)).unwrap();
        assert_eq!(t.margin(), MIN_DUTY_MARGIN);
        assert_eq!(
            DutyTiming::new(Duration::from_millis(300)),
            Err(DutyTimingError::MarginTooLarge {
                margin: MIN_DUTY_MARGIN,
                ttl: Duration::from_millis(300)
            })
        );
    }

    #[test]
    fn a_margin_outside_its_bounds_is_refused_naming_it() {
        let ttl = Duration::from_secs(4);
        let small = DutyTiming::with_margin(ttl, Duration::from_millis(99)).unwrap_err();
        assert!(small.to_string().contains("99ms"), "{small}");
        let large = DutyTiming::with_margin(ttl, Duration::from_millis(1334)).unwrap_err();
        assert!(large.to_string().contains("a third"), "{large}");
        assert!(DutyTiming::with_margin(ttl, Duration::from_millis(1333)).is_ok());
    }

    #[test]
    fn the_deadline_counts_from_the_send_and_keeps_the_margin() {
        let t = DutyTiming::with_margin(Duration::from_secs(4), Duration::from_secs(1)).unwrap();
        let sent = Instant::now();
        assert_eq!(
            t.deadline(sent, Duration::from_secs(4)),
            sent + Duration::from_secs(3)
        );
        // A keep-alive answered with less TTL left than granted counts what is left.
        assert_eq!(
            t.deadline(sent, Duration::from_secs(2)),
            sent + Duration::from_secs(1)
        );
        // More than the TTL is never believed.
        assert_eq!(
            t.deadline(sent, Duration::from_secs(60)),
            sent + Duration::from_secs(3)
        );
        assert_eq!(t.deadline(sent, Duration::ZERO), sent);
    }

    #[test]
    fn a_deadline_only_moves_forward_and_a_lapse_is_final() {
        let now = Instant::now();
        let fence = Fence {
            key: "k".into(),
            revision: 1,
        };
        let duty = Duty::new("a", fence, now + Duration::from_secs(5));
        duty.extend(now + Duration::from_secs(1));
        assert_eq!(duty.until(), Some(now + Duration::from_secs(5)));
        let clone = duty.clone();
        clone.lapse();
        assert!(!duty.holds(now));
        duty.extend(now + Duration::from_secs(50));
        assert_eq!(duty.until(), None);
        assert!(duty.same_as(&clone));
    }
}
