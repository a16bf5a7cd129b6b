//! Integration tests of csi-client over real unix sockets: the connection (authority,
//! one dial, late socket, restart), the retry and deadline policy, error classes, and
//! validation against the csi-testkit mock plugin.

mod support;

mod connection;
