//! The absolute deadline a call carries between agents, and the wall clock it is read against.
//!
//! gRPC's `grpc-timeout` is relative: it restarts when the receiver reads the request. A call
//! that waited in the receiver's socket buffer (its agent paused, say, by SIGSTOP or a frozen
//! container) would run in full once the receiver wakes, long after the sender gave up on it
//! and perhaps after the sender did the same step elsewhere. So every agent that sends a call
//! also stamps it with the sender's deadline as wall-clock time, [`DEADLINE_HEADER`], and the
//! agent that serves it checks the stamp immediately before calling its plugin:
//!
//! - a call whose stamp has passed, allowing [`ShimConfig::clock_skew_margin`] (the receiver
//!   refuses when `now + margin >= deadline`), never reaches the plugin: it is answered with
//!   [`ShimError::DeadlineExceeded`] (uncertain for a mutating call, as the sender's own
//!   deadline passing is) and logged with the call, the volume, the sender and how late it is;
//! - a call with time left is served, the plugin call getting no more than that time;
//! - a call without the stamp (from an agent that predates it) is bounded by its
//!   `grpc-timeout` alone, as before;
//! - a stamp that does not parse is refused as an invalid request naming the header.
//!
//! A relay checks the stamp as well and passes it on unchanged (or stamps its own deadline
//! when the caller sent none).
//!
//! The agents' wall clocks must agree within the margin: with NTP they agree within
//! milliseconds. A receiver whose clock is ahead refuses calls early, which costs a retry; one
//! whose clock is behind by more than the margin could serve a call late.
//!
//! [`ShimConfig::clock_skew_margin`]: crate::ShimConfig::clock_skew_margin
//! [`ShimError::DeadlineExceeded`]: crate::ShimError::DeadlineExceeded

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use csi_structs::untrusted::escaped;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

/// Metadata key holding the sender's deadline: whole milliseconds since the Unix epoch, in
/// decimal ASCII digits (for example `1735689600000`).
pub const DEADLINE_HEADER: &str = "x-csisdk-deadline-unix-ms";

/// The default [`ShimConfig::clock_skew_margin`](crate::ShimConfig::clock_skew_margin):
/// 250 ms, far above the skew of clocks kept by NTP, and small next to a release step's
/// deadline (seconds).
pub const DEFAULT_CLOCK_SKEW_MARGIN: Duration = Duration::from_millis(250);

/// The most digits a stamp may have: `u64::MAX` has 20.
const MAX_DIGITS: usize = 20;

/// Where a shim reads the wall-clock time that stamped deadlines are made from and compared
/// with. The default is the system clock.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use csi_rpc_shim::WallClock;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
/// let clock = WallClock::following_tokio(start);
/// tokio::time::advance(Duration::from_secs(5)).await;
/// assert_eq!(clock.now(), start + Duration::from_secs(5));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WallClock {
    /// A wall time and the tokio instant it was read at; `None`: the system clock.
    anchor: Option<(SystemTime, Instant)>,
}

impl WallClock {
    /// The system clock (`SystemTime::now`).
    pub const fn system() -> Self {
        Self { anchor: None }
    }

    /// A clock that reads `now` at this moment and moves with tokio's clock from then on: the
    /// wall clock of a cluster simulated under tokio's paused time, or of a test agent whose
    /// clock is set ahead of (or behind) the others'.
    pub fn following_tokio(now: SystemTime) -> Self {
        Self {
            anchor: Some((now, Instant::now())),
        }
    }

    /// The time now, by this clock.
    pub fn now(&self) -> SystemTime {
        match self.anchor {
            None => SystemTime::now(),
            Some((wall, at)) => {
                let elapsed = Instant::now().saturating_duration_since(at);
                wall.checked_add(elapsed).unwrap_or(wall)
            }
        }
    }

    /// `deadline` (on tokio's clock) as wall-clock time by this clock.
    pub(crate) fn at(&self, deadline: Instant) -> SystemTime {
        let now = self.now();
        let left = deadline.saturating_duration_since(Instant::now());
        now.checked_add(left).unwrap_or(now)
    }
}

/// The [`DEADLINE_HEADER`] of a call could not be read. The call is refused as an invalid
/// request; the sender is not an agent of this protocol, or a broken one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "metadata {field} is not a whole number of milliseconds since the Unix epoch: {}",
    escaped(value)
)]
pub struct MalformedDeadline {
    /// The metadata key, [`DEADLINE_HEADER`].
    pub field: &'static str,
    /// The value received (cut to 64 bytes; text that is not ASCII reads as empty).
    pub value: String,
}

