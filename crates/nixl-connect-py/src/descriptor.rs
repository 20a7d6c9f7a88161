//! The native `Descriptor`: a Python object's memory (or a part of a pool's,
//! see `pool`), and the Rust [`Descriptor`] over it while no operation holds
//! it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use descriptor_core::Descriptor;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::connector::PyConnector;
use crate::error::to_py;
use crate::fork;
use crate::held;
use crate::memory::{PyMemory, Source, source_of};
use crate::operation::Loan;
use crate::pool::PyRegisteredMemory;

/// Where the Rust descriptor is.
enum Slot {
    /// Here, free to lend to an operation or register.
    Idle {
        descriptor: Descriptor,
        alive: Weak<()>,
    },
    /// Moved into an operation (or a registration call in progress). `alive`
    /// tells whether its buffer still exists: once dropped (the operation
    /// ended without handing it back, e.g. it was dropped or failed to
    /// start), the memory may be described again; while alive it is held,
    /// and if it was leaked because a peer may still write, it stays held.
    /// `loan` is the operation that holds it (once made), asked to hand the
    /// memory back before the descriptor is reported in use.
    ///
    /// For a pool's part, `alive` is always dead: whether a Rust view still
    /// holds the range is the core's to say (`carve` refuses it), and a part
    /// not carved yet is `Lent` too.
    Lent { alive: Weak<()>, loan: Weak<Loan> },
}

impl Slot {
    /// Nothing here, and nothing known about an operation holding it.
    fn loose() -> Slot {
        Slot::Lent {
            alive: Weak::new(),
            loan: Weak::new(),
        }
    }
}

/// A part of a pool's memory, which a live Python descriptor owns.
struct Part {
    memory: Py<PyRegisteredMemory>,
    offset: usize,
}

/// Memory of a Python object, described for transfers (`nixl_connect.Descriptor`
/// wraps it).
#[pyclass(frozen, module = "nixl_connect._native", name = "Descriptor")]
pub(crate) struct PyDescriptor {
    /// The memory described (for a pool's part: that part).
    source: Source,
    /// Set for a pool's part: its memory and offset.
    part: Option<Part>,
    /// Bytes a transfer moves (`0 < size <= source.size`): applied to the
    /// Rust descriptor when it is lent, so setting it never waits for, nor
    /// fails because of, an operation holding the memory.
    size: AtomicUsize,
    slot: Mutex<Slot>,
}

