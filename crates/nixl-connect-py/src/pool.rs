//! The native pools: memory registered once and described in parts
//! (`nixl_connect.RegisteredMemory` and `nixl_connect.BlockPool` wrap
//! [`PyRegisteredMemory`]).
//!
//! Python cannot move ownership, so a part is owned at two levels:
//!
//! - **here**, by a Python `Descriptor` (a view [`PyDescriptor`]) for its
//!   whole life: [`Claims`] hands a range to one descriptor and takes it back
//!   when that descriptor is dropped, so two live Python descriptors never
//!   describe the same bytes. A range the core still holds when its
//!   descriptor is dropped stays claimed, as *held*, until the core lets go
//!   (asked again whenever the pool counts or hands out parts): `free`,
//!   `checkout`, `blocks` and `view` never count or hand out bytes an
//!   operation still holds;
//! - **in the core**, by a Rust view carved from the core's
//!   [`RegisteredMemory`] when the descriptor is lent to an operation. The
//!   core refuses a range a Rust view still holds (an operation draining or
//!   leaked after its Python objects went away): that is the safety net, and
//!   the only check soundness rests on. A view an operation dropped (a failed
//!   post) is carved again on the next lend; the memory is never described
//!   afresh (that would register it twice).
//!
//! The memory is registered once, with the connector given or the first one
//! to lend a view, and deregistered after the last Rust view and the last
//! handle are gone (the core's region); the Python object stays pinned
//! (see `memory`) until then.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use descriptor_core::{Descriptor, RegisteredMemory};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::connector::PyConnector;
use crate::descriptor::PyDescriptor;
use crate::error::to_py;
use crate::fork;
use crate::memory::{PyMemory, Source, source_of};

/// The ranges live Python descriptors own, as disjoint `start -> end` pairs,
/// and those their descriptors left while the core still held them.
#[derive(Default)]
struct Claims {
    ranges: BTreeMap<usize, usize>,
    bytes: usize,
    /// Claimed ranges with no Python descriptor, which a Rust view (an
    /// operation draining or leaked) still holds: a subset of `ranges`.
    held: BTreeMap<usize, usize>,
}

impl Claims {
    /// The claimed range overlapping `[start, end)`, if any.
    fn overlapping(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        // Ranges are disjoint, so the one starting last before `end` ends
        // last among them: if it ends by `start`, none overlaps.
        let (&s, &e) = self.ranges.range(..end).next_back()?;
        (e > start).then_some((s, e))
    }

    /// Claims `[start, end)`, or names the claimed range in the way.
    fn take(&mut self, start: usize, end: usize) -> Result<(), (usize, usize)> {
        if let Some(taken) = self.overlapping(start, end) {
            return Err(taken);
        }
        self.ranges.insert(start, end);
        self.bytes += end - start;
        Ok(())
    }

    /// Gives `[start, end)` back (a descriptor's drop, or a held range the
    /// core let go of).
    fn give_back(&mut self, start: usize, end: usize) {
        if self.ranges.get(&start) == Some(&end) {
            self.ranges.remove(&start);
            self.held.remove(&start);
            self.bytes -= end - start;
        }
    }

    /// Keeps the claimed `[start, end)` of a dropped descriptor as held.
    fn hold(&mut self, start: usize, end: usize) {
        if self.ranges.get(&start) == Some(&end) {
            self.held.insert(start, end);
        }
    }

    /// Whether `[start, end)` is a held range.
    fn is_held(&self, start: usize, end: usize) -> bool {
        self.held.get(&start) == Some(&end)
    }

    /// The lowest `n` unclaimed blocks of `block` bytes among the first
    /// `count`, or `None` if fewer are free. Claims are block-aligned in a
    /// block pool, so the free blocks are those in the gaps between claims.
    /// `n` comes from Python: compared with the free count before anything
    /// is allocated for it (any `n` past the free blocks is `None`).
    fn lowest_free_blocks(&self, block: usize, count: usize, n: usize) -> Option<Vec<usize>> {
        if n > count.saturating_sub(self.bytes / block) {
            return None;
        }
        let mut found = Vec::with_capacity(n);
        let mut next = 0usize;
        let gaps = self
            .ranges
            .iter()
            .map(|(&s, &e)| (s, e))
            .chain(std::iter::once((count * block, count * block)));
        for (start, end) in gaps {
            let first_claimed = start / block;
            while next < first_claimed.min(count) && found.len() < n {
                found.push(next);
                next += 1;
            }
            if found.len() == n {
                return Some(found);
            }
            next = next.max(end.div_ceil(block));
        }
        (found.len() == n).then_some(found)
    }
}

