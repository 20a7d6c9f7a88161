//! The native side of `RdmaMetadata`: parsed and validated once by the Rust
//! core (bounded, untrusted input), then handed to `begin_read`/`begin_write`.
//!
//! The pydantic models' fast path (docs/decisions/0011, §6) is here too:
//! - `from_json_exact` and `from_dict_exact` read only documents that
//!   pydantic would read into the very same model (every field present, each
//!   once, objects as objects, exact types, device strings as Dynamo writes
//!   them) and refuse everything else, which the Python layer then hands to
//!   pydantic; what they take, the core validates as `from_json` does;
//! - `model` builds the pydantic models from the parsed metadata the way
//!   pydantic-core builds a validated instance, without running a validator
//!   per descriptor;
//! - `to_json` writes what pydantic's `model_dump_json()` writes for that
//!   model, `nixl_metadata` as the document gave it.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

use descriptor_core::{
    Device, Error, MAX_DESCRIPTORS, OperationKind, RdmaMetadata, SerializedDescriptor,
    check_descriptor_count, check_json_len, decode_agent_metadata_cached, encode_agent_metadata,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::{PyBackedBytes, PyBackedStr};
use pyo3::types::{PyDict, PyInt, PyList, PySet, PyString, PyTuple, PyType};
use pyo3::{ffi, intern};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::to_py;

/// Validated `RdmaMetadata` (the pydantic model in `nixl_connect` caches one).
#[pyclass(frozen, module = "nixl_connect._native", name = "Metadata")]
pub(crate) struct PyMetadata {
    inner: Arc<RdmaMetadata>,
    /// `nixl_metadata` as `to_json` writes it: as the document gave it
    /// (`from_*_exact`), else as this library encodes the agent blob.
    nixl_metadata: OnceLock<String>,
}

impl PyMetadata {
    pub(crate) fn new(inner: RdmaMetadata) -> PyMetadata {
        PyMetadata::from_arc(Arc::new(inner))
    }

    pub(crate) fn from_arc(inner: Arc<RdmaMetadata>) -> PyMetadata {
        PyMetadata {
            inner,
            nixl_metadata: OnceLock::new(),
        }
    }

    /// Metadata whose `to_json` writes `nixl_metadata` as given.
    fn with_encoded(inner: RdmaMetadata, nixl_metadata: String) -> PyMetadata {
        PyMetadata {
            inner: Arc::new(inner),
            nixl_metadata: OnceLock::from(nixl_metadata),
        }
    }

    pub(crate) fn inner(&self) -> &RdmaMetadata {
        &self.inner
    }

    fn encoded(&self) -> &str {
        self.nixl_metadata
            .get_or_init(|| encode_agent_metadata(self.inner.agent_metadata()))
    }

    /// What pydantic-core writes for the model `model` builds: compact, in
    /// field order, strings escaped as serde_json escapes them (as
    /// pydantic-core does), integers in decimal. Written by hand so that a
    /// run of descriptors on one device formats its device once (serde's
    /// derive formats each one through `Display`). Why: the Outcome of
    /// docs/decisions/0011-registered-memory-and-views.md, Python metadata.
    fn write_json(&self) -> Result<String, String> {
        let failed = |e: serde_json::Error| format!("cannot write the metadata's JSON: {e}");
        let descriptors = self.inner.descriptors();
        let nixl_metadata = self.encoded();
        let key = self.inner.notification_key();
        let mut out =
            Vec::with_capacity(96 + descriptors.len() * 64 + nixl_metadata.len() + 2 * key.len());
        out.extend_from_slice(b"{\"descriptors\":[");
        let mut numbers = itoa::Buffer::new();
        // The device's JSON string, for a run of descriptors on one device.
        let mut last: Option<(Device, Vec<u8>)> = None;
        for (i, d) in descriptors.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"device\":");
            match &last {
                Some((device, text)) if *device == d.device => out.extend_from_slice(text),
                _ => {
                    let text = serde_json::to_vec(&d.device.to_string()).map_err(failed)?;
                    out.extend_from_slice(&text);
                    last = Some((d.device, text));
                }
            }
            out.extend_from_slice(b",\"ptr\":");
            out.extend_from_slice(numbers.format(d.ptr).as_bytes());
            out.extend_from_slice(b",\"size\":");
            out.extend_from_slice(numbers.format(d.size).as_bytes());
            out.push(b'}');
        }
        out.extend_from_slice(b"],\"nixl_metadata\":");
        serde_json::to_writer(&mut out, nixl_metadata).map_err(failed)?;
        out.extend_from_slice(b",\"notification_key\":");
        serde_json::to_writer(&mut out, key).map_err(failed)?;
        out.extend_from_slice(b",\"operation_kind\":");
        out.extend_from_slice(
            numbers
                .format(u8::from(self.inner.operation_kind()))
                .as_bytes(),
        );
        out.push(b'}');
        String::from_utf8(out).map_err(|e| format!("the metadata's JSON is not UTF-8: {e}"))
    }
}

