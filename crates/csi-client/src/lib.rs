//! Typed async CSI clients over unix sockets, with the spec's per-RPC deadlines, retries and
//! error classes.
//!
//! This crate is the orchestrator's side of a CSI plugin socket. It is what Nomad, kubelet
//! and the Kubernetes sidecars each wrote for themselves, done once:
//!
//! - **Every RPC has a deadline** (per attempt, also sent as `grpc-timeout`, and per call),
//!   enforced by our own timer, so a hung plugin cannot hang the caller. A deadline is our
//!   own typed [`Elapsed`], never guessed from a status code.
//! - **Retries that actually happen**, bounded by attempts, a total budget and a retry budget
//!   shared by the client, with exponential backoff and jitter — and never for
//!   UNIMPLEMENTED, INVALID_ARGUMENT or Probe. The whole policy is one table:
//!   [`policy`].
//! - **Every error is classified once** into an [`ErrorClass`] ("already done", "retry",
//!   "retry elsewhere", "uncertain", "fatal") and names the RPC, volume and node, and a node
//!   call's staging and target paths. A deadline
//!   or lost connection on a mutating RPC is *uncertain*, not *failed*. An answer we could
//!   not use (over the [`MAX_ANSWER_BYTES`] decode limit, undecodable, an HTTP error page
//!   instead of gRPC, invalid fields) is never taken for the plugin's status code: it is
//!   uncertain on a mutation and retryable on a read. A status number gRPC does not define
//!   keeps its number.
//! - **One lazily dialled connection** per plugin ([`Connection`]) that waits for a socket the
//!   plugin has not created yet, reconnects when the plugin restarts (a request that never
//!   reached the closed connection's socket goes out on the new one), and sends
//!   `:authority localhost`. Under load (8 requests in flight on each connection) it opens
//!   more, at most four.
//! - **One call in flight per volume**, as the spec asks of the orchestrator: each attempt of
//!   an RPC about a volume waits for that volume's turn ([`VolumeTurns`]), in the order
//!   callers asked and within the call's budget, instead of drawing `ABORTED` from the plugin
//!   and a backoff pause. Clones share the turns; separately built clients of one plugin
//!   share them through [`CsiClientBuilder::volume_turns`]. A call whose volume stays busy
//!   until its budget runs out sends nothing and fails with [`ErrorKind::VolumeBusy`].
//! - **Listings to the end** ([`paging`]): `list_all_volumes` and its siblings follow
//!   `next_token` page by page, refuse a plugin whose tokens loop or never end, and start
//!   over when the plugin refuses its own token (ABORTED), as the spec says;
//!   `list_all_volumes_with_status` and `list_all_snapshots_matching` answer checked
//!   csi-structs values.
//! - **Requests are checked before sending and answers on arrival**, with errors naming the
//!   field; secrets never reach a log line, a span or an error.
//! - **Observable**: `tracing` spans per call and attempt, plus two hooks for metrics.
//!   A [`CallObserver`] ([`CsiClientBuilder::observer`]) gets the client's view: one event
//!   per attempt and per call with the failure kind and [`ErrorClass`] (a call's with the
//!   volume it names), including requests refused before sending and dials that never
//!   connected — use it to count outcomes the orchestrator acts on ("how many unpublishes
//!   ended uncertain"), or to show each call as it ends. A tower layer
//!   ([`CsiClientBuilder::layer`]) wraps the shared HTTP/2 channel and sees the wire's view:
//!   each request that reached the plugin, with its latency and final gRPC code — use
//!   [`metrics::MetricsLayer`] with [`metrics::InMemoryMetrics`] for per-RPC latency
//!   histograms and code counters in the Prometheus text format, or any tower layer of your
//!   own.
//!
//! It is not a claim tracker (see `csi-claims`) and keeps no state about volumes beyond the
//! calls in flight.
//!
//! # Choosing a runtime
//!
//! The client works on either tokio runtime. On a node with few cores, where the plugins
//! share the cores with the orchestrator, a **current-thread** runtime is the faster one under
//! load. Measured on two cores against a plugin on the same machine, Probe from 1 to 32
//! concurrent callers, it moved as many calls per second as the multi-thread runtime or more
//! at every point (the same at one caller; 1.4–1.8 times as many at 4–32 callers against the
//! csi-testkit mock, up to 1.5 times against a grpc-go plugin), and spent about 30 % less CPU
//! per call at 32 callers. The multi-thread runtime's second worker
//! competes with the plugin for the cores, and most requests go out in a system call of their
//! own (0.84 writes per call at 32 callers, against 0.13 on one thread).
//!
//! On a current-thread runtime each connection's task reads a few answers per turn (a quarter
//! of the requests in flight) rather than all the socket holds, so the callers they wake send
//! again while the rest are read: without that, one thread sends a batch and then waits for all
//! of it, and at 4–8 callers the runtime did half as well as the multi-thread one.
//!
//! The figures are in the repository's `benches/README.md`.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use csi_client::{CallOptions, CsiClient, Endpoint, ErrorClass, proto};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = CsiClient::new(Endpoint::from_env()?);
//!
//! let fingerprint = client.fingerprint().await?;
//! println!("{} {}", fingerprint.plugin.name, fingerprint.plugin.vendor_version);
//!
//! let node = client.node();
//! let request = proto::NodeUnpublishVolumeRequest {
//!     volume_id: "vol-1".into(),
//!     target_path: "/var/lib/csi/pods/p1/vol-1".into(),
//! };
//! match node
//!     .with_options(CallOptions::new().attempt_deadline(Duration::from_secs(30)))
//!     .node_unpublish_volume(request)
//!     .await
//! {
//!     Ok(()) => {}
//!     Err(e) if e.class() == ErrorClass::AlreadyDone => {} // already unpublished
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```

// The README is the crate's page on crates.io; its examples run as doctests with these docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod answer;
pub mod budget;
mod call;
pub mod channel;
pub mod client;
pub mod connection;
pub mod controller;
mod convert;
pub mod endpoint;
pub mod error;
pub mod fingerprint;
pub mod group_controller;
pub mod health;
pub mod identity;
pub mod inflight;
mod link;
pub mod metrics;
pub mod node;
pub mod observe;
pub mod paging;
pub mod policy;
mod service;
pub mod snapshot_metadata;
pub mod turns;
mod validate;

pub use budget::RetryBudget;
pub use channel::PluginChannel;
pub use client::{CsiClient, CsiClientBuilder};
pub use connection::{ConnectError, ConnectOptions, Connection, EndpointFault, HandshakeError};
pub use controller::{
    ControllerClient, SnapshotFilter, SnapshotPage, UNDO_CREATE_ROUNDS, undo_create_with,
};
pub use csi_proto::Rpc;
/// The CSI wire messages, for the RPCs that take or return raw messages.
pub use csi_proto::v1 as proto;
pub use csi_structs::ErrorClass;
pub use endpoint::{CSI_ENDPOINT_VAR, Endpoint, EndpointError};
pub use error::{
    CallContext, DeadlineScope, Elapsed, Error, ErrorKind, H2Code, MAX_ANSWER_BYTES,
    MAX_CONTEXT_PATH_BYTES, PathField, ResponseError, TransportFault,
};
pub use fingerprint::Fingerprint;
pub use group_controller::GroupControllerClient;
pub use health::{HealthEvent, HealthReason, HealthState, HealthWatcher};
pub use identity::{IdentityClient, Readiness};
pub use inflight::{CallInFlight, CallsInFlight, LongCalls, Waiting};
pub use node::{NodeClient, NodeExpand, NodePublish, NodeStage};
pub use observe::{AttemptEvent, CallEvent, CallObserver, CallOutcome};
pub use policy::{
    Backoff, CallOptions, CodeSet, Effect, Failure, PolicyTable, RpcPolicy, classify,
    classify_failure, default_policy,
};
pub use snapshot_metadata::{MetadataMessage, MetadataStream, SnapshotMetadataClient};
/// gRPC status codes, as carried by [`Error::code`].
pub use tonic::Code;
pub use turns::{Turn, VolumeTurns};

#[cfg(test)]
mod send_checks {
    //! Compile-only checks: the futures of the public API can be spawned.
    use super::*;

    fn is_send<T: Send>(_: &T) {}

    #[allow(dead_code)]
    fn public_futures_are_send(client: CsiClient, asked: csi_structs::confirm::AskedCapabilities) {
        is_send(&client.identity().probe());
        is_send(
            &client
                .node()
                .node_publish_volume(proto::NodePublishVolumeRequest::default()),
        );
        is_send(
            &client
                .controller()
                .create_volume(proto::CreateVolumeRequest::default()),
        );
        let id = csi_structs::ExternalVolumeId::new("v").ok();
        if let Some(id) = id {
            let secrets = csi_structs::Secrets::default();
            is_send(&client.controller().validate_volume_capabilities(
                &id,
                &asked,
                &secrets,
                csi_structs::ConfirmPolicy::Strict,
            ));
        }
        if let (Ok(volume), Ok(range)) = (
            csi_structs::ExternalVolumeId::new("v"),
            csi_structs::CapacityRange::at_least(1),
        ) {
            let secrets = csi_structs::Secrets::default();
            let controller = client.controller();
            is_send(&controller.expand(&volume, &range, None, &secrets));
            is_send(&controller.get_volume(&volume));
            is_send(&controller.create_snapshot(
                &volume,
                "s",
                &csi_structs::Parameters::default(),
                &secrets,
            ));
            is_send(&controller.list_all_snapshots_matching(&SnapshotFilter::all(), &secrets));
            is_send(&controller.list_snapshots_page(&SnapshotFilter::all(), &secrets, 0, None));
            is_send(&controller.list_all_volumes_with_status(0));
            let path = std::path::Path::new("/v");
            is_send(&client.node().expand(&NodeExpand {
                volume: &volume,
                volume_path: path,
                staging_target_path: None,
                capacity_range: Some(&range),
                capability: None,
                secrets: &secrets,
            }));
        }
        is_send(&client.fingerprint());
        is_send(
            &client
                .snapshot_metadata()
                .get_metadata_allocated(Default::default()),
        );
        fn sync_and_send<T: Send + Sync>() {}
        sync_and_send::<CsiClient>();
        sync_and_send::<Error>();
    }
}
