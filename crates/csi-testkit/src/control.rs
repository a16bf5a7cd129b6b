//! A control socket: change a running mock's faults and read its call log from any language,
//! one line of text per command, over a unix socket (mode 0600).
//!
//! Each command is one line; each answer is zero or more data lines, then `ok` or
//! `error: <what is wrong>`. A line longer than [`MAX_LINE_BYTES`] is refused.
//!
//! | command | effect |
//! |---|---|
//! | `fault RPC=CODE[:after=N][:times=M][:volume=ID]` | adds a fault ([`fault_spec`](crate::fault_spec)) |
//! | `delay RPC=DURATION[:after=N][:times=M][:volume=ID]` | adds a delay |
//! | `hang RPC[:after=N][:times=M][:volume=ID]` | adds a hang |
//! | `hold RPC[:after=N][:times=M][:volume=ID]` | adds a hold: the call waits for `resume` |
//! | `clear` | removes every fault not yet consumed |
//! | `release` | ends hung, held and delayed calls with UNAVAILABLE |
//! | `resume` | serves the held calls now, normally ([`Faults::resume_held`](crate::Faults::resume_held)) |
//! | `condition VOLUME_ID abnormal MESSAGE` | reports the volume abnormal with `MESSAGE` (the rest of the line) where `VOLUME_CONDITION` is advertised ([`MockPlugin::set_volume_condition`]) |
//! | `condition VOLUME_ID normal [MESSAGE]` | reports it normal, with `MESSAGE` if given |
//! | `condition VOLUME_ID clear` | forgets the volume's condition: normal, no message ([`MockPlugin::clear_volume_condition`]) |
//! | `calls` | one line per recorded call: `call SEQ RPC OUTCOME [volume=ID]` |
//! | `drain` | as `calls`, and forgets the records it printed, in the same step |
//! | `log` | `log limit=N kept=K evicted=E received=R`: the log's limit (`none` for no limit), the records it holds, those it dropped because it was full, and every call received |
//!
//! `OUTCOME` is `OK`, `FAILED <CODE> <message>`, `IN_FLIGHT`, `ABANDONED` or
//! `CONNECTION_DROPPED`. Requests themselves are not printed. The log holds at most its
//! [limit](crate::MockPluginBuilder::call_log_limit) of records, oldest dropped first; a
//! reader that wants every call drains it more often than the limit fills (a gap in `SEQ`
//! shows what was dropped).
//!
//! ```text
//! $ printf 'fault NodeUnpublishVolume=UNAVAILABLE:times=3\n' | socat - UNIX-CONNECT:/tmp/ctl.sock
//! ok
//! ```
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
//!
//! let dir = tempfile::tempdir()?;
//! let plugin = csi_testkit::MockPlugin::builder().build()?;
//! let control = plugin.serve_control(dir.path().join("control.sock")).await?;
//! let mut stream = tokio::net::UnixStream::connect(control.path()).await?;
//! stream.write_all(b"fault NodeUnpublishVolume=UNAVAILABLE:times=3\n").await?;
//! let mut answer = String::new();
//! BufReader::new(&mut stream).read_line(&mut answer).await?;
//! assert_eq!(answer, "ok\n");
//! control.shutdown().await;
//! # Ok(()) }
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use crate::calls::{CallList, RecordedOutcome};
use crate::error::Error;
use crate::fault_spec::{FaultSpec, FaultSpecError};
use crate::plugin::MockPlugin;
use crate::transport::unix::{self, SocketId};

/// The longest command line accepted, in bytes.
pub const MAX_LINE_BYTES: usize = 4096;

/// A running control socket. Dropping it stops it and removes the socket.
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    socket: SocketId,
    task: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting commands and removes the socket.
    pub async fn shutdown(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        unix::remove_own(&self.path, self.socket);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            unix::remove_own(&self.path, self.socket);
        }
    }
}

impl MockPlugin {
    /// Serves the control socket at `path`; see the [module docs](crate::control).
    ///
    /// # Errors
    ///
    /// The same as [`serve_unix`](MockPlugin::serve_unix) for its socket: a missing
    /// directory, a path that is too long, something that is not a stale socket in the way,
    /// a bind failure.
    pub async fn serve_control(&self, path: impl AsRef<Path>) -> Result<ControlServer, Error> {
        let path = path.as_ref().to_path_buf();
        unix::prepare(&path)?;
        let (listener, socket) = unix::bind(&path)?;
        let plugin = self.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(session(plugin.clone(), stream));
            }
        });
        Ok(ControlServer {
            path,
            socket,
            task: Some(task),
        })
    }
}

