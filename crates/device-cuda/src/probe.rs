//! [`CudaProbe`]: devices and pointer locations, without creating a context.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::MaybeUninit;

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdevice_attribute, CUpointer_attribute};
use descriptor_core::{Device, DeviceInfo, DeviceProbe, Result};

use crate::driver::{NAME, error, ready};

/// The CUDA device probe.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaProbe;

fn attribute(dev: sys::CUdevice, attr: CUdevice_attribute) -> Option<i32> {
    // SAFETY: `dev` came from cuDeviceGet and the driver is initialised.
    unsafe { result::device::get_attribute(dev, attr) }.ok()
}

fn pci_bus_id(dev: sys::CUdevice) -> String {
    let mut buf = [0 as c_char; 32];
    // SAFETY: the buffer is 32 bytes, as passed; the driver NUL-terminates it.
    let status = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return String::new();
    }
    // SAFETY: NUL-terminated within the buffer on success.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

impl DeviceProbe for CudaProbe {
    fn platform(&self) -> &'static str {
        NAME
    }

    fn available(&self) -> bool {
        ready()
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        if !ready() {
            return Ok(Vec::new());
        }
        let count = result::device::get_count().map_err(|e| error("count devices", e))?;
        (0..count)
            .map(|ordinal| {
                let dev = result::device::get(ordinal)
                    .map_err(|e| error(format!("get device {ordinal}"), e))?;
                // SAFETY: `dev` is a valid device handle from cuDeviceGet.
                let total = unsafe { result::device::total_mem(dev) }
                    .map_err(|e| error(format!("memory of device {ordinal}"), e))?;
                let cc = attribute(
                    dev,
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                )
                .zip(attribute(
                    dev,
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                ));
                Ok(DeviceInfo {
                    device: Device::cuda(ordinal as u32),
                    name: result::device::get_name(dev).unwrap_or_default(),
                    total_memory: total as u64,
                    pci_bus_id: pci_bus_id(dev),
                    compute_capability: cc.map(|(a, b)| (a as u32, b as u32)),
                    gpudirect_rdma: attribute(
                        dev,
                        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
                    )
                    .map(|v| v != 0),
                })
            })
            .collect()
    }

    fn locate(&self, ptr: usize) -> Result<Option<Device>> {
        if !ready() || ptr == 0 {
            return Ok(None);
        }
        let mut ordinal = MaybeUninit::<c_int>::uninit();
        // SAFETY: queries the driver about an address without dereferencing it;
        // the output is one int, as the attribute requires.
        let status = unsafe {
            sys::cuPointerGetAttribute(
                ordinal.as_mut_ptr().cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr as sys::CUdeviceptr,
            )
        };
        if status != sys::CUresult::CUDA_SUCCESS {
            // CUDA_ERROR_INVALID_VALUE: not memory the driver knows (host memory).
            return Ok(None);
        }
        let mut kind = MaybeUninit::<u32>::uninit();
        // SAFETY: as above; CU_POINTER_ATTRIBUTE_MEMORY_TYPE writes one unsigned int.
        let status = unsafe {
            sys::cuPointerGetAttribute(
                kind.as_mut_ptr().cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr as sys::CUdeviceptr,
            )
        };
        // SAFETY: both succeeded, so both were written.
        let (ordinal, kind) = unsafe { (ordinal.assume_init(), kind.assume_init()) };
        let device_memory = status == sys::CUresult::CUDA_SUCCESS
            && kind == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
        Ok(device_memory.then(|| Device::cuda(ordinal as u32)))
    }
}
