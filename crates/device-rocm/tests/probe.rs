//! The ROCm probe and buffers: the no-ROCm path runs everywhere; the GPU path
//! runs where a HIP runtime and a device exist.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stderr)]

use descriptor_core::{Descriptor, Device, DeviceProbe, Error};
use device_rocm::{MemoryKind, RocmBuffer, RocmProbe};

#[test]
fn no_rocm_is_a_normal_answer_not_an_error() {
    let probe = RocmProbe;
    assert_eq!(probe.platform(), "rocm");
    let devices = probe.devices().unwrap();
    let host = [1u8; 64];
    assert_eq!(probe.locate(host.as_ptr() as usize).unwrap(), None);
    if !probe.available() {
        assert!(devices.is_empty());
        assert_eq!(probe.memory_kind(host.as_ptr() as usize), None);
        match RocmBuffer::alloc(0, 4096) {
            Err(Error::BackendUnavailable { backend, tried, .. }) => {
                assert_eq!(backend, "rocm");
                assert!(tried.iter().any(|t| t.contains("libamdhip64")), "{tried:?}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn vram_buffer_holds_bytes_and_describes_itself_as_rocm_memory() {
    if RocmProbe.devices().map(|d| d.is_empty()).unwrap_or(true) {
        eprintln!("no ROCm device here: GPU-only assertions skipped");
        return;
    }
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 13 % 251) as u8).collect();
    let mut buffer = RocmBuffer::alloc(0, data.len()).unwrap();
    buffer.copy_from_host(&data).unwrap();
    assert_eq!(buffer.to_host().unwrap(), data);
    let d = Descriptor::new(buffer).unwrap();
    assert_eq!(d.device(), Device::rocm(0));
    assert_eq!(
        RocmProbe.memory_kind(d.ptr()).map(|(k, _)| k),
        Some(MemoryKind::Device)
    );
    assert_eq!(RocmProbe.locate(d.ptr()).unwrap(), Some(Device::rocm(0)));
}
