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

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::buffer::MemoryBuffer;

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

/// Host memory that records, when it is freed, what `seen` counts then
/// (in the tests: the deregistrations the backend was asked for), plus one,
/// in the counter [`WatchedMemory::new`] returns: 0 while it lives. Checks
/// that memory is freed only after its registration ended, and never where
/// it must leak.
pub struct WatchedMemory {
    bytes: Vec<u8>,
    seen: Box<dyn Fn() -> usize + Send + Sync>,
    freed_after: Arc<AtomicUsize>,
}

impl WatchedMemory {
    /// `len` bytes of `fill`, and the counter its drop sets.
    pub fn new(
        len: usize,
        fill: u8,
        seen: impl Fn() -> usize + Send + Sync + 'static,
    ) -> (WatchedMemory, Arc<AtomicUsize>) {
        let freed_after = Arc::new(AtomicUsize::new(0));
        let memory = WatchedMemory {
            bytes: vec![fill; len],
            seen: Box::new(seen),
            freed_after: Arc::clone(&freed_after),
        };
        (memory, freed_after)
    }
}

// SAFETY: as for `Vec<u8>`: the bytes live in the Vec's heap block, which
// moves of the value do not move, and are released only when it is dropped.
unsafe impl MemoryBuffer for WatchedMemory {
    fn base_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn is_writable(&self) -> bool {
        true
    }
}

impl Drop for WatchedMemory {
    fn drop(&mut self) {
        self.freed_after.store((self.seen)() + 1, Ordering::SeqCst);
    }
}

/// The value of the sample `name` whose labels are exactly `labels` (in any
/// order) in Prometheus / OpenMetrics text such as
/// `metrics::Metrics::encode_text` writes; `None` if there is no such
/// sample. For a histogram, name its `_count`, `_sum` or `_bucket` sample
/// (with its `le` label).
pub fn openmetrics_sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut wanted: Vec<(&str, &str)> = labels.to_vec();
    wanted.sort_unstable();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, found) = match series.split_once('{') {
                Some((metric, rest)) => (metric, parse_labels(rest.strip_suffix('}')?)?),
                None => (series, Vec::new()),
            };
            (metric == name && found == wanted)
                .then(|| value.parse().ok())
                .flatten()
        })
}

/// `a="x",b="y"`, sorted by name; values hold no quotes here (the metrics'
/// label values are fixed words).
fn parse_labels(text: &str) -> Option<Vec<(&str, &str)>> {
    let mut labels = Vec::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=')?;
        labels.push((key, value.strip_prefix('"')?.strip_suffix('"')?));
    }
    labels.sort_unstable();
    Some(labels)
}
