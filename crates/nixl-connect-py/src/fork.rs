//! `fork()`: the child of a process that made a connector gets a clear error,
//! never a hang.
//!
//! A connector runs threads (the progress engine, NIXL's) and holds NIXL
//! agents with UCX workers; `fork()` copies none of the threads, and a lock
//! one of them held stays held in the child. A NIXL transfer started there
//! never ends (seen: a forked child's READ never completed). So once this
//! process made a connector, its forked children refuse every call that
//! would reach the core (`RuntimeError`), and the objects they inherited are
//! leaked when dropped instead of being torn down through the backend. A
//! child of a process that only imported the package works normally.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::PyResult;
use pyo3::exceptions::PyRuntimeError;

/// Set in the child of a `fork()` of a process that made a connector.
static FORKED: AtomicBool = AtomicBool::new(false);
static WATCHING: Once = Once::new();

extern "C" fn in_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Called when a connector is made: from now on, forked children refuse.
pub(crate) fn watch() {
    WATCHING.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic (which is
        // async-signal-safe, as a fork handler must be); no other argument.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        if rc != 0 {
            tracing::warn!(
                rc,
                "pthread_atfork failed: a fork()ed child will not be refused"
            );
        }
    });
}

/// Whether this process is a forked child of one that made a connector.
pub(crate) fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// `RuntimeError` in a forked child (see the module docs).
pub(crate) fn check() -> PyResult<()> {
    if forked() {
        return Err(PyRuntimeError::new_err(
            "nixl_connect cannot be used in a fork()ed child of a process that made a Connector: \
             its threads and NIXL's UCX workers do not survive fork(). Start workers with \
             multiprocessing's 'spawn' or 'forkserver' method, or make connectors only after the fork.",
        ));
    }
    Ok(())
}
