//! Python objects as memory: what a `Descriptor(data)` describes, and the
//! [`PyMemory`] buffer that keeps the Python object alive inside the Rust
//! descriptor for as long as a transfer may touch it.
//!
//! Accepted sources, in the order they are tried:
//! - `torch.Tensor` (when torch is imported): `data_ptr()`, contiguous copy if
//!   needed (as Dynamo does; the copy is then readable only);
//! - `(array, Device|str)`: NumPy arrays (through their buffer export, or
//!   `__array_interface__` for objects with no native buffer) or CuPy arrays
//!   (`__cuda_array_interface__`), the device checked against the array;
//! - `(ptr, size[, Device|str[, ref]])`: raw parts, `ref` kept alive;
//! - `bytes` (read-only), `bytearray` (writable) and, beyond Dynamo, any
//!   object with a native buffer export (`memoryview`, `array.array`, `mmap`,
//!   NumPy arrays): the export is held by a [`Pin`](crate::export::Pin) that
//!   Python cannot release, so the object cannot be resized or closed while
//!   described;
//! - beyond Dynamo: any object exposing `__cuda_array_interface__`,
//!   `__dlpack__` or `__array_interface__`.
//!
//! What pins what (the package README repeats it for users) is each
//! constructor's `keep_alive`.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use descriptor_core::{Device, DeviceKind, MemoryBuffer};

use crate::export::{Exported, Pin, export};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyCapsule, PyDict, PyString, PyTuple};

/// Dynamo's message for a `data` argument of the wrong type.
pub(crate) const TYPE_ERROR_MESSAGE: &str = "Argument `data` must be `torch.Tensor`, `tuple[ndarray, Device|str]`, `bytes`, or `tuple[int, int, Device|str, Any]`.";

/// Where a descriptor's memory came from (for `repr` and error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Tensor,
    TensorCopy,
    Bytes,
    ByteArray,
    Buffer,
    Array,
    CudaArray,
    DLPack,
    Raw,
}

impl Origin {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Origin::Tensor => "torch.Tensor",
            Origin::TensorCopy => "torch.Tensor (contiguous copy)",
            Origin::Bytes => "bytes",
            Origin::ByteArray => "bytearray",
            Origin::Buffer => "buffer",
            Origin::Array => "array",
            Origin::CudaArray => "CUDA array",
            Origin::DLPack => "DLPack",
            Origin::Raw => "raw pointer",
        }
    }
}

/// One contiguous region described by a Python object.
pub(crate) struct Source {
    pub(crate) ptr: usize,
    pub(crate) size: usize,
    pub(crate) device: Device,
    pub(crate) writable: bool,
    /// Why the region is read-only, when it is.
    pub(crate) read_only_reason: Option<&'static str>,
    pub(crate) origin: Origin,
    /// What keeps the memory valid: the object itself, a [`Pin`] (a buffer
    /// export of it, or it and its DLPack capsule), or the caller's `ref`.
    pub(crate) keep_alive: Py<PyAny>,
    /// The object Dynamo's `Descriptor._data_ref` names: the tensor (or its
    /// contiguous copy), the array, the `bytes`/`bytearray`/exporter, the
    /// DLPack producer, or the raw form's `ref` (`None` without one). Python
    /// reaches the memory through it as it could before; it pins nothing
    /// that `keep_alive` does not.
    pub(crate) referent: Py<PyAny>,
}

impl Source {
    /// Bytes `[offset, offset + len)` of this memory (a pool's view), which
    /// the caller checked lie inside it; kept valid by the same objects.
    pub(crate) fn part(&self, py: Python<'_>, offset: usize, len: usize) -> Source {
        Source {
            ptr: self.ptr + offset,
            size: len,
            device: self.device,
            writable: self.writable,
            read_only_reason: self.read_only_reason,
            origin: self.origin,
            keep_alive: self.keep_alive.clone_ref(py),
            referent: self.referent.clone_ref(py),
        }
    }
}

/// A Python object's memory as a [`MemoryBuffer`]: the Rust descriptor owns
/// this, so the object lives at least as long as any operation holding it.
pub(crate) struct PyMemory {
    ptr: *mut u8,
    len: usize,
    device: Device,
    writable: bool,
    /// Dropped (a decref, deferred by PyO3 to the next time a thread holds the
    /// GIL if this thread does not) only when the descriptor is.
    _keep_alive: Py<PyAny>,
    /// Alive exactly as long as this buffer: the Python descriptor holds a
    /// `Weak` to it and so knows whether the buffer was dropped (and may be
    /// described again) or is still held, perhaps leaked, by an operation.
    _alive: Arc<()>,
}

