//! Transports: a real unix socket, and an in-memory duplex pipe for fast unit tests. Both wrap
//! each connection in an IO wrapper a fault script can tear down (see [`crate::FaultStep`]),
//! over one that reads at most 8 requests per turn
//! ([`csi_proto::pace::PacedIo`]).

pub(crate) mod killable;
pub(crate) mod memory;
pub(crate) mod unix;

pub use unix::{connect_unix, connect_unix_lazy};

use std::num::NonZeroUsize;

use csi_proto::pace::{Pace, PacedIo};

/// Complete requests the mock reads per turn of a connection. Of 1, 2, 4, 8, 12 and 16, 4 and 8
/// served grpc-go's client best at 32 callers (about a fifth more Probes per second than no
/// limit), and 8 was the one of them that did not slow csi-client down.
pub(crate) const REQUESTS_PER_TURN: NonZeroUsize = NonZeroUsize::new(8).unwrap();

/// An accepted connection, read a few requests per turn.
pub(crate) fn paced<T>(io: T) -> PacedIo<T> {
    PacedIo::server(io, Pace::Fixed(REQUESTS_PER_TURN))
}
