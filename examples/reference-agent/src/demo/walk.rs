//! The forward half of the lifecycle: fingerprint, create, validate, claim, publish, write,
//! stop; then the release (see `release.rs`) and delete.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_claims::driver::ClaimsHandle;
use csi_claims::{ClaimMode, ClaimRequest, ControllerRequirement, VolumeInfo};
use csi_client::{CsiClient, ErrorClass, NodePublish, NodeStage, proto};
use csi_structs::confirm::AskedCapabilities;
use csi_structs::topology::check_accessible;
use csi_structs::{
    AccessMode, AccessTypeKind, ConfirmPolicy, ExternalVolumeId, MountOptions, NodeId, PluginId,
    PublishContext, Secrets, Topology, VolumeCapability, VolumeContext, VolumeId, WorkloadId,
};

use super::error::{DemoError, StepError};
use super::leftovers::{Leftovers, Made, Outcome};
use super::plan::{Plan, VolumeSource};
use super::step::Step;
use super::table::Table;
use csi_node::layout::{Layout, PublishUsage};

/// The orchestrator-side ids the demo uses.
pub(crate) const DEMO_VOLUME: &str = "demo-volume";
pub(crate) const DEMO_WORKLOAD: &str = "demo-workload";
pub(crate) const DEMO_NODE: &str = "local";
const FILE_NAME: &str = "hello-from-csi-agent.txt";
const FILE_CONTENT: &[u8] = b"written by csi-agent demo through the published path\n";

/// The volume once it exists.
#[derive(Debug, Clone)]
pub(crate) struct Volume {
    pub(crate) id: VolumeId,
    pub(crate) external: ExternalVolumeId,
    pub(crate) context: VolumeContext,
    /// Its size, when known.
    pub(crate) capacity: Option<u64>,
    /// The topologies it is reachable from (empty: everywhere, or not known for a volume
    /// given with `--volume-id`).
    pub(crate) topology: Vec<Topology>,
}

/// One run of the demo: the client, where paths go, the table, and what is left so far.
#[derive(Debug)]
pub(crate) struct Walk<'t, W: Write> {
    pub(crate) client: CsiClient,
    pub(crate) layout: Layout,
    pub(crate) table: &'t mut Table<W>,
    pub(crate) left: Leftovers,
    pub(crate) skipped: usize,
    pub(crate) capability: VolumeCapability,
    pub(crate) workload: WorkloadId,
}

/// The result text of a delete call: `NOT_FOUND` ("already done") counts as deleted.
pub(crate) fn deleted_result(
    deleted: Result<(), csi_client::Error>,
) -> Result<&'static str, csi_client::Error> {
    match deleted {
        Ok(()) => Ok("ok: deleted"),
        Err(e) if e.class() == ErrorClass::AlreadyDone => Ok("ok: already gone"),
        Err(e) => Err(e),
    }
}

fn ids_invariant<T>(result: Result<T, csi_structs::ValidationErrors>) -> T {
    result.expect("the demo's constant ids are short, non-empty and valid")
}

