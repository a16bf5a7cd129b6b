//! CPU time of a process, from `/proc/<pid>/stat` (Linux).
//!
//! The times there are in clock ticks of `USER_HZ`, which Linux fixes at 100 per second on
//! every architecture it exports to user space (asking `sysconf(_SC_CLK_TCK)` would need
//! `libc` and `unsafe`, which the workspace forbids). One reading is coarse (10 ms), so the
//! bench sums the differences over many batches; over a run of seconds the error is small.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::BenchError;

/// Clock ticks per second of the times in `/proc/<pid>/stat`.
pub const TICKS_PER_SECOND: u64 = 100;

/// The CPU times of one process, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    /// Its own user plus system time (`utime + stime`).
    pub own: u64,
    /// That of its children it has waited for (`cutime + cstime`).
    pub children: u64,
}

/// Ticks as a duration.
pub fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_millis(ticks.saturating_mul(1000 / TICKS_PER_SECOND))
}

/// The CPU times of process `pid` (`None`: this process).
///
/// # Errors
///
/// [`BenchError::Stat`] when the file cannot be read or parsed (not Linux, or the process is
/// gone).
pub fn cpu_ticks(pid: Option<u32>) -> Result<CpuTicks, BenchError> {
    let path = match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}/stat")),
        None => PathBuf::from("/proc/self/stat"),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| BenchError::Stat {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    parse_stat(&text).ok_or_else(|| BenchError::Stat {
        path,
        detail: "fields 14-17 (utime stime cutime cstime) missing or not numbers".to_owned(),
    })
}

/// The CPU times of a `/proc/<pid>/stat` text. The command name (field 2) may hold spaces and
/// parentheses, so the fields are counted from the last `)`.
pub fn parse_stat(stat: &str) -> Option<CpuTicks> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name: field 3 (state) is index 0, so utime (14) is index 11.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(CpuTicks {
        own: number(11)? + number(12)?,
        children: number(13)? + number(14)?,
    })
}

/// The 1-minute load average, from `/proc/loadavg`; `None` when unreadable.
pub fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_and_children_times_after_the_name() {
        let stat = "4242 (we (ird) name) S 1 4242 4242 0 -1 4194304 100 0 0 0 \
                    70 30 5 6 20 0 3 0 12345 1000000 200 18446744073709551615";
        assert_eq!(
            parse_stat(stat),
            Some(CpuTicks {
                own: 100,
                children: 11
            })
        );
        assert_eq!(parse_stat("4242 (x) S 1 2"), None);
        assert_eq!(parse_stat("no name at all"), None);
        assert_eq!(ticks_to_duration(150), Duration::from_millis(1500));
    }

    #[test]
    fn own_times_are_readable_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(cpu_ticks(None).is_ok());
        }
    }
}
