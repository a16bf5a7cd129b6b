//! Campaign `crash`: crash consistency of the durable stores and the agent's state files.
//!
//! A case is a generated sequence of operations (register a volume in the agent's book,
//! claim it for a workload and record the publication in the node's usage records, release
//! a claim to the end and forget the publication, remove a volume without claims; see
//! module `stores`), written to csi-claims' [`RedbStore`](csi_claims::RedbStore) through its
//! claims driver, csi-node's usage records (a [`UsageDb`](csi_node::volumes::UsageDb) in
//! the same file, as the agent keeps them) and the reference agent's `volumes.json`, in a
//! temporary directory of its own. Two kinds:
//!
//! - **Kill**: the campaign binary runs the sequence in a child process of its own
//!   ([`CHILD_VAR`]), which prints a line as each operation is acknowledged; the campaign
//!   kills it with SIGKILL once a generated number of operations were acknowledged, after a
//!   generated pause of 0-3 ms (so the kill lands before, inside or after the next write), then
//!   opens every store again, as a restart does. Property: each store holds the state after
//!   exactly the acknowledged operations, or after one more (the one in flight): nothing
//!   acknowledged was lost, nothing was done twice (a claim held twice counts), and every
//!   store opens.
//! - **Damage**: the sequence runs in the process, then one file is truncated at a random
//!   offset, overwritten with garbage or zeros at a random offset, emptied, or made garbage
//!   when it did not exist. Property: opening it again fails with an error naming the file,
//!   never a silent reset; for the redb file, which has room it does not use, opening may
//!   also succeed, but then with every record intact.
//!
//! Child processes are slow (a start, a runtime, a database): the kill cases are about half
//! of all and stop when the campaign's share of the budget is spent.

mod stores;

use std::fmt;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use self::stores::{Model, Op, Paths};
use crate::panics;
use crate::report::{Plan, Report};
use crate::rng::Rng;

/// The campaign's name on the command line and in its report line.
pub const NAME: &str = "crash";

/// What the campaign covers, for `--list` and RELIABILITY.md.
pub const COVERS: &str = "crash consistency: generated claims and releases through csi-claims' RedbStore, csi-node's usage records (in the same redb file) and the agent's volumes.json, killed with SIGKILL in a child process at generated points and opened again (nothing acknowledged lost, nothing done twice); files truncated, overwritten with garbage or zeros, or emptied (an error naming the file, never a silent reset)";

/// The violation counters, in the order they print.
const COUNTERS: &[&str] = &[
    "panics",
    "lost_acknowledged",
    "done_twice",
    "unreadable_after_kill",
    "silent_reset",
    "unclear_errors",
    "child_failures",
];

/// Set in a child's environment: the directory of its stores. The campaign binary runs the
/// child's work instead of its command line when it is set ([`child_main`]).
pub const CHILD_VAR: &str = "CSI_CAMPAIGN_CRASH_DIR";
/// The child's seed and case index, to generate the same operations.
const SEED_VAR: &str = "CSI_CAMPAIGN_CRASH_SEED";
const CASE_VAR: &str = "CSI_CAMPAIGN_CRASH_CASE";

/// The longest a child may take to acknowledge the next operation before it counts as hung.
const CHILD_GUARD: Duration = Duration::from_secs(30);

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// The program that runs a child (the campaign binary, which calls [`child_main`] first).
/// Default: the running executable. A test harness that is not the campaign binary sets the
/// binary's path here before running the campaign.
pub fn set_child_program(path: impl Into<PathBuf>) {
    let _ = PROGRAM.set(path.into());
}

fn program() -> Result<PathBuf, String> {
    match PROGRAM.get() {
        Some(p) => Ok(p.clone()),
        None => {
            std::env::current_exe().map_err(|e| format!("cannot find the campaign binary: {e}"))
        }
    }
}

/// What a case does.
#[derive(Clone, Debug)]
enum Kind {
    /// Kill the child once `after` operations were acknowledged, `pause_us` later.
    Kill { after: usize, pause_us: u64 },
    /// Damage one file once every operation ran.
    Damage(Target, Damage),
}

/// Which file a damage case hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Claims,
    Usage,
    Book,
}

/// How the file is damaged; offsets are fractions (per mille) of the file's length.
#[derive(Clone, Copy, Debug)]
enum Damage {
    /// Cut at this point (before its end).
    Truncate(u64),
    /// `len` bytes of garbage (starting with 0xff) from this point.
    Garbage(u64, usize),
    /// `len` zero bytes from this point.
    Zeros(u64, usize),
    /// Emptied.
    Empty,
}