/// A JSON document from Python: `str`, `bytes` or `bytearray`.
#[derive(FromPyObject)]
pub(crate) enum JsonText {
    Text(PyBackedStr),
    Bytes(PyBackedBytes),
}

impl JsonText {
    fn as_bytes(&self) -> &[u8] {
        match self {
            JsonText::Text(text) => text.as_bytes(),
            JsonText::Bytes(bytes) => bytes,
        }
    }
}

#[pymethods]
impl PyMetadata {
    /// Parses Dynamo's JSON (`b64:` or legacy hex `nixl_metadata`); `ValueError`
    /// on anything invalid or over the bounds.
    #[staticmethod]
    fn from_json(py: Python<'_>, json: JsonText) -> PyResult<PyMetadata> {
        // Decoding inflates the agent blob: no GIL needed for that.
        crate::exit::detach(py, || RdmaMetadata::from_slice(json.as_bytes()))
            .map(PyMetadata::new)
            .map_err(to_py)
    }

    /// Parses only a document that pydantic reads into the same model as
    /// this gives (see the module's documentation), validated as `from_json`
    /// validates; `ValueError` on anything else.
    #[staticmethod]
    fn from_json_exact(py: Python<'_>, json: JsonText) -> PyResult<PyMetadata> {
        crate::exit::detach(py, || exact_json(json.as_bytes())).map_err(to_py)
    }

    /// `from_json_exact` for a `dict` (what `model_validate` gets): only
    /// exact `dict`, `list`, `str` and `int` objects; `ValueError` otherwise.
    #[staticmethod]
    fn from_dict_exact(document: &Bound<'_, PyAny>) -> PyResult<PyMetadata> {
        exact_dict(document)
    }

    /// Dynamo's JSON: what pydantic's `model_dump_json()` writes for the
    /// model `model` builds.
    fn to_json(&self) -> PyResult<String> {
        self.write_json().map_err(PyRuntimeError::new_err)
    }

    /// `nixl_metadata` as `to_json` writes it.
    #[getter]
    fn nixl_metadata(&self) -> &str {
        self.encoded()
    }

    /// 1 (readable: the peer READs) or 2 (writable: the peer WRITEs).
    #[getter]
    fn operation_kind(&self) -> u8 {
        self.inner.operation_kind().into()
    }

    /// The key the peer's notification carries.
    #[getter]
    fn notification_key(&self) -> &str {
        self.inner.notification_key()
    }

    /// `(device, ptr, size)` of each remote descriptor.
    #[getter]
    fn descriptors(&self) -> Vec<(String, u64, u64)> {
        self.inner
            .descriptors()
            .iter()
            .map(|d| (d.device.to_string(), d.ptr, d.size))
            .collect()
    }

