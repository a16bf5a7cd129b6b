//! [`BenchError`]: everything that can stop a `csi-bench` run, each naming what it was doing.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use crate::rpc::BenchRpc;

/// Why a `csi-bench` run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag value outside what the run can use.
    #[error("--{flag} {value}: {limit}")]
    BadFlag {
        /// The flag, without dashes.
        flag: &'static str,
        /// The value given.
        value: String,
        /// The limit it broke.
        limit: &'static str,
    },
    /// The mode needs a plugin and neither `--endpoint` nor `--mock` was given.
    #[error("{mode} needs a plugin: give --endpoint unix:///path.sock or --mock")]
    NoTarget {
        /// The mode that needed one.
        mode: &'static str,
    },
    /// `--endpoint` is not a CSI endpoint.
    #[error("--endpoint {endpoint:?} is not a plugin endpoint")]
    Endpoint {
        /// The text given.
        endpoint: String,
        /// Why.
        #[source]
        source: csi_client::EndpointError,
    },
    /// An id flag (`--volume-id`, `--node-id`) or an id made for the run is not a valid id.
    #[error("{what} {value:?} is not a valid id")]
    InvalidId {
        /// Which id.
        what: &'static str,
        /// The text.
        value: String,
        /// Why.
        #[source]
        source: csi_structs::ValidationErrors,
    },
    /// The tokio runtime could not be built.
    #[error("cannot start the tokio runtime")]
    Runtime(#[source] io::Error),
    /// A temporary directory could not be made.
    #[error("cannot create a temporary directory for {purpose}")]
    TempDir {
        /// What it was for.
        purpose: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The mock plugin's configuration was refused.
    #[error("the mock plugin's configuration was refused")]
    MockConfig(#[source] csi_testkit::ConfigError),
    /// The mock plugin could not be served.
    #[error("the mock plugin could not be served")]
    MockServe(#[source] csi_testkit::Error),
    /// The plugin cannot run the requested rpc's set-up and no id was given for it.
    #[error("rpc {rpc}: {reason}")]
    Unsupported {
        /// The rpc asked for.
        rpc: BenchRpc,
        /// What is missing, and which flag supplies it.
        reason: &'static str,
    },
    /// A set-up or clean-up call failed (creating, publishing or deleting the bench volumes,
    /// asking the plugin's capabilities or node id).
    #[error("{step} failed")]
    Setup {
        /// The step.
        step: &'static str,
        /// The client's error (class, rpc, volume).
        #[source]
        source: Box<csi_client::Error>,
    },
    /// A call failed; the run stops at the first failure.
    #[error("rpc {rpc}: {phase} call #{index} failed")]
    Call {
        /// The rpc.
        rpc: BenchRpc,
        /// `warm-up` or `measured`.
        phase: &'static str,
        /// Which call (0-based, counted across all callers).
        index: u64,
        /// The client's error (class, rpc, volume).
        #[source]
        source: Box<csi_client::Error>,
    },
    /// A caller task panicked or was cancelled.
    #[error("a caller task of rpc {rpc} did not finish")]
    CallerTask {
        /// The rpc.
        rpc: BenchRpc,
    },
    /// A step of the raw socket baseline failed.
    #[error("baseline ping-pong: {step}")]
    Baseline {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A child process (ping-pong peer or mock server) could not be started or failed.
    #[error("child process {exe} ({role}) failed: {status}")]
    Child {
        /// The executable re-executed.
        exe: PathBuf,
        /// What the child was for.
        role: &'static str,
        /// How it ended.
        status: ExitStatus,
    },
    /// A child process could not be started.
    #[error("cannot start child process {exe} ({role})")]
    Spawn {
        /// The executable re-executed.
        exe: PathBuf,
        /// What the child was for.
        role: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The child's socket did not appear in time.
    #[error("child process ({role}) did not create {path} within {waited_ms} ms")]
    ChildSocket {
        /// What the child was for.
        role: &'static str,
        /// The socket it should have created.
        path: PathBuf,
        /// How long we waited.
        waited_ms: u64,
    },
    /// `/proc/<pid>/statm` could not be read or parsed (Linux only).
    #[error("cannot read resident memory from {path}: {detail}")]
    Statm {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The release machine refused a claim the run made.
    #[error("claims bench: claim refused")]
    ClaimRefused(#[source] Box<csi_claims::ClaimError>),
    /// The release machine refused a release the run asked for.
    #[error("claims bench: release refused")]
    ReleaseRefused(#[source] Box<csi_claims::ReleaseError>),
    /// The claims driver failed (start, claim or release).
    #[error("claims bench: the driver failed at {step}")]
    ClaimsDriver {
        /// The step.
        step: &'static str,
        /// The driver's error.
        #[source]
        source: Box<csi_claims::driver::DriverError>,
    },
    /// The claim store failed when the driver started.
    #[error("claims bench: the claim store failed")]
    ClaimsStore(#[source] Box<csi_claims::StoreError>),
    /// A claim the run released did not end freed.
    #[error("claims bench: the claim of {workload} on {volume} ended {state:?}, not freed")]
    NotFreed {
        /// The volume.
        volume: String,
        /// The workload.
        workload: String,
        /// The state it ended in.
        state: Box<csi_claims::ClaimState>,
    },
    /// `etcd` could not be started for `--claims-etcd`.
    #[error(
        "cannot start etcd for --claims-etcd: {step}: {detail} (install it, e.g. Debian's \
         etcd-server package, or give --etcd-endpoints)"
    )]
    EtcdStart {
        /// The step.
        step: &'static str,
        /// Why.
        detail: String,
    },
    /// A request the etcd bench makes itself (not through the claim store) failed.
    #[error("claims-etcd bench: etcd at {endpoints} failed to {operation}: {detail}")]
    EtcdRequest {
        /// The endpoints, comma-separated.
        endpoints: String,
        /// What the bench asked for.
        operation: &'static str,
        /// Why.
        detail: String,
    },
    /// A phase of the etcd bench made no progress for too long.
    #[error(
        "claims-etcd bench: the {phase} phase made no progress for {waited:?}: {done} of \
         {total} done; {stuck}"
    )]
    Stalled {
        /// `claim` or `release`.
        phase: &'static str,
        /// Claims or releases done.
        done: u64,
        /// Claims or releases asked for.
        total: u64,
        /// How long nothing finished.
        waited: std::time::Duration,
        /// What the first agent reports stuck.
        stuck: String,
    },
    /// A claim or release was still answered "try again" after many attempts.
    #[error(
        "claims-etcd bench: the {what} of {workload} on {volume} was still refused after \
         {attempts} attempts"
    )]
    GaveUp {
        /// `claim` or `release`.
        what: &'static str,
        /// The volume.
        volume: String,
        /// The workload.
        workload: String,
        /// Attempts made.
        attempts: u32,
        /// The last answer.
        #[source]
        source: Box<csi_claims::driver::DriverError>,
    },
    /// The child that measures an agent loading the claims failed or printed something else.
    #[error("claims-etcd bench: the memory child {detail}")]
    MemoryChild {
        /// What went wrong.
        detail: String,
    },
    /// The controller duty's lease timing was refused.
    #[error("claims-etcd bench: the controller duty's timing was refused")]
    DutyTiming(#[source] csi_claims::duty::DutyTimingError),
    /// With `--etcd-duty fenced`, agent 0 did not win the controller duty in time.
    #[error(
        "claims-etcd bench: agent {agent} did not take the controller duty within {waited:?} \
         (leader as it knows it: {leader:?})"
    )]
    DutyNotWon {
        /// The agent campaigning.
        agent: String,
        /// How long the bench waited.
        waited: std::time::Duration,
        /// Who held the duty, as the campaign last heard.
        leader: Option<String>,
    },
    /// Volume records were still in etcd after every claim was freed.
    #[error(
        "claims-etcd bench: {records} volume records left under {prefix} after every claim \
         was freed"
    )]
    Leftover {
        /// The bench's key prefix.
        prefix: String,
        /// How many records.
        records: usize,
    },
    /// A shim token could not be made.
    #[error("shim hop bench: a token was refused")]
    ShimToken(#[source] csi_rpc_shim::TokenError),
    /// Agent b's loopback listener could not be set up.
    #[error("shim hop bench: {step}")]
    ShimListener {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A direct csi-client call of the hop bench failed.
    #[error("shim hop bench: a {path} call failed")]
    DirectCall {
        /// Which path was measured.
        path: &'static str,
        /// The client's error.
        #[source]
        source: Box<csi_client::Error>,
    },
    /// A call through a shim failed.
    #[error("shim hop bench: a {path} call failed")]
    ShimCall {
        /// Which path was measured.
        path: &'static str,
        /// The shim's error.
        #[source]
        source: Box<csi_rpc_shim::ShimError>,
    },
    /// A call of the hop bench did not answer within its limit.
    #[error("shim hop bench: a {path} call did not answer within {limit:?}")]
    ShimCallHung {
        /// Which path was measured.
        path: &'static str,
        /// The limit.
        limit: std::time::Duration,
    },
    /// Agent a served calls itself instead of sending them to agent b.
    #[error("shim hop bench: agent a sent {sent} calls to agent b, expected {expected}")]
    NotForwarded {
        /// Calls sent.
        sent: u64,
        /// Calls made.
        expected: u64,
    },
    /// The bare tonic client of `--compare` could not connect.
    #[error("compare: the bare tonic client could not connect")]
    RawConnect(#[source] csi_testkit::Error),
    /// A Probe of the bare tonic client failed.
    #[error("compare: bare tonic Probe #{index} failed with {code:?}: {message}")]
    RawCall {
        /// Which call (warm-up included).
        index: u64,
        /// The gRPC code.
        code: csi_client::Code,
        /// The plugin's message.
        message: String,
    },
    /// The bare hyper HTTP/2 connection of `--compare` could not be opened.
    #[error("compare: the hyper-h2 client could not open {path}")]
    H2Connect {
        /// The socket path.
        path: std::path::PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP/2 handshake of the bare hyper connection failed.
    #[error("compare: the hyper-h2 client's HTTP/2 handshake failed")]
    H2Handshake(#[source] hyper::Error),
    /// A peer program of `--compare-peer` (gobench, goserver, the mock plugin) failed or
    /// printed something that is not a result line.
    #[error("compare-peer: {program} {detail}")]
    Peer {
        /// The program's path.
        program: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// A step of `--agent-claims` failed: starting or waiting for the agent or the mock
    /// plugin, creating the bench's volumes, a client task.
    #[error("agent-claims: {step}: {detail}")]
    AgentClaims {
        /// The step.
        step: &'static str,
        /// What went wrong (with the tail of a child's log when it died).
        detail: String,
    },
    /// `--agent-claims` ran to the end but counts errors or made no op: its result line is
    /// printed all the same (see [`BenchError::result_line`]), and the run fails.
    #[error(
        "agent-claims: {errors} error answer(s) and {ops} measured op(s); the first error is \
         above on stderr, the run's line on stdout"
    )]
    AgentClaimsFailed {
        /// The result line, printed on stdout before the error.
        line: String,
        /// Errors counted.
        errors: u64,
        /// Ops measured.
        ops: u64,
    },
    /// `/proc/<pid>/stat` could not be read or parsed (Linux only).
    #[error("cannot read CPU time from {path}: {detail}")]
    Stat {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
}

impl BenchError {
    /// The result line a failed run still prints on stdout (`--agent-claims` with errors or
    /// no op), if any.
    pub fn result_line(&self) -> Option<&str> {
        match self {
            BenchError::AgentClaimsFailed { line, .. } => Some(line),
            _ => None,
        }
    }
}
