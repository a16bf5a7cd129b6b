//! Claims benchmarks shared by `csi-bench` and the criterion benches: driving the pure release
//! machine with every action answered at once, memory per claim, and releasing many claims
//! through the tokio driver against the mock plugin.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use csi_claims::driver::{ClaimsDriver, DriverConfig};
use csi_claims::{
    Action, ClaimMode, ClaimRequest, ClaimState, ControllerRequirement, MachineConfig, MemoryStore,
    ReleaseMachine, VolumeInfo, store::Version,
};
use csi_client::CsiClient;
use csi_node::detach::{ClientControllerDetacher, ClientNodeDetacher, NoSecrets, NodeDetachPolicy};
use csi_node::layout::Layout;
use csi_structs::{AccessMode, AccessTypeKind, PluginNodeId};
use tokio::runtime::Runtime;
use tokio::time::Instant;

use crate::error::BenchError;
use crate::memory::rss_bytes;
use crate::target::{MOCK_CALL_LOG_LIMIT, mock_socket, socket_dir};

/// The plugin id of every bench volume.
pub const PLUGIN: &str = "bench.csi.example";

/// How many orchestrator nodes the bench's claims are spread over.
pub const NODES: usize = 50;

pub(crate) fn id<T>(what: &'static str, value: String) -> Result<T, BenchError>
where
    T: TryFrom<String, Error = csi_structs::ValidationErrors>,
{
    T::try_from(value.clone()).map_err(|source| BenchError::InvalidId {
        what,
        value,
        source,
    })
}

/// The `i`th bench volume: `vol-<i>`, plugin volume `ext-<i>`, controller required.
///
/// # Errors
///
/// [`BenchError::InvalidId`] (the ids are short and valid; not assumed).
pub fn volume_info(i: usize) -> Result<VolumeInfo, BenchError> {
    Ok(VolumeInfo {
        id: id("volume id", format!("vol-{i}"))?,
        external_id: id("external volume id", format!("ext-{i}"))?,
        plugin: id("plugin id", PLUGIN.to_owned())?,
        controller: ControllerRequirement::Required,
    })
}

/// A write claim of workload `w` on `info`, from orchestrator node `n-<node % 50>` whose
/// plugin node id is `plugin_node`, in `access_mode`.
///
/// # Errors
///
/// [`BenchError::InvalidId`].
pub fn claim_request(
    info: &VolumeInfo,
    w: usize,
    node: usize,
    plugin_node: &PluginNodeId,
    access_mode: AccessMode,
) -> Result<ClaimRequest, BenchError> {
    Ok(ClaimRequest {
        volume: info.id.clone(),
        workload: id("workload id", format!("w-{w}"))?,
        node: id("node id", format!("n-{}", node % NODES))?,
        plugin_node: plugin_node.clone(),
        mode: ClaimMode::Write,
        access_mode,
        attachment: AccessTypeKind::Mount,
    })
}

/// Performs every action the machine asks for at once (writes succeed with the next version,
/// detach calls succeed) until it asks for nothing more; returns how many results were fed
/// back. Events are drained and dropped.
pub fn settle(machine: &mut ReleaseMachine, now: Instant) -> u64 {
    let mut inputs = 0;
    while let Some(action) = machine.poll_action() {
        inputs += 1;
        match action {
            Action::Persist(write) => {
                let version = write
                    .record
                    .as_ref()
                    .map(|_| Version::after(write.expected));
                machine.persisted(write.ticket, Ok(version), now);
            }
            Action::Reload(read) => {
                // Never asked for: nothing else writes the bench's records.
                machine.reloaded(read.ticket, Ok(None), now);
            }
            Action::NodeDetach(call) => machine.node_detached(call.ticket, Ok(()), now),
            Action::ControllerDetach(call) => machine.controller_detached(call.ticket, Ok(()), now),
        }
    }
    while machine.poll_event().is_some() {}
    inputs
}

/// The inputs of one claim-to-freed cycle over `infos`, each with one single-writer claim.
#[derive(Debug)]
pub struct Cycle {
    infos: Vec<VolumeInfo>,
    requests: Vec<ClaimRequest>,
}

impl Cycle {
    /// A cycle over `volumes` volumes.
    ///
    /// # Errors
    ///
    /// [`BenchError::InvalidId`].
    pub fn new(volumes: usize) -> Result<Cycle, BenchError> {
        let plugin_node = id("plugin node id", "node-1".to_owned())?;
        let infos = (0..volumes)
            .map(volume_info)
            .collect::<Result<Vec<_>, _>>()?;
        let requests = infos
            .iter()
            .enumerate()
            .map(|(w, info)| claim_request(info, w, w, &plugin_node, AccessMode::SingleNodeWriter))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Cycle { infos, requests })
    }

    /// Claims every volume, makes it durable, releases every claim and runs every release to
    /// freed; returns how many inputs (commands and results) the machine processed. Each is
    /// one state transition of a claim or of its volume's record.
    ///
    /// # Errors
    ///
    /// [`BenchError::ClaimRefused`] and [`BenchError::ReleaseRefused`] (not expected: every
    /// volume is free when the cycle starts).
    pub fn run(&self, machine: &mut ReleaseMachine, now: Instant) -> Result<u64, BenchError> {
        let mut inputs = 0;
        for (info, request) in self.infos.iter().zip(&self.requests) {
            machine
                .claim(info, request.clone(), now)
                .map_err(|e| BenchError::ClaimRefused(Box::new(e)))?;
            inputs += 1;
        }
        inputs += settle(machine, now);
        for request in &self.requests {
            machine
                .release(&request.volume, &request.workload, now)
                .map_err(|e| BenchError::ReleaseRefused(Box::new(e)))?;
            inputs += 1;
        }
        inputs += settle(machine, now);
        Ok(inputs)
    }
}

