//! One client: claim a volume for a new workload, release it and wait until it is freed, again
//! and again until the run ends. It records what it was told about every workload, which the
//! checks at the end compare with what the agent holds.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use csi_agent::ops::api::{ClaimView, ClaimVolume, ReleaseVolume, VolumeView};
use hyper::Method;
use tokio::time::Instant;

use super::control::{Answer, Control};
use super::report::Rng;
use super::{Access, RELEASE_GUARD, RELEASE_POLL, Volume};

/// A claim: one workload on one volume (every workload is claimed once).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub(crate) volume: String,
    pub(crate) workload: String,
}

impl Key {
    pub(crate) fn new(volume: &str, workload: &str) -> Key {
        Key {
            volume: volume.to_owned(),
            workload: workload.to_owned(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.volume, self.workload)
    }
}

/// What a client was told about a claim, and so what the agent must show after the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    /// The claim was acknowledged and not released: it is there, `taken`.
    HeldAcknowledged,
    /// The claim's outcome was unknown, it was found `taken` after the restart and not
    /// released: it is there, `taken`.
    HeldFound,
    /// The release was acknowledged, or found under way or done after a restart: freed.
    Released,
    /// The claim was refused (409): never made.
    Refused,
    /// The claim failed with another error: never made, or released by the agent itself.
    Failed,
    /// The claim's outcome was unknown and it was not there after the restart.
    NotFound,
    /// The claim's outcome was unknown and it was found being released after the restart.
    FoundReleasing,
}

impl Expect {
    pub(crate) fn is_held(self) -> bool {
        matches!(self, Expect::HeldAcknowledged | Expect::HeldFound)
    }
}

/// What one client did and saw.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) claims_taken: u64,
    pub(crate) claims_refused: u64,
    /// Claims answered with an error other than 409, by the answer's kind.
    pub(crate) claims_failed: BTreeMap<String, u64>,
    pub(crate) claims_unknown: u64,
    pub(crate) unknown_found_taken: u64,
    pub(crate) unknown_found_releasing: u64,
    pub(crate) releases_acknowledged: u64,
    /// Releases answered with an error, by the answer's kind.
    pub(crate) releases_failed: BTreeMap<String, u64>,
    pub(crate) releases_unknown: u64,
    /// Acknowledged claims during which no kill happened, per access mode.
    pub(crate) latency: BTreeMap<Access, Vec<Duration>>,
    pub(crate) ledger: Vec<(Key, Expect)>,
    pub(crate) violations: Vec<String>,
}

/// Claims a client tries after the deadline to end holding one.
const LAST_TRIES: usize = 10;

/// One client of the run.
pub(crate) struct Client {
    pub(crate) id: usize,
    pub(crate) rng: Rng,
    pub(crate) volumes: Arc<[Volume]>,
    pub(crate) control: Control,
    pub(crate) deadline: Instant,
}

impl Client {
    /// Loops until the deadline, then tries a few more claims and keeps the first it gets,
    /// so that the run ends with claims held.
    pub(crate) async fn run(mut self) -> Tally {
        let mut t = Tally::default();
        let mut n = 0u64;
        let mut late = 0;
        while late < LAST_TRIES {
            if Instant::now() >= self.deadline {
                late += 1;
            }
            n += 1;
            let volume = self.volumes[self.rng.below(self.volumes.len())].clone();
            let mode = match volume.access {
                Access::SingleWriter => "write",
                Access::ReaderOnly => "read",
                Access::MultiWriter if self.rng.below(2) == 0 => "read",
                Access::MultiWriter => "write",
            };
            let key = Key::new(&volume.id, &format!("c{}-{n}", self.id));
            let Some(held) = self.claim(&mut t, &volume, mode, &key).await else {
                continue;
            };
            if Instant::now() >= self.deadline {
                t.ledger.push((key, held));
                break;
            }
            self.release(&mut t, &key).await;
        }
        t
    }

