//! CSI v1.13 wire types and tonic stubs for all five CSI services.
//!
//! This crate is the edge of the workspace: prost messages, tonic clients and servers for
//! Identity, Controller, Node, GroupController and SnapshotMetadata, generated from
//! `proto/csi.proto` (package `csi.v1`, spec v1.13.0 plus the v1.12 volume-condition elements
//! that v1.13 reserved, so health reports from older plugins still decode).
//!
//! It is not a domain model: no validation, no conversions, and no I/O beyond [`pace`], a
//! wrapper that reads an HTTP/2 connection a few messages at a time. Upper crates speak
//! `csi-structs` types and keep these at the edge. The tonic stubs sit behind the default `grpc`
//! feature; `default-features = false` gives the messages alone, with no gRPC runtime in the
//! dependency tree (that is how `csi-structs` uses this crate).
//!
//! # How the code is generated
//!
//! `build.rs` compiles the proto with [protox](https://docs.rs/protox), a pure-Rust protobuf
//! compiler, and hands the descriptor to `tonic-prost-build`. We chose a build-time compiler over
//! checked-in generated code because the redaction of secrets is *derived* from the descriptor:
//! every build reads the `(csi_secret)` option afresh, so a field marked secret in the proto can
//! never be printed by a stale hand-kept list, and nothing needs `protoc` on the machine.
//! The generated clients and servers encode and decode with [`codec::CsiCodec`]: prost's
//! codec with first buffers of 1 KiB rather than tonic's 8 KiB.
//!
//! # Secrets
//!
//! Every message with a `(csi_secret)` field gets a hand-shaped `Debug` that prints the secret
//! map's keys but never a value; [`SECRET_FIELDS`] lists those fields.
//!
//! ```
//! use csi_proto::v1::NodeStageVolumeRequest;
//!
//! let mut req = NodeStageVolumeRequest {
//!     volume_id: "vol-1".into(),
//!     ..Default::default()
//! };
//! req.secrets.insert("password".into(), "hunter2".into());
//! let printed = format!("{req:?}");
//! assert!(printed.contains("vol-1") && printed.contains("password"));
//! assert!(!printed.contains("hunter2"));
//! ```

// The README is the crate's page on crates.io; its examples run as doctests with these docs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

use std::collections::BTreeMap;
use std::fmt;

pub mod pluginregistration {
    //! Kubelet's plugin registration protocol, version 1: the messages, and with the `grpc`
    //! feature the `Registration` client and server. A node-driver-registrar sidecar serves it
    //! on a socket in kubelet's registration directory; csi-node's `kubelet` module dials it.
    #![allow(
        missing_docs,
        clippy::all,
        unreachable_pub,
        missing_debug_implementations
    )]
    include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));
}

/// Messages, enums, clients (`*_client`) and servers (`*_server`) of package `csi.v1`.
///
/// The clients and servers exist with the `grpc` feature (on by default); without it this is
/// the prost messages and enums only.
#[allow(missing_docs, clippy::all, unreachable_pub)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.rs"));
}

#[cfg(feature = "grpc")]
pub mod codec;
#[cfg(feature = "grpc")]
pub mod pace;

include!(concat!(env!("OUT_DIR"), "/secret_debug.rs"));
include!(concat!(env!("OUT_DIR"), "/rpcs.rs"));

/// The CSI spec version this crate's schema follows.
pub const SPEC_VERSION: &str = "1.13.0";

/// The protobuf package of every CSI message and service.
pub const PACKAGE: &str = "csi.v1";

/// The encoded `FileDescriptorSet` of `csi.proto` and its imports, options included.
///
/// Useful for reflection and for tests that check the schema itself.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/csi_descriptor.bin"));

/// A `Debug` view of a secret map that prints its keys and hides every value.
///
/// The one rendering of a secret map in the workspace: the generated `Debug` of every message
/// with a `(csi_secret)` field and `csi_structs::Secrets` both print through it. The
/// placeholder is unquoted so it cannot be mistaken for a value.
///
/// Keys are printed in sorted order so the output is stable.
///
/// ```
/// use std::collections::HashMap;
/// let secrets = HashMap::from([("token".to_string(), "s3cr3t".to_string())]);
/// let shown = format!("{:?}", csi_proto::Redacted(&secrets));
/// assert_eq!(shown, r#"{"token": <redacted>}"#);
/// ```
pub struct Redacted<'a, M>(pub &'a M);

/// Maps whose keys [`Redacted`] can list.
pub trait SecretKeys {
    /// The keys, in any order.
    fn secret_keys(&self) -> Vec<&str>;
}

impl<S> SecretKeys for std::collections::HashMap<String, String, S> {
    fn secret_keys(&self) -> Vec<&str> {
        self.keys().map(String::as_str).collect()
    }
}

impl SecretKeys for BTreeMap<String, String> {
    fn secret_keys(&self) -> Vec<&str> {
        self.keys().map(String::as_str).collect()
    }
}

impl<M: SecretKeys> fmt::Debug for Redacted<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys = self.0.secret_keys();
        keys.sort_unstable();
        let mut map = f.debug_map();
        for key in keys {
            map.entry(&key, &format_args!("<redacted>"));
        }
        map.finish()
    }
}

impl<M> fmt::Display for Redacted<'_, M>
where
    Self: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