impl PyMemory {
    /// Describes `source` again.
    ///
    /// # Safety
    ///
    /// `source.ptr..source.ptr + source.size` must be one region on
    /// `source.device` that stays valid (for reads, and for writes if
    /// `source.writable`) while `source.keep_alive` lives.
    pub(crate) unsafe fn new(py: Python<'_>, source: &Source, alive: Arc<()>) -> PyMemory {
        PyMemory {
            ptr: std::ptr::with_exposed_provenance_mut(source.ptr),
            len: source.size,
            device: source.device,
            writable: source.writable,
            _keep_alive: source.keep_alive.clone_ref(py),
            _alive: alive,
        }
    }
}

// SAFETY: the pointer is only an address handed to the backend; the memory it
// names is owned by a Python object, which `_keep_alive` (a `Py`, itself Send)
// keeps alive from any thread.
unsafe impl Send for PyMemory {}
// SAFETY: `&PyMemory` gives out nothing but the address, length and flags.
unsafe impl Sync for PyMemory {}

// SAFETY: `PyMemory::new`'s contract gives a region valid (for writes only if
// `writable`) while `_keep_alive` lives, and this value owns `_keep_alive`; the
// region is the Python object's storage, not inside this value; every method
// returns a field that never changes. The Python program can still reach the
// memory through its own object (a tensor, an array), as with Dynamo: Rust code
// never forms a reference to it while an operation holds the descriptor, and
// Python code that reads or writes it during a transfer sees torn data, not
// freed memory. Freeing or resizing it behind the descriptor's back is
// prevented where the object allows (a native buffer export is held by a
// `Pin` that Python cannot release) and is otherwise the caller's promise,
// exactly as for Dynamo's raw `(ptr, size, device, ref)` form (the package
// README lists what pins what).
unsafe impl MemoryBuffer for PyMemory {
    fn base_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device(&self) -> Device {
        self.device
    }
    fn is_writable(&self) -> bool {
        self.writable
    }
}

fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// Parses a device given as a `str` or as a `Device` object (by its `str()`).
pub(crate) fn parse_device(device: &Bound<'_, PyAny>) -> PyResult<Device> {
    let text: String = if let Ok(s) = device.cast::<PyString>() {
        s.to_str()?.to_owned()
    } else if device.hasattr("kind")? && device.hasattr("id")? {
        device.str()?.to_str()?.to_owned()
    } else {
        return Err(PyTypeError::new_err(
            "Argument `device` must be a `dynamo.nixl_connect.Device` or a `str`.",
        ));
    };
    crate::device::parse(&text)
}

fn is_device_like(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(obj.is_instance_of::<PyString>() || (obj.hasattr("kind")? && obj.hasattr("id")?))
}

/// Reads the memory a Python object describes: `ValueError` for a region
/// that wraps the address space or is longer than any memory can be
/// (`isize::MAX` bytes), whatever integers the object gave.
pub(crate) fn source_of(data: &Bound<'_, PyAny>) -> PyResult<Source> {
    let source = read_source(data)?;
    if source.ptr.checked_add(source.size).is_none() || isize::try_from(source.size).is_err() {
        return Err(value_error(format!(
            "{} bytes at {:#x} do not fit in the address space",
            source.size, source.ptr
        )));
    }
    Ok(source)
}

fn read_source(data: &Bound<'_, PyAny>) -> PyResult<Source> {
    let py = data.py();
    if data.is_none() {
        return Err(value_error("Argument `data` cannot be `None`."));
    }
    if let Some(tensor_type) = torch_tensor_type(py)?
        && data.is_instance(&tensor_type)?
    {
        return from_tensor(data);
    }
    if let Ok(tuple) = data.cast::<PyTuple>() {
        return from_tuple(tuple);
    }
    if let Some(exported) = export(data)? {
        return Ok(from_export(data, exported));
    }
    if data.hasattr("__cuda_array_interface__")? {
        return from_cuda_array(data, None);
    }
    if data.hasattr("__dlpack__")? {
        return from_dlpack(data);
    }
    if data.hasattr("__array_interface__")? {
        return from_host_array(data);
    }
    Err(PyTypeError::new_err(TYPE_ERROR_MESSAGE))
}

