//! The native `Connector`: a core [`Connector`] over NIXL or the process-wide
//! loopback fabric, and the ways to start an operation (the four of
//! Dynamo's, and READs and WRITEs of files).

use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use backend_loopback::{Fabric, LoopbackBackend};
use backend_nixl::NixlBackend;
use descriptor_core::faults::{Faults, Faulty};
use descriptor_core::metrics::Metered;
use descriptor_core::{
    Connector, ConnectorBuilder, Descriptor, Error, PeerKeys, QuarantinePolicy, RegistrationBackend,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::descriptor::PyDescriptor;
use crate::error::to_py;
use crate::file::PyFileSegment;
use crate::fork;
use crate::log;
use crate::metadata::PyMetadata;
use crate::metrics::PyMetrics;
use crate::operation::{AnyOp, PyOperation};

/// Backends a connector can be built over.
pub(crate) const BACKENDS: &[&str] = &["nixl", "loopback"];

/// A connector (`nixl_connect.Connector` creates one on first use).
#[pyclass(frozen, module = "nixl_connect._native", name = "Connector")]
pub(crate) struct PyConnector {
    /// Dropped unless this is a forked child (see `fork`), where it leaks.
    inner: ManuallyDrop<Connector>,
    /// Fault injection for tests (loopback connectors run under [`Faulty`]).
    faults: Option<Faults>,
    /// NIXL's UCX error handling mode, as the agent reported it (NIXL only).
    ucx_error_handling_mode: Option<String>,
    /// The backend's `RegistrationBackend::wait_assist`.
    wait_assist: Duration,
    /// What `agent_metadata` reads.
    agent: Agent,
}

/// The backend's agent, as `agent_metadata` reads it.
enum Agent {
    /// NIXL's metadata changes with every registration: asked each time.
    Nixl(Arc<NixlBackend>),
    /// The same, of a NIXL backend counted into metrics.
    MeteredNixl(Arc<Metered<NixlBackend>>),
    /// Loopback's blob names the fabric and the agent only: made once.
    Loopback(Vec<u8>),
}

impl Drop for PyConnector {
    fn drop(&mut self) {
        if !fork::forked() {
            // SAFETY: dropped once, here, and never used after.
            unsafe { ManuallyDrop::drop(&mut self.inner) }
        }
    }
}

impl PyConnector {
    pub(crate) fn inner(&self) -> &Connector {
        &self.inner
    }

    fn faults(&self) -> PyResult<&Faults> {
        self.faults
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("fault injection is for loopback connectors"))
    }
}

/// Which way the operation moves bytes through the local memory.
#[derive(Clone, Copy)]
enum Access {
    /// Peers or transfers only read it.
    Read,
    /// A transfer writes it.
    Written,
}

/// Takes the Rust descriptors out of `descriptors` for an operation of
/// `connector`; on any refusal gives back those already taken.
fn lend(
    py: Python<'_>,
    connector: &Bound<'_, PyConnector>,
    descriptors: &[Py<PyDescriptor>],
    access: Access,
) -> PyResult<Vec<Descriptor>> {
    log::refresh_if_stale(py);
    if descriptors.is_empty() {
        return Err(PyValueError::new_err(
            "Argument `local_descriptors` must not be an empty list.",
        ));
    }
    if let Access::Written = access {
        for (index, d) in descriptors.iter().enumerate() {
            let source = d.get().source();
            if !source.writable {
                return Err(PyValueError::new_err(format!(
                    "local descriptor {index} is read-only and cannot receive data: {}",
                    source.read_only_reason.unwrap_or("the memory is read-only")
                )));
            }
        }
    }
    let mut taken = Vec::with_capacity(descriptors.len());
    for (index, d) in descriptors.iter().enumerate() {
        match d.get().lend(py, index, Some(connector)) {
            Ok(descriptor) => taken.push(descriptor),
            Err(e) => {
                for (python, descriptor) in descriptors.iter().zip(taken) {
                    python.get().give_back(descriptor);
                }
                return Err(e);
            }
        }
    }
    if let Access::Written = access {
        for d in descriptors {
            d.get().record_written();
        }
    }
    Ok(taken)
}