/// Resident memory of a release machine holding many durable claims: `claims_memory …` (a
/// bare machine) or `claims_etcd_memory …` (an agent that loaded them from etcd).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimsMemory {
    /// The line's first word.
    pub line: &'static str,
    /// Claims held.
    pub claims: u64,
    /// Volumes they are spread over.
    pub volumes: u32,
    /// Resident bytes before.
    pub before: u64,
    /// Resident bytes with every claim held.
    pub after: u64,
}

impl ClaimsMemory {
    /// Growth per claim, in bytes.
    pub fn per_claim(&self) -> u64 {
        self.after.saturating_sub(self.before) / self.claims.max(1)
    }
}

impl fmt::Display for ClaimsMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} claims={} volumes={} rss_before_kib={} rss_after_kib={} \
             bytes_per_claim={} kib_per_10000_claims={}",
            self.line,
            self.claims,
            self.volumes,
            self.before / 1024,
            self.after / 1024,
            self.per_claim(),
            self.per_claim() * 10_000 / 1024
        )
    }
}

/// Makes `claims` durable write claims (multi-node multi-writer) spread over `volumes`
/// volumes in one release machine and measures this process's resident memory around it.
/// Workload `w` claims volume `w % volumes` from node `(w / volumes) % 50`, so each volume's
/// claims are spread over up to 50 nodes.
///
/// # Errors
///
/// [`BenchError::ClaimRefused`], [`BenchError::Statm`], [`BenchError::InvalidId`].
pub fn claims_memory(claims: u32, volumes: u32) -> Result<ClaimsMemory, BenchError> {
    let plugin_node: PluginNodeId = id("plugin node id", "node-1".to_owned())?;
    let infos = (0..volumes as usize)
        .map(volume_info)
        .collect::<Result<Vec<_>, _>>()?;
    let now = Instant::now();
    let volumes_n = infos.len();
    // Everything the claims hold is allocated after the first measurement.
    let before = rss_bytes(None)?;
    let mut machine = ReleaseMachine::new(MachineConfig::with_seed(1));
    for w in 0..claims as usize {
        let info = &infos[w % volumes_n];
        let request = claim_request(
            info,
            w,
            w / volumes_n,
            &plugin_node,
            AccessMode::MultiNodeMultiWriter,
        )?;
        machine
            .claim(info, request, now)
            .map_err(|e| BenchError::ClaimRefused(Box::new(e)))?;
        settle(&mut machine, now);
    }
    let after = rss_bytes(None)?;
    let held: usize = infos
        .iter()
        .filter_map(|i| machine.record(&i.id))
        .map(|r| r.claims().len())
        .sum();
    drop(machine);
    Ok(ClaimsMemory {
        line: "claims_memory",
        claims: u64::try_from(held).unwrap_or(u64::MAX),
        volumes,
        before,
        after,
    })
}

/// The result of releasing many claims through the driver.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimsRelease {
    /// Claims released.
    pub claims: u32,
    /// Volumes they were spread over.
    pub volumes: u32,
    /// How long making every claim (durable, in the memory store) took.
    pub claim_time: Duration,
    /// From the first release to the last claim freed.
    pub release_time: Duration,
    /// Plugin calls the mock recorded during the release.
    pub plugin_calls: u64,
}

impl fmt::Display for ClaimsRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.release_time.as_secs_f64();
        let rate = if secs > 0.0 {
            f64::from(self.claims) / secs
        } else {
            0.0
        };
        write!(
            f,
            "claims_release claims={} volumes={} plugin_calls={} claim_ms={:.0} release_ms={:.0} \
             released_per_s={:.0}",
            self.claims,
            self.volumes,
            self.plugin_calls,
            self.claim_time.as_secs_f64() * 1e3,
            secs * 1e3,
            rate
        )
    }
}