/// `torch.Tensor`, if torch is already imported (never imported here).
fn torch_tensor_type(py: Python<'_>) -> PyResult<Option<Bound<'_, PyAny>>> {
    let modules = py.import("sys")?.getattr("modules")?;
    let Ok(torch) = modules.get_item("torch") else {
        return Ok(None);
    };
    Ok(torch.getattr("Tensor").ok())
}

fn from_tensor(tensor: &Bound<'_, PyAny>) -> PyResult<Source> {
    let contiguous: bool = tensor.call_method0("is_contiguous")?.extract()?;
    // NIXL registers pointer + size, so the storage must be contiguous: Dynamo
    // copies. Bytes a peer writes into the copy would never reach the tensor,
    // so the copy is readable only.
    let (tensor, origin) = if contiguous {
        (tensor.clone(), Origin::Tensor)
    } else {
        (tensor.call_method0("contiguous")?, Origin::TensorCopy)
    };
    let ptr: usize = tensor.call_method0("data_ptr")?.extract()?;
    let numel: usize = tensor.call_method0("numel")?.extract()?;
    let element: usize = tensor.call_method0("element_size")?.extract()?;
    let size = numel
        .checked_mul(element)
        .ok_or_else(|| value_error("tensor size overflows"))?;
    let device_obj = tensor.getattr("device")?;
    let kind: String = device_obj.getattr("type")?.extract()?;
    let device = match kind.as_str() {
        "cpu" => Device::HOST,
        "cuda" => {
            let index: i64 = tensor.call_method0("get_device")?.extract()?;
            Device::cuda(u32::try_from(index).map_err(|_| value_error("bad CUDA device index"))?)
        }
        other => {
            return Err(value_error(format!(
                "tensors on {other:?} devices are not supported (cpu and cuda are)"
            )));
        }
    };
    Ok(Source {
        ptr,
        size,
        device,
        writable: origin == Origin::Tensor,
        read_only_reason: (origin == Origin::TensorCopy).then_some(
            "a non-contiguous tensor is described by a contiguous copy, which a transfer could write but the tensor would never see",
        ),
        origin,
        referent: tensor.clone().unbind(),
        keep_alive: tensor.unbind(),
    })
}

/// A native buffer export (`bytes`, `bytearray` and any other exporter).
fn from_export(data: &Bound<'_, PyAny>, exported: Exported) -> Source {
    let origin = if data.is_instance_of::<PyBytes>() {
        Origin::Bytes
    } else if data.is_instance_of::<PyByteArray>() {
        Origin::ByteArray
    } else {
        Origin::Buffer
    };
    let reason = match origin {
        Origin::Bytes => "`bytes` are immutable",
        _ => "the object exports its buffer read-only",
    };
    Source {
        ptr: exported.ptr,
        size: exported.len,
        device: Device::HOST,
        writable: !exported.readonly,
        read_only_reason: exported.readonly.then_some(reason),
        origin,
        keep_alive: exported.pin,
        referent: data.clone().unbind(),
    }
}

fn from_tuple(tuple: &Bound<'_, PyTuple>) -> PyResult<Source> {
    let len = tuple.len();
    if len == 2 {
        let first = tuple.get_item(0)?;
        let second = tuple.get_item(1)?;
        if !first.is_instance_of::<pyo3::types::PyInt>() && is_device_like(&second)? {
            let device = parse_device(&second)?;
            if first.hasattr("__cuda_array_interface__")? {
                return from_cuda_array(&first, Some(device));
            }
            if let Some(exported) = export(&first)? {
                if !device.is_host() {
                    return Err(value_error(format!(
                        "the array lives in host memory, not on {device}"
                    )));
                }
                return Ok(Source {
                    origin: Origin::Array,
                    ..from_export(&first, exported)
                });
            }
            if first.hasattr("__array_interface__")? {
                let source = from_host_array(&first)?;
                if !device.is_host() {
                    return Err(value_error(format!(
                        "the array lives in host memory, not on {device}"
                    )));
                }
                return Ok(source);
            }
            return Err(PyTypeError::new_err(
                "Argument `data[0]` must be a `ndarray` with a valid array interface.",
            ));
        }
    }
    if (2..=4).contains(&len) {
        let first = tuple.get_item(0)?;
        let second = tuple.get_item(1)?;
        if first.is_instance_of::<pyo3::types::PyInt>()
            && second.is_instance_of::<pyo3::types::PyInt>()
        {
            return from_raw(tuple);
        }
    }
    Err(PyTypeError::new_err(TYPE_ERROR_MESSAGE))
}

fn from_raw(tuple: &Bound<'_, PyTuple>) -> PyResult<Source> {
    let py = tuple.py();
    let ptr: usize = tuple
        .get_item(0)?
        .extract()
        .map_err(|_| value_error("the pointer must be an integer in 0..2**64"))?;
    let size: usize = tuple
        .get_item(1)?
        .extract()
        .map_err(|_| value_error("the size must be a non-negative integer"))?;
    let device = if tuple.len() >= 3 {
        let device = tuple.get_item(2)?;
        if !is_device_like(&device)? {
            return Err(PyTypeError::new_err(
                "Argument `data` must be a `tuple[int, int, Device|str, Any]`.",
            ));
        }
        parse_device(&device)?
    } else {
        Device::HOST
    };
    if ptr == 0 {
        return Err(value_error("Cannot register memory with a null pointer."));
    }
    let keep_alive = if tuple.len() >= 4 {
        tuple.get_item(3)?.unbind()
    } else {
        py.None()
    };
    let referent = keep_alive.clone_ref(py);
    Ok(Source {
        ptr,
        size,
        device,
        writable: true,
        read_only_reason: None,
        origin: Origin::Raw,
        keep_alive,
        referent,
    })
}

/// `(ptr, readonly)`, byte size and contiguity from an array-interface dict
/// (NumPy's `__array_interface__`, CUDA's `__cuda_array_interface__`).
fn interface_region(interface: &Bound<'_, PyAny>) -> PyResult<(usize, bool, usize)> {
    let interface = interface
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("the array interface must be a dict"))?;
    let item = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        interface
            .get_item(key)?
            .ok_or_else(|| value_error(format!("the array interface has no {key:?}")))
    };
    let (ptr, readonly): (usize, bool) = item("data")?.extract()?;
    let shape: Vec<usize> = item("shape")?.extract()?;
    let typestr: String = item("typestr")?.extract()?;
    let itemsize = itemsize(&typestr)
        .ok_or_else(|| value_error(format!("unknown array typestr {typestr:?}")))?;
    let strides: Option<Vec<isize>> = match interface.get_item("strides")? {
        Some(s) if !s.is_none() => Some(s.extract()?),
        _ => None,
    };
    let size = shape
        .iter()
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| value_error("array size overflows"))?;
    if let Some(strides) = strides {
        let bytes_strides: Vec<isize> = strides;
        if !contiguous(&shape, &bytes_strides, itemsize) {
            return Err(value_error(
                "the array is not contiguous: NIXL registers one pointer and size (make a contiguous copy first)",
            ));
        }
    }
    Ok((ptr, readonly, size))
}

