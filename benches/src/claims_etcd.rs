//! `--claims-etcd` (feature `etcd`): claims and releases through etcd with csi-claims'
//! `EtcdStore`, and the memory of an agent that loads them.
//!
//! **Agents.** `A` claims drivers run in this process, each on its own `EtcdStore` connection
//! (so with its own watch), each performing the node steps of its own node `n-<i>`; agent 0
//! also performs the controller-side steps. The detachers answer at once and count their calls.
//!
//! **Controller duty** (`--etcd-duty`). `fenced` (the default, what a cluster of agents runs):
//! agent 0 starts without the duty and campaigns for it with
//! `EtcdStore::elect_controller_duty("n-0", DutyTiming::new(10 s), handle)` on its own store
//! connection; the bench waits (at most [`DUTY_LIMIT`]) until agent 0 holds it before the
//! claims, keeps the election (and its lease's keep-alives) running through every phase, and
//! resigns after the release. Under the fenced duty every controller call is preceded by a
//! read-only etcd transaction confirming the record and the duty key, and every controller-side
//! record write compares the duty key too (issue 30). `unfenced`: agent 0 holds the duty from
//! the start without a fence (`Duties::node(n-0, true)`), as the bench did before; no election,
//! no confirmation. The claim and release lines name the mode (`duty=fenced`).
//!
//! **Claims.** Workload `w` (`0..N`) claims volume `vol-<w % V>` for writing with
//! `MULTI_NODE_MULTI_WRITER` (so every claim is admitted) from node `n-<w % A>`, through that
//! node's agent. Each agent runs `-c` callers, each claiming its share one claim after the
//! other; a claim returns once it is durable in etcd. With more than one agent every volume is
//! claimed from every agent, so their compare-and-swap writes race for the same keys; a claim
//! the driver answers "lost to a concurrent writer" or "volume being read again" (after its own
//! five attempts) is asked again and counted in `retries`.
//!
//! **Memory.** With every claim durable, this executable is re-run as one more agent (a child
//! process, node `n-memory`, no duties) that loads every record from etcd; it reads its
//! `VmRSS` before and after starting its driver.
//!
//! **Release.** Every claim is released at once, each through the agent of its node
//! (`release_and_wait`), and the time runs until every claim is freed: node steps on each
//! claim's agent, controller steps on agent 0, every step checkpointed in etcd.
//!
//! `etcd_writes` on each line is the growth of etcd's revision over the phase: one per
//! successful write of a volume record. Nothing in this module asserts a duration.

use std::collections::HashSet;
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use csi_claims::driver::{
    ClaimsDriver, ClaimsHandle, ControllerDetacher, DriverConfig, DriverError, NodeDetacher,
};
use csi_claims::duty::DutyTiming;
use csi_claims::store::{ClaimStore, ControllerElection, EtcdStore, EtcdStoreConfig};
use csi_claims::{
    ClaimError, ClaimRequest, ClaimState, ControllerDetachRequest, DetachError, Duties,
    MachineConfig, NodeDetachRequest, ReleaseError, VolumeInfo,
};
use csi_structs::{AccessMode, NodeId, VolumeId, WorkloadId};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

use crate::claims::{ClaimsMemory, claim_request, driver_error, id, plugin_node, volume_info};
use crate::cli::{EtcdDuty, EtcdSpec};
use crate::error::BenchError;
use crate::etcd_process::EtcdProcess;
use crate::memory::rss_bytes;

/// The hidden flag that makes `csi-bench` the agent whose memory is measured
/// (`--etcd-memory-child PREFIX --etcd-endpoints URLS --volumes V`).
pub const HIDDEN_MEMORY_CHILD: &str = "--etcd-memory-child";

/// A phase fails when no claim or release finished for this long.
pub const STALL_LIMIT: Duration = Duration::from_secs(60);

/// How long a started etcd gets to answer.
pub const READY_LIMIT: Duration = Duration::from_secs(30);

