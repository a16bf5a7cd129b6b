//! What happens to every call before and after its rpc logic: it is recorded, guarded against a
//! concurrent call on the same volume (ABORTED), put through the fault scripts, checked against
//! the configured capabilities (UNIMPLEMENTED) and the required secrets (INVALID_ARGUMENT), and
//! its outcome recorded.

use std::fmt;
use std::time::Duration;

use csi_proto::Rpc;
use tonic::{Request, Response, Status};

use crate::calls::RecordedOutcome;
use crate::faults::FaultStep;
use crate::plugin::MockPlugin;
use crate::secrets::CallSecrets;
use crate::transport::killable::KillSwitch;

/// How long a call whose connection was dropped waits for the connection task to drop it.
const DROPPED_CALL_LINGER: Duration = Duration::from_secs(60);

/// The response stream of the streaming rpcs: messages computed up front.
pub(crate) type VecStream<T> = tokio_stream::Iter<std::vec::IntoIter<Result<T, Status>>>;

/// What a call is about, for the log, the concurrency guard and fault matching.
#[derive(Debug, Default)]
pub(crate) struct Target {
    pub(crate) volume: Option<String>,
    pub(crate) node: Option<String>,
    /// The in-flight key; a second call with the same key while this one runs gets ABORTED.
    pub(crate) lock: Option<String>,
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

impl Target {
    /// A read-only call with no subject.
    pub(crate) fn none() -> Self {
        Target::default()
    }

    /// A read-only call about a volume.
    pub(crate) fn read_volume(volume_id: &str) -> Self {
        Target {
            volume: non_empty(volume_id),
            ..Target::default()
        }
    }

    /// A mutating call about a volume: concurrent calls on it get ABORTED.
    pub(crate) fn volume(volume_id: &str) -> Self {
        Target {
            volume: non_empty(volume_id),
            lock: non_empty(volume_id).map(|v| format!("volume:{v}")),
            node: None,
        }
    }

    /// A mutating call about a snapshot (by id or by name).
    pub(crate) fn snapshot(kind: &str, key: &str) -> Self {
        Target {
            lock: non_empty(key).map(|k| format!("{kind}:{k}")),
            ..Target::default()
        }
    }

    pub(crate) fn with_node(mut self, node_id: &str) -> Self {
        self.node = non_empty(node_id);
        self
    }

    pub(crate) fn with_volume(mut self, volume_id: &str) -> Self {
        self.volume = non_empty(volume_id);
        self
    }
}

/// One call being served. Records the outcome when finished; a call dropped before it
/// finished (the caller gave up) is recorded as [`RecordedOutcome::Abandoned`].
pub(crate) struct CallScope {
    plugin: MockPlugin,
    rpc: Rpc,
    seq: u64,
    finished: bool,
    lock: Option<String>,
    /// Set by a [`FaultStep::FailStreamAfter`] step for the streaming rpcs.
    pub(crate) stream_fault: Option<(usize, Status)>,
}

impl fmt::Debug for CallScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallScope").field("seq", &self.seq).finish()
    }
}

impl CallScope {
    fn record(&mut self, outcome: RecordedOutcome) {
        self.finished = true;
        tracing::debug!(
            rpc = self.rpc.name(),
            seq = self.seq,
            ?outcome,
            "csi mock call"
        );
        self.plugin.shared.lock().calls.finish(self.seq, outcome);
        self.plugin.shared.log_changed.notify_waiters();
    }

    fn release_lock(&mut self) {
        if let Some(key) = self.lock.take() {
            self.plugin.shared.lock().in_flight.remove(&key);
        }
    }

    /// Records a failure and hands the status back.
    pub(crate) fn fail(mut self, status: Status) -> Status {
        self.record(RecordedOutcome::Failed {
            code: status.code(),
            message: status.message().to_string(),
        });
        status
    }

    /// Records the result and wraps it for tonic.
    pub(crate) fn finish<T>(mut self, result: Result<T, Status>) -> Result<Response<T>, Status> {
        match result {
            Ok(value) => match self.plugin.shared.save_state() {
                Ok(()) => {
                    self.record(RecordedOutcome::Ok);
                    Ok(Response::new(value))
                }
                Err(err) => {
                    let rpc = self.rpc.name();
                    Err(self.fail(Status::internal(format!(
                        "{rpc}: the state changed but was not saved: {err}"
                    ))))
                }
            },
            Err(status) => Err(self.fail(status)),
        }
    }

    /// Records the result of a streaming rpc and turns its messages into the response stream,
    /// cut short by a [`FaultStep::FailStreamAfter`] step if one applies.
    pub(crate) fn finish_stream<T>(
        mut self,
        result: Result<Vec<T>, Status>,
    ) -> Result<Response<VecStream<T>>, Status> {
        let items = match result {
            Ok(items) => items,
            Err(status) => return Err(self.fail(status)),
        };
        let mut out: Vec<Result<T, Status>> = items.into_iter().map(Ok).collect();
        match self.stream_fault.take() {
            Some((messages, status)) => {
                out.truncate(messages);
                self.record(RecordedOutcome::Failed {
                    code: status.code(),
                    message: status.message().to_string(),
                });
                out.push(Err(status));
            }
            None => self.record(RecordedOutcome::Ok),
        }
        Ok(Response::new(tokio_stream::iter(out)))
    }

