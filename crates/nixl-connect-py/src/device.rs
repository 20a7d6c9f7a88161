//! Device strings, parsed in one place for the whole package: the Python
//! `Device(...)`, `SerializedDescriptor`'s validator and the native
//! descriptors all come here, and here to `descriptor_core::Device`.

use descriptor_core::{Device, DeviceKind, Error};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// What `nixl_connect.Device(...)` takes, for the messages that refuse an input.
pub(crate) const DEVICE_FORMS: &str = "Device() takes \"cpu\", \"cuda\", \"cuda:N\" (also \
     \"host\", \"gpu[:N]\", \"xpu[:N]\", \"rocm[:N]\", \"hip[:N]\"), a torch.device, \
     or a (DeviceKind, int) tuple";

/// `text` as a device; `ValueError` naming the input, why, and the accepted forms.
pub(crate) fn parse(text: &str) -> PyResult<Device> {
    text.parse::<Device>().map_err(|e| match e {
        // The core's "expected ..." lists the kinds, which DEVICE_FORMS does too.
        Error::InvalidDevice { input, reason } if reason.starts_with("expected") => {
            PyValueError::new_err(format!("invalid device {input:?}. {DEVICE_FORMS}."))
        }
        Error::InvalidDevice { input, reason } => PyValueError::new_err(format!(
            "invalid device {input:?}: {reason}. {DEVICE_FORMS}."
        )),
        other => PyValueError::new_err(other.to_string()),
    })
}

/// `nixl_connect.DeviceKind`'s value for a kind.
fn kind_value(kind: DeviceKind) -> u8 {
    match kind {
        DeviceKind::Host => 1,
        DeviceKind::Cuda => 2,
        DeviceKind::Xpu => 3,
        DeviceKind::Rocm => 4,
        // `DeviceKind` is non-exhaustive: a kind Python does not know.
        _ => 0,
    }
}

/// `(kind, ordinal)` of a device string, the kind as `nixl_connect.DeviceKind`'s
/// integer; `ValueError` naming the input and the accepted forms.
#[pyfunction]
pub(crate) fn parse_device(text: &str) -> PyResult<(u8, u32)> {
    let device = parse(text)?;
    Ok((kind_value(device.kind()), device.ordinal()))
}
