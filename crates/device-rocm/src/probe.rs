//! [`RocmProbe`]: devices and pointer locations through the HIP shim.

use std::ffi::{CStr, c_char, c_int};

use descriptor_core::{Device, DeviceInfo, DeviceProbe, Result};

use crate::hip::{MemoryKind, NAME, PointerAttributes, check, hip};

/// The ROCm device probe.
#[derive(Debug, Clone, Copy, Default)]
pub struct RocmProbe;

fn string(buf: &[c_char]) -> String {
    CStr::from_bytes_until_nul(&buf.iter().map(|&c| c as u8).collect::<Vec<u8>>())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl RocmProbe {
    /// What kind of memory `ptr` is, as HIP reports it (decoded for the
    /// runtime's version); `None` without ROCm.
    pub fn memory_kind(&self, ptr: usize) -> Option<(MemoryKind, i32)> {
        let hip = hip()?;
        let mut attrs = PointerAttributes::default();
        // SAFETY: HIP fills the struct (same layout in ROCm 5-7) for any address
        // without dereferencing it; unknown host memory is an error status.
        let status =
            unsafe { (hip.pointer_get_attributes)(&mut attrs, std::ptr::without_provenance(ptr)) };
        if check(status, "hipPointerGetAttributes").is_err() {
            return Some((MemoryKind::Unregistered, -1));
        }
        Some((
            MemoryKind::decode(hip.runtime_version, attrs.memory_type),
            attrs.device,
        ))
    }
}

impl DeviceProbe for RocmProbe {
    fn platform(&self) -> &'static str {
        NAME
    }

    fn available(&self) -> bool {
        hip().is_some()
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let Some(hip) = hip() else {
            return Ok(Vec::new());
        };
        let mut count: c_int = 0;
        // SAFETY: valid out-pointer.
        let status = unsafe { (hip.get_device_count)(&mut count) };
        check(status, "hipGetDeviceCount")?;
        (0..count)
            .map(|ordinal| {
                let mut name = [0 as c_char; 256];
                let mut bus = [0 as c_char; 32];
                let mut total = 0usize;
                // SAFETY: buffers are as long as the lengths passed; out-pointer valid.
                unsafe {
                    check(
                        (hip.device_get_name)(name.as_mut_ptr(), name.len() as c_int, ordinal),
                        "hipDeviceGetName",
                    )?;
                    check(
                        (hip.device_total_mem)(&mut total, ordinal),
                        "hipDeviceTotalMem",
                    )?;
                    check(
                        (hip.device_get_pci_bus_id)(bus.as_mut_ptr(), bus.len() as c_int, ordinal),
                        "hipDeviceGetPCIBusId",
                    )?;
                }
                Ok(DeviceInfo {
                    device: Device::rocm(ordinal as u32),
                    name: string(&name),
                    total_memory: total as u64,
                    pci_bus_id: string(&bus),
                    compute_capability: None,
                    gpudirect_rdma: None,
                })
            })
            .collect()
    }

    fn locate(&self, ptr: usize) -> Result<Option<Device>> {
        Ok(match self.memory_kind(ptr) {
            Some((MemoryKind::Device, ordinal)) if ordinal >= 0 => {
                Some(Device::rocm(ordinal as u32))
            }
            _ => None,
        })
    }
}
