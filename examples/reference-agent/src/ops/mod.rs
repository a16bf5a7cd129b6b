//! Operator commands against a running `csi-agent serve`: `plugin list|info`,
//! `volume register|create|claim|release|expand|detach|deregister|list|snapshot|status|delete`
//! and `status`, as tables by default
//! or JSON with `--json`.
//!
//! The agent is found through its data directory (`--data-dir` / `CSI_AGENT_DATA_DIR`):
//! `agent.json` names its address and `control.token` holds the token; `--agent` and
//! `--token-file` override them.

pub mod api;
pub mod client;
pub mod table;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hyper::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::parse_duration;
use client::ClientError;

/// How to reach the agent, and how to print.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The agent's data directory (holds `agent.json` and `control.token`).
    #[arg(long, env = "CSI_AGENT_DATA_DIR", global = true)]
    pub data_dir: Option<PathBuf>,
    /// The agent's control address (`IP:PORT`), instead of reading `agent.json`.
    #[arg(long, env = "CSI_AGENT_ADDR", global = true)]
    pub agent: Option<String>,
    /// The control token file, instead of `<data-dir>/control.token`.
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// How long to wait for the agent (e.g. `30s`).
    #[arg(long, default_value = "60s", global = true)]
    pub timeout: String,
}

/// Arguments of `csi-agent plugin`.
#[derive(Debug, clap::Args)]
pub struct PluginArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: PluginCommand,
    /// The agent.
    #[command(flatten)]
    pub target: Target,
}

/// `csi-agent plugin` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Every plugin the agent knows (local and on peers).
    List,
    /// One plugin in detail.
    Info {
        /// The plugin id.
        id: String,
    },
}

/// Arguments of `csi-agent volume`.
#[derive(Debug, clap::Args)]
pub struct VolumeArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: VolumeCommand,
    /// The agent.
    #[command(flatten)]
    pub target: Target,
}