/// Serves one connection, one command per line, until the peer closes it.
async fn session(plugin: MockPlugin, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        // Reads at most one byte past the limit, so a client cannot make the mock buffer
        // an endless line.
        let mut limited = (&mut lines).take(MAX_LINE_BYTES as u64 + 1);
        let answer = match limited.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) if line.len() > MAX_LINE_BYTES && line.last() != Some(&b'\n') => {
                // Skip the rest of the long line, a bounded piece at a time.
                loop {
                    line.clear();
                    let mut piece = (&mut lines).take(MAX_LINE_BYTES as u64);
                    match piece.read_until(b'\n', &mut line).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line.last() == Some(&b'\n') => break,
                        Ok(_) => {}
                    }
                }
                format!("error: the line is longer than {MAX_LINE_BYTES} bytes\n")
            }
            Ok(_) => match std::str::from_utf8(&line) {
                Ok(text) => execute(&plugin, text.trim()),
                Err(_) => "error: the line is not UTF-8\n".to_string(),
            },
        };
        if write.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Runs one command and returns the whole answer, ending in `ok` or `error: ...`.
pub(crate) fn execute(plugin: &MockPlugin, line: &str) -> String {
    let (command, argument) = line.split_once(' ').unwrap_or((line, ""));
    let argument = argument.trim();
    let add = |parse: fn(&str) -> Result<FaultSpec, FaultSpecError>| match parse(argument) {
        Ok(spec) => {
            spec.install(&plugin.faults());
            "ok\n".to_string()
        }
        Err(err) => format!("error: {err}\n"),
    };
    match command {
        "fault" => add(FaultSpec::parse_fault),
        "delay" => add(FaultSpec::parse_delay),
        "hang" => add(FaultSpec::parse_hang),
        "hold" => add(FaultSpec::parse_hold),
        "clear" => {
            plugin.faults().clear();
            "ok\n".into()
        }
        "release" => {
            plugin.faults().release_hung();
            "ok\n".into()
        }
        "resume" => {
            plugin.faults().resume_held();
            "ok\n".into()
        }
        "condition" => match condition(plugin, argument) {
            Ok(()) => "ok\n".into(),
            Err(err) => format!("error: {err}\n"),
        },
        "calls" => call_lines(&plugin.calls().snapshot()),
        "drain" => call_lines(&plugin.calls().drain()),
        "log" => {
            let stats = plugin.calls().stats();
            let limit = stats
                .limit
                .map_or_else(|| "none".to_owned(), |n| n.to_string());
            format!(
                "log limit={limit} kept={} evicted={} received={}\nok\n",
                stats.kept, stats.evicted, stats.received
            )
        }
        "" => format!("error: empty command; known: {KNOWN}\n"),
        other => format!("error: unknown command {other:?}; known: {KNOWN}\n"),
    }
}

/// The commands, for the error that names an unknown one.
const KNOWN: &str =
    "fault, delay, hang, hold, clear, release, resume, condition, calls, drain, log";

/// The forms of `condition`, for the error that refuses another.
const CONDITION_FORMS: &str = "condition VOLUME_ID abnormal MESSAGE, \
     condition VOLUME_ID normal [MESSAGE] or condition VOLUME_ID clear";

/// `VOLUME_ID abnormal MESSAGE`, `VOLUME_ID normal [MESSAGE]` or `VOLUME_ID clear`.
fn condition(plugin: &MockPlugin, argument: &str) -> Result<(), String> {
    let (volume_id, rest) = argument.split_once(' ').unwrap_or((argument, ""));
    let (state, message) = rest.trim().split_once(' ').unwrap_or((rest.trim(), ""));
    let message = message.trim();
    if volume_id.is_empty() {
        return Err(format!("condition needs a volume id: {CONDITION_FORMS}"));
    }
    match state {
        "abnormal" if message.is_empty() => Err(format!(
            "an abnormal condition needs a message: {CONDITION_FORMS}"
        )),
        "abnormal" => {
            plugin.set_volume_condition(volume_id, true, message);
            Ok(())
        }
        "normal" => {
            plugin.set_volume_condition(volume_id, false, message);
            Ok(())
        }
        "clear" if message.is_empty() => {
            plugin.clear_volume_condition(volume_id);
            Ok(())
        }
        "clear" => Err(format!(
            "condition {volume_id} clear takes no message: {CONDITION_FORMS}"
        )),
        "" => Err(format!(
            "condition {volume_id} needs abnormal, normal or clear: {CONDITION_FORMS}"
        )),
        other => Err(format!(
            "unknown condition {other:?} (abnormal, normal or clear): {CONDITION_FORMS}"
        )),
    }
}

