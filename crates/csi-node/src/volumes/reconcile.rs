//! Confirming the usage records restored at open: [`VolumeManager::reconcile`].
//!
//! A record written before a restart says what was done then, not what holds now: after a
//! host reboot the plugin comes back with nothing staged or published, whatever the file
//! says. The manager keeps, in memory only, which stages and publishes it saw succeed since
//! it opened the file; [`mount`](VolumeManager::mount) skips a stage only when it saw it
//! succeed, and `reconcile` confirms every other record at once, by sending the calls again
//! (stage and publish are idempotent, CSI spec) rather than waiting for each workload's next
//! mount.
//!
//! What the record does not keep comes from the embedder, through a [`RestoreLookup`]: the
//! secrets are never written to the usage records, and the capability, read-only flag and
//! volume context are the embedder's to say (it has them in its own records of the volume
//! and the claim, the same ones it builds a [`MountRequest`] from). The lookup also says
//! whether the workload still wants the volume: [`Restore::Republish`],
//! [`Restore::Release`] (the workload is gone: unpublish, and unstage with the last user)
//! or [`Restore::Keep`] (not known yet: nothing is called, the record stays unconfirmed and
//! the next mount stages and publishes again). The `publish_context` is the record's.
//!
//! # The host's mount table
//!
//! `reconcile` reads `/proc/self/mountinfo` once and reports, per record, whether its
//! staging path and target are mount points on this host ([`Found::staging_mounted`],
//! [`Found::target_mounted`]). That is advice for a person reading the report, never a
//! reason to skip or to make a call: a plugin in a container may mount in a namespace this
//! process does not see, a plugin may publish without a mount point of its own (the mock
//! plugin makes directories; a block volume's target is a file), and a mount point can be
//! there and stale. Only the plugin's answer confirms a step.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use csi_structs::{
    AccessMode, AccessTypeKind, ExternalVolumeId, PluginId, VolumeCapability, VolumeContext,
    VolumeId, VolumeSecrets, WorkloadId,
};

use super::usage::{StepState, VolumeEntry};
use super::{
    Ids, MountRequest, UnmountRequest, Unmounted, VolumeError, VolumeEvent, VolumeManager,
};
use crate::layout::PublishUsage;

/// A publication restored from the usage records that this process has not seen succeed: what
/// the [`RestoreLookup`] is asked about.
#[derive(Clone, Debug)]
pub struct Restored {
    /// The plugin.
    pub plugin: PluginId,
    /// The volume.
    pub volume: VolumeId,
    /// The plugin's volume id.
    pub external_id: ExternalVolumeId,
    /// The workload.
    pub workload: WorkloadId,
    /// Its target (host path), as recorded.
    pub target: PathBuf,
    /// How its last publish call ended, as recorded.
    pub publish: StepState,
}

/// What a stage and publish need that the usage record does not keep: the fields of a
/// [`MountRequest`] beyond its ids, target and `publish_context`.
#[derive(Clone, Debug)]
pub struct Republish {
    /// How the volume is used.
    pub capability: VolumeCapability,
    /// Publish read-only.
    pub read_only: bool,
    /// The volume's context.
    pub volume_context: VolumeContext,
    /// The volume's secrets (never in the usage records): `NodeStageVolume` sends their
    /// `NodeStage` set, `NodePublishVolume` their `NodePublish` set.
    pub secrets: VolumeSecrets,
}

/// The embedder's answer about a restored publication.
#[derive(Clone, Debug)]
pub enum Restore {
    /// The workload still uses the volume: stage (when not seen succeed since the start) and
    /// publish again with these fields.
    Republish(Republish),
    /// The workload is gone: unpublish, and unstage when it was the volume's last user here.
    Release,
    /// Not known (yet): nothing is called and the record stays as it is, unconfirmed; the
    /// workload's next mount stages and publishes again, its unmount releases it.
    Keep,
}

/// Where [`VolumeManager::reconcile`] gets what the usage record does not keep. Closures
/// `Fn(&Restored) -> Restore` are lookups.
pub trait RestoreLookup: Send + Sync {
    /// What to do about `publication`.
    fn restore(&self, publication: &Restored) -> Restore;
}