    /// Claims `key`; `Some` when the client holds the claim after it.
    async fn claim(
        &mut self,
        t: &mut Tally,
        volume: &Volume,
        mode: &str,
        key: &Key,
    ) -> Option<Expect> {
        let mark = self.control.life.mark();
        let body = ClaimVolume {
            workload: key.workload.clone(),
            mode: mode.to_owned(),
        };
        let sent = std::time::Instant::now();
        let path = format!("/v1/volumes/{}/claim", key.volume);
        let answer: Answer<ClaimView> = self.control.call(Method::POST, &path, Some(&body)).await;
        let took = sent.elapsed();
        let outcome = match answer {
            Answer::Ok(_) => {
                t.claims_taken += 1;
                if !self.control.life.killed_since(mark) {
                    t.latency.entry(volume.access).or_default().push(took);
                }
                return Some(Expect::HeldAcknowledged);
            }
            Answer::Error { status: 409, .. } => {
                t.claims_refused += 1;
                Expect::Refused
            }
            Answer::Error { error, .. } => {
                *t.claims_failed.entry(error.kind).or_default() += 1;
                Expect::Failed
            }
            Answer::Unknown(why) => {
                t.claims_unknown += 1;
                self.explained(t, mark, "claim", key, &why);
                match self.look(key).await.as_deref() {
                    None => Expect::NotFound,
                    Some("taken") => {
                        t.unknown_found_taken += 1;
                        return Some(Expect::HeldFound);
                    }
                    Some(_) => {
                        t.unknown_found_releasing += 1;
                        self.wait_freed(t, key).await;
                        Expect::FoundReleasing
                    }
                }
            }
        };
        t.ledger.push((key.clone(), outcome));
        None
    }

    /// Releases `key` (sending it again while the agent shows the claim still `taken`) and
    /// waits until it is freed.
    async fn release(&mut self, t: &mut Tally, key: &Key) {
        let guard = Instant::now() + RELEASE_GUARD;
        let path = format!("/v1/volumes/{}/release", key.volume);
        let body = ReleaseVolume {
            workload: key.workload.clone(),
        };
        while Instant::now() < guard {
            let mark = self.control.life.mark();
            let answer: Answer<VolumeView> =
                self.control.call(Method::POST, &path, Some(&body)).await;
            let seen = match answer {
                Answer::Ok(_) => {
                    t.releases_acknowledged += 1;
                    self.wait_freed(t, key).await;
                    t.ledger.push((key.clone(), Expect::Released));
                    return;
                }
                Answer::Error { status, error } => {
                    *t.releases_failed.entry(error.kind.clone()).or_default() += 1;
                    let seen = self.look(key).await;
                    if seen.is_none() {
                        t.violations.push(format!(
                            "claim {key}, held by its client, is unknown to the agent: the \
                             release was answered {status} {error:?}"
                        ));
                    }
                    seen
                }
                Answer::Unknown(why) => {
                    t.releases_unknown += 1;
                    self.explained(t, mark, "release", key, &why);
                    self.look(key).await
                }
            };
            match seen.as_deref() {
                Some("taken") => tokio::time::sleep(RELEASE_POLL).await,
                Some(_) => {
                    self.wait_freed(t, key).await;
                    break;
                }
                None => break,
            }
        }
        if Instant::now() >= guard {
            t.violations.push(format!(
                "the release of {key} was not accepted in {RELEASE_GUARD:?}"
            ));
        }
        t.ledger.push((key.clone(), Expect::Released));
    }

    /// A request without an answer must be explained by a kill.
    fn explained(&self, t: &mut Tally, mark: u64, what: &str, key: &Key, why: &str) {
        if !self.control.life.killed_since(mark) {
            t.violations.push(format!(
                "the {what} of {key} got no answer and the agent was not being killed \
                 ({} kills begun, all before the request and done): {why}",
                self.control.life.begun()
            ));
        }
    }

    /// The state of `key`'s claim as an agent started after every kill so far shows it;
    /// `None` when it has none.
    async fn look(&self, key: &Key) -> Option<String> {
        let path = format!("/v1/volumes/{}", key.volume);
        loop {
            self.control.life.back().await;
            match self.control.get::<VolumeView>(&path).await {
                Ok(v) => {
                    return v
                        .claims
                        .into_iter()
                        .find(|c| c.workload == key.workload)
                        .map(|c| c.state);
                }
                Err(_) => tokio::time::sleep(RELEASE_POLL).await,
            }
        }
    }

    /// Polls until `key`'s claim is freed (gone from the volume's claims).
    async fn wait_freed(&self, t: &mut Tally, key: &Key) {
        let guard = Instant::now() + RELEASE_GUARD;
        let path = format!("/v1/volumes/{}", key.volume);
        let mut pause = Duration::from_millis(2);
        while Instant::now() < guard {
            if let Ok(v) = self.control.get::<VolumeView>(&path).await
                && !v.claims.iter().any(|c| c.workload == key.workload)
            {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RELEASE_POLL * 5);
        }
        t.violations.push(format!(
            "the acknowledged release of {key} was not freed within {RELEASE_GUARD:?}"
        ));
    }
}