/// Claims `claims` write claims over `volumes` volumes seeded into an in-process mock plugin
/// (spread over nodes as in [`claims_memory`]),
/// then releases them all at once through [`ClaimsDriver`] (memory store, default machine
/// configuration: one controller call per plugin at a time), whose detachers are the reference
/// agent's ([`csi_node::detach`]) calling the mock over its unix socket through csi-client.
/// Returns the timings.
///
/// # Errors
///
/// Start-up errors of the mock, [`BenchError::ClaimsStore`], [`BenchError::ClaimsDriver`],
/// [`BenchError::NotFreed`].
pub fn claims_release(
    rt: &Runtime,
    claims: u32,
    volumes: u32,
) -> Result<ClaimsRelease, BenchError> {
    rt.block_on(async {
        let dir = socket_dir("the mock plugin's socket and node paths")?;
        let mut builder = csi_testkit::MockPlugin::builder().call_log_limit(MOCK_CALL_LOG_LIMIT);
        for i in 0..volumes as usize {
            builder = builder.volume(format!("ext-{i}"), 1 << 30);
        }
        let plugin = builder.build().map_err(BenchError::MockConfig)?;
        let path = mock_socket(dir.path());
        let server = plugin
            .serve_unix(&path)
            .await
            .map_err(BenchError::MockServe)?;
        let endpoint =
            csi_client::Endpoint::unix(&path).map_err(|source| BenchError::Endpoint {
                endpoint: path.display().to_string(),
                source,
            })?;
        let client = CsiClient::new(endpoint.clone());
        // The reference agent's own adapters, so the bench measures the release path the
        // agent runs. After each successful node call they remove the empty directories the
        // orchestrator created below the layout root. Here that root is inside the bench's
        // temporary directory and nothing ever creates those directories (the claims are
        // recorded in the store, never published through the mock), so each removal is a
        // short walk of `NotFound`s: harmless, and counted in the release time as it would
        // be in the agent. `staging = true`: the mock advertises STAGE_UNSTAGE_VOLUME, and
        // the release ends with `NodeUnstageVolume` as the agent's would. Node calls go
        // through a client of their own under the agent's node detach policy, as in the agent.
        let node = Arc::new(ClientNodeDetacher::new(
            NodeDetachPolicy::DEFAULT.client(endpoint),
            Layout::new(dir.path().join("node")),
            true,
        ));
        let controller = Arc::new(ClientControllerDetacher::new(client, Arc::new(NoSecrets)));
        let (handle, driver) = ClaimsDriver::start(
            Arc::new(MemoryStore::new()),
            node,
            controller,
            DriverConfig::default(),
        )
        .await
        .map_err(|e| BenchError::ClaimsStore(Box::new(e)))?;

        let plugin_node: PluginNodeId = id("plugin node id", plugin.config().node_id.clone())?;
        let infos = (0..volumes as usize)
            .map(volume_info)
            .collect::<Result<Vec<_>, _>>()?;
        let mut made = Vec::with_capacity(claims as usize);
        let claim_start = Instant::now();
        for w in 0..claims as usize {
            let info = &infos[w % infos.len()];
            let request = claim_request(
                info,
                w,
                w / infos.len(),
                &plugin_node,
                AccessMode::MultiNodeMultiWriter,
            )?;
            let key = (request.volume.clone(), request.workload.clone());
            handle
                .claim(info, request)
                .await
                .map_err(|e| driver_error("claim", e))?;
            made.push(key);
        }
        let claim_time = claim_start.elapsed();

        let total_calls = || plugin.calls().len() as u64 + plugin.calls().evicted();
        let calls_before = total_calls();
        let release_start = Instant::now();
        let mut tasks = Vec::with_capacity(made.len());
        for (volume, workload) in made {
            let handle = handle.clone();
            tasks.push(tokio::spawn(async move {
                let freed = handle.release_and_wait(&volume, &workload).await;
                (volume, workload, freed)
            }));
        }
        let mut outcome = Ok(());
        for task in tasks {
            let Ok((volume, workload, freed)) = task.await else {
                outcome = outcome.and(Err(BenchError::ClaimsDriver {
                    step: "release (task)",
                    source: Box::new(csi_claims::driver::DriverError::Stopped),
                }));
                continue;
            };
            match freed {
                Ok(claim) if matches!(claim.state(), ClaimState::Freed(_)) => {}
                Ok(claim) => {
                    outcome = outcome.and(Err(BenchError::NotFreed {
                        volume: volume.to_string(),
                        workload: workload.to_string(),
                        state: Box::new(claim.state().clone()),
                    }));
                }
                Err(e) => outcome = outcome.and(Err(driver_error("release", e))),
            }
        }
        let release_time = release_start.elapsed();
        let plugin_calls = total_calls().saturating_sub(calls_before);
        driver.shutdown().await;
        server.shutdown().await.map_err(BenchError::MockServe)?;
        outcome?;
        Ok(ClaimsRelease {
            claims,
            volumes,
            claim_time,
            release_time,
            plugin_calls,
        })
    })
}

pub(crate) fn driver_error(step: &'static str, e: csi_claims::driver::DriverError) -> BenchError {
    BenchError::ClaimsDriver {
        step,
        source: Box::new(e),
    }
}

/// A plugin node id (for the criterion benches).
///
/// # Errors
///
/// [`BenchError::InvalidId`].
pub fn plugin_node(value: &str) -> Result<PluginNodeId, BenchError> {
    id("plugin node id", value.to_owned())
}
