//! [`Region`]: one buffer, its one registration, and the bookkeeping of the
//! owned, disjoint views ([`Descriptor`](crate::Descriptor)s) that share it.
//!
//! A plain descriptor is the one view of a region of its own. A
//! [`BlockPool`](crate::BlockPool) or [`RegisteredMemory`](crate::RegisteredMemory)
//! is a region with an [`Allocator`] that hands out views and takes their
//! ranges back when they are dropped. The rules it keeps are V1-V4 of
//! ARCHITECTURE.md's invariant 9 ("Views"), which comments here refer to.

use std::collections::BTreeMap;
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use crate::backend::{RegionId, RegistrationBackend, Segment};
use crate::buffer::MemoryBuffer;
use crate::connector::Connector;
use crate::error::{Error, Result};
use crate::sync::{AtomicBool, Mutex, MutexGuard, OnceLock, Ordering};

#[cfg(all(test, loom))]
mod loom;

/// A buffer shared by views, registered at most once.
///
/// The buffer is stored inline (one allocation with the `Arc`), behind
/// `ManuallyDrop` so that it is dropped only once the registration ended
/// (or never, if it could not end).
pub(crate) struct Region<B: ?Sized + MemoryBuffer = dyn MemoryBuffer> {
    /// The buffer's start, from its one `base_ptr` call; provenance exposed.
    base: *mut u8,
    /// The whole buffer.
    whole: Segment,
    writable: bool,
    /// Set once, by the first view (or pool) to register; taken in `Drop`.
    registration: OnceLock<Registration>,
    /// Hands out views and takes their ranges back; `None` for a plain
    /// descriptor's region, whose one view covers it all.
    allocator: Option<Mutex<Allocator>>,
    /// Bytes per block, for a block pool's region (fixed: read without the
    /// allocator's lock).
    block: Option<usize>,
    /// A registration could not be ended: never release the buffer.
    leak: AtomicBool,
    /// `Descriptor::into_buffer` moved the buffer out: never drop it here.
    taken: bool,
    buffer: ManuallyDrop<B>,
}

// SAFETY: `base` points into `buffer` (`Send + Sync` by `MemoryBuffer`), and
// the region hands out no reference to that memory: views reach it through
// `&`/`&mut` of themselves only, and views are disjoint (V1). The rest is
// `Send + Sync` on its own.
unsafe impl<B: ?Sized + MemoryBuffer> Send for Region<B> {}
// SAFETY: see `Send`.
unsafe impl<B: ?Sized + MemoryBuffer> Sync for Region<B> {}

/// One registration with one connector's backend: of a region, or of a
/// file ([`crate::FileSegment`]).
pub(crate) struct Registration {
    connector_id: u64,
    connector_name: Arc<str>,
    backend: Arc<dyn RegistrationBackend>,
    id: RegionId,
    /// What was registered instead of read-only memory, on a backend that
    /// does not enforce access.
    shadow: Option<Shadow>,
}

impl Registration {
    /// A registration `id` just made with `connector`'s backend, of memory
    /// that needs no private copy (or of a file).
    pub(crate) fn new(connector: &Connector, id: RegionId) -> Registration {
        Registration {
            connector_id: connector.id(),
            connector_name: connector.shared_name(),
            backend: connector.backend_arc(),
            id,
            shadow: None,
        }
    }

    pub(crate) fn connector_name(&self) -> &str {
        &self.connector_name
    }

    /// Deregisters the region; false if the backend refused or panicked, in
    /// which case it may still hand the memory to peers (a shadow is then
    /// leaked with it).
    pub(crate) fn deregister(&mut self) -> bool {
        let ended = match catch_unwind(AssertUnwindSafe(|| self.backend.deregister(self.id))) {
            Ok(Ok(())) => true,
            Ok(Err(error)) => {
                tracing::error!(%error, connector = %self.connector_name, region = self.id.0, "deregistration failed");
                false
            }
            Err(_) => {
                tracing::error!(connector = %self.connector_name, region = self.id.0, "deregistration panicked");
                false
            }
        };
        if !ended && let Some(shadow) = self.shadow.take() {
            shadow.leak();
        }
        ended
    }

    pub(crate) fn check(&self, connector: &Connector) -> Result<RegionId> {
        if self.connector_id == connector.id() {
            Ok(self.id)
        } else {
            Err(Error::RegisteredElsewhere {
                registered: self.connector_name.to_string(),
                requested: connector.name().to_owned(),
            })
        }
    }
}

