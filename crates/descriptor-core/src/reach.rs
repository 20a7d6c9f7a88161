//! Memory of this process that a transfer posted in this process may still
//! reach through a peer agent: kept, never freed, until that transfer is let
//! go ([`Ticket`], [`keep_while_reached`]).
//!
//! A passive operation hands its memory back once its exposure ends and, on
//! a backend that cannot cut a peer off, once its peer notified completion
//! (or its quarantine window is over). That is sound against the peer the
//! exposure was made for; it is not against another transfer that still
//! reads the same memory: a second READ of a readable that already
//! completed, or a READ still in flight when its readable is dropped over a
//! full quarantine. Over UCX's TCP transport the exposing agent's own UCX
//! thread serves such a READ by copying from the address (no registration is
//! checked), so a READ of memory that was freed and unmapped ends the process
//! with `SIGSEGV` in `ucp_get_req_handler`. When the reading agent lives in
//! this process (two connectors, as tests and single-process pipelines
//! have), nothing but plain safe calls leads there.
//!
//! So every transfer posted to a peer on a backend whose revocation is not
//! enforced holds a [`Ticket`] on the peer's ranges (addresses in the peer's
//! address space, which is this one's when the peer lives here) until the
//! backend lets go of it; a region whose memory overlaps a live ticket is
//! not freed when its last view goes ([`keep_while_reached`]) but kept until
//! the last overlapping ticket ends. A peer in another process names
//! addresses that mean nothing here: an overlap with local memory only
//! delays that memory's free until the transfer ends. A transfer the backend
//! lost (its memory leaked) keeps its ticket for good, and with it what it
//! overlaps. Peers in other processes are the quarantine's concern
//! (decision record 0014).

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::backend::Segment;

/// Ranges reached by live tickets, and what waits for them to end.
struct Reached {
    /// `(start, end, ticket)`, one per remote segment of a live ticket.
    spans: Vec<(usize, usize, u64)>,
    next: u64,
    /// Values kept while their range `(start, end)` overlaps a span.
    kept: Vec<(usize, usize, Box<dyn Any + Send>)>,
}

static REACHED: Mutex<Reached> = Mutex::new(Reached {
    spans: Vec::new(),
    next: 0,
    kept: Vec::new(),
});

/// Live tickets: every free checks this first, without the lock.
static LIVE: AtomicUsize = AtomicUsize::new(0);

fn reached() -> MutexGuard<'static, Reached> {
    // Every change is a push or a retain: a poisoned list is consistent.
    REACHED.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Reached {
    /// Whether a span overlaps `start..end`; an empty range counts as its
    /// first byte (a zero-length segment is still named by a transfer).
    /// Remote addresses come from a peer's metadata: nothing here overflows.
    fn overlaps(&self, start: usize, end: usize) -> bool {
        let end = end.max(start.saturating_add(1));
        self.spans
            .iter()
            .any(|&(s, e, _)| s < end && start < e.max(s.saturating_add(1)))
    }
}

/// A transfer's claim on the peer ranges it may still read or write; ends
/// (freeing what waited only for it) when dropped.
#[derive(Debug)]
pub(crate) struct Ticket(u64);

impl Ticket {
    /// Claims `remote` (a peer's segments) for a transfer about to be posted.
    pub(crate) fn claim(remote: &[Segment]) -> Ticket {
        let mut reached = reached();
        let id = reached.next;
        reached.next += 1;
        for s in remote {
            reached
                .spans
                .push((s.addr, s.addr.saturating_add(s.len), id));
        }
        LIVE.fetch_add(1, Ordering::SeqCst);
        Ticket(id)
    }

    /// The transfer may touch the ranges for good (the backend lost it):
    /// the claim is never given up.
    pub(crate) fn keep_for_good(self) {
        std::mem::forget(self);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let freed: Vec<Box<dyn Any + Send>> = {
            let mut reached = reached();
            reached.spans.retain(|&(_, _, id)| id != self.0);
            LIVE.fetch_sub(1, Ordering::SeqCst);
            let kept = std::mem::take(&mut reached.kept);
            let (still, free): (Vec<_>, Vec<_>) = kept
                .into_iter()
                .partition(|&(start, end, _)| reached.overlaps(start, end));
            reached.kept = still;
            free.into_iter().map(|(_, _, value)| value).collect()
        };
        // Dropped after the lock: a region's drop deregisters through its
        // backend.
        drop(freed);
    }
}

/// Keeps `value` (what keeps `start..start + len` allocated) until no live
/// ticket overlaps the range, if one does now: `None`. `Some(value)` back if
/// nothing reaches the range, to be dropped by the caller.
pub(crate) fn keep_while_reached<T: Any + Send>(start: usize, len: usize, value: T) -> Option<T> {
    if LIVE.load(Ordering::SeqCst) == 0 {
        return Some(value);
    }
    let end = start.saturating_add(len);
    let mut reached = reached();
    if !reached.overlaps(start, end) {
        return Some(value);
    }
    tracing::debug!(
        bytes = len,
        "memory still reached by a transfer of this process: kept until it ends"
    );
    reached.kept.push((start, end, Box::new(value)));
    None
}

/// Whether a live ticket overlaps `start..start + len`.
pub(crate) fn is_reached(start: usize, len: usize) -> bool {
    LIVE.load(Ordering::SeqCst) != 0 && reached().overlaps(start, start.saturating_add(len))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::Device;

    fn segment(addr: usize, len: usize) -> Segment {
        Segment {
            addr,
            len,
            device: Device::HOST,
        }
    }

    // One test: the registry is process-wide, and tests run in parallel.
    #[test]
    fn memory_reached_by_a_live_ticket_is_kept_until_the_last_overlapping_ticket_ends() {
        let base = 0x7000_0000_0000_usize;
        let first = Ticket::claim(&[segment(base, 4096)]);
        let second = Ticket::claim(&[segment(base + 2048, 4096)]);
        let kept = Arc::new(());
        assert!(keep_while_reached(base + 3000, 16, Arc::clone(&kept)).is_none());
        assert!(is_reached(base + 5000, 8));
        assert!(
            keep_while_reached(base + 8192, 16, ()).is_some(),
            "no overlap: freed now"
        );
        drop(first);
        assert_eq!(
            Arc::strong_count(&kept),
            2,
            "the second ticket still overlaps"
        );
        drop(second);
        assert_eq!(
            Arc::strong_count(&kept),
            1,
            "freed with the last overlapping ticket"
        );
        assert!(!is_reached(base, 8192));
        // A peer's metadata may name any address: the last one does not overflow.
        let edge = Ticket::claim(&[segment(usize::MAX - 1, 0), segment(usize::MAX, usize::MAX)]);
        assert!(is_reached(usize::MAX - 1, 0));
        let _ = is_reached(usize::MAX, usize::MAX);
        drop(edge);
    }
}
