//! Memory registered once, moved in parts: [`BlockPool`] (fixed-size blocks,
//! KV-cache style) and [`RegisteredMemory`] (views at any offset).
//!
//! Both are handles on one registered buffer (a region) that hand out owned,
//! disjoint views ([`Descriptor`]s). A view goes back when it is dropped, as
//! tokio-uring's fixed buffers check back in; operations take views and hand
//! them back like any descriptor, with no registration of their own. The
//! buffer is deregistered, then released, once the last handle and the last
//! view are gone (see [`Descriptor`]'s "Views, capacity and size").

use std::num::NonZeroUsize;
use std::sync::Arc;

use crate::buffer::MemoryBuffer;
use crate::connector::Connector;
use crate::descriptor::Descriptor;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::region::{Allocator, Blocks, Bytes, Region};

/// A registered buffer divided into fixed-size blocks, checked out as
/// descriptors: register a KV-cache arena once, then move blocks by index.
///
/// Cheap to clone (clones share the pool). A block is checked out by one
/// descriptor at a time and comes back when that descriptor is dropped; an
/// operation that holds it gives it back when the operation ends and the
/// backend let go of the memory. A descriptor that is leaked (`mem::forget`,
/// or a cancelled passive operation on a backend that cannot revoke a peer's
/// access) keeps its blocks for the pool's life: [`free`](Self::free) shows it.
///
/// ```
/// # use descriptor_core::{BlockPool, Connector};
/// # use std::num::NonZeroUsize;
/// fn blocks(connector: &Connector) -> descriptor_core::Result<()> {
///     let block = NonZeroUsize::new(64 << 10).expect("not zero");
///     let pool = BlockPool::new(connector, vec![0u8; 256 << 16], block)?; // one registration
///     let run = pool.checkout_run(4).expect("4 contiguous blocks free"); // one view of blocks 0..4
///     let picked = pool.checkout_blocks(&[9, 17])?; // blocks by index
///     assert_eq!((run.block_index(), run.size()), (Some(0), 4 << 16));
///     assert_eq!(pool.free(), 256 - 6);
///     drop((run, picked)); // back to the pool
///     assert_eq!(pool.free(), 256);
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct BlockPool {
    region: Arc<Region>,
}

impl Drop for BlockPool {
    fn drop(&mut self) {
        Region::keep_while_reached(&self.region);
    }
}

impl BlockPool {
    /// Registers `buffer` with `connector` now (one backend registration)
    /// and divides it into blocks of `block_size` bytes; a tail shorter than
    /// a block is never handed out. [`Error::InvalidDescriptor`] for a
    /// buffer smaller than one block.
    pub fn new<B: MemoryBuffer>(
        connector: &Connector,
        buffer: B,
        block_size: NonZeroUsize,
    ) -> Result<BlockPool> {
        let block = block_size.get();
        let region = Region::new(buffer, |whole| {
            let count = whole.len / block;
            if count == 0 {
                return Err(Error::InvalidDescriptor(format!(
                    "a buffer of {} bytes holds no block of {block} bytes",
                    whole.len
                )));
            }
            Ok(Some(Allocator::Blocks(Blocks::new(block, count))))
        })?;
        region.register(connector)?;
        Ok(BlockPool { region })
    }