    /// The metadata as an instance of `cls` (pydantic's `RdmaMetadata`), its
    /// `descriptors` instances of `descriptor_cls` (`SerializedDescriptor`),
    /// built as pydantic-core builds validated instances: `__dict__` in field
    /// order, every field set, no extra, no private attributes. No validator
    /// runs: the caller vouches that these are the two models, and that
    /// pydantic would have validated the metadata into these values.
    /// Returned with the [`Snapshot`] of what it was built with.
    fn model<'py>(
        &self,
        cls: &Bound<'py, PyType>,
        descriptor_cls: &Bound<'py, PyType>,
    ) -> PyResult<(Bound<'py, PyAny>, Snapshot)> {
        let py = cls.py();
        let _paused = GcPaused::new(py);
        let names = item_fields(py);
        let shells = Shells::new(descriptor_cls, &names)?;
        let mut items = Vec::with_capacity(self.inner.descriptors().len());
        let mut held = Vec::with_capacity(self.inner.descriptors().len());
        // Blocks of one buffer share a device: one string for a run of them.
        let mut last: Option<(Device, Bound<'py, PyString>)> = None;
        let mut last_size: Option<(u64, Bound<'py, PyInt>)> = None;
        for d in self.inner.descriptors() {
            let device = match &last {
                Some((device, text)) if *device == d.device => text.clone(),
                _ => {
                    let text = PyString::new(py, &d.device.to_string());
                    last = Some((d.device, text.clone()));
                    text
                }
            };
            // Blocks share a size too: one int for a run of them.
            let size = match &last_size {
                Some((value, int)) if *value == d.size => int.clone(),
                _ => {
                    let int = d.size.into_pyobject(py)?;
                    last_size = Some((d.size, int.clone()));
                    int
                }
            };
            let ptr = d.ptr.into_pyobject(py)?.into_any();
            let dict = PyDict::new(py);
            dict.set_item(names[0], &device)?;
            dict.set_item(names[1], &ptr)?;
            dict.set_item(names[2], &size)?;
            let item = shells.build(dict.clone())?;
            held.push(HeldItem {
                item: item.clone().unbind(),
                dict: dict.into_any().unbind(),
                values: [
                    device.into_any().unbind(),
                    ptr.unbind(),
                    size.into_any().unbind(),
                ],
            });
            items.push(item);
        }
        let fields = model_fields(py);
        let values = [
            PyList::new(py, items)?.into_any(),
            PyString::new(py, self.encoded()).into_any(),
            PyString::new(py, self.notification_key()).into_any(),
            self.operation_kind().into_pyobject(py)?.into_any(),
        ];
        let dict = PyDict::new(py);
        for (name, value) in fields.iter().zip(&values) {
            dict.set_item(name, value)?;
        }
        let model = Shells::new(cls, &fields)?.build(dict.clone())?;
        let snapshot = Snapshot {
            dict: dict.into_any().unbind(),
            values: values.map(Bound::unbind),
            item_type: descriptor_cls.clone().unbind(),
            items: held,
        };
        Ok((model, snapshot))
    }

    /// The [`Snapshot`] of `model` (an `RdmaMetadata` pydantic built) as it
    /// is now; `None` for a model whose fields are not where pydantic keeps
    /// them (its twin is then never reused).
    #[staticmethod]
    fn snapshot(model: &Bound<'_, PyAny>) -> PyResult<Option<Snapshot>> {
        Snapshot::of(model)
    }
}

/// What a model held when its native twin was made (or parsed), by
/// identity: its `__dict__`, the objects of its four fields, and for each
/// descriptor its object, type, `__dict__` and the objects of its three
/// fields. A frozen pydantic model can still be changed past its
/// `__setattr__` (`object.__setattr__`, its `__dict__`, its list in place),
/// and `holds` tells whether it was: a twin is used only while its model
/// holds exactly what the twin was made from. Field values are immutable
/// (`str`, `int`), and the snapshot keeps each alive, so one of them still
/// in its place is the value the twin has. Holds the model's parts, never
/// the model (whose weak reference retires the twin).
#[pyclass(frozen, module = "nixl_connect._native", name = "Snapshot")]
pub(crate) struct Snapshot {
    dict: Py<PyAny>,
    /// `descriptors` (a `list`), `nixl_metadata`, `notification_key`,
    /// `operation_kind`.
    values: [Py<PyAny>; 4],
    /// The one type of every descriptor.
    item_type: Py<PyType>,
    items: Vec<HeldItem>,
}

/// A descriptor of a [`Snapshot`]: its object, `__dict__`, and `device`,
/// `ptr` and `size` objects.
struct HeldItem {
    item: Py<PyAny>,
    dict: Py<PyAny>,
    values: [Py<PyAny>; 3],
}

/// `obj.__dict__` as `object` keeps it (no class attribute consulted), or
/// `None`, with no exception left set.
fn dict_of<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyDict>> {
    let py = obj.py();
    // SAFETY: a live object, the GIL held; a new reference or NULL with an
    // exception set, which is cleared.
    let dict = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyObject_GenericGetDict(obj.as_ptr(), std::ptr::null_mut()),
        )
    };
    dict.ok()?.cast_into_exact::<PyDict>().ok()
}

/// The object `dict[name]` holds now, if any (no exception left set).
fn field<'py>(dict: &Bound<'py, PyDict>, name: &Bound<'py, PyString>) -> Option<Bound<'py, PyAny>> {
    dict.get_item(name).ok().flatten()
}

