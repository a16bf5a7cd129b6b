//! The attempt loop: deadlines, classification, retries, budget, spans and observer events.
//!
//! Every RPC of every typed client goes through [`Caller::call`]. One call:
//! 1. takes the RPC's [`RpcPolicy`] (client table plus per-call [`CallOptions`]);
//! 2. runs attempts, each under `tokio::time::timeout` of the attempt deadline (clipped to what
//!    is left of the total budget) and with the same deadline sent as `grpc-timeout`;
//! 3. classifies each failure ([`classify_failure`]) and retries only what the policy retries,
//!    while attempts, the total budget and the shared [`RetryBudget`] allow, pausing by the
//!    policy's [`Backoff`](crate::Backoff).
//!
//! Dropping the returned future cancels the call: the in-flight HTTP/2 stream is reset and no
//! further attempt is made.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::answer::AnswerWatch;
use crate::budget::RetryBudget;
use crate::channel::PluginChannel;
use crate::connection::{ConnectError, Connection, DialFailure};
use crate::error::{
    CallContext, DeadlineScope, Elapsed, Error, ErrorKind, H2Code, ResponseError, TransportFault,
};
use crate::inflight::CallsInFlight;
use crate::link::Handover;
use crate::observe::{AttemptEvent, CallEvent, CallObserver, CallOutcome};
use crate::policy::{CallOptions, PolicyTable, RpcPolicy, classify_failure};
use crate::turns::{self, VolumeTurns};
use crate::validate::{CsiRequest, CsiResponse, check_request, check_response};

/// Everything the typed clients share: the connection, the policy table, the retry budget and
/// the observer. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Caller {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    connection: Connection,
    policies: PolicyTable,
    budget: Arc<RetryBudget>,
    observer: Option<Arc<dyn CallObserver>>,
    turns: Arc<VolumeTurns>,
    calls: Arc<CallsInFlight>,
}

/// Why one attempt failed before classification.
enum AttemptError {
    Dial(DialFailure),
    Status(tonic::Status),
}

impl Caller {
    pub(crate) fn new(
        connection: Connection,
        policies: PolicyTable,
        budget: Arc<RetryBudget>,
        observer: Option<Arc<dyn CallObserver>>,
        turns: Arc<VolumeTurns>,
        calls: Arc<CallsInFlight>,
    ) -> Self {
        Caller {
            shared: Arc::new(Shared {
                connection,
                policies,
                budget,
                observer,
                turns,
                calls,
            }),
        }
    }

    pub(crate) fn turns(&self) -> &Arc<VolumeTurns> {
        &self.shared.turns
    }

    pub(crate) fn calls(&self) -> &Arc<CallsInFlight> {
        &self.shared.calls
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.shared.connection
    }

    pub(crate) fn policies(&self) -> &PolicyTable {
        &self.shared.policies
    }

    pub(crate) fn budget(&self) -> &Arc<RetryBudget> {
        &self.shared.budget
    }

    /// The policy a call of `rpc` with `options` runs under. Probe is never retried, whatever
    /// the table or the call options say: its caller (a health loop) is the retry loop, and a
    /// retried probe would hide exactly the flapping it exists to report.
    pub(crate) fn policy(&self, context: &CallContext, options: &CallOptions) -> RpcPolicy {
        let mut policy = self
            .shared
            .policies
            .get(context.rpc())
            .with_options(options);
        if context.rpc() == csi_proto::Rpc::Probe {
            policy.max_attempts = 1;
        }
        policy
    }

    /// Reports a call that failed before any attempt (an invalid request) and builds its error.
    pub(crate) fn refuse(&self, context: CallContext, kind: ErrorKind) -> Error {
        let failure = kind.failure();
        let class = classify_failure(context.rpc(), failure);
        tracing::debug!(rpc = context.rpc().name(), error = %kind, "request refused before sending");
        if let Some(observer) = &self.shared.observer {
            observer.on_call(&CallEvent {
                rpc: context.rpc(),
                volume: context.volume_id().cloned(),
                attempts: 0,
                duration: Duration::ZERO,
                outcome: CallOutcome::Failed { failure, class },
            });
        }
        Error::new(context, kind, class, 0)
    }