/// How long the memory child gets.
pub const MEMORY_CHILD_LIMIT: Duration = Duration::from_secs(120);

/// How long agent 0 gets to win the controller duty (`--etcd-duty fenced`).
pub const DUTY_LIMIT: Duration = Duration::from_secs(30);

/// The controller duty's lease TTL (`--etcd-duty fenced`); its margin is the default fifth.
pub const DUTY_TTL: Duration = Duration::from_secs(10);

/// How often one claim or release is asked for before the run gives up.
pub const MAX_ATTEMPTS: u32 = 1_000;

/// The pause before asking again.
const RETRY_PAUSE: Duration = Duration::from_millis(2);

/// The deadline of each etcd request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Detachers that answer at once and count the calls, shared by every agent.
#[derive(Debug, Default)]
pub struct CountingDetachers {
    node_unpublish: AtomicU64,
    node_unstage: AtomicU64,
    controller_unpublish: AtomicU64,
}

#[async_trait]
impl NodeDetacher for CountingDetachers {
    async fn node_unpublish(&self, _: &NodeDetachRequest) -> Result<(), DetachError> {
        self.node_unpublish.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn node_unstage(&self, _: &NodeDetachRequest) -> Result<(), DetachError> {
        self.node_unstage.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[async_trait]
impl ControllerDetacher for CountingDetachers {
    async fn controller_unpublish(&self, _: &ControllerDetachRequest) -> Result<(), DetachError> {
        self.controller_unpublish.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// How the claims were made: `claims_etcd_claim …`.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimPhase {
    /// Agents claiming.
    pub agents: u32,
    /// How agent 0 holds the controller duty.
    pub duty: EtcdDuty,
    /// Claims made, each durable.
    pub claims: u32,
    /// Volumes they are spread over.
    pub volumes: u32,
    /// Callers per agent.
    pub callers: u32,
    /// From the first claim to the last one durable.
    pub elapsed: Duration,
    /// Claims asked again after the driver answered "lost" or "reloading".
    pub retries: u64,
    /// Writes etcd committed meanwhile (revision growth).
    pub etcd_writes: u64,
}

fn per_second(count: u32, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        f64::from(count) / secs
    } else {
        0.0
    }
}

impl fmt::Display for ClaimPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "claims_etcd_claim agents={} duty={} claims={} volumes={} callers_per_agent={} \
             claim_ms={:.0} claims_per_s={:.0} retries={} etcd_writes={}",
            self.agents,
            self.duty,
            self.claims,
            self.volumes,
            self.callers,
            self.elapsed.as_secs_f64() * 1e3,
            per_second(self.claims, self.elapsed),
            self.retries,
            self.etcd_writes
        )
    }
}

/// How the claims were released: `claims_etcd_release …`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReleasePhase {
    /// Agents releasing.
    pub agents: u32,
    /// How agent 0 holds the controller duty.
    pub duty: EtcdDuty,
    /// Claims released.
    pub claims: u32,
    /// Claims that ended freed.
    pub released: u32,
    /// Volumes they were spread over.
    pub volumes: u32,
    /// Distinct (volume, node) pairs: each needs one unstage and one controller unpublish.
    pub volume_nodes: u64,
    /// From the first release asked to the last claim freed.
    pub elapsed: Duration,
    /// Releases asked again after the driver answered "reloading".
    pub retries: u64,
    /// Claims `release_and_wait` returned (gone from the store) in another state than
    /// `Freed`: freed by another agent's write while this agent had last seen an earlier step.
    pub freed_in_other_state: u64,
    /// `NodeUnpublishVolume` calls made.
    pub node_unpublish: u64,
    /// `NodeUnstageVolume` calls made.
    pub node_unstage: u64,
    /// `ControllerUnpublishVolume` calls made.
    pub controller_unpublish: u64,
    /// Writes etcd committed meanwhile (revision growth).
    pub etcd_writes: u64,
}