impl<F> RestoreLookup for F
where
    F: Fn(&Restored) -> Restore + Send + Sync,
{
    fn restore(&self, publication: &Restored) -> Restore {
        self(publication)
    }
}

/// What a record said when reconcile came to it, and what the host's mount table showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// How the volume's stage call ended, as recorded (`None`: not staged, or the plugin does
    /// not stage).
    pub stage: Option<StepState>,
    /// How the workload's publish call ended, as recorded (`None`: a record with no
    /// publication left, only a staging).
    pub publish: Option<StepState>,
    /// Whether the staging path is a mount point on this host (`None`: no staging path, or
    /// the mount table could not be read). Advice only (see
    /// [`reconcile`](VolumeManager::reconcile)).
    pub staging_mounted: Option<bool>,
    /// Whether the target is a mount point on this host (`None`: no publication, or the mount
    /// table could not be read). Advice only.
    pub target_mounted: Option<bool>,
}

/// What reconcile did about one record (a workload's publication, or a volume's staging
/// with no publication left).
#[derive(Clone, Debug)]
pub enum ReconcileOutcome {
    /// This process had seen the steps succeed already: nothing to confirm, nothing called.
    AlreadyConfirmed,
    /// Staged (when `restaged`) and published again; the record is confirmed.
    Republished {
        /// The target (host path).
        target: PathBuf,
        /// Whether `NodeStageVolume` was called (false: the plugin does not stage, or another
        /// publication of the volume confirmed the staging first).
        restaged: bool,
    },
    /// The embedder said the workload is gone: released as an unmount does.
    Released(Unmounted),
    /// A staging with no publication left: unstaged (`NOT_FOUND` counts as done) and the
    /// record dropped.
    Cleaned {
        /// Whether `NodeUnstageVolume` was called (false: the record had no staging).
        unstaged: bool,
    },
    /// The embedder did not know the publication ([`Restore::Keep`]): nothing called, the
    /// record kept unconfirmed.
    Kept,
    /// The plugin is not here or not known to be healthy: nothing called, the record kept.
    /// The error ([`VolumeError::NotConfirmed`]) names the plugin, the volume and why.
    PluginMissing(VolumeError),
    /// A call or a local step failed; the record keeps what is left to do (see the
    /// error's class).
    Failed(VolumeError),
}

/// One record's reconciliation.
#[derive(Clone, Debug)]
pub struct Reconciliation {
    /// The plugin.
    pub plugin: PluginId,
    /// The volume.
    pub volume: VolumeId,
    /// The workload (`None`: the volume's staging, with no publication left).
    pub workload: Option<WorkloadId>,
    /// What the record said.
    pub found: Found,
    /// What was done.
    pub outcome: ReconcileOutcome,
}

