//! [`Descriptor`]: an owned view of registered memory on one device.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use bytemuck::Pod;
use bytes::Bytes;

use crate::backend::{RegionId, Segment};
use crate::buffer::{MemoryBuffer, RawMemory};
use crate::connector::Connector;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::metadata::SerializedDescriptor;
use crate::region::Region;

/// An owned, contiguous view of memory on one device: what operations move.
///
/// Build one from an owned buffer ([`new`](Self::new)), from an owned buffer and
/// the device it must be on ([`with_device`](Self::with_device)), from bytes
/// ([`from_bytes`](Self::from_bytes), or `From<Vec<u8>>`), or from foreign memory
/// ([`from_raw_parts`](Self::from_raw_parts)): such a descriptor is the one
/// view of its buffer. Or check views out of memory registered once: a
/// [`BlockPool`](crate::BlockPool) or [`RegisteredMemory`](crate::RegisteredMemory).
/// Operations take descriptors by value and hand them back when no transfer
/// can touch them any more; take a buffer back with
/// [`into_buffer`](Self::into_buffer) or [`into_vec`](Self::into_vec).
///
/// # Views, capacity and size
///
/// A descriptor owns `capacity()` bytes starting at `ptr()`; no other live
/// descriptor overlaps them. [`split_to`](Self::split_to),
/// [`split_off`](Self::split_off) and [`unsplit`](Self::unsplit) divide and
/// join views of one buffer without copying, as `bytes::BytesMut` does.
/// [`size`](Self::size) is what a transfer moves and what metadata publishes:
/// the capacity unless [`set_size`](Self::set_size) made it less (a partial
/// length). All views of one buffer share one registration: it ends, and the
/// memory is released, only after the last view (and pool handle) is gone.
///
/// ```
/// # use descriptor_core::Descriptor;
/// let mut head = Descriptor::new(vec![0u8; 4096])?;
/// let tail = head.split_off(1024)?; // [1024, 4096): another view, no copy
/// assert_eq!((head.capacity(), tail.capacity()), (1024, 3072));
/// assert_eq!(tail.ptr(), head.ptr() + 1024);
/// head.unsplit(tail).expect("adjacent views of one buffer");
/// head.set_size(100)?; // move only the first 100 bytes
/// assert_eq!((head.size(), head.capacity()), (100, 4096));
/// assert_eq!(head.into_vec::<u8>().ok().map(|v| v.len()), Some(4096));
/// # Ok::<(), descriptor_core::Error>(())
/// ```
pub struct Descriptor {
    region: Arc<Region>,
    /// Where the view starts in the region.
    offset: usize,
    /// The bytes the view owns; 0 only for the view of an empty buffer and
    /// for a view being dissolved ([`unsplit`](Self::unsplit)); the drop of
    /// either gives nothing back.
    capacity: usize,
    /// The bytes a transfer moves: `size <= capacity`.
    size: usize,
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // The range goes back to the pool (a leaf lock, no backend call);
        // then the `Arc`: the last one deregisters and frees (`Region::drop`).
        self.region.give_back(self.offset, self.capacity);
        Region::keep_while_reached(&self.region);
    }
}

impl Descriptor {
    /// Describes an owned buffer; the device is the buffer's own.
    ///
    /// ```
    /// # use descriptor_core::{Descriptor, Device};
    /// let d = Descriptor::new(vec![0u32; 1024])?;
    /// assert_eq!((d.size(), d.device()), (4096, Device::HOST));
    /// # Ok::<(), descriptor_core::Error>(())
    /// ```
    pub fn new<B: MemoryBuffer>(buffer: B) -> Result<Descriptor> {
        let region = Region::new(buffer, |_| Ok(None))?;
        let len = region.whole().len;
        Ok(Descriptor::view(region, 0, len))
    }