/// One `call SEQ RPC OUTCOME [volume=ID]` line per record, then `ok`.
fn call_lines(calls: &CallList) -> String {
    let mut out = String::new();
    for record in calls.records() {
        let _ = write!(out, "call {} {} ", record.seq, record.rpc.name());
        match &record.outcome {
            RecordedOutcome::Ok => out.push_str("OK"),
            RecordedOutcome::Failed { code, message } => {
                let _ = write!(
                    out,
                    "FAILED {} {}",
                    crate::fault_spec::code_name(*code),
                    message.replace(['\n', '\r'], " ")
                );
            }
            RecordedOutcome::InFlight => out.push_str("IN_FLIGHT"),
            RecordedOutcome::Abandoned => out.push_str("ABANDONED"),
            RecordedOutcome::ConnectionDropped => out.push_str("CONNECTION_DROPPED"),
        }
        if let Some(volume) = &record.volume_id {
            let _ = write!(out, " volume={volume}");
        }
        out.push('\n');
    }
    out.push_str("ok\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::Rpc;

    #[test]
    fn commands_answer_ok_or_a_named_error() {
        let plugin = MockPlugin::builder().build().unwrap();
        assert_eq!(
            execute(&plugin, "fault NodeUnpublishVolume=UNAVAILABLE:times=3"),
            "ok\n"
        );
        assert_eq!(plugin.faults().pending(Rpc::NodeUnpublishVolume), 3);
        assert_eq!(execute(&plugin, "hang DeleteVolume:times=1"), "ok\n");
        assert_eq!(execute(&plugin, "delay CreateVolume=1s:times=2"), "ok\n");
        assert_eq!(plugin.faults().pending(Rpc::CreateVolume), 2);
        assert_eq!(execute(&plugin, "clear"), "ok\n");
        assert!(plugin.faults().is_exhausted());
        let err = execute(&plugin, "fault NodeUnpublishVolume=SOMETIMES");
        assert!(
            err.starts_with("error: ") && err.contains("SOMETIMES"),
            "{err}"
        );
        let err = execute(&plugin, "explode now");
        assert!(
            err.contains("\"explode\"") && err.contains("drain"),
            "{err}"
        );
        assert_eq!(execute(&plugin, "calls"), "ok\n");
        assert_eq!(
            execute(&plugin, "log"),
            "log limit=none kept=0 evicted=0 received=0\nok\n"
        );
    }

    #[test]
    fn condition_sets_replaces_and_clears_a_volume_condition() {
        use csi_proto::v1::VolumeCondition;
        let plugin = MockPlugin::builder().build().unwrap();
        let reported = |id: &str| plugin.shared.lock().volume_condition(true, id);
        let normal = Some(VolumeCondition::default());
        assert_eq!(reported("vol-1"), normal);
        assert_eq!(
            execute(&plugin, "condition vol-1 abnormal disk  detached"),
            "ok\n"
        );
        let detached = VolumeCondition {
            abnormal: true,
            message: "disk  detached".into(),
        };
        assert_eq!(reported("vol-1"), Some(detached));
        assert_eq!(reported("vol-2"), normal, "only the named volume");
        assert_eq!(execute(&plugin, "condition vol-1 normal resynced"), "ok\n");
        let resynced = VolumeCondition {
            abnormal: false,
            message: "resynced".into(),
        };
        assert_eq!(reported("vol-1"), Some(resynced));
        assert_eq!(execute(&plugin, "condition vol-1 clear"), "ok\n");
        assert_eq!(reported("vol-1"), normal);
        for (line, names) in [
            ("condition", "volume id"),
            ("condition vol-1", "abnormal, normal or clear"),
            ("condition vol-1 abnormal", "needs a message"),
            ("condition vol-1 broken badly", "\"broken\""),
            ("condition vol-1 clear now", "no message"),
        ] {
            let err = execute(&plugin, line);
            assert!(
                err.starts_with("error: ") && err.contains(names),
                "{line}: {err}"
            );
        }
        assert_eq!(
            reported("vol-1"),
            normal,
            "a refused command changes nothing"
        );
    }

    #[tokio::test]
    async fn drain_prints_the_records_once_and_log_counts_them() {
        use csi_proto::v1::ProbeRequest;
        use csi_proto::v1::identity_client::IdentityClient;
        let plugin = MockPlugin::builder().call_log_limit(2).build().unwrap();
        let (server, channel) = plugin.serve_in_memory().await.unwrap();
        let mut identity = IdentityClient::new(channel);
        for _ in 0..3 {
            identity.probe(ProbeRequest {}).await.unwrap();
        }
        assert_eq!(
            execute(&plugin, "log"),
            "log limit=2 kept=2 evicted=1 received=3\nok\n"
        );
        assert_eq!(
            execute(&plugin, "drain"),
            "call 1 Probe OK\ncall 2 Probe OK\nok\n"
        );
        assert_eq!(execute(&plugin, "drain"), "ok\n");
        assert_eq!(
            execute(&plugin, "log"),
            "log limit=2 kept=0 evicted=1 received=3\nok\n"
        );
        server.shutdown().await.unwrap();
    }
}
