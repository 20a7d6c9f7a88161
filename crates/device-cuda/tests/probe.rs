//! The CUDA probe and buffers: the no-driver path runs everywhere; the GPU path
//! runs where a driver and a device exist (`cargo xtask gpu-bundle` ships the
//! full GPU checks, with NIXL, as `gpu-check`).
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stderr)]

use descriptor_core::{Descriptor, Device, DeviceProbe, Error};
use device_cuda::{CudaBuffer, CudaProbe};

fn gpu() -> bool {
    let present = CudaProbe.devices().map(|d| !d.is_empty()).unwrap_or(false);
    if !present {
        eprintln!("no CUDA device here: GPU-only assertions skipped");
    }
    present
}

#[test]
fn no_driver_is_a_normal_answer_not_an_error() {
    let probe = CudaProbe;
    assert_eq!(probe.platform(), "cuda");
    let devices = probe.devices().unwrap();
    let host = [1u8; 64];
    assert_eq!(
        probe.locate(host.as_ptr() as usize).unwrap(),
        None,
        "host memory is on no GPU"
    );
    assert_eq!(probe.locate(0).unwrap(), None);
    if !probe.available() {
        assert!(devices.is_empty());
        match CudaBuffer::alloc(0, 4096) {
            Err(Error::BackendUnavailable { backend, tried, .. }) => {
                assert_eq!(backend, "cuda");
                assert!(!tried.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn vram_buffer_holds_bytes_and_describes_itself_as_cuda_memory() {
    if !gpu() {
        return;
    }
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let mut buffer = CudaBuffer::alloc(0, data.len()).unwrap();
    assert!(
        buffer.to_host().unwrap().iter().all(|&b| b == 0),
        "allocations start zeroed"
    );
    buffer.copy_from_host(&data).unwrap();
    assert_eq!(buffer.to_host().unwrap(), data);
    let d = Descriptor::new(buffer).unwrap();
    assert_eq!(d.device(), Device::cuda(0));
    assert!(d.as_slice().is_none(), "device memory has no host slice");
    assert_eq!(CudaProbe.locate(d.ptr()).unwrap(), Some(Device::cuda(0)));
    assert_eq!(
        d.into_buffer::<CudaBuffer>().unwrap().to_host().unwrap(),
        data
    );
    assert!(CudaBuffer::alloc(0, 0).is_err());
}
