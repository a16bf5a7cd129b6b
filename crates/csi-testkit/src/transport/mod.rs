//! Transports: a real unix socket, and an in-memory duplex pipe for fast unit tests. Both wrap
//! each connection in an IO wrapper a fault script can tear down (see [`crate::FaultStep`]),
//! over one that reads a few requests per turn ([`paced`]).

pub(crate) mod killable;
pub(crate) mod memory;
pub(crate) mod paced;
pub(crate) mod unix;

pub use unix::{connect_unix, connect_unix_lazy};