impl Reconciliation {
    /// The error, for a record that could not be confirmed or released.
    pub fn error(&self) -> Option<&VolumeError> {
        match &self.outcome {
            ReconcileOutcome::PluginMissing(e) | ReconcileOutcome::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// What was done, without its details: [`ReconcileAction::as_str`] gives it in a word.
    pub fn action(&self) -> ReconcileAction {
        self.outcome.action()
    }
}

impl ReconcileOutcome {
    /// What was done, without its details.
    pub fn action(&self) -> ReconcileAction {
        match self {
            ReconcileOutcome::AlreadyConfirmed => ReconcileAction::AlreadyConfirmed,
            ReconcileOutcome::Republished { .. } => ReconcileAction::Republished,
            ReconcileOutcome::Released(_) => ReconcileAction::Released,
            ReconcileOutcome::Cleaned { .. } => ReconcileAction::Cleaned,
            ReconcileOutcome::Kept => ReconcileAction::Kept,
            ReconcileOutcome::PluginMissing(_) => ReconcileAction::PluginMissing,
            ReconcileOutcome::Failed(_) => ReconcileAction::Failed,
        }
    }
}

/// What reconcile did about one record, without its details: one variant per
/// [`ReconcileOutcome`], to count, match or print (`Display` writes [`as_str`](Self::as_str)).
///
/// ```
/// use csi_node::volumes::ReconcileAction;
///
/// assert_eq!(ReconcileAction::PluginMissing.as_str(), "plugin_missing");
/// assert_eq!(ReconcileAction::Republished.to_string(), "republished");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReconcileAction {
    /// [`ReconcileOutcome::AlreadyConfirmed`].
    AlreadyConfirmed,
    /// [`ReconcileOutcome::Republished`].
    Republished,
    /// [`ReconcileOutcome::Released`].
    Released,
    /// [`ReconcileOutcome::Cleaned`].
    Cleaned,
    /// [`ReconcileOutcome::Kept`].
    Kept,
    /// [`ReconcileOutcome::PluginMissing`].
    PluginMissing,
    /// [`ReconcileOutcome::Failed`].
    Failed,
}

impl ReconcileAction {
    /// In a word: `already_confirmed`, `republished`, `released`, `cleaned`, `kept`,
    /// `plugin_missing` or `failed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReconcileAction::AlreadyConfirmed => "already_confirmed",
            ReconcileAction::Republished => "republished",
            ReconcileAction::Released => "released",
            ReconcileAction::Cleaned => "cleaned",
            ReconcileAction::Kept => "kept",
            ReconcileAction::PluginMissing => "plugin_missing",
            ReconcileAction::Failed => "failed",
        }
    }
}

impl fmt::Display for ReconcileAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Reconciliation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "volume {} (plugin {})", self.volume, self.plugin)?;
        if let Some(w) = &self.workload {
            write!(f, " for workload {w}")?;
        }
        match &self.outcome {
            ReconcileOutcome::AlreadyConfirmed => f.write_str(": already confirmed"),
            ReconcileOutcome::Republished { restaged, .. } => f.write_str(if *restaged {
                ": staged and published again"
            } else {
                ": published again"
            }),
            ReconcileOutcome::Released(u) => write!(
                f,
                ": released (unpublished: {}, unstaged: {})",
                u.unpublished, u.unstaged
            ),
            ReconcileOutcome::Cleaned { unstaged } => {
                write!(f, ": staging cleaned up (unstaged: {unstaged})")
            }
            ReconcileOutcome::Kept => f.write_str(": kept unconfirmed, unknown to the embedder"),
            ReconcileOutcome::PluginMissing(e) | ReconcileOutcome::Failed(e) => {
                write!(f, ": {e} ({})", e.class().as_str())
            }
        }
    }
}

/// What [`VolumeManager::reconcile`] found and did, one entry per record.
#[derive(Clone, Debug, Default)]
pub struct Reconciled {
    /// One per workload's publication, and one per staging with no publication left, in the
    /// records' order.
    pub records: Vec<Reconciliation>,
}

impl Reconciled {
    /// The records that could not be confirmed or released (their plugin missing, or a call
    /// failed): each is kept.
    pub fn failed(&self) -> impl Iterator<Item = &Reconciliation> {
        self.records.iter().filter(|r| r.error().is_some())
    }

    /// Whether every record is confirmed or released (none failed, none kept unknown).
    pub fn is_complete(&self) -> bool {
        self.records.iter().all(|r| {
            !matches!(
                r.outcome,
                ReconcileOutcome::Kept
                    | ReconcileOutcome::PluginMissing(_)
                    | ReconcileOutcome::Failed(_)
            )
        })
    }
}

impl fmt::Display for Reconciled {
    /// `3 record(s): 1 republished, 1 released, 0 kept, 1 not confirmed`: a summary; each
    /// record's line is its [`Reconciliation`]'s.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |actions: &[ReconcileAction]| {
            self.records
                .iter()
                .filter(|r| actions.contains(&r.action()))
                .count()
        };
        write!(
            f,
            "{} record(s): {} republished, {} released, {} kept, {} not confirmed",
            self.records.len(),
            count(&[ReconcileAction::Republished]),
            count(&[ReconcileAction::Released, ReconcileAction::Cleaned]),
            count(&[ReconcileAction::Kept]),
            self.failed().count()
        )
    }
}

