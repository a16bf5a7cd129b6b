//! Child processes: this executable re-run with a hidden flag, as the ping-pong peer or as a
//! mock plugin whose memory is measured from outside.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::error::BenchError;

/// The hidden flag that makes `csi-bench` the ping-pong peer (`--baseline-child PATH`).
pub const HIDDEN_BASELINE_CHILD: &str = "--baseline-child";

/// The hidden flag that makes `csi-bench` serve the mock plugin at a socket until its stdin
/// closes (`--serve-mock PATH`).
pub const HIDDEN_SERVE_MOCK: &str = "--serve-mock";

/// How long a child gets to connect or to create its socket.
pub const CHILD_START_LIMIT: Duration = Duration::from_secs(20);

const POLL: Duration = Duration::from_millis(2);

/// Accepts the one connection the child makes, giving up when the child exits first or
/// after [`CHILD_START_LIMIT`].
pub(crate) fn accept_from(
    listener: &UnixListener,
    child: &mut Child,
    exe: &Path,
    path: &Path,
    role: &'static str,
) -> Result<UnixStream, BenchError> {
    let step = |step| move |source| BenchError::Baseline { step, source };
    listener
        .set_nonblocking(true)
        .map_err(step("making the listener non-blocking"))?;
    let started = Instant::now();
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(step("making the stream blocking"))?;
                return Ok(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(step("accepting the child")(e)),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(BenchError::Child {
                exe: exe.to_path_buf(),
                role,
                status,
            });
        }
        if started.elapsed() > CHILD_START_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BenchError::ChildSocket {
                role,
                path: path.to_path_buf(),
                waited_ms: waited_ms(started),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Waits until `path` accepts connections, giving up when the child exits first or after
/// [`CHILD_START_LIMIT`].
pub(crate) fn wait_for_socket(
    path: &Path,
    child: &mut Child,
    exe: &Path,
    role: &'static str,
) -> Result<(), BenchError> {
    let started = Instant::now();
    loop {
        if UnixStream::connect(path).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(BenchError::Child {
                exe: exe.to_path_buf(),
                role,
                status,
            });
        }
        if started.elapsed() > CHILD_START_LIMIT {
            return Err(BenchError::ChildSocket {
                role,
                path: path.to_path_buf(),
                waited_ms: waited_ms(started),
            });
        }
        std::thread::sleep(POLL);
    }
}

fn waited_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Waits for a child that was told to exit. When `check` is set, a failed exit is an error.
pub(crate) fn reap(
    mut child: Child,
    exe: &Path,
    role: &'static str,
    check: bool,
) -> Result<(), BenchError> {
    let status = child.wait().map_err(|source| BenchError::Spawn {
        exe: exe.to_path_buf(),
        role,
        source,
    })?;
    if check && !status.success() {
        return Err(BenchError::Child {
            exe: exe.to_path_buf(),
            role,
            status,
        });
    }
    Ok(())
}
