//! Cluster mode (cargo feature `etcd`, `--store etcd://...`): agents share one etcd.
//!
//! Under the key prefix (`/csi-agent` by default):
//! - `claims/<volume>`: the claims of each volume (csi-claims' `EtcdStore`), so a claim is
//!   admitted against every agent's claims of the volume in one compare-and-swap;
//! - `volumes/<volume>`: the volume book (csi-control's `EtcdCatalog`), so every agent sees
//!   every volume exactly once;
//! - `members/<node>`, `gone/<node>` and `leader/controller-duty`: csi-control's
//!   [`Membership`] (see [`csi_control::cluster`]): each agent's record under a lease, which
//!   replaces the static `--peer` list; the nodes an operator reported gone for good (`volume
//!   detach --node-gone`: every agent's driver skips their node steps, so the duty holder runs
//!   the controller step without them); and the agent that performs controller-side release
//!   steps (one at a time, elected; another takes over within the lease TTL when it dies).
//!
//! csi-control's front door joins the membership and follows the other members into the
//! routing (`ControlPlaneBuilder::cluster`); what is the agent's own stays here: what it says
//! of itself in its record beside the routing's address and its plugins (its control API,
//! `http`: the record has the fields an older agent's had, and each reads the other's), and the
//! `status` view of the cluster ([`Cluster`], the agent's [`ClusterStatus`]).
//!
//! Node-side release steps stay with the node's own agent.

use std::sync::Arc;
use std::time::Duration;

use csi_claims::duty::Duty;
use csi_control::Membership;
use csi_control::peers::NodeAbout;

use super::agent::ClusterStatus;
use crate::config::EtcdSettings;
use crate::ops::api;

/// The field of a member record that holds an agent's control API address.
pub const HTTP_FIELD: &str = "http";

/// This agent in the cluster: its membership (the control plane's), and how `status` names
/// the store.
#[derive(Debug)]
pub struct Cluster {
    /// This agent's membership, the other members, and the controller duty.
    pub membership: Arc<Membership<NodeAbout>>,
    /// The store as the operator wrote it ([`EtcdSettings::display`]).
    store: String,
    /// The key prefix.
    prefix: String,
}

impl Cluster {
    /// The `status` view of `membership`, joined with `settings`.
    pub fn new(membership: Arc<Membership<NodeAbout>>, settings: &EtcdSettings) -> Self {
        Self {
            membership,
            store: settings.display(),
            prefix: settings.store.prefix.clone(),
        }
    }
}

/// This agent's hold on the controller duty, as `status` shows it.
fn duty_view(duty: &Duty) -> api::DutyView {
    // The driver's clock (tokio's, which tests may pause).
    let now = tokio::time::Instant::now();
    let left = duty
        .until()
        .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
    api::DutyView {
        holds: duty.holds(now),
        confirmed_for_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        revision: duty.fence().revision,
    }
}

impl ClusterStatus for Cluster {
    fn view(&self) -> api::ClusterView {
        let m = &self.membership;
        api::ClusterView {
            store: self.store.clone(),
            prefix: self.prefix.clone(),
            controller_duty: m.duty_holder(),
            held_duty: m.held_duty().map(|duty| duty_view(&duty)),
            members: m
                .members()
                .into_iter()
                .map(|r| api::MemberView {
                    me: r.node == m.me().as_str(),
                    node: r.node,
                    http: r
                        .about
                        .extra
                        .get(HTTP_FIELD)
                        .and_then(|v| v.as_str())
                        .unwrap_or_default()
                        .to_owned(),
                    shim: r.about.shim,
                    plugins: r.about.plugins.into_iter().map(|p| p.id).collect(),
                })
                .collect(),
            outage: m.outage(),
        }
    }
}