/// `csi-agent volume` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum VolumeCommand {
    /// Register an existing volume.
    Register {
        /// The orchestrator's volume id.
        id: String,
        /// The plugin's volume id.
        #[arg(long)]
        external_id: String,
        /// The plugin id.
        #[arg(long)]
        plugin: String,
        /// Access mode (e.g. `single-node-writer`).
        #[arg(long, default_value = "single-node-writer")]
        access_mode: String,
        /// `mount` or `block`.
        #[arg(long, default_value = "mount")]
        attachment: String,
        /// Whether releases need ControllerUnpublishVolume (default: from the plugin).
        #[arg(long)]
        controller_publish: Option<bool>,
        /// Volume context entries, `KEY=VALUE` (repeatable).
        #[arg(long = "context")]
        context: Vec<String>,
        /// The volume's secrets: `KEY=VALUE` lines (`[section]` lines for one kind of call)
        /// or JSON, in a file other users cannot read.
        #[arg(long)]
        secrets_file: Option<PathBuf>,
        /// A topology the volume is reachable from, `KEY=VALUE[,KEY=VALUE...]` (repeatable;
        /// none: from everywhere).
        #[arg(long = "topology")]
        topology: Vec<String>,
    },
    /// Create a volume through the plugin's controller, then register it.
    Create {
        /// The orchestrator's volume id (also the name sent to the plugin).
        id: String,
        /// The plugin id.
        #[arg(long)]
        plugin: String,
        /// Capacity in bytes, or with a suffix: `K`, `M`, `G`, `Ki`, `Mi`, `Gi`.
        #[arg(long, default_value = "0")]
        capacity: String,
        /// Access mode.
        #[arg(long, default_value = "single-node-writer")]
        access_mode: String,
        /// `mount` or `block`.
        #[arg(long, default_value = "mount")]
        attachment: String,
        /// Plugin parameters, `KEY=VALUE` (repeatable).
        #[arg(long = "parameter")]
        parameters: Vec<String>,
        /// The volume's secrets, as for `register`.
        #[arg(long)]
        secrets_file: Option<PathBuf>,
        /// A topology the volume must be reachable from, `KEY=VALUE[,KEY=VALUE...]`
        /// (repeatable; the requisite list of `accessibility_requirements`).
        #[arg(long = "topology")]
        topology: Vec<String>,
        /// A topology to try first, as `--topology` (repeatable, in order; the preferred
        /// list).
        #[arg(long = "preferred-topology")]
        preferred_topology: Vec<String>,
        /// Make it from this snapshot of the plugin (its id, as `volume snapshot list`
        /// shows it); the plugin needs controller CREATE_DELETE_SNAPSHOT.
        #[arg(long, conflicts_with = "clone")]
        snapshot: Option<String>,
        /// Make it a copy of this registered volume (in the same plugin); the plugin needs
        /// controller CLONE_VOLUME.
        #[arg(long)]
        clone: Option<String>,
    },
    /// Claim a volume for a workload on the agent's node and publish it there.
    Claim {
        /// The volume id.
        id: String,
        /// The workload.
        #[arg(long)]
        workload: String,
        /// `read` or `write`.
        #[arg(long, default_value = "write")]
        mode: String,
    },
    /// Release a workload's claim (node unpublish/unstage, controller unpublish, free).
    Release {
        /// The volume id.
        id: String,
        /// The workload.
        #[arg(long)]
        workload: String,
        /// Wait until the claim is freed (bounded by `--timeout`).
        #[arg(long)]
        wait: bool,
    },
    /// Grow a volume: ControllerExpandVolume, then NodeExpandVolume where it is published.
    Expand {
        /// The volume id.
        id: String,
        /// The capacity wanted: bytes, or with a suffix (`K`, `M`, `G`, `Ki`, `Mi`, `Gi`).
        #[arg(long)]
        capacity: String,
    },
    /// The agent's volumes (of one plugin), or with `--external` the plugin's own listing
    /// (`ListVolumes`), showing which the agent knows.
    List {
        /// Only this plugin's volumes (required with `--external`).
        #[arg(long)]
        plugin: Option<String>,
        /// List the plugin's volumes, not the agent's.
        #[arg(long, requires = "plugin")]
        external: bool,
    },
    /// Snapshots: create, list, delete (when the plugin offers them).
    Snapshot {
        /// What to do.
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// One volume (or all), with claims and release progress.
    Status {
        /// The volume id; all volumes when left out.
        id: Option<String>,
    },
    /// Delete a volume without claims (in the plugin too when the agent created it).
    Delete {
        /// The volume id.
        id: String,
    },
    /// Release every claim of a volume on one node: node steps there, then the controller step.
    Detach {
        /// The volume id.
        id: String,
        /// The orchestrator node whose claims are released.
        #[arg(long)]
        node: String,
        /// The node is gone for good: skip its node steps and run the controller step
        /// without it (every claim made from it, on every volume, is released).
        #[arg(long)]
        node_gone: bool,
        /// Wait until those claims are freed (bounded by `--timeout`).
        #[arg(long)]
        wait: bool,
    },
    /// Drop a volume from the agent without calling the plugin; says what the plugin keeps.
    Deregister {
        /// The volume id.
        id: String,
        /// Drop it even with claims, which are forgotten, not released.
        #[arg(long)]
        force: bool,
        /// Confirm a forced deregistration (without it, it is refused with what would be left).
        #[arg(long, requires = "force")]
        yes: bool,
    },
}

/// `csi-agent volume snapshot` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Cut a snapshot of a volume (`CreateSnapshot`).
    Create {
        /// The volume id.
        id: String,
        /// The snapshot's name (the same name again answers the same snapshot).
        #[arg(long)]
        name: String,
        /// Plugin parameters, `KEY=VALUE` (repeatable).
        #[arg(long = "parameter")]
        parameters: Vec<String>,
    },
    /// The snapshots of a volume, or with `--plugin` every snapshot of a plugin
    /// (`ListSnapshots`).
    List {
        /// The volume id.
        #[arg(required_unless_present = "plugin", conflicts_with = "plugin")]
        id: Option<String>,
        /// Every snapshot of this plugin.
        #[arg(long)]
        plugin: Option<String>,
    },
    /// Delete a snapshot (`DeleteSnapshot`).
    Delete {
        /// The plugin's snapshot id.
        snapshot: String,
        /// The volume it was cut from (its plugin and secrets are used).
        #[arg(long, required_unless_present = "plugin", conflicts_with = "plugin")]
        volume: Option<String>,
        /// The plugin, for a snapshot of a volume the agent does not know.
        #[arg(long)]
        plugin: Option<String>,
    },
}