    /// A view of `[offset, offset + len)` of `region`, whose range the caller
    /// owns (V1: handed out by the region's allocator, or the region's
    /// whole buffer for its one view).
    pub(crate) fn view(region: Arc<Region>, offset: usize, len: usize) -> Descriptor {
        Descriptor {
            region,
            offset,
            capacity: len,
            size: len,
        }
    }

    /// Describes an owned buffer that must live on `device`: the checked form of
    /// Dynamo's `(array, device)`. A buffer on another device is an error rather
    /// than a silently mislabelled descriptor.
    pub fn with_device<B: MemoryBuffer>(buffer: B, device: Device) -> Result<Descriptor> {
        let actual = buffer.device();
        if actual != device {
            return Err(Error::InvalidDescriptor(format!(
                "the buffer lives on {actual}, not on {device}"
            )));
        }
        Descriptor::new(buffer)
    }

    /// Describes read-only bytes in host memory. Such a descriptor can back a
    /// readable operation, never a writable one.
    pub fn from_bytes(bytes: Bytes) -> Result<Descriptor> {
        Descriptor::new(bytes)
    }

    /// Describes foreign memory by address, size and device, keeping `keep_alive`
    /// (if any) alive as long as the descriptor.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + size` must be one region on `device`, valid for reads and writes
    /// until the descriptor and everything it is moved into are dropped, and
    /// nothing else may access that memory while an operation holds the descriptor.
    /// A cancelled operation holds it until its transfer drained (a backend
    /// that cannot abort, NIXL, keeps writing until then): describing the
    /// same memory again for another operation before the first one's
    /// `wait_released` returned true breaks this contract.
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        size: usize,
        device: Device,
        keep_alive: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<Descriptor> {
        // SAFETY: the caller upholds `RawMemory::new`'s contract, which is ours.
        let memory = unsafe { RawMemory::new(ptr, size, device, keep_alive) };
        Descriptor::new(memory)
    }

    /// Registers the memory with `connector`'s backend. Calling it again with the
    /// same connector does nothing; with another connector it is an error.
    /// Operations register their descriptors themselves. All views of one
    /// buffer share one registration.
    pub fn register_memory(&mut self, connector: &Connector) -> Result<()> {
        self.region.register(connector).map(drop)
    }

