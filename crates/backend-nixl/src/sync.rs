//! Locking that a panic elsewhere does not stop.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, poisoned or not: a thread that panicked holding one of the
/// backend's locks does not make every later call (its drop included)
/// panic too.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
