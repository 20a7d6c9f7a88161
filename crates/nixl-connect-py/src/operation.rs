//! The native operation: one of the core's four operations, the Python
//! descriptors it borrowed, and the hand-back of their memory when it ends.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use descriptor_core::{
    Completion, Descriptor, Error, OperationStatus, RdmaMetadata, ReadOperation, ReadableOperation,
    SerializedDescriptor, WritableOperation, WriteOperation,
};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError};
use pyo3::prelude::*;

use crate::descriptor::PyDescriptor;
use crate::error::to_py;
use crate::fork;
use crate::metadata::PyMetadata;

/// Longest stretch a blocking `wait` spends without the GIL before it checks
/// for signals (Ctrl-C), so a blocked thread can still be interrupted.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// One of the four operations of the core.
pub(crate) enum AnyOp {
    Readable(ReadableOperation),
    Writable(WritableOperation),
    Read(ReadOperation),
    Write(WriteOperation),
}

macro_rules! each {
    ($value:expr, $op:ident => $body:expr) => {
        match $value {
            AnyOp::Readable($op) => $body,
            AnyOp::Writable($op) => $body,
            AnyOp::Read($op) => $body,
            AnyOp::Write($op) => $body,
        }
    };
}

impl AnyOp {
    pub(crate) fn status(&self) -> OperationStatus {
        each!(self, op => op.status())
    }

    pub(crate) fn wait_timeout(&self, timeout: Duration) -> descriptor_core::Result<()> {
        each!(self, op => op.wait_timeout(timeout))
    }

    pub(crate) fn cancel(&self) {
        each!(self, op => op.cancel())
    }

    /// Whether this is an active operation (a READ or WRITE of this side).
    fn is_active(&self) -> bool {
        matches!(self, AnyOp::Read(_) | AnyOp::Write(_))
    }

    pub(crate) fn completion(&self) -> Completion {
        each!(self, op => op.completion())
    }

    fn metadata(&self) -> Option<&RdmaMetadata> {
        match self {
            AnyOp::Readable(op) => Some(op.metadata()),
            AnyOp::Writable(op) => Some(op.metadata()),
            AnyOp::Read(_) | AnyOp::Write(_) => None,
        }
    }

    #[allow(clippy::result_large_err)]
    fn into_descriptors(self) -> Result<Vec<Descriptor>, AnyOp> {
        match self {
            AnyOp::Readable(op) => op.into_descriptors().map_err(AnyOp::Readable),
            AnyOp::Writable(op) => op.into_descriptors().map_err(AnyOp::Writable),
            AnyOp::Read(op) => op.into_descriptors().map_err(AnyOp::Read),
            AnyOp::Write(op) => op.into_descriptors().map_err(AnyOp::Write),
        }
    }
}

/// How an ended operation ended, for Python.
enum Ended {
    Complete,
    Cancelled,
    Failed(String),
}

/// Marks that the operation was handed back (its status is then kept here).
const NO_STATUS: u8 = u8::MAX;

/// What an operation borrowed from its Python descriptors, and how it hands
/// the memory back. The descriptors point here (weakly) while lent, so that a
/// descriptor asked for again hands itself back as soon as the operation can,
/// however its end was learned (a wait, `status`, a closed event loop's wait
/// that never resumed, or no look at all after a cancelled transfer drained).
pub(crate) struct Loan {
    /// The core operation, shared with blocking waits while they wait;
    /// `None` once it ended and gave its descriptors back.
    op: Mutex<Option<Arc<AnyOp>>>,
    /// The final status once `op` is gone.
    final_status: AtomicU8,
    /// The Python descriptors, in order, that receive the memory back.
    descriptors: Vec<Py<PyDescriptor>>,
    error: Mutex<Option<String>>,
}

