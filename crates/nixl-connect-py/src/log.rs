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

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
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
        if let Err(TrySendError::Full(_)) = queue.try_send(line) {
            DROPPED.fetch_add(dropped + 1, Ordering::Relaxed);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Hands queued records to the logger, with the GIL, until the interpreter
/// shuts down.
fn forward(queue: Receiver<Line>) {
    while let Ok(line) = queue.recv() {
        let delivered = Python::try_attach(|py| {
            if let Some(logger) = LOGGER.get() {
                // A handler's exception is Python's to report, not ours.
                if let Err(e) = logger.call_method1(py, "log", (python_level(line.rank), line.text))
                {
                    e.print(py);
                }
            }
        });
        if delivered.is_none() {
            return;
        }
    }
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
