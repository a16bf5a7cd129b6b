//! Counting panics anywhere in the process: in a campaign's own code, in a library it calls,
//! or in a task of a server it runs (a tokio task that panics is caught by its runtime, so
//! only a hook sees it).

use std::sync::Once;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

static PANICS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();
/// How many [`Contained`] scopes are open.
static CONTAINED: AtomicUsize = AtomicUsize::new(0);

/// While it lives, panics are expected to be contained by the code the campaign runs (redb
/// panics on some damaged files, and the claim store turns that into an error): the hook still
/// counts each and prints its location, but not its backtrace. Without it, one CI log held
/// 130 lines of backtrace per damaged file.
#[must_use = "the scope ends when the guard is dropped"]
#[derive(Debug)]
pub struct Contained(());

impl Contained {
    /// Opens a scope.
    pub fn open() -> Self {
        CONTAINED.fetch_add(1, Ordering::SeqCst);
        Self(())
    }
}

impl Drop for Contained {
    fn drop(&mut self) {
        CONTAINED.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Replaces the panic hook with one that counts panics and prints where each happened. It
/// prints the location only, never the payload: a payload may hold the input, and campaign
/// inputs hold secrets. Replay the case with `RUST_BACKTRACE=1` to see more.
pub fn install_hook() {
    INSTALL.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            let thread = std::thread::current();
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_else(|| "an unknown location".to_owned());
            let contained = CONTAINED.load(Ordering::SeqCst) > 0;
            eprintln!(
                "panic in thread {} at {location}{}",
                thread.name().unwrap_or("<unnamed>"),
                if contained {
                    " (where the code under test must contain it)"
                } else {
                    ""
                }
            );
            if !contained && std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
                eprintln!("{}", std::backtrace::Backtrace::force_capture());
            }
        }));
    });
}

/// How many panics happened since the hook was installed.
pub fn count() -> u64 {
    PANICS.load(Ordering::SeqCst)
}

/// Counts a `panics` violation of case `index` for every panic since the count was
/// `before`.
pub fn note(report: &mut crate::Report, index: u64, before: u64) {
    for _ in before..count() {
        report.violation("panics", index, "a panic (location printed above)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_counted() {
        install_hook();
        let before = count();
        let caught = std::panic::catch_unwind(|| panic!("boom"));
        assert!(caught.is_err());
        assert!(count() > before);
    }

    #[test]
    fn a_panic_in_a_contained_scope_is_still_counted() {
        install_hook();
        let before = count();
        {
            let _scope = Contained::open();
            let caught = std::panic::catch_unwind(|| panic!("boom"));
            assert!(caught.is_err());
        }
        assert!(count() > before);
        assert_eq!(CONTAINED.load(Ordering::SeqCst), 0, "the scope closed");
    }
}
