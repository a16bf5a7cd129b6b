//! The floor: a raw 100-byte ping-pong over a unix socket between this process and a child
//! (this same executable, re-run with a hidden flag). No gRPC, no HTTP/2, no async runtime:
//! what one round trip between two processes costs on this machine.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::child::{self, HIDDEN_BASELINE_CHILD};
use crate::error::BenchError;
use crate::report::Line;

/// The message size of the ping-pong, in bytes.
pub const MESSAGE_BYTES: usize = 100;

/// The `client=` value of the baseline line.
pub const CLIENT: &str = "baseline";

/// The `rpc=` value of the baseline line.
pub const RPC: &str = "pingpong";

fn step(step: &'static str) -> impl FnOnce(io::Error) -> BenchError {
    move |source| BenchError::Baseline { step, source }
}

/// The ping-pong peer, started and connected: round trips can be run in as many batches as
/// the caller likes (`--compare` interleaves them with the Probe batches).
#[derive(Debug)]
pub struct PingPong {
    child: Child,
    stream: UnixStream,
    exe: PathBuf,
    // Holds the socket's directory until the peer is gone.
    _dir: TempDir,
    sent: u64,
}

impl PingPong {
    /// Starts the peer (this executable, `exe`, re-run with a hidden flag) and accepts its
    /// connection.
    ///
    /// # Errors
    ///
    /// [`BenchError::TempDir`], [`BenchError::Baseline`] for a socket failure,
    /// [`BenchError::Spawn`], [`BenchError::ChildSocket`] and [`BenchError::Child`] when the
    /// child does not start or connect.
    pub fn start(exe: &Path) -> Result<PingPong, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("csi-bench-")
            .tempdir()
            .map_err(|source| BenchError::TempDir {
                purpose: "the ping-pong socket",
                source,
            })?;
        let path = dir.path().join("pingpong.sock");
        let listener = UnixListener::bind(&path).map_err(step("binding the socket"))?;
        let mut child = Command::new(exe)
            .arg(HIDDEN_BASELINE_CHILD)
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|source| BenchError::Spawn {
                exe: exe.to_path_buf(),
                role: "ping-pong peer",
                source,
            })?;
        let stream = match child::accept_from(&listener, &mut child, exe, &path, "ping-pong peer") {
            Ok(stream) => stream,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        Ok(PingPong {
            child,
            stream,
            exe: exe.to_path_buf(),
            _dir: dir,
            sent: 0,
        })
    }

    /// `n` round trips, each timed.
    ///
    /// # Errors
    ///
    /// [`BenchError::Baseline`] when the socket fails or a pong does not echo its ping.
    pub fn round_trips(&mut self, n: u64) -> Result<Vec<Duration>, BenchError> {
        let mut ping = [0u8; MESSAGE_BYTES];
        let mut pong = [0u8; MESSAGE_BYTES];
        let mut latencies = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for _ in 0..n {
            let t = Instant::now();
            round_trip(&mut self.stream, &mut ping, &mut pong, self.sent)?;
            latencies.push(t.elapsed());
            self.sent += 1;
        }
        Ok(latencies)
    }

    /// Closes the socket (the peer exits) and waits for the peer. When `check` is set, a
    /// failed exit is an error.
    ///
    /// # Errors
    ///
    /// [`BenchError::Spawn`] when the peer cannot be waited for, [`BenchError::Child`] when
    /// it failed and `check` is set.
    pub fn finish(self, check: bool) -> Result<(), BenchError> {
        let PingPong {
            child, stream, exe, ..
        } = self;
        drop(stream);
        child::reap(child, &exe, "ping-pong peer", check)
    }
}

/// Runs `warmup` then `n` measured round trips against a child started from `exe` and
/// returns the line (`client=baseline rpc=pingpong c=1`).
///
/// # Errors
///
/// As [`PingPong::start`] and [`PingPong::round_trips`].
pub fn run_baseline(exe: &Path, n: u64, warmup: u64) -> Result<Line, BenchError> {
    let mut peer = PingPong::start(exe)?;
    let result = peer.round_trips(warmup).and_then(|_| {
        let started = Instant::now();
        let mut latencies = peer.round_trips(n)?;
        let wall = started.elapsed();
        Ok(Line::from_run(CLIENT, RPC, 1, &mut latencies, wall))
    });
    peer.finish(result.is_ok())?;
    result
}

fn round_trip(
    stream: &mut UnixStream,
    ping: &mut [u8; MESSAGE_BYTES],
    pong: &mut [u8; MESSAGE_BYTES],
    i: u64,
) -> Result<(), BenchError> {
    ping[..8].copy_from_slice(&i.to_le_bytes());
    stream.write_all(ping).map_err(step("sending a ping"))?;
    stream.read_exact(pong).map_err(step("reading a pong"))?;
    if pong[..8] != ping[..8] {
        return Err(BenchError::Baseline {
            step: "checking a pong",
            source: io::Error::new(
                io::ErrorKind::InvalidData,
                "the pong does not echo the ping",
            ),
        });
    }
    Ok(())
}

/// The child's side: connects to `path` and echoes every 100-byte message until the parent
/// closes the socket.
///
/// # Errors
///
/// [`BenchError::Baseline`] when the socket fails other than by being closed.
pub fn serve_pongs(path: &Path) -> Result<(), BenchError> {
    let mut stream = UnixStream::connect(path).map_err(step("connecting to the parent"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(step("setting a read timeout"))?;
    let mut buf = [0u8; MESSAGE_BYTES];
    loop {
        match stream.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(step("reading a ping")(e)),
        }
        stream.write_all(&buf).map_err(step("sending a pong"))?;
    }
}
