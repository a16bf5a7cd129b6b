//! The rpcs `csi-bench` can drive, what each needs set up first (volumes, a node id), and one
//! measured call of each.

use std::fmt;

use csi_client::{CsiClient, proto};
use csi_structs::confirm::AskedCapabilities;
use csi_structs::{
    AccessMode, ConfirmPolicy, ExternalVolumeId, MountOptions, PluginNodeId, Secrets,
    VolumeCapability, VolumeContext,
};

use crate::error::BenchError;

/// An rpc `csi-bench` drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchRpc {
    /// Identity `Probe`.
    Probe,
    /// Node `NodeGetCapabilities`.
    Nodecaps,
    /// Controller `ValidateVolumeCapabilities` of one volume (created for the run unless
    /// `--volume-id` is given).
    Validate,
    /// Controller `ControllerPublishVolume`, repeated (idempotent) on one volume per caller
    /// (created for the run unless `--volume-id` is given).
    Publish,
}

impl BenchRpc {
    /// The name printed in the result line.
    pub const fn name(self) -> &'static str {
        match self {
            BenchRpc::Probe => "probe",
            BenchRpc::Nodecaps => "nodecaps",
            BenchRpc::Validate => "validate",
            BenchRpc::Publish => "publish",
        }
    }
}

impl fmt::Display for BenchRpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The capability every bench volume is created, validated and published with.
pub fn bench_capability() -> VolumeCapability {
    VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new())
}

/// What the measured calls of a run use: the volumes (one per caller for `publish`), the node,
/// and what the set-up made that the clean-up must undo.
#[derive(Debug)]
pub struct Plan {
    rpc: BenchRpc,
    volumes: Vec<ExternalVolumeId>,
    node: Option<PluginNodeId>,
    created: Vec<ExternalVolumeId>,
    published: Vec<ExternalVolumeId>,
    asked: AskedCapabilities,
    capability: VolumeCapability,
    secrets: Secrets,
    context: VolumeContext,
}

/// Ids the caller supplied instead of letting the run create them.
#[derive(Clone, Debug, Default)]
pub struct Given {
    /// `--volume-id`.
    pub volume: Option<String>,
    /// `--node-id`.
    pub node: Option<String>,
}

fn setup(step: &'static str) -> impl FnOnce(csi_client::Error) -> BenchError {
    move |e| BenchError::Setup {
        step,
        source: Box::new(e),
    }
}

impl Plan {
    /// Prepares `rpc` for `callers` callers: creates the volumes it needs (unless one is
    /// given) and finds the node id for `publish` (from `NodeGetInfo` unless given).
    ///
    /// # Errors
    ///
    /// [`BenchError::Unsupported`] when the plugin cannot create volumes and none was given,
    /// [`BenchError::BadFlag`] for `publish` with one given volume and several callers,
    /// [`BenchError::InvalidId`], and [`BenchError::Setup`] for a failed set-up call (the
    /// volumes made before it are deleted again).
    pub async fn prepare(
        client: &CsiClient,
        rpc: BenchRpc,
        callers: u32,
        given: &Given,
    ) -> Result<Plan, BenchError> {
        let capability = bench_capability();
        let mut plan = Plan {
            rpc,
            volumes: Vec::new(),
            node: None,
            created: Vec::new(),
            published: Vec::new(),
            asked: AskedCapabilities::new(vec![capability.clone()]),
            capability,
            secrets: Secrets::default(),
            context: VolumeContext::new(),
        };
        let result = plan.fill(client, callers, given).await;
        match result {
            Ok(()) => Ok(plan),
            Err(e) => {
                // Best effort: the set-up error is the one to report.
                let _ = plan.clean_up(client).await;
                Err(e)
            }
        }
    }

