//! A stateful mock CSI plugin with scripted faults and a call log, for testing orchestrators.
//!
//! `csi-testkit` serves all five CSI services (Identity, Controller, Node, GroupController,
//! SnapshotMetadata) from an in-memory model of a storage system, over a real unix socket or an
//! in-memory pipe. It behaves as the spec demands (required fields, NOT_FOUND, ALREADY_EXISTS,
//! idempotent repeats, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ABORTED, UNIMPLEMENTED for what
//! its capabilities do not cover, size limits), creates and removes real directories for node
//! staging and publishing (without mounting anything), and can be told to misbehave: per-rpc
//! fault scripts (a status, a delay, a hang, a dropped connection) and quirks real plugins have.
//! Every call is recorded so a test can assert exactly what the orchestrator did. With the
//! v1.12 `VOLUME_CONDITION` capabilities opted into, it reports the per-volume conditions a
//! test sets with [`MockPlugin::set_volume_condition`].
//!
//! It is a test double, not a CSI plugin framework, and it depends only on `csi-proto` and
//! `csi-structs`. The `csi-mock-plugin` binary serves the same mock to clients in any language.
//!
//! # Example
//!
//! A plugin that fails `NodeUnstageVolume` twice with UNAVAILABLE, then succeeds:
//!
//! ```
//! use csi_proto::Rpc;
//! use csi_proto::v1::node_client::NodeClient;
//! use csi_proto::v1::NodeUnstageVolumeRequest;
//! use csi_testkit::MockPlugin;
//! use tonic::Code;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let plugin = MockPlugin::builder().role(csi_testkit::Role::Node).build()?;
//! plugin.faults().on(Rpc::NodeUnstageVolume).fail_times(2, Code::Unavailable, "busy");
//!
//! let (server, channel) = plugin.serve_in_memory().await?; // or plugin.serve_unix(path)
//! let mut node = NodeClient::new(channel);
//! let unstage = || NodeUnstageVolumeRequest {
//!     volume_id: "vol-1".into(),
//!     staging_target_path: "/var/lib/csi/staging/vol-1".into(),
//! };
//! for _ in 0..2 {
//!     let err = node.node_unstage_volume(unstage()).await.unwrap_err();
//!     assert_eq!(err.code(), Code::Unavailable);
//! }
//! node.node_unstage_volume(unstage()).await?; // the script is used up: normal service
//!
//! server.calls().assert_runs(&[(Rpc::NodeUnstageVolume, 3)])?;
//! server.shutdown().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! - [`config`]: the [`MockPluginBuilder`], [`Role`] and [`Config`].
//! - [`capabilities`]: capability names and which rpc each one enables.
//! - [`quirks`]: [`Quirk`] switches.
//! - [`secrets`]: secrets the mock requires on the calls that take them
//!   ([`MockPluginBuilder::require_secret`]).
//! - [`faults`]: fault scripts ([`Faults`], [`ScriptBuilder`], [`FaultStep`]);
//!   [`fault_spec`]: the same written as text (`csi-mock-plugin --fault`);
//!   [`control`]: a control socket to change faults and read the call log at run time.
//! - [`calls`]: the call log ([`Calls`], [`CallRecord`], [`CallList`]).
//! - [`disk`]: [`disk::StalledFile`], a disk that stops answering for the code under test's
//!   own files (a FIFO where it will write).
//! - [`server`]: [`MockServer`], started by [`MockPlugin::serve_unix`] or
//!   [`MockPlugin::serve_in_memory`]; [`transport`]: client connectors.
//! - `state`, `services`, `dispatch`, `validate`, `metadata`: the model, the five services,
//!   the per-call pipeline, the request checks, the block-metadata model (internal).

// The README is the crate's page on crates.io; its examples run as doctests with these docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod calls;
pub mod capabilities;
pub mod config;
pub mod conformance;
pub mod control;
pub mod disk;
mod dispatch;
pub mod endpoint;
pub mod error;
pub mod etcd;
pub mod fault_spec;
pub mod faults;
pub mod logs;
mod metadata;
mod plugin;
pub mod quirks;
pub mod registrar;
pub mod secrets;
pub mod server;
mod services;
mod state;
pub mod transport;
mod validate;

pub use calls::{
    CallList, CallRecord, Calls, LogStats, RecordedOutcome, RunsMismatch, WaitTimeout,
};
pub use capabilities::{
    ControllerCapability, GroupControllerCapability, NodeCapability, PluginCapabilities,
    PluginService, VolumeExpansion,
};
pub use config::{Config, ConfigError, MockPluginBuilder, Role, SeedVolume};
pub use endpoint::{EndpointError, UnixEndpoint};
pub use error::Error;
pub use faults::{FaultStep, Faults, ScriptBuilder};
pub use plugin::{MockPlugin, NodePath};
pub use quirks::Quirk;
pub use secrets::SecretRequirementError;
pub use server::MockServer;
pub use state::persist::{STATE_FILE_VERSION, StateFileError};