/// The pairing errors of a READ or WRITE in Dynamo's words (its
/// `ActiveOperation` checks sizes and counts before NIXL sees them); other
/// errors as `to_py` maps them.
fn pairing_error(error: Error, local: usize) -> PyErr {
    match error {
        Error::SizeMismatch {
            local: l,
            remote: r,
            ..
        } if local == 1 => PyValueError::new_err(format!(
            "Local and remote descriptors must be the same size. {l} != {r}."
        )),
        Error::SizeMismatch {
            index,
            local: l,
            remote: r,
        } => PyValueError::new_err(format!(
            "Descriptor length mismatch: `local_descriptors` and `remote_descriptors` descriptor at {index} must have the same size. {l} != {r}."
        )),
        Error::DescriptorCountMismatch {
            local: l,
            remote: r,
        } if l > 1 && r > 1 => PyValueError::new_err(format!(
            "When `local_descriptors` and `remote_descriptors` are lists, they must have the same length. {l} != {r}."
        )),
        Error::DescriptorCountMismatch { .. } => PyValueError::new_err(
            "Both `local_descriptors` and `remote_descriptors` must be either lists or single descriptors.",
        ),
        other => to_py(other),
    }
}

/// The pairing errors of a storage transfer in the Python arguments' names
/// (`local_descriptors`, `segments`); other errors as `to_py` maps them.
fn file_pairing_error(error: Error) -> PyErr {
    match error {
        Error::DescriptorCountMismatch { local, remote } => PyValueError::new_err(format!(
            "`local_descriptors` and `segments` must be as many: {local} != {remote}."
        )),
        Error::SizeMismatch {
            index,
            local,
            remote,
        } => PyValueError::new_err(format!(
            "Local descriptor {index} and file segment {index} must be the same size. {local} != {remote}."
        )),
        Error::EmptyDescriptorList { .. } => {
            PyValueError::new_err("Argument `segments` must not be an empty list.")
        }
        other => to_py(other),
    }
}

/// The core segments the Python ones stand for (the operation owns clones:
/// the file stays open while it may touch it).
fn segments_of(segments: &[Py<PyFileSegment>]) -> Vec<descriptor_core::FileSegment> {
    segments.iter().map(|s| s.get().inner().clone()).collect()
}

/// `builder` with `keys` when given (else the core's default: the environment's).
fn with_keys(builder: ConnectorBuilder, keys: Option<PeerKeys>) -> ConnectorBuilder {
    match keys {
        Some(keys) => builder.peer_keys(keys),
        None => builder,
    }
}

/// The quarantine of a new connector: the environment's (or the default),
/// with what the caller gave in its place.
fn quarantine_policy(
    seconds: Option<f64>,
    readable_bytes: Option<usize>,
) -> PyResult<QuarantinePolicy> {
    let mut policy =
        QuarantinePolicy::from_env().map_err(|e| PyValueError::new_err(e.to_string()))?;
    if let Some(seconds) = seconds {
        let hold = if seconds == f64::INFINITY {
            None
        } else {
            Some(Duration::try_from_secs_f64(seconds).map_err(|_| {
                PyValueError::new_err(format!(
                    "Argument `quarantine_seconds` must be a non-negative number of seconds or `math.inf`; got {seconds}."
                ))
            })?)
        };
        policy = policy.with_hold(hold);
    }
    if let Some(bytes) = readable_bytes {
        policy = policy.with_readable_bytes(bytes);
    }
    Ok(policy)
}

