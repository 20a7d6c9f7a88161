//! Pins held by Rust: what keeps a described object's memory in place, out of
//! reach of Python code.
//!
//! A pin that is an ordinary Python object can be undone from Python: a
//! `memoryview` is found through `gc.get_objects()` and `release()`d, a tuple
//! holding a DLPack capsule hands the capsule to any consumer. And on CPython
//! 3.12+ a class statement can define `__buffer__` (PEP 688), so that
//! `memoryview(obj)` exports some other object and pins nothing of `obj`.
//!
//! [`Pin`] is a native object with no methods and no referents: Python can
//! hold it longer (which only pins longer) but never release or open it. A
//! buffer export is taken through the exporter's *native* buffer slot (the
//! first type in the MRO whose slot was not defined in Python), so no Python
//! code runs and no override is consulted: the export counts against the
//! object itself (a `bytearray` then refuses to resize, an `mmap` to close).

use std::ffi::{c_char, c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// CPython's `Py_buffer` (`Include/pybuffer.h`): the layout has not changed
/// since 3.3 and is part of the stable ABI from 3.11. Declared here because
/// PyO3 exposes it only to builds for 3.11+, and this module is abi3 for 3.10.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

/// `getbufferproc` and `releasebufferproc`, over [`RawBuffer`].
type GetBuffer = unsafe extern "C" fn(*mut ffi::PyObject, *mut RawBuffer, c_int) -> c_int;
type ReleaseBuffer = unsafe extern "C" fn(*mut ffi::PyObject, *mut RawBuffer);

/// `PyBUF_ANY_CONTIGUOUS`: one dense block (C or Fortran order), no format.
const PYBUF_ANY_CONTIGUOUS: c_int = 0x0080 | 0x0010 | 0x0008;

/// A buffer export, released (by the same native slots) when the pin dies.
struct Export {
    view: RawBuffer,
    release: Option<ReleaseBuffer>,
}

/// What a descriptor holds to keep its memory valid (see the module docs).
#[pyclass(frozen, module = "nixl_connect._native", name = "Pin")]
pub(crate) struct Pin {
    export: Option<Export>,
    /// Objects kept alive (the source object, a DLPack capsule).
    _objects: Vec<Py<PyAny>>,
}

// SAFETY: `export` is touched only by `drop`, which runs in the object's
// deallocator with the GIL held (whatever thread drops the last `Py<Pin>`,
// PyO3 defers the decref to a thread holding the GIL); its pointers name
// Python-owned memory and the exporter, valid from any thread under the GIL.
unsafe impl Send for Pin {}
// SAFETY: `&Pin` gives out nothing: no method reads `export`.
unsafe impl Sync for Pin {}

impl Drop for Pin {
    fn drop(&mut self) {
        if let Some(export) = &mut self.export {
            // SAFETY: with the GIL held (see `Send`); `view` was filled by a
            // successful `getbuffer` of the type whose `releasebuffer` this is
            // and is released once, here; then its reference to the exporter
            // is dropped, as `PyBuffer_Release` does.
            unsafe {
                if let Some(release) = export.release {
                    release(export.view.obj, &mut export.view);
                }
                ffi::Py_DECREF(export.view.obj);
            }
        }
    }
}

impl Pin {
    /// A pin that keeps `objects` alive.
    pub(crate) fn objects(py: Python<'_>, objects: Vec<Py<PyAny>>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(
            py,
            Pin {
                export: None,
                _objects: objects,
            },
        )?
        .into_any())
    }
}

/// A native buffer export of an object: one contiguous host region.
pub(crate) struct Exported {
    pub(crate) ptr: usize,
    pub(crate) len: usize,
    pub(crate) readonly: bool,
    /// Holds the export until the last descriptor of the region is gone.
    pub(crate) pin: Py<PyAny>,
}

