//! Resident memory of a process, from `/proc` (Linux).
//!
//! `/proc/<pid>/statm` counts pages, and the page size cannot be asked without `libc` (and
//! `unsafe`, which this workspace forbids), so the `VmRSS` line of `/proc/<pid>/status`, which
//! is in kB, is read instead: the same number, with its unit.

use std::path::PathBuf;

use crate::error::BenchError;

/// The resident set size of process `pid` (`None`: this process), in bytes.
///
/// # Errors
///
/// [`BenchError::Statm`] when the file cannot be read or has no parsable `VmRSS` line
/// (not Linux, or the process is gone).
pub fn rss_bytes(pid: Option<u32>) -> Result<u64, BenchError> {
    let path = match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}/status")),
        None => PathBuf::from("/proc/self/status"),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| BenchError::Statm {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    parse_vm_rss(&text).ok_or_else(|| BenchError::Statm {
        path,
        detail: "no `VmRSS: <n> kB` line".to_owned(),
    })
}

/// The `VmRSS` of a `/proc/<pid>/status` text, in bytes.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let kib: u64 = parts.next()?.parse().ok()?;
    (parts.next()? == "kB").then_some(kib.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_in_bytes() {
        let text = "Name:\tx\nVmPeak:\t  10 kB\nVmRSS:\t    2048 kB\nThreads: 3\n";
        assert_eq!(parse_vm_rss(text), Some(2048 * 1024));
        assert_eq!(parse_vm_rss("VmRSS: 12 MB\n"), None);
        assert_eq!(parse_vm_rss("VmRSS: lots kB\n"), None);
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }

    #[test]
    fn own_rss_is_positive_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(rss_bytes(None).is_ok_and(|b| b > 0));
        }
    }
}