#[pymethods]
impl PyConnector {
    /// A connector named `name` over `backend` (`"nixl"` or `"loopback"`).
    /// For NIXL, the runtime is looked for first in `site_packages` (the
    /// running interpreter's), then where `backend_nixl::runtime` looks, and
    /// `peer_failure_detection` is the agent's
    /// (`NixlBackendBuilder::peer_failure_detection`); loopback ignores it.
    #[new]
    ///
    /// `site_packages` defaults to `nixl_connect._search_paths()`, as every
    /// entry point that loads the runtime does (`crate::runtime::load`).
    ///
    /// `quarantine_seconds` (`inf`: forever) and `quarantine_readable_bytes`
    /// set the connector's `QuarantinePolicy`; each one not given is the
    /// core's `QuarantinePolicy::from_env`'s (ValueError for an invalid
    /// environment variable). `peer_keys` (the signing key first) are the
    /// connector's `PeerKeys` (ValueError if one is too short); without them,
    /// the core's `PeerKeys::from_env`.
    ///
    /// With `metrics`, the backend is wrapped in `Metered` counting into
    /// them (loopback's fault injection inside it, so that injected failures
    /// are counted as the connector sees them); without, it is not wrapped.
    #[pyo3(signature = (
        name,
        backend,
        site_packages=None,
        peer_failure_detection=true,
        quarantine_seconds=None,
        quarantine_readable_bytes=None,
        peer_keys=None,
        *,
        metrics=None,
    ))]
    // One parameter per keyword of the Python constructor.
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: &str,
        backend: &str,
        site_packages: Option<Vec<PathBuf>>,
        peer_failure_detection: bool,
        quarantine_seconds: Option<f64>,
        quarantine_readable_bytes: Option<usize>,
        peer_keys: Option<Vec<Vec<u8>>>,
        metrics: Option<PyRef<'_, PyMetrics>>,
    ) -> PyResult<PyConnector> {
        let quarantine = quarantine_policy(quarantine_seconds, quarantine_readable_bytes)?;
        let peer_keys = peer_keys
            .map(PeerKeys::new)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("Argument `peer_keys`: {e}")))?;
        fork::check()?;
        fork::watch();
        log::install(py)?;
        let mut faults = None;
        let mut ucx_error_handling_mode = None;
        let wait_assist;
        let agent;
        let inner = match backend {
            "loopback" => {
                let backend = LoopbackBackend::new(&Fabric::global(), name).map_err(to_py)?;
                agent = Agent::Loopback(backend.agent_metadata());
                let backend = Faulty::new(backend);
                faults = Some(backend.faults());
                wait_assist = backend.wait_assist();
                let builder = match &metrics {
                    Some(m) => Connector::builder(Metered::new(backend, m.inner())),
                    None => Connector::builder(backend),
                };
                with_keys(builder.quarantine(quarantine), peer_keys).build()
            }
            "nixl" => {
                crate::runtime::load(py, site_packages)?;
                let backend = crate::exit::detach(py, || {
                    NixlBackend::builder(name)
                        .peer_failure_detection(peer_failure_detection)
                        .build()
                })
                .map_err(to_py)?;
                ucx_error_handling_mode = backend
                    .plugin_params("UCX")
                    .map_err(to_py)?
                    .into_iter()
                    .flatten()
                    .find_map(|(key, value)| (key == "ucx_error_handling_mode").then_some(value));
                wait_assist = backend.wait_assist();
                let builder = match &metrics {
                    Some(m) => {
                        let backend = Arc::new(Metered::new(backend, m.inner()));
                        agent = Agent::MeteredNixl(Arc::clone(&backend));
                        Connector::builder_from_arc(backend)
                    }
                    None => {
                        let backend = Arc::new(backend);
                        agent = Agent::Nixl(Arc::clone(&backend));
                        Connector::builder_from_arc(backend)
                    }
                };
                with_keys(builder.quarantine(quarantine), peer_keys).build()
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown backend {other:?}; available: {}",
                    BACKENDS.join(", ")
                )));
            }
        };
        Ok(PyConnector {
            inner: ManuallyDrop::new(inner),
            faults,
            ucx_error_handling_mode,
            wait_assist,
            agent,
        })
    }

    /// What the quarantine keeps now: `(exposures, bytes, readable_bytes)`
    /// (`Connector::quarantined`).
    fn quarantined(&self) -> (usize, usize, usize) {
        let q = self.inner.quarantined();
        (q.exposures, q.bytes, q.readable_bytes)
    }

    /// Frees everything the quarantine keeps, whatever its window
    /// (`Connector::free_quarantined`); what was freed, as `quarantined`.
    fn free_quarantined(&self, py: Python<'_>) -> (usize, usize, usize) {
        let q = crate::exit::detach(py, || self.inner.free_quarantined());
        (q.exposures, q.bytes, q.readable_bytes)
    }

    /// The agent's metadata, what a peer loads to reach it: NIXL's full
    /// serialized agent (`NixlBackend::agent_metadata`, as Dynamo's
    /// `Connection.metadata` returns it), or loopback's blob.
    fn agent_metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        fork::check()?;
        let bytes = match &self.agent {
            Agent::Nixl(backend) => {
                crate::exit::detach(py, || backend.agent_metadata()).map_err(to_py)?
            }
            Agent::MeteredNixl(backend) => {
                crate::exit::detach(py, || backend.inner().agent_metadata()).map_err(to_py)?
            }
            Agent::Loopback(blob) => blob.clone(),
        };
        // Sealed as the connector's exposures are, when it has keys.
        let bytes = self.inner.seal_agent_metadata(bytes).map_err(to_py)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Loads the peer `metadata` names and makes the connection to it now
    /// (`Connector::warm_up`), GIL released.
    fn warm_up(&self, py: Python<'_>, metadata: &PyMetadata) -> PyResult<()> {
        fork::check()?;
        let inner = self.inner();
        crate::exit::detach(py, || inner.warm_up(metadata.inner())).map_err(to_py)
    }

    /// Peers this connector has loaded, in use or kept idle
    /// (`Connector::remote_agent_count` plus `idle_remote_agent_count`).
    #[getter]
    fn remote_agents(&self) -> usize {
        self.inner.remote_agent_count() + self.inner.idle_remote_agent_count()
    }

    /// Seconds a thread blocked on an active operation polls its transfer
    /// before it sleeps: the backend's transport policy
    /// (`RegistrationBackend::wait_assist`), which `nixl_connect.Connector`'s
    /// `await_spin` defaults to (capped).
    #[getter]
    fn wait_assist(&self) -> f64 {
        self.wait_assist.as_secs_f64()
    }

    /// Testing hook: NIXL's UCX error handling mode as the agent reports it
    /// (`"peer"` or `"none"`); `None` for loopback.
    #[getter]
    fn _ucx_error_handling_mode(&self) -> Option<&str> {
        self.ucx_error_handling_mode.as_deref()
    }

    /// Testing hook (loopback only): the next transfer this connector posts
    /// fails with `reason`, touching no memory.
    fn _fail_next_transfer(&self, reason: &str) -> PyResult<()> {
        self.faults()?.fail_next_transfer(reason);
        Ok(())
    }

    /// Testing hook (loopback only): the next transfer this connector posts
    /// stays in progress for `seconds` before moving any byte (cancelled
    /// meanwhile, it never moves one).
    fn _delay_next_transfer(&self, seconds: f64) -> PyResult<()> {
        let delay = Duration::try_from_secs_f64(seconds)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.faults()?.delay_next_transfer(delay);
        Ok(())
    }

    /// Testing hook (loopback only): the next transfer this connector posts
    /// stays in progress for `seconds`, then moves its bytes *even if it was
    /// cancelled meanwhile* (a transfer NIXL cannot abort), and lets go of
    /// the memory only after that.
    fn _drain_next_transfer(&self, seconds: f64) -> PyResult<()> {
        let delay = Duration::try_from_secs_f64(seconds)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.faults()?.drain_next_transfer(delay);
        Ok(())
    }

    /// Testing hook (loopback only): the next transfer this connector posts
    /// moves its bytes but its notification is lost.
    fn _drop_next_notification(&self) -> PyResult<()> {
        self.faults()?.drop_next_notification();
        Ok(())
    }

    /// The agent name peers know this connector by.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// `"nixl"` or `"loopback"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend_name()
    }

    /// Whether the backend can cut a peer off after an operation ends.
    #[getter]
    fn revocation_enforced(&self) -> bool {
        self.inner.revocation_enforced()
    }

    /// Backend registrations this connector has made so far (one per plain
    /// descriptor on first use, one per pool).
    #[getter]
    fn registrations(&self) -> u64 {
        self.inner.registrations()
    }

    /// Exposes the descriptors' memory for one peer to READ.
    fn create_readable(
        slf: &Bound<'_, Self>,
        descriptors: Vec<Py<PyDescriptor>>,
    ) -> PyResult<PyOperation> {
        let py = slf.py();
        let local = lend(py, slf, &descriptors, Access::Read)?;
        let inner = slf.get().inner();
        let op = crate::exit::detach(py, || inner.create_readable(local)).map_err(to_py)?;
        Ok(PyOperation::new(AnyOp::Readable(op), descriptors))
    }

    /// Exposes the descriptors' memory for one peer to WRITE.
    fn create_writable(
        slf: &Bound<'_, Self>,
        descriptors: Vec<Py<PyDescriptor>>,
    ) -> PyResult<PyOperation> {
        let py = slf.py();
        let local = lend(py, slf, &descriptors, Access::Written)?;
        let inner = slf.get().inner();
        let op = crate::exit::detach(py, || inner.create_writable(local)).map_err(to_py)?;
        Ok(PyOperation::new(AnyOp::Writable(op), descriptors))
    }

    /// READs the peer's readable memory (`metadata`) into the descriptors;
    /// posted before this returns. Sizes pair strictly (Dynamo's
    /// `ValueError`s).
    fn begin_read(
        slf: &Bound<'_, Self>,
        metadata: &PyMetadata,
        descriptors: Vec<Py<PyDescriptor>>,
    ) -> PyResult<PyOperation> {
        let py = slf.py();
        let local = lend(py, slf, &descriptors, Access::Written)?;
        let inner = slf.get().inner();
        let count = local.len();
        let op = crate::exit::detach(py, || inner.begin_read(metadata.inner(), local))
            .map_err(|e| pairing_error(e, count))?;
        Ok(PyOperation::new(AnyOp::Read(op), descriptors))
    }

    /// WRITEs the descriptors into the peer's writable memory (`metadata`);
    /// posted before this returns.
    fn begin_write(
        slf: &Bound<'_, Self>,
        descriptors: Vec<Py<PyDescriptor>>,
        metadata: &PyMetadata,
    ) -> PyResult<PyOperation> {
        let py = slf.py();
        let local = lend(py, slf, &descriptors, Access::Read)?;
        let inner = slf.get().inner();
        let count = local.len();
        let op = crate::exit::detach(py, || inner.begin_write(local, metadata.inner()))
            .map_err(|e| pairing_error(e, count))?;
        Ok(PyOperation::new(AnyOp::Write(op), descriptors))
    }

    /// WRITEs the descriptors into the file segments, pair by pair (same
    /// count, same sizes, files opened for writing: `ValueError`s); posted
    /// before this returns (`Connector::begin_file_write`).
    fn begin_file_write(
        slf: &Bound<'_, Self>,
        descriptors: Vec<Py<PyDescriptor>>,
        segments: Vec<Py<PyFileSegment>>,
    ) -> PyResult<PyOperation> {
        let py = slf.py();
        let files = segments_of(&segments);
        let local = lend(py, slf, &descriptors, Access::Read)?;
        let inner = slf.get().inner();
        let op = crate::exit::detach(py, || inner.begin_file_write(local, files))
            .map_err(file_pairing_error)?;
        Ok(PyOperation::storage(AnyOp::Write(op), descriptors))
    }

    /// READs the file segments into the descriptors, pair by pair (same
    /// count, same sizes, writable memory, each segment inside its file:
    /// `ValueError`s); posted before this returns
    /// (`Connector::begin_file_read`).
    fn begin_file_read(
        slf: &Bound<'_, Self>,
        segments: Vec<Py<PyFileSegment>>,
        descriptors: Vec<Py<PyDescriptor>>,
    ) -> PyResult<PyOperation> {
        let py = slf.py();
        let files = segments_of(&segments);
        let local = lend(py, slf, &descriptors, Access::Written)?;
        let inner = slf.get().inner();
        let op = crate::exit::detach(py, || inner.begin_file_read(files, local))
            .map_err(file_pairing_error)?;
        Ok(PyOperation::storage(AnyOp::Read(op), descriptors))
    }
}
