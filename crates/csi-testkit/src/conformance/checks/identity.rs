//! Identity: GetPluginInfo, Probe, capability coherence, NodeGetInfo.

use csi_proto::v1;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;

use crate::conformance::PluginIdentity;
use crate::conformance::caps::Gate;
use crate::conformance::ctx::{Ctx, Step, Stop, verdict};

/// The longest plugin name the spec allows.
const MAX_PLUGIN_NAME: usize = 63;
/// The longest node id the spec allows, in bytes.
const MAX_NODE_ID_BYTES: usize = 256;

/// Why `name` is not a valid plugin name (domain-name style, ≤63 characters), if it is not.
pub(crate) fn plugin_name_problem(name: &str) -> Option<String> {
    let chars: Vec<char> = name.chars().collect();
    let (Some(first), Some(last)) = (chars.first(), chars.last()) else {
        return Some("name is empty".into());
    };
    if chars.len() > MAX_PLUGIN_NAME {
        return Some(format!(
            "name {name:?} has {} characters, at most {MAX_PLUGIN_NAME} allowed",
            chars.len()
        ));
    }
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Some(format!(
            "name {name:?} must start and end with an ASCII letter or digit"
        ));
    }
    if let Some(bad) = chars
        .iter()
        .find(|c| !(c.is_ascii_alphanumeric() || **c == '-' || **c == '.'))
    {
        return Some(format!(
            "name {name:?} contains {bad:?}; only letters, digits, '-' and '.' are allowed"
        ));
    }
    None
}

pub(crate) async fn plugin_info(ctx: &mut Ctx) -> Step {
    let info = ctx.get_plugin_info(v1::GetPluginInfoRequest {}).await?;
    ctx.plugin = Some(PluginIdentity {
        name: info.name.clone(),
        vendor_version: info.vendor_version.clone(),
    });
    let mut problems: Vec<String> = plugin_name_problem(&info.name).into_iter().collect();
    if info.vendor_version.is_empty() {
        problems.push("vendor_version is empty".into());
    }
    verdict(problems)
}

pub(crate) async fn probe(ctx: &mut Ctx) -> Step {
    let response = ctx.probe(v1::ProbeRequest {}).await?;
    match response.ready {
        Some(false) => Err(Stop::fail("Probe answered ready=false")),
        Some(true) | None => Ok(()),
    }
}

pub(crate) async fn capabilities_coherent(ctx: &mut Ctx) -> Step {
    let caps = &ctx.caps;
    let mut problems = caps.problems.clone();
    // The rules of spec §3.8 are csi-structs'; the suite adds only the node id one below.
    problems.extend(
        caps.structs()
            .rule_violations()
            .iter()
            .map(ToString::to_string),
    );
    if caps.has_controller(CtrlCap::PublishUnpublishVolume)
        && ctx.require(Gate::NodeService).is_ok()
        && ctx.node_id.is_none()
    {
        problems
            .push("PUBLISH_UNPUBLISH_VOLUME is advertised but NodeGetInfo gave no node id".into());
    }
    verdict(problems)
}

pub(crate) async fn node_get_info(ctx: &mut Ctx) -> Step {
    ctx.require(Gate::NodeService)?;
    let info = ctx.node_get_info(v1::NodeGetInfoRequest {}).await?;
    let mut problems = Vec::new();
    if info.node_id.is_empty() {
        problems.push("node_id is empty".to_owned());
    } else if info.node_id.len() > MAX_NODE_ID_BYTES {
        problems.push(format!(
            "node_id has {} bytes, at most {MAX_NODE_ID_BYTES} allowed",
            info.node_id.len()
        ));
    }
    if info.max_volumes_per_node < 0 {
        problems.push(format!(
            "max_volumes_per_node is negative ({})",
            info.max_volumes_per_node
        ));
    }
    if info.accessible_topology.is_some()
        && !ctx
            .caps
            .plugin
            .contains(&PluginCap::VolumeAccessibilityConstraints)
    {
        problems.push("accessible_topology is set without VOLUME_ACCESSIBILITY_CONSTRAINTS".into());
    }
    verdict(problems)
}

#[cfg(test)]
mod tests {
    use super::plugin_name_problem;

    #[test]
    fn plugin_names() {
        for good in ["a", "mock.csi.example.com", "x-1.y", &"a".repeat(63)] {
            assert_eq!(plugin_name_problem(good), None, "{good}");
        }
        for bad in ["", "-a", "a.", "a_b", "a b", "ä", &"a".repeat(64)] {
            assert!(plugin_name_problem(bad).is_some(), "{bad}");
        }
    }
}