/// A private copy of read-only host memory, registered in its place with a
/// backend that does not enforce access ([`RegistrationBackend::access_enforced`]):
/// a peer that writes what it was shown for reading changes the copy, never
/// the memory safe code shares (a [`bytes::Bytes`]'s clones, a Python
/// `bytes`). Held as a raw pointer, never as a reference or a `Box`: the
/// backend may write it behind the compiler's back. Freed when dropped, which
/// happens only after the registration ended; [`leak`](Self::leak)ed if it
/// could not.
struct Shadow {
    addr: usize,
    ptr: *mut u8,
    len: usize,
    device: crate::device::Device,
}

// SAFETY: the copy is a heap block owned by this value alone; the pointer is
// never dereferenced by it, only freed.
unsafe impl Send for Shadow {}
// SAFETY: see `Send`: shared references read the pointer's value only.
unsafe impl Sync for Shadow {}

impl Shadow {
    /// A copy of `region`'s whole buffer; host memory only (the copy is made
    /// by the CPU), and an error rather than an abort if it cannot be had.
    fn of<B: ?Sized + MemoryBuffer>(region: &Region<B>) -> Result<Shadow> {
        let whole = region.whole;
        if whole.device.kind() != crate::device::DeviceKind::Host {
            return Err(Error::Unsupported {
                backend: "core",
                what: format!(
                    "read-only {} memory on a backend that lets peers write any registered byte \
                     (register writable memory instead)",
                    whole.device
                ),
            });
        }
        let mut copy: Vec<u8> = Vec::new();
        copy.try_reserve_exact(whole.len).map_err(|_| {
            Error::InvalidDescriptor(format!(
                "no memory for the private copy of {} read-only bytes",
                whole.len
            ))
        })?;
        // SAFETY: `base..base + len` is the region's buffer, valid for reads
        // (the `MemoryBuffer` contract) and never written (read-only); the
        // copy has room for `len` bytes and does not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(region.base, copy.as_mut_ptr(), whole.len);
            copy.set_len(whole.len);
        }
        let ptr = Box::into_raw(copy.into_boxed_slice()).cast::<u8>();
        Ok(Shadow {
            addr: ptr.expose_provenance(),
            ptr,
            len: whole.len,
            device: whole.device,
        })
    }

    fn segment(&self) -> Segment {
        Segment {
            addr: self.addr,
            len: self.len,
            device: self.device,
        }
    }

    /// Never frees the copy: a backend may still let peers reach it.
    fn leak(self) {
        tracing::error!(
            bytes = self.len,
            "a private copy of read-only memory is still registered: leaking it"
        );
        std::mem::forget(self);
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
        // SAFETY: `ptr` and `len` came from `Box::into_raw` of a boxed slice
        // in `of`; dropped once, after the backend let go of it.
        drop(unsafe { Box::from_raw(slice) });
    }
}

impl<B: ?Sized + MemoryBuffer> Drop for Region<B> {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        if let Some(mut registration) = self.registration.take()
            && !registration.deregister()
        {
            // Still registered as far as we know: leak rather than free
            // memory the backend might let a peer reach.
            return;
        }
        if self.leak.load(Ordering::Acquire) {
            tracing::error!(
                bytes = self.whole.len,
                "a second registration of this memory could not be ended: leaking it"
            );
            return;
        }
        // SAFETY: dropped exactly once, here, and never used again; the
        // backend holds no registration of it any more.
        unsafe { ManuallyDrop::drop(&mut self.buffer) }
    }
}

