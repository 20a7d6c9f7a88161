//! The native half of the Python package `nixl_connect`: NVIDIA Dynamo's
//! `dynamo.nixl_connect` API (1.6.1) over `descriptor-core`, so that a Python
//! worker switches with its import line.
//!
//! The Python layer (`python/nixl_connect/__init__.py`) keeps Dynamo's names,
//! enums and pydantic models; everything else is here, over the Rust API:
//! - `descriptor::PyDescriptor`: a Python object's memory
//!   (tensor, NumPy/CuPy array, `bytes`, `bytearray`, raw tuple, DLPack) in a
//!   `MemoryBuffer` that keeps the object alive inside the Rust descriptor;
//! - `connector::PyConnector`: a core `Connector` over NIXL or
//!   the process-wide loopback fabric;
//! - `operation::PyOperation`: the core's operations, handing
//!   the memory back to the Python descriptors once no transfer can touch it;
//! - `pool::PyRegisteredMemory`: a Python object's memory registered once
//!   and described in parts (`RegisteredMemory`, `BlockPool`);
//! - `file::PyFileSegment`: a part of a file (a path opened, or a
//!   duplicated fd), the far side of a storage transfer
//!   (`Connector.begin_file_write` / `begin_file_read`);
//! - `metrics::PyMetrics`: transfer metrics that connectors made with
//!   them count into (`Connector(metrics=...)`), as OpenMetrics text or
//!   parsed families;
//! - `notifier::Notifier`: completion into asyncio through an
//!   eventfd the event loop watches, woken by the library's own wakers.
//!
//! Every blocking call and transfer runs with the GIL released; no lock of
//! this crate is held while Python runs or while the GIL is awaited.

mod connector;
mod descriptor;
mod device;
mod error;
mod exit;
mod export;
mod file;
mod fork;
mod held;
mod log;
mod memory;
mod metadata;
mod metrics;
mod notifier;
mod operation;
mod pool;
mod runtime;

use pyo3::prelude::*;

/// `nixl_connect._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<connector::PyConnector>()?;
    m.add_class::<descriptor::PyDescriptor>()?;
    m.add_class::<file::PyFileSegment>()?;
    m.add_class::<metadata::PyMetadata>()?;
    m.add_class::<metadata::Snapshot>()?;
    m.add_class::<metrics::PyMetrics>()?;
    m.add_class::<operation::PyOperation>()?;
    m.add_class::<pool::PyRegisteredMemory>()?;
    m.add_class::<notifier::Notifier>()?;
    m.add("MemoryBusy", m.py().get_type::<held::MemoryBusy>())?;
    m.add("BACKENDS", connector::BACKENDS.to_vec())?;
    m.add("TYPE_ERROR_MESSAGE", memory::TYPE_ERROR_MESSAGE)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEVICE_FORMS", device::DEVICE_FORMS)?;
    m.add_function(wrap_pyfunction!(device::parse_device, m)?)?;
    m.add_function(wrap_pyfunction!(set_nixl_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(nixl_runtime, m)?)?;
    m.add_function(wrap_pyfunction!(log::close_at_exit, m)?)?;
    Ok(())
}

/// Loads the NIXL runtime (looking first in `site_packages`, by default
/// `nixl_connect._search_paths()`: `runtime::load`) and returns the path of
/// its `libnixl_capi.so`; `ImportError` listing every place looked in, and
/// what to run, if there is none.
#[pyfunction]
#[pyo3(signature = (site_packages=None))]
fn nixl_runtime(
    py: Python<'_>,
    site_packages: Option<Vec<std::path::PathBuf>>,
) -> PyResult<String> {
    runtime::load(py, site_packages).map(|path| path.display().to_string())
}

/// Sets the native layer's log level for the process (`"info"`,
/// `"warning"`, `"error"`, `"fatal"` or `"off"`): NIXL's, and UCX's unless
/// `UCX_LOG_LEVEL` is set (`backend_nixl::LogLevel`), loading the NIXL
/// runtime first as a connector does (`runtime::load`, first in
/// `site_packages`, by default `nixl_connect._search_paths()`).
#[pyfunction]
#[pyo3(signature = (level, site_packages=None))]
fn set_nixl_log_level(
    py: Python<'_>,
    level: &str,
    site_packages: Option<Vec<std::path::PathBuf>>,
) -> PyResult<()> {
    use backend_nixl::LogLevel;
    let level = match level.to_ascii_lowercase().as_str() {
        "info" => LogLevel::Info,
        "warning" | "warn" => LogLevel::Warning,
        "error" => LogLevel::Error,
        "fatal" => LogLevel::Fatal,
        "off" => LogLevel::Off,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "unknown NIXL log level {other:?}: info, warning, error, fatal or off"
            )));
        }
    };
    runtime::load(py, site_packages)?;
    crate::exit::detach(py, || backend_nixl::runtime::set_log_level(level)).map_err(error::to_py)
}
