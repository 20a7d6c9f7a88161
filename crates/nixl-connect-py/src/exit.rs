//! The interpreter's exit: once the package's `atexit` hook ran
//! ([`close`]), no thread but the one finalizing the interpreter takes the
//! GIL again through this module.
//!
//! CPython 3.11/3.12 end a thread that asks for the GIL while the
//! interpreter finalizes with `pthread_exit`, a forced unwind through
//! whatever Rust frames the thread is in (a crash); 3.14 hangs it. Two kinds
//! of threads would ask: the native log forwarder ([`crate::log`], which
//! checks [`closed`] before it attaches), and Python threads (daemon threads,
//! which finalization does not wait for) coming back from a call of ours
//! that released the GIL (a blocking `wait()`, a registration, a post).
//! Every such call goes through [`detach`] (clippy's `disallowed_methods`
//! refuses `Python::detach` elsewhere in this crate): a thread that comes
//! back after [`close`] parks for good instead, holding no lock of ours,
//! and the process exits without it. [`close`] waits, without the GIL, for
//! the threads that were already on their way back. The thread that ran the
//! hook, which finalizes the interpreter, is exempt: it tears down what is
//! left (operations, connectors) through these same calls. So an `atexit`
//! hook that runs after the package's (registered before it was imported)
//! must not wait for another thread that calls the package.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use pyo3::prelude::*;

/// Set by [`close`]: no thread but [`CLOSER`] takes the GIL back.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// The thread that ran [`close`]: the one that finalizes the interpreter.
static CLOSER: OnceLock<ThreadId> = OnceLock::new();
/// Threads between the end of a [`detach`]ed call and holding the GIL again:
/// with [`CLOSED`], a Dekker pair (`SeqCst` on both sides) by which either
/// the thread sees `CLOSED` or [`close`] sees it and waits.
static REATTACHING: AtomicUsize = AtomicUsize::new(0);

/// Whether [`close`] ran.
pub(crate) fn closed() -> bool {
    CLOSED.load(Ordering::SeqCst)
}

/// Runs `f` with the GIL released, as `Python::detach`, then takes the GIL
/// back, unless [`close`] ran and this is not the thread that ran it: then
/// the thread parks for good (see the module docs).
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    #[allow(
        clippy::disallowed_methods,
        reason = "the one sanctioned release of the GIL"
    )]
    let out = py.detach(move || {
        let out = f();
        REATTACHING.fetch_add(1, Ordering::SeqCst);
        if CLOSED.load(Ordering::SeqCst) && CLOSER.get() != Some(&std::thread::current().id()) {
            REATTACHING.fetch_sub(1, Ordering::SeqCst);
            park_for_good();
        }
        out
    });
    // With the GIL: `close` (without it) may now go on.
    REATTACHING.fetch_sub(1, Ordering::SeqCst);
    out
}

/// Never returns: the thread waits for the process to end.
fn park_for_good() -> ! {
    loop {
        std::thread::park();
    }
}

/// Marks the interpreter as about to finalize (from the `atexit` hook, with
/// the GIL): `before` runs first, without the GIL; then no thread but this
/// one takes the GIL back through [`detach`], and those already on their way
/// back are waited for, as is `attached` (the log forwarder's own check).
pub(crate) fn close(
    py: Python<'_>,
    before: impl Send + FnOnce(),
    attached: impl Send + Sync + Fn() -> bool,
) {
    #[allow(
        clippy::disallowed_methods,
        reason = "the closing thread may take the GIL back"
    )]
    py.detach(move || {
        before();
        let _ = CLOSER.set(std::thread::current().id());
        CLOSED.store(true, Ordering::SeqCst);
        // Threads that saw `CLOSED` false get the GIL (released here) and
        // let it go again; any later one sees it.
        while REATTACHING.load(Ordering::SeqCst) > 0 || attached() {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}
