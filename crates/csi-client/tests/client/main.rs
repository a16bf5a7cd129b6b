//! Integration tests of csi-client over real unix sockets: the connection (authority, one
//! dial, late socket, restart, endpoints that can never be dialled), the retry and deadline
//! policy and error classes against the csi-testkit mock plugin, the typed answers and
//! helpers, the paths node errors name, and the tower layer hook with its metrics layer.

mod support;

mod broken;
mod connection;
mod dial;
mod expand_snapshots;
mod inflight;
mod lifecycle;
mod metrics;
mod misbehaving;
mod paths;
mod retries;
mod turns;
mod typed;
mod undo;