impl Region {
    /// A region over `buffer`, with the allocator `allocator` makes for its
    /// whole segment (`None`: a plain descriptor's).
    pub(crate) fn new<B: MemoryBuffer>(
        buffer: B,
        allocator: impl FnOnce(&Segment) -> Result<Option<Allocator>>,
    ) -> Result<Arc<Region>> {
        let device = buffer.device();
        let mut region = Arc::new(Region {
            base: std::ptr::null_mut(),
            whole: Segment {
                addr: 0,
                len: 0,
                device,
            },
            writable: false,
            registration: OnceLock::new(),
            allocator: None,
            block: None,
            leak: AtomicBool::new(false),
            taken: false,
            buffer: ManuallyDrop::new(buffer),
        });
        // The pointer is taken where the buffer will stay: nothing moves it
        // afterwards.
        let Some(fresh) = Arc::get_mut(&mut region) else {
            return Err(Error::InvalidDescriptor(
                "a new region was shared before it was built".into(),
            ));
        };
        let len = fresh.buffer.len();
        let ptr = fresh.buffer.base_ptr();
        // An empty buffer is a region of zero bytes, registered, exposed and
        // moved like any other (as Dynamo does: a peer's zero-length
        // descriptor must lie in a registration of ours); its address is
        // still checked, as Dynamo refuses a null one.
        if ptr.is_null() {
            return Err(Error::InvalidDescriptor(
                "the buffer's address is null".into(),
            ));
        }
        let addr = ptr.expose_provenance();
        if addr.checked_add(len).is_none() {
            return Err(Error::InvalidDescriptor(format!(
                "{len} bytes at {addr:#x} wrap the address space"
            )));
        }
        fresh.base = ptr;
        fresh.whole = Segment { addr, len, device };
        fresh.writable = fresh.buffer.is_writable();
        let allocator = allocator(&fresh.whole)?;
        fresh.block = match &allocator {
            Some(Allocator::Blocks(blocks)) => Some(blocks.size),
            _ => None,
        };
        fresh.allocator = allocator.map(Mutex::new);
        Ok(region)
    }
}

impl<B: ?Sized + MemoryBuffer> Region<B> {
    /// The whole buffer.
    pub(crate) fn whole(&self) -> &Segment {
        &self.whole
    }

    pub(crate) fn is_writable(&self) -> bool {
        self.writable
    }

    /// The start of the buffer, with its provenance, for a view's slices.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// The start of the memory as the backend and peers see it: the
    /// buffer's, or its shadow's once a shadow was registered.
    pub(crate) fn addr(&self) -> usize {
        match self.registration.get().and_then(|r| r.shadow.as_ref()) {
            Some(shadow) => shadow.addr,
            None => self.whole.addr,
        }
    }

    /// The backend's handle, once registered.
    pub(crate) fn id(&self) -> Option<RegionId> {
        self.registration.get().map(|r| r.id)
    }

    /// The name of the connector the region is registered with.
    pub(crate) fn registered_with(&self) -> Option<&str> {
        self.registration.get().map(|r| &*r.connector_name)
    }

    /// Registers the whole buffer with `connector`'s backend, once; again
    /// with the same connector it does nothing, with another it is
    /// [`Error::RegisteredElsewhere`].
    ///
    /// Two views may register at once: each calls the backend with no lock
    /// held, the first to publish wins, and the other deregisters its own
    /// registration (or, if that fails, the buffer is leaked: the backend
    /// might hand it to peers). A backend that refuses the second
    /// registration of the same memory makes the other take the winner's,
    /// if it was published by then.
    pub(crate) fn register(&self, connector: &Connector) -> Result<RegionId> {
        if let Some(registration) = self.registration.get() {
            return registration.check(connector);
        }
        let started = Instant::now();
        let backend = connector.backend_arc();
        // Read-only memory that a peer could write anyway: the backend gets
        // a private copy, and the memory itself is never registered.
        let shadow = if self.writable || backend.access_enforced() {
            None
        } else {
            Some(Shadow::of(self)?)
        };
        let registered = shadow.as_ref().map_or(self.whole, Shadow::segment);
        // SAFETY: the buffer stays valid (and writable if it says so) until
        // the region's `Drop` has deregistered it: the registration lives in
        // the region, and the buffer is dropped only after `deregister`
        // returned `Ok`. `whole.addr` came from `expose_provenance`. Views
        // are disjoint and operations own the views they move (V1, V2), so
        // nothing else touches memory a transfer or an exposure covers. On a
        // backend that does not enforce access, read-only memory is never
        // registered: its shadow is, valid for reads and writes, reached by
        // nothing but the backend, and freed only after `deregister`
        // returned `Ok` (leaked otherwise).
        let id = match unsafe { backend.register(&registered, self.writable) } {
            Ok(id) => id,
            // Another view may have registered the region meanwhile, and a
            // backend that refuses a second registration of the same
            // memory (NIXL from PR #1773 on) refuses this one: the
            // winner's registration is the region's.
            Err(error) => {
                return match self.registration.get() {
                    Some(winner) => winner.check(connector),
                    None => Err(error),
                };
            }
        };
        connector.count_registration();
        let mine = Registration {
            connector_id: connector.id(),
            connector_name: connector.shared_name(),
            backend,
            id,
            shadow,
        };
        match self.registration.set(mine) {
            Ok(()) => {
                tracing::debug!(
                    connector = connector.name(),
                    bytes = self.whole.len,
                    device = %self.whole.device,
                    region = id.0,
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "registered memory"
                );
                Ok(id)
            }
            Err(mut lost) => {
                if !lost.deregister() {
                    self.leak.store(true, Ordering::Release);
                }
                match self.registration.get() {
                    Some(winner) => winner.check(connector),
                    None => Err(Error::InvalidDescriptor(
                        "the region's registration vanished while it was registered".into(),
                    )),
                }
            }
        }
    }

