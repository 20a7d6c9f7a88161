//! The synchronisation primitives of the operation state machine and the
//! remote-peer cache, swapped for `loom`'s when the crate is built with
//! `--cfg loom`, so that the model in `operation/loom.rs` explores every
//! interleaving of the real code (what tokio does with its `crate::loom`
//! module).

#[cfg(all(loom, test))]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(all(not(loom), test))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU8, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