impl VolumeManager {
    /// Confirms every usage record this process has not seen succeed against its plugin:
    /// for each publication the `lookup` says is still wanted, `NodeStageVolume` again (when
    /// the plugin stages and this process has not staged the volume since it opened the
    /// records) and `NodePublishVolume` again at the recorded target; a publication the
    /// lookup says is gone is released (unpublished, then unstaged with the volume's last
    /// user; `NOT_FOUND` is done); a staging with no publication left is unstaged. A record
    /// whose plugin is not here (or not known to be healthy, for a republish) is reported
    /// and kept, never dropped; so is a failed call, with its error and class.
    ///
    /// Records go one at a time, each in its volume's turn (a mount or unmount of the same
    /// volume waits, or is waited for). Every record ends with a [`VolumeEvent::Reconcile`].
    /// Calling it again is safe: what was confirmed is [`AlreadyConfirmed`] and not called
    /// again. Without it, nothing is trusted either: each workload's next mount stages again
    /// (it always publishes), and its unmount always calls the plugin.
    ///
    /// # What comes from where
    ///
    /// The record keeps the ids, the staging path and target, and the volume's
    /// `publish_context` (sent again as recorded, so it matches what
    /// `ControllerPublishVolume` returned). What it does not keep comes from `lookup`: the
    /// secrets, which are never written to the usage records, and the capability, read-only
    /// flag and volume context, which the embedder has in its own records of the volume and
    /// the claim (the ones it builds a [`MountRequest`] from), so they are asked for rather
    /// than copied into the file (mount flags can carry credentials too). The lookup also
    /// says whether the workload still wants the volume ([`Restore`]); closures
    /// `Fn(&Restored) -> Restore` are lookups.
    ///
    /// # The host's mount table
    ///
    /// It reads `/proc/self/mountinfo` once and reports per record whether its staging path
    /// and target are mount points on this host ([`Found::staging_mounted`],
    /// [`Found::target_mounted`]). That is advice for a person reading the report, never a
    /// reason to skip or to make a call: a plugin in a container may mount in a namespace
    /// this process does not see, a plugin may publish without a mount point of its own (the
    /// mock plugin makes directories; a block volume's target is a file), and a mount point
    /// can be there and stale. Only the plugin's answer confirms a step.
    ///
    /// ```no_run
    /// use csi_node::volumes::{Republish, Restore, Restored, VolumeManager};
    /// use csi_structs::{AccessMode, MountOptions, VolumeCapability, VolumeContext};
    ///
    /// # async fn run(volumes: VolumeManager) {
    /// // Every restored publication is still wanted, with no secrets.
    /// let lookup = |_: &Restored| {
    ///     Restore::Republish(Republish {
    ///         capability: VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::new()),
    ///         read_only: false,
    ///         volume_context: VolumeContext::new(),
    ///         secrets: Default::default(),
    ///     })
    /// };
    /// let report = volumes.reconcile(&lookup).await;
    /// for kept in report.failed() {
    ///     eprintln!("{kept}");
    /// }
    /// # }
    /// ```
    ///
    /// [`AlreadyConfirmed`]: ReconcileOutcome::AlreadyConfirmed
    pub async fn reconcile(&self, lookup: &dyn RestoreLookup) -> Reconciled {
        self.reconcile_where(lookup, &|_| true).await
    }