impl Loan {
    fn lock(&self) -> MutexGuard<'_, Option<Arc<AnyOp>>> {
        // Only ever `take`/`replace`d: a poisoned lock still holds a valid value.
        self.op.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands the memory back to the Python descriptors once the operation
    /// ended and the backend let go of it. Does nothing while the backend
    /// still holds it, or while a blocking wait of another thread shares the
    /// operation (that wait, or the next look at a descriptor, reclaims).
    /// The lock is held only to take the operation out or put it back: the
    /// calls into the core (which may call the backend) run outside it.
    pub(crate) fn reclaim(&self) {
        let Some(op) = self.lock().clone() else {
            return;
        };
        let status = op.status();
        if !status.is_terminal() {
            return;
        }
        if let Err(Error::TransferFailed { source }) = op.wait_timeout(Duration::ZERO) {
            *self.error.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(with_sources(&*source));
        }
        drop(op);
        let op = {
            let mut slot = self.lock();
            let Some(op) = slot.take() else {
                return;
            };
            match Arc::try_unwrap(op) {
                // Terminal for good: readers see this status while it is out.
                Ok(op) => {
                    self.final_status.store(status as u8, Ordering::Release);
                    op
                }
                Err(shared) => {
                    *slot = Some(shared);
                    return;
                }
            }
        };
        match op.into_descriptors() {
            Ok(descriptors) => {
                for (python, descriptor) in self.descriptors.iter().zip(descriptors) {
                    python.get().give_back(descriptor);
                }
            }
            // The backend still holds the memory (a draining transfer, or a
            // cancelled NIXL passive operation, which never gives it back).
            Err(op) => *self.lock() = Some(Arc::new(op)),
        }
    }
}

/// A native operation (`nixl_connect`'s four operation classes wrap it).
#[pyclass(frozen, module = "nixl_connect._native", name = "Operation")]
pub(crate) struct PyOperation {
    loan: Arc<Loan>,
    /// A passive operation's metadata as exposed.
    exposed: Option<Arc<RdmaMetadata>>,
    /// The exposed metadata with the sizes its descriptors were lowered to
    /// since (Dynamo's `_data_size`), and those sizes.
    narrowed: Mutex<Option<(Vec<u64>, Arc<RdmaMetadata>)>>,
    /// A READ or WRITE of files (no peer to blame when it fails).
    storage: bool,
}

impl PyOperation {
    pub(crate) fn new(op: AnyOp, descriptors: Vec<Py<PyDescriptor>>) -> PyOperation {
        PyOperation::with(op, descriptors, false)
    }

    /// A READ or WRITE of files.
    pub(crate) fn storage(op: AnyOp, descriptors: Vec<Py<PyDescriptor>>) -> PyOperation {
        PyOperation::with(op, descriptors, true)
    }

    fn with(op: AnyOp, descriptors: Vec<Py<PyDescriptor>>, storage: bool) -> PyOperation {
        let exposed = op.metadata().map(|m| Arc::new(m.clone()));
        let loan = Arc::new(Loan {
            op: Mutex::new(Some(Arc::new(op))),
            final_status: AtomicU8::new(NO_STATUS),
            descriptors,
            error: Mutex::new(None),
        });
        for descriptor in &loan.descriptors {
            descriptor.get().lent_to(Arc::downgrade(&loan));
        }
        PyOperation {
            loan,
            exposed,
            narrowed: Mutex::new(None),
            storage,
        }
    }

    /// Whether the descriptors' sizes are still those exposed (what a
    /// passive operation publishes then is its exposed metadata).
    fn as_exposed(&self) -> bool {
        let Some(exposed) = &self.exposed else {
            return true;
        };
        let published = exposed.descriptors();
        published.len() != self.loan.descriptors.len()
            || published
                .iter()
                .zip(&self.loan.descriptors)
                .all(|(p, d)| p.size == d.get().transfer_size() as u64)
    }

