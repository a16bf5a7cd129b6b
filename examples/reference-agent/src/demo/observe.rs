//! Detachers that report each call of the release pipeline, so the demo can print it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use csi_claims::driver::{ControllerDetacher, NodeDetacher};
use csi_claims::{ControllerDetachRequest, DetachError, DetachRpc, NodeDetachRequest};
use tokio::sync::mpsc;

/// One detach call the release pipeline made.
#[derive(Debug, Clone)]
pub struct DetachRecord {
    /// Which call.
    pub rpc: DetachRpc,
    /// How long it took.
    pub took: Duration,
    /// How it ended.
    pub outcome: Result<(), DetachError>,
}

/// Wraps a node and a controller detacher, sending a [`DetachRecord`] per call.
#[derive(Debug)]
pub struct Observed<D: ?Sized> {
    inner: Arc<D>,
    records: mpsc::UnboundedSender<DetachRecord>,
}

impl<D: ?Sized> Observed<D> {
    /// Reports `inner`'s calls to `records`.
    pub fn new(inner: Arc<D>, records: mpsc::UnboundedSender<DetachRecord>) -> Self {
        Self { inner, records }
    }

    fn report(&self, rpc: DetachRpc, started: Instant, outcome: &Result<(), DetachError>) {
        // The receiver is gone only when the demo stopped listening; nothing to report to.
        let _ = self.records.send(DetachRecord {
            rpc,
            took: started.elapsed(),
            outcome: outcome.clone(),
        });
    }
}

#[async_trait]
impl<D: NodeDetacher + ?Sized> NodeDetacher for Observed<D> {
    async fn node_unpublish(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        let started = Instant::now();
        let outcome = self.inner.node_unpublish(request).await;
        self.report(DetachRpc::NodeUnpublish, started, &outcome);
        outcome
    }

    async fn node_unstage(&self, request: &NodeDetachRequest) -> Result<(), DetachError> {
        let started = Instant::now();
        let outcome = self.inner.node_unstage(request).await;
        self.report(DetachRpc::NodeUnstage, started, &outcome);
        outcome
    }
}

#[async_trait]
impl<D: ControllerDetacher + ?Sized> ControllerDetacher for Observed<D> {
    async fn controller_unpublish(
        &self,
        request: &ControllerDetachRequest,
    ) -> Result<(), DetachError> {
        let started = Instant::now();
        let outcome = self.inner.controller_unpublish(request).await;
        self.report(DetachRpc::ControllerUnpublish, started, &outcome);
        outcome
    }
}
