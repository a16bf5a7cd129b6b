//! Route each CSI call to the agent that can serve it: controller calls to a healthy
//! controller instance of the plugin (with failover), node calls to the node that owns the
//! volume, over an authenticated, versioned gRPC protocol between agents.
//!
//! In a cluster the controller service of a plugin runs on some nodes and its node service on
//! every node that mounts volumes, while the code that decides (claims, releases, creation)
//! may run anywhere. Each agent runs a [`Shim`]: local callers hand it a call, and it
//!
//! - serves it with this node's plugins when the target is this node (no network hop);
//! - for controller calls, orders the healthy instances from the [`Registry`] (sticky per
//!   volume by default, see [`Strategy`]) and fails over on "retry elsewhere" or `UNAVAILABLE`;
//!   when none is left, one [`ShimError::NoController`] lists why each was refused;
//! - for node calls, goes to the owning node only; a node that left answers
//!   [`ShimError::NodeGone`];
//! - treats health as advice, not a gate, for release steps (node detach, controller
//!   detach): they go to an instance reported unhealthy too (a controller's after the
//!   healthy ones), while every other call is refused there;
//! - sends the call to the target agent directly, or through one relay when it has no direct
//!   link ([`Routes`]); a relay never relays again (hop count in metadata);
//! - carries the caller's deadline on every hop, relative (`grpc-timeout`, and each agent
//!   enforces it) and absolute (wall-clock time, [`deadline::DEADLINE_HEADER`]): the agent
//!   that serves a call refuses it, before any plugin call, once the sender's deadline has
//!   passed, however long the request waited in its socket ([`deadline`]).
//!
//! Calls are authenticated with per-node [`Token`]s compared in constant time; a node-scoped
//! caller may act only for its own node ([`auth`]). Errors cross the wire as a structured
//! detail with their [`ErrorClass`](csi_structs::ErrorClass); nothing matches message text.
//!
//! With the cargo feature `tls`, agent links can run over TLS (tonic's rustls support, ring
//! provider): build a `TlsConfig` with `TlsConfig::from_pem` (mutual TLS under one cluster
//! CA) and put it in `ShimConfig::tls`. Tokens are checked on top of it all the same.
//!
//! The shim does not talk to plugins itself: the composing layer implements [`LocalPlugins`]
//! (with `csi-client`), and tests implement it with fakes.
//!
//! It is not a plugin client, a claim tracker or a cluster membership service: the registry,
//! routes and token book are fed by the layer above.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use csi_rpc_shim::{
//!     ControllerDetach, ControllerQuery, Credentials, Health, Instance, LocalPlugins, Registry,
//!     Routes, Scope, Shim, ShimConfig, Token, TokenBook,
//! };
//! use csi_structs::{ExternalVolumeId, NodeId, PluginId, PluginNodeId, Secrets, VolumeId};
//!
//! # async fn run(plugins: Arc<dyn LocalPlugins>) -> Result<(), Box<dyn std::error::Error>> {
//! let me = NodeId::new("node-a")?;
//! let controller = NodeId::new("node-b")?;
//! let ebs = PluginId::new("ebs")?;
//! let my_token = Token::new("node-a-token-0123456789")?;
//!
//! // What the cluster view says: node-b runs the controller, node-a the node plugin.
//! let registry = Arc::new(Registry::new());
//! registry.update(&controller, &ebs, Instance::Controller(Health::Healthy));
//! registry.update(
//!     &me,
//!     &ebs,
//!     Instance::Node { plugin_node: PluginNodeId::new("i-0a")?, health: Health::Healthy },
//! );
//!
//! let routes = Routes::new().with_direct(controller.clone(), "10.0.0.2:7400".parse()?);
//! let tokens = TokenBook::new().with(
//!     controller.clone(),
//!     Token::new("node-b-token-0123456789")?,
//!     Scope::Node,
//! );
//! let config = ShimConfig::new(Credentials { node: me.clone(), token: my_token }, Scope::Node);
//! let shim = Shim::new(config, registry, plugins, tokens, routes);
//!
//! // Serve other agents...
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:7400").await?;
//! let server = shim.clone();
//! tokio::spawn(async move { server.serve(listener, std::future::pending()).await });
//!
//! // ...and route our own calls.
//! let detach = ControllerDetach {
//!     query: ControllerQuery::new(ebs),
//!     volume: VolumeId::new("db-data")?,
//!     external_volume: ExternalVolumeId::new("vol-0abc")?,
//!     node: me,
//!     plugin_node: PluginNodeId::new("i-0a")?,
//!     secrets: Secrets::new(),
//! };
//! match shim.controller_detach(detach, Duration::from_secs(30)).await {
//!     Ok(()) => {}
//!     Err(e) => println!("{e} (class {})", e.class()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Measuring the hop cost
//!
//! `csi-bench --shim-hop` (in the workspace's `benches/` package) measures it: the same
//! `ControllerUnpublishVolume` against an in-process mock plugin called directly, through the
//! shim of the node that runs the controller, and through another node's shim over loopback
//! TCP, printing each latency and the p50 one hop adds. `benches/README.md` has the numbers.

// The README is the crate's page on crates.io; its examples run as doctests with these docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod auth;
mod backend;
pub mod deadline;
mod details;
mod error;
mod forward;
mod ops;
mod peers;
mod registry;
pub mod request;
mod routing;
mod rpc;
mod server;
mod shim;
#[cfg(feature = "tls")]
mod tls;
pub mod wire;

pub use auth::{Credentials, Denied, Principal, Scope, Token, TokenBook, TokenError};
pub use backend::{GrpcCode, LocalPlugins, LocalStatus, PluginError, PluginFailure, ShimContext};
pub use deadline::{DEFAULT_CLOCK_SKEW_MARGIN, MalformedDeadline, WallClock};
pub use error::{ProtocolProblem, Refusal, RefusalReason, ShimError};
pub use peers::Routes;
pub use registry::{ControllerView, Health, Instance, NodePlugin, NodeStatus, Registry};
pub use request::{
    ControllerAttach, ControllerAttached, ControllerDetach, ControllerExpand, ControllerExpanded,
    ControllerQuery, ControllerValidate, CreateSnapshot, CreateVolume, CreatedVolume,
    DeleteSnapshot, DeleteVolume, ListSnapshots, ListVolumes, ListedVolume, NodeDetach, NodeExpand,
    NodeExpanded, SnapshotInfo, SnapshotPage, Validated, VolumePage,
};
pub use routing::Strategy;
pub use rpc::{AgentRpc, ServiceKind};
pub use server::{AgentService, ServeError};
pub use shim::{MAX_LOCAL_TIMEOUT, Shim, ShimConfig, ShimStats};
#[cfg(feature = "tls")]
pub use tls::{PemInput, TLS_HANDSHAKE_TIMEOUT, TlsConfig, TlsConfigError};
pub use wire::InvalidMessage;
