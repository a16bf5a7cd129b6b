//! How long the agent lets one node detach call (`NodeUnpublishVolume`, `NodeUnstageVolume`)
//! wait for a node plugin that is not there: the one place these numbers live.
//!
//! csi-client's defaults suit a caller that has nobody else to retry for it: a dial waits up
//! to [`ConnectOptions::DEFAULT`]'s 30 s for a missing socket, and "not connected" is retried
//! up to the mutation row's four attempts, so one call against a missing node plugin takes
//! about two minutes (4 × 30 s plus backoff) before it answers
//! [`RetryElsewhere`](csi_structs::ErrorClass::RetryElsewhere).
//!
//! The release pipeline has somebody: csi-claims' driver is the retry loop for every release
//! step. It backs off per volume with jitter and a cap, is woken early when the plugin or the
//! node comes back, and shows every failed attempt in `stuck()`. Waiting inside the call only
//! hides the missing plugin from that loop and holds the volume's one release slot, so the
//! agent's node detach calls use [`NodeDetachPolicy`] instead: a short socket wait and one
//! attempt, and the driver hears "plugin missing" after about a second.

use std::time::Duration;

use csi_client::{ConnectOptions, CsiClient, CsiClientBuilder, Endpoint, Rpc};

/// The node detach RPCs the policy applies to.
pub const NODE_DETACH_RPCS: [Rpc; 2] = [Rpc::NodeUnpublishVolume, Rpc::NodeUnstageVolume];

/// How the agent's node detach calls treat a node plugin that does not answer.
///
/// Applied to a client with [`apply`](Self::apply) or [`client`](Self::client): the socket
/// wait of its connection and the policy rows of the two RPCs. Those rows are then the one
/// place the limits live; nothing overrides them per call.
///
/// ```
/// use csi_node::detach::NodeDetachPolicy;
/// use csi_client::{CsiClient, Rpc};
///
/// # fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let policy = NodeDetachPolicy::DEFAULT;
/// let client = policy.client("unix:///run/csi/node.sock".parse()?);
/// assert_eq!(client.policies().get(Rpc::NodeUnpublishVolume).max_attempts, 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeDetachPolicy {
    /// How long one dial waits for the node plugin's socket to appear or accept.
    pub socket_wait: Duration,
    /// Attempts per node detach call, the first included: from 1 to
    /// [`MAX_ATTEMPTS`](Self::MAX_ATTEMPTS) ([`check_attempts`](Self::check_attempts)).
    pub max_attempts: u32,
    /// Deadline of one attempt, and (times the attempts) of the whole call.
    pub attempt_deadline: Duration,
}

impl NodeDetachPolicy {
    /// The agent's defaults:
    ///
    /// - `socket_wait` **1 s**. A plugin that restarts unlinks and binds its socket again in
    ///   milliseconds, and `serve` notices a vanished socket within its 1 s scan, so a second
    ///   covers a restart in progress. A plugin gone for longer is the driver's to wait for:
    ///   its backoff starts at 1 s anyway and it is woken when the plugin is healthy again.
    /// - `max_attempts` **1**. The driver retries every release step (UNAVAILABLE, ABORTED,
    ///   a deadline, a missing plugin) with its own backoff and records each attempt; a
    ///   retry loop inside the call would only multiply the wait and hide the attempts.
    /// - `attempt_deadline` **2 min**, csi-client's (and kubelet's) deadline for a node
    ///   mutation: a plugin that does answer may need that long to unmount, and cutting it
    ///   shorter would turn slow unmounts into uncertain outcomes.
    ///
    /// So a missing node plugin is reported after about one `socket_wait` instead of about
    /// two minutes.
    pub const DEFAULT: NodeDetachPolicy = NodeDetachPolicy {
        socket_wait: Duration::from_secs(1),
        max_attempts: 1,
        attempt_deadline: Duration::from_secs(120),
    };

    /// The most attempts a node detach call may make. More would only hold the volume's
    /// release slot longer: the release driver retries beyond it with its own backoff.
    pub const MAX_ATTEMPTS: u32 = 10;

    /// `attempts` if it is a usable [`max_attempts`](Self::max_attempts): from 1 to
    /// [`MAX_ATTEMPTS`](Self::MAX_ATTEMPTS).
    ///
    /// # Errors
    ///
    /// [`AttemptsOutOfRange`] with the value, when it is 0 or above the maximum.
    pub fn check_attempts(attempts: u32) -> Result<u32, AttemptsOutOfRange> {
        if (1..=Self::MAX_ATTEMPTS).contains(&attempts) {
            Ok(attempts)
        } else {
            Err(AttemptsOutOfRange { attempts })
        }
    }

