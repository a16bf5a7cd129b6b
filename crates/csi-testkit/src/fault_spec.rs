//! Fault scripts written as text, for `csi-mock-plugin`'s `--fault`, `--delay`, `--hang` and
//! `--hold` flags and its control socket: a test in any language can script the mock without
//! Rust.
//!
//! ```text
//! --fault RPC=CODE[:after=N][:times=M][:volume=ID]     answer CODE
//! --delay RPC=DURATION[:after=N][:times=M][:volume=ID] wait, then serve normally
//! --hang  RPC[:after=N][:times=M][:volume=ID]          never answer
//! --hold  RPC[:after=N][:times=M][:volume=ID]          wait for `resume`, then serve normally
//! ```
//!
//! `RPC` is the rpc's name (`NodeUnpublishVolume`, any case); `CODE` a gRPC code name
//! (`UNAVAILABLE`, any case, `-` or `_`) or number (`14`); `DURATION` a whole number with `ms`,
//! `s` or `m`. The first `after` matching calls are served normally; then `times` calls get
//! the fault, or every call when `times` is left out. `volume` limits the fault to calls about
//! one volume.
//!
//! ```
//! use csi_proto::Rpc;
//! use csi_testkit::MockPlugin;
//! use csi_testkit::fault_spec::FaultSpec;
//!
//! let plugin = MockPlugin::builder().build().unwrap();
//! // NodeUnpublishVolume fails three times with UNAVAILABLE, then succeeds.
//! FaultSpec::parse_fault("NodeUnpublishVolume=UNAVAILABLE:times=3")
//!     .unwrap()
//!     .install(&plugin.faults());
//! assert_eq!(plugin.faults().pending(Rpc::NodeUnpublishVolume), 3);
//!
//! let err = FaultSpec::parse_fault("NodeUnpublishVolume=UNAVAILABLE:times=lots").unwrap_err();
//! assert!(err.to_string().contains("times"));
//! ```

use std::fmt;
use std::time::Duration;

use csi_proto::Rpc;
use tonic::Code;

use crate::faults::{FaultStep, Faults};

/// The largest `after` or `times`: scripted steps are kept one by one.
pub const MAX_COUNT: usize = 100_000;
/// The longest `--delay`.
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

/// What a [`FaultSpec`] does to a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Answer with this code (and a message saying the fault was injected).
    Fail(Code),
    /// Wait this long, then serve the call normally.
    Delay(Duration),
    /// Never answer.
    Hang,
    /// Wait until resumed ([`Faults::resume_held`], the control socket's `resume`), then
    /// serve the call normally.
    Hold,
}

/// One fault given as text; see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    /// The rpc it applies to.
    pub rpc: Rpc,
    /// What it does.
    pub kind: FaultKind,
    /// How many matching calls are served normally first.
    pub after: usize,
    /// How many calls get the fault; `None`: every call from then on.
    pub times: Option<usize>,
    /// Only calls about this volume, if set.
    pub volume: Option<String>,
}

/// Text that is not a fault spec; each variant names the part that is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultSpecError {
    /// The rpc name is not one of CSI's.
    #[error("unknown rpc {text:?} (an rpc name such as NodeUnpublishVolume)")]
    UnknownRpc {
        /// The text given.
        text: String,
    },
    /// The `=` and its value are missing.
    #[error("{spec:?} has no {what}: write {form}")]
    Missing {
        /// The whole spec.
        spec: String,
        /// What is missing, e.g. `code`.
        what: &'static str,
        /// The form expected.
        form: &'static str,
    },
    /// The code is not a gRPC error code.
    #[error("unknown gRPC code {text:?} (a name such as UNAVAILABLE, or a number 1 to 16)")]
    UnknownCode {
        /// The text given.
        text: String,
    },
    /// The duration is not a whole number with `ms`, `s` or `m`, or too long.
    #[error("duration {text:?} must be a whole number with ms, s or m, at most {limit:?}")]
    BadDuration {
        /// The text given.
        text: String,
        /// The longest delay allowed.
        limit: Duration,
    },
    /// An option (`after`, `times`, `volume`) is unknown or its value is not allowed.
    #[error("option {option:?} in {spec:?}: {problem}")]
    BadOption {
        /// The whole spec.
        spec: String,
        /// The option as given.
        option: String,
        /// What is wrong.
        problem: String,
    },
}

impl FaultSpec {
    /// Parses `RPC=CODE[:after=N][:times=M][:volume=ID]`.
    ///
    /// # Errors
    ///
    /// [`FaultSpecError`] naming the part that is wrong.
    pub fn parse_fault(text: &str) -> Result<Self, FaultSpecError> {
        const FORM: &str = "RPC=CODE[:after=N][:times=M][:volume=ID]";
        let (rpc, value, options) = split(text, "code", FORM)?;
        Self::build(text, rpc, FaultKind::Fail(parse_code(value)?), options)
    }

