//! The library's `tracing` events into Python's `logging`, logger
//! `nixl_connect`, so that a worker's logging configuration captures them.
//!
//! Levels: ERROR 40, WARN 30, INFO 20, DEBUG 10, TRACE 5 (below DEBUG; name
//! it with `logging.addLevelName(5, "TRACE")` if wanted). An event is built
//! only if the logger is enabled for its level: the check is one atomic load
//! of the level last read from the logger (no GIL). That level is read again
//! (with the GIL, which those calls hold anyway) when a connector is made and
//! at most once a second when an operation starts, so a change of the
//! logging configuration counts from the next operation a second later.
//!
//! An enabled event is not handed to Python by the thread that emitted it:
//! that thread may be a transfer's, holding a lock of the core, and logging
//! handlers are user code. It is queued (at most [`QUEUE`] records; past
//! that, records are counted and the count is logged with the next one) and a
//! thread of this module takes the GIL and calls the logger.
//!
//! # At interpreter exit
//!
//! That thread is the only native thread of the package that enters the
//! interpreter (the asyncio wake-ups write an eventfd, without the GIL, and
//! every other native thread only drops Python references, which PyO3
//! defers to a thread holding the GIL). It must never do so once
//! finalization can have begun: `Python::try_attach` cannot tell (it checks
//! before `PyGILState_Ensure` takes the GIL, and finalization may begin in
//! between; see [`crate::exit`] for what CPython does then). So the
//! package's `atexit` hook calls [`close`]: it waits (without the GIL) for
//! the records queued so far to be delivered, marks the module closed, and
//! waits for the thread to leave the interpreter if it was entering it.
//! From then on the thread never attaches again: the records of the rest of
//! the exit (operations and connectors torn down while the interpreter
//! finalizes) are written to stderr by the thread that emits them, if the
//! logger had a handler that shows records (one that is not a
//! `NullHandler`), and are not built otherwise, as that configuration would
//! have dropped them.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Mutex, Once, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// Records waiting for the forwarding thread, at most.
const QUEUE: usize = 4096;
/// How often an operation's start reads the logger's level again, at most.
const REFRESH: Duration = Duration::from_secs(1);

/// The most verbose level the logger is enabled for: 0 none, 1 ERROR ...
/// 5 TRACE.
static ENABLED: AtomicU8 = AtomicU8::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static QUEUE_TX: OnceLock<SyncSender<Line>> = OnceLock::new();
static LOGGER: OnceLock<Py<PyAny>> = OnceLock::new();
static LAST_REFRESH: Mutex<Option<Instant>> = Mutex::new(None);
static INSTALL: Once = Once::new();
/// Whether the forwarding thread is attached to the interpreter, or about
/// to be: with [`crate::exit::closed`], a Dekker pair (`SeqCst` on both
/// sides) by which either the thread sees the module closed or [`close`]
/// sees it attaching and waits (no lock is held while the GIL is awaited).
static ATTACHING: AtomicBool = AtomicBool::new(false);
/// After [`close`]: records go to stderr rather than being dropped.
static TO_STDERR: AtomicBool = AtomicBool::new(false);
/// Records queued, and records the forwarding thread has handled.
static QUEUED: AtomicU64 = AtomicU64::new(0);
static HANDLED: AtomicU64 = AtomicU64::new(0);
/// How long [`close`] waits for the records queued before it to reach the
/// logger, at most (a logging handler that blocks must not stall the exit).
const CLOSE_WAIT: Duration = Duration::from_secs(1);

fn rank(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

/// Python's number for a `rank`.
fn python_level(rank: u8) -> u8 {
    match rank {
        1 => 40,
        2 => 30,
        3 => 20,
        4 => 10,
        _ => 5,
    }
}

/// One event, formatted.
struct Line {
    rank: u8,
    text: String,
}

/// Formats an event's fields: the message, then `name=value` for the rest.
struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let out = &mut *self.0;
        if field.name() == "message" {
            let _ = write!(out, "{value:?}");
        } else {
            if !out.is_empty() {
                out.push(' ');
            }
            let _ = write!(out, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            self.record_debug(field, &value);
        }
    }
}

/// The process-wide subscriber of the native module (this cdylib has its own
/// copy of `tracing`, so other extensions' subscribers are not affected).
struct ToPython;