    /// [`reconcile`](Self::reconcile), for the records `pick` selects (as they are when the
    /// call starts), the others left as they are: to confirm some records before the
    /// others, say those the embedder knows are to be released, so that what waits on
    /// their release goes on sooner.
    ///
    /// ```no_run
    /// use csi_node::volumes::{Restore, Restored, VolumeManager};
    /// use csi_structs::VolumeId;
    ///
    /// # async fn run(volumes: VolumeManager, lost: VolumeId) {
    /// // The publications of one volume are gone: released before anything else.
    /// let release = |_: &Restored| Restore::Release;
    /// let report = volumes.reconcile_where(&release, &|r| r.volume == lost).await;
    /// # }
    /// ```
    pub async fn reconcile_where(
        &self,
        lookup: &dyn RestoreLookup,
        pick: &(dyn Fn(&VolumeEntry) -> bool + Send + Sync),
    ) -> Reconciled {
        let mounts = read_mount_points();
        let keys: Vec<String> = self
            .usage()
            .iter()
            .filter(|(_, entry)| pick(entry))
            .map(|(key, _)| key.clone())
            .collect();
        let mut report = Reconciled::default();
        for key in keys {
            let _turn = self.inner.ops.turn(&key).await;
            // The record as it is now: a mount or unmount may have changed it meanwhile.
            let Some(entry) = self.entry(&key) else {
                continue;
            };
            for item in self
                .reconcile_record(&key, &entry, lookup, mounts.as_ref())
                .await
            {
                log(&item);
                self.emit(VolumeEvent::Reconcile(item.clone()));
                report.records.push(item);
            }
        }
        report
    }

    /// Every reconciliation of one record, with its volume's turn held.
    async fn reconcile_record(
        &self,
        key: &str,
        entry: &VolumeEntry,
        lookup: &dyn RestoreLookup,
        mounts: Option<&BTreeSet<PathBuf>>,
    ) -> Vec<Reconciliation> {
        let mounted = |path: Option<&Path>| Some(mounts?.contains(path?));
        let staging_mounted = mounted(entry.staging.as_deref());
        let (plugin, volume) = (entry.plugin.clone(), entry.volume.clone());
        let item = |workload: Option<WorkloadId>, publish, target, outcome| Reconciliation {
            plugin: plugin.clone(),
            volume: volume.clone(),
            workload,
            found: Found {
                stage: entry.stage,
                publish,
                staging_mounted,
                target_mounted: mounted(target),
            },
            outcome,
        };
        let external_id = &entry.external_id;
        let not_confirmed = |workload: Option<&WorkloadId>, source: VolumeError| {
            ReconcileOutcome::PluginMissing(VolumeError::NotConfirmed {
                plugin: plugin.clone(),
                volume: volume.clone(),
                workload: workload.cloned(),
                source: Box::new(source),
            })
        };
        let stage_confirmed = entry.staging.is_none() || self.stage_confirmed(key);

        if entry.users.is_empty() {
            // A staging left by an unmount or an undo that failed after the unpublish: no
            // workload uses it, so it is unstaged (an unused staging is never trusted either:
            // the next mount stages again).
            let nothing_staged = entry.staging.is_none() && entry.legacy_stagings.is_empty();
            let outcome =
                if entry.staging.is_some() && stage_confirmed && entry.legacy_stagings.is_empty() {
                    ReconcileOutcome::AlreadyConfirmed
                } else if !nothing_staged && self.inner.plugins.detach_client(&plugin).is_none() {
                    not_confirmed(
                        None,
                        VolumeError::PluginMissing {
                            plugin: plugin.clone(),
                        },
                    )
                } else {
                    let ids = Ids {
                        plugin: &plugin,
                        volume: &volume,
                        external_id,
                        workload: None,
                    };
                    match self.unstage_if_unused(key, &ids).await {
                        Ok(unstaged) => ReconcileOutcome::Cleaned { unstaged },
                        Err(e) => ReconcileOutcome::Failed(e),
                    }
                };
            return vec![item(None, None, None, outcome)];
        }

        let mut out = Vec::new();
        for (workload, user) in &entry.users {
            let found = |outcome| {
                item(
                    Some(workload.clone()),
                    Some(user.publish),
                    Some(user.target.as_path()),
                    outcome,
                )
            };
            // A stage confirmed meanwhile (by this record's first publication) counts.
            let staged_now = entry.staging.is_none() || self.stage_confirmed(key);
            if staged_now && self.publish_confirmed(key, workload) {
                out.push(found(ReconcileOutcome::AlreadyConfirmed));
                continue;
            }
            let restored = Restored {
                plugin: plugin.clone(),
                volume: volume.clone(),
                external_id: external_id.clone(),
                workload: workload.clone(),
                target: user.target.clone(),
                publish: user.publish,
            };
            let outcome = match lookup.restore(&restored) {
                Restore::Keep => ReconcileOutcome::Kept,
                Restore::Release => {
                    if self.inner.plugins.detach_client(&plugin).is_none() {
                        not_confirmed(
                            Some(workload),
                            VolumeError::PluginMissing {
                                plugin: plugin.clone(),
                            },
                        )
                    } else {
                        let req = UnmountRequest {
                            plugin: plugin.clone(),
                            volume: volume.clone(),
                            external_id: external_id.clone(),
                            workload: workload.clone(),
                            // Only names a target when there is no record; this one has.
                            usage: PublishUsage {
                                read_only: false,
                                attachment: AccessTypeKind::Mount,
                                access_mode: AccessMode::SingleNodeWriter,
                            },
                        };
                        match self.unmount_in_turn(&req).await {
                            Ok(done) => ReconcileOutcome::Released(done),
                            Err(e) => ReconcileOutcome::Failed(e),
                        }
                    }
                }
                Restore::Republish(r) => match self.publishable(&plugin) {
                    Err(e) => not_confirmed(Some(workload), e),
                    Ok(_) => {
                        let req = MountRequest {
                            plugin: plugin.clone(),
                            volume: volume.clone(),
                            external_id: external_id.clone(),
                            capability: r.capability,
                            read_only: r.read_only,
                            workload: workload.clone(),
                            publish_context: entry.publish_context.clone().unwrap_or_default(),
                            volume_context: r.volume_context,
                            secrets: r.secrets,
                        };
                        match self.mount_in_turn(&req).await {
                            Ok(m) => ReconcileOutcome::Republished {
                                target: m.target,
                                restaged: m.restaged,
                            },
                            Err(e) => ReconcileOutcome::Failed(e),
                        }
                    }
                },
            };
            out.push(found(outcome));
        }
        out
    }
}

