//! What the claim layer knows about a volume, and the record stored per volume.

use csi_structs::{Capabilities, ExternalVolumeId, PluginId, VolumeId, WorkloadId};
use serde::{Deserialize, Serialize};

use super::claim::Claim;

/// Whether releasing a claim needs a `ControllerUnpublishVolume` call.
///
/// Comes from the plugin's controller capability `PUBLISH_UNPUBLISH_VOLUME`; decided by the
/// layer that fingerprints plugins, recorded with the volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControllerRequirement {
    /// The plugin publishes volumes to nodes through its controller; releases end with
    /// `ControllerUnpublishVolume`.
    Required,
    /// The plugin has no controller publish step; the controller step is skipped.
    NotRequired,
}

impl ControllerRequirement {
    /// The requirement of a plugin with `capabilities` (its fingerprint): `Required` when it
    /// offers the Controller service with `PUBLISH_UNPUBLISH_VOLUME`.
    ///
    /// ```
    /// use csi_claims::ControllerRequirement;
    /// use csi_structs::Capabilities;
    ///
    /// // A node-only plugin: no controller step.
    /// assert_eq!(
    ///     ControllerRequirement::of(&Capabilities::default()),
    ///     ControllerRequirement::NotRequired
    /// );
    /// ```
    pub fn of(capabilities: &Capabilities) -> Self {
        if capabilities.plugin.has_controller_service()
            && capabilities.controller.requires_controller_publish()
        {
            ControllerRequirement::Required
        } else {
            ControllerRequirement::NotRequired
        }
    }
}

/// What the claim layer must know about a volume to release claims on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The orchestrator's id.
    pub id: VolumeId,
    /// The plugin's id, sent in every detach call.
    pub external_id: ExternalVolumeId,
    /// The plugin serving the volume.
    pub plugin: PluginId,
    /// Whether releases need a controller step.
    pub controller: ControllerRequirement,
}

/// All claims on one volume: the unit that is stored and compare-and-swapped.
///
/// Accounting is per volume, so every decision about a volume reads and writes one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRecord {
    pub(crate) info: VolumeInfo,
    pub(crate) claims: Vec<Claim>,
}

impl VolumeRecord {
    /// A record with no claims yet.
    pub(crate) fn new(info: VolumeInfo) -> Self {
        Self {
            info,
            claims: Vec::new(),
        }
    }

    /// The volume.
    pub fn info(&self) -> &VolumeInfo {
        &self.info
    }

    /// Every claim not yet freed, in the order they were made.
    pub fn claims(&self) -> &[Claim] {
        &self.claims
    }

    /// The claim held by `workload`, if any.
    pub fn claim(&self, workload: &WorkloadId) -> Option<&Claim> {
        self.claims.iter().find(|c| &c.workload == workload)
    }

    pub(crate) fn position(&self, workload: &WorkloadId) -> Option<usize> {
        self.claims.iter().position(|c| &c.workload == workload)
    }
}
