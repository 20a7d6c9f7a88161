//! Helpers for tests of this workspace (feature `testing`): bounded waits that
//! turn a hang into a failed test, and the resident memory of the process.
//! They live here once; the conformance suite, the core's own tests and
//! `test-support` (for every other test) use these very functions.
//!
//! Every bound is a deadlock guard, never a timing assertion: a correct
//! program ends far within it on any machine (sanitizers included).
//!
//! This module is for tests: it is not a stable API.
#![allow(clippy::panic)]

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

#[cfg(test)]
mod scripted;
#[cfg(test)]
pub(crate) use scripted::{Script, Scripted};

/// How long [`eventually`] and [`within`] wait before they call it a hang:
/// far beyond what any check needs (a few seconds under AddressSanitizer), so
/// that a busy machine cannot fail them.
pub const BOUND: Duration = Duration::from_secs(90);

/// Polls `condition` until it holds; fails the test (naming `what`) after
/// [`BOUND`].
pub fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {BOUND:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `f` on another thread and returns its result; fails the test (naming
/// `what`) if it has not returned after [`BOUND`], so that a deadlock fails
/// instead of hanging the test harness. A panic in `f` comes out of `within`.
pub fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(BOUND) {
        Ok(value) => value,
        Err(RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("{what}: the worker ended without a result"),
        },
        Err(RecvTimeoutError::Timeout) => {
            panic!("hung: {what} did not return within {BOUND:?} (a deadlock?)")
        }
    }
}

/// Resident memory of this process in bytes (Linux; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}
