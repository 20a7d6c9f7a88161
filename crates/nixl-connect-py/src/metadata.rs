//! The native side of `RdmaMetadata`: parsed and validated once by the Rust
//! core (bounded, untrusted input), then handed to `begin_read`/`begin_write`.

use std::sync::Arc;

use descriptor_core::{OperationKind, RdmaMetadata};
use pyo3::prelude::*;

use crate::error::to_py;

/// Validated `RdmaMetadata` (the pydantic model in `nixl_connect` caches one).
#[pyclass(frozen, module = "nixl_connect._native", name = "Metadata")]
pub(crate) struct PyMetadata {
    inner: Arc<RdmaMetadata>,
}

impl PyMetadata {
    pub(crate) fn new(inner: RdmaMetadata) -> PyMetadata {
        PyMetadata {
            inner: Arc::new(inner),
        }
    }

    pub(crate) fn from_arc(inner: Arc<RdmaMetadata>) -> PyMetadata {
        PyMetadata { inner }
    }

    pub(crate) fn inner(&self) -> &RdmaMetadata {
        &self.inner
    }
}

pub(crate) fn kind_number(kind: OperationKind) -> u8 {
    match kind {
        OperationKind::Read => 1,
        OperationKind::Write => 2,
    }
}

#[pymethods]
impl PyMetadata {
    /// Parses Dynamo's JSON (`b64:` or legacy hex `nixl_metadata`); `ValueError`
    /// on anything invalid or over the bounds.
    #[staticmethod]
    fn from_json(py: Python<'_>, json: String) -> PyResult<PyMetadata> {
        // Decoding inflates the agent blob: no GIL needed for that.
        py.detach(|| RdmaMetadata::from_json(&json))
            .map(PyMetadata::new)
            .map_err(to_py)
    }

    /// Dynamo's JSON.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// 1 (readable: the peer READs) or 2 (writable: the peer WRITEs).
    #[getter]
    fn operation_kind(&self) -> u8 {
        kind_number(self.inner.operation_kind())
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
}
