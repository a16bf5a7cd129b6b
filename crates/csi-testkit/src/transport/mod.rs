//! Transports: a real unix socket, and an in-memory duplex pipe for fast unit tests. Both wrap
//! each connection in a [`killable::KillableIo`] so fault scripts can drop it.

pub(crate) mod killable;
pub(crate) mod memory;
pub(crate) mod unix;

pub use unix::{connect_unix, connect_unix_lazy};
