//! [`CudaBuffer`]: owned VRAM from `cuMemAlloc`, usable as a descriptor's buffer.

use cudarc::driver::result;
use cudarc::driver::sys;
use descriptor_core::{Device, Error, MemoryBuffer, Result};

use crate::driver::{error, ready, unavailable};

/// Device memory allocated with `cuMemAlloc` (not the stream-ordered pool, which
/// NIXL cannot register) in the device's primary context.
pub struct CudaBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ordinal: u32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: the buffer owns a device allocation and a primary-context reference;
// both are process-wide driver objects usable from any thread (the context is
// made current before every call).
unsafe impl Send for CudaBuffer {}
// SAFETY: `&CudaBuffer` only reads the handle values.
unsafe impl Sync for CudaBuffer {}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBuffer")
            .field("device", &Device::cuda(self.ordinal))
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl CudaBuffer {
    /// Allocates `len` bytes (zeroed) on CUDA device `ordinal`.
    pub fn alloc(ordinal: u32, len: usize) -> Result<CudaBuffer> {
        if !ready() {
            return Err(unavailable());
        }
        if len == 0 {
            return Err(Error::InvalidDescriptor(
                "a CUDA buffer needs at least one byte".into(),
            ));
        }
        let dev = result::device::get(ordinal as i32)
            .map_err(|e| error(format!("get device {ordinal}"), e))?;
        // SAFETY: `dev` is valid; the reference is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(|e| error("retain primary context", e))?;
        let mut buffer = CudaBuffer {
            ptr: 0,
            len,
            ordinal,
            dev,
            ctx,
        };
        buffer.bind()?;
        // SAFETY: a context is current; the memory is zeroed below before use.
        buffer.ptr = unsafe { result::malloc_sync(len) }
            .map_err(|e| error(format!("cuMemAlloc {len} bytes"), e))?;
        // SAFETY: `ptr` is a live allocation of `len` bytes.
        unsafe { result::memset_d8_sync(buffer.ptr, 0, len) }.map_err(|e| error("zero", e))?;
        Ok(buffer)
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is a retained primary context.
        unsafe { result::ctx::set_current(self.ctx) }
            .map_err(|e| error("make the context current", e))
    }

    /// The device.
    pub fn device(&self) -> Device {
        Device::cuda(self.ordinal)
    }

    /// Copies `src` to the start of the buffer.
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        if src.len() > self.len {
            return Err(Error::InvalidDescriptor(format!(
                "{} bytes do not fit a {}-byte CUDA buffer",
                src.len(),
                self.len
            )));
        }
        self.bind()?;
        // SAFETY: the destination range is inside the allocation; `&mut self`
        // means no transfer owns the buffer.
        unsafe { result::memcpy_htod_sync(self.ptr, src) }
            .map_err(|e| error("copy to the device", e))
    }

    /// Copies the whole buffer to host memory.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        self.bind()?;
        let mut out = vec![0u8; self.len];
        // SAFETY: reads `len` bytes of the live allocation into `out`.
        unsafe { result::memcpy_dtoh_sync(&mut out, self.ptr) }
            .map_err(|e| error("copy to the host", e))?;
        Ok(out)
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.bind().is_ok() {
            // SAFETY: frees our own allocation once; descriptors deregister
            // before dropping their buffer.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::error!(error = %e, "cuMemFree failed");
            }
        }
        // SAFETY: releases the reference taken in `alloc`.
        if let Err(e) = unsafe { result::primary_ctx::release(self.dev) } {
            tracing::error!(error = %e, "releasing the primary context failed");
        }
    }
}

// SAFETY: `ptr..ptr+len` is one device allocation on `cuda:ordinal`, valid until
// the buffer drops; it is not inside the value, and transfers (NIXL VRAM) may
// read and write it.
unsafe impl MemoryBuffer for CudaBuffer {
    fn base_ptr(&mut self) -> *mut u8 {
        std::ptr::without_provenance_mut(self.ptr as usize)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device(&self) -> Device {
        Device::cuda(self.ordinal)
    }
    fn is_writable(&self) -> bool {
        true
    }
}
