//! Running one step: the operation, each CSI call printed as the library reports it, and each
//! event the volume service sends printed under them.

use std::io::Write;
use std::time::{Duration, Instant};

use csi_client::{CallEvent, CallObserver};
use csi_control::ServiceEvent;
use csi_control::VolumeService;
use csi_control::service::ReleaseStepFailed;
use csi_structs::{ErrorClass, VolumeId, WorkloadId};
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::sync::mpsc;

use super::table::Table;
use super::{BoxError, DemoError, Step};

/// How many failed attempts of one release step the demo watches before it stops waiting.
/// The release pipeline itself never gives a release up; a demo should not wait forever.
const MAX_RELEASE_FAILURES: u32 = 3;

/// Hang guard for the whole release (each call has its own deadline).
const RELEASE_GUARD: Duration = Duration::from_secs(600);

/// The control plane's call observer: every call its clients report, sent to the walk.
#[derive(Debug)]
pub(crate) struct Calls(pub(crate) mpsc::UnboundedSender<CallEvent>);

impl CallObserver for Calls {
    fn on_call(&self, call: &CallEvent) {
        // The receiver goes only when the demo ends: nothing to show then.
        let _ = self.0.send(call.clone());
    }
}

/// The table with what feeds it: the calls and the service's events.
#[derive(Debug)]
pub(crate) struct Walk<'t, W: Write> {
    pub(crate) table: &'t mut Table<W>,
    calls: mpsc::UnboundedReceiver<CallEvent>,
    events: broadcast::Receiver<ServiceEvent>,
    /// Steps and calls skipped because the plugin does not need them.
    pub(crate) skipped: usize,
    /// The calls printed and the time taken by the last step.
    last: (usize, Duration),
}

impl<'t, W: Write> Walk<'t, W> {
    pub(crate) fn new(
        table: &'t mut Table<W>,
        calls: mpsc::UnboundedReceiver<CallEvent>,
        events: broadcast::Receiver<ServiceEvent>,
    ) -> Self {
        Walk {
            table,
            calls,
            events,
            skipped: 0,
            last: (0, Duration::ZERO),
        }
    }

    /// Runs `op` as `step`, printing its calls and the service's events as they come; on
    /// failure prints it under them and names the step.
    pub(crate) async fn step<T, E: Into<BoxError>>(
        &mut self,
        step: Step,
        op: impl Future<Output = Result<T, E>>,
    ) -> Result<T, DemoError> {
        let (before, started) = (self.table.calls(), Instant::now());
        tokio::pin!(op);
        let result = loop {
            // Each handler touches the table only: the receivers stay borrowed meanwhile.
            let printed = tokio::select! {
                biased;
                Some(call) = self.calls.recv() => self.table.call(step, &call),
                Ok(event) = self.events.recv() => {
                    self.table.note(step, &format!("service: {event}"))
                }
                result = &mut op => break result,
            };
            printed.map_err(DemoError::Output)?;
        };
        self.drain(step)?;
        self.last = (self.table.calls() - before, started.elapsed());
        result.map_err(|e| self.fail(step, e.into()))
    }

    /// Prints `step`'s failure under its calls (as its row when it made none) and names it.
    pub(crate) fn fail(&mut self, step: Step, cause: BoxError) -> DemoError {
        let text = format!("FAILED: {cause}");
        // The step's failure is what matters; an output error here cannot be reported.
        let _ = match self.last.0 {
            0 => self.table.row(step, "-", None, Some(self.last.1), &text),
            _ => self.table.note(step, &text),
        };
        DemoError::Step { step, cause }
    }

    /// Prints the calls and events that came in and are not printed yet.
    pub(crate) fn drain(&mut self, step: Step) -> Result<(), DemoError> {
        while let Ok(call) = self.calls.try_recv() {
            self.table.call(step, &call).map_err(DemoError::Output)?;
        }
        loop {
            match self.events.try_recv() {
                Ok(event) => self.note(step, &format!("service: {event}"))?,
                Err(TryRecvError::Lagged(_)) => {}
                Err(_) => return Ok(()),
            }
        }
    }

    /// After a step: its result as a row when it made no CSI call (so every step has one).
    pub(crate) fn result(&mut self, step: Step, text: &str) -> Result<(), DemoError> {
        if self.last.0 > 0 {
            return Ok(());
        }
        let took = Some(self.last.1);
        self.table
            .row(step, "-", None, took, text)
            .map_err(DemoError::Output)
    }

    /// Prints a skipped step or call.
    pub(crate) fn skip(&mut self, step: Step, rpc: &str, why: &str) -> Result<(), DemoError> {
        self.skipped += 1;
        let why = format!("skipped: {why}");
        self.table
            .row(step, rpc, None, None, &why)
            .map_err(DemoError::Output)
    }

    /// Prints a note under `step`'s rows.
    pub(crate) fn note(&mut self, step: Step, text: &str) -> Result<(), DemoError> {
        self.table.note(step, text).map_err(DemoError::Output)
    }
}

/// Releases the claim through the service and follows the release pipeline's progress on the
/// service's events until the claim is freed; gives up (the pipeline goes on) once a step
/// failed fatally, needs another instance, or failed [`MAX_RELEASE_FAILURES`] times.
pub(crate) async fn release(
    service: &VolumeService,
    volume: &VolumeId,
    workload: &WorkloadId,
) -> Result<(), BoxError> {
    let mut events = service.subscribe();
    service.release(volume, workload).await?;
    let gives_up = |f: &ReleaseStepFailed| {
        f.attempt >= MAX_RELEASE_FAILURES
            || matches!(f.class, ErrorClass::Fatal | ErrorClass::RetryElsewhere)
    };
    let freed = async {
        loop {
            match events.recv().await {
                Ok(ServiceEvent::Freed {
                    volume: v,
                    workload: w,
                    ..
                }) if &v == volume && &w == workload => return Ok(()),
                Ok(ServiceEvent::ReleaseStepFailed(f)) if &f.volume == volume && gives_up(&f) => {
                    return Err(format!(
                        "{f}; the demo stops waiting (the release pipeline would retry it \
                         without end)"
                    ));
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return Err("the volume service stopped".to_owned()),
            }
        }
    };
    match tokio::time::timeout(RELEASE_GUARD, freed).await {
        Ok(freed) => Ok(freed?),
        Err(_) => Err(format!("the release did not finish within {RELEASE_GUARD:?}").into()),
    }
}