    /// Whether the memory is registered with a connector.
    pub fn is_registered(&self) -> bool {
        self.region.id().is_some()
    }

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.region.whole().device
    }

    /// Bytes a transfer moves: the [`capacity`](Self::capacity) unless
    /// [`set_size`](Self::set_size) made it less. Metadata publishes it, and
    /// the pairing rules compare it. Zero for an empty buffer (or a size set
    /// to 0): such a descriptor pairs with a peer's of size 0, and the
    /// transfer moves nothing for it, as Dynamo's does.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes this view owns.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Makes a transfer move the first `size` bytes of the view only (a
    /// partial length; 0 moves nothing); [`Error::InvalidDescriptor`] unless
    /// `size <= capacity()`. The bytes past it are neither sent nor
    /// overwritten, and stay the view's.
    pub fn set_size(&mut self, size: usize) -> Result<()> {
        if size > self.capacity {
            return Err(Error::InvalidDescriptor(format!(
                "size {size} is not within 0..={} (the view's capacity)",
                self.capacity
            )));
        }
        self.size = size;
        Ok(())
    }

    /// Moves the whole view again: `size() == capacity()`.
    pub fn reset_size(&mut self) {
        self.size = self.capacity;
    }

    /// Start address, as a peer sees it in [`RdmaMetadata`](crate::RdmaMetadata).
    ///
    /// For read-only memory ([`is_writable`](Self::is_writable) false)
    /// registered with a backend that does not enforce access
    /// ([`RegistrationBackend::access_enforced`](crate::RegistrationBackend::access_enforced):
    /// NIXL), that is the address of the private copy registered in its
    /// place, from registration on: a peer that writes what it was shown
    /// for reading changes that copy, never the memory.
    pub fn ptr(&self) -> usize {
        self.region.addr() + self.offset
    }

    /// Whether transfers may write into the memory.
    pub fn is_writable(&self) -> bool {
        self.region.is_writable()
    }

    /// For a view of a [`BlockPool`](crate::BlockPool): the index of its
    /// first block.
    pub fn block_index(&self) -> Option<usize> {
        self.region.block_size().map(|block| self.offset / block)
    }

    /// The first [`size`](Self::size) bytes, for host memory (`None` for device memory).
    pub fn as_slice(&self) -> Option<&[u8]> {
        self.host_bytes(self.size)
    }

    /// The first [`size`](Self::size) bytes, mutably, for writable host memory.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        self.host_bytes_mut(self.size)
    }

    /// All [`capacity`](Self::capacity) bytes of the view, for host memory.
    pub fn as_full_slice(&self) -> Option<&[u8]> {
        self.host_bytes(self.capacity)
    }

    /// All [`capacity`](Self::capacity) bytes of the view, mutably, for
    /// writable host memory.
    pub fn as_full_mut_slice(&mut self) -> Option<&mut [u8]> {
        self.host_bytes_mut(self.capacity)
    }

    fn host_bytes(&self, len: usize) -> Option<&[u8]> {
        if !self.device().is_host() {
            return None;
        }
        // SAFETY: host memory valid for reads of the whole buffer
        // (MemoryBuffer's contract), of which `[offset, offset + len)` is in
        // bounds (`len <= capacity`). No other live view overlaps it (V1),
        // and no transfer touches it while the caller holds this view,
        // because operations own the views they move (V2).
        Some(unsafe { std::slice::from_raw_parts(self.region.base().add(self.offset), len) })
    }

    fn host_bytes_mut(&mut self, len: usize) -> Option<&mut [u8]> {
        if !self.device().is_host() || !self.is_writable() {
            return None;
        }
        // SAFETY: as in `host_bytes`, plus the buffer permits writes through
        // its base pointer, and `&mut self` makes this the only reference to
        // the view's bytes (no other view overlaps them).
        Some(unsafe { std::slice::from_raw_parts_mut(self.region.base().add(self.offset), len) })
    }

    /// Splits the view in two at `at`: returns `[0, at)` and keeps
    /// `[at, capacity)`. Both halves move their whole capacity afterwards.
    /// [`Error::InvalidDescriptor`] unless `0 < at < capacity()`, and, for a
    /// block pool's view, `at` falls on a block boundary.
    pub fn split_to(&mut self, at: usize) -> Result<Descriptor> {
        self.check_split(at)?;
        let head = Descriptor::view(Arc::clone(&self.region), self.offset, at);
        self.offset += at;
        self.capacity -= at;
        self.size = self.capacity;
        Ok(head)
    }

    /// Splits the view in two at `at`: returns `[at, capacity)` and keeps
    /// `[0, at)`. The rules are [`split_to`](Self::split_to)'s.
    pub fn split_off(&mut self, at: usize) -> Result<Descriptor> {
        self.check_split(at)?;
        let tail = Descriptor::view(
            Arc::clone(&self.region),
            self.offset + at,
            self.capacity - at,
        );
        self.capacity = at;
        self.size = at;
        Ok(tail)
    }

    fn check_split(&self, at: usize) -> Result<()> {
        if at == 0 || at >= self.capacity {
            return Err(Error::InvalidDescriptor(format!(
                "cannot split a view of {} bytes at {at} (0 < at < capacity)",
                self.capacity
            )));
        }
        if let Some(block) = self.region.block_size()
            && !at.is_multiple_of(block)
        {
            return Err(Error::InvalidDescriptor(format!(
                "a block pool's view splits at block boundaries only: {at} is not a multiple of {block}"
            )));
        }
        Ok(())
    }

    /// Joins `other` onto the end of this view, without copying: `other` must
    /// be a view of the same buffer starting where this one ends, as a
    /// [`split_off`](Self::split_off) leaves them. Otherwise `other` comes
    /// back. Afterwards the view moves its whole capacity.
    pub fn unsplit(&mut self, mut other: Descriptor) -> Result<(), Descriptor> {
        if !Arc::ptr_eq(&self.region, &other.region) || other.offset != self.offset + self.capacity
        {
            return Err(other);
        }
        self.capacity += other.capacity;
        self.size = self.capacity;
        // Its range is now this view's: its drop gives nothing back.
        other.capacity = 0;
        Ok(())
    }

    /// Deregisters (if registered) and returns the buffer, if it is a `B` and
    /// this descriptor is its only view, covering all of it (not a view of a
    /// pool, nor one half of a split) and no transfer of this process may
    /// still reach it through a peer agent (a READ of a readable made of
    /// it that is still in flight); otherwise gives the descriptor back
    /// unchanged.
    ///
    /// ```
    /// # use descriptor_core::Descriptor;
    /// let d = Descriptor::new(vec![7u16; 8])?;
    /// let d = d.into_buffer::<Vec<u8>>().unwrap_err(); // wrong type: the descriptor comes back
    /// assert_eq!(d.into_buffer::<Vec<u16>>().ok(), Some(vec![7u16; 8]));
    /// # Ok::<(), descriptor_core::Error>(())
    /// ```
    pub fn into_buffer<B: MemoryBuffer>(mut self) -> Result<B, Descriptor> {
        let whole = self.region.whole();
        // A transfer of this process may still reach the memory through a
        // peer agent: the buffer stays with the descriptor (see `reach`).
        if self.offset != 0
            || self.capacity != whole.len
            || crate::reach::is_reached(whole.addr, whole.len)
        {
            return Err(self);
        }
        // On success the view keeps the emptied region, and dropping it
        // frees only the region's own allocation.
        Region::take_buffer::<B>(&mut self.region).ok_or(self)
    }

    /// [`into_buffer`](Self::into_buffer) for a `Vec<T>`.
    pub fn into_vec<T: Pod + Send + Sync>(self) -> Result<Vec<T>, Descriptor> {
        self.into_buffer::<Vec<T>>()
    }

    /// The bytes a transfer moves, as a backend sees them.
    pub(crate) fn segment(&self) -> Segment {
        Segment {
            addr: self.ptr(),
            len: self.size,
            device: self.device(),
        }
    }

    /// Registers the view's region with `connector` (once) and returns its
    /// handle: what an operation does with each descriptor it takes.
    pub(crate) fn register_view(&mut self, connector: &Connector) -> Result<RegionId> {
        self.region.register(connector)
    }

    pub(crate) fn serialized(&self) -> SerializedDescriptor {
        SerializedDescriptor {
            device: self.device(),
            ptr: self.ptr() as u64,
            size: self.size as u64,
        }
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("device", &self.device())
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("size", &self.size)
            .field("capacity", &self.capacity)
            .field("writable", &self.is_writable())
            .field("registered_with", &self.region.registered_with())
            .finish()
    }
}

