//! Running the built `csi-agent` binary with a hang guard.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Only a hang guard: a demo against the mock takes well under a second.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// What a finished `csi-agent` run printed.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// Both streams, for assertion messages.
    pub(crate) fn dump(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `csi-agent` with `args` off the async runtime, so an in-process mock plugin keeps
/// serving while the binary runs.
pub(crate) async fn csi_agent(args: &[&str]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_csi-agent"));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command
        .spawn()
        .expect("the csi-agent binary cargo built can be started");
    let pid = child.id();
    let waited = tokio::time::timeout(
        HANG_GUARD,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await;
    let output: Output = match waited {
        Ok(joined) => joined
            .expect("the waiting thread does not panic")
            .expect("waiting for csi-agent works"),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("csi-agent {args:?} did not finish within {HANG_GUARD:?}");
        }
    };
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Writes `text` to `<dir>/<name>` with permission bits `mode` (a secrets file: 0600), and
/// returns the path as a flag value.
pub(crate) fn file_with_mode(dir: &std::path::Path, name: &str, text: &str, mode: u32) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(&path, text).expect("the temp dir is writable");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path.display().to_string()
}