impl<'t, W: Write> Walk<'t, W> {
    pub(crate) fn new(client: CsiClient, layout: Layout, table: &'t mut Table<W>) -> Self {
        Self {
            client,
            layout,
            table,
            left: Leftovers::default(),
            skipped: 0,
            capability: VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new()),
            workload: ids_invariant(WorkloadId::new(DEMO_WORKLOAD)),
        }
    }

    pub(crate) fn usage(&self) -> PublishUsage {
        PublishUsage {
            read_only: false,
            attachment: AccessTypeKind::Mount,
            access_mode: AccessMode::SingleNodeWriter,
        }
    }

    /// Prints a row; an output error becomes [`DemoError::Output`].
    pub(crate) fn row(
        &mut self,
        step: Step,
        took: Option<Duration>,
        result: &str,
    ) -> Result<(), DemoError> {
        self.table
            .row(step, took, result)
            .map_err(DemoError::Output)
    }

    /// Prints a skipped row.
    pub(crate) fn skip(&mut self, step: Step, why: &str) -> Result<(), DemoError> {
        self.skipped += 1;
        self.row(step, None, &format!("skipped: {why}"))
    }

    /// Prints the failed row and makes the error.
    pub(crate) fn fail(
        &mut self,
        step: Step,
        took: Option<Duration>,
        cause: StepError,
    ) -> DemoError {
        // The step's failure is what matters; an output error here cannot be reported anyway.
        let _ = self.table.row(step, took, &format!("FAILED: {cause}"));
        DemoError::Step { step, cause }
    }

    /// Creates `path` and any missing parents, recording each directory it made.
    fn make_dirs(&mut self, path: &Path) -> Result<(), StepError> {
        let missing: Vec<PathBuf> = path
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .map(Path::to_path_buf)
            .collect();
        for dir in missing.into_iter().rev() {
            std::fs::create_dir(&dir).map_err(|source| StepError::Io {
                what: "creating directory",
                path: dir.clone(),
                source,
            })?;
            self.left.dirs.push(dir);
        }
        Ok(())
    }

    /// Step 1: fingerprint and plan.
    pub(crate) async fn fingerprint(
        &mut self,
        existing: Option<ExternalVolumeId>,
    ) -> Result<(Plan, PluginId), DemoError> {
        let started = Instant::now();
        let fingerprint = match self.client.fingerprint().await {
            Ok(f) => f,
            Err(e) => return Err(self.fail(Step::Fingerprint, Some(started.elapsed()), e.into())),
        };
        let took = started.elapsed();
        let plan = match Plan::for_plugin(&fingerprint, existing) {
            Ok(plan) => plan,
            Err(e) => {
                let _ = self
                    .table
                    .row(Step::Fingerprint, Some(took), &format!("FAILED: {e}"));
                return Err(e.into());
            }
        };
        let plugin = match PluginId::new(fingerprint.plugin.name.to_string()) {
            Ok(id) => id,
            Err(e) => {
                return Err(self.fail(Step::Fingerprint, Some(took), StepError::BadAnswer(e)));
            }
        };
        self.row(
            Step::Fingerprint,
            Some(took),
            &format!(
                "ok: {} {}; {}",
                fingerprint.plugin.name,
                fingerprint.plugin.vendor_version,
                plan.describe()
            ),
        )?;
        Ok((plan, plugin))
    }

    /// Undoes a `CreateVolume` whose outcome is uncertain (its name is recorded before the
    /// call): `CreateVolume` is sent again by name until the answer is usable and the volume
    /// it names is deleted. The name stays among the leftovers unless that worked.
    async fn undo_create(
        &mut self,
        request: proto::CreateVolumeRequest,
        error: csi_client::Error,
    ) -> StepError {
        let name = request.name.clone();
        match self
            .client
            .controller()
            .undo_create(request, &Secrets::default())
            .await
        {
            Ok(deleted) => {
                self.left.maybe_created = None;
                StepError::CreateUndone { error, deleted }
            }
            Err(undo) => StepError::CreateNotUndone { error, name, undo },
        }
    }

    /// A failed call that changes the plugin's state, recorded by `record` before it was
    /// sent. A certain failure did nothing: the record goes. An uncertain one may have
    /// happened: `undo` (its counterpart call, named `undo_call`) is sent, and the record goes
    /// when that is done (or already done); otherwise it stays, and the "left behind" list
    /// names it.
    async fn failed_change<T>(
        &mut self,
        step: Step,
        took: Duration,
        error: csi_client::Error,
        undo_call: &'static str,
        undo: impl Future<Output = Result<(), csi_client::Error>>,
        record: fn(&mut Leftovers) -> &mut Option<Made<T>>,
    ) -> DemoError {
        let cause = if !error.class().is_uncertain() {
            *record(&mut self.left) = None;
            error.into()
        } else {
            match undo.await {
                Err(undo_error) if undo_error.class() != ErrorClass::AlreadyDone => {
                    StepError::NotUndone {
                        error,
                        undo: undo_call,
                        undo_error,
                    }
                }
                _ => {
                    *record(&mut self.left) = None;
                    StepError::Undone {
                        error,
                        undo: undo_call,
                    }
                }
            }
        };
        self.fail(step, Some(took), cause)
    }

    /// Step 2: create the volume (or take the given one).
    pub(crate) async fn create(&mut self, plan: &Plan) -> Result<Volume, DemoError> {
        let id = ids_invariant(VolumeId::new(DEMO_VOLUME));
        match &plan.volume {
            VolumeSource::Existing(external) => {
                self.skip(
                    Step::CreateVolume,
                    &format!("using existing volume {external}"),
                )?;
                Ok(Volume {
                    id,
                    external: external.clone(),
                    context: VolumeContext::new(),
                    capacity: None,
                    topology: Vec::new(),
                })
            }
            VolumeSource::Create => {
                let name = format!(
                    "csi-agent-demo-{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis())
                        .unwrap_or_default()
                );
                let request = proto::CreateVolumeRequest {
                    name: name.clone(),
                    volume_capabilities: vec![(&self.capability).into()],
                    ..Default::default()
                };
                // Recorded before it is sent: a volume of this name may exist from now on.
                self.left.maybe_created = Some(name.clone());
                let started = Instant::now();
                let created = self
                    .client
                    .controller()
                    .create_volume(request.clone())
                    .await;
                let took = started.elapsed();
                let volume = match created {
                    Ok(v) => v,
                    Err(e) if e.class().is_uncertain() => {
                        let cause = self.undo_create(request, e).await;
                        return Err(self.fail(Step::CreateVolume, Some(took), cause));
                    }
                    Err(e) => {
                        self.left.maybe_created = None;
                        return Err(self.fail(Step::CreateVolume, Some(took), e.into()));
                    }
                };
                self.left.maybe_created = None;
                self.left.created = Some(volume.volume_id.clone());
                let size = volume
                    .capacity_bytes
                    .map(|b| format!("{} MiB", b >> 20))
                    .unwrap_or_else(|| "size unknown".to_owned());
                self.row(
                    Step::CreateVolume,
                    Some(took),
                    &format!("ok: {} (name {name}, {size})", volume.volume_id),
                )?;
                Ok(Volume {
                    id,
                    external: volume.volume_id,
                    context: volume.volume_context,
                    capacity: volume.capacity_bytes,
                    topology: volume.accessible_topology,
                })
            }
        }
    }

    /// Step 3: validate the capabilities.
    pub(crate) async fn validate(&mut self, plan: &Plan, volume: &Volume) -> Result<(), DemoError> {
        if !plan.validate {
            return self.skip(
                Step::ValidateCapabilities,
                "the plugin has no Controller service",
            );
        }
        let mut asked = AskedCapabilities::new(vec![self.capability.clone()]);
        asked.volume_context = volume.context.clone();
        let started = Instant::now();
        let answer = self
            .client
            .controller()
            .validate_volume_capabilities(
                &volume.external,
                &asked,
                &Secrets::default(),
                ConfirmPolicy::Strict,
            )
            .await;
        let took = started.elapsed();
        match answer {
            Ok(c) if c.is_accepted() => self.row(
                Step::ValidateCapabilities,
                Some(took),
                "ok: mount, single-node-writer confirmed",
            ),
            Ok(c) => Err(self.fail(
                Step::ValidateCapabilities,
                Some(took),
                StepError::NotConfirmed(c),
            )),
            Err(e) => Err(self.fail(Step::ValidateCapabilities, Some(took), e.into())),
        }
    }

    /// Step 4: claim for writing.
    pub(crate) async fn claim(
        &mut self,
        claims: &ClaimsHandle,
        plan: &Plan,
        plugin: &PluginId,
        volume: &Volume,
    ) -> Result<VolumeInfo, DemoError> {
        // The rule `serve` applies: refused before anything is recorded or called, since
        // the plugin could only fail late.
        if let Err(refused) = check_accessible(&volume.topology, plan.node_topology.as_ref()) {
            let cause = StepError::NotAccessible {
                volume: volume.external.clone(),
                node: plan.plugin_node.clone(),
                refused,
            };
            return Err(self.fail(Step::Claim, None, cause));
        }
        let info = VolumeInfo {
            id: volume.id.clone(),
            external_id: volume.external.clone(),
            plugin: plugin.clone(),
            controller: if plan.controller_publish {
                ControllerRequirement::Required
            } else {
                ControllerRequirement::NotRequired
            },
        };
        let request = ClaimRequest {
            volume: volume.id.clone(),
            workload: self.workload.clone(),
            node: ids_invariant(NodeId::new(DEMO_NODE)),
            plugin_node: plan.plugin_node.clone(),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            attachment: AccessTypeKind::Mount,
        };
        let started = Instant::now();
        let claimed = claims.claim(&info, request).await;
        let took = started.elapsed();
        match claimed {
            Ok(claim) => {
                self.left.claim = Some(claim.state().name().to_owned());
                self.row(
                    Step::Claim,
                    Some(took),
                    &format!(
                        "ok: {} {} by workload {}",
                        volume.id,
                        claim.state().name(),
                        self.workload
                    ),
                )?;
                Ok(info)
            }
            Err(e) => Err(self.fail(Step::Claim, Some(took), e.into())),
        }
    }

    /// Step 5: controller publish.
    pub(crate) async fn controller_publish(
        &mut self,
        plan: &Plan,
        volume: &Volume,
    ) -> Result<PublishContext, DemoError> {
        if !plan.controller_publish {
            self.skip(
                Step::ControllerPublish,
                "the plugin lacks PUBLISH_UNPUBLISH_VOLUME",
            )?;
            return Ok(PublishContext::new());
        }
        // Recorded before it is sent: it may happen whatever the answer.
        self.left.controller_published = Some(Made::maybe((
            volume.external.clone(),
            plan.plugin_node.clone(),
        )));
        let controller = self.client.controller();
        let started = Instant::now();
        let published = controller
            .publish(
                &volume.external,
                &plan.plugin_node,
                &self.capability,
                false,
                &volume.context,
                &Secrets::default(),
            )
            .await;
        let took = started.elapsed();
        match published {
            Ok(context) => {
                set_done(&mut self.left.controller_published);
                self.row(
                    Step::ControllerPublish,
                    Some(took),
                    &format!(
                        "ok: published to node {} ({} publish context keys)",
                        plan.plugin_node,
                        context.len()
                    ),
                )?;
                Ok(context)
            }
            Err(e) => {
                let secrets = Secrets::default();
                let undo =
                    controller.unpublish(&volume.external, Some(&plan.plugin_node), &secrets);
                Err(self
                    .failed_change(
                        Step::ControllerPublish,
                        took,
                        e,
                        "ControllerUnpublishVolume",
                        undo,
                        |left| &mut left.controller_published,
                    )
                    .await)
            }
        }
    }

    /// Step 6: node stage; returns the staging path when staged.
    pub(crate) async fn stage(
        &mut self,
        plan: &Plan,
        volume: &Volume,
        publish_context: &PublishContext,
    ) -> Result<Option<String>, DemoError> {
        if !plan.stage {
            self.skip(Step::NodeStage, "the plugin lacks STAGE_UNSTAGE_VOLUME")?;
            return Ok(None);
        }
        let staging = self
            .layout
            .staging_path(&volume.id)
            .map_err(|e| self.fail(Step::NodeStage, None, e.into()))?;
        let Some(path) = staging.to_str().map(str::to_owned) else {
            return Err(self.fail(Step::NodeStage, None, StepError::PathNotUtf8(staging)));
        };
        if let Err(e) = self.make_dirs(&staging) {
            return Err(self.fail(Step::NodeStage, None, e));
        }
        self.left.staged = Some(Made::maybe((volume.external.clone(), staging.clone())));
        let node = self.client.node();
        let started = Instant::now();
        let staged = node
            .stage(&NodeStage {
                volume: &volume.external,
                staging_target_path: Path::new(&path),
                capability: &self.capability,
                publish_context,
                volume_context: &volume.context,
                secrets: &Secrets::default(),
            })
            .await;
        let took = started.elapsed();
        match staged {
            Ok(()) => {
                set_done(&mut self.left.staged);
                self.row(
                    Step::NodeStage,
                    Some(took),
                    &format!("ok: staged at {path}"),
                )?;
                Ok(Some(path))
            }
            Err(e) => {
                let undo = node.unstage(&volume.external, Path::new(&path));
                Err(self
                    .failed_change(
                        Step::NodeStage,
                        took,
                        e,
                        "NodeUnstageVolume",
                        undo,
                        |left| &mut left.staged,
                    )
                    .await)
            }
        }
    }

    /// Step 7: node publish; returns the target path.
    pub(crate) async fn publish(
        &mut self,
        volume: &Volume,
        staging: Option<&str>,
        publish_context: &PublishContext,
    ) -> Result<PathBuf, DemoError> {
        let target = self
            .layout
            .target_path(&volume.id, &self.workload, &self.usage())
            .map_err(|e| self.fail(Step::NodePublish, None, e.into()))?;
        let Some(path) = target.to_str().map(str::to_owned) else {
            return Err(self.fail(Step::NodePublish, None, StepError::PathNotUtf8(target)));
        };
        if let Some(parent) = target.parent()
            && let Err(e) = self.make_dirs(parent)
        {
            return Err(self.fail(Step::NodePublish, None, e));
        }
        // The plugin makes the target; the demo removes it if the plugin leaves it.
        self.left.dirs.push(target.clone());
        self.left.published = Some(Made::maybe((volume.external.clone(), target.clone())));
        let node = self.client.node();
        let started = Instant::now();
        let published = node
            .publish(&NodePublish {
                volume: &volume.external,
                staging_target_path: staging.map(Path::new),
                target_path: Path::new(&path),
                capability: &self.capability,
                readonly: false,
                publish_context,
                volume_context: &volume.context,
                secrets: &Secrets::default(),
            })
            .await;
        let took = started.elapsed();
        match published {
            Ok(()) => {
                set_done(&mut self.left.published);
                self.row(
                    Step::NodePublish,
                    Some(took),
                    &format!("ok: published at {path}"),
                )?;
                Ok(target)
            }
            Err(e) => {
                let undo = node.unpublish(&volume.external, Path::new(&path));
                Err(self
                    .failed_change(
                        Step::NodePublish,
                        took,
                        e,
                        "NodeUnpublishVolume",
                        undo,
                        |left| &mut left.published,
                    )
                    .await)
            }
        }
    }

    /// Steps 8 and 9: the workload writes a file through the target, reads it back, removes
    /// it and stops.
    pub(crate) async fn workload(&mut self, target: &Path) -> Result<(), DemoError> {
        let file = target.join(FILE_NAME);
        let started = Instant::now();
        let io = |what| {
            let path = file.clone();
            move |source| StepError::Io { what, path, source }
        };
        let written = async {
            tokio::fs::write(&file, FILE_CONTENT)
                .await
                .map_err(io("writing"))?;
            let back = tokio::fs::read(&file).await.map_err(io("reading back"))?;
            if back != FILE_CONTENT {
                return Err(StepError::ReadBack(file.clone()));
            }
            Ok(())
        }
        .await;
        self.left.file = Some(file.clone());
        if let Err(e) = written {
            return Err(self.fail(Step::WriteFile, Some(started.elapsed()), e));
        }
        self.row(
            Step::WriteFile,
            Some(started.elapsed()),
            &format!(
                "ok: wrote and read back {} bytes in {}",
                FILE_CONTENT.len(),
                file.display()
            ),
        )?;
        let started = Instant::now();
        if let Err(e) = tokio::fs::remove_file(&file).await {
            return Err(self.fail(
                Step::StopWorkload,
                Some(started.elapsed()),
                io("removing")(e),
            ));
        }
        self.left.file = None;
        self.row(
            Step::StopWorkload,
            Some(started.elapsed()),
            "ok: file removed, workload stopped",
        )
    }

    /// The last step: delete the volume if the demo created it.
    pub(crate) async fn delete(&mut self, volume: &Volume) -> Result<(), DemoError> {
        if self.left.created.is_none() {
            return self.skip(
                Step::DeleteVolume,
                &format!("existing volume {} is kept", volume.external),
            );
        }
        let started = Instant::now();
        let deleted = self
            .client
            .controller()
            .delete(&volume.external, &Secrets::default())
            .await;
        let took = started.elapsed();
        let result = deleted_result(deleted)
            .map_err(|e| self.fail(Step::DeleteVolume, Some(took), e.into()))?;
        self.left.created = None;
        self.row(Step::DeleteVolume, Some(took), result)
    }

    /// Removes the (empty) directories the demo made, deepest first.
    pub(crate) fn remove_dirs(&mut self) {
        for dir in self.left.dirs.iter().rev() {
            // Gone already (the plugin or the release removed it) or still in use: either
            // way the report lists what remains.
            let _ = std::fs::remove_dir(dir);
        }
        self.left.dirs.retain(|d| d.exists());
    }
}

/// The plugin answered that it did what `made` records.
fn set_done<T>(made: &mut Option<Made<T>>) {
    if let Some(made) = made {
        made.outcome = Outcome::Done;
    }
}