/// Bytes per element of an array-interface `typestr` (`<f4`, `|u1`, `<U4`):
/// its number counts bytes, except for `U` (UCS-4 characters, 4 bytes each).
fn itemsize(typestr: &str) -> Option<usize> {
    let kind = typestr.get(1..2)?;
    let count: usize = typestr.get(2..)?.parse().ok()?;
    if kind == "U" {
        count.checked_mul(4)
    } else {
        Some(count)
    }
}

/// Whether byte `strides` over `shape` describe one dense block (C or Fortran order).
fn contiguous(shape: &[usize], strides: &[isize], itemsize: usize) -> bool {
    if shape.len() != strides.len() {
        return false;
    }
    if shape.contains(&0) {
        return true;
    }
    let dense = |order: &mut dyn Iterator<Item = (usize, isize)>| {
        let mut expected = itemsize as isize;
        for (dim, stride) in order {
            if dim != 1 && stride != expected {
                return false;
            }
            expected = expected.saturating_mul(dim as isize);
        }
        true
    };
    let c_order = dense(&mut shape.iter().copied().zip(strides.iter().copied()).rev());
    c_order || dense(&mut shape.iter().copied().zip(strides.iter().copied()))
}

fn from_host_array(array: &Bound<'_, PyAny>) -> PyResult<Source> {
    let (ptr, readonly, size) = interface_region(&array.getattr("__array_interface__")?)?;
    Ok(Source {
        ptr,
        size,
        device: Device::HOST,
        writable: !readonly,
        read_only_reason: readonly.then_some("the array is not writeable"),
        origin: Origin::Array,
        keep_alive: array.clone().unbind(),
        referent: array.clone().unbind(),
    })
}

