//! The synchronisation primitives of the operation state machine, the
//! engine's notification hand-off and the remote-peer cache, swapped for
//! `loom`'s when the crate is built with `--cfg loom`, so that the model in
//! `operation/loom.rs` explores every interleaving of the real code (what
//! tokio does with its `crate::loom` module).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