    /// Parses `RPC=DURATION[:after=N][:times=M][:volume=ID]`.
    ///
    /// # Errors
    ///
    /// [`FaultSpecError`] naming the part that is wrong.
    pub fn parse_delay(text: &str) -> Result<Self, FaultSpecError> {
        const FORM: &str = "RPC=DURATION[:after=N][:times=M][:volume=ID]";
        let (rpc, value, options) = split(text, "duration", FORM)?;
        Self::build(text, rpc, FaultKind::Delay(parse_duration(value)?), options)
    }

    /// Parses `RPC[:after=N][:times=M][:volume=ID]`.
    ///
    /// # Errors
    ///
    /// [`FaultSpecError`] naming the part that is wrong.
    pub fn parse_hang(text: &str) -> Result<Self, FaultSpecError> {
        let mut parts = text.split(':');
        let rpc = parts.next().unwrap_or_default();
        Self::build(text, rpc, FaultKind::Hang, parts.collect())
    }

    /// Parses `RPC[:after=N][:times=M][:volume=ID]`, a hold.
    ///
    /// # Errors
    ///
    /// [`FaultSpecError`] naming the part that is wrong.
    pub fn parse_hold(text: &str) -> Result<Self, FaultSpecError> {
        let mut parts = text.split(':');
        let rpc = parts.next().unwrap_or_default();
        Self::build(text, rpc, FaultKind::Hold, parts.collect())
    }

    fn build(
        spec: &str,
        rpc: &str,
        kind: FaultKind,
        options: Vec<&str>,
    ) -> Result<Self, FaultSpecError> {
        let mut fault = FaultSpec {
            rpc: parse_rpc(rpc)?,
            kind,
            after: 0,
            times: None,
            volume: None,
        };
        for option in options {
            let bad = |problem: String| FaultSpecError::BadOption {
                spec: spec.to_string(),
                option: option.to_string(),
                problem,
            };
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| bad("must be after=N, times=M or volume=ID".into()))?;
            match key {
                "after" => fault.after = parse_count(value).map_err(bad)?,
                "times" => fault.times = Some(parse_count(value).map_err(bad)?),
                "volume" if value.is_empty() || value.len() > 128 => {
                    return Err(bad("a volume id is 1 to 128 bytes".into()));
                }
                "volume" => fault.volume = Some(value.to_string()),
                _ => return Err(bad("unknown option; use after, times or volume".into())),
            }
        }
        Ok(fault)
    }

    /// Installs the fault as a script on `faults` (see [`Faults::on`]).
    pub fn install(&self, faults: &Faults) {
        let step = match &self.kind {
            FaultKind::Fail(code) => FaultStep::Fail {
                code: *code,
                message: format!(
                    "{}: fault injected by csi-mock-plugin ({self})",
                    self.rpc.name()
                ),
            },
            FaultKind::Delay(delay) => FaultStep::Delay(*delay),
            FaultKind::Hang => FaultStep::Hang,
            FaultKind::Hold => FaultStep::Hold,
        };
        let mut script = faults.on(self.rpc).pass_times(self.after);
        if let Some(volume) = &self.volume {
            script = script.for_volume(volume);
        }
        match self.times {
            Some(times) => {
                for _ in 0..times {
                    script = script.step(step.clone());
                }
            }
            None => script = script.forever(step),
        }
        script.install();
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rpc.name())?;
        match &self.kind {
            FaultKind::Fail(code) => write!(f, "={}", code_name(*code))?,
            FaultKind::Delay(delay) => write!(f, "={}ms", delay.as_millis())?,
            FaultKind::Hang | FaultKind::Hold => {}
        }
        if self.after > 0 {
            write!(f, ":after={}", self.after)?;
        }
        if let Some(times) = self.times {
            write!(f, ":times={times}")?;
        }
        if let Some(volume) = &self.volume {
            write!(f, ":volume={volume}")?;
        }
        Ok(())
    }
}

fn split<'t>(
    text: &'t str,
    what: &'static str,
    form: &'static str,
) -> Result<(&'t str, &'t str, Vec<&'t str>), FaultSpecError> {
    let mut parts = text.split(':');
    let head = parts.next().unwrap_or_default();
    let (rpc, value) = head
        .split_once('=')
        .ok_or_else(|| FaultSpecError::Missing {
            spec: text.to_string(),
            what,
            form,
        })?;
    Ok((rpc, value, parts.collect()))
}

fn parse_rpc(text: &str) -> Result<Rpc, FaultSpecError> {
    rpc_by_name(text).ok_or_else(|| FaultSpecError::UnknownRpc {
        text: text.to_string(),
    })
}

