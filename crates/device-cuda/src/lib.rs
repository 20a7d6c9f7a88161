//! CUDA for [`descriptor_core`]: a device probe, pointer location and owned VRAM
//! buffers, through `cudarc`'s driver API with dynamic loading.
//!
//! The crate builds and runs without CUDA: `CudaProbe::available()` is false,
//! `CudaProbe::devices()` is empty (see [`descriptor_core::DeviceProbe`]) and [`CudaBuffer::alloc`] is
//! `Error::BackendUnavailable`. The driver is checked for before any cudarc call
//! (cudarc panics otherwise), and probing creates no context (contexts cost VRAM).
//!
//! ```
//! use descriptor_core::DeviceProbe;
//! let probe = device_cuda::CudaProbe;
//! for gpu in probe.devices()? {
//!     println!("{}: {} ({} GiB)", gpu.device, gpu.name, gpu.total_memory >> 30);
//! }
//! # Ok::<(), descriptor_core::Error>(())
//! ```

mod buffer;
mod driver;
mod probe;

pub use buffer::CudaBuffer;
pub use probe::CudaProbe;