fn from_cuda_array(array: &Bound<'_, PyAny>, device: Option<Device>) -> PyResult<Source> {
    let (ptr, readonly, size) = interface_region(&array.getattr("__cuda_array_interface__")?)?;
    // CuPy arrays name their device; other producers need the tuple form.
    let named = match array.getattr("device").and_then(|d| d.getattr("id")) {
        Ok(id) => Some(Device::cuda(id.extract()?)),
        Err(_) => None,
    };
    let device = match (device, named) {
        (Some(d), _) if d.kind() != DeviceKind::Cuda => {
            return Err(value_error(format!(
                "the array lives in CUDA memory, not on {d}"
            )));
        }
        (Some(d), Some(named)) if d != named => {
            return Err(value_error(format!(
                "the array lives on {named}, not on {d}"
            )));
        }
        (Some(d), _) | (None, Some(d)) => d,
        (None, None) => {
            return Err(value_error(
                "cannot tell which GPU this CUDA array is on: pass `(array, \"cuda:N\")`",
            ));
        }
    };
    Ok(Source {
        ptr,
        size,
        device,
        writable: !readonly,
        read_only_reason: readonly.then_some("the array is read-only"),
        origin: Origin::CudaArray,
        keep_alive: array.clone().unbind(),
        referent: array.clone().unbind(),
    })
}

/// DLPack's C structures (dlpack.h, ABI version 1).
#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const DLPACK_FLAG_READ_ONLY: u64 = 1;
const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;
const KDL_ROCM: i32 = 10;
const KDL_ROCM_HOST: i32 = 11;

fn from_dlpack(obj: &Bound<'_, PyAny>) -> PyResult<Source> {
    let py = obj.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("max_version", (1u32, 0u32))?;
    // Producers before DLPack 1.0 take no `max_version`.
    let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
        Err(e) => return Err(e),
    };
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("`__dlpack__()` did not return a capsule"))?;
    let (tensor, read_only): (&DLTensor, bool) = if let Ok(p) =
        capsule.pointer_checked(Some(c"dltensor_versioned"))
    {
        // SAFETY: a capsule named "dltensor_versioned" holds a valid
        // `DLManagedTensorVersioned` (DLPack's protocol) until it is consumed
        // or freed; it is neither while `capsule` (held here) lives, and
        // the reference does not outlive this function.
        let managed = unsafe { &*p.as_ptr().cast::<DLManagedTensorVersioned>() };
        if managed.version.major != 1 {
            return Err(value_error(format!(
                "unsupported DLPack version {}.{}",
                managed.version.major, managed.version.minor
            )));
        }
        (
            &managed.dl_tensor,
            managed.flags & DLPACK_FLAG_READ_ONLY != 0,
        )
    } else if let Ok(p) = capsule.pointer_checked(Some(c"dltensor")) {
        // SAFETY: as above, for an unversioned "dltensor" capsule, which
        // holds a `DLManagedTensor`.
        let managed = unsafe { &*p.as_ptr().cast::<DLManagedTensor>() };
        (&managed.dl_tensor, false)
    } else {
        return Err(PyTypeError::new_err(
            "`__dlpack__()` returned a capsule that is neither \"dltensor\" nor \"dltensor_versioned\" (already consumed?)",
        ));
    };
    let ndim = usize::try_from(tensor.ndim).map_err(|_| value_error("negative DLPack ndim"))?;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: DLPack guarantees `shape` points to `ndim` int64 values for
        // the capsule's lifetime.
        unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }
    };
    let shape: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| value_error("negative DLPack dimension")))
        .collect::<PyResult<_>>()?;
    let bits = usize::from(tensor.dtype.bits) * usize::from(tensor.dtype.lanes);
    let itemsize = bits.div_ceil(8);
    if !tensor.strides.is_null() && ndim > 0 {
        // SAFETY: non-null `strides` points to `ndim` int64 values (DLPack).
        let strides = unsafe { std::slice::from_raw_parts(tensor.strides, ndim) };
        let byte_strides: Vec<isize> = strides
            .iter()
            .map(|&s| (s as isize).saturating_mul(itemsize as isize))
            .collect();
        if !contiguous(&shape, &byte_strides, itemsize) {
            return Err(value_error(
                "the DLPack tensor is not contiguous: NIXL registers one pointer and size",
            ));
        }
    }
    let size = shape
        .iter()
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| value_error("DLPack tensor size overflows"))?;
    let offset = usize::try_from(tensor.byte_offset)
        .map_err(|_| value_error("DLPack byte offset overflows"))?;
    let ptr = (tensor.data as usize)
        .checked_add(offset)
        .ok_or_else(|| value_error("DLPack data pointer overflows"))?;
    let ordinal =
        u32::try_from(tensor.device.device_id).map_err(|_| value_error("bad DLPack device id"))?;
    let device = match tensor.device.device_type {
        KDL_CPU | KDL_CUDA_HOST | KDL_ROCM_HOST => Device::HOST,
        KDL_CUDA => Device::cuda(ordinal),
        KDL_ROCM => Device::rocm(ordinal),
        other => {
            return Err(value_error(format!(
                "DLPack device type {other} is not supported (CPU, CUDA and ROCm are)"
            )));
        }
    };
    // The capsule is kept, not consumed: while it lives the producer keeps the
    // memory; when it is freed (with the GIL), the producer's destructor calls
    // the DLPack deleter, as for any capsule nobody consumed. A `Pin` holds
    // it, so no Python code can reach it (and hand it to a consumer).
    let keep_alive = Pin::objects(
        py,
        vec![obj.clone().unbind(), capsule.clone().into_any().unbind()],
    )?;
    Ok(Source {
        ptr,
        size,
        device,
        writable: !read_only,
        read_only_reason: read_only.then_some("the DLPack tensor is flagged read-only"),
        origin: Origin::DLPack,
        keep_alive,
        referent: obj.clone().unbind(),
    })
}

