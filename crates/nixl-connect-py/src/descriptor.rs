//! The native `Descriptor`: a Python object's memory, and the Rust
//! [`Descriptor`] over it while no operation holds it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use descriptor_core::Descriptor;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::connector::PyConnector;
use crate::error::to_py;
use crate::fork;
use crate::memory::{PyMemory, Source, source_of};
use crate::operation::Loan;

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
    Lent { alive: Weak<()>, loan: Weak<Loan> },
}

/// Memory of a Python object, described for transfers (`nixl_connect.Descriptor`
/// wraps it).
#[pyclass(frozen, module = "nixl_connect._native", name = "Descriptor")]
pub(crate) struct PyDescriptor {
    source: Source,
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
            Slot::Lent { alive, loan } if alive.strong_count() > 0 => loan.upgrade(),
            _ => None,
        };
        if let Some(loan) = loan {
            loan.reclaim();
        }
    }

    /// Records which operation holds the lent memory.
    pub(crate) fn lent_to(&self, owner: Weak<Loan>) {
        if let Slot::Lent { loan, .. } = &mut *self.lock() {
            *loan = owner;
        }
    }

    /// Takes the Rust descriptor out for an operation.
    pub(crate) fn lend(&self, py: Python<'_>, index: usize) -> PyResult<Descriptor> {
        fork::check()?;
        self.settle_loan();
        let mut slot = self.lock();
        match &*slot {
            Slot::Idle { .. } => {}
            Slot::Lent { alive, .. } if alive.strong_count() == 0 => {
                // The last operation dropped the buffer: describe it afresh.
                let (descriptor, alive) = Self::build(py, &self.source)?;
                *slot = Slot::Idle { descriptor, alive };
            }
            Slot::Lent { .. } => {
                return Err(PyValueError::new_err(format!(
                    "descriptor {index} is in use by another operation (wait for that operation to finish, \
                     or describe the memory with a new Descriptor)"
                )));
            }
        }
        let placeholder = Slot::Lent {
            alive: Weak::new(),
            loan: Weak::new(),
        };
        match std::mem::replace(&mut *slot, placeholder) {
            Slot::Idle { descriptor, alive } => {
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
        *slot = Slot::Idle { descriptor, alive };
    }

    pub(crate) fn source(&self) -> &Source {
        &self.source
    }
}

impl Drop for PyDescriptor {
    fn drop(&mut self) {
        // A forked child leaks what it inherited (deregistering would call
        // into a backend whose threads are gone: see `fork`).
        if fork::forked() {
            let slot = self.slot.get_mut().unwrap_or_else(PoisonError::into_inner);
            if let Slot::Idle { descriptor, .. } = std::mem::replace(
                slot,
                Slot::Lent {
                    alive: Weak::new(),
                    loan: Weak::new(),
                },
            ) {
                std::mem::forget(descriptor);
            }
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
            source,
            slot: Mutex::new(Slot::Idle { descriptor, alive }),
        })
    }

    /// Start address of the memory.
    #[getter]
    fn ptr(&self) -> usize {
        self.source.ptr
    }

    /// Size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.source.size
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
    /// holding it has registered it).
    #[getter]
    fn is_registered(&self) -> bool {
        self.settle_loan();
        match &*self.lock() {
            Slot::Idle { descriptor, .. } => descriptor.is_registered(),
            Slot::Lent { alive, .. } => alive.strong_count() > 0,
        }
    }

    /// Whether an operation holds the memory now.
    #[getter]
    fn in_use(&self) -> bool {
        self.settle_loan();
        matches!(&*self.lock(), Slot::Lent { alive, .. } if alive.strong_count() > 0)
    }

    /// Registers the memory with `connector` (nothing if already registered
    /// with it; `RuntimeError` if registered with another connector).
    fn register(&self, py: Python<'_>, connector: &PyConnector) -> PyResult<()> {
        let mut descriptor = self.lend(py, 0)?;
        let connector = connector.inner();
        // Registration pins memory: no lock of ours and no GIL held meanwhile.
        let result = py.detach(|| descriptor.register_memory(connector));
        self.give_back(descriptor);
        result.map_err(to_py)
    }

    /// Deregisters the memory (it registers again on its next use).
    fn deregister(&self, py: Python<'_>) -> PyResult<()> {
        let descriptor = self.lend(py, 0)?;
        if !descriptor.is_registered() {
            self.give_back(descriptor);
            return Ok(());
        }
        match py.detach(|| descriptor.into_buffer::<PyMemory>()) {
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