impl PyDescriptor {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        // Every change is a single assignment: a poisoned slot is consistent.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn build(py: Python<'_>, source: &Source) -> PyResult<(Descriptor, Weak<()>)> {
        let alive = Arc::new(());
        let weak = Arc::downgrade(&alive);
        // SAFETY: `source` came from `source_of`, which read the region from
        // the object `source.keep_alive` keeps alive (see `PyMemory`'s
        // `MemoryBuffer` safety comment for what Python can still do).
        let memory = unsafe { PyMemory::new(py, source, alive) };
        let descriptor = Descriptor::new(memory).map_err(to_py)?;
        Ok((descriptor, weak))
    }

    /// Asks the operation holding the memory, if any, to hand it back (it
    /// does once it ended and the backend let go). Called without the slot's
    /// lock: the hand-back takes it.
    fn settle_loan(&self) {
        let loan = match &*self.lock() {
            Slot::Lent { alive, loan } if self.part.is_some() || alive.strong_count() > 0 => {
                loan.upgrade()
            }
            _ => None,
        };
        if let Some(loan) = loan {
            loan.reclaim();
        }
    }

    /// Records which operation holds the lent memory.
    pub(crate) fn lent_to(&self, owner: Weak<Loan>) {
        if let Slot::Lent { loan, alive } = &mut *self.lock() {
            if self.part.is_none() {
                held::attach(self.source.ptr, alive, &owner);
            }
            *loan = owner;
        }
    }

    /// Records the lent memory as written by its operation (see `held`):
    /// until it comes back, no other operation is lent memory overlapping
    /// it. Nothing for a pool's part (the core's allocator keeps parts apart).
    pub(crate) fn record_written(&self) {
        if self.part.is_some() {
            return;
        }
        if let Slot::Lent { alive, .. } = &*self.lock() {
            held::record(self.source.ptr, self.source.size, alive);
        }
    }

    /// The liveness of the buffer the slot holds (or last lent).
    fn alive(&self) -> Weak<()> {
        match &*self.lock() {
            Slot::Idle { alive, .. } | Slot::Lent { alive, .. } => alive.clone(),
        }
    }

    /// A part of `memory` at `offset`, which the caller claimed for it.
    pub(crate) fn view(source: Source, memory: Py<PyRegisteredMemory>, offset: usize) -> Self {
        PyDescriptor {
            size: AtomicUsize::new(source.size),
            source,
            part: Some(Part { memory, offset }),
            slot: Mutex::new(Slot::loose()),
        }
    }

    /// For a pool's part not here: carves its Rust view again, if no Rust
    /// view holds the range (the operation that had it dropped it, or it was
    /// never carved). Called with the slot locked: carving takes only the
    /// core allocator's leaf lock.
    fn recarve(&self, part: &Part, slot: &mut Slot) -> bool {
        if matches!(slot, Slot::Idle { .. }) {
            return true;
        }
        match part.memory.get().carve(part.offset, self.source.size) {
            Some(descriptor) => {
                *slot = Slot::Idle {
                    descriptor,
                    alive: Weak::new(),
                };
                true
            }
            None => false,
        }
    }

    /// Takes the Rust descriptor out for an operation of `connector`, its
    /// size set to the one asked for. A pool's part registers its memory with
    /// `connector` first, if that was not done (without a connector, an
    /// unregistered part cannot be carved: it is reported in use).
    pub(crate) fn lend(
        &self,
        py: Python<'_>,
        index: usize,
        connector: Option<&Bound<'_, PyConnector>>,
    ) -> PyResult<Descriptor> {
        fork::check()?;
        self.settle_loan();
        if self.part.is_none() {
            // Not lent over memory another operation may still write.
            held::check(index, self.source.ptr, self.source.size, &self.alive())?;
        }
        if let (Some(part), Some(connector)) = (&self.part, connector) {
            part.memory.get().ensure_registered(py, connector)?;
        }
        let mut slot = self.lock();
        match (&*slot, &self.part) {
            (Slot::Idle { .. }, _) => {}
            (Slot::Lent { .. }, Some(part)) => {
                if !self.recarve(part, &mut slot) {
                    return Err(PyValueError::new_err(format!(
                        "descriptor {index} is in use: bytes {}..{} of its pool are still held by an operation \
                         that has not let go of them (one in progress, draining, or leaked after a cancel)",
                        part.offset,
                        part.offset + self.source.size
                    )));
                }
            }
            (Slot::Lent { alive, .. }, None) if alive.strong_count() == 0 => {
                // The last operation dropped the buffer: describe it afresh.
                let (descriptor, alive) = Self::build(py, &self.source)?;
                *slot = Slot::Idle { descriptor, alive };
            }
            (Slot::Lent { .. }, None) => {
                return Err(PyValueError::new_err(format!(
                    "descriptor {index} is in use by another operation: wait for that operation to end \
                     (after `cancel()`, `await op.wait_for_release()` waits until a transfer the backend \
                     could not abort has let go of the memory)"
                )));
            }
        }
        match std::mem::replace(&mut *slot, Slot::loose()) {
            Slot::Idle {
                mut descriptor,
                alive,
            } => {
                let wanted = self.size.load(Ordering::Relaxed);
                if let Err(e) = descriptor.set_size(wanted) {
                    *slot = Slot::Idle { descriptor, alive };
                    return Err(to_py(e));
                }
                *slot = Slot::Lent {
                    alive,
                    loan: Weak::new(),
                };
                Ok(descriptor)
            }
            lent @ Slot::Lent { .. } => {
                *slot = lent;
                Err(PyRuntimeError::new_err(
                    "descriptor slot changed under its lock",
                ))
            }
        }
    }

    /// Gives a lent descriptor back (the operation ended and let go of it).
    pub(crate) fn give_back(&self, descriptor: Descriptor) {
        let mut slot = self.lock();
        let alive = match &*slot {
            Slot::Lent { alive, .. } | Slot::Idle { alive, .. } => alive.clone(),
        };
        if self.part.is_none() {
            held::forget(self.source.ptr, &alive);
        }
        *slot = Slot::Idle { descriptor, alive };
    }

    pub(crate) fn source(&self) -> &Source {
        &self.source
    }

    /// Bytes a transfer moves (what `size` reads).
    pub(crate) fn transfer_size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }
}

impl Drop for PyDescriptor {
    fn drop(&mut self) {
        let slot = std::mem::replace(
            self.slot.get_mut().unwrap_or_else(PoisonError::into_inner),
            Slot::loose(),
        );
        if fork::forked() {
            // A forked child leaks what it inherited (deregistering would call
            // into a backend whose threads are gone: see `fork`).
            if let Slot::Idle { descriptor, .. } = slot {
                std::mem::forget(descriptor);
            }
        } else {
            // A part's Rust view goes back to the core first, then the
            // Python-level claim: a new descriptor of these bytes lends at
            // once. (Bytes an operation still holds stay claimed, as held,
            // until the core lets go of them: see `pool`.)
            drop(slot);
        }
        if let Some(part) = &self.part {
            part.memory.get().release(part.offset, self.source.size);
        }
    }
}

