//! The process's exit: no NIXL agent is destroyed while, or after, the
//! process runs its exit handlers ([`Guard`]).
//!
//! A connector's agents usually go on the thread that drops the connector.
//! Not always: when the last reference goes inside the watcher's event hook
//! (a cancelled READ that drained, the last operation of a connector the
//! program already dropped), the watcher thread destroys the agents once it
//! stops, and nothing waits for it. If the process exits meanwhile (a
//! Python program's last objects torn down by finalization, a Rust `main`
//! returning), `exit()` runs UCX's library destructors while that thread is
//! inside `ucp_worker_destroy`: `SIGSEGV` in `ucs_async_context_cleanup`.
//! So the first agent registers an `atexit` handler ([`watch`]; it runs
//! before the destructors of the NIXL and UCX libraries loaded before it)
//! that marks the process as exiting and waits, a bounded time, for the
//! destructions already under way; one that would begin later leaks the
//! agent instead (the process is ending: the kernel takes it all back).

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Set by the `atexit` handler: no agent is destroyed from now on.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Destructions under way: with [`EXITING`], a Dekker pair (`SeqCst` on both
/// sides) by which either the destroying thread sees `EXITING`, or the
/// handler sees it and waits.
static DESTROYING: AtomicUsize = AtomicUsize::new(0);
static WATCHING: Once = Once::new();

/// How long the handler waits for destructions under way: an agent's
/// destruction joins its progress thread and closes its endpoints (a few
/// milliseconds); a stuck one must not hold the exit for good.
const WAIT: Duration = Duration::from_secs(5);

extern "C" fn on_exit() {
    EXITING.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while DESTROYING.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Called as agents are made (after the runtime was loaded): from then on,
/// the process's exit waits for destructions under way and stops new ones.
pub(crate) fn watch() {
    WATCHING.call_once(|| {
        // SAFETY: registers a handler that takes no argument, touches only
        // atomics and sleeps, and never calls back into `exit`.
        let rc = unsafe { libc::atexit(on_exit) };
        if rc != 0 {
            tracing::warn!(
                rc,
                "atexit failed: an agent destroyed while the process exits may crash it"
            );
        }
    });
}

/// Held while agents are destroyed: [`Guard::enter`] says whether they may be.
pub(crate) struct Guard(bool);

impl Guard {
    /// `None` once the process is exiting: the caller leaks what it would
    /// have destroyed. Otherwise the exit waits until the guard is dropped.
    pub(crate) fn enter() -> Option<Guard> {
        DESTROYING.fetch_add(1, Ordering::SeqCst);
        if EXITING.load(Ordering::SeqCst) {
            DESTROYING.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Guard(true))
    }

    /// A guard that guards nothing (dropped without a destruction).
    pub(crate) const fn idle() -> Guard {
        Guard(false)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0 {
            DESTROYING.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
