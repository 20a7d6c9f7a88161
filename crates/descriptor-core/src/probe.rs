//! Device probes: what GPUs a machine has and where a pointer lives, behind one
//! small trait that `device-cuda` and `device-rocm` implement.

use crate::device::Device;
use crate::error::Result;

/// One GPU, as a probe reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device (`cuda:N`, `rocm:N`).
    pub device: Device,
    /// Marketing name, e.g. `"NVIDIA H200"`.
    pub name: String,
    /// Total memory in bytes.
    pub total_memory: u64,
    /// PCI bus id, e.g. `"0000:3b:00.0"`.
    pub pci_bus_id: String,
    /// Compute capability (CUDA) or GCN architecture major/minor (ROCm), if known.
    pub compute_capability: Option<(u32, u32)>,
    /// Whether the device supports GPUDirect RDMA, if the driver says.
    pub gpudirect_rdma: Option<bool>,
}

/// A GPU platform's probe. "No driver" and "no device" are normal answers
/// (`available() == false`, an empty list), never errors or panics.
pub trait DeviceProbe: Send + Sync {
    /// The platform, `"cuda"` or `"rocm"`.
    fn platform(&self) -> &'static str;

    /// Whether the platform's driver library could be loaded.
    fn available(&self) -> bool;

    /// The devices, in ordinal order; empty without a driver or a device.
    fn devices(&self) -> Result<Vec<DeviceInfo>>;

    /// The device holding `ptr`, or `None` if it is not memory of this platform
    /// (host memory, or no driver).
    fn locate(&self, ptr: usize) -> Result<Option<Device>>;
}