/// Arguments of `csi-agent status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The agent.
    #[command(flatten)]
    pub target: Target,
}

/// Error of the operator commands.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// A flag is wrong.
    #[error("flag --{flag}: {reason}")]
    Usage {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The agent cannot be found.
    #[error("cannot find the agent: {0}")]
    Locate(String),
    /// The call failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `volume detach --wait` ran out of time.
    #[error("claims of {volume} on node {node} not freed within {limit:?}; see `csi-agent status`")]
    DetachTimedOut {
        /// The volume.
        volume: String,
        /// The node.
        node: String,
        /// The limit.
        limit: Duration,
    },
    /// `--wait` ran out of time.
    #[error("claim of {workload} on {volume} not freed within {limit:?}; see `csi-agent status`")]
    WaitTimedOut {
        /// The volume.
        volume: String,
        /// The workload.
        workload: String,
        /// The limit.
        limit: Duration,
    },
    /// The async runtime could not start.
    #[error("runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl crate::ExitStatus for OpsError {
    fn exit_code(&self) -> u8 {
        match self {
            OpsError::Usage { .. } => 2,
            _ => 1,
        }
    }
}

impl OpsError {
    /// The error as the control API answers one: the agent's own answer when it gave one,
    /// else a kind for what failed here (`usage`, `no_agent`, `unreachable`, `timeout`,
    /// `agent_answer`, `local`).
    pub fn api_error(&self) -> api::ApiError {
        let kind = match self {
            OpsError::Client(ClientError::Api { error, .. }) => return error.clone(),
            OpsError::Usage { .. } => "usage",
            OpsError::Locate(_) => "no_agent",
            OpsError::Client(ClientError::Connect { .. }) => "unreachable",
            OpsError::Client(ClientError::Timeout { .. })
            | OpsError::DetachTimedOut { .. }
            | OpsError::WaitTimedOut { .. } => "timeout",
            OpsError::Client(_) => "agent_answer",
            OpsError::Runtime(_) => "local",
        };
        let error = self.to_string();
        let class = None;
        api::ApiError {
            kind: kind.into(),
            error,
            class,
        }
    }
}

/// `result` of a command; with `--json`, a failure is also printed on stdout as the API's
/// error JSON, so a script reads one format.
fn answered(json: bool, result: Result<(), OpsError>) -> Result<(), OpsError> {
    if let (true, Err(e)) = (json, &result) {
        let text = serde_json::to_string_pretty(&e.api_error()).unwrap_or_default();
        println!("{text}");
    }
    result
}

struct Conn {
    addr: SocketAddr,
    token: String,
    json: bool,
    limit: Duration,
}

impl Conn {
    fn open(t: &Target) -> Result<Self, OpsError> {
        let limit = parse_duration("timeout", &t.timeout).map_err(|e| OpsError::Usage {
            flag: "timeout",
            reason: e.to_string(),
        })?;
        let addr_text = match (&t.agent, &t.data_dir) {
            (Some(a), _) => a.clone(),
            (None, Some(dir)) => {
                let path = dir.join("agent.json");
                let info: api::AgentInfo = csi_node::state::load_json(&path)
                    .map_err(|e| OpsError::Locate(e.to_string()))?
                    .ok_or_else(|| {
                        OpsError::Locate(format!(
                            "{} does not exist: is `csi-agent serve --data-dir {}` running?",
                            path.display(),
                            dir.display()
                        ))
                    })?;
                info.http
            }
            (None, None) => {
                return Err(OpsError::Usage {
                    flag: "data-dir",
                    reason: "give --data-dir (or CSI_AGENT_DATA_DIR) or --agent".into(),
                });
            }
        };
        let addr = addr_text.parse().map_err(|_| OpsError::Usage {
            flag: "agent",
            reason: format!("{addr_text:?} is not IP:PORT"),
        })?;
        let token_path = match (&t.token_file, &t.data_dir) {
            (Some(p), _) => p.clone(),
            (None, Some(d)) => d.join("control.token"),
            (None, None) => {
                return Err(OpsError::Usage {
                    flag: "token-file",
                    reason: "give --token-file or --data-dir".into(),
                });
            }
        };
        let token = std::fs::read_to_string(&token_path)
            .map_err(|e| OpsError::Locate(format!("cannot read {}: {e}", token_path.display())))?
            .trim()
            .to_owned();
        Ok(Self {
            addr,
            token,
            json: t.json,
            limit,
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, OpsError> {
        Ok(client::call::<(), T>(
            self.addr,
            Some(&self.token),
            Method::GET,
            path,
            None,
            self.limit,
        )
        .await?)
    }

    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, OpsError> {
        Ok(client::call(self.addr, Some(&self.token), method, path, body, self.limit).await?)
    }

    /// `POST /v1/volumes/<id>/<action>` with `body`.
    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        id: &str,
        action: &str,
        body: &B,
    ) -> Result<T, OpsError> {
        let path = format!("{}/{action}", volume_path(id));
        self.send(Method::POST, &path, Some(body)).await
    }

    fn print<T: Serialize>(&self, value: &T, human: impl FnOnce(&T) -> String) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_else(|_| "{}".into())
            );
        } else {
            print!("{}", human(value));
        }
    }
}