impl Subscriber for ToPython {
    /// Asked again at every event: the logger's level changes.
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && rank(metadata.level()) <= ENABLED.load(Ordering::Relaxed)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let metadata = event.metadata();
        let mut text = String::new();
        event.record(&mut Fields(&mut text));
        let _ = write!(text, " [{}]", metadata.target());
        if crate::exit::closed() {
            // Written by this thread, in order (it holds no lock of the core:
            // a subscriber is never called under one).
            after_close(&Line {
                rank: rank(metadata.level()),
                text,
            });
            return;
        }
        let dropped = DROPPED.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = write!(
                text,
                " ({dropped} earlier records dropped: the queue was full)"
            );
        }
        let Some(queue) = QUEUE_TX.get() else {
            return;
        };
        let line = Line {
            rank: rank(metadata.level()),
            text,
        };
        match queue.try_send(line) {
            Ok(()) => {
                QUEUED.fetch_add(1, Ordering::Release);
            }
            Err(TrySendError::Full(_)) => {
                DROPPED.fetch_add(dropped + 1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Hands queued records to the logger, with the GIL, until [`close`]; after
/// it, to stderr or nowhere (see the module docs), never to Python.
fn forward(queue: Receiver<Line>) {
    while let Ok(line) = queue.recv() {
        ATTACHING.store(true, Ordering::SeqCst);
        #[allow(
            clippy::disallowed_methods,
            reason = "the one native thread that attaches, checked against `close` by ATTACHING"
        )]
        let line = if crate::exit::closed() {
            Some(line)
        } else {
            // `None`: the interpreter is not initialized (any more).
            Python::try_attach(|py| {
                if let Some(logger) = LOGGER.get() {
                    // A handler's exception is Python's to report, not ours.
                    if let Err(e) =
                        logger.call_method1(py, "log", (python_level(line.rank), &line.text))
                    {
                        e.print(py);
                    }
                }
            })
            .is_none()
            .then_some(line)
        };
        ATTACHING.store(false, Ordering::SeqCst);
        if let Some(line) = line {
            after_close(&line);
        }
        HANDLED.fetch_add(1, Ordering::Release);
    }
}

/// A record that can no longer reach Python: to stderr if the logger showed
/// records at [`close`], else dropped.
fn after_close(line: &Line) {
    if TO_STDERR.load(Ordering::Relaxed) {
        let level = match line.rank {
            1 => "ERROR",
            2 => "WARNING",
            3 => "INFO",
            4 => "DEBUG",
            _ => "TRACE",
        };
        // Nothing to do if stderr is closed.
        let _ = writeln!(
            std::io::stderr().lock(),
            "nixl_connect (at exit) {level}: {}",
            line.text
        );
    }
}

/// Stops the forwarding thread from entering the interpreter, for good:
/// called by the package's `atexit` hook, before finalization begins (see the
/// module docs). `to_stderr`: whether later records go to stderr (the logger
/// has a handler that shows them) or are dropped. Waits, without the GIL, for
/// the records queued so far to be delivered (at most [`CLOSE_WAIT`]), then
/// for the thread to leave the interpreter if it was entering it.
pub(crate) fn close(py: Python<'_>, to_stderr: bool) {
    // Without the GIL: the thread may be waiting for it. Waiting for it to
    // leave the interpreter has no bound (as a handler that blocks would
    // block any logging call): given up early, finalization could begin
    // while it is attached.
    let deliver_queued = move || {
        let queued = QUEUED.load(Ordering::Acquire);
        let started = Instant::now();
        while HANDLED.load(Ordering::Acquire) < queued && started.elapsed() < CLOSE_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
        TO_STDERR.store(to_stderr, Ordering::Relaxed);
    };
    // The thread attaching now saw the module open: it gets the GIL
    // (released by `close`), delivers its record and detaches. Any later
    // one sees it closed.
    crate::exit::close(py, deliver_queued, || ATTACHING.load(Ordering::SeqCst));
    if !to_stderr {
        // Dropped anyway: not even built from now on.
        ENABLED.store(0, Ordering::Relaxed);
    }
}

/// The package's `atexit` hook's half in the native module: see [`close`].
#[pyfunction]
#[pyo3(name = "close_at_exit")]
pub(crate) fn close_at_exit(py: Python<'_>, to_stderr: bool) {
    close(py, to_stderr);
}

/// Installs the subscriber and reads the logger's level (once per process;
/// later calls only read the level again).
pub(crate) fn install(py: Python<'_>) -> PyResult<()> {
    if LOGGER.get().is_none() {
        let logger = py
            .import("logging")?
            .call_method1("getLogger", ("nixl_connect",))?;
        let _ = LOGGER.set(logger.unbind());
    }
    let mut result = Ok(());
    INSTALL.call_once(|| {
        let (tx, rx) = sync_channel(QUEUE);
        let _ = QUEUE_TX.set(tx);
        result = std::thread::Builder::new()
            .name("nixl_connect-log".into())
            .spawn(move || forward(rx))
            .map(drop)
            .map_err(|e| {
                pyo3::exceptions::PyRuntimeError::new_err(format!("start the log thread: {e}"))
            });
        if result.is_ok() && tracing::subscriber::set_global_default(ToPython).is_err() {
            result = Err(pyo3::exceptions::PyRuntimeError::new_err(
                "a tracing subscriber is already installed in the native module",
            ));
        }
    });
    result?;
    refresh(py)
}

/// Reads the logger's level now.
pub(crate) fn refresh(py: Python<'_>) -> PyResult<()> {
    let Some(logger) = LOGGER.get() else {
        return Ok(());
    };
    if crate::exit::closed() && !TO_STDERR.load(Ordering::Relaxed) {
        // Records would be dropped: keep building none.
        return Ok(());
    }
    let logger = logger.bind(py);
    let mut enabled = 0;
    for rank in (1..=5).rev() {
        if logger
            .call_method1("isEnabledFor", (python_level(rank),))?
            .is_truthy()?
        {
            enabled = rank;
            break;
        }
    }
    ENABLED.store(enabled, Ordering::Relaxed);
    *LAST_REFRESH.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    Ok(())
}

/// Reads the logger's level again if the last read is over [`REFRESH`] old.
pub(crate) fn refresh_if_stale(py: Python<'_>) {
    let stale = LAST_REFRESH
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_none_or(|at| at.elapsed() >= REFRESH);
    if stale && let Err(e) = refresh(py) {
        e.print(py);
    }
}