/// Exports `obj`'s buffer through its native slot; `None` if its type has
/// none (it does not implement the buffer protocol in C).
pub(crate) fn export(obj: &Bound<'_, PyAny>) -> PyResult<Option<Exported>> {
    let py = obj.py();
    let Some((get, release)) = native_slots(&obj.get_type())? else {
        return Ok(None);
    };
    let mut view = MaybeUninit::<RawBuffer>::zeroed();
    // SAFETY: `get` is a type's `bf_getbuffer` from its MRO, so `obj` is an
    // instance of that type; `view` is writable storage of `Py_buffer`'s
    // layout; the GIL is held (`obj` is bound).
    if unsafe { get(obj.as_ptr(), view.as_mut_ptr(), PYBUF_ANY_CONTIGUOUS) } != 0 {
        let cause = PyErr::fetch(py);
        let err = PyValueError::new_err(format!(
            "cannot describe this {} as one contiguous region: {cause}",
            obj.get_type().name()?
        ));
        err.set_cause(py, Some(cause));
        return Err(err);
    }
    // SAFETY: a successful `getbuffer` filled the view (zeroed before).
    let mut view = unsafe { view.assume_init() };
    if view.obj.is_null() {
        // Exporters must set it; hold the object ourselves if one did not.
        view.obj = obj.clone().into_ptr();
    }
    let exported = Exported {
        ptr: view.buf.expose_provenance(),
        len: usize::try_from(view.len).unwrap_or(0),
        readonly: view.readonly != 0,
        pin: Py::new(
            py,
            Pin {
                export: Some(Export { view, release }),
                _objects: Vec::new(),
            },
        )?
        .into_any(),
    };
    Ok(Some(exported))
}

/// The buffer slots of the first type in `ty`'s MRO that implements them
/// natively (not through `__buffer__`/`__release_buffer__` defined in Python).
fn native_slots(ty: &Bound<'_, PyType>) -> PyResult<Option<(GetBuffer, Option<ReleaseBuffer>)>> {
    let python = python_slots(ty.py())?;
    for base in ty.mro().iter() {
        let base = base.cast_into::<PyType>()?;
        let tp = base.as_type_ptr();
        // SAFETY: `tp` is a live type object (the GIL is held); these slot ids
        // are valid for every type (static ones too, since 3.10).
        let (get, release) = unsafe {
            (
                ffi::PyType_GetSlot(tp, ffi::Py_bf_getbuffer),
                ffi::PyType_GetSlot(tp, ffi::Py_bf_releasebuffer),
            )
        };
        let defined_in_python =
            |slot: *mut c_void, python: Option<usize>| python == Some(slot.expose_provenance());
        if get.is_null() || defined_in_python(get, python.get) {
            continue;
        }
        if defined_in_python(release, python.release) {
            continue;
        }
        // SAFETY: `Py_bf_getbuffer` and `Py_bf_releasebuffer` slots hold
        // functions of these signatures (`RawBuffer` is `Py_buffer`).
        let slots = unsafe {
            (
                std::mem::transmute::<*mut c_void, GetBuffer>(get),
                (!release.is_null())
                    .then(|| std::mem::transmute::<*mut c_void, ReleaseBuffer>(release)),
            )
        };
        return Ok(Some(slots));
    }
    Ok(None)
}

/// The slot functions a class statement's `__buffer__` and
/// `__release_buffer__` install (CPython 3.12+); `None` before 3.12, where a
/// class statement cannot define buffer slots.
struct PythonSlots {
    get: Option<usize>,
    release: Option<usize>,
}

fn python_slots(py: Python<'_>) -> PyResult<&'static PythonSlots> {
    static SLOTS: OnceLock<PythonSlots> = OnceLock::new();
    if let Some(slots) = SLOTS.get() {
        return Ok(slots);
    }
    let probe = py.eval(
        c"type('Probe', (bytearray,), {'__buffer__': lambda self, flags: memoryview(b''), '__release_buffer__': lambda self, view: None})",
        None,
        None,
    )?;
    let slots_of = |ty: &Bound<'_, PyAny>| -> PyResult<(usize, usize)> {
        let ty = ty.cast::<PyType>()?;
        // SAFETY: as in `native_slots`.
        let (get, release) = unsafe {
            (
                ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_bf_getbuffer),
                ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_bf_releasebuffer),
            )
        };
        Ok((get.expose_provenance(), release.expose_provenance()))
    };
    let (probe_get, probe_release) = slots_of(&probe)?;
    let (native_get, native_release) =
        slots_of(py.get_type::<pyo3::types::PyByteArray>().as_any())?;
    Ok(SLOTS.get_or_init(|| PythonSlots {
        get: (probe_get != native_get).then_some(probe_get),
        release: (probe_release != native_release).then_some(probe_release),
    }))
}