/// `RdmaMetadata`'s fields, in the order a snapshot keeps their values.
fn model_fields(py: Python<'_>) -> [&Bound<'_, PyString>; 4] {
    [
        intern!(py, "descriptors"),
        intern!(py, "nixl_metadata"),
        intern!(py, "notification_key"),
        intern!(py, "operation_kind"),
    ]
}

/// `SerializedDescriptor`'s fields, in the order a snapshot keeps them.
fn item_fields(py: Python<'_>) -> [&Bound<'_, PyString>; 3] {
    [
        intern!(py, "device"),
        intern!(py, "ptr"),
        intern!(py, "size"),
    ]
}

/// The values of `names` in `dict`, in order; `None` if one is missing.
fn fields_in<'py, const N: usize>(
    dict: &Bound<'py, PyDict>,
    names: [&Bound<'py, PyString>; N],
) -> Option<[Py<PyAny>; N]> {
    let mut values = Vec::with_capacity(N);
    for name in names {
        values.push(field(dict, name)?.unbind());
    }
    values.try_into().ok()
}

impl Snapshot {
    fn of(model: &Bound<'_, PyAny>) -> PyResult<Option<Snapshot>> {
        let py = model.py();
        let fields = model_fields(py);
        let names = item_fields(py);
        let Some(dict) = dict_of(model) else {
            return Ok(None);
        };
        let Some(values) = fields_in(&dict, fields) else {
            return Ok(None);
        };
        let Ok(list) = values[0].bind(py).cast_exact::<PyList>() else {
            return Ok(None);
        };
        let mut item_type = None;
        let mut items = Vec::with_capacity(list.len());
        for item in list.iter() {
            let ty = item.get_type();
            match &item_type {
                None => item_type = Some(ty),
                Some(first) if first.is(&ty) => {}
                Some(_) => return Ok(None),
            }
            let Some(item_dict) = dict_of(&item) else {
                return Ok(None);
            };
            let Some(values) = fields_in(&item_dict, names) else {
                return Ok(None);
            };
            items.push(HeldItem {
                item: item.unbind(),
                dict: item_dict.into_any().unbind(),
                values,
            });
        }
        // Without descriptors no item is ever compared with it.
        let item_type = item_type
            .unwrap_or_else(|| py.get_type::<PyDict>())
            .unbind();
        Ok(Some(Snapshot {
            dict: dict.into_any().unbind(),
            values,
            item_type,
            items,
        }))
    }
}

#[pymethods]
impl Snapshot {
    /// Whether `model` holds exactly what it held when this was taken.
    /// Identity checks only: per descriptor, a few pointer comparisons and
    /// three dictionary lookups (it runs before every dump of a parsed model,
    /// so it goes to the C API directly).
    fn holds(&self, model: &Bound<'_, PyAny>) -> bool {
        let py = model.py();
        let fields = model_fields(py);
        let names = item_fields(py).map(|name| name.as_ptr());
        let dict = self.dict.as_ptr();
        // SAFETY: the GIL is held (`model` is bound); every pointer is a live
        // object: `model`, and the snapshot's own strong references (the
        // dicts are exact `dict`s, the list an exact `list`). Borrowed
        // results are compared, never kept.
        unsafe {
            if !dict_is(model.as_ptr(), dict)
                || !fields
                    .iter()
                    .zip(&self.values)
                    .all(|(name, value)| entry_is(dict, name.as_ptr(), value.as_ptr()))
            {
                return false;
            }
            let list = self.values[0].as_ptr();
            if ffi::PyList_Size(list) != ffi::Py_ssize_t::try_from(self.items.len()).unwrap_or(-1) {
                ffi::PyErr_Clear();
                return false;
            }
            let item_type = self.item_type.as_ptr().cast::<ffi::PyTypeObject>();
            self.items.iter().zip(0..).all(|(held, i)| {
                let item = ffi::PyList_GetItem(list, i);
                let item_dict = held.dict.as_ptr();
                item == held.item.as_ptr()
                    && ffi::Py_TYPE(item) == item_type
                    && dict_is(item, item_dict)
                    && names
                        .iter()
                        .zip(&held.values)
                        .all(|(&name, value)| entry_is(item_dict, name, value.as_ptr()))
            })
        }
    }
}