/// The control API's path of volume `id`.
fn volume_path(id: &str) -> String {
    format!("/v1/volumes/{}", api::encode_segment(id))
}

fn block_on<T>(f: impl Future<Output = Result<T, OpsError>>) -> Result<T, OpsError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OpsError::Runtime)?
        .block_on(f)
}

/// `KEY=VALUE` flags as a map; an item without `=` is an error naming the flag.
pub fn pairs(flag: &'static str, items: &[String]) -> Result<BTreeMap<String, String>, OpsError> {
    items
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| OpsError::Usage {
                    flag,
                    reason: format!("{kv:?} is not KEY=VALUE"),
                })
        })
        .collect()
}

/// Topologies from `KEY=VALUE[,KEY=VALUE...]` flags, one per flag (the agent checks the
/// spec's rules).
pub fn topologies(
    flag: &'static str,
    items: &[String],
) -> Result<Vec<BTreeMap<String, String>>, OpsError> {
    items
        .iter()
        .map(|item| {
            let segments: Vec<String> = item.split(',').map(str::to_owned).collect();
            let map = pairs(flag, &segments)?;
            if map.len() != segments.len() {
                return Err(OpsError::Usage {
                    flag,
                    reason: format!("{item:?} names a key twice"),
                });
            }
            Ok(map)
        })
        .collect()
}

/// The secrets in `--secrets-file` (none without the flag); see
/// [`csi_node::secrets::read_secrets_file`] for the forms and the checks.
fn read_secrets(path: Option<&std::path::Path>) -> Result<csi_structs::VolumeSecrets, OpsError> {
    match path {
        None => Ok(csi_structs::VolumeSecrets::default()),
        Some(path) => csi_node::secrets::read_secrets_file(path).map_err(|e| OpsError::Usage {
            flag: "secrets-file",
            reason: e.to_string(),
        }),
    }
}

