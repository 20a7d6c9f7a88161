//! [`Descriptor`]: one contiguous region of memory on one device, with its owner.

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

use bytemuck::Pod;
use bytes::Bytes;

use crate::backend::{RegionId, RegistrationBackend, Segment};
use crate::buffer::{MemoryBuffer, RawMemory};
use crate::connector::Connector;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::metadata::SerializedDescriptor;

/// One contiguous region on one device, owning the memory it describes.
///
/// Build one from an owned buffer ([`new`](Self::new)), from an owned buffer and
/// the device it must be on ([`with_device`](Self::with_device)), from bytes
/// ([`from_bytes`](Self::from_bytes), or `From<Vec<u8>>`), or from foreign memory
/// ([`from_raw_parts`](Self::from_raw_parts)). Operations take descriptors by value
/// and hand them back when no transfer can touch them any more; take the buffer
/// back with [`into_buffer`](Self::into_buffer) or [`into_vec`](Self::into_vec).
///
/// A registered descriptor deregisters itself when dropped, before its memory is
/// released.
pub struct Descriptor {
    /// Deregistered (in `Drop`) before the buffer is released.
    registration: Option<Registration>,
    ptr: *mut u8,
    segment: Segment,
    writable: bool,
    /// `Some` until `into_buffer` takes it or `drop` releases (or leaks) it.
    buffer: Option<Box<dyn MemoryBuffer>>,
}

// SAFETY: `ptr` points into `buffer`, which is Send + Sync; the descriptor only
// hands out references to that memory through `&self`/`&mut self`, so moving it
// or sharing it across threads is as safe as for the buffer itself.
unsafe impl Send for Descriptor {}
// SAFETY: see `Send`: `&Descriptor` only gives shared reads of the memory.
unsafe impl Sync for Descriptor {}

struct Registration {
    connector_id: u64,
    connector_name: Arc<str>,
    backend: Arc<dyn RegistrationBackend>,
    region: RegionId,
}

impl Registration {
    /// Deregisters the region; false if the backend refused or panicked, in
    /// which case it may still hand the memory to peers.
    fn deregister(&self) -> bool {
        match catch_unwind(AssertUnwindSafe(|| self.backend.deregister(self.region))) {
            Ok(Ok(())) => true,
            Ok(Err(error)) => {
                tracing::error!(%error, connector = %self.connector_name, region = self.region.0, "deregistration failed");
                false
            }
            Err(_) => {
                tracing::error!(connector = %self.connector_name, region = self.region.0, "deregistration panicked");
                false
            }
        }
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        if let Some(registration) = self.registration.take()
            && !registration.deregister()
        {
            // Still registered as far as we know: leak rather than free
            // memory the backend might let a peer reach.
            std::mem::forget(self.buffer.take());
        }
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
        // Box first, then take the pointer: later moves of the descriptor move
        // only the box pointer, never the buffer value the pointer came from.
        let mut buffer: Box<dyn MemoryBuffer> = Box::new(buffer);
        let len = buffer.len();
        let device = buffer.device();
        let writable = buffer.is_writable();
        let ptr = buffer.base_ptr();
        if len == 0 {
            return Err(Error::InvalidDescriptor("the buffer is empty".into()));
        }
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
        Ok(Descriptor {
            registration: None,
            ptr,
            segment: Segment { addr, len, device },
            writable,
            buffer: Some(buffer),
        })
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
    /// Operations register their descriptors themselves.
    pub fn register_memory(&mut self, connector: &Connector) -> Result<()> {
        match &self.registration {
            Some(r) if r.connector_id == connector.id() => Ok(()),
            Some(r) => Err(Error::RegisteredElsewhere {
                registered: r.connector_name.to_string(),
                requested: connector.name().to_owned(),
            }),
            None => {
                let started = Instant::now();
                let backend = connector.backend_arc();
                // SAFETY: the buffer stays valid (and writable if it says so) until
                // `Registration::drop` deregisters it, which happens before the
                // buffer is dropped; `addr` came from `expose_provenance`; and while
                // an operation owns the descriptor nothing else can reach the memory.
                let region = unsafe { backend.register(&self.segment, self.writable)? };
                tracing::debug!(
                    connector = connector.name(),
                    bytes = self.segment.len,
                    device = %self.segment.device,
                    region = region.0,
                    elapsed_us = started.elapsed().as_micros() as u64,
                    "registered memory"
                );
                self.registration = Some(Registration {
                    connector_id: connector.id(),
                    connector_name: connector.shared_name(),
                    backend,
                    region,
                });
                Ok(())
            }
        }
    }

    /// Whether the memory is registered with a connector.
    pub fn is_registered(&self) -> bool {
        self.registration.is_some()
    }

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.segment.device
    }