/// Whether `obj`'s `__dict__`, as `object` keeps it, is `dict`.
///
/// # Safety
///
/// The GIL is held; `obj` is a live object.
unsafe fn dict_is(obj: *mut ffi::PyObject, dict: *mut ffi::PyObject) -> bool {
    // SAFETY: the caller's; a new reference (dropped at once: only its
    // address is compared) or NULL with an exception set, which is cleared.
    unsafe {
        let now = ffi::PyObject_GenericGetDict(obj, std::ptr::null_mut());
        if now.is_null() {
            ffi::PyErr_Clear();
            return false;
        }
        ffi::Py_DECREF(now);
        now == dict
    }
}

/// Whether `dict[name]` is `value` (the same object).
///
/// # Safety
///
/// The GIL is held; `dict` is a live exact `dict`, `name` a live `str`.
unsafe fn entry_is(
    dict: *mut ffi::PyObject,
    name: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
) -> bool {
    // SAFETY: the caller's; a borrowed reference, or NULL (missing, or an
    // exception, cleared).
    unsafe {
        let now = ffi::PyDict_GetItemWithError(dict, name);
        if now.is_null() {
            ffi::PyErr_Clear();
            return false;
        }
        now == value
    }
}

/// The cyclic garbage collector paused while it lives (if it was enabled),
/// for a burst of allocations: CPython's default threshold would start a
/// collection every few hundred new instances, and the survivors (all of
/// them) a full one every few documents, each traversing every object of
/// the process, so a large document's cost would grow with the process's
/// heap. Paused, a document costs one collection of its young objects,
/// after. Why: the Outcome of docs/decisions/0011-registered-memory-and-views.md,
/// Python metadata. Nothing else can see the pause: the GIL is held
/// throughout and no Python code runs while it lasts.
struct GcPaused(bool);

impl GcPaused {
    fn new(_py: Python<'_>) -> GcPaused {
        // SAFETY: the GIL is held (`_py`); returns whether it was enabled.
        GcPaused(unsafe { ffi::PyGC_Disable() } == 1)
    }
}

impl Drop for GcPaused {
    fn drop(&mut self) {
        if self.0 {
            // SAFETY: dropped where it was made, the GIL still held (the
            // builder never releases it).
            unsafe { ffi::PyGC_Enable() };
        }
    }
}

/// Builds instances of one pydantic model class without validation, as
/// pydantic-core's model validator does once it has the field values: the
/// class's `tp_new` with no arguments, then `__dict__`, `__pydantic_extra__`
/// (`None`), `__pydantic_private__` (`None`) and `__pydantic_fields_set__`
/// (every field) set past the model's own `__setattr__` (frozen models
/// refuse that one).
struct Shells<'py> {
    cls: Bound<'py, PyType>,
    new: ffi::newfunc,
    args: Bound<'py, PyTuple>,
    /// The field names, copied into each instance's own set.
    fields: Bound<'py, PySet>,
    none: Bound<'py, PyAny>,
    names: [Bound<'py, PyString>; 4],
}

impl<'py> Shells<'py> {
    fn new(cls: &Bound<'py, PyType>, fields: &[&Bound<'py, PyString>]) -> PyResult<Shells<'py>> {
        let py = cls.py();
        // SAFETY: `cls` is a live type object (the GIL is held); `Py_tp_new`
        // is a valid slot id for every type (static ones too, since 3.10).
        let slot = unsafe { ffi::PyType_GetSlot(cls.as_type_ptr(), ffi::Py_tp_new) };
        if slot.is_null() {
            return Err(PyValueError::new_err(format!(
                "{cls} cannot be instantiated (no tp_new)"
            )));
        }
        // SAFETY: the `Py_tp_new` slot holds a `newfunc`.
        let new = unsafe { std::mem::transmute::<*mut std::ffi::c_void, ffi::newfunc>(slot) };
        Ok(Shells {
            cls: cls.clone(),
            new,
            args: PyTuple::empty(py),
            fields: PySet::new(py, fields)?,
            none: py.None().into_bound(py),
            names: [
                intern!(py, "__dict__").clone(),
                intern!(py, "__pydantic_extra__").clone(),
                intern!(py, "__pydantic_private__").clone(),
                intern!(py, "__pydantic_fields_set__").clone(),
            ],
        })
    }

    /// An instance whose `__dict__` is `dict` (the fields' values, in field
    /// order).
    fn build(&self, dict: Bound<'py, PyDict>) -> PyResult<Bound<'py, PyAny>> {
        let py = self.cls.py();
        // SAFETY: `tp_new` of `cls`, called with `cls` itself, an empty
        // argument tuple and no keywords (allowed: NULL `kwds`), the GIL
        // held; it returns a new reference or NULL with an exception set.
        let instance = unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                (self.new)(
                    self.cls.as_type_ptr(),
                    self.args.as_ptr(),
                    std::ptr::null_mut(),
                ),
            )
        }?;
        // SAFETY: `fields` is a live set (the GIL is held); `PySet_New`
        // returns a new reference to a new set of its items, or NULL with an
        // exception set.
        let fields_set =
            unsafe { Bound::from_owned_ptr_or_err(py, ffi::PySet_New(self.fields.as_ptr())) }?;
        let [dict_name, extra, private, fields_name] = &self.names;
        force_setattr(&instance, dict_name, dict.as_any())?;
        force_setattr(&instance, extra, &self.none)?;
        force_setattr(&instance, private, &self.none)?;
        force_setattr(&instance, fields_name, &fields_set)?;
        Ok(instance)
    }
}

