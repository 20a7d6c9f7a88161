//! Owned memory that transfers may touch: the [`MemoryBuffer`] trait.
//!
//! A remote peer reads or writes registered memory behind the compiler's back, so
//! the library takes *ownership* of buffers for as long as a transfer may touch
//! them and gives them back afterwards, the way io_uring runtimes do.

use std::any::Any;

use bytemuck::Pod;
use bytes::{Bytes, BytesMut};

use crate::device::Device;

/// Memory that can back a [`Descriptor`](crate::Descriptor).
///
/// Implemented for `Vec<T>` and `Box<[T]>` of plain-old-data `T`, for
/// [`bytes::Bytes`] (read-only) and [`bytes::BytesMut`], and by the device crates
/// for GPU memory. Foreign memory enters through
/// [`Descriptor::from_raw_parts`](crate::Descriptor::from_raw_parts) instead.
///
/// # Safety
///
/// An implementation guarantees that:
/// - the pointer returned by [`base_ptr`](Self::base_ptr) and [`len`](Self::len)
///   bytes from it are one region on [`device`](Self::device), valid for reads,
///   and for writes through that pointer when [`is_writable`](Self::is_writable)
///   is true, for as long as the value lives;
/// - the region is *not* inside the value itself, so moving the value does not move
///   the memory (a `Vec`'s heap block, not an array field);
/// - every method returns the same answer each time it is called;
/// - the memory is released only when the value is dropped, and nothing but the
///   value's owner reaches it.
pub unsafe trait MemoryBuffer: Any + Send + Sync {
    /// Start of the region. Called once, when the descriptor is built; for
    /// writable buffers the pointer must permit writes.
    fn base_ptr(&mut self) -> *mut u8;

    /// Length of the region in bytes.
    fn len(&self) -> usize;

    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device the region lives on.
    fn device(&self) -> Device {
        Device::HOST
    }

    /// Whether a transfer may write into the region.
    fn is_writable(&self) -> bool;
}

// SAFETY: a Vec's elements live in a heap block that moves of the Vec do not
// move; `as_mut_ptr` gives a write-capable pointer without creating a reference,
// and the Vec is never resized while the descriptor owns it.
unsafe impl<T: Pod + Send + Sync> MemoryBuffer for Vec<T> {
    fn base_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        std::mem::size_of_val(self.as_slice())
    }
    fn is_writable(&self) -> bool {
        true
    }
}

// SAFETY: as for `Vec<T>`: the slice lives on the heap, outside the box value.
unsafe impl<T: Pod + Send + Sync> MemoryBuffer for Box<[T]> {
    fn base_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        std::mem::size_of_val(&**self)
    }
    fn is_writable(&self) -> bool {
        true
    }
}

// SAFETY: `Bytes` points at shared immutable storage that outlives the handle and
// is never written: the buffer says it is read-only, so no transfer of ours
// writes to it, a backend that enforces access lets no peer write it, and on
// one that does not the region registers a private copy instead (`Shadow` in
// region.rs), so the storage itself is never registered there.
unsafe impl MemoryBuffer for Bytes {
    fn base_ptr(&mut self) -> *mut u8 {
        self.as_ptr().cast_mut()
    }
    fn len(&self) -> usize {
        Bytes::len(self)
    }
    fn is_writable(&self) -> bool {
        false
    }
}

// SAFETY: a `BytesMut` uniquely owns its heap storage; `as_mut_ptr` comes from a
// mutable borrow, and the descriptor never grows or splits it.
unsafe impl MemoryBuffer for BytesMut {
    fn base_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn len(&self) -> usize {
        BytesMut::len(self)
    }
    fn is_writable(&self) -> bool {
        true
    }
}

/// Foreign memory described by address, size and device, with an optional owner
/// kept alive as long as the descriptor: what
/// [`Descriptor::from_raw_parts`](crate::Descriptor::from_raw_parts) wraps.
pub struct RawMemory {
    ptr: *mut u8,
    len: usize,
    device: Device,
    keep_alive: Option<Box<dyn Any + Send + Sync>>,
}

impl RawMemory {
    /// Wraps foreign memory.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` must be one region on `device`, valid for reads and writes
    /// until this value (and with it `keep_alive`) is dropped, and nothing else may
    /// access it while a descriptor built from it is held by an operation.
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        device: Device,
        keep_alive: Option<Box<dyn Any + Send + Sync>>,
    ) -> RawMemory {
        RawMemory {
            ptr,
            len,
            device,
            keep_alive,
        }
    }

    /// Gives back the keep-alive owner, if one was given.
    pub fn into_keep_alive(self) -> Option<Box<dyn Any + Send + Sync>> {
        self.keep_alive
    }
}

impl std::fmt::Debug for RawMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawMemory")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.device)
            .field("keep_alive", &self.keep_alive.is_some())
            .finish()
    }
}

// SAFETY: the constructor's contract makes the region usable from any thread for
// the value's lifetime, and the keep-alive owner is itself Send + Sync.
unsafe impl Send for RawMemory {}
// SAFETY: shared references only read the pointer value, never the memory.
unsafe impl Sync for RawMemory {}

// SAFETY: `RawMemory::new`'s contract is this trait's contract.
unsafe impl MemoryBuffer for RawMemory {
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
        true
    }
}