    /// Size in bytes (never zero).
    pub fn size(&self) -> usize {
        self.segment.len
    }

    /// Start address, as a peer sees it in [`RdmaMetadata`](crate::RdmaMetadata).
    pub fn ptr(&self) -> usize {
        self.segment.addr
    }

    /// Whether transfers may write into the memory.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The bytes, for host memory (`None` for device memory).
    pub fn as_slice(&self) -> Option<&[u8]> {
        if !self.segment.device.is_host() {
            return None;
        }
        // SAFETY: host memory valid for reads of `len` bytes (MemoryBuffer's
        // contract); no transfer touches it while the caller holds the descriptor,
        // because operations own the descriptors they transfer.
        Some(unsafe { std::slice::from_raw_parts(self.ptr, self.segment.len) })
    }

    /// The bytes, mutably, for writable host memory.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        if !self.segment.device.is_host() || !self.writable {
            return None;
        }
        // SAFETY: as in `as_slice`, plus the buffer permits writes through `ptr`
        // and `&mut self` makes this the only reference.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.segment.len) })
    }

    /// Deregisters (if registered) and returns the buffer, if it is a `B`;
    /// otherwise gives the descriptor back unchanged.
    ///
    /// ```
    /// # use descriptor_core::Descriptor;
    /// let d = Descriptor::new(vec![7u16; 8])?;
    /// let d = d.into_buffer::<Vec<u8>>().unwrap_err(); // wrong type: the descriptor comes back
    /// assert_eq!(d.into_buffer::<Vec<u16>>().ok(), Some(vec![7u16; 8]));
    /// # Ok::<(), descriptor_core::Error>(())
    /// ```
    pub fn into_buffer<B: MemoryBuffer>(mut self) -> Result<B, Descriptor> {
        let is_b = self
            .buffer
            .as_deref()
            .is_some_and(|b| (b as &dyn Any).is::<B>());
        if !is_b {
            return Err(self);
        }
        if let Some(registration) = &self.registration {
            if !registration.deregister() {
                // Still registered: the descriptor comes back, and leaks its
                // memory when dropped unless deregistration works then.
                return Err(self);
            }
            self.registration = None;
        }
        let buffer: Option<Box<dyn Any>> = self.buffer.take().map(|b| b as Box<dyn Any>);
        match buffer.map(|b| b.downcast::<B>()) {
            Some(Ok(b)) => Ok(*b),
            // `is::<B>()` was checked above.
            _ => unreachable!("type checked before downcast"),
        }
    }

    /// [`into_buffer`](Self::into_buffer) for a `Vec<T>`.
    pub fn into_vec<T: Pod + Send + Sync>(self) -> Result<Vec<T>, Descriptor> {
        self.into_buffer::<Vec<T>>()
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    pub(crate) fn region(&self) -> Option<RegionId> {
        self.registration.as_ref().map(|r| r.region)
    }

    pub(crate) fn serialized(&self) -> SerializedDescriptor {
        SerializedDescriptor {
            device: self.segment.device,
            ptr: self.segment.addr as u64,
            size: self.segment.len as u64,
        }
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("device", &self.segment.device)
            .field("ptr", &format_args!("{:#x}", self.segment.addr))
            .field("size", &self.segment.len)
            .field("writable", &self.writable)
            .field(
                "registered_with",
                &self.registration.as_ref().map(|r| &*r.connector_name),
            )
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
    fn empty_buffers_are_refused() {
        assert!(matches!(
            Descriptor::new(Vec::<u8>::new()),
            Err(Error::InvalidDescriptor(_))
        ));
        assert!(matches!(
            Descriptor::from_bytes(Bytes::new()),
            Err(Error::InvalidDescriptor(_))
        ));
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
}