    /// Bytes per block.
    pub fn block_size(&self) -> usize {
        self.region.block_size().unwrap_or(1)
    }

    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.with_blocks(|b| b.count).unwrap_or(0)
    }

    /// Blocks not checked out now.
    pub fn free(&self) -> usize {
        self.with_blocks(|b| b.free_count()).unwrap_or(0)
    }

    /// Whether block `index` is not checked out now.
    pub fn is_free(&self, index: usize) -> bool {
        self.with_blocks(|b| b.is_free(index)).unwrap_or(false)
    }

    /// The device the pool's memory is on.
    pub fn device(&self) -> Device {
        self.region.whole().device
    }

    /// Start address of block 0.
    pub fn ptr(&self) -> usize {
        self.region.addr()
    }

    /// `n` one-block descriptors, the lowest free blocks first (so that runs
    /// of neighbours form, which backends move as one); `None`, and nothing
    /// checked out, if fewer than `n` are free.
    pub fn checkout(&self, n: usize) -> Option<Vec<Descriptor>> {
        let indices = self.with_blocks(|b| b.take_lowest(n))??;
        Some(self.views(&indices, 1))
    }

    /// One descriptor of `n` contiguous blocks (the lowest such run); `None`
    /// if no run of `n` free blocks exists (or `n` is 0).
    pub fn checkout_run(&self, n: usize) -> Option<Descriptor> {
        let first = self.with_blocks(|b| b.take_run(n))??;
        self.views(&[first], n).pop()
    }

    /// The blocks at `indices`, one descriptor each, in that order: all or
    /// none. [`Error::InvalidDescriptor`] names the first index out of range,
    /// checked out already, or listed twice.
    pub fn checkout_blocks(&self, indices: &[usize]) -> Result<Vec<Descriptor>> {
        self.with_blocks(|b| b.take_exact(indices))
            .unwrap_or_else(|| Err("the pool has no blocks".into()))
            .map_err(Error::InvalidDescriptor)?;
        Ok(self.views(indices, 1))
    }

    /// Views of `blocks` blocks starting at each of `firsts`, whose blocks
    /// the caller took from the allocator.
    fn views(&self, firsts: &[usize], blocks: usize) -> Vec<Descriptor> {
        let block = self.block_size();
        firsts
            .iter()
            .map(|&first| Descriptor::view(Arc::clone(&self.region), first * block, blocks * block))
            .collect()
    }

    /// Runs `f` on the pool's blocks under the allocator's lock. `None`
    /// never happens: a pool's region is made with blocks.
    fn with_blocks<T>(&self, f: impl FnOnce(&mut Blocks) -> T) -> Option<T> {
        self.region
            .allocate(|a| match a {
                Allocator::Blocks(blocks) => Some(f(blocks)),
                Allocator::Bytes(_) => None,
            })
            .flatten()
    }
}

impl std::fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockPool")
            .field("device", &self.device())
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("block_size", &self.block_size())
            .field("blocks", &self.blocks())
            .field("free", &self.free())
            .field("registered_with", &self.region.registered_with())
            .finish()
    }
}

/// A registered buffer from which descriptors are carved at any offset: for
/// layouts a [`BlockPool`] does not fit (variable-size entries, a receive
/// buffer read into at chosen places).
///
/// Cheap to clone (clones share the buffer). Carved descriptors never
/// overlap; a carved range comes back when its descriptor is dropped.
///
/// ```
/// # use descriptor_core::{Connector, RegisteredMemory};
/// fn carve(connector: &Connector) -> descriptor_core::Result<()> {
///     let memory = RegisteredMemory::new(connector, vec![0u8; 1 << 20])?;
///     let header = memory.carve(0, 512)?;
///     let body = memory.carve(4096, 64 << 10)?;
///     assert!(memory.carve(500, 100).is_err()); // overlaps `header`
///     assert_eq!(body.ptr(), memory.ptr() + 4096);
///     drop(header);
///     assert!(memory.carve(500, 100).is_ok());
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct RegisteredMemory {
    region: Arc<Region>,
}

impl Drop for RegisteredMemory {
    fn drop(&mut self) {
        Region::keep_while_reached(&self.region);
    }
}

impl RegisteredMemory {
    /// Registers `buffer` with `connector` now (one backend registration).
    pub fn new<B: MemoryBuffer>(connector: &Connector, buffer: B) -> Result<RegisteredMemory> {
        let region = Region::new(buffer, |_| Ok(Some(Allocator::Bytes(Bytes::default()))))?;
        region.register(connector)?;
        Ok(RegisteredMemory { region })
    }