    /// The whole call's budget: every attempt's deadline (pauses between attempts are cut
    /// from the last one by csi-client).
    pub fn total_budget(&self) -> Duration {
        self.attempt_deadline
            .saturating_mul(self.max_attempts.max(1))
    }

    /// csi-client's connect options with this socket wait (the rest as
    /// [`ConnectOptions::DEFAULT`]).
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            socket_wait: self.socket_wait,
            ..ConnectOptions::DEFAULT
        }
    }

    /// `builder` with this socket wait and with the policy rows of [`NODE_DETACH_RPCS`]
    /// changed to these attempts and deadlines (never longer than the rows already were).
    pub fn apply(&self, builder: CsiClientBuilder) -> CsiClientBuilder {
        let mut builder = builder.connect_options(self.connect_options());
        let total = self.total_budget();
        for rpc in NODE_DETACH_RPCS {
            let policy = *self;
            builder = builder.policy(rpc, move |p| {
                p.max_attempts = policy.max_attempts.max(1);
                p.attempt_deadline = p.attempt_deadline.min(policy.attempt_deadline);
                p.total_budget = p.total_budget.min(total).max(p.attempt_deadline);
            });
        }
        builder
    }

    /// A client of `endpoint` for node detach calls ([`apply`](Self::apply) on a fresh
    /// builder). Dials nothing yet.
    pub fn client(&self, endpoint: Endpoint) -> CsiClient {
        self.apply(CsiClient::builder(endpoint)).build()
    }
}

/// An attempt count for node detach calls outside 1 to [`NodeDetachPolicy::MAX_ATTEMPTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{attempts} attempts per node detach call: must be from 1 to {max}",
    max = NodeDetachPolicy::MAX_ATTEMPTS
)]
pub struct AttemptsOutOfRange {
    /// The count given.
    pub attempts: u32,
}

impl Default for NodeDetachPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_changes_the_detach_rows_and_nothing_else() {
        let policy = NodeDetachPolicy {
            socket_wait: Duration::from_millis(300),
            max_attempts: 2,
            attempt_deadline: Duration::from_secs(10),
        };
        let client = policy.client(Endpoint::unix("/nonexistent/node.sock").expect("valid path"));
        for rpc in NODE_DETACH_RPCS {
            let row = client.policies().get(rpc);
            assert_eq!(row.max_attempts, 2, "{rpc:?}");
            assert_eq!(row.attempt_deadline, Duration::from_secs(10), "{rpc:?}");
            assert_eq!(row.total_budget, Duration::from_secs(20), "{rpc:?}");
        }
        let stage = client.policies().get(Rpc::NodeStageVolume);
        assert_eq!(stage, csi_client::default_policy(Rpc::NodeStageVolume));
        assert_eq!(policy.connect_options().socket_wait, policy.socket_wait);
    }

    #[test]
    fn attempts_are_checked_against_the_bound() {
        let max = NodeDetachPolicy::MAX_ATTEMPTS;
        for ok in [1, 3, max] {
            assert_eq!(NodeDetachPolicy::check_attempts(ok), Ok(ok));
        }
        for bad in [0, max + 1, u32::MAX] {
            let e = NodeDetachPolicy::check_attempts(bad).unwrap_err();
            assert_eq!(e, AttemptsOutOfRange { attempts: bad });
            assert!(e.to_string().contains(&format!("from 1 to {max}")), "{e}");
        }
        NodeDetachPolicy::check_attempts(NodeDetachPolicy::DEFAULT.max_attempts)
            .expect("the default is within the bound");
    }

    #[test]
    fn the_default_is_shorter_than_csi_clients() {
        let client_default = csi_client::default_policy(Rpc::NodeUnpublishVolume);
        let ours = NodeDetachPolicy::DEFAULT;
        assert!(ours.socket_wait < ConnectOptions::DEFAULT.socket_wait);
        assert!(ours.max_attempts < client_default.max_attempts);
        assert!(ours.total_budget() < client_default.total_budget);
        assert_eq!(ours.attempt_deadline, client_default.attempt_deadline);
    }
}