/// `object.__setattr__(target, name, value)`: past the class's `__setattr__`.
fn force_setattr(
    target: &Bound<'_, PyAny>,
    name: &Bound<'_, PyString>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    // SAFETY: three live objects, the GIL held; the call borrows them.
    let status =
        unsafe { ffi::PyObject_GenericSetAttr(target.as_ptr(), name.as_ptr(), value.as_ptr()) };
    if status == 0 {
        Ok(())
    } else {
        Err(PyErr::fetch(target.py()))
    }
}

/// A document's fields as given, before the core validates them.
struct Given<'a> {
    descriptors: Vec<GivenDescriptor<'a>>,
    nixl_metadata: Cow<'a, str>,
    notification_key: Cow<'a, str>,
    operation_kind: u64,
}

/// One descriptor as given: its device string as written.
struct GivenDescriptor<'a> {
    device: Cow<'a, str>,
    ptr: u64,
    size: u64,
}

/// The core's metadata from `given`, keeping `nixl_metadata` as given; an
/// error for anything the core refuses, and for a device string that is not
/// in the form Dynamo writes (pydantic keeps `"GPU:1"` as `"gpu:1"`, the core
/// reads it as `cuda:1`: the model would differ).
fn validated(given: Given<'_>) -> Result<PyMetadata, Error> {
    let mut descriptors = Vec::with_capacity(given.descriptors.len());
    let mut last: Option<(&str, Device)> = None;
    for (i, d) in given.descriptors.iter().enumerate() {
        let device = match last {
            Some((text, device)) if text == d.device => device,
            _ => {
                let device: Device = d.device.parse()?;
                if device.to_string() != d.device {
                    return Err(Error::invalid_metadata(
                        format!("descriptors[{i}].device"),
                        format!("{:?} is not written as {device}", d.device),
                    ));
                }
                last = Some((&d.device, device));
                device
            }
        };
        descriptors.push(SerializedDescriptor {
            device,
            ptr: d.ptr,
            size: d.size,
        });
    }
    let operation_kind = OperationKind::try_from(given.operation_kind)?;
    let agent_metadata = decode_agent_metadata_cached(&given.nixl_metadata)?;
    let inner = RdmaMetadata::new(
        operation_kind,
        descriptors,
        agent_metadata,
        given.notification_key.into_owned(),
    )?;
    Ok(PyMetadata::with_encoded(
        inner,
        given.nixl_metadata.into_owned(),
    ))
}

fn exact_json(json: &[u8]) -> Result<PyMetadata, Error> {
    check_json_len(json.len())?;
    let given: Given<'_> =
        serde_json::from_slice(json).map_err(|e| Error::invalid_metadata("json", e.to_string()))?;
    validated(given)
}

