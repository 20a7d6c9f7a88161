//! The core's errors as the Python exceptions Dynamo raises for the same cases.

use descriptor_core::Error;
use pyo3::PyErr;
use pyo3::exceptions::{
    PyImportError, PyPermissionError, PyRuntimeError, PyTimeoutError, PyValueError,
};

use crate::runtime;

/// Maps an error of the Rust API to the exception a Dynamo caller expects:
/// bad arguments are `ValueError` (for storage transfers too: a file that
/// cannot be a segment, a read-only file WRITten, a READ past a file's end,
/// an `O_DIRECT` segment or its memory unaligned),
/// a wrong kind of metadata and failed transfers `RuntimeError`, a missing NIXL runtime `ImportError` (Dynamo's
/// deferred import error, the fix first: `runtime`), a wait that gave up
/// `TimeoutError`.
pub(crate) fn to_py(error: Error) -> PyErr {
    if let Error::BackendUnavailable {
        backend: "nixl",
        tried,
        hint,
        ..
    } = &error
    {
        return PyImportError::new_err(runtime::missing_runtime_message(tried, hint.as_deref()));
    }
    let message = error.to_string();
    match error {
        Error::InvalidDevice { .. }
        | Error::InvalidDescriptor(_)
        | Error::InvalidMetadata { .. }
        | Error::EmptyDescriptorList { .. }
        | Error::DescriptorCountMismatch { .. }
        | Error::SizeMismatch { .. }
        | Error::MixedDevices { .. }
        | Error::ReadOnlyBuffer { .. }
        | Error::InvalidSetting { .. }
        | Error::InvalidFile(_)
        | Error::ReadOnlyFile { .. }
        | Error::PastEndOfFile { .. }
        | Error::UnalignedDirectIo { .. } => PyValueError::new_err(message),
        Error::Unauthenticated { .. } => PyPermissionError::new_err(message),
        Error::BackendUnavailable { .. } => PyImportError::new_err(message),
        Error::TimedOut(_) => PyTimeoutError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}