/// A flat window of bytes over memory a [`Source`] describes: a native
/// object whose buffer export is `len` bytes at `buf`, one dimension, format
/// `B`, and which keeps `owner` (the source's `keep_alive`) alive, so that a
/// `memoryview` of it stays valid whatever the Python program drops. What a
/// pool's parts are viewed through (`_data_ref`): the exporter's own shape
/// and order (a Fortran-ordered array, an `np.matrix`) never come into it.
#[repr(C)]
struct WindowObject {
    ob_base: ffi::PyObject,
    buf: *mut c_void,
    len: ffi::Py_ssize_t,
    readonly: c_int,
    /// A strong reference (null only in an instance made by `tp_alloc`
    /// and not filled yet).
    owner: *mut ffi::PyObject,
}

unsafe extern "C" {
    /// CPython's `PyBuffer_FillInfo` (every version this module loads into
    /// has it; the limited API declares it from 3.11), over an opaque
    /// `Py_buffer *`: the view of a flat byte buffer, `obj` its exporter.
    fn PyBuffer_FillInfo(
        view: *mut c_void,
        obj: *mut ffi::PyObject,
        buf: *mut c_void,
        len: ffi::Py_ssize_t,
        readonly: c_int,
        flags: c_int,
    ) -> c_int;
}

/// `bf_getbuffer` of a window: its bytes, flat (a writable request of a
/// read-only window raises `BufferError`, as `PyBuffer_FillInfo` does).
unsafe extern "C" fn window_getbuffer(
    obj: *mut ffi::PyObject,
    view: *mut c_void,
    flags: c_int,
) -> c_int {
    let window = obj.cast::<WindowObject>();
    // SAFETY: `obj` is a window (this slot is only its type's); `view` is
    // the caller's `Py_buffer`; the GIL is held (a buffer slot is called
    // with it). `FillInfo` takes a new reference to `obj`, so the window,
    // and with it `owner`, lives as long as the view.
    unsafe {
        PyBuffer_FillInfo(
            view,
            obj,
            (*window).buf,
            (*window).len,
            (*window).readonly,
            flags,
        )
    }
}