/// The rpc named `text` (`NodeUnpublishVolume`, any case, surrounding blanks ignored).
pub(crate) fn rpc_by_name(text: &str) -> Option<Rpc> {
    Rpc::ALL
        .iter()
        .copied()
        .find(|rpc| rpc.name().eq_ignore_ascii_case(text.trim()))
}

/// The canonical upper-case name of a gRPC code, as the CSI spec writes it.
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn parse_code(text: &str) -> Result<Code, FaultSpecError> {
    let name = text.trim().to_ascii_uppercase().replace('-', "_");
    // Every error code; OK is no fault.
    let mut codes = (1..=16).map(Code::from_i32);
    let found = match name.parse::<i32>() {
        Ok(number) => codes.find(|code| *code as i32 == number),
        Err(_) => codes.find(|code| code_name(*code) == name),
    };
    found.ok_or_else(|| FaultSpecError::UnknownCode {
        text: text.to_string(),
    })
}

fn parse_duration(text: &str) -> Result<Duration, FaultSpecError> {
    let bad = || FaultSpecError::BadDuration {
        text: text.to_string(),
        limit: MAX_DELAY,
    };
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let number: u64 = digits.parse().map_err(|_| bad())?;
    let delay = match &text[digits.len()..] {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.checked_mul(60).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    if delay > MAX_DELAY {
        return Err(bad());
    }
    Ok(delay)
}

fn parse_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n <= MAX_COUNT => Ok(n),
        Ok(n) => Err(format!("{n} is more than the limit {MAX_COUNT}")),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        let fault =
            FaultSpec::parse_fault("nodeunpublishvolume=unavailable:after=1:times=3").unwrap();
        assert_eq!(fault.rpc, Rpc::NodeUnpublishVolume);
        assert_eq!(fault.kind, FaultKind::Fail(Code::Unavailable));
        assert_eq!((fault.after, fault.times), (1, Some(3)));
        assert_eq!(
            fault.to_string(),
            "NodeUnpublishVolume=UNAVAILABLE:after=1:times=3"
        );
        let fault = FaultSpec::parse_fault("DeleteVolume=9:volume=vol-7").unwrap();
        assert_eq!(fault.kind, FaultKind::Fail(Code::FailedPrecondition));
        assert_eq!(fault.volume.as_deref(), Some("vol-7"));
        assert_eq!(fault.times, None);
        let delay = FaultSpec::parse_delay("CreateVolume=250ms:times=1").unwrap();
        assert_eq!(delay.kind, FaultKind::Delay(Duration::from_millis(250)));
        assert_eq!(
            FaultSpec::parse_delay("CreateVolume=2m").unwrap().kind,
            FaultKind::Delay(Duration::from_secs(120))
        );
        let hang = FaultSpec::parse_hang("NodeStageVolume:after=2").unwrap();
        assert_eq!((hang.kind, hang.after), (FaultKind::Hang, 2));
        let hold = FaultSpec::parse_hold("NodeStageVolume:times=1:volume=v3").unwrap();
        assert_eq!(
            (hold.kind, hold.times, hold.volume.as_deref()),
            (FaultKind::Hold, Some(1), Some("v3"))
        );
    }

    #[test]
    fn bad_specs_name_the_part_and_the_limit() {
        let cases: &[(Result<FaultSpec, FaultSpecError>, &str)] = &[
            (FaultSpec::parse_fault("Teleport=UNAVAILABLE"), "Teleport"),
            (FaultSpec::parse_fault("DeleteVolume"), "code"),
            (FaultSpec::parse_fault("DeleteVolume=OK"), "\"OK\""),
            (FaultSpec::parse_fault("DeleteVolume=0"), "\"0\""),
            (FaultSpec::parse_fault("DeleteVolume=17"), "\"17\""),
            (
                FaultSpec::parse_fault("DeleteVolume=INTERNAL:times=x"),
                "times",
            ),
            (
                FaultSpec::parse_fault("DeleteVolume=INTERNAL:times=100001"),
                "100000",
            ),
            (
                FaultSpec::parse_fault("DeleteVolume=INTERNAL:every=2"),
                "every",
            ),
            (
                FaultSpec::parse_fault("DeleteVolume=INTERNAL:volume="),
                "volume",
            ),
            (FaultSpec::parse_delay("DeleteVolume=5"), "\"5\""),
            (FaultSpec::parse_delay("DeleteVolume=2h"), "3600s"),
            (FaultSpec::parse_delay("DeleteVolume=61m"), "3600s"),
            (FaultSpec::parse_hang(""), "unknown rpc"),
            (FaultSpec::parse_hold("Freeze"), "unknown rpc"),
        ];
        for (result, needle) in cases {
            match result {
                Ok(spec) => panic!("{spec} should be refused"),
                Err(err) => assert!(err.to_string().contains(needle), "{err} lacks {needle}"),
            }
        }
    }
}