/// The core's registered memory, once made, and the connector it was made with.
struct Registered {
    memory: RegisteredMemory,
    connector: Py<PyConnector>,
}

/// A Python object's memory, registered once and described in parts
/// (`nixl_connect.RegisteredMemory` and `nixl_connect.BlockPool`).
#[pyclass(frozen, module = "nixl_connect._native", name = "RegisteredMemory")]
pub(crate) struct PyRegisteredMemory {
    source: Source,
    /// Bytes per block of a block pool; `None`: parts at any offset.
    block: Option<usize>,
    /// Set once, by the first registration.
    registered: OnceLock<Registered>,
    claims: Mutex<Claims>,
    /// A registration failed to be kept: logged once.
    raced: AtomicBool,
}

impl PyRegisteredMemory {
    fn claims(&self) -> MutexGuard<'_, Claims> {
        // Every change is whole before anything can panic: a poisoned
        // lock's value is consistent.
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The claims, with every held range the core let go of given back.
    /// Asking the core takes only its allocator's leaf lock (no backend
    /// call), so it is asked under ours. A forked child asks nothing: it
    /// leaks what it inherited (see `fork`), and its parent's threads may
    /// have held that lock at the fork.
    fn settled_claims(&self) -> MutexGuard<'_, Claims> {
        let mut claims = self.claims();
        if claims.held.is_empty() || fork::forked() {
            return claims;
        }
        let Some(registered) = self.registered.get() else {
            return claims;
        };
        let let_go: Vec<(usize, usize)> = claims
            .held
            .iter()
            .filter(|&(&s, &e)| registered.memory.is_free(s, e - s))
            .map(|(&s, &e)| (s, e))
            .collect();
        for (start, end) in let_go {
            claims.give_back(start, end);
        }
        claims
    }

    /// Registers the memory with `connector` unless it is registered:
    /// `RuntimeError` if it is, with another connector. No lock is held
    /// while the backend registers (two threads racing both register; the
    /// first to publish wins and the other's registration is ended).
    pub(crate) fn ensure_registered(
        &self,
        py: Python<'_>,
        connector: &Bound<'_, PyConnector>,
    ) -> PyResult<&RegisteredMemory> {
        fork::check()?;
        if let Some(registered) = self.registered.get() {
            return check_connector(registered, connector);
        }
        // SAFETY: `self.source` came from `source_of`, which read the region
        // from the object `source.keep_alive` keeps alive (see `PyMemory`).
        let memory = unsafe { PyMemory::new(py, &self.source, Arc::new(())) };
        let core = connector.get().inner().clone();
        let made = match crate::exit::detach(py, move || RegisteredMemory::new(&core, memory)) {
            Ok(made) => made,
            // A backend that refuses registering the same memory twice
            // (NIXL from PR #1773 on) refuses this one if another thread's
            // registration came first: that one is the pool's.
            Err(error) => {
                return match self.registered.get() {
                    Some(registered) => check_connector(registered, connector),
                    None => Err(to_py(error)),
                };
            }
        };
        let mine = Registered {
            memory: made,
            connector: connector.clone().unbind(),
        };
        if let Err(lost) = self.registered.set(mine) {
            if !self.raced.swap(true, Ordering::Relaxed) {
                tracing::debug!("two threads registered one pool at once; one registration ended");
            }
            // Its drop deregisters: no lock of ours is held.
            crate::exit::detach(py, move || drop(lost.memory));
            drop(lost.connector);
        }
        match self.registered.get() {
            Some(registered) => check_connector(registered, connector),
            None => Err(PyRuntimeError::new_err(
                "the pool's registration vanished while it was made",
            )),
        }
    }

    /// Carves the core's view of `[offset, offset + len)` (the memory is
    /// registered): `None` if a Rust view still holds any of it.
    pub(crate) fn carve(&self, offset: usize, len: usize) -> Option<Descriptor> {
        self.registered.get()?.memory.carve(offset, len).ok()
    }

    /// Whether the memory is registered with a connector.
    pub(crate) fn registered(&self) -> bool {
        self.registered.get().is_some()
    }

    /// Gives back a range a Python descriptor owned (its drop), after the
    /// descriptor's own Rust view went back to the core. If a Rust view still
    /// holds any of it (an operation draining, or leaked after a cancel), the
    /// range stays claimed as held until the core lets go of it; it is never
    /// counted free or handed out meanwhile. A forked child keeps it held
    /// (its descriptor's view was leaked, and the core is not asked there).
    pub(crate) fn release(&self, offset: usize, len: usize) {
        let end = offset + len;
        let held = match self.registered.get() {
            _ if fork::forked() => true,
            // Only this descriptor carved these bytes: none but its view, in
            // an operation, can hold them.
            Some(registered) => !registered.memory.is_free(offset, len),
            None => false,
        };
        let mut claims = self.claims();
        if held {
            claims.hold(offset, end);
        } else {
            claims.give_back(offset, end);
        }
    }

    fn views(slf: &Bound<'_, Self>, parts: &[(usize, usize)]) -> Vec<PyDescriptor> {
        let py = slf.py();
        let this = slf.get();
        parts
            .iter()
            .map(|&(offset, len)| {
                PyDescriptor::view(
                    this.source.part(py, offset, len),
                    slf.clone().unbind(),
                    offset,
                )
            })
            .collect()
    }

    fn block_size_or_err(&self) -> PyResult<usize> {
        self.block.ok_or_else(|| {
            PyValueError::new_err(
                "this memory has no blocks: describe parts with `descriptor(offset, size)`",
            )
        })
    }

    fn block_count(&self) -> usize {
        self.block.map_or(0, |b| self.source.size / b)
    }
}