/// `tp_dealloc` of a window: lets go of its owner, frees the object, and
/// drops the instance's reference to its (heap) type.
unsafe extern "C" fn window_dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: called once, by CPython, with the GIL, for a window whose
    // last reference went; its type is a heap type whose `tp_free` frees
    // what its `tp_alloc` allocated; `owner` is a strong reference or null.
    unsafe {
        let window = obj.cast::<WindowObject>();
        let owner = std::mem::replace(&mut (*window).owner, std::ptr::null_mut());
        let ty = ffi::Py_TYPE(obj);
        let free = ffi::PyType_GetSlot(ty, ffi::Py_tp_free);
        if !free.is_null() {
            let free = std::mem::transmute::<*mut c_void, ffi::freefunc>(free);
            free(obj.cast());
        }
        ffi::Py_XDECREF(owner);
        ffi::Py_DECREF(ty.cast());
    }
}

/// The windows' type, made once (a heap type, not in the module: Python
/// cannot make one, only receive `memoryview`s of them).
fn window_type(py: Python<'_>) -> PyResult<&Bound<'_, pyo3::types::PyType>> {
    static TYPE: PyOnceLock<Py<pyo3::types::PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        let mut slots = [
            ffi::PyType_Slot {
                slot: ffi::Py_bf_getbuffer,
                pfunc: window_getbuffer as *mut c_void,
            },
            ffi::PyType_Slot {
                slot: ffi::Py_tp_dealloc,
                pfunc: window_dealloc as *mut c_void,
            },
            ffi::PyType_Slot {
                slot: 0,
                pfunc: std::ptr::null_mut(),
            },
        ];
        let mut spec = ffi::PyType_Spec {
            // A `'static` C string: the type keeps pointing to it.
            name: c"nixl_connect._native.Window".as_ptr(),
            basicsize: c_int::try_from(std::mem::size_of::<WindowObject>())
                .map_err(|_| PyValueError::new_err("window object too large"))?,
            itemsize: 0,
            flags: c_uint::try_from(
                ffi::Py_TPFLAGS_DEFAULT | ffi::Py_TPFLAGS_DISALLOW_INSTANTIATION,
            )
            .map_err(|_| PyValueError::new_err("type flags out of range"))?,
            slots: slots.as_mut_ptr(),
        };
        // SAFETY: a valid spec (CPython copies the slots; the name is
        // `'static`), buffer slots in specs are honoured from CPython 3.9 on,
        // the GIL is held; a new reference or NULL with an exception set.
        let ty = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyType_FromSpec(&mut spec)) }?;
        Ok(ty.cast_into::<pyo3::types::PyType>()?.unbind())
    })
    .map(|ty| ty.bind(py))
}

/// A flat `memoryview` (format `B`) of the bytes `source` describes, for
/// host memory only (`None` elsewhere): writable if the source is, valid
/// for as long as the view lives (it keeps `source.keep_alive`).
pub(crate) fn host_window<'py>(
    py: Python<'py>,
    source: &Source,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !source.device.is_host() {
        return Ok(None);
    }
    let len = ffi::Py_ssize_t::try_from(source.size)
        .map_err(|_| value_error(format!("{} bytes cannot be viewed", source.size)))?;
    let ty = window_type(py)?;
    // SAFETY: the window type's `tp_alloc` (PyType_GenericAlloc: a zeroed
    // instance, the type's reference taken) with the GIL held; NULL with an
    // exception set on failure.
    let window = unsafe {
        let alloc = ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_alloc);
        if alloc.is_null() {
            return Err(PyValueError::new_err("the window type has no tp_alloc"));
        }
        let alloc = std::mem::transmute::<*mut c_void, ffi::allocfunc>(alloc);
        Bound::from_owned_ptr_or_err(py, alloc(ty.as_type_ptr(), 0))?
    };
    let object = window.as_ptr().cast::<WindowObject>();
    // SAFETY: a fresh, zeroed window that nothing else has seen yet; the
    // owner reference moves into it (released by `window_dealloc`).
    // `source`'s contract: `ptr..ptr + size` stays valid (writable if
    // `writable`) while `keep_alive` lives.
    unsafe {
        (*object).buf = std::ptr::with_exposed_provenance_mut(source.ptr);
        (*object).len = len;
        (*object).readonly = c_int::from(!source.writable);
        (*object).owner = source.keep_alive.clone_ref(py).into_ptr();
    }
    // SAFETY: `window` is a live exporter (the GIL is held); a new
    // reference to a memoryview holding the window, or NULL with an
    // exception set.
    let view =
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyMemoryView_FromObject(window.as_ptr())) }?;
    Ok(Some(view))
}
