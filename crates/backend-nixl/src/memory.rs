//! Memory as NIXL takes it: a registered region and the handles that keep
//! it registered, a range as nixl-sys reads one, a device's NIXL memory
//! type, and a request's transfer lists.

use descriptor_core::{Device, DeviceKind, Error, Result, Segment, Side, TransferRequest};
use nixl_sys::{MemType, MemoryRegion, NixlDescriptor, RegistrationHandle, XferDescList};

use crate::error::{NAME, nixl_error};
use crate::spans::Spans;

/// A registered region, with the handles that keep it registered.
pub(crate) struct Region {
    pub(crate) segment: Segment,
    pub(crate) writable: bool,
    // Dropping the handles deregisters the memory (from each agent).
    pub(crate) _handles: Vec<RegistrationHandle>,
}

/// A registered range as nixl-sys wants to see it.
#[derive(Debug)]
pub(crate) struct Range {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) mem: MemType,
    pub(crate) device: u64,
}

impl MemoryRegion for Range {
    unsafe fn as_ptr(&self) -> *const u8 {
        std::ptr::with_exposed_provenance(self.addr)
    }
    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for Range {
    fn mem_type(&self) -> MemType {
        self.mem
    }
    fn device_id(&self) -> u64 {
        self.device
    }
}

/// NIXL's memory type and device id for a device.
pub(crate) fn mem_of(device: Device) -> Result<(MemType, u64)> {
    match device.kind() {
        DeviceKind::Host => Ok((MemType::Dram, 0)),
        // Dynamo registers Intel XPU memory as VRAM too.
        DeviceKind::Cuda | DeviceKind::Xpu => Ok((MemType::Vram, u64::from(device.ordinal()))),
        _ => Err(Error::Unsupported {
            backend: NAME,
            what: format!("{device} memory (NIXL moves host, CUDA and XPU memory)"),
        }),
    }
}

/// The local and remote transfer lists of `request`, one descriptor per run
/// of neighbouring pairs ([`TransferRequest::runs`]): local runs within one
/// registration (the request names it), remote runs within one of the
/// peer's registrations as `spans` records them (none merge without).
pub(crate) fn run_lists(
    request: &TransferRequest<'_>,
    remote: &[Segment],
    spans: Option<&Spans>,
) -> Result<(XferDescList<'static>, XferDescList<'static>)> {
    let first = |segments: &[Segment], side| {
        segments
            .first()
            .ok_or(Error::EmptyDescriptorList { side })
            .and_then(|s| mem_of(s.device))
            .and_then(|(mem, _)| {
                XferDescList::new(mem).map_err(|e| nixl_error("create a transfer list", e))
            })
    };
    let mut local = first(request.local, Side::Local)?;
    let mut remote = first(remote, Side::Remote)?;
    for run in request.runs(|a, b| spans.is_some_and(|s| s.hold_together(a, b))) {
        local.add_desc(run.local.addr, run.local.len, mem_of(run.local.device)?.1);
        remote.add_desc(
            run.remote.addr,
            run.remote.len,
            mem_of(run.remote.device)?.1,
        );
    }
    Ok((local, remote))
}

#[cfg(test)]
mod tests {
    use super::mem_of;
    use descriptor_core::{Device, Error};

    #[test]
    fn rocm_memory_is_unsupported() {
        assert!(matches!(
            mem_of(Device::rocm(0)),
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(mem_of(Device::cuda(3)).ok().map(|(_, d)| d), Some(3));
    }
}
