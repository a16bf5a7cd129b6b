//! The control API of whichever agent runs on the data directory now, and the kills.
//!
//! A restarted agent listens on a new port and rewrites `agent.json`, so every request reads
//! the address and the token again. A request that could not connect was never sent and is
//! sent again once an agent answers; one whose connection broke afterwards has an unknown
//! outcome.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use csi_agent::ops::api::{AgentInfo, ApiError};
use csi_agent::ops::client::{self, ClientError};
use hyper::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::serve::GUARD;

/// How long to wait before trying to reach the agent again while it restarts.
const RECONNECT: Duration = Duration::from_millis(10);

/// How a request ended.
#[derive(Debug)]
pub(crate) enum Answer<T> {
    /// A 2xx answer.
    Ok(T),
    /// An error answer: the agent decided.
    Error { status: u16, error: ApiError },
    /// The connection broke after the request was sent: it may or may not have happened.
    Unknown(String),
}

/// The agent's lives: how many kills began and how many restarted agents answer.
#[derive(Debug)]
pub(crate) struct Life {
    begun: AtomicU64,
    ready: tokio::sync::watch::Sender<u64>,
}

impl Life {
    /// Called before each SIGKILL.
    pub(crate) fn killing(&self) {
        self.begun.fetch_add(1, Ordering::SeqCst);
    }

    /// Called once the agent started after a kill answers.
    pub(crate) fn ready(&self) {
        self.ready.send_modify(|n| *n += 1);
    }

    /// A mark to take before a request, for [`killed_since`](Self::killed_since).
    pub(crate) fn mark(&self) -> u64 {
        *self.ready.borrow()
    }

    /// Kills begun so far.
    pub(crate) fn begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Whether a kill was under way when `mark` was taken or began after it.
    pub(crate) fn killed_since(&self, mark: u64) -> bool {
        self.begun.load(Ordering::SeqCst) > mark
    }

    /// Waits until an agent started after every kill begun so far answers, so what it shows
    /// is what the killed ones left in the store.
    pub(crate) async fn back(&self) {
        let begun = self.begun.load(Ordering::SeqCst);
        let mut ready = self.ready.subscribe();
        tokio::time::timeout(GUARD, ready.wait_for(|n| *n >= begun))
            .await
            .expect("hang guard: the agent is started again after a kill")
            .expect("the life outlives its watchers");
    }
}

/// The control API on one data directory, across restarts. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Control {
    data: Arc<PathBuf>,
    pub(crate) life: Arc<Life>,
}

impl Control {
    pub(crate) fn new(data: &Path) -> Control {
        Control {
            data: Arc::new(data.to_owned()),
            life: Arc::new(Life {
                begun: AtomicU64::new(0),
                ready: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    pub(crate) fn data(&self) -> &Path {
        &self.data
    }

    /// The address and token of the agent running now, if it wrote them yet.
    fn endpoint(&self) -> Option<(SocketAddr, String)> {
        let info: AgentInfo =
            serde_json::from_slice(&std::fs::read(self.data.join("agent.json")).ok()?).ok()?;
        let token = std::fs::read_to_string(self.data.join("control.token")).ok()?;
        Some((info.http.parse().ok()?, token.trim().to_owned()))
    }

    /// Sends one request, again while no agent can be reached (it was not sent).
    pub(crate) async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Answer<T> {
        let guard = tokio::time::Instant::now() + GUARD;
        loop {
            assert!(
                tokio::time::Instant::now() < guard,
                "hang guard: no agent answered {method} {path} for {GUARD:?}"
            );
            let Some((addr, token)) = self.endpoint() else {
                tokio::time::sleep(RECONNECT).await;
                continue;
            };
            match client::call(addr, Some(&token), method.clone(), path, body, GUARD).await {
                Ok(answer) => return Answer::Ok(answer),
                // A stale address: nobody listens there now, or another agent does.
                Err(ClientError::Connect { .. }) | Err(ClientError::Api { status: 401, .. }) => {
                    tokio::time::sleep(RECONNECT).await;
                }
                Err(ClientError::Api { status, error }) => {
                    return Answer::Error { status, error };
                }
                Err(ClientError::BadAnswer { path, detail }) => {
                    panic!("the agent's answer to {path} is not what the API says: {detail}")
                }
                Err(cut @ (ClientError::Http { .. } | ClientError::Timeout { .. })) => {
                    return Answer::Unknown(cut.to_string());
                }
            }
        }
    }

    /// A `GET`; `Err` when the agent answered an error or the connection broke.
    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        match self.call::<(), T>(Method::GET, path, None).await {
            Answer::Ok(v) => Ok(v),
            Answer::Error { status, error } => Err(format!("{status} {error:?}")),
            Answer::Unknown(why) => Err(why),
        }
    }
}