    async fn fill(
        &mut self,
        client: &CsiClient,
        callers: u32,
        given: &Given,
    ) -> Result<(), BenchError> {
        let rpc = self.rpc;
        let wanted = match rpc {
            BenchRpc::Probe | BenchRpc::Nodecaps => return Ok(()),
            BenchRpc::Validate => 1,
            BenchRpc::Publish => callers,
        };
        if let Some(id) = &given.volume {
            if wanted > 1 {
                return Err(BenchError::BadFlag {
                    flag: "volume-id",
                    value: id.clone(),
                    limit: "publish with one given volume needs -c 1 (plugins refuse \
                            concurrent publishes of one volume with ABORTED)",
                });
            }
            self.volumes.push(parse_id("--volume-id", id)?);
        } else {
            let caps = client
                .controller()
                .controller_get_capabilities()
                .await
                .map_err(setup("ControllerGetCapabilities"))?;
            if !caps.can_create_delete() {
                return Err(BenchError::Unsupported {
                    rpc,
                    reason: "the plugin cannot create volumes (no CREATE_DELETE_VOLUME): \
                             give --volume-id",
                });
            }
            let pid = std::process::id();
            for i in 0..wanted {
                let volume = client
                    .controller()
                    .create_volume(proto::CreateVolumeRequest {
                        name: format!("csi-bench-{pid}-{i}"),
                        volume_capabilities: vec![(&self.capability).into()],
                        ..Default::default()
                    })
                    .await
                    .map_err(setup("CreateVolume of a bench volume"))?;
                self.created.push(volume.volume_id.clone());
                self.volumes.push(volume.volume_id);
            }
        }
        if rpc == BenchRpc::Publish {
            self.node = Some(match &given.node {
                Some(id) => parse_id("--node-id", id)?,
                None => {
                    client
                        .node()
                        .node_get_info()
                        .await
                        .map_err(setup("NodeGetInfo (give --node-id to skip it)"))?
                        .node_id
                }
            });
        }
        Ok(())
    }

    /// The rpc prepared.
    pub fn rpc(&self) -> BenchRpc {
        self.rpc
    }

    /// One measured call by caller `caller`.
    ///
    /// # Errors
    ///
    /// The client's error for the call.
    pub async fn call(
        &mut self,
        client: &CsiClient,
        caller: usize,
    ) -> Result<(), csi_client::Error> {
        match self.rpc {
            BenchRpc::Probe => client.identity().probe().await.map(drop),
            BenchRpc::Nodecaps => client.node().node_get_capabilities().await.map(drop),
            BenchRpc::Validate => {
                let volume = &self.volumes[caller % self.volumes.len()];
                client
                    .controller()
                    .validate_volume_capabilities(
                        volume,
                        &self.asked,
                        &self.secrets,
                        ConfirmPolicy::Strict,
                    )
                    .await
                    .map(drop)
            }
            BenchRpc::Publish => {
                let volume = &self.volumes[caller % self.volumes.len()];
                let node = self
                    .node
                    .as_ref()
                    .expect("invariant: Plan::prepare sets the node of every publish plan");
                client
                    .controller()
                    .publish(
                        volume,
                        node,
                        &self.capability,
                        false,
                        &self.context,
                        &self.secrets,
                    )
                    .await?;
                if !self.published.contains(volume) {
                    self.published.push(volume.clone());
                }
                Ok(())
            }
        }
    }

    /// A copy for one caller: the same volumes and node, its own record of what it published.
    pub fn for_caller(&self) -> Plan {
        Plan {
            rpc: self.rpc,
            volumes: self.volumes.clone(),
            node: self.node.clone(),
            created: Vec::new(),
            published: Vec::new(),
            asked: self.asked.clone(),
            capability: self.capability.clone(),
            secrets: self.secrets.clone(),
            context: self.context.clone(),
        }
    }

    /// Takes over what a caller's copy published, so [`clean_up`](Self::clean_up) undoes it.
    pub fn absorb(&mut self, caller: Plan) {
        for volume in caller.published {
            if !self.published.contains(&volume) {
                self.published.push(volume);
            }
        }
    }

    /// Unpublishes what the run published and deletes the volumes it created.
    ///
    /// # Errors
    ///
    /// The first failed clean-up call (the others are still tried).
    pub async fn clean_up(&mut self, client: &CsiClient) -> Result<(), BenchError> {
        let mut first = None;
        if let Some(node) = &self.node {
            for volume in self.published.drain(..) {
                if let Err(e) = client
                    .controller()
                    .unpublish(&volume, Some(node), &self.secrets)
                    .await
                    && e.class() != csi_client::ErrorClass::AlreadyDone
                {
                    first.get_or_insert(setup("ControllerUnpublishVolume of a bench volume")(e));
                }
            }
        }
        for volume in self.created.drain(..) {
            if let Err(e) = client.controller().delete(&volume, &self.secrets).await
                && e.class() != csi_client::ErrorClass::AlreadyDone
            {
                first.get_or_insert(setup("DeleteVolume of a bench volume")(e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

fn parse_id<T>(what: &'static str, value: &str) -> Result<T, BenchError>
where
    T: TryFrom<String, Error = csi_structs::ValidationErrors>,
{
    T::try_from(value.to_owned()).map_err(|source| BenchError::InvalidId {
        what,
        value: value.to_owned(),
        source,
    })
}