fn log(item: &Reconciliation) {
    let workload = item.workload.as_ref().map(ToString::to_string);
    let workload = workload.as_deref().unwrap_or("-");
    match &item.outcome {
        ReconcileOutcome::PluginMissing(e) | ReconcileOutcome::Failed(e) => tracing::warn!(
            plugin = %item.plugin,
            volume = %item.volume,
            workload,
            action = item.action().as_str(),
            class = e.class().as_str(),
            error = %e,
            "usage record not confirmed; kept"
        ),
        _ => tracing::info!(
            plugin = %item.plugin,
            volume = %item.volume,
            workload,
            action = item.action().as_str(),
            "usage record reconciled"
        ),
    }
}

/// The mount points of this process's mount namespace (`None`: the table cannot be read).
fn read_mount_points() -> Option<BTreeSet<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    Some(mount_points(&text))
}

/// The mount points (fifth field) of a `mountinfo` text, with its octal escapes (`\040` for
/// a space) decoded.
fn mount_points(text: &str) -> BTreeSet<PathBuf> {
    text.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape(field)))
        .collect()
}

/// `\NNN` (three octal digits) as the byte it stands for.
fn unescape(field: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0')))
            .and_then(|n| u8::try_from(n).ok());
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    std::ffi::OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_the_fifth_field_unescaped() {
        let text = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    36 22 0:31 / /var/lib/csi/per\\040workload/w1 rw - tmpfs tmpfs rw\n\
                    37 22 0:32 / /bad\\9x rw - tmpfs tmpfs rw\n\
                    short line\n";
        let points = mount_points(text);
        assert!(points.contains(Path::new("/")));
        assert!(points.contains(Path::new("/var/lib/csi/per workload/w1")));
        assert!(points.contains(Path::new("/bad\\9x")), "{points:?}");
        assert_eq!(points.len(), 3);
    }

    #[test]
    fn this_process_s_mount_table_has_the_root() {
        // Linux only, like the rest of the node side.
        let points = read_mount_points().expect("readable");
        assert!(points.contains(Path::new("/")), "{points:?}");
    }
}
