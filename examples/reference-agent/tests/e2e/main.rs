//! End-to-end tests of the `csi-agent` binary and the agent's adapters, against the csi-testkit
//! mock plugin served on unix sockets in temporary directories.
//!
//! One test binary (one link) with a module per area.

mod adapters;
mod attach_limit;
mod claims_release;
#[cfg(feature = "etcd")]
mod cluster;
#[cfg(feature = "etcd")]
mod cluster_attach_limit;
#[cfg(feature = "etcd")]
mod cluster_fencing;
mod content_source;
mod demo;
mod detach;
mod expand;
mod faults;
mod hangup;
mod health;
mod kubelet;
mod load;
mod long_calls;
mod plugin_text;
mod secrets;
mod serve;
mod snapshots;
mod support;
mod topology;
mod uncertain;
mod views;
mod volume_health;
