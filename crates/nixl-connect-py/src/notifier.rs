//! Completion into asyncio without polling and without the GIL.
//!
//! One [`Notifier`] per event loop owns an `eventfd` that the loop watches
//! (`loop.add_reader`). A waiting coroutine *arms* an operation: the
//! operation's completion future is polled once with a waker of ours, and kept
//! (with the asyncio future to resolve) until it fires. The core calls that
//! waker from whichever thread settled the operation (the progress engine,
//! the thread that delivered the event, or one that cancelled it), never under
//! one of its locks; the waker only pushes a token onto a queue and writes the
//! eventfd. It never takes the GIL, so no thread that completes a transfer can
//! block on Python, and a Python thread blocked in a wait (GIL released) or
//! running Python code (GIL held) cannot deadlock with it. The loop wakes on
//! the eventfd exactly as `call_soon_threadsafe` wakes it on its own pipe, and
//! `on_ready` (in the loop's thread, with the GIL) resolves the futures.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Wake, Waker};

use descriptor_core::Completion;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

use crate::operation::PyOperation;

/// What wakers share with the notifier: the eventfd and the tokens of the
/// operations that settled since the loop last looked.
struct Ready {
    fd: OwnedFd,
    tokens: Mutex<Vec<u64>>,
}

impl Ready {
    fn tokens(&self) -> MutexGuard<'_, Vec<u64>> {
        // Only pushes and takes: a poisoned queue is still a valid queue.
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: `fd` is an eventfd owned by `self`, open while `self` lives;
        // writing 8 bytes from a live u64 is the eventfd protocol. A failed
        // write (the counter is saturated) still leaves the fd readable, so
        // the loop wakes regardless.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&raw const one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    fn drain(&self) {
        let mut count: u64 = 0;
        // SAFETY: as in `signal`; the fd is non-blocking, so this returns at
        // once (EAGAIN) when nothing was signalled.
        let _ = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&raw mut count).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// The waker of one armed operation.
struct TokenWaker {
    token: u64,
    ready: Arc<Ready>,
}

impl Wake for TokenWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.tokens().push(self.token);
        self.ready.signal();
    }
}

/// Resolves asyncio futures when operations settle (one per event loop).
#[pyclass(frozen, module = "nixl_connect._native", name = "Notifier")]
pub(crate) struct Notifier {
    ready: Arc<Ready>,
    next: AtomicU64,
    /// Armed operations and the asyncio futures to resolve, by token. Only
    /// Python threads (with the GIL) touch it; no Python is called under it.
    armed: Mutex<HashMap<u64, (Completion, Py<PyAny>)>>,
}

impl Notifier {
    fn armed(&self) -> MutexGuard<'_, HashMap<u64, (Completion, Py<PyAny>)>> {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl Notifier {
    #[new]
    fn new() -> PyResult<Notifier> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(PyOSError::new_err(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Notifier {
            ready: Arc::new(Ready {
                fd,
                tokens: Mutex::new(Vec::new()),
            }),
            next: AtomicU64::new(1),
            armed: Mutex::new(HashMap::new()),
        })
    }

    /// The eventfd the event loop watches.
    fn fileno(&self) -> i32 {
        self.ready.fd.as_raw_fd()
    }

    /// Arms `operation`: `future.set_result(None)` runs in the loop once it
    /// settles. Returns the token (for `disarm`), or `None` if it already
    /// settled (or was handed back), in which case nothing is armed.
    fn arm(&self, operation: &PyOperation, future: Py<PyAny>) -> PyResult<Option<u64>> {
        crate::fork::check()?;
        let Some(op) = operation.shared() else {
            return Ok(None);
        };
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let waker = Waker::from(Arc::new(TokenWaker {
            token,
            ready: Arc::clone(&self.ready),
        }));
        // The completion borrows nothing of the operation: armed, it does not
        // keep the operation from handing its memory back.
        let mut completion = op.completion();
        drop(op);
        let polled = Pin::new(&mut completion).poll(&mut Context::from_waker(&waker));
        if polled.is_ready() {
            return Ok(None);
        }
        let replaced = self.armed().insert(token, (completion, future));
        drop(replaced);
        Ok(Some(token))
    }

    /// Forgets an armed operation (its waiter stopped waiting).
    fn disarm(&self, token: u64) {
        let removed = self.armed().remove(&token);
        drop(removed);
    }

    /// Called by the event loop when the eventfd is readable: resolves the
    /// futures of the operations that settled.
    fn on_ready(&self, py: Python<'_>) -> PyResult<()> {
        self.ready.drain();
        let tokens = std::mem::take(&mut *self.ready.tokens());
        if tokens.is_empty() {
            return Ok(());
        }
        let fired: Vec<(Completion, Py<PyAny>)> = {
            let mut armed = self.armed();
            tokens.iter().filter_map(|t| armed.remove(t)).collect()
        };
        let mut first_error = None;
        for (completion, future) in fired {
            drop(completion);
            let future = future.bind(py);
            let resolved = future.call_method0("done").and_then(|done| {
                if done.is_truthy()? {
                    Ok(())
                } else {
                    future.call_method1("set_result", (py.None(),)).map(drop)
                }
            });
            // Every future is resolved even if one refuses.
            if let Err(e) = resolved {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Number of armed operations (waits the loop will resolve);
    /// `wait_for_completion` spins first only when there are none.
    fn __len__(&self) -> usize {
        self.armed().len()
    }
}
