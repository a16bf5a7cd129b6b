//! Operations that run to their end, whoever awaits them.
//!
//! Every operation that changes something runs in a Tokio task of its own, over a handle of
//! the service; the future its caller awaits only waits for the answer. A caller that stops
//! waiting (an HTTP client that timed out, a `select!` that took another branch) drops that
//! future and nothing else: the operation goes on to its end, or to its undo, exactly as if
//! it had been awaited, and then logs one line saying that its caller left and how it ended.

use std::sync::Arc;

use csi_structs::VolumeId;
use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::{Inner, ServiceError, VolumeService};

impl VolumeService {
    /// Another handle on the same service, for a task to own.
    fn handle(&self) -> VolumeService {
        VolumeService {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Runs `work` over a handle of this service in a task of its own and answers what it
    /// answers. Dropping the returned future does not stop the task: it runs to its end and
    /// then logs that the caller of `operation` (on `volume`, when it has one) left before,
    /// and how it ended. A panic of the operation is the caller's panic.
    ///
    /// # Errors
    ///
    /// The operation's, and [`ServiceError::Stopped`] when its task was dropped before it
    /// answered (the runtime is shutting down).
    pub(super) async fn to_the_end<T, F>(
        &self,
        operation: &'static str,
        volume: Option<&VolumeId>,
        work: impl FnOnce(VolumeService) -> F,
    ) -> Result<T, ServiceError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, ServiceError>> + Send + 'static,
    {
        let (answer, heard) = oneshot::channel();
        let volume = volume.cloned();
        let running = Running::start(self.handle());
        let work = work(self.handle());
        // In the caller's span, as if it ran in the caller's task.
        let task = tokio::spawn(
            async move {
                let _running = running;
                let outcome = work.await;
                if let Err(unheard) = answer.send(outcome) {
                    caller_left(operation, volume.as_ref(), &unheard);
                }
            }
            .in_current_span(),
        );
        match heard.await {
            Ok(outcome) => outcome,
            // The task ended without answering: it panicked, or it was dropped.
            Err(_) => match task.await {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                _ => Err(ServiceError::Stopped { operation }),
            },
        }
    }

    /// Waits until no operation of this service runs, those whose callers left included
    /// (each runs to its end in a task of its own: [`module docs`](super#dropping-the-future)).
    /// Operations started meanwhile are waited for too. Every operation's plugin calls and
    /// waits have deadlines, so this ends; bound it with a timeout to give up sooner.
    pub async fn wait_idle(&self) {
        let mut running = self.inner.running.subscribe();
        // The sender lives in `self.inner`, so the wait ends only once none runs.
        let _ = running.wait_for(|n| *n == 0).await;
    }
}

/// One running operation, counted in [`Inner::running`] from its start until it is dropped
/// (at its task's end, however it ends).
struct Running {
    service: Arc<Inner>,
}

impl Running {
    fn start(service: VolumeService) -> Running {
        service.inner.running.send_modify(|n| *n += 1);
        Running {
            service: service.inner,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.service
            .running
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The line of an operation whose caller left before its end: what, on which volume, that
/// the caller hung up, and how it ended.
fn caller_left<T>(
    operation: &'static str,
    volume: Option<&VolumeId>,
    outcome: &Result<T, ServiceError>,
) {
    let volume = volume.map(tracing::field::display);
    match outcome {
        Ok(_) => tracing::info!(
            operation,
            volume,
            outcome = "done",
            "the caller hung up before the operation ended; it ran to its end"
        ),
        Err(e) => tracing::warn!(
            operation,
            volume,
            outcome = "failed",
            class = e.class().map(|c| c.as_str()),
            error = %e,
            "the caller hung up before the operation ended; it ran to its end"
        ),
    }
}