    /// A descriptor of `len` bytes at `offset`. [`Error::InvalidDescriptor`]
    /// if the range is empty, runs past the buffer, or overlaps a live
    /// descriptor carved before (named in the error).
    pub fn carve(&self, offset: usize, len: usize) -> Result<Descriptor> {
        let total = self.len();
        let end = offset
            .checked_add(len)
            .filter(|&end| len > 0 && end <= total);
        let Some(end) = end else {
            return Err(Error::InvalidDescriptor(format!(
                "cannot carve {len} bytes at offset {offset} from {total} registered bytes"
            )));
        };
        let taken = self.region.allocate(|a| match a {
            Allocator::Bytes(bytes) => bytes.take(offset, end),
            Allocator::Blocks(_) => Err((0, 0)),
        });
        match taken {
            Some(Ok(())) => Ok(Descriptor::view(Arc::clone(&self.region), offset, len)),
            Some(Err((s, e))) => Err(Error::InvalidDescriptor(format!(
                "bytes {offset}..{end} overlap the live descriptor of bytes {s}..{e}"
            ))),
            None => Err(Error::InvalidDescriptor("the memory has no carver".into())),
        }
    }

    /// Whether [`carve`](Self::carve)`(offset, len)` would succeed now: the
    /// range is not empty, lies in the buffer, and no live descriptor holds
    /// any of its bytes. A descriptor held by an operation counts as live
    /// until the operation hands it back or drops it (after the backend let
    /// go of the memory); one leaked (`mem::forget`, or a cancelled passive
    /// operation on a backend that cannot revoke a peer's access) holds its
    /// bytes for good. Takes the allocator's lock only (no backend call);
    /// another thread may carve or drop a descriptor the moment after.
    pub fn is_free(&self, offset: usize, len: usize) -> bool {
        let Some(end) = offset
            .checked_add(len)
            .filter(|&end| len > 0 && end <= self.len())
        else {
            return false;
        };
        self.region
            .allocate(|a| match a {
                Allocator::Bytes(bytes) => bytes.overlapping(offset, end).is_none(),
                Allocator::Blocks(_) => false,
            })
            .unwrap_or(false)
    }

    /// Registered bytes.
    pub fn len(&self) -> usize {
        self.region.whole().len
    }

    /// Whether no bytes are registered (never true: empty buffers are refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes in live carved descriptors.
    pub fn carved(&self) -> usize {
        self.region
            .allocate(|a| match a {
                Allocator::Bytes(bytes) => bytes.live_bytes(),
                Allocator::Blocks(_) => 0,
            })
            .unwrap_or(0)
    }

    /// Start address.
    pub fn ptr(&self) -> usize {
        self.region.addr()
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        self.region.whole().device
    }

    /// Whether transfers may write into the memory.
    pub fn is_writable(&self) -> bool {
        self.region.is_writable()
    }
}