impl MalformedDeadline {
    fn new(value: &str) -> Self {
        let mut value = value.to_owned();
        if value.len() > 64 {
            let mut end = 64;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            value.truncate(end);
        }
        Self {
            field: DEADLINE_HEADER,
            value,
        }
    }
}

/// The stamped deadline in `md`: `Ok(None)` when the sender sent none.
///
/// # Errors
///
/// [`MalformedDeadline`] when the value is not 1 to 20 decimal digits, or names a time the
/// system clock cannot hold.
pub(crate) fn from_metadata(md: &MetadataMap) -> Result<Option<SystemTime>, MalformedDeadline> {
    let Some(value) = md.get(DEADLINE_HEADER) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default();
    parse(text)
        .map(Some)
        .ok_or_else(|| MalformedDeadline::new(text))
}

/// Reads a stamp's value; `None` when it is malformed.
fn parse(text: &str) -> Option<SystemTime> {
    if text.is_empty() || text.len() > MAX_DIGITS || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let millis: u64 = text.parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// The header value for a deadline at `at` (rounded down to the millisecond, so never later
/// than the sender's own); `None` for a time before the Unix epoch (a clock that is broken
/// anyway: the call then goes without a stamp).
pub(crate) fn to_header(at: SystemTime) -> Option<AsciiMetadataValue> {
    let millis = at.duration_since(UNIX_EPOCH).ok()?.as_millis();
    let millis = u64::try_from(millis).ok()?;
    Some(AsciiMetadataValue::from(millis))
}

/// How far past the refusal line a call stamped `deadline` is at `now`: how late it is
/// (`now - deadline`) in signed milliseconds; negative when the deadline is still ahead but
/// within the margin.
pub(crate) fn late_millis(now: SystemTime, deadline: SystemTime) -> i128 {
    match now.duration_since(deadline) {
        Ok(late) => i128::try_from(late.as_millis()).unwrap_or(i128::MAX),
        Err(early) => -i128::try_from(early.duration().as_millis()).unwrap_or(i128::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_to_the_millisecond() {
        let at = UNIX_EPOCH + Duration::from_millis(1_735_689_600_123) + Duration::from_micros(999);
        let header = to_header(at).unwrap();
        assert_eq!(header.to_str().unwrap(), "1735689600123");
        let mut md = MetadataMap::new();
        md.insert(DEADLINE_HEADER, header);
        assert_eq!(
            from_metadata(&md),
            Ok(Some(UNIX_EPOCH + Duration::from_millis(1_735_689_600_123)))
        );
        assert_eq!(from_metadata(&MetadataMap::new()), Ok(None));
        assert_eq!(to_header(UNIX_EPOCH - Duration::from_secs(1)), None);
    }

    #[test]
    fn malformed_stamps_name_the_header() {
        for bad in [
            "",
            "-1",
            "+5",
            "12.5",
            "1e9",
            " 1",
            "0x10",
            "18446744073709551616",
            "123456789012345678901",
        ] {
            let mut md = MetadataMap::new();
            md.insert(DEADLINE_HEADER, AsciiMetadataValue::try_from(bad).unwrap());
            let err = from_metadata(&md).unwrap_err();
            assert_eq!(err.field, DEADLINE_HEADER, "{bad:?}");
            assert!(err.to_string().contains(DEADLINE_HEADER), "{err}");
        }
        let mut md = MetadataMap::new();
        md.insert(
            DEADLINE_HEADER,
            AsciiMetadataValue::try_from("9".repeat(20).as_str()).unwrap(),
        );
        assert!(from_metadata(&md).is_err(), "above u64::MAX milliseconds");
        let long = "7".repeat(200);
        assert!(MalformedDeadline::new(&long).value.len() <= 64);
    }

    #[test]
    fn lateness_is_signed() {
        let t = UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(late_millis(t + Duration::from_millis(1500), t), 1500);
        assert_eq!(late_millis(t, t + Duration::from_millis(40)), -40);
    }

    #[tokio::test(start_paused = true)]
    async fn a_following_clock_moves_with_tokio_and_converts_deadlines() {
        let start = UNIX_EPOCH + Duration::from_secs(1_000);
        let clock = WallClock::following_tokio(start);
        let deadline = Instant::now() + Duration::from_secs(30);
        assert_eq!(clock.at(deadline), start + Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(clock.now(), start + Duration::from_secs(10));
        assert_eq!(clock.at(deadline), start + Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            clock.at(deadline),
            clock.now(),
            "a passed deadline is now, not earlier"
        );
    }
}