    /// Validates `request`, runs it under its policy, and checks and converts the answer.
    pub(crate) async fn unary<Req, Resp, Out, F, Fut, C>(
        &self,
        options: &CallOptions,
        request: Req,
        send: F,
        convert: C,
    ) -> Result<Out, Error>
    where
        Req: CsiRequest,
        Resp: CsiResponse,
        F: Fn(PluginChannel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
        C: Fn(Resp) -> Result<Out, ErrorKind>,
    {
        let context = request.context();
        if let Err(errs) = check_request(&request) {
            return Err(self.refuse(context, ErrorKind::InvalidRequest(errs)));
        }
        self.call(context, options, request, send, move |resp: Resp| {
            check_response(&resp)
                .map_err(|errs| ErrorKind::InvalidResponse(ResponseError::Fields(errs)))?;
            convert(resp)
        })
        .await
        .map(|(out, _, _)| out)
    }

    /// Validates `request` and opens a server stream under the RPC's policy (the opening is
    /// retried like a unary call). Returns the stream with the record of its answer, the
    /// policy it ran under, and when the call started.
    pub(crate) async fn open_stream<Req, T, F, Fut>(
        &self,
        options: &CallOptions,
        request: Req,
        send: F,
    ) -> Result<(OpenStream<T>, CallContext, RpcPolicy, Instant), Error>
    where
        Req: CsiRequest,
        F: Fn(PluginChannel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>>,
    {
        let context = request.context();
        if let Err(errs) = check_request(&request) {
            return Err(self.refuse(context, ErrorKind::InvalidRequest(errs)));
        }
        let started = Instant::now();
        let policy = self.policy(&context, options);
        let (stream, _, answer) = self
            .call(context.clone(), options, request, send, Ok)
            .await?;
        Ok(((stream, answer), context, policy, started))
    }

    /// Runs one RPC under its policy. `send` performs one attempt on the shared channel;
    /// `convert` checks an OK answer and turns it into the result (a failure there is an
    /// invalid response: classified, never retried).
    ///
    /// Returns the result, the number of attempts made and the record of the answer.
    pub(crate) async fn call<Req, Resp, Out, F, Fut, C>(
        &self,
        context: CallContext,
        options: &CallOptions,
        request: Req,
        send: F,
        convert: C,
    ) -> Result<(Out, u32, AnswerWatch), Error>
    where
        Req: Clone,
        F: Fn(PluginChannel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
        C: Fn(Resp) -> Result<Out, ErrorKind>,
    {
        let rpc = context.rpc();
        let policy = self.policy(&context, options);
        let span = tracing::debug_span!(
            "csi.call",
            rpc = rpc.name(),
            volume_id = context.volume_id().map(|v| v.as_str()),
            node_id = context.node_id().map(|n| n.as_str()),
            attempts = tracing::field::Empty,
            code = tracing::field::Empty,
            class = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let result = self
            .attempt_loop(&context, &policy, request, send, convert)
            .instrument(span.clone())
            .await;
        let (outcome, attempts, duration) = match &result {
            Ok((_, attempts, duration, _)) => (CallOutcome::Ok, *attempts, *duration),
            Err((error, duration)) => (
                CallOutcome::Failed {
                    failure: error.kind().failure(),
                    class: error.class(),
                },
                error.attempts(),
                *duration,
            ),
        };
        span.record("attempts", attempts);
        span.record("code", outcome.label());
        if let CallOutcome::Failed { class, .. } = outcome {
            span.record("class", class.as_str());
        }
        span.record("duration_ms", duration.as_millis() as u64);
        if let Some(observer) = &self.shared.observer {
            observer.on_call(&CallEvent {
                rpc,
                volume: context.volume_id().cloned(),
                attempts,
                duration,
                outcome,
            });
        }
        match result {
            Ok((resp, attempts, _, answer)) => Ok((resp, attempts, answer)),
            Err((error, _)) => {
                span.in_scope(|| tracing::debug!(error = %error, "call failed"));
                Err(error)
            }
        }
    }

    async fn attempt_loop<Req, Resp, Out, F, Fut, C>(
        &self,
        context: &CallContext,
        policy: &RpcPolicy,
        request: Req,
        send: F,
        convert: C,
    ) -> Result<(Out, u32, Duration, AnswerWatch), (Error, Duration)>
    where
        Req: Clone,
        F: Fn(PluginChannel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
        C: Fn(Resp) -> Result<Out, ErrorKind>,
    {
        let rpc = context.rpc();
        let streaming = rpc.is_server_streaming();
        let start = Instant::now();
        let call_deadline = start + policy.total_budget;
        self.shared.budget.deposit();
        let mut delays = policy.backoff.delays(policy.max_attempts.saturating_sub(1));
        let mut attempt: u32 = 0;
        // Listed until the call ends, however it ends (a dropped call included).
        let listed = self.shared.calls.enter(context, policy.max_attempts);
        // One call in flight per volume: each attempt waits for its volume's turn, within
        // the call's budget, and gives it back when it ends.
        let volume = turns::volume_of(rpc, context.volume_id());
        loop {
            attempt += 1;
            listed.turn(attempt);
            let turn = match volume {
                Some(volume) => {
                    let take = self.shared.turns.take(volume);
                    match tokio::time::timeout_at(call_deadline, take).await {
                        Ok(turn) => Some(turn),
                        Err(_) => {
                            let kind = ErrorKind::VolumeBusy {
                                budget: policy.total_budget,
                            };
                            let class = classify_failure(rpc, kind.failure());
                            tracing::debug!(attempt, "the volume stayed busy until the deadline");
                            let error = Error::new(context.clone(), kind, class, attempt - 1);
                            return Err((error, start.elapsed()));
                        }
                    }
                }
                None => None,
            };
            let attempt_start = Instant::now();
            let left = call_deadline.saturating_duration_since(attempt_start);
            let clipped = left < policy.attempt_deadline;
            let limit = if clipped {
                left
            } else {
                policy.attempt_deadline
            };
            let attempt_deadline = attempt_start + limit;
            listed.sent(attempt, limit);
            let connection = &self.shared.connection;
            // How far the request got: a deadline that expires while it still waits for a
            // connection (the first dial here, a redial in the link) means nothing reached
            // the plugin.
            let handover = Handover::new();
            // What the plugin's answer held, to tell its status from an answer we refused.
            let answer = AnswerWatch::new();
            let one = async {
                let channel = connection.channel().await.map_err(AttemptError::Dial)?;
                handover.handed();
                let mut req = tonic::Request::new(request.clone());
                req.extensions_mut().insert(handover.clone());
                req.extensions_mut().insert(answer.clone());
                // The plugin learns the deadline too. A stream's messages may take the whole
                // call budget; its opening is still bounded by the attempt deadline below.
                let header = if streaming {
                    call_deadline.saturating_duration_since(Instant::now())
                } else {
                    attempt_deadline.saturating_duration_since(Instant::now())
                };
                req.set_timeout(header.max(Duration::from_millis(1)));
                send(channel, req).await.map_err(AttemptError::Status)
            };
            let outcome = tokio::time::timeout_at(attempt_deadline, one)
                .instrument(tracing::debug_span!("csi.attempt", attempt))
                .await;
            drop(turn);
            let elapsed = attempt_start.elapsed();
            let scope = if clipped {
                Elapsed::new(DeadlineScope::Call, policy.total_budget)
            } else {
                Elapsed::new(DeadlineScope::Attempt, policy.attempt_deadline)
            };
            let kind = match outcome {
                Ok(Ok(_)) if !streaming && let Some(kind) = answer.extra_messages() => kind,
                Ok(Ok(response)) => match convert(response.into_inner()) {
                    Ok(out) => {
                        self.observe_attempt(rpc, attempt, elapsed, CallOutcome::Ok);
                        return Ok((out, attempt, start.elapsed(), answer));
                    }
                    Err(kind) => kind,
                },
                Ok(Err(AttemptError::Dial(DialFailure::Connect(e)))) => ErrorKind::of_dial(e),
                Ok(Err(AttemptError::Dial(DialFailure::Handshake(e)))) => ErrorKind::Handshake(e),
                Ok(Err(AttemptError::Status(status))) => kind_of_status(status, &answer),
                Err(_) if handover.is_waiting() => {
                    ErrorKind::NotConnected(ConnectError::timed_out(connection.endpoint(), elapsed))
                }
                Err(_) => ErrorKind::Timeout(scope),
            };
            let failure = kind.failure();
            let class = classify_failure(rpc, failure);
            self.observe_attempt(
                rpc,
                attempt,
                elapsed,
                CallOutcome::Failed { failure, class },
            );
            tracing::debug!(
                attempt,
                code = CallOutcome::Failed { failure, class }.label(),
                class = class.as_str(),
                "attempt failed"
            );

            let fail = |budget_exhausted: bool| {
                let error = Error::new(context.clone(), kind, class, attempt);
                let error = if budget_exhausted {
                    error.with_budget_exhausted()
                } else {
                    error
                };
                Err((error, start.elapsed()))
            };
            if !policy.retries(failure) || attempt >= policy.max_attempts {
                return fail(false);
            }
            let Some(pause) = delays.next() else {
                return fail(false);
            };
            if Instant::now() + pause >= call_deadline {
                return fail(false);
            }
            if !self.shared.budget.try_withdraw() {
                return fail(true);
            }
            tracing::debug!(
                attempt,
                ?pause,
                class = class.as_str(),
                "retrying after pause"
            );
            listed.backoff();
            tokio::time::sleep(pause).await;
        }
    }

    fn observe_attempt(
        &self,
        rpc: csi_proto::Rpc,
        attempt: u32,
        duration: Duration,
        outcome: CallOutcome,
    ) {
        if let Some(observer) = &self.shared.observer {
            observer.on_attempt(&AttemptEvent {
                rpc,
                attempt,
                duration,
                outcome,
            });
        }
    }
}

/// A server stream and the record of the answer that carries it.
pub(crate) type OpenStream<T> = (tonic::Streaming<T>, AnswerWatch);

/// Sorts a tonic status into what actually happened, by the *types* in its source chain:
/// - our dial failure ([`DialFailure`], [`ConnectError`]): the link could not redial the
///   plugin; nothing was sent;
/// - any other source: a transport failure after the request was handed to the connection;
/// - no source: a status the plugin sent, or tonic's failure to read the answer, which
///   `answer` (what the link saw of it) tells apart.
pub(crate) fn kind_of_status(status: tonic::Status, answer: &AnswerWatch) -> ErrorKind {
    let mut source = std::error::Error::source(&status);
    let mut transport = false;
    while let Some(err) = source {
        transport = true;
        if let Some(dial) = err.downcast_ref::<DialFailure>() {
            return match dial {
                DialFailure::Connect(connect) => ErrorKind::of_dial(connect.duplicate()),
                DialFailure::Handshake(handshake) => ErrorKind::Handshake(handshake.clone()),
            };
        }
        if let Some(connect) = err.downcast_ref::<ConnectError>() {
            return ErrorKind::of_dial(connect.duplicate());
        }
        source = err.source();
    }
    if transport {
        ErrorKind::ConnectionLost {
            fault: fault_of(&status, answer.headers_arrived()),
        }
    } else {
        answer.kind_of(&status)
    }
}

/// What broke a call, from the kinds of the transport errors in `status`'s source chain
/// (never their text).
fn fault_of(status: &tonic::Status, after_headers: bool) -> TransportFault {
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return fault_of_h2(h2, after_headers);
        }
        if err.downcast_ref::<std::io::Error>().is_some() {
            return TransportFault::Closed { after_headers };
        }
        source = err.source();
    }
    TransportFault::Other
}

fn fault_of_h2(error: &h2::Error, after_headers: bool) -> TransportFault {
    let code = error.reason().map(|r| H2Code(r.into()));
    if error.is_io() {
        TransportFault::Closed { after_headers }
    } else if error.is_go_away() && error.is_remote() {
        TransportFault::GoAway {
            code: code.unwrap_or(H2Code(0)),
            after_headers,
        }
    } else if error.is_reset() && error.is_remote() {
        TransportFault::StreamReset {
            code: code.unwrap_or(H2Code(0)),
            after_headers,
        }
    } else if let Some(code) = code {
        TransportFault::Protocol { code }
    } else {
        TransportFault::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Endpoint;
    use tonic::Code;

    #[test]
    fn statuses_are_sorted_by_the_types_in_their_source_chain() {
        let sent = AnswerWatch::sent_status(Code::NotFound as u32);
        let plugin = kind_of_status(tonic::Status::new(Code::NotFound, "gone"), &sent);
        assert!(
            matches!(plugin, ErrorKind::Status { code: Code::NotFound, ref message } if message == "gone")
        );

        // The link's redial gave up: nothing was sent.
        let endpoint: Endpoint = "/run/none.sock".parse().unwrap();
        let dial =
            DialFailure::Connect(ConnectError::timed_out(&endpoint, Duration::from_millis(5)));
        let not_connected = tonic::Status::from_error(Box::new(dial));
        assert!(matches!(
            kind_of_status(not_connected, &AnswerWatch::new()),
            ErrorKind::NotConnected(ref e) if e.waited() == Duration::from_millis(5)
        ));

        // A new connection closed before taking the request: nothing was sent either.
        let unsent = DialFailure::Connect(ConnectError::closed_unsent(&endpoint));
        assert!(matches!(
            kind_of_status(
                tonic::Status::from_error(Box::new(unsent)),
                &AnswerWatch::new()
            ),
            ErrorKind::NotConnected(_)
        ));

        // Any other transport error: the connection broke under the call.
        let broken = tonic::Status::from_error(Box::new(std::io::Error::other("connection reset")));
        assert!(matches!(
            kind_of_status(broken, &AnswerWatch::new()),
            ErrorKind::ConnectionLost { .. }
        ));
    }
}
