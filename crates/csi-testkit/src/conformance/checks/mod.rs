//! The checks, one concern per file, and the dispatch from [`Check`] to code.

mod condition;
mod consistency;
mod idempotent;
mod identity;
mod limits;
mod mutable;
mod node;
mod not_found;
mod pagination;
mod required;
mod secrets;
mod validate;

use super::Check;
use super::ctx::{Ctx, Step};

/// Runs one check. Cleanup of what it created is the caller's job.
pub(crate) async fn run(ctx: &mut Ctx, check: Check) -> Step {
    match check {
        Check::PluginInfo => identity::plugin_info(ctx).await,
        Check::Probe => identity::probe(ctx).await,
        Check::CapabilitiesCoherent => identity::capabilities_coherent(ctx).await,
        Check::NodeGetInfo => identity::node_get_info(ctx).await,
        Check::AdvertisedRpcsAnswer => consistency::advertised_answer(ctx).await,
        Check::UnadvertisedRpcsUnimplemented => consistency::unadvertised_unimplemented(ctx).await,
        Check::RequiredFields(rpc) => required::check(ctx, rpc).await,
        Check::NotFound(rpc) => not_found::check(ctx, rpc).await,
        Check::Idempotent(rpc) => idempotent::check(ctx, rpc).await,
        Check::Pagination(rpc) => pagination::check(ctx, rpc).await,
        Check::ValidateConfirms => validate::confirms(ctx).await,
        Check::NodeLifecycle => node::lifecycle(ctx).await,
        Check::SecretsPassedThrough => secrets::passed_through(ctx).await,
        Check::SizeLimits => limits::string_sizes(ctx).await,
        Check::MutableParameterKeys => mutable::keys(ctx).await,
        Check::ControllerVolumeCondition => condition::controller(ctx).await,
        Check::NodeVolumeCondition => condition::node(ctx).await,
    }
}
