//! Shared fakes for the driver tests: scripted detachers with a call log.

#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use csi_claims::driver::{ControllerDetacher, NodeDetacher};
use csi_claims::{
    ClaimMode, ClaimRequest, ControllerDetachRequest, ControllerRequirement, DetachError,
    DetachRpc, NodeDetachRequest, VolumeInfo,
};
use csi_structs::{
    AccessMode, AccessTypeKind, ErrorClass, ExternalVolumeId, NodeId, PluginId, PluginNodeId,
    VolumeId, WorkloadId,
};
use tokio::sync::Notify;

pub fn info(volume: &str, plugin: &str, controller: ControllerRequirement) -> VolumeInfo {
    VolumeInfo {
        id: VolumeId::new(volume).unwrap(),
        external_id: ExternalVolumeId::new(format!("ext-{volume}")).unwrap(),
        plugin: PluginId::new(plugin).unwrap(),
        controller,
    }
}

pub fn request(
    info: &VolumeInfo,
    workload: &str,
    node: &str,
    mode: ClaimMode,
    access: AccessMode,
) -> ClaimRequest {
    ClaimRequest {
        volume: info.id.clone(),
        workload: WorkloadId::new(workload).unwrap(),
        node: NodeId::new(node).unwrap(),
        plugin_node: PluginNodeId::new(format!("sp-{node}")).unwrap(),
        mode,
        access_mode: access,
        attachment: AccessTypeKind::Mount,
    }
}

/// A single-node writer's claim of `info`'s volume for `workload` on `node`.
/// A record of one write claim on `volume`, built through the machine (records are only made
/// by it).
pub fn a_record(volume: &str) -> (VolumeId, Arc<csi_claims::VolumeRecord>) {
    let info = info(volume, "p", ControllerRequirement::Required);
    let mut m = csi_claims::ReleaseMachine::new(csi_claims::MachineConfig::default());
    m.claim(
        &info,
        write_claim(&info, "w", "n1"),
        tokio::time::Instant::now(),
    )
    .unwrap();
    let Some(csi_claims::Action::Persist(write)) = m.poll_action() else {
        panic!("a write is asked for");
    };
    (info.id, write.record.unwrap())
}

pub fn write_claim(info: &VolumeInfo, workload: &str, node: &str) -> ClaimRequest {
    request(
        info,
        workload,
        node,
        ClaimMode::Write,
        AccessMode::SingleNodeWriter,
    )
}

/// One call as the fake plugin saw it, with its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub rpc: DetachRpc,
    pub volume: String,
    pub workload: String,
    pub node: String,
    pub ok: bool,
}

/// What the fake plugin answers, and what it saw. Shared by the node and controller fakes,
/// and across driver restarts.
#[derive(Debug, Default)]
pub struct Plugin {
    pub log: Mutex<Vec<Call>>,
    /// Answers to hand out, per call, before falling back to success.
    pub script: Mutex<VecDeque<(DetachRpc, ErrorClass)>>,
    /// Controller calls in flight now, and the most seen at once.
    pub in_flight: Mutex<(usize, usize)>,
    /// How long a controller call takes (virtual time).
    pub controller_latency: Mutex<Duration>,
    /// When set, the call with this number (1-based, over all calls) never returns, and
    /// `killed` is notified: the process "dies" in the middle of it.
    pub hang_at: Mutex<Option<usize>>,
    pub killed: Notify,
}

impl Plugin {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn script(&self, rpc: DetachRpc, class: ErrorClass, times: usize) {
        let mut s = self.script.lock().unwrap();
        for _ in 0..times {
            s.push_back((rpc, class));
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.log.lock().unwrap().clone()
    }

    async fn answer(
        &self,
        rpc: DetachRpc,
        volume: &VolumeId,
        workload: &WorkloadId,
        node: &NodeId,
    ) -> Result<(), DetachError> {
        let scripted = {
            let mut s = self.script.lock().unwrap();
            match s.front() {
                Some((r, _)) if *r == rpc => s.pop_front().map(|(_, c)| c),
                _ => None,
            }
        };
        let number = {
            let mut log = self.log.lock().unwrap();
            log.push(Call {
                rpc,
                volume: volume.to_string(),
                workload: workload.to_string(),
                node: node.to_string(),
                ok: scripted.is_none_or(|c| c == ErrorClass::AlreadyDone),
            });
            log.len()
        };
        if *self.hang_at.lock().unwrap() == Some(number) {
            self.killed.notify_one();
            std::future::pending::<()>().await;
        }
        match scripted {
            None => Ok(()),
            Some(class) => Err(DetachError::new(rpc, class, "scripted answer")),
        }
    }
}

/// The node side of the fake plugin.
#[derive(Debug)]
pub struct FakeNode(pub Arc<Plugin>);

#[async_trait]
impl NodeDetacher for FakeNode {
    async fn node_unpublish(&self, r: &NodeDetachRequest) -> Result<(), DetachError> {
        self.0
            .answer(DetachRpc::NodeUnpublish, &r.volume, &r.workload, &r.node)
            .await
    }

    async fn node_unstage(&self, r: &NodeDetachRequest) -> Result<(), DetachError> {
        self.0
            .answer(DetachRpc::NodeUnstage, &r.volume, &r.workload, &r.node)
            .await
    }
}

/// The controller side of the fake plugin.
#[derive(Debug)]
pub struct FakeController(pub Arc<Plugin>);

#[async_trait]
impl ControllerDetacher for FakeController {
    async fn controller_unpublish(&self, r: &ControllerDetachRequest) -> Result<(), DetachError> {
        {
            let mut f = self.0.in_flight.lock().unwrap();
            f.0 += 1;
            f.1 = f.1.max(f.0);
        }
        let latency = *self.0.controller_latency.lock().unwrap();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let result = self
            .0
            .answer(
                DetachRpc::ControllerUnpublish,
                &r.volume,
                &r.workload,
                &r.node,
            )
            .await;
        self.0.in_flight.lock().unwrap().0 -= 1;
        result
    }
}