fn exact_dict(document: &Bound<'_, PyAny>) -> PyResult<PyMetadata> {
    let py = document.py();
    let dict = document
        .cast_exact::<PyDict>()
        .map_err(|_| not_exact("the document is not a dict"))?;
    if dict.len() != DOCUMENT_FIELDS.len() {
        return Err(not_exact(
            "the document does not have exactly its four fields",
        ));
    }
    let list = item(dict, intern!(py, "descriptors"))?;
    let list = list
        .cast_exact::<PyList>()
        .map_err(|_| not_exact("descriptors is not a list"))?;
    check_descriptor_count(list.len()).map_err(to_py)?;
    let names = item_fields(py);
    // The device strings are borrowed from these objects.
    let mut devices = Vec::with_capacity(list.len());
    let mut numbers = Vec::with_capacity(list.len());
    for entry in list.iter() {
        let entry = entry
            .cast_into_exact::<PyDict>()
            .map_err(|_| not_exact("a descriptor is not a dict"))?;
        if entry.len() != DESCRIPTOR_FIELDS.len() {
            return Err(not_exact(
                "a descriptor does not have exactly its three fields",
            ));
        }
        devices.push(item(&entry, names[0])?);
        numbers.push((
            exact_int(&item(&entry, names[1])?, "ptr")?,
            exact_int(&item(&entry, names[2])?, "size")?,
        ));
    }
    let mut descriptors = Vec::with_capacity(devices.len());
    for (device, (ptr, size)) in devices.iter().zip(numbers) {
        descriptors.push(GivenDescriptor {
            device: Cow::Borrowed(exact_str(device, "device")?),
            ptr,
            size,
        });
    }
    let nixl_metadata = item(dict, intern!(py, "nixl_metadata"))?;
    let notification_key = item(dict, intern!(py, "notification_key"))?;
    let operation_kind = item(dict, intern!(py, "operation_kind"))?;
    let given = Given {
        descriptors,
        nixl_metadata: Cow::Borrowed(exact_str(&nixl_metadata, "nixl_metadata")?),
        notification_key: Cow::Borrowed(exact_str(&notification_key, "notification_key")?),
        operation_kind: exact_int(&operation_kind, "operation_kind")?,
    };
    validated(given).map_err(to_py)
}

/// The `ValueError` of a document `from_dict_exact` leaves to pydantic.
fn not_exact(what: &str) -> PyErr {
    PyValueError::new_err(format!(
        "{what}: not exactly what pydantic would keep as is"
    ))
}

/// `dict[name]`; `ValueError` if it is missing.
fn item<'py>(
    dict: &Bound<'py, PyDict>,
    name: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    dict.get_item(name)?
        .ok_or_else(|| not_exact(&format!("no {name}")))
}

/// The text of an exact `str`; `ValueError` for anything else (subclasses
/// included) and for a string that is not valid UTF-8 (lone surrogates).
fn exact_str<'a>(value: &'a Bound<'_, PyAny>, what: &str) -> PyResult<&'a str> {
    value
        .cast_exact::<PyString>()
        .map_err(|_| not_exact(what))?
        .to_str()
        .map_err(|_| not_exact(what))
}

/// The value of an exact `int` within `u64`; `ValueError` for anything else
/// (`bool` too).
fn exact_int(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if !value.is_exact_instance_of::<PyInt>() {
        return Err(not_exact(what));
    }
    value.extract::<u64>().map_err(|_| not_exact(what))
}

// What `from_json_exact` reads. Written by hand rather than derived: serde's
// derived structs also read arrays (`[[...], "b64:...", "key", 1]`), which
// pydantic refuses.

/// A field name of the document or of a descriptor.
enum Field {
    Descriptors,
    NixlMetadata,
    NotificationKey,
    OperationKind,
    Device,
    Ptr,
    Size,
}

const DOCUMENT_FIELDS: &[&str] = &[
    "descriptors",
    "nixl_metadata",
    "notification_key",
    "operation_kind",
];
const DESCRIPTOR_FIELDS: &[&str] = &["device", "ptr", "size"];

impl Field {
    fn name(&self) -> &'static str {
        match self {
            Field::Descriptors => "descriptors",
            Field::NixlMetadata => "nixl_metadata",
            Field::NotificationKey => "notification_key",
            Field::OperationKind => "operation_kind",
            Field::Device => "device",
            Field::Ptr => "ptr",
            Field::Size => "size",
        }
    }
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Field, D::Error> {
        struct Names;
        impl Visitor<'_> for Names {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
                Ok(match v {
                    "descriptors" => Field::Descriptors,
                    "nixl_metadata" => Field::NixlMetadata,
                    "notification_key" => Field::NotificationKey,
                    "operation_kind" => Field::OperationKind,
                    "device" => Field::Device,
                    "ptr" => Field::Ptr,
                    "size" => Field::Size,
                    other => return Err(E::unknown_field(other, DOCUMENT_FIELDS)),
                })
            }
        }
        deserializer.deserialize_identifier(Names)
    }
}

