//! Steps 10 to 13: the release, run by csi-claims' release pipeline through the adapters,
//! printed as each call ends.

use std::io::Write;
use std::time::{Duration, Instant};

use csi_claims::driver::ClaimsHandle;
use csi_claims::{DetachRpc, Event, VolumeInfo};
use csi_client::ErrorClass;
use tokio::sync::{broadcast, mpsc};

use super::error::{DemoError, StepError};
use super::observe::DetachRecord;
use super::plan::Plan;
use super::step::Step;
use super::walk::Walk;

/// How many failed release calls the demo watches before it gives up and reports. The
/// pipeline itself would retry forever with backoff; a demo should not.
pub(crate) const MAX_RELEASE_FAILURES: u32 = 3;

/// Hang guard for the whole release (each call has its own deadline in csi-client).
pub(crate) const RELEASE_GUARD: Duration = Duration::from_secs(600);

fn step_of(rpc: DetachRpc) -> Step {
    match rpc {
        DetachRpc::NodeUnpublish => Step::NodeUnpublish,
        DetachRpc::NodeUnstage => Step::NodeUnstage,
        DetachRpc::ControllerUnpublish => Step::ControllerUnpublish,
    }
}

impl<W: Write> Walk<'_, W> {
    /// Releases the demo's claim and waits until it is freed, printing each call.
    pub(crate) async fn release(
        &mut self,
        claims: &ClaimsHandle,
        records: &mut mpsc::UnboundedReceiver<DetachRecord>,
        plan: &Plan,
        info: &VolumeInfo,
    ) -> Result<(), DemoError> {
        let mut events = claims.subscribe();
        let started = Instant::now();
        if let Err(e) = claims.release(&info.id, &self.workload).await {
            return Err(self.fail(Step::NodeUnpublish, None, e.into()));
        }
        self.left.claim = Some("releasing".to_owned());
        let guard = tokio::time::sleep(RELEASE_GUARD);
        tokio::pin!(guard);
        let mut failures = 0;
        let mut last = started;
        let mut controller_seen = false;
        loop {
            tokio::select! {
                // Calls first: a call's record is sent before the pipeline learns its outcome,
                // so it is always printed before the Freed event that follows it.
                biased;
                Some(record) = records.recv() => {
                    last = Instant::now();
                    let step = step_of(record.rpc);
                    controller_seen |= step == Step::ControllerUnpublish;
                    match &record.outcome {
                        Ok(()) if step == Step::NodeUnstage && !plan.stage => {
                            self.skip(step, "the plugin lacks STAGE_UNSTAGE_VOLUME")?;
                        }
                        Ok(()) => {
                            self.settled(step);
                            self.row(step, Some(record.took), "ok")?;
                        }
                        Err(e) if e.class == ErrorClass::AlreadyDone => {
                            self.settled(step);
                            self.row(step, Some(record.took), "ok: already done")?;
                        }
                        Err(e) => {
                            failures += 1;
                            let gives_up = failures >= MAX_RELEASE_FAILURES
                                || matches!(e.class, ErrorClass::Fatal | ErrorClass::RetryElsewhere);
                            if gives_up {
                                let cause = StepError::Detach { error: e.clone(), attempts: failures };
                                self.left.claim = claims
                                    .status(&info.id)
                                    .and_then(|s| s.claims.first().map(|c| c.state().name().to_owned()))
                                    .or_else(|| self.left.claim.take());
                                return Err(self.fail(step, Some(record.took), cause));
                            }
                            self.row(
                                step,
                                Some(record.took),
                                &format!("failed ({}), the release pipeline retries: {e}", e.class.as_str()),
                            )?;
                        }
                    }
                }
                event = events.recv() => match event {
                    Ok(Event::Freed(claim)) if claim.volume() == &info.id => {
                        if !controller_seen {
                            self.skip(Step::ControllerUnpublish, "the plugin lacks PUBLISH_UNPUBLISH_VOLUME")?;
                        }
                        self.left.claim = None;
                        return self.row(Step::Free, Some(last.elapsed()), "ok: claim freed");
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        let cause = StepError::Claim(csi_claims::driver::DriverError::Stopped);
                        return Err(self.fail(Step::Free, None, cause));
                    }
                },
                () = &mut guard => {
                    return Err(self.fail(Step::Free, None, StepError::ReleaseTimedOut(RELEASE_GUARD)));
                }
            }
        }
    }

    /// A release call succeeded: forget what it undid.
    fn settled(&mut self, step: Step) {
        match step {
            Step::NodeUnpublish => self.left.published = None,
            Step::NodeUnstage => self.left.staged = None,
            Step::ControllerUnpublish => self.left.controller_published = None,
            _ => {}
        }
    }
}