    /// What a passive operation publishes now (`None` for an active one):
    /// the exposed metadata, or, once its descriptors' sizes were lowered
    /// (Dynamo's pooled senders set `_data_size` on a live readable and ask
    /// for its metadata again), the same exposure and key with those sizes:
    /// the peer moves a prefix of each exposed range. `RuntimeError` if a
    /// size grew past what is exposed (a live operation cannot expose more).
    fn published(&self) -> PyResult<Option<Arc<RdmaMetadata>>> {
        let Some(exposed) = &self.exposed else {
            return Ok(None);
        };
        if self.as_exposed() {
            return Ok(Some(exposed.clone()));
        }
        let published = exposed.descriptors();
        let sizes: Vec<u64> = self
            .loan
            .descriptors
            .iter()
            .map(|d| d.get().transfer_size() as u64)
            .collect();
        if let Some((index, (n, d))) = sizes
            .iter()
            .zip(published)
            .enumerate()
            .find(|(_, (n, d))| **n > d.size)
        {
            return Err(PyRuntimeError::new_err(format!(
                "descriptor {index} is {n} bytes now, but this operation exposes {} of it: a live \
                 operation cannot expose more (re-arm it once it completed, or make a new one)",
                d.size
            )));
        }
        let mut narrowed = self.narrowed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((cached, published)) = &*narrowed
            && *cached == sizes
        {
            return Ok(Some(published.clone()));
        }
        let descriptors = published
            .iter()
            .zip(&sizes)
            .map(|(d, &size)| SerializedDescriptor { size, ..*d })
            .collect();
        let metadata = RdmaMetadata::new(
            exposed.operation_kind(),
            descriptors,
            exposed.agent_metadata().to_vec(),
            exposed.notification_key().to_owned(),
        )
        .map_err(to_py)?;
        let made = Arc::new(metadata);
        *narrowed = Some((sizes, made.clone()));
        Ok(Some(made))
    }

    /// The core operation, while it has not been handed back.
    pub(crate) fn shared(&self) -> Option<Arc<AnyOp>> {
        self.loan.lock().clone()
    }

    fn reclaim(&self) {
        self.loan.reclaim();
    }

    /// How the operation ended, without blocking; `None` while it has not
    /// settled (outcome decided and the backend asked to let go).
    fn ended(&self) -> Option<Ended> {
        let op = self.shared();
        let Some(op) = op else {
            let error = self
                .loan
                .error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            return Some(match self.loan.final_status.load(Ordering::Acquire) {
                s if s == OperationStatus::Complete as u8 => Ended::Complete,
                s if s == OperationStatus::Errored as u8 => {
                    Ended::Failed(error.unwrap_or_default())
                }
                _ => Ended::Cancelled,
            });
        };
        match op.wait_timeout(Duration::ZERO) {
            Ok(()) => Some(Ended::Complete),
            Err(Error::Cancelled) => Some(Ended::Cancelled),
            Err(Error::TransferFailed { source }) => Some(Ended::Failed(with_sources(&*source))),
            Err(_) => None,
        }
    }

    fn outcome(&self, ended: Ended) -> PyResult<u8> {
        self.reclaim();
        match ended {
            Ended::Complete => Ok(OperationStatus::Complete as u8),
            Ended::Cancelled => Ok(OperationStatus::Cancelled as u8),
            // Dynamo's wording for a peer; a file has no remote agent.
            Ended::Failed(reason) if self.storage => Err(PyRuntimeError::new_err(format!(
                "NIXL transfer operation ERRORED: {reason}."
            ))),
            Ended::Failed(reason) => Err(PyRuntimeError::new_err(format!(
                "NIXL transfer operation ERRORED: {reason}. The remote agent may have disconnected or its memory may be invalid."
            ))),
        }
    }
}

impl Drop for PyOperation {
    fn drop(&mut self) {
        // As dropping a Rust operation: an unfinished one is cancelled. Its
        // memory goes back to the Python descriptors (still registered) if
        // the backend already let go of it; otherwise the core frees it once
        // the backend does (or leaks it if a peer may still write), and the
        // Python descriptor describes the memory afresh on its next use.
        // A forked child leaks it instead (see `fork`).
        if fork::forked() {
            std::mem::forget(self.loan.lock().take());
            return;
        }
        if let Some(op) = self.shared() {
            op.cancel();
        }
        self.reclaim();
    }
}

#[pymethods]
impl PyOperation {
    /// The status, as `OperationStatus`'s integer; never blocks. A terminal
    /// status hands the memory back if the backend let go of it (callers that
    /// poll `status`, as Dynamo's do, reuse their descriptors at once).
    fn status(&self) -> PyResult<u8> {
        fork::check()?;
        let Some(op) = self.shared() else {
            return Ok(self.loan.final_status.load(Ordering::Acquire));
        };
        let status = op.status();
        drop(op);
        if status.is_terminal() {
            self.reclaim();
        }
        Ok(status as u8)
    }