impl fmt::Display for ReleasePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "claims_etcd_release agents={} duty={} claims={} released={} volumes={} \
             volume_nodes={} release_ms={:.0} released_per_s={:.0} retries={} \
             freed_in_other_state={} node_unpublish={} node_unstage={} controller_unpublish={} \
             etcd_writes={}",
            self.agents,
            self.duty,
            self.claims,
            self.released,
            self.volumes,
            self.volume_nodes,
            self.elapsed.as_secs_f64() * 1e3,
            per_second(self.released, self.elapsed),
            self.retries,
            self.freed_in_other_state,
            self.node_unpublish,
            self.node_unstage,
            self.controller_unpublish,
            self.etcd_writes
        )
    }
}

/// The three measurements of one `--claims-etcd` run.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimsEtcd {
    /// Claims per second.
    pub claim: ClaimPhase,
    /// Memory of an agent that loaded them.
    pub memory: ClaimsMemory,
    /// Release throughput.
    pub release: ReleasePhase,
}

impl ClaimsEtcd {
    /// The lines printed, in the order measured.
    pub fn lines(&self) -> Vec<String> {
        vec![
            self.claim.to_string(),
            self.memory.to_string(),
            self.release.to_string(),
        ]
    }
}

/// One agent: a driver on its own connection.
struct Agent {
    node: NodeId,
    handle: ClaimsHandle,
    driver: ClaimsDriver,
}

/// One claim to make, through agent `agent`.
#[derive(Clone)]
struct Work {
    agent: usize,
    info: VolumeInfo,
    request: ClaimRequest,
}

fn store_config(endpoints: &[String], prefix: &str) -> EtcdStoreConfig {
    let mut config = EtcdStoreConfig::new(endpoints.to_vec()).with_prefix(prefix);
    config.request_timeout = REQUEST_TIMEOUT;
    config
}

async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdStore, BenchError> {
    EtcdStore::connect(store_config(endpoints, prefix))
        .await
        .map_err(|e| BenchError::ClaimsStore(Box::new(e)))
}

/// etcd's current revision (a read of a key that does not exist).
async fn revision(store: &EtcdStore, prefix: &str) -> Result<i64, BenchError> {
    let fail = |detail: String| BenchError::EtcdRequest {
        endpoints: store.config().endpoints_text(),
        operation: "read the revision",
        detail,
    };
    let mut kv = store.client().kv_client();
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, kv.get(format!("{prefix}/probe"), None))
        .await
        .map_err(|_| fail(format!("no answer within {REQUEST_TIMEOUT:?}")))?
        .map_err(|e| fail(e.to_string()))?;
    answer
        .header()
        .map(|h| h.revision())
        .ok_or_else(|| fail("an answer without a header".to_owned()))
}