/// A string, borrowed from the input unless it has escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Text<'de>, D::Error> {
        struct Strings;
        impl<'de> Visitor<'de> for Strings {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(Strings)
    }
}

/// Sets a field read once; an error if it was already read.
fn once<T, E: de::Error>(slot: &mut Option<T>, name: &'static str, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(name));
    }
    *slot = Some(value);
    Ok(())
}

impl<'de> Deserialize<'de> for Given<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Given<'de>, D::Error> {
        struct Document;
        impl<'de> Visitor<'de> for Document {
            type Value = Given<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RdmaMetadata object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Given<'de>, A::Error> {
                let (mut descriptors, mut nixl_metadata, mut notification_key, mut kind) =
                    (None, None, None, None);
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Descriptors => once(
                            &mut descriptors,
                            "descriptors",
                            map.next_value::<Descriptors<'de>>()?.0,
                        )?,
                        Field::NixlMetadata => once(
                            &mut nixl_metadata,
                            "nixl_metadata",
                            map.next_value::<Text<'de>>()?.0,
                        )?,
                        Field::NotificationKey => once(
                            &mut notification_key,
                            "notification_key",
                            map.next_value::<Text<'de>>()?.0,
                        )?,
                        Field::OperationKind => {
                            once(&mut kind, "operation_kind", map.next_value::<u64>()?)?;
                        }
                        Field::Device | Field::Ptr | Field::Size => {
                            return Err(de::Error::unknown_field(field.name(), DOCUMENT_FIELDS));
                        }
                    }
                }
                Ok(Given {
                    descriptors: descriptors
                        .ok_or_else(|| de::Error::missing_field("descriptors"))?,
                    nixl_metadata: nixl_metadata
                        .ok_or_else(|| de::Error::missing_field("nixl_metadata"))?,
                    notification_key: notification_key
                        .ok_or_else(|| de::Error::missing_field("notification_key"))?,
                    operation_kind: kind
                        .ok_or_else(|| de::Error::missing_field("operation_kind"))?,
                })
            }
        }
        deserializer.deserialize_map(Document)
    }
}

/// The descriptor list, stopped at [`MAX_DESCRIPTORS`] before it grows past.
struct Descriptors<'a>(Vec<GivenDescriptor<'a>>);

impl<'de> Deserialize<'de> for Descriptors<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Descriptors<'de>, D::Error> {
        struct List;
        impl<'de> Visitor<'de> for List {
            type Value = Descriptors<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {MAX_DESCRIPTORS} descriptors")
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Descriptors<'de>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(d) = seq.next_element::<GivenDescriptor<'de>>()? {
                    if out.len() == MAX_DESCRIPTORS {
                        return Err(de::Error::custom(format_args!(
                            "more than {MAX_DESCRIPTORS} descriptors"
                        )));
                    }
                    out.push(d);
                }
                Ok(Descriptors(out))
            }
        }
        deserializer.deserialize_seq(List)
    }
}

impl<'de> Deserialize<'de> for GivenDescriptor<'de> {
    fn deserialize<D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<GivenDescriptor<'de>, D::Error> {
        struct Descriptor;
        impl<'de> Visitor<'de> for Descriptor {
            type Value = GivenDescriptor<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a SerializedDescriptor object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<GivenDescriptor<'de>, A::Error> {
                let (mut device, mut ptr, mut size) = (None, None, None);
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Device => {
                            once(&mut device, "device", map.next_value::<Text<'de>>()?.0)?;
                        }
                        Field::Ptr => once(&mut ptr, "ptr", map.next_value::<u64>()?)?,
                        Field::Size => once(&mut size, "size", map.next_value::<u64>()?)?,
                        other => {
                            return Err(de::Error::unknown_field(other.name(), DESCRIPTOR_FIELDS));
                        }
                    }
                }
                Ok(GivenDescriptor {
                    device: device.ok_or_else(|| de::Error::missing_field("device"))?,
                    ptr: ptr.ok_or_else(|| de::Error::missing_field("ptr"))?,
                    size: size.ok_or_else(|| de::Error::missing_field("size"))?,
                })
            }
        }
        deserializer.deserialize_map(Descriptor)
    }
}