fn check_connector<'a>(
    registered: &'a Registered,
    connector: &Bound<'_, PyConnector>,
) -> PyResult<&'a RegisteredMemory> {
    if registered.connector.as_ptr() == connector.as_ptr() {
        return Ok(&registered.memory);
    }
    Err(PyRuntimeError::new_err(format!(
        "the memory is registered with connector {:?}, not {:?}: a pool registers with one connector",
        registered.connector.get().inner().name(),
        connector.get().inner().name()
    )))
}

impl Drop for PyRegisteredMemory {
    fn drop(&mut self) {
        // A forked child leaks what it inherited (see `fork`).
        if fork::forked()
            && let Some(registered) = self.registered.take()
        {
            std::mem::forget(registered);
        }
    }
}

#[pymethods]
impl PyRegisteredMemory {
    /// The memory `data` describes (what `Descriptor` takes), in blocks of
    /// `block_size` bytes if given (a tail shorter than a block is unused).
    #[new]
    #[pyo3(signature = (data, block_size=None))]
    fn new(data: &Bound<'_, PyAny>, block_size: Option<usize>) -> PyResult<Self> {
        let source = source_of(data)?;
        if source.size == 0 {
            return Err(PyValueError::new_err("the memory is empty"));
        }
        if let Some(block) = block_size
            && (block == 0 || block > source.size)
        {
            return Err(PyValueError::new_err(format!(
                "block_size must be between 1 and the memory's {} bytes; got {block}",
                source.size
            )));
        }
        Ok(PyRegisteredMemory {
            source,
            block: block_size,
            registered: OnceLock::new(),
            claims: Mutex::new(Claims::default()),
            raced: AtomicBool::new(false),
        })
    }

    /// Start address.
    #[getter]
    fn ptr(&self) -> usize {
        self.source.ptr
    }

    /// Bytes of the memory.
    #[getter]
    fn size(&self) -> usize {
        self.source.size
    }

    /// The device, as `cpu`, `cuda:N` or `rocm:N`.
    #[getter]
    fn device(&self) -> String {
        self.source.device.to_string()
    }

    /// Whether transfers may write into the memory.
    #[getter]
    fn writable(&self) -> bool {
        self.source.writable
    }