impl std::fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredMemory")
            .field("device", &self.device())
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("len", &self.len())
            .field("carved", &self.carved())
            .field("registered_with", &self.region.registered_with())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};

    use std::sync::Mutex;

    use proptest::prelude::*;

    use super::*;
    use crate::backend::RegistrationBackend;
    use crate::sync::Ordering;
    use crate::testing::{Scripted, WatchedMemory};

    fn scripted() -> (Arc<Scripted>, Connector) {
        let backend = Arc::new(Scripted::new(true, true));
        let connector = Connector::from_arc(Arc::clone(&backend) as Arc<dyn RegistrationBackend>);
        (backend, connector)
    }

    fn block(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    /// Memory that records the backend's deregistrations when freed.
    fn watched(backend: &Arc<Scripted>, len: usize) -> (WatchedMemory, Arc<StdAtomicUsize>) {
        let backend = Arc::clone(backend);
        WatchedMemory::new(len, 0, move || backend.deregistered.load(Ordering::SeqCst))
    }

    #[test]
    fn a_pool_registers_once_and_checks_out_disjoint_blocks() {
        let (backend, connector) = scripted();
        let pool = BlockPool::new(&connector, vec![0u8; 10 * 4096 + 100], block(4096)).unwrap();
        assert_eq!(
            (pool.blocks(), pool.free(), pool.block_size()),
            (10, 10, 4096)
        );
        let singles = pool.checkout(3).unwrap();
        let starts: Vec<usize> = singles.iter().map(|d| d.ptr() - pool.ptr()).collect();
        assert_eq!(starts, [0, 4096, 8192]);
        assert!(
            singles
                .iter()
                .all(|d| d.is_registered() && d.size() == 4096)
        );
        let run = pool.checkout_run(4).unwrap();
        assert_eq!((run.block_index(), run.capacity()), (Some(3), 4 * 4096));
        let picked = pool.checkout_blocks(&[9, 7]).unwrap();
        assert_eq!(
            picked.iter().map(|d| d.block_index()).collect::<Vec<_>>(),
            [Some(9), Some(7)]
        );
        match pool.checkout_blocks(&[8, 4]) {
            Err(Error::InvalidDescriptor(why)) => assert!(why.contains("block 4"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(pool.is_free(8), "a refused checkout takes nothing");
        assert!(
            matches!(pool.checkout_blocks(&[10]), Err(Error::InvalidDescriptor(why)) if why.contains("out of range"))
        );
        assert_eq!(pool.free(), 1);
        assert!(pool.checkout(2).is_none() && pool.checkout_run(2).is_none());
        drop(singles);
        assert_eq!(pool.free(), 4);
        assert_eq!(pool.checkout_run(3).unwrap().block_index(), Some(0));
        drop((run, picked));
        assert_eq!(pool.free(), 10);
        assert_eq!(connector.registrations(), 1);
        assert_eq!(backend.registered.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn block_views_split_on_block_boundaries_and_go_back_in_parts() {
        let (_, connector) = scripted();
        let pool = BlockPool::new(&connector, vec![0u8; 8 * 64], block(64)).unwrap();
        let mut run = pool.checkout_run(4).unwrap();
        assert!(
            matches!(run.split_off(100), Err(Error::InvalidDescriptor(why)) if why.contains("block boundaries"))
        );
        let tail = run.split_off(128).unwrap();
        assert_eq!((run.block_index(), tail.block_index()), (Some(0), Some(2)));
        drop(run);
        assert!(pool.is_free(0) && pool.is_free(1) && !pool.is_free(2));
        drop(tail);
        assert_eq!(pool.free(), 8);
        // A pool's view never gives the whole buffer back.
        let all = pool.checkout_run(8).unwrap();
        assert!(all.into_vec::<u8>().is_err());
    }

    #[test]
    fn the_registration_ends_after_the_last_view_and_before_the_memory_goes() {
        let (backend, connector) = scripted();
        let (memory, freed) = watched(&backend, 4 * 256);
        let pool = BlockPool::new(&connector, memory, block(256)).unwrap();
        let views = pool.checkout(2).unwrap();
        let clone = pool.clone();
        drop(pool);
        drop(clone);
        assert_eq!(
            backend.deregistered.load(Ordering::SeqCst),
            0,
            "views still live"
        );
        let mut views = views.into_iter();
        drop(views.next());
        assert_eq!(freed.load(StdOrdering::SeqCst), 0);
        drop(views);
        assert_eq!(backend.deregistered.load(Ordering::SeqCst), 1);
        assert_eq!(
            freed.load(StdOrdering::SeqCst),
            2,
            "freed after exactly one deregistration"
        );
    }

    #[test]
    fn a_forgotten_view_keeps_its_blocks_and_the_registration() {
        let (backend, connector) = scripted();
        let (memory, freed) = watched(&backend, 4 * 256);
        let pool = BlockPool::new(&connector, memory, block(256)).unwrap();
        let views = pool.checkout(2).unwrap();
        for view in views {
            std::mem::forget(view);
        }
        assert_eq!(pool.free(), 2);
        assert_eq!(pool.checkout(3).map(|v| v.len()), None);
        drop(pool);
        assert_eq!(backend.deregistered.load(Ordering::SeqCst), 0);
        assert_eq!(freed.load(StdOrdering::SeqCst), 0, "leaked, never freed");
    }

    #[test]
    fn a_registration_that_cannot_end_leaks_the_memory() {
        let (backend, connector) = scripted();
        let (memory, freed) = watched(&backend, 1024);
        let carver = RegisteredMemory::new(&connector, memory).unwrap();
        let view = carver.carve(0, 10).unwrap();
        backend.deregister_fails.store(true, Ordering::SeqCst);
        drop((carver, view));
        assert_eq!(
            freed.load(StdOrdering::SeqCst),
            0,
            "the backend may still hand it out"
        );
    }

    #[test]
    fn views_of_one_registration_refuse_another_connector() {
        let (_, connector) = scripted();
        let (_, other) = scripted();
        let memory = RegisteredMemory::new(&connector, vec![0u8; 64]).unwrap();
        let mut view = memory.carve(8, 8).unwrap();
        assert!(view.register_memory(&connector).is_ok());
        assert!(matches!(
            view.register_memory(&other),
            Err(Error::RegisteredElsewhere { .. })
        ));
        assert_eq!(connector.registrations(), 1);
        assert_eq!(other.registrations(), 0);
    }

    #[test]
    fn carving_refuses_overlaps_and_ranges_past_the_end() {
        let (_, connector) = scripted();
        let memory = RegisteredMemory::new(&connector, vec![0u8; 100]).unwrap();
        let a = memory.carve(10, 20).unwrap();
        for (offset, len) in [(0, 11), (29, 1), (15, 2), (0, 0), (90, 11), (usize::MAX, 2)] {
            assert!(memory.carve(offset, len).is_err(), "{offset}+{len}");
        }
        let b = memory.carve(30, 70).unwrap();
        assert_eq!(memory.carved(), 90);
        assert_eq!((a.ptr() - memory.ptr(), b.ptr() - memory.ptr()), (10, 30));
        drop((a, b));
        assert_eq!(memory.carved(), 0);
    }

    #[test]
    fn is_free_says_whether_a_carve_would_succeed() {
        let (_, connector) = scripted();
        let memory = RegisteredMemory::new(&connector, vec![0u8; 100]).unwrap();
        let a = memory.carve(10, 20).unwrap();
        let cases = [
            (0, 10),
            (0, 11),
            (10, 20),
            (29, 1),
            (30, 70),
            (15, 2),
            (0, 0),
            (90, 11),
            (usize::MAX, 2),
        ];
        for (offset, len) in cases {
            let expected = memory.carve(offset, len).is_ok(); // dropped at once
            assert_eq!(memory.is_free(offset, len), expected, "{offset}+{len}");
        }
        assert!(!memory.is_free(10, 20) && memory.is_free(30, 70));
        // A forgotten view (as a leaked operation's) holds its bytes for good.
        std::mem::forget(a);
        assert!(!memory.is_free(29, 1));
        // A view an operation holds is live until it is handed back; a part
        // of a split view comes back alone.
        let mut b = memory.carve(40, 20).unwrap();
        let tail = b.split_off(10).unwrap();
        drop(b);
        assert!(memory.is_free(40, 10) && !memory.is_free(40, 11));
        drop(tail);
        assert!(memory.is_free(30, 70));
        assert_eq!(memory.carved(), 20);
    }

    #[test]
    fn two_views_registering_at_once_leave_one_registration() {
        for _ in 0..50 {
            let (backend, connector) = scripted();
            let mut first = Descriptor::new(vec![0u8; 64]).unwrap();
            let mut second = first.split_off(32).unwrap();
            let other = connector.clone();
            let racer = std::thread::spawn(move || {
                second.register_memory(&other).unwrap();
                second
            });
            first.register_memory(&connector).unwrap();
            let second = racer.join().unwrap();
            let made = backend.registered.load(Ordering::SeqCst);
            let ended = backend.deregistered.load(Ordering::SeqCst);
            assert_eq!(made - ended, 1, "one registration survives");
            drop((first, second));
            assert_eq!(backend.deregistered.load(Ordering::SeqCst), made);
        }
    }

    #[test]
    fn a_refused_second_registration_takes_the_winners() {
        let (backend, connector) = scripted();
        let mut first = Descriptor::new(vec![0u8; 64]).unwrap();
        let second = first.split_off(32).unwrap();
        // While `first` registers, `second` registers and publishes first;
        // the backend then refuses `first`'s registration of the same memory.
        let other = connector.clone();
        let second = Arc::new(Mutex::new(Some(second)));
        let inner = Arc::clone(&second);
        *backend.on_register.lock().unwrap() = Some(Box::new(move || {
            let mut view = inner.lock().unwrap().take().unwrap();
            view.register_memory(&other).unwrap();
            *inner.lock().unwrap() = Some(view);
        }));
        backend.refuse_registration.store(true, Ordering::SeqCst);
        first.register_memory(&connector).unwrap();
        let second = second.lock().unwrap().take().unwrap();
        assert!(first.is_registered() && second.is_registered());
        assert_eq!(backend.registered.load(Ordering::SeqCst), 1);
        drop((first, second));
        assert_eq!(backend.deregistered.load(Ordering::SeqCst), 1);
    }

    /// What a random sequence does to a pool's views.
    #[derive(Debug, Clone)]
    enum Step {
        Checkout(usize),
        Run(usize),
        Blocks(Vec<usize>),
        Split(usize, usize),
        Unsplit(usize, usize),
        Drop(usize),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                (0usize..4).prop_map(Step::Checkout),
                (1usize..5).prop_map(Step::Run),
                prop::collection::vec(0usize..20, 0..4).prop_map(Step::Blocks),
                (0usize..16, 1usize..4).prop_map(|(v, at)| Step::Split(v, at)),
                (0usize..16, 0usize..16).prop_map(|(a, b)| Step::Unsplit(a, b)),
                (0usize..16).prop_map(Step::Drop),
            ],
            1..60,
        )
    }

    /// Live views never overlap, each lies in the pool, and the free count
    /// is the pool's blocks less the live views' blocks.
    fn check(pool: &BlockPool, views: &[Descriptor]) {
        let mut spans: Vec<(usize, usize)> = views
            .iter()
            .map(|v| (v.ptr() - pool.ptr(), v.capacity()))
            .collect();
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "overlap: {spans:?}");
        }
        let used: usize = spans.iter().map(|&(_, len)| len / pool.block_size()).sum();
        assert!(
            spans
                .iter()
                .all(|&(s, l)| s + l <= pool.blocks() * pool.block_size())
        );
        assert_eq!(pool.free(), pool.blocks() - used);
    }

    proptest! {
        #[test]
        fn random_checkouts_splits_and_drops_keep_views_disjoint(steps in steps()) {
            let (backend, connector) = scripted();
            let pool = BlockPool::new(&connector, vec![0u8; 16 * 8], block(8)).unwrap();
            let mut views: Vec<Descriptor> = Vec::new();
            for step in steps {
                match step {
                    Step::Checkout(n) => views.extend(pool.checkout(n).unwrap_or_default()),
                    Step::Run(n) => views.extend(pool.checkout_run(n)),
                    Step::Blocks(indices) => views.extend(pool.checkout_blocks(&indices).unwrap_or_default()),
                    Step::Split(v, at) if v < views.len() => {
                        if let Ok(tail) = views[v].split_off(at * 8) {
                            views.push(tail);
                        }
                    }
                    Step::Unsplit(a, b) if a < views.len() && b < views.len() && a != b => {
                        let other = views.remove(b);
                        let a = if b < a { a - 1 } else { a };
                        if let Err(other) = views[a].unsplit(other) {
                            views.push(other);
                        }
                    }
                    Step::Drop(v) if v < views.len() => drop(views.swap_remove(v)),
                    _ => {}
                }
                check(&pool, &views);
            }
            drop(views);
            prop_assert_eq!(pool.free(), 16);
            drop(pool);
            prop_assert_eq!(backend.deregistered.load(Ordering::SeqCst), 1);
        }
    }
}
