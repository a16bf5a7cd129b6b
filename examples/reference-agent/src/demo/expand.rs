//! The demo's expansion and snapshot steps, each run only when the plugin advertises it.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use csi_client::NodeExpand;
use csi_structs::{CapacityRange, Parameters, Secrets, SnapshotId};

use super::error::{DemoError, StepError};
use super::plan::Plan;
use super::step::Step;
use super::walk::{Volume, Walk, deleted_result};

/// What the expansion asks for: the volume's size (1 GiB when unknown) plus 1 GiB.
const GROWTH: u64 = 1 << 30;

impl<W: Write> Walk<'_, W> {
    /// Grows the published volume: `ControllerExpandVolume`, then `NodeExpandVolume` at the
    /// target when the controller asks for it (or alone, for a plugin that expands on the
    /// node only).
    pub(crate) async fn expand(
        &mut self,
        plan: &Plan,
        volume: &Volume,
        staging: Option<&str>,
        target: &Path,
    ) -> Result<(), DemoError> {
        let how = match plan.expand {
            Ok(how) => how,
            Err(why) => return self.skip(Step::Expand, why),
        };
        let wanted = volume.capacity.unwrap_or(GROWTH).saturating_add(GROWTH);
        let range = match CapacityRange::new(Some(wanted), None) {
            Ok(range) => range,
            Err(e) => return Err(self.fail(Step::Expand, None, StepError::BadAnswer(e))),
        };
        // The wire carries paths as strings: say so before growing anything.
        if target.to_str().is_none() {
            let path = target.to_owned();
            return Err(self.fail(Step::Expand, None, StepError::PathNotUtf8(path)));
        }
        let secrets = Secrets::default();
        let started = Instant::now();
        let mut done = Vec::new();
        let mut node_step = !how.controller;
        if how.controller {
            let answer = self
                .client
                .controller()
                .expand(&volume.external, &range, Some(&self.capability), &secrets)
                .await;
            match answer {
                Ok(a) => {
                    done.push(format!(
                        "grown to {} MiB by the controller",
                        a.capacity_bytes >> 20
                    ));
                    node_step = a.node_expansion_required;
                }
                Err(e) => return Err(self.fail(Step::Expand, Some(started.elapsed()), e.into())),
            }
        }
        if node_step && how.node {
            let answer = self
                .client
                .node()
                .expand(&NodeExpand {
                    volume: &volume.external,
                    volume_path: target,
                    staging_target_path: staging.map(Path::new),
                    capacity_range: Some(&range),
                    capability: Some(&self.capability),
                    secrets: &secrets,
                })
                .await;
            match answer {
                Ok(_) => done.push("grown on the node (NodeExpandVolume)".to_owned()),
                Err(e) => return Err(self.fail(Step::Expand, Some(started.elapsed()), e.into())),
            }
        } else if node_step {
            done.push("the controller asked for NodeExpandVolume, which the plugin's node does not advertise".to_owned());
        }
        self.row(
            Step::Expand,
            Some(started.elapsed()),
            &format!("ok: {}", done.join("; ")),
        )
    }

    /// Cuts a snapshot of the volume (the workload stopped); returns its id.
    pub(crate) async fn snapshot(
        &mut self,
        plan: &Plan,
        volume: &Volume,
    ) -> Result<Option<SnapshotId>, DemoError> {
        if let Err(why) = plan.snapshot {
            self.skip(Step::Snapshot, why)?;
            return Ok(None);
        }
        let name = format!(
            "csi-agent-demo-snapshot-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default()
        );
        let started = Instant::now();
        let cut = self
            .client
            .controller()
            .create_snapshot(
                &volume.external,
                &name,
                &Parameters::default(),
                &Secrets::default(),
            )
            .await;
        let took = started.elapsed();
        match cut {
            Ok(snapshot) => {
                self.left.snapshot = Some(snapshot.snapshot_id.clone());
                let size = snapshot
                    .size_bytes
                    .map_or_else(|| "size unknown".to_owned(), |b| format!("{} MiB", b >> 20));
                self.row(
                    Step::Snapshot,
                    Some(took),
                    &format!(
                        "ok: {} of {} (name {name}, {size}, {})",
                        snapshot.snapshot_id,
                        volume.external,
                        if snapshot.ready_to_use {
                            "ready to use"
                        } else {
                            "being processed"
                        }
                    ),
                )?;
                Ok(Some(snapshot.snapshot_id))
            }
            Err(e) => {
                if e.class().is_uncertain() {
                    self.left.maybe_snapshot = Some(name);
                }
                Err(self.fail(Step::Snapshot, Some(took), e.into()))
            }
        }
    }

    /// Deletes the snapshot [`snapshot`](Self::snapshot) cut.
    pub(crate) async fn delete_snapshot(
        &mut self,
        plan: &Plan,
        snapshot: Option<SnapshotId>,
    ) -> Result<(), DemoError> {
        let Some(snapshot) = snapshot else {
            return self.skip(
                Step::DeleteSnapshot,
                plan.snapshot.err().unwrap_or("no snapshot was cut"),
            );
        };
        let started = Instant::now();
        let deleted = self
            .client
            .controller()
            .delete_snapshot(&snapshot, &Secrets::default())
            .await;
        let took = started.elapsed();
        let result = deleted_result(deleted)
            .map_err(|e| self.fail(Step::DeleteSnapshot, Some(took), e.into()))?;
        self.left.snapshot = None;
        self.row(Step::DeleteSnapshot, Some(took), result)
    }
}