impl TryFrom<Vec<u8>> for Descriptor {
    type Error = Error;
    fn try_from(v: Vec<u8>) -> Result<Descriptor> {
        Descriptor::new(v)
    }
}

impl TryFrom<Bytes> for Descriptor {
    type Error = Error;
    fn try_from(b: Bytes) -> Result<Descriptor> {
        Descriptor::from_bytes(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    #[test]
    fn typed_buffer_reports_its_bytes_and_comes_back_intact() {
        let data: Vec<u64> = (0..512).collect();
        let d = Descriptor::new(data.clone()).unwrap();
        assert_eq!(d.size(), 4096);
        assert_eq!(
            d.as_slice().unwrap(),
            bytemuck::cast_slice::<u64, u8>(&data)
        );
        assert_eq!(d.into_vec::<u64>().unwrap(), data);
    }

    #[test]
    fn empty_buffers_describe_zero_bytes_and_come_back() {
        let d = Descriptor::new(Vec::<u8>::new()).unwrap();
        assert_eq!((d.size(), d.capacity()), (0, 0));
        assert_ne!(d.ptr(), 0, "a published address is never null");
        assert_eq!(d.as_slice(), Some(&[][..]));
        assert_eq!((d.serialized().size, d.segment().len), (0, 0));
        assert!(d.into_vec::<u8>().unwrap().is_empty());
        let ro = Descriptor::from_bytes(Bytes::new()).unwrap();
        assert_eq!((ro.size(), ro.is_writable()), (0, false));
        let mut rw = Descriptor::new(BytesMut::new()).unwrap();
        assert_eq!(rw.as_mut_slice(), Some(&mut [][..]));
        // An empty view cannot be split, and keeps its size of 0.
        assert!(rw.split_off(0).is_err());
        rw.set_size(0).unwrap();
        assert!(rw.set_size(1).is_err());
        // A null address is refused, whatever the length (as Dynamo does).
        // SAFETY: never dereferenced: refused before any use.
        let null =
            unsafe { Descriptor::from_raw_parts(std::ptr::null_mut(), 0, Device::HOST, None) };
        assert!(matches!(null, Err(Error::InvalidDescriptor(m)) if m.contains("null")));
    }

    #[test]
    fn bytes_are_read_only_and_bytes_mut_writable() {
        let mut ro = Descriptor::from_bytes(Bytes::from_static(b"hello")).unwrap();
        assert!(!ro.is_writable());
        assert!(ro.as_mut_slice().is_none());
        assert_eq!(ro.as_slice(), Some(&b"hello"[..]));
        let mut rw = Descriptor::new(BytesMut::from(&b"hello"[..])).unwrap();
        rw.as_mut_slice().unwrap()[0] = b'j';
        assert_eq!(&rw.into_buffer::<BytesMut>().unwrap()[..], b"jello");
    }

    #[test]
    fn explicit_device_must_match_the_buffer() {
        assert!(Descriptor::with_device(vec![1u8; 4], Device::HOST).is_ok());
        assert!(matches!(
            Descriptor::with_device(vec![1u8; 4], Device::cuda(0)),
            Err(Error::InvalidDescriptor(m)) if m.contains("cuda:0")
        ));
    }

    #[test]
    fn raw_parts_keep_their_owner_alive_and_report_the_given_device() {
        let mut owner = vec![9u8; 64];
        let ptr = owner.as_mut_ptr();
        // SAFETY: `owner` travels as the keep-alive, so the memory outlives the descriptor.
        let d = unsafe { Descriptor::from_raw_parts(ptr, 64, Device::HOST, Some(Box::new(owner))) }
            .unwrap();
        assert_eq!((d.ptr(), d.size()), (ptr as usize, 64));
        assert_eq!(d.as_slice().unwrap(), &[9u8; 64][..]);
        let raw = d.into_buffer::<RawMemory>().unwrap();
        let owner = raw
            .into_keep_alive()
            .unwrap()
            .downcast::<Vec<u8>>()
            .unwrap();
        assert_eq!(*owner, vec![9u8; 64]);
        // SAFETY: never dereferenced: construction fails on the null pointer.
        let null =
            unsafe { Descriptor::from_raw_parts(std::ptr::null_mut(), 8, Device::HOST, None) };
        assert!(null.is_err());
    }

    #[test]
    fn device_memory_has_no_host_slice() {
        let mut owner = vec![0u8; 16];
        // SAFETY: labelled as CUDA memory, so the descriptor never reads it.
        let d =
            unsafe { Descriptor::from_raw_parts(owner.as_mut_ptr(), 16, Device::cuda(1), None) }
                .unwrap();
        assert_eq!(d.device(), Device::cuda(1));
        assert!(d.as_slice().is_none());
        drop(d);
        drop(owner);
    }

    #[test]
    fn split_views_partition_the_buffer_and_unsplit_joins_them_back() {
        let mut whole =
            Descriptor::new((0..=255u8).cycle().take(4096).collect::<Vec<u8>>()).unwrap();
        let base = whole.ptr();
        let head = whole.split_to(1000).unwrap();
        let tail = whole.split_off(2000).unwrap();
        // [0, 1000), [1000, 3000), [3000, 4096): disjoint, in order, no copy.
        let views = [&head, &whole, &tail];
        let spans: Vec<(usize, usize)> = views
            .iter()
            .map(|v| (v.ptr() - base, v.capacity()))
            .collect();
        assert_eq!(spans, [(0, 1000), (1000, 2000), (3000, 1096)]);
        assert_eq!(tail.as_slice().unwrap()[0], (3000 % 256) as u8);
        assert!(views.iter().all(|v| v.size() == v.capacity()));
        // Only a neighbour of the same buffer joins, and only at its end.
        let stranger = Descriptor::new(vec![0u8; 16]).unwrap();
        let mut head = head;
        let stranger = head.unsplit(stranger).unwrap_err();
        let tail = head.unsplit(tail).unwrap_err();
        head.unsplit(whole).unwrap();
        head.unsplit(tail).unwrap();
        assert_eq!(
            (head.ptr(), head.capacity(), head.size()),
            (base, 4096, 4096)
        );
        // Whole again, and the only view: the buffer comes back.
        let bytes = head.into_vec::<u8>().unwrap();
        assert_eq!(bytes, (0..=255u8).cycle().take(4096).collect::<Vec<u8>>());
        drop(stranger);
    }

    #[test]
    fn a_split_view_does_not_give_its_buffer_back_while_another_lives() {
        let mut d = Descriptor::new(vec![1u8; 64]).unwrap();
        let tail = d.split_off(32).unwrap();
        let d = d.into_vec::<u8>().unwrap_err();
        drop(tail);
        // Alone, but covering half: still not the whole buffer.
        let d = d.into_vec::<u8>().unwrap_err();
        assert_eq!(d.capacity(), 32);
    }

    #[test]
    fn splits_outside_the_view_are_refused() {
        let mut d = Descriptor::new(vec![0u8; 8]).unwrap();
        for at in [0, 8, 9, usize::MAX] {
            assert!(
                matches!(d.split_to(at), Err(Error::InvalidDescriptor(_))),
                "{at}"
            );
            assert!(
                matches!(d.split_off(at), Err(Error::InvalidDescriptor(_))),
                "{at}"
            );
        }
        assert_eq!(d.capacity(), 8);
    }

    #[test]
    fn a_partial_length_limits_the_slice_and_the_metadata_not_the_view() {
        let mut d = Descriptor::new(vec![5u8; 100]).unwrap();
        assert!(
            matches!(d.set_size(101), Err(Error::InvalidDescriptor(m)) if m.contains("0..=100"))
        );
        d.set_size(0).unwrap();
        assert_eq!((d.size(), d.as_slice().map(<[u8]>::len)), (0, Some(0)));
        d.set_size(10).unwrap();
        assert_eq!((d.size(), d.capacity()), (10, 100));
        assert_eq!(d.as_slice().unwrap().len(), 10);
        assert_eq!(d.as_full_slice().unwrap().len(), 100);
        assert_eq!(d.as_mut_slice().unwrap().len(), 10);
        assert_eq!(d.as_full_mut_slice().unwrap().len(), 100);
        assert_eq!((d.serialized().size, d.segment().len), (10, 10));
        d.reset_size();
        assert_eq!(d.size(), 100);
        d.set_size(1).unwrap();
        // A split resets both halves to their capacity.
        let tail = d.split_off(40).unwrap();
        assert_eq!((d.size(), tail.size()), (40, 60));
        // Taking the buffer back gives all of it.
        d.unsplit(tail).unwrap();
        d.set_size(3).unwrap();
        assert_eq!(d.into_vec::<u8>().unwrap().len(), 100);
    }
}