    fn allocator(&self) -> Option<MutexGuard<'_, Allocator>> {
        // Every change to an allocator is made whole before anything that
        // can panic: a poisoned one is consistent.
        self.allocator
            .as_ref()
            .map(|a| a.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs `f` on the allocator under its lock (a leaf lock: `f` calls
    /// nothing out); `None` for a region without one.
    pub(crate) fn allocate<T>(&self, f: impl FnOnce(&mut Allocator) -> T) -> Option<T> {
        self.allocator().map(|mut a| f(&mut a))
    }

    /// Takes a view's range back (a view's `Drop`); nothing for a region
    /// without an allocator.
    pub(crate) fn give_back(&self, offset: usize, len: usize) {
        if let Some(mut allocator) = self.allocator() {
            allocator.give_back(offset, len);
        }
    }

    /// The block size, for a block pool's region.
    pub(crate) fn block_size(&self) -> Option<usize> {
        self.block
    }
}

impl Region {
    /// Moves the buffer out, if it is a `T` and `this` is the region's only
    /// handle; the emptied region then frees only its own allocation when
    /// dropped. A registered region is deregistered first; if that fails,
    /// nothing is taken and the region stays registered.
    /// Called as a holder of `this` lets go of it: if a transfer posted in
    /// this process may still reach the region's memory through a peer
    /// agent, one more reference is kept until that transfer ends, so the
    /// memory is not freed under it (see [`crate::reach`]).
    pub(crate) fn keep_while_reached(this: &Arc<Region>) {
        let whole = this.whole();
        if crate::reach::is_reached(whole.addr, whole.len) {
            drop(crate::reach::keep_while_reached(
                whole.addr,
                whole.len,
                Arc::clone(this),
            ));
        }
    }

    pub(crate) fn take_buffer<T: MemoryBuffer>(this: &mut Arc<Region>) -> Option<T> {
        let region = Arc::get_mut(this)?;
        if region.taken
            || region.allocator.is_some()
            || region.leak.load(Ordering::Acquire)
            || !(&*region.buffer as &dyn std::any::Any).is::<T>()
        {
            return None;
        }
        if let Some(mut registration) = region.registration.take() {
            if !registration.deregister() {
                // Still registered (its shadow, if any, leaked): the region
                // keeps it, and the buffer.
                let _kept = region.registration.set(registration);
                return None;
            }
            drop(registration);
        }
        let any: &mut dyn std::any::Any = &mut *region.buffer;
        let buffer: *mut T = any.downcast_mut::<T>()?;
        // SAFETY: the value is read out once, and `taken` makes the region
        // leave it alone from now on (no drop, no second read); no
        // registration covers it any more.
        let buffer = unsafe { std::ptr::read(buffer) };
        region.taken = true;
        Some(buffer)
    }
}

/// Hands out a region's views.
pub(crate) enum Allocator {
    /// Fixed-size blocks: a [`BlockPool`](crate::BlockPool).
    Blocks(Blocks),
    /// Any byte range: [`RegisteredMemory`](crate::RegisteredMemory).
    Bytes(Bytes),
}

impl Allocator {
    fn give_back(&mut self, offset: usize, len: usize) {
        match self {
            Allocator::Blocks(blocks) => blocks.give_back(offset / blocks.size, len / blocks.size),
            Allocator::Bytes(bytes) => bytes.give_back(offset, offset + len),
        }
    }
}

/// Which blocks of a pool are free: a bitset, one bit per block (set: free).
#[derive(Debug)]
pub(crate) struct Blocks {
    /// Bytes per block.
    pub(crate) size: usize,
    /// Number of blocks.
    pub(crate) count: usize,
    free: Vec<u64>,
    free_count: usize,
}

impl Blocks {
    /// `count` free blocks of `size` bytes.
    pub(crate) fn new(size: usize, count: usize) -> Blocks {
        let mut free = vec![u64::MAX; count.div_ceil(64)];
        if let Some(last) = free.last_mut()
            && !count.is_multiple_of(64)
        {
            *last = (1u64 << (count % 64)) - 1;
        }
        Blocks {
            size,
            count,
            free,
            free_count: count,
        }
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free_count
    }

    pub(crate) fn is_free(&self, index: usize) -> bool {
        index < self.count && self.free[index / 64] & (1 << (index % 64)) != 0
    }

    fn set(&mut self, index: usize, free: bool) {
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        if free {
            self.free[word] |= bit;
        } else {
            self.free[word] &= !bit;
        }
    }

    /// The `n` lowest free blocks, taken; `None` (nothing taken) if fewer
    /// are free.
    pub(crate) fn take_lowest(&mut self, n: usize) -> Option<Vec<usize>> {
        if n > self.free_count {
            return None;
        }
        let mut taken = Vec::with_capacity(n);
        for (w, word) in self.free.iter_mut().enumerate() {
            while taken.len() < n && *word != 0 {
                let bit = word.trailing_zeros() as usize;
                *word &= *word - 1;
                taken.push(w * 64 + bit);
            }
            if taken.len() == n {
                break;
            }
        }
        self.free_count -= taken.len();
        Some(taken)
    }

    /// The first of `n` contiguous free blocks, the lowest such run, taken;
    /// `None` if there is no such run.
    pub(crate) fn take_run(&mut self, n: usize) -> Option<usize> {
        if n == 0 || n > self.free_count {
            return None;
        }
        let mut start = 0;
        let mut len = 0;
        for index in 0..self.count {
            if self.is_free(index) {
                if len == 0 {
                    start = index;
                }
                len += 1;
                if len == n {
                    (start..start + n).for_each(|i| self.set(i, false));
                    self.free_count -= n;
                    return Some(start);
                }
            } else {
                len = 0;
            }
        }
        None
    }

    /// Takes exactly `indices`, or nothing: `Err` names the first that is
    /// out of range, checked out, or given twice.
    pub(crate) fn take_exact(&mut self, indices: &[usize]) -> std::result::Result<(), String> {
        for (i, &index) in indices.iter().enumerate() {
            if index >= self.count {
                self.undo(&indices[..i]);
                return Err(format!(
                    "block {index} is out of range (the pool has {} blocks)",
                    self.count
                ));
            }
            if !self.is_free(index) {
                self.undo(&indices[..i]);
                return Err(format!(
                    "block {index} is checked out already (or listed twice)"
                ));
            }
            self.set(index, false);
        }
        self.free_count -= indices.len();
        Ok(())
    }

    fn undo(&mut self, taken: &[usize]) {
        taken.iter().for_each(|&i| self.set(i, true));
    }

    fn give_back(&mut self, first: usize, count: usize) {
        for index in first..first + count {
            debug_assert!(!self.is_free(index), "block {index} given back twice");
            if index < self.count && !self.is_free(index) {
                self.set(index, true);
                self.free_count += 1;
            }
        }
    }
}

/// The live views of [`RegisteredMemory`](crate::RegisteredMemory): disjoint
/// byte ranges, `start -> end`.
#[derive(Debug, Default)]
pub(crate) struct Bytes {
    live: BTreeMap<usize, usize>,
}

impl Bytes {
    /// Takes `[start, end)` unless it overlaps a live range, which `Err`
    /// returns.
    pub(crate) fn take(
        &mut self,
        start: usize,
        end: usize,
    ) -> std::result::Result<(), (usize, usize)> {
        let before = self.live.range(..end).next_back();
        if let Some((&s, &e)) = before
            && e > start
        {
            return Err((s, e));
        }
        self.live.insert(start, end);
        Ok(())
    }

    /// The live range overlapping `[start, end)`, if any (the one starting
    /// last before `end`: ranges are disjoint).
    pub(crate) fn overlapping(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let (&s, &e) = self.live.range(..end).next_back()?;
        (e > start).then_some((s, e))
    }

    /// Bytes in live ranges.
    pub(crate) fn live_bytes(&self) -> usize {
        self.live.iter().map(|(s, e)| e - s).sum()
    }

    /// Gives `[start, end)` back: it may be part of a live range (a split
    /// view) or span adjacent ones (an unsplit view).
    fn give_back(&mut self, start: usize, end: usize) {
        let overlapping: Vec<(usize, usize)> = self
            .live
            .range(..end)
            .rev()
            .take_while(|&(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in overlapping {
            self.live.remove(&s);
            if s < start {
                self.live.insert(s, start);
            }
            if e > end {
                self.live.insert(end, e);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn blocks_hand_out_the_lowest_first_and_take_them_back() {
        let mut b = Blocks::new(4096, 130);
        assert_eq!(b.free_count(), 130);
        assert_eq!(b.take_lowest(3), Some(vec![0, 1, 2]));
        assert_eq!(b.take_exact(&[64, 129]), Ok(()));
        assert!(b.take_exact(&[5, 64]).unwrap_err().contains("block 64"));
        assert!(b.is_free(5), "a refused take_exact takes nothing");
        assert!(b.take_exact(&[130]).unwrap_err().contains("out of range"));
        assert!(b.take_exact(&[7, 7]).unwrap_err().contains("twice"));
        // Free now: 3..=63 (61 blocks) and 65..=128 (64).
        assert_eq!(b.take_run(62), Some(65), "the first run long enough");
        b.give_back(65, 62);
        assert_eq!(b.take_run(61), Some(3));
        assert_eq!(b.take_run(64), Some(65));
        assert_eq!(b.take_run(1), None);
        assert_eq!(b.free_count(), 0);
        b.give_back(1, 2);
        assert_eq!(b.take_run(2), Some(1));
        assert_eq!(b.take_lowest(1), None);
        b.give_back(0, 130);
        assert_eq!(b.free_count(), 130);
    }

    /// On a backend that lets peers write any registered byte, read-only
    /// memory is never registered: a private copy of it is, whose address
    /// peers see, and the memory keeps its bytes whatever lands in the copy.
    #[test]
    fn read_only_memory_is_registered_as_a_private_copy_where_access_is_not_enforced() {
        use crate::testing::Scripted;
        let backend = Arc::new(Scripted::new(true, false));
        assert!(!backend.access_enforced());
        let c = Connector::from_arc(Arc::clone(&backend) as Arc<dyn RegistrationBackend>);
        let bytes = bytes::Bytes::from((0..=255u8).cycle().take(4096).collect::<Vec<u8>>());
        let alias = bytes.clone();
        let mut ro = crate::Descriptor::from_bytes(bytes).unwrap();
        assert_eq!(
            ro.ptr(),
            alias.as_ptr() as usize,
            "unregistered: its own address"
        );
        ro.register_memory(&c).unwrap();
        assert_ne!(ro.ptr(), alias.as_ptr() as usize, "registered: the copy's");
        let copy = ro.ptr() as *mut u8;
        // SAFETY: test only: the copy is 4096 bytes of heap the region owns,
        // registered, and nothing else touches it (what a peer's WRITE does).
        let copied = unsafe { std::slice::from_raw_parts(copy, 4096) }.to_vec();
        assert_eq!(copied, alias.to_vec(), "the copy holds the bytes");
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(copy, 0xEE, 4096) };
        assert_eq!(
            ro.as_slice().unwrap(),
            &alias[..],
            "the memory kept its bytes"
        );
        assert!(alias.iter().zip((0..=255u8).cycle()).all(|(a, b)| *a == b));
        drop(ro);
        assert_eq!(backend.deregistered.load(Ordering::SeqCst), 1);

        let mut rw = crate::Descriptor::new(vec![1u8; 64]).unwrap();
        let before = rw.ptr();
        rw.register_memory(&c).unwrap();
        assert_eq!(rw.ptr(), before, "writable memory is registered as it is");
    }

    #[test]
    fn byte_ranges_refuse_overlaps_and_take_back_parts_and_spans() {
        let mut b = Bytes::default();
        assert_eq!(b.take(100, 200), Ok(()));
        assert_eq!(b.take(200, 300), Ok(()));
        assert_eq!(b.take(150, 160), Err((100, 200)));
        assert_eq!(b.take(0, 101), Err((100, 200)));
        assert_eq!(b.take(299, 400), Err((200, 300)));
        assert_eq!(b.take(0, 100), Ok(()));
        // A split view's half, then a span over two ranges.
        b.give_back(100, 150);
        assert_eq!(b.take(120, 130), Ok(()));
        b.give_back(120, 130);
        b.give_back(150, 300);
        assert_eq!(b.live_bytes(), 100);
        b.give_back(0, 100);
        assert_eq!(b.live_bytes(), 0);
    }
}