struct Case {
    ops: Vec<Op>,
    kind: Kind,
    /// For garbage bytes.
    rng: Rng,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops: Vec<String> = self.ops.iter().map(Op::to_string).collect();
        write!(f, "{:?} after [{}]", self.kind, ops.join(", "))
    }
}

impl Case {
    fn generate(rng: &mut Rng) -> Case {
        let n = rng.range(3, 10) as usize;
        let ops = stores::generate_ops(rng, n);
        let kind = if rng.percent(50) {
            Kind::Kill {
                after: rng.index(n + 1),
                pause_us: rng.pick(&[0, 0, 50, 200, 1000, 3000]),
            }
        } else {
            let target = rng.pick(&[Target::Claims, Target::Usage, Target::Book]);
            let at = rng.below(1000);
            let damage = match rng.index(4) {
                0 => Damage::Truncate(at),
                1 => Damage::Garbage(at, rng.range(1, 512) as usize),
                2 => Damage::Zeros(at, rng.range(1, 4096) as usize),
                _ => Damage::Empty,
            };
            Kind::Damage(target, damage)
        };
        Case {
            ops,
            kind,
            rng: Rng::new(rng.next_u64()),
        }
    }
}

/// The child's work, when the environment asks for it: `Some(exit code)` then, and the
/// binary must exit with it; `None` in a normal run.
pub fn child_main() -> Option<ExitCode> {
    let dir = std::env::var_os(CHILD_VAR)?;
    let parse = |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok());
    let (Some(seed), Some(index)) = (parse(SEED_VAR), parse(CASE_VAR)) else {
        eprintln!("{SEED_VAR} and {CASE_VAR} must be numbers");
        return Some(ExitCode::from(2));
    };
    let case = Case::generate(&mut Rng::for_case(seed, index));
    let runtime = match crate::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return Some(ExitCode::from(2));
        }
    };
    let paths = Paths::new(Path::new(&dir));
    let result = runtime.block_on(stores::run_ops(&paths, &case.ops, |i| {
        let mut out = std::io::stdout().lock();
        let _ = match i {
            None => writeln!(out, "ready"),
            Some(i) => writeln!(out, "ack {i}"),
        };
        let _ = out.flush();
    }));
    match result {
        Ok(()) => Some(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("child failed: {e}");
            Some(ExitCode::from(1))
        }
    }
}

/// How a kill case ended: how many operations the child acknowledged before it died.
struct Killed {
    acked: usize,
}

/// Runs the case's operations in a child and kills it as the case says.
fn kill(
    seed: u64,
    index: u64,
    paths: &Paths,
    after: usize,
    pause_us: u64,
) -> Result<Killed, String> {
    let mut child = Command::new(program()?)
        .env(CHILD_VAR, &paths.dir)
        .env(SEED_VAR, seed.to_string())
        .env(CASE_VAR, index.to_string())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the child: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The line that says `after` operations are acknowledged.
    let signal = match after {
        0 => "ready".to_owned(),
        n => format!("ack {}", n - 1),
    };
    let mut acked = 0;
    let mut hung = false;
    loop {
        match rx.recv_timeout(CHILD_GUARD) {
            Ok(line) => {
                if line.starts_with("ack ") {
                    acked += 1;
                }
                if line == signal {
                    break;
                }
            }
            // The child ended before the signal: its error is on stderr.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                hung = true;
                break;
            }
        }
    }
    if pause_us > 0 {
        std::thread::sleep(Duration::from_micros(pause_us));
    }
    // SIGKILL: no destructor, no flush of anything the process still held.
    let _ = child.kill();
    let status = child.wait().map_err(|e| e.to_string())?;
    // Acknowledgements printed before the kill that were not read yet.
    let _ = reader.join();
    acked += rx.try_iter().filter(|l| l.starts_with("ack ")).count();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    if hung {
        return Err(format!(
            "the child acknowledged nothing for {CHILD_GUARD:?} ({acked} acknowledged)"
        ));
    }
    if !stderr.trim().is_empty() && stderr.contains("child failed") {
        return Err(format!("the child failed ({status}): {}", stderr.trim()));
    }
    Ok(Killed { acked })
}

/// The judge of one case.
struct Judge<'a> {
    report: &'a mut Report,
    index: u64,
    what: String,
}

impl Judge<'_> {
    fn fail(&mut self, counter: &'static str, why: impl fmt::Display) {
        let why: String = why.to_string().chars().take(600).collect();
        self.report
            .violation(counter, self.index, format!("{why} [{}]", self.what));
    }
}