    /// Cancels the operation unless it already ended.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        fork::check()?;
        if let Some(op) = self.shared() {
            crate::exit::detach(py, || op.cancel());
        }
        self.reclaim();
        Ok(())
    }

    /// Whether the operation settled (a wait would return at once).
    fn settled(&self) -> PyResult<bool> {
        fork::check()?;
        Ok(self.ended().is_some())
    }

    /// Ends a wait that saw the operation settle: gives the memory back and
    /// returns the final status, or raises `RuntimeError` if it failed.
    /// Returns `None` if the operation has not settled.
    fn finish(&self) -> PyResult<Option<u8>> {
        fork::check()?;
        match self.ended() {
            Some(ended) => self.outcome(ended).map(Some),
            None => Ok(None),
        }
    }

    /// Blocks (without the GIL) until the operation ends or `timeout`
    /// seconds pass (`TimeoutError`; the operation goes on). Returns the
    /// final status; raises `RuntimeError` if the transfer failed.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u8> {
        fork::check()?;
        let deadline = match timeout {
            Some(t) => Instant::now().checked_add(seconds(t, "timeout")?),
            None => None,
        };
        loop {
            if let Some(ended) = self.ended() {
                return self.outcome(ended);
            }
            let Some(op) = self.shared() else {
                continue;
            };
            let chunk = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(PyTimeoutError::new_err(format!(
                            "operation did not finish within {} s",
                            timeout.unwrap_or_default()
                        )));
                    }
                    left.min(SIGNAL_CHECK)
                }
                None => SIGNAL_CHECK,
            };
            match crate::exit::detach(py, || op.wait_timeout(chunk)) {
                Ok(()) | Err(Error::Cancelled) | Err(Error::TransferFailed { .. }) => {}
                Err(Error::TimedOut(_)) => py.check_signals()?,
                Err(e) => return Err(to_py(e)),
            }
        }
    }

    /// Waits (without the GIL) at most `seconds` for an *active* operation to
    /// settle, as a blocking `wait` begins: the backend's waiting thread polls
    /// its transfer. Returns whether it settled. A passive operation (it waits
    /// for a peer, perhaps for long) returns `False` at once.
    ///
    /// `wait_for_completion` calls this before it hands the wait to the event
    /// loop: a transfer that ends within it skips the loop's wake-up (the
    /// eventfd, then a second loop turn to resume the coroutine; measured in
    /// docs/decisions/0010-python-await-spin.md).
    #[pyo3(name = "spin")]
    fn spin_for(&self, py: Python<'_>, window: f64) -> PyResult<bool> {
        fork::check()?;
        let window = seconds(window, "spin")?.min(SIGNAL_CHECK);
        let Some(op) = self.shared() else {
            return Ok(true);
        };
        if !op.is_active() {
            return Ok(false);
        }
        match crate::exit::detach(py, || op.wait_timeout(window)) {
            Ok(()) | Err(Error::Cancelled) | Err(Error::TransferFailed { .. }) => Ok(true),
            Err(Error::TimedOut(_)) => Ok(false),
            Err(e) => Err(to_py(e)),
        }
    }

    /// Tries to hand the memory back now (after the operation ended).
    fn reclaim_now(&self) -> PyResult<()> {
        fork::check()?;
        self.reclaim();
        Ok(())
    }

    /// Whether the operation has handed its memory back (or is doing so).
    #[getter]
    fn reclaimed(&self) -> bool {
        self.loan.lock().is_none()
    }

    /// A passive operation's metadata, parsed (for `begin_*` in this process).
    fn metadata(&self) -> PyResult<Option<PyMetadata>> {
        Ok(self.published()?.map(PyMetadata::from_arc))
    }

    /// Number of descriptors.
    fn __len__(&self) -> usize {
        self.loan.descriptors.len()
    }
}

/// A number of seconds from Python, refused (`ValueError`, naming `what`)
/// if NaN or negative; one too large for a `Duration` (about 585 billion
/// years, or infinity) is the longest `Duration`, which a deadline treats as
/// none.
fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    if value.is_nan() || value < 0.0 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{what} must be a non-negative number of seconds"
        )));
    }
    Ok(Duration::try_from_secs_f64(value).unwrap_or(Duration::MAX))
}

/// `error` and the errors it came from, as one line.
fn with_sources(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}
