//! [`RocmBuffer`]: owned VRAM from `hipMalloc`, usable as a descriptor's buffer.

use std::ffi::c_void;

use descriptor_core::{Device, Error, MemoryBuffer, Result};

use crate::hip::{MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, check, hip, unavailable};

/// Device memory from `hipMalloc` on one ROCm device.
pub struct RocmBuffer {
    ptr: *mut c_void,
    len: usize,
    ordinal: u32,
}

// SAFETY: a device allocation is a process-wide object usable from any thread
// (the device is selected before every call).
unsafe impl Send for RocmBuffer {}
// SAFETY: `&RocmBuffer` only reads the handle values.
unsafe impl Sync for RocmBuffer {}

impl std::fmt::Debug for RocmBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocmBuffer")
            .field("device", &Device::rocm(self.ordinal))
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl RocmBuffer {
    /// Allocates `len` zeroed bytes on ROCm device `ordinal`.
    pub fn alloc(ordinal: u32, len: usize) -> Result<RocmBuffer> {
        let hip = hip().ok_or_else(unavailable)?;
        if len == 0 {
            return Err(Error::InvalidDescriptor(
                "a ROCm buffer needs at least one byte".into(),
            ));
        }
        let mut ptr = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the allocation is freed in Drop.
        unsafe {
            check((hip.set_device)(ordinal as i32), "hipSetDevice")?;
            check((hip.malloc)(&mut ptr, len), "hipMalloc")?;
        }
        let buffer = RocmBuffer { ptr, len, ordinal };
        // SAFETY: `ptr` is a live allocation of `len` bytes.
        check(unsafe { (hip.memset)(ptr, 0, len) }, "hipMemset")?;
        Ok(buffer)
    }

    /// Copies `src` to the start of the buffer.
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        let hip = hip().ok_or_else(unavailable)?;
        if src.len() > self.len {
            return Err(Error::InvalidDescriptor(format!(
                "{} bytes do not fit a {}-byte ROCm buffer",
                src.len(),
                self.len
            )));
        }
        // SAFETY: the destination range is inside the allocation.
        let status = unsafe {
            (hip.memcpy)(
                self.ptr,
                src.as_ptr().cast(),
                src.len(),
                MEMCPY_HOST_TO_DEVICE,
            )
        };
        check(status, "hipMemcpy to the device")
    }

    /// Copies the whole buffer to host memory.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let hip = hip().ok_or_else(unavailable)?;
        let mut out = vec![0u8; self.len];
        // SAFETY: reads `len` bytes of the allocation into `out`.
        let status = unsafe {
            (hip.memcpy)(
                out.as_mut_ptr().cast(),
                self.ptr,
                self.len,
                MEMCPY_DEVICE_TO_HOST,
            )
        };
        check(status, "hipMemcpy to the host")?;
        Ok(out)
    }
}

impl Drop for RocmBuffer {
    fn drop(&mut self) {
        if let Some(hip) = hip() {
            // SAFETY: frees our own allocation once.
            if let Err(e) = check(unsafe { (hip.free)(self.ptr) }, "hipFree") {
                tracing::error!(error = %e, "hipFree failed");
            }
        }
    }
}

// SAFETY: `ptr..ptr+len` is one device allocation on `rocm:ordinal`, valid until
// the buffer drops, not inside the value.
unsafe impl MemoryBuffer for RocmBuffer {
    fn base_ptr(&mut self) -> *mut u8 {
        self.ptr.cast()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device(&self) -> Device {
        Device::rocm(self.ordinal)
    }
    fn is_writable(&self) -> bool {
        true
    }
}