/// Checks what a restart found in one store against the state after the acknowledged
/// operations (`before`) and after the one in flight (`after`, when there was one). Returns
/// whether the store holds the in-flight operation's change (for the trace).
fn check_kill<T: PartialEq + fmt::Debug>(
    judge: &mut Judge<'_>,
    store: &str,
    found: Result<T, String>,
    before: &T,
    after: Option<&T>,
) -> bool {
    let landed = matches!((&found, after), (Ok(f), Some(a)) if f == a && f != before);
    match found {
        Err(e) if e.starts_with("DUPLICATE") => judge.fail("done_twice", format!("{store}: {e}")),
        Err(e) => judge.fail(
            "unreadable_after_kill",
            format!("{store} cannot be opened after the kill: {e}"),
        ),
        Ok(found) if &found == before || after.is_some_and(|a| &found == a) => {}
        Ok(found) => {
            // Lost: something acknowledged is missing. Twice: something beyond the op in
            // flight is there.
            judge.fail(
                "lost_acknowledged",
                format!(
                    "{store} holds {found:?}; acknowledged: {before:?}, with the next operation: {after:?}"
                ),
            );
        }
    }
    landed
}

/// A directory of its own for a case's stores, removed when dropped.
fn case_dir() -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix("csi-crash")
        .tempdir()
        .map_err(|e| e.to_string())
}

async fn run_kill(
    plan: &Plan,
    index: u64,
    case: &Case,
    after: usize,
    pause_us: u64,
    judge: &mut Judge<'_>,
) -> Result<(), String> {
    let dir = case_dir()?;
    let paths = Paths::new(dir.path());
    let seed = plan.seed;
    let killed = {
        let paths = Paths::new(dir.path());
        tokio::task::spawn_blocking(move || kill(seed, index, &paths, after, pause_us))
            .await
            .map_err(|e| e.to_string())?
    };
    let killed = match killed {
        Ok(k) => k,
        Err(e) => {
            judge.fail("child_failures", e);
            return Ok(());
        }
    };
    let acked = killed.acked.min(case.ops.len());
    plan.trace(
        index,
        format_args!(
            "killed with {acked} of {} operations acknowledged{}",
            case.ops.len(),
            if acked < case.ops.len() {
                " (one in flight)"
            } else {
                ""
            }
        ),
    );
    if acked < after {
        judge.fail(
            "child_failures",
            format!("only {acked} of {after} operations were acknowledged"),
        );
        return Ok(());
    }
    let before = Model::after(&case.ops, acked);
    let next = (acked < case.ops.len()).then(|| Model::after(&case.ops, acked + 1));
    let mut landed = Vec::new();
    if check_kill(
        judge,
        "the claim store",
        stores::read_claims(&paths.claims).await,
        &before.claims,
        next.as_ref().map(|m| &m.claims),
    ) {
        landed.push("claims.redb");
    }
    if check_kill(
        judge,
        "the usage records",
        stores::read_usage(&paths.usage),
        &before.claims,
        next.as_ref().map(|m| &m.claims),
    ) {
        landed.push("usage records");
    }
    if check_kill(
        judge,
        "volumes.json",
        stores::read_book(&paths.dir),
        &before.book,
        next.as_ref().map(|m| &m.book),
    ) {
        landed.push("volumes.json");
    }
    if !landed.is_empty() {
        plan.trace(
            index,
            format_args!("the operation in flight reached {}", landed.join(", ")),
        );
    }
    Ok(())
}

/// Damages `path` as `damage` says.
fn damage(path: &Path, damage: Damage, rng: &mut Rng) -> std::io::Result<()> {
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let at = |per_mille: u64| len.saturating_mul(per_mille) / 1000;
    match damage {
        Damage::Truncate(p) => {
            let f = std::fs::OpenOptions::new().write(true).open(path)?;
            f.set_len(at(p).min(len.saturating_sub(1)))
        }
        Damage::Empty => std::fs::write(path, b""),
        Damage::Garbage(p, n) | Damage::Zeros(p, n) => {
            let mut bytes = if matches!(damage, Damage::Garbage(..)) {
                let mut b = rng.bytes(n);
                b[0] = 0xff;
                b
            } else {
                vec![0; n]
            };
            if len == 0 {
                // A file that was never written: garbage in its place.
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                bytes[0] = 0xff;
                return std::fs::write(path, bytes);
            }
            use std::io::{Seek as _, SeekFrom};
            let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
            f.seek(SeekFrom::Start(at(p).min(len - 1)))?;
            f.write_all(&bytes)
        }
    }
}