/// Parses `1073741824`, `10G`, `1Gi`, `512Mi`, ….
///
/// # Errors
///
/// [`OpsError::Usage`] for `--capacity`.
pub fn parse_bytes(text: &str) -> Result<i64, OpsError> {
    let bad = || OpsError::Usage {
        flag: "capacity",
        reason: format!("{text:?} is not a size (e.g. 1073741824, 10G, 1Gi)"),
    };
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: i64 = digits.parse().map_err(|_| bad())?;
    let mult: i64 = match unit {
        "" => 1,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// Runs `csi-agent plugin`.
///
/// # Errors
///
/// [`OpsError`].
pub fn plugin(args: PluginArgs) -> Result<(), OpsError> {
    let json = args.target.json;
    answered(
        json,
        Conn::open(&args.target).and_then(|conn| {
            block_on(async {
                match args.command {
                    PluginCommand::List => {
                        let list: Vec<api::PluginView> = conn.get("/v1/plugins").await?;
                        conn.print(&list, |l| table::plugins(l));
                    }
                    PluginCommand::Info { id } => {
                        let p: api::PluginView = conn
                            .get(&format!("/v1/plugins/{}", api::encode_segment(&id)))
                            .await?;
                        conn.print(&p, table::plugin_detail);
                    }
                }
                Ok(())
            })
        }),
    )
}

/// Runs `csi-agent volume`.
///
/// # Errors
///
/// [`OpsError`].
pub fn volume(args: VolumeArgs) -> Result<(), OpsError> {
    let json = args.target.json;
    answered(
        json,
        Conn::open(&args.target).and_then(|conn| {
            block_on(async {
                match args.command {
                    VolumeCommand::Register {
                        id,
                        external_id,
                        plugin,
                        access_mode,
                        attachment,
                        controller_publish,
                        context,
                        secrets_file,
                        topology,
                    } => {
                        let body = api::RegisterVolume {
                            id,
                            external_id,
                            plugin,
                            access_mode,
                            attachment,
                            controller_publish,
                            context: pairs("context", &context)?,
                            secrets: read_secrets(secrets_file.as_deref())?,
                            accessible_topology: topologies("topology", &topology)?,
                        };
                        let v: api::VolumeView =
                            conn.send(Method::POST, "/v1/volumes", Some(&body)).await?;
                        conn.print(&v, table::volume_detail);
                    }
                    VolumeCommand::Create {
                        id,
                        plugin,
                        capacity,
                        access_mode,
                        attachment,
                        parameters,
                        secrets_file,
                        topology,
                        preferred_topology,
                        snapshot,
                        clone,
                    } => {
                        let body = api::CreateVolume {
                            id,
                            plugin,
                            capacity_bytes: parse_bytes(&capacity)?,
                            access_mode,
                            attachment,
                            parameters: pairs("parameter", &parameters)?,
                            secrets: read_secrets(secrets_file.as_deref())?,
                            requisite_topology: topologies("topology", &topology)?,
                            preferred_topology: topologies(
                                "preferred-topology",
                                &preferred_topology,
                            )?,
                            snapshot,
                            clone,
                        };
                        let v: api::VolumeView = conn
                            .send(Method::POST, "/v1/volumes/create", Some(&body))
                            .await?;
                        conn.print(&v, table::volume_detail);
                    }
                    VolumeCommand::Claim { id, workload, mode } => {
                        let body = api::ClaimVolume { workload, mode };
                        let c: api::ClaimView = conn.post(&id, "claim", &body).await?;
                        conn.print(&c, |c| table::claims(std::slice::from_ref(c)));
                    }
                    VolumeCommand::Release { id, workload, wait } => {
                        let body = api::ReleaseVolume {
                            workload: workload.clone(),
                        };
                        let mut v: api::VolumeView = conn.post(&id, "release", &body).await?;
                        if wait {
                            v = wait_freed(&conn, &id, &workload).await?;
                        }
                        conn.print(&v, table::volume_detail);
                    }
                    VolumeCommand::Expand { id, capacity } => {
                        let body = api::ExpandVolume {
                            capacity_bytes: parse_bytes(&capacity)?,
                        };
                        let e: api::ExpandView = conn.post(&id, "expand", &body).await?;
                        conn.print(&e, table::expanded);
                    }
                    VolumeCommand::List { plugin, external } => match (plugin, external) {
                        (Some(plugin), true) => {
                            let list: Vec<api::ExternalVolumeView> = conn
                                .get(&format!(
                                    "/v1/plugins/{}/volumes",
                                    api::encode_segment(&plugin)
                                ))
                                .await?;
                            conn.print(&list, |l| table::external_volumes(l));
                        }
                        (plugin, _) => {
                            let mut list: Vec<api::VolumeView> = conn.get("/v1/volumes").await?;
                            if let Some(plugin) = plugin {
                                list.retain(|v| v.plugin == plugin);
                            }
                            conn.print(&list, |l| table::volumes(l));
                        }
                    },
                    VolumeCommand::Snapshot { command } => snapshot(&conn, command).await?,
                    VolumeCommand::Status { id: Some(id) } => {
                        let v: api::VolumeView = conn.get(&volume_path(&id)).await?;
                        conn.print(&v, table::volume_detail);
                    }
                    VolumeCommand::Status { id: None } => {
                        let list: Vec<api::VolumeView> = conn.get("/v1/volumes").await?;
                        conn.print(&list, |l| table::volumes(l));
                    }
                    VolumeCommand::Detach {
                        id,
                        node,
                        node_gone,
                        wait,
                    } => {
                        let body = api::DetachVolume {
                            node: node.clone(),
                            node_gone,
                        };
                        let mut d: api::DetachView = conn.post(&id, "detach", &body).await?;
                        if wait {
                            d.volume = wait_until(&conn, &id, |v| {
                                !v.claims.iter().any(|c| c.node == node)
                            })
                            .await?
                            .ok_or_else(|| {
                                OpsError::DetachTimedOut {
                                    volume: id.clone(),
                                    node: node.clone(),
                                    limit: conn.limit,
                                }
                            })?;
                        }
                        conn.print(&d, table::detached);
                    }
                    VolumeCommand::Deregister { id, force, yes } => {
                        let body = api::DeregisterVolume {
                            force,
                            confirmed: yes,
                        };
                        let d: api::DeregisterView = conn.post(&id, "deregister", &body).await?;
                        conn.print(&d, table::deregistered);
                    }
                    VolumeCommand::Delete { id } => {
                        let v: api::VolumeView = conn
                            .send::<(), _>(Method::DELETE, &volume_path(&id), None)
                            .await?;
                        conn.print(&v, |v| {
                            format!(
                                "deleted volume {}\n",
                                csi_structs::untrusted::escaped(&v.id)
                            )
                        });
                    }
                }
                Ok(())
            })
        }),
    )
}

/// Runs `csi-agent volume snapshot`.
async fn snapshot(conn: &Conn, command: SnapshotCommand) -> Result<(), OpsError> {
    let owner = |volume: Option<String>, plugin: Option<String>| match (volume, plugin) {
        (Some(v), _) => Ok(volume_path(&v)),
        (None, Some(p)) => Ok(format!("/v1/plugins/{}", api::encode_segment(&p))),
        (None, None) => Err(OpsError::Usage {
            flag: "plugin",
            reason: "give the volume or --plugin".into(),
        }),
    };
    match command {
        SnapshotCommand::Create {
            id,
            name,
            parameters,
        } => {
            let body = api::CreateSnapshot {
                name,
                parameters: pairs("parameter", &parameters)?,
            };
            let s: api::SnapshotView = conn.post(&id, "snapshots", &body).await?;
            conn.print(&s, |s| table::snapshots(std::slice::from_ref(s)));
        }
        SnapshotCommand::List { id, plugin } => {
            let list: Vec<api::SnapshotView> = conn
                .get(&format!("{}/snapshots", owner(id, plugin)?))
                .await?;
            conn.print(&list, |l| table::snapshots(l));
        }
        SnapshotCommand::Delete {
            snapshot,
            volume,
            plugin,
        } => {
            let d: api::SnapshotDeleted = conn
                .send::<(), _>(
                    Method::DELETE,
                    &format!(
                        "{}/snapshots/{}",
                        owner(volume, plugin)?,
                        api::encode_segment(&snapshot)
                    ),
                    None,
                )
                .await?;
            conn.print(&d, |d| {
                format!(
                    "deleted snapshot {} of plugin {}\n",
                    csi_structs::untrusted::escaped(&d.snapshot_id),
                    csi_structs::untrusted::escaped(&d.plugin)
                )
            });
        }
    }
    Ok(())
}

/// Polls until `workload`'s claim on `id` is gone, within the connection's limit.
async fn wait_freed(conn: &Conn, id: &str, workload: &str) -> Result<api::VolumeView, OpsError> {
    wait_until(conn, id, |v| {
        !v.claims.iter().any(|c| c.workload == workload)
    })
    .await?
    .ok_or_else(|| OpsError::WaitTimedOut {
        volume: id.to_owned(),
        workload: workload.to_owned(),
        limit: conn.limit,
    })
}

/// Polls volume `id` until `done` holds, within the connection's limit: `None` when the
/// limit passed first.
async fn wait_until(
    conn: &Conn,
    id: &str,
    done: impl Fn(&api::VolumeView) -> bool,
) -> Result<Option<api::VolumeView>, OpsError> {
    let deadline = tokio::time::Instant::now() + conn.limit;
    loop {
        let v: api::VolumeView = conn.get(&volume_path(id)).await?;
        if done(&v) {
            return Ok(Some(v));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `csi-agent status`.
///
/// # Errors
///
/// [`OpsError`].
pub fn status(args: StatusArgs) -> Result<(), OpsError> {
    let json = args.target.json;
    answered(
        json,
        Conn::open(&args.target).and_then(|conn| {
            block_on(async {
                let s: api::StatusView = conn.get("/v1/status").await?;
                conn.print(&s, table::status);
                Ok(())
            })
        }),
    )
}