#[pymethods]
impl PyDescriptor {
    #[new]
    fn new(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<PyDescriptor> {
        let source = source_of(data)?;
        let (descriptor, alive) = Self::build(py, &source)?;
        Ok(PyDescriptor {
            size: AtomicUsize::new(source.size),
            source,
            part: None,
            slot: Mutex::new(Slot::Idle { descriptor, alive }),
        })
    }

    /// Start address of the memory.
    #[getter]
    fn ptr(&self) -> usize {
        self.source.ptr
    }

    /// Bytes a transfer moves: the capacity unless `set_size` made it less.
    #[getter]
    fn size(&self) -> usize {
        self.size.load(Ordering::Relaxed)
    }

    /// Bytes described (a pool's part: the part's).
    #[getter]
    fn capacity(&self) -> usize {
        self.source.size
    }

    /// Makes transfers move the first `size` bytes only (`0 < size <=
    /// capacity`, else `ValueError`); applied when the memory is next lent
    /// to an operation, so it never fails for being in use.
    fn set_size(&self, size: usize) -> PyResult<()> {
        if size == 0 || size > self.source.size {
            return Err(PyValueError::new_err(format!(
                "`_data_size` must be an integer between 1 and the descriptor's capacity ({} bytes); got {size}",
                self.source.size
            )));
        }
        self.size.store(size, Ordering::Relaxed);
        Ok(())
    }

    /// The object the memory belongs to (Dynamo's `_data_ref`; for a pool's
    /// part, the pool's object).
    #[getter]
    fn referent(&self, py: Python<'_>) -> Py<PyAny> {
        self.source.referent.clone_ref(py)
    }

    /// For a pool's part: its offset in the pool's memory; `None` otherwise.
    #[getter]
    fn offset(&self) -> Option<usize> {
        self.part.as_ref().map(|p| p.offset)
    }

    /// The device, as `cpu`, `cuda:N` or `rocm:N`.
    #[getter]
    fn device(&self) -> String {
        self.source.device.to_string()
    }

    /// Whether transfers may write into the memory (false for `bytes`).
    #[getter]
    fn writable(&self) -> bool {
        self.source.writable
    }

    /// Why the memory is read-only, or `None`.
    #[getter]
    fn read_only_reason(&self) -> Option<&'static str> {
        self.source.read_only_reason
    }

    /// What the memory came from (`bytes`, `array`, `DLPack`, ...).
    #[getter]
    fn origin(&self) -> &'static str {
        self.source.origin.name()
    }

    /// Whether the memory is registered with a connector (an operation
    /// holding it has registered it). Asks the operation holding the memory
    /// to hand it back first: `RuntimeError` in a forked child (see `fork`),
    /// which must not settle its parent's operation.
    #[getter]
    fn is_registered(&self) -> PyResult<bool> {
        fork::check()?;
        if let Some(part) = &self.part {
            return Ok(part.memory.get().registered());
        }
        self.settle_loan();
        Ok(match &*self.lock() {
            Slot::Idle { descriptor, .. } => descriptor.is_registered(),
            Slot::Lent { alive, .. } => alive.strong_count() > 0,
        })
    }

    /// Whether an operation holds the memory now (asking it to hand the
    /// memory back first): `RuntimeError` in a forked child, as
    /// `is_registered`.
    #[getter]
    fn in_use(&self) -> PyResult<bool> {
        fork::check()?;
        self.settle_loan();
        let mut slot = self.lock();
        Ok(match &self.part {
            Some(part) => part.memory.get().registered() && !self.recarve(part, &mut slot),
            None => matches!(&*slot, Slot::Lent { alive, .. } if alive.strong_count() > 0),
        })
    }

    /// Registers the memory with `connector` (nothing if already registered
    /// with it; `RuntimeError` if registered with another connector). A
    /// pool's part registers the pool's memory, once.
    fn register(&self, py: Python<'_>, connector: &Bound<'_, PyConnector>) -> PyResult<()> {
        if let Some(part) = &self.part {
            return part.memory.get().ensure_registered(py, connector).map(drop);
        }
        let mut descriptor = self.lend(py, 0, Some(connector))?;
        let connector = connector.get().inner();
        // Registration pins memory: no lock of ours and no GIL held meanwhile.
        let result = crate::exit::detach(py, || descriptor.register_memory(connector));
        self.give_back(descriptor);
        result.map_err(to_py)
    }

    /// Deregisters the memory (it registers again on its next use). Nothing
    /// for a pool's part: the pool's memory stays registered until its last
    /// descriptor and handle are gone.
    fn deregister(&self, py: Python<'_>) -> PyResult<()> {
        if self.part.is_some() {
            return Ok(());
        }
        let descriptor = self.lend(py, 0, None)?;
        if !descriptor.is_registered() {
            self.give_back(descriptor);
            return Ok(());
        }
        match crate::exit::detach(py, || descriptor.into_buffer::<PyMemory>()) {
            Ok(memory) => {
                let descriptor = Descriptor::new(memory).map_err(to_py)?;
                self.give_back(descriptor);
                Ok(())
            }
            Err(descriptor) => {
                self.give_back(descriptor);
                Err(PyRuntimeError::new_err(
                    "the backend refused to deregister the memory",
                ))
            }
        }
    }
}
