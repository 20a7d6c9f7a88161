//! Memory that an operation may still write, by address ([`check`],
//! [`record`]), so that no other operation is lent it meanwhile.
//!
//! In Rust a buffer is owned: while an operation (or a cancelled transfer
//! draining after it) holds a descriptor, nothing else can describe its
//! memory. Python objects are described by address, as often as the caller
//! likes: a `Descriptor` made anew over an array that a cancelled READ is
//! still draining into (NIXL cannot abort a posted transfer) would be lent
//! to a second READ, which then reports done while the first one's bytes
//! keep landing. So every plain descriptor lent to an operation that writes
//! its memory (a READ into it, a writable) is recorded here until the
//! memory comes back or its buffer is freed, and a descriptor whose memory
//! overlaps a recorded range is not lent: the caller gets [`MemoryBusy`]
//! (the `nixl_connect` Connector's coroutines wait for the range to come
//! back, for a bounded time, then raise it).
//!
//! Only what is written is recorded: memory that operations only read may
//! be described and lent many times at once (one tensor exposed to several
//! peers). A pool's parts are not recorded: the core's allocator already
//! hands each range to one view at a time.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError, Weak};

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::operation::Loan;

create_exception!(
    _native,
    MemoryBusy,
    PyValueError,
    "The memory of a descriptor is still being written by an earlier operation \
     (one in progress, or a cancelled transfer the backend has not let go of)."
);

/// One lent range.
struct Entry {
    end: usize,
    /// The buffer's liveness: dead once the Rust descriptor over it was
    /// freed (nothing can write it through that descriptor any more).
    alive: Weak<()>,
    /// The operation holding it, once made: asked to hand the memory back
    /// when the range is wanted.
    loan: Weak<Loan>,
}

/// Lent ranges by start address (and the liveness pointer, which tells
/// descriptors over one address apart), with the longest length seen so
/// that an overlap search can stop.
struct Written {
    ranges: BTreeMap<(usize, usize), Entry>,
    longest: usize,
}

static WRITTEN: Mutex<Written> = Mutex::new(Written {
    ranges: BTreeMap::new(),
    longest: 0,
});

fn written() -> MutexGuard<'static, Written> {
    // Every change is one insert or remove: a poisoned map is consistent.
    WRITTEN.lock().unwrap_or_else(PoisonError::into_inner)
}

fn key(start: usize, alive: &Weak<()>) -> (usize, usize) {
    (start, alive.as_ptr() as usize)
}

/// The operation holding a live recorded range that overlaps
/// `start..start + len` (other than `mine`), if any; dead entries met on
/// the way are dropped.
fn overlapping(start: usize, len: usize, mine: &Weak<()>) -> Option<Option<Weak<Loan>>> {
    let end = start.saturating_add(len);
    let mut map = written();
    let from = start.saturating_sub(map.longest);
    let mut dead = Vec::new();
    let mut found = None;
    for (&k, entry) in map.ranges.range((from, 0)..(end, 0)) {
        if entry.alive.strong_count() == 0 {
            dead.push(k);
        } else if entry.end > start && !Weak::ptr_eq(&entry.alive, mine) {
            found = Some((entry.loan.strong_count() > 0).then(|| entry.loan.clone()));
            break;
        }
    }
    for k in dead {
        map.ranges.remove(&k);
    }
    found
}

/// `Err(MemoryBusy)` if an operation may still write memory overlapping
/// `start..start + len` (descriptor `index` of the call). An ended
/// operation that was not asked yet is asked to hand its memory back first
/// (no lock held meanwhile).
pub(crate) fn check(index: usize, start: usize, len: usize, mine: &Weak<()>) -> PyResult<()> {
    if len == 0 {
        return Ok(());
    }
    for attempt in 0..2 {
        match overlapping(start, len, mine) {
            None => return Ok(()),
            Some(Some(loan)) if attempt == 0 => {
                if let Some(loan) = loan.upgrade() {
                    loan.reclaim();
                }
            }
            Some(_) => break,
        }
    }
    Err(MemoryBusy::new_err(format!(
        "descriptor {index}: its memory ({len} bytes at {start:#x}) is still being written by an \
         earlier operation, in progress or cancelled and still draining (a backend cannot abort a \
         posted transfer); wait for that operation to end, or for its cancelled transfer to let \
         go, before describing the memory for another operation"
    )))
}

/// Records `start..start + len`, lent to an operation that writes it.
pub(crate) fn record(start: usize, len: usize, alive: &Weak<()>) {
    if len == 0 || alive.strong_count() == 0 {
        return;
    }
    let mut map = written();
    map.longest = map.longest.max(len);
    map.ranges.insert(
        key(start, alive),
        Entry {
            end: start.saturating_add(len),
            alive: alive.clone(),
            loan: Weak::new(),
        },
    );
}

/// Names the operation holding a recorded range.
pub(crate) fn attach(start: usize, alive: &Weak<()>, loan: &Weak<Loan>) {
    if let Some(entry) = written().ranges.get_mut(&key(start, alive)) {
        entry.loan = loan.clone();
    }
}

/// The memory came back from its operation: nothing writes it any more.
pub(crate) fn forget(start: usize, alive: &Weak<()>) {
    let removed = written().ranges.remove(&key(start, alive));
    // The entry's weak handles are dropped after the lock.
    drop(removed);
}