    /// What the memory came from (`bytes`, `array`, `DLPack`, ...).
    #[getter]
    fn origin(&self) -> &'static str {
        self.source.origin.name()
    }

    /// The object the memory belongs to (Dynamo's `_data_ref`).
    #[getter]
    fn referent(&self, py: Python<'_>) -> Py<PyAny> {
        self.source.referent.clone_ref(py)
    }

    /// The memory as a flat `memoryview` of bytes (format `B`), for host
    /// memory; `None` on a device. It keeps the memory valid while it lives,
    /// and views the bytes in memory order whatever the object's shape.
    fn window<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        crate::memory::host_window(py, &self.source)
    }

    /// Bytes per block; `None` for memory described at any offset.
    #[getter]
    fn block_size(&self) -> Option<usize> {
        self.block
    }

    /// Number of blocks (0 without blocks).
    #[getter]
    fn blocks_total(&self) -> usize {
        self.block_count()
    }

    /// Blocks no descriptor owns and no operation holds (block pools), or
    /// such bytes.
    #[getter]
    fn free(&self) -> usize {
        let claimed = self.settled_claims().bytes;
        match self.block {
            Some(block) => self.block_count() - claimed / block,
            None => self.source.size - claimed,
        }
    }

    /// Whether the memory is registered with a connector.
    #[getter]
    fn is_registered(&self) -> bool {
        self.registered()
    }

    /// Registers the memory with `connector` now (nothing if registered with
    /// it; `RuntimeError` if registered with another).
    fn register(&self, py: Python<'_>, connector: &Bound<'_, PyConnector>) -> PyResult<()> {
        self.ensure_registered(py, connector).map(drop)
    }

    /// A descriptor of `size` bytes at `offset`, owning them until it is
    /// dropped: `ValueError` if the range is empty, runs past the memory, or
    /// overlaps a live descriptor of this memory or bytes an operation still
    /// holds.
    fn view(slf: &Bound<'_, Self>, offset: usize, size: usize) -> PyResult<PyDescriptor> {
        let this = slf.get();
        let total = this.source.size;
        let end = offset
            .checked_add(size)
            .filter(|&end| size > 0 && end <= total);
        let Some(end) = end else {
            return Err(PyValueError::new_err(format!(
                "cannot describe {size} bytes at offset {offset} of {total} bytes"
            )));
        };
        if let Some(block) = this.block
            && (!offset.is_multiple_of(block)
                || !size.is_multiple_of(block)
                || end > this.block_count() * block)
        {
            return Err(PyValueError::new_err(format!(
                "a block pool is described in whole blocks of {block} bytes"
            )));
        }
        let mut claims = this.settled_claims();
        claims.take(offset, end).map_err(|(s, e)| {
            PyValueError::new_err(if claims.is_held(s, e) {
                format!(
                    "bytes {offset}..{end} overlap bytes {s}..{e}, still held by an operation that has \
                     not let go of them (draining, or leaked after a cancel)"
                )
            } else {
                format!("bytes {offset}..{end} overlap the live descriptor of bytes {s}..{e}")
            })
        })?;
        drop(claims);
        Ok(Self::views(slf, &[(offset, size)]).remove(0))
    }

    /// `n` one-block descriptors, the lowest free blocks first; `None` (and
    /// nothing checked out) if fewer than `n` are free. A block an operation
    /// still holds is not free.
    fn checkout(slf: &Bound<'_, Self>, n: usize) -> PyResult<Option<Vec<PyDescriptor>>> {
        let this = slf.get();
        let block = this.block_size_or_err()?;
        let indices = {
            let mut claims = this.settled_claims();
            let Some(indices) = claims.lowest_free_blocks(block, this.block_count(), n) else {
                return Ok(None);
            };
            for &i in &indices {
                // Free by construction: found under this lock.
                let _ = claims.take(i * block, (i + 1) * block);
            }
            indices
        };
        let parts: Vec<(usize, usize)> = indices.iter().map(|&i| (i * block, block)).collect();
        Ok(Some(Self::views(slf, &parts)))
    }

    /// The blocks at `indices`, one descriptor each, in that order: all or
    /// none. `ValueError` names the first index out of range, owned by a live
    /// descriptor, still held by an operation, or listed twice.
    fn blocks(slf: &Bound<'_, Self>, indices: Vec<usize>) -> PyResult<Vec<PyDescriptor>> {
        let this = slf.get();
        let block = this.block_size_or_err()?;
        let count = this.block_count();
        {
            let mut claims = this.settled_claims();
            let mut taken = Vec::with_capacity(indices.len());
            let mut refused = None;
            for &i in &indices {
                if i >= count {
                    refused = Some(format!("block {i} is out of range (the pool has {count})"));
                    break;
                }
                if let Err((s, e)) = claims.take(i * block, (i + 1) * block) {
                    refused = Some(if taken.contains(&i) {
                        format!("block {i} is listed twice")
                    } else if claims.is_held(s, e) {
                        format!(
                            "block {i} is still held by an operation that has not let go of it \
                             (draining, or leaked after a cancel)"
                        )
                    } else {
                        format!("block {i} is checked out by a live descriptor")
                    });
                    break;
                }
                taken.push(i);
            }
            if let Some(why) = refused {
                for i in taken {
                    claims.give_back(i * block, (i + 1) * block);
                }
                return Err(PyValueError::new_err(why));
            }
        }
        let parts: Vec<(usize, usize)> = indices.iter().map(|&i| (i * block, block)).collect();
        Ok(Self::views(slf, &parts))
    }
}