    /// Sets the volume id in the log (`CreateVolume` learns it only when it succeeds).
    pub(crate) fn set_volume(&self, volume_id: &str) {
        self.plugin
            .shared
            .lock()
            .calls
            .set_volume(self.seq, volume_id.to_string());
    }
}

impl Drop for CallScope {
    fn drop(&mut self) {
        self.release_lock();
        if !self.finished {
            self.plugin
                .shared
                .lock()
                .calls
                .finish(self.seq, RecordedOutcome::Abandoned);
            self.plugin.shared.log_changed.notify_waiters();
        }
    }
}

impl MockPlugin {
    /// Starts serving a call: records it and applies the concurrency guard, the fault scripts,
    /// the capabilities and the required secrets, in that order. `Err` is the status to answer
    /// (already recorded).
    pub(crate) async fn begin<T: fmt::Debug + CallSecrets>(
        &self,
        rpc: Rpc,
        request: &Request<T>,
        target: Target,
    ) -> Result<CallScope, Status> {
        let kill = request.extensions().get::<KillSwitch>().cloned();
        let text = format!("{:?}", request.get_ref());
        let node = target.node.clone().or_else(|| {
            (rpc.service() == csi_proto::Service::Node).then(|| self.node_id().to_owned())
        });
        // One critical section: once the call is visible in the log it also holds its volume,
        // so a test that waits for the log can rely on a second call being ABORTED.
        let (seq, busy, step, resumes) = {
            let mut inner = self.shared.lock();
            let seq = inner.calls.push(rpc, target.volume.clone(), node, text);
            let busy = target
                .lock
                .as_ref()
                .is_some_and(|key| !inner.in_flight.insert(key.clone()));
            let step = if busy {
                None
            } else {
                inner.faults.take(rpc, target.volume.as_deref())
            };
            // Read with the record: a resume the log's reader sends after seeing the call
            // is one this call waits for.
            let resumes = *self.shared.resume.borrow();
            (seq, busy, step, resumes)
        };
        self.shared.log_changed.notify_waiters();
        let mut scope = CallScope {
            plugin: self.clone(),
            rpc,
            seq,
            finished: false,
            lock: if busy { None } else { target.lock.clone() },
            stream_fault: None,
        };
        if busy {
            return Err(scope.fail(Status::aborted(format!(
                "{}: another operation on {} is still in progress",
                rpc.name(),
                target.lock.as_deref().unwrap_or_default()
            ))));
        }

        // A scripted outcome wins over everything, even UNIMPLEMENTED and missing secrets: a
        // test may want a plugin that answers an rpc it does not advertise. A plugin does not
        // look at the secrets of an rpc it does not serve, so UNIMPLEMENTED comes first; the
        // secrets are checked when the call would be served (after a scripted delay).
        let serve = |scope: CallScope| {
            if let Some(reason) = self.shared.refusal(rpc) {
                return Err(scope.fail(Status::unimplemented(reason)));
            }
            let secrets = self
                .shared
                .lock()
                .required_secrets
                .check(rpc, request.get_ref().secrets());
            match secrets {
                Ok(()) => Ok(scope),
                Err(status) => Err(scope.fail(status)),
            }
        };
        match step {
            None | Some(FaultStep::Pass) => serve(scope),
            Some(FaultStep::Fail { code, message }) => Err(scope.fail(Status::new(code, message))),
            Some(FaultStep::FailStreamAfter {
                messages,
                code,
                message,
            }) => {
                let status = Status::new(code, message);
                if rpc.is_server_streaming() {
                    scope.stream_fault = Some((messages, status));
                    serve(scope)
                } else {
                    Err(scope.fail(status))
                }
            }
            Some(FaultStep::Delay(delay)) => {
                let released = self.shared.release.notified();
                tokio::select! {
                    () = tokio::time::sleep(delay) => serve(scope),
                    () = released => Err(scope.fail(released_status(rpc))),
                }
            }
            Some(FaultStep::Hold) => {
                let released = self.shared.release.notified();
                let mut resume = self.shared.resume.subscribe();
                tokio::select! {
                    // The sender lives in the plugin this call runs on.
                    _ = resume.wait_for(|r| *r > resumes) => serve(scope),
                    () = released => Err(scope.fail(released_status(rpc))),
                }
            }
            Some(FaultStep::Hang) => {
                // Dropped (and recorded as abandoned) when the caller gives up.
                self.shared.release.notified().await;
                Err(scope.fail(released_status(rpc)))
            }
            Some(FaultStep::DropConnection) => {
                scope.record(RecordedOutcome::ConnectionDropped);
                // The call is over as far as the mock is concerned: free its volume now rather
                // than when the connection task gets round to dropping this future.
                scope.release_lock();
                match kill {
                    Some(switch) => switch.trip(),
                    None => {
                        return Err(Status::unavailable(format!(
                            "{}: connection dropped by a fault script (this transport cannot \
                             be torn down, so the call fails instead)",
                            rpc.name()
                        )));
                    }
                }
                // The connection task drops this future when it notices the dead connection.
                let released = self.shared.release.notified();
                tokio::select! {
                    () = tokio::time::sleep(DROPPED_CALL_LINGER) => {}
                    () = released => {}
                }
                Err(Status::unavailable(format!(
                    "{}: connection dropped by a fault script",
                    rpc.name()
                )))
            }
        }
    }
}

fn released_status(rpc: Rpc) -> Status {
    Status::unavailable(format!(
        "{}: a hung or delayed call was released (mock shutting down or release_hung)",
        rpc.name()
    ))
}