/// A store once etcd answers; a started etcd gets [`READY_LIMIT`], a given one one try.
async fn connect_ready(
    endpoints: &[String],
    prefix: &str,
    mut process: Option<&mut EtcdProcess>,
) -> Result<EtcdStore, BenchError> {
    let store = connect(endpoints, prefix).await?;
    let started = Instant::now();
    loop {
        let error = match revision(&store, prefix).await {
            Ok(_) => return Ok(store),
            Err(e) => e,
        };
        let Some(process) = process.as_deref_mut() else {
            return Err(error);
        };
        if let Some(why) = process.exited() {
            return Err(BenchError::EtcdStart {
                step: "waiting for etcd to answer",
                detail: why,
            });
        }
        if started.elapsed() > READY_LIMIT {
            return Err(BenchError::EtcdStart {
                step: "waiting for etcd to answer",
                detail: format!(
                    "no answer within {READY_LIMIT:?} ({error}); end of its log: {}",
                    process.log_tail()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn driver_config(node: &NodeId, seed: u64, controller: bool) -> DriverConfig {
    DriverConfig {
        machine: MachineConfig {
            duties: Duties::node(node.clone(), controller),
            ..MachineConfig::with_seed(seed)
        },
        ..DriverConfig::default()
    }
}

async fn start_agent(
    endpoints: &[String],
    prefix: &str,
    node: NodeId,
    seed: u64,
    controller: bool,
    reread: Option<Duration>,
    detachers: &Arc<CountingDetachers>,
) -> Result<(ClaimsHandle, ClaimsDriver, EtcdStore), BenchError> {
    let mut config = store_config(endpoints, prefix);
    config.resync_interval = reread;
    let store = EtcdStore::connect(config)
        .await
        .map_err(|e| BenchError::ClaimsStore(Box::new(e)))?;
    let (handle, driver) = ClaimsDriver::start(
        Arc::new(store.clone()),
        Arc::clone(detachers),
        Arc::clone(detachers),
        driver_config(&node, seed, controller),
    )
    .await
    .map_err(|e| BenchError::ClaimsStore(Box::new(e)))?;
    Ok((handle, driver, store))
}

/// Agent 0 campaigns for the controller duty on its own store connection; returns the
/// election (kept alive for the run) once agent 0 holds the duty, at most [`DUTY_LIMIT`] later.
async fn elect(agent: &Agent, store: &EtcdStore) -> Result<ControllerElection, BenchError> {
    let timing = DutyTiming::new(DUTY_TTL).map_err(BenchError::DutyTiming)?;
    let election = store.elect_controller_duty(agent.node.as_str(), timing, agent.handle.clone());
    let started = Instant::now();
    while !agent.handle.controller_duty() {
        if started.elapsed() >= DUTY_LIMIT {
            let leader = election.leader();
            election.resign().await;
            return Err(BenchError::DutyNotWon {
                agent: agent.node.to_string(),
                waited: started.elapsed(),
                leader,
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(election)
}

/// Every claim of the run, in workload order.
fn plan(claims: u32, agents: u32, volumes: u32) -> Result<Vec<Work>, BenchError> {
    let infos = (0..volumes as usize)
        .map(volume_info)
        .collect::<Result<Vec<_>, _>>()?;
    let plugin_nodes = (0..agents)
        .map(|i| plugin_node(&format!("sp-n-{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    (0..claims as usize)
        .map(|w| {
            let agent = w % agents as usize;
            let info = infos[w % infos.len()].clone();
            let request = claim_request(
                &info,
                w,
                agent,
                &plugin_nodes[agent],
                AccessMode::MultiNodeMultiWriter,
            )?;
            Ok(Work {
                agent,
                info,
                request,
            })
        })
        .collect()
}

/// Runs the `--claims-etcd` benchmark: against the etcd of `spec.endpoints`, or one it starts
/// (and stops) itself. `exe` is re-run as the agent whose memory is measured. The keys are
/// under a prefix of their own (`/csi-bench/<pid>-<time>`); on a given cluster whatever is left
/// under it is deleted at the end.
///
/// # Errors
///
/// [`BenchError::EtcdStart`], [`BenchError::ClaimsStore`], [`BenchError::EtcdRequest`],
/// [`BenchError::ClaimsDriver`], [`BenchError::GaveUp`], [`BenchError::Stalled`],
/// [`BenchError::Leftover`], [`BenchError::MemoryChild`].
pub fn run_claims_etcd(
    spec: &EtcdSpec,
    volumes: u32,
    callers: u32,
    exe: &Path,
) -> Result<ClaimsEtcd, BenchError> {
    let rt = crate::runtime()?;
    let mut process = match spec.endpoints {
        Some(_) => None,
        None => Some(EtcdProcess::start()?),
    };
    let endpoints = match &spec.endpoints {
        Some(given) => given.clone(),
        None => process.iter().map(|p| p.endpoint().to_owned()).collect(),
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = format!("/csi-bench/{}-{nanos}", std::process::id());
    let result = bench(
        &rt,
        spec,
        &endpoints,
        &prefix,
        process.as_mut(),
        volumes,
        callers,
        exe,
    );
    let cleaned = match process {
        Some(process) => {
            process.stop();
            Ok(())
        }
        None => rt.block_on(delete_prefix(&endpoints, &prefix)),
    };
    let run = result?;
    cleaned?;
    Ok(run)
}

async fn delete_prefix(endpoints: &[String], prefix: &str) -> Result<(), BenchError> {
    let store = connect(endpoints, prefix).await?;
    let mut kv = store.client().kv_client();
    let options = etcd_client::DeleteOptions::new().with_prefix();
    let fail = |detail: String| BenchError::EtcdRequest {
        endpoints: endpoints.join(","),
        operation: "delete the bench's keys",
        detail,
    };
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        kv.delete(format!("{prefix}/"), Some(options)),
    )
    .await
    .map_err(|_| fail(format!("no answer within {REQUEST_TIMEOUT:?}")))?
    .map_err(|e| fail(e.to_string()))?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn bench(
    rt: &Runtime,
    spec: &EtcdSpec,
    endpoints: &[String],
    prefix: &str,
    process: Option<&mut EtcdProcess>,
    volumes: u32,
    callers: u32,
    exe: &Path,
) -> Result<ClaimsEtcd, BenchError> {
    let store = rt.block_on(connect_ready(endpoints, prefix, process))?;
    let work = plan(spec.claims, spec.agents, volumes)?;
    let detachers = Arc::new(CountingDetachers::default());
    let fenced = spec.duty == EtcdDuty::Fenced;
    let (agents, election) = rt.block_on(async {
        let mut agents = Vec::new();
        let mut first_store = None;
        for i in 0..spec.agents {
            let node: NodeId = id("node id", format!("n-{i}"))?;
            let (handle, driver, store) = start_agent(
                endpoints,
                prefix,
                node.clone(),
                u64::from(i) + 1,
                i == 0 && !fenced,
                spec.reread,
                &detachers,
            )
            .await?;
            if i == 0 {
                first_store = Some(store);
            }
            agents.push(Agent {
                node,
                handle,
                driver,
            });
        }
        let election = match (fenced, &first_store, agents.first()) {
            (true, Some(store), Some(agent)) => Some(elect(agent, store).await?),
            _ => None,
        };
        Ok::<_, BenchError>((agents, election))
    })?;
    let duty = agents.first().and_then(|a| a.handle.duty());

    let (elapsed, retries, etcd_writes) =
        rt.block_on(claim_phase(&store, prefix, &agents, &work, callers))?;
    let claim = ClaimPhase {
        agents: spec.agents,
        duty: spec.duty,
        claims: spec.claims,
        volumes,
        callers,
        elapsed,
        retries,
        etcd_writes,
    };

    let memory = measure_memory(exe, endpoints, prefix, volumes)?;

    let calls_before = calls(&detachers);
    let (elapsed, tally, etcd_writes, released) =
        rt.block_on(release_phase(&store, prefix, &agents, &work))?;
    let calls_after = calls(&detachers);
    let volume_nodes = work
        .iter()
        .map(|w| (w.info.id.clone(), w.agent))
        .collect::<HashSet<_>>()
        .len() as u64;
    let release = ReleasePhase {
        agents: spec.agents,
        duty: spec.duty,
        claims: spec.claims,
        released,
        volumes,
        volume_nodes,
        elapsed,
        retries: tally.retries,
        freed_in_other_state: tally.other_state,
        node_unpublish: calls_after.0 - calls_before.0,
        node_unstage: calls_after.1 - calls_before.1,
        controller_unpublish: calls_after.2 - calls_before.2,
        etcd_writes,
    };
    // A duty lost and taken again meanwhile still completes the run, but not as measured.
    let kept = match (&duty, agents.first().and_then(|a| a.handle.duty())) {
        (Some(first), Some(now)) => now.same_as(first) && now.until().is_some(),
        (None, _) => true,
        (Some(_), None) => false,
    };
    if !kept {
        eprintln!(
            "csi-bench: warning: agent 0 did not hold its first controller duty through the whole \
             run (it was lost, and maybe taken again); the release line is not a steady fenced run"
        );
    }
    rt.block_on(async {
        if let Some(election) = election {
            election.resign().await;
        }
        for agent in agents {
            agent.driver.shutdown().await;
        }
    });
    Ok(ClaimsEtcd {
        claim,
        memory,
        release,
    })
}

fn calls(d: &CountingDetachers) -> (u64, u64, u64) {
    (
        d.node_unpublish.load(Ordering::Relaxed),
        d.node_unstage.load(Ordering::Relaxed),
        d.controller_unpublish.load(Ordering::Relaxed),
    )
}

fn writes(from: i64, to: i64) -> u64 {
    u64::try_from(to.saturating_sub(from)).unwrap_or(0)
}

/// Makes every claim: `callers` tasks per agent. Returns the time, the retries and the writes.
async fn claim_phase(
    store: &EtcdStore,
    prefix: &str,
    agents: &[Agent],
    work: &[Work],
    callers: u32,
) -> Result<(Duration, u64, u64), BenchError> {
    let callers = callers as usize;
    // Caller k of agent a claims every `callers`-th of agent a's claims.
    let mut shares: Vec<Vec<Vec<Work>>> = vec![vec![Vec::new(); callers]; agents.len()];
    let mut next = vec![0usize; agents.len()];
    for w in work {
        shares[w.agent][next[w.agent] % callers].push(w.clone());
        next[w.agent] += 1;
    }
    let done = Arc::new(AtomicU64::new(0));
    let first = revision(store, prefix).await?;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (agent, shares) in agents.iter().zip(shares) {
        for share in shares.into_iter().filter(|s| !s.is_empty()) {
            let handle = agent.handle.clone();
            let done = Arc::clone(&done);
            tasks.spawn(claim_all(handle, share, done));
        }
    }
    let tally = supervise("claim", tasks, &done, work.len() as u64, agents).await?;
    let elapsed = started.elapsed();
    let last = revision(store, prefix).await?;
    Ok((elapsed, tally.retries, writes(first, last)))
}

fn again_claim(e: &DriverError) -> bool {
    e.is_store_failure()
        || matches!(
            e,
            DriverError::Lost { .. } | DriverError::Claim(ClaimError::Reloading { .. })
        )
}

/// A release to ask for again: the volume is being read again, or etcd failed a moment.
fn again_release(e: &DriverError) -> bool {
    e.is_store_failure() || matches!(e, DriverError::Release(ReleaseError::Reloading { .. }))
}

async fn claim_all(
    handle: ClaimsHandle,
    share: Vec<Work>,
    done: Arc<AtomicU64>,
) -> Result<Tally, BenchError> {
    let mut retries = 0;
    for w in share {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match handle.claim(&w.info, w.request.clone()).await {
                Ok(_) => break,
                Err(e) if again_claim(&e) && attempts < MAX_ATTEMPTS => {
                    retries += 1;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) if again_claim(&e) => {
                    return Err(BenchError::GaveUp {
                        what: "claim",
                        volume: w.request.volume.to_string(),
                        workload: w.request.workload.to_string(),
                        attempts,
                        source: Box::new(e),
                    });
                }
                Err(e) => return Err(driver_error("claim", e)),
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Tally {
        retries,
        other_state: 0,
    })
}

/// Releases every claim at once, each through its node's agent, and waits until all are
/// freed; then checks that etcd holds no record of the run. Returns the time, what the tasks
/// counted, the writes and how many claims came back freed.
async fn release_phase(
    store: &EtcdStore,
    prefix: &str,
    agents: &[Agent],
    work: &[Work],
) -> Result<(Duration, Tally, u64, u32), BenchError> {
    let done = Arc::new(AtomicU64::new(0));
    let first = revision(store, prefix).await?;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for w in work {
        let handle = agents[w.agent].handle.clone();
        let (volume, workload) = (w.request.volume.clone(), w.request.workload.clone());
        let done = Arc::clone(&done);
        tasks.spawn(release_one(handle, volume, workload, done));
    }
    let tally = supervise("release", tasks, &done, work.len() as u64, agents).await?;
    let elapsed = started.elapsed();
    let last = revision(store, prefix).await?;
    let left = store
        .load_all()
        .await
        .map_err(|e| BenchError::ClaimsStore(Box::new(e)))?;
    if !left.is_empty() {
        return Err(BenchError::Leftover {
            prefix: prefix.to_owned(),
            records: left.len(),
        });
    }
    let released = u32::try_from(done.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
    Ok((elapsed, tally, writes(first, last), released))
}

async fn release_one(
    handle: ClaimsHandle,
    volume: VolumeId,
    workload: WorkloadId,
    done: Arc<AtomicU64>,
) -> Result<Tally, BenchError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match handle.release_and_wait(&volume, &workload).await {
            Ok(claim) => {
                // The claim is gone from the store. Freed by another agent, it comes back in
                // the last state this agent saw, which is not always `Freed`: counted apart.
                done.fetch_add(1, Ordering::Relaxed);
                let other_state = !matches!(claim.state(), ClaimState::Freed(_));
                return Ok(Tally {
                    retries: u64::from(attempts - 1),
                    other_state: u64::from(other_state),
                });
            }
            Err(e) if again_release(&e) && attempts < MAX_ATTEMPTS => {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(e) if again_release(&e) => {
                return Err(BenchError::GaveUp {
                    what: "release",
                    volume: volume.to_string(),
                    workload: workload.to_string(),
                    attempts,
                    source: Box::new(e),
                });
            }
            Err(e) => return Err(driver_error("release", e)),
        }
    }
}

/// What the tasks of a phase counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    /// Claims or releases asked again.
    retries: u64,
    /// Releases whose claim came back freed in another state than `Freed`.
    other_state: u64,
}

/// Waits for every task, adding up what they counted; fails at the first error, or when
/// nothing finished for [`STALL_LIMIT`] (with what each agent reports stuck).
async fn supervise(
    phase: &'static str,
    mut tasks: JoinSet<Result<Tally, BenchError>>,
    done: &AtomicU64,
    total: u64,
    agents: &[Agent],
) -> Result<Tally, BenchError> {
    let mut tally = Tally::default();
    let mut seen = done.load(Ordering::Relaxed);
    let mut since = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            next = tasks.join_next() => match next {
                None => return Ok(tally),
                Some(Ok(Ok(t))) => {
                    tally.retries += t.retries;
                    tally.other_state += t.other_state;
                }
                Some(Ok(Err(e))) => return Err(e),
                Some(Err(_)) => {
                    return Err(BenchError::ClaimsDriver {
                        step: "a claim or release task (it panicked or was cancelled)",
                        source: Box::new(DriverError::Stopped),
                    });
                }
            },
            _ = tick.tick() => {
                let now = done.load(Ordering::Relaxed);
                if now != seen {
                    seen = now;
                    since = Instant::now();
                } else if since.elapsed() >= STALL_LIMIT {
                    return Err(BenchError::Stalled {
                        phase,
                        done: now,
                        total,
                        waited: since.elapsed(),
                        stuck: stuck_report(agents),
                    });
                }
            }
        }
    }
}

fn stuck_report(agents: &[Agent]) -> String {
    agents
        .iter()
        .map(|a| {
            let stuck = a.handle.stuck();
            let view = agent_view(a);
            match stuck.first() {
                None => format!("agent {}: nothing stuck ({view})", a.node),
                Some(first) => format!(
                    "agent {}: {} volumes stuck, first {} ({:?}) ({view})",
                    a.node,
                    stuck.len(),
                    first.volume,
                    first.last_error
                ),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What an agent holds of the volumes `vol-0`, `vol-1`, ... (the first 10,000): claims per
/// state, steps in flight, volumes with unwritten changes, for a stall's report.
fn agent_view(agent: &Agent) -> String {
    let mut states = std::collections::BTreeMap::<String, usize>::new();
    let mut pending = std::collections::BTreeMap::<String, usize>::new();
    let mut dirty = 0;
    for i in 0..10_000 {
        let Ok(volume) = VolumeId::new(format!("vol-{i}")) else {
            continue;
        };
        let Some(status) = agent.handle.status(&volume) else {
            continue;
        };
        for claim in &status.claims {
            *states.entry(claim.state().name().to_owned()).or_default() += 1;
        }
        let op = format!("{:?}", status.pending);
        let op = op.split('(').next().unwrap_or_default().to_owned();
        *pending.entry(op).or_default() += 1;
        dirty += usize::from(!status.durable);
    }
    format!("claims {states:?}, steps {pending:?}, not durable {dirty}")
}

/// Re-runs `exe` as one more agent that loads every claim under `prefix`, and reads the
/// numbers it prints.
fn measure_memory(
    exe: &Path,
    endpoints: &[String],
    prefix: &str,
    volumes: u32,
) -> Result<ClaimsMemory, BenchError> {
    let fail = |detail: String| BenchError::MemoryChild { detail };
    let mut child = Command::new(exe)
        .args([HIDDEN_MEMORY_CHILD, prefix])
        .args(["--etcd-endpoints", &endpoints.join(",")])
        .args(["--volumes", &volumes.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| fail(format!("could not be started from {}: {e}", exe.display())))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < MEMORY_CHILD_LIMIT => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!(
                    "did not finish within {MEMORY_CHILD_LIMIT:?}"
                )));
            }
            Err(e) => return Err(fail(format!("could not be waited for: {e}"))),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout
            .read_to_string(&mut out)
            .map_err(|e| fail(format!("printed something unreadable: {e}")))?;
    }
    if !status.success() {
        return Err(fail(format!("failed ({status}); its error is above")));
    }
    let field = |name: &str| {
        out.split_whitespace()
            .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| fail(format!("printed no {name}= in {out:?}")))
    };
    Ok(ClaimsMemory {
        line: "claims_etcd_memory",
        claims: field("claims")?,
        volumes,
        before: field("rss_before")?,
        after: field("rss_after")?,
    })
}

/// The memory child: connects to `endpoints`, then starts one claims driver (node
/// `n-memory`, no duties) that loads every record under `prefix`, reading this process's
/// `VmRSS` before and after. Returns the line to print:
/// `etcd_memory_child claims=<held> rss_before=<bytes> rss_after=<bytes>`.
///
/// # Errors
///
/// [`BenchError::ClaimsStore`], [`BenchError::EtcdRequest`], [`BenchError::Statm`].
pub fn memory_child(
    endpoints: &[String],
    prefix: &str,
    volumes: u32,
) -> Result<Vec<String>, BenchError> {
    let rt = crate::runtime()?;
    let ids = (0..volumes as usize)
        .map(|i| volume_info(i).map(|info| info.id))
        .collect::<Result<Vec<VolumeId>, _>>()?;
    let node: NodeId = id("node id", "n-memory".to_owned())?;
    rt.block_on(async {
        let store = connect(endpoints, prefix).await?;
        // The connection is open before the first reading.
        revision(&store, prefix).await?;
        let detachers = Arc::new(CountingDetachers::default());
        let before = rss_bytes(None)?;
        let (handle, driver) = ClaimsDriver::start(
            Arc::new(store),
            Arc::clone(&detachers),
            Arc::clone(&detachers),
            driver_config(&node, 0, false),
        )
        .await
        .map_err(|e| BenchError::ClaimsStore(Box::new(e)))?;
        let after = rss_bytes(None)?;
        let held: usize = ids
            .iter()
            .filter_map(|v| handle.record(v))
            .map(|r| r.claims().len())
            .sum();
        driver.shutdown().await;
        Ok(vec![format!(
            "etcd_memory_child claims={held} rss_before={before} rss_after={after}"
        )])
    })
}