async fn run_damage(
    case: &mut Case,
    target: Target,
    how: Damage,
    judge: &mut Judge<'_>,
) -> Result<(), String> {
    let dir = case_dir()?;
    let paths = Paths::new(dir.path());
    stores::run_ops(&paths, &case.ops, |_| {}).await?;
    let full = Model::after(&case.ops, case.ops.len());
    let path = match target {
        Target::Claims => &paths.claims,
        Target::Usage => &paths.usage,
        Target::Book => &paths.book,
    };
    let existed = path.exists();
    if !existed && matches!(how, Damage::Truncate(_) | Damage::Empty) {
        // Nothing to cut: make it garbage instead.
        damage(path, Damage::Garbage(0, 16), &mut case.rng).map_err(|e| e.to_string())?;
    } else {
        damage(path, how, &mut case.rng).map_err(|e| e.to_string())?;
    }
    let name = path.display().to_string();
    let read: Result<(), String> = match target {
        Target::Claims => match stores::read_claims(path).await {
            // redb has room it does not use: damage there changes nothing, which is fine
            // as long as nothing changed.
            Ok(found) if found == full.claims => Ok(()),
            Ok(found) => {
                judge.fail(
                    "silent_reset",
                    format!(
                        "the damaged claim store opened with {found:?}, not {:?}",
                        full.claims
                    ),
                );
                return Ok(());
            }
            Err(e) => Err(e),
        },
        // The usage records share the claims' file: as there, damage the records do not
        // read may leave them whole, and that is fine.
        Target::Usage => match stores::read_usage(path) {
            Ok(found) if found == full.claims => Ok(()),
            Ok(found) => {
                judge.fail(
                    "silent_reset",
                    format!(
                        "the damaged usage records opened with {found:?}, not {:?}",
                        full.claims
                    ),
                );
                return Ok(());
            }
            Err(e) => Err(e),
        },
        Target::Book => stores::read_book(&paths.dir).map(|found| {
            judge.fail(
                "silent_reset",
                format!("the damaged volumes.json opened without an error, holding {found:?}"),
            );
        }),
    };
    if let Err(e) = read {
        if e.starts_with("UNKNOWN") || e.starts_with("DUPLICATE") {
            judge.fail(
                "silent_reset",
                format!("the damaged file opened with changed content: {e}"),
            );
        } else if !e.contains(&name) {
            judge.fail(
                "unclear_errors",
                format!("the error does not name {name}: {e}"),
            );
        }
    }
    Ok(())
}

/// Runs the campaign.
pub fn run(plan: &Plan) -> Report {
    let mut report = Report::new(NAME, plan, COUNTERS);
    panics::install_hook();
    let runtime = match crate::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            report.violation("child_failures", 0, format!("cannot start a runtime: {e}"));
            return report;
        }
    };
    runtime.block_on(campaign(plan, &mut report));
    runtime.shutdown_timeout(Duration::from_secs(5));
    report
}

async fn campaign(plan: &Plan, report: &mut Report) {
    for index in plan.indices() {
        if plan.out_of_time() {
            report.stopped_by_budget();
            break;
        }
        let mut case = Case::generate(&mut Rng::for_case(plan.seed, index));
        plan.trace(index, &case);
        let before = panics::count();
        let mut judge = Judge {
            report,
            index,
            what: case.to_string(),
        };
        let kind = case.kind.clone();
        let started = Instant::now();
        let mut contained = false;
        let ran = match kind {
            Kind::Kill { after, pause_us } => {
                run_kill(plan, index, &case, after, pause_us, &mut judge).await
            }
            Kind::Damage(target, how) => {
                // redb panics on some damaged files; a store must answer with an error
                // naming the file instead. A panic it contains so is no violation; one that
                // reaches its caller is.
                contained = true;
                let _scope = panics::Contained::open();
                let caught =
                    std::panic::AssertUnwindSafe(run_damage(&mut case, target, how, &mut judge));
                let ran = futures_catch(caught).await;
                if ran.is_none() {
                    judge.fail("panics", "a panic reached the store's caller");
                }
                ran.unwrap_or(Ok(()))
            }
        };
        if let Err(e) = ran {
            judge.fail("child_failures", format!("the case could not run: {e}"));
        }
        plan.trace(index, format_args!("took {:?}", started.elapsed()));
        if !contained {
            panics::note(report, index, before);
        }
        report.case_done();
    }
}

/// Runs `fut`, turning a panic inside it into `None` (the panic hook has counted it).
async fn futures_catch<F: std::future::Future>(
    fut: std::panic::AssertUnwindSafe<F>,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut.0);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Some(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(_) => std::task::Poll::Ready(None),
        }
    })
    .await
}
