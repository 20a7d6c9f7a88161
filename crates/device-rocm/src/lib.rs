//! ROCm for [`descriptor_core`]: a device probe, pointer location and owned VRAM
//! buffers, through a small `libloading` shim over the dozen HIP functions needed.
//!
//! `hip-sys` 0.1.2 only builds with ROCm installed and carries the HIP 5.4 ABI,
//! whose memory-type numbering ROCm 6 changed; this shim loads
//! `libamdhip64.so` at run time (`$ROCM_PATH/lib`, `/opt/rocm/lib`, then the
//! dynamic linker's search, trying `.so`, `.so.7`, `.so.6`, `.so.5`) and decodes
//! pointer attributes by the runtime's version. Without ROCm it reports no
//! devices, never an error or a panic.
//!
//! ```
//! use descriptor_core::DeviceProbe;
//! let probe = device_rocm::RocmProbe;
//! println!("ROCm available: {}, devices: {}", probe.available(), probe.devices()?.len());
//! # Ok::<(), descriptor_core::Error>(())
//! ```

mod buffer;
mod hip;
mod probe;

pub use buffer::RocmBuffer;
pub use hip::MemoryKind;
pub use probe::RocmProbe;
