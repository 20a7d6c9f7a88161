//! Where memory lives: [`DeviceKind`] and [`Device`].

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The kind of memory a region lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DeviceKind {
    /// Host (CPU) memory, `"cpu"` on the wire.
    Host,
    /// NVIDIA GPU memory, `"cuda:N"` on the wire.
    Cuda,
    /// AMD GPU memory, `"rocm:N"` on the wire (Rust peers only: Dynamo's
    /// Python workers know no ROCm device).
    Rocm,
    /// Intel GPU memory (Level Zero), `"xpu:N"` on the wire, as Dynamo 1.6
    /// writes it; NIXL registers it as VRAM.
    Xpu,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Host => "host",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Rocm => "rocm",
            DeviceKind::Xpu => "xpu",
        })
    }
}

/// A device: a kind plus an ordinal (always 0 for the host).
///
/// Parses the strings Dynamo uses, case-insensitively and ignoring surrounding
/// white space: `"cpu"`, `"host"`, `"cuda"`, `"cuda:N"`, `"gpu"`, `"gpu:N"`,
/// `"xpu"`, `"xpu:N"`, plus `"rocm[:N]"` and `"hip[:N]"`. Prints `cpu`,
/// `cuda:N`, `xpu:N` or `rocm:N`, the form Dynamo's Python workers read (but
/// for `rocm`, which they do not know). `docs/dynamo-compatibility.md` lists
/// where this is stricter than Dynamo 1.6.1.
///
/// ```
/// use descriptor_core::{Device, DeviceKind};
/// let d: Device = "GPU:3".parse()?;
/// assert_eq!((d.kind(), d.ordinal()), (DeviceKind::Cuda, 3));
/// assert_eq!(d.to_string(), "cuda:3");
/// assert!("cuda:-1".parse::<Device>().is_err());
/// # Ok::<(), descriptor_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    kind: DeviceKind,
    ordinal: u32,
}

impl Device {
    /// Host memory.
    pub const HOST: Device = Device {
        kind: DeviceKind::Host,
        ordinal: 0,
    };

    /// The CUDA device with this ordinal.
    pub const fn cuda(ordinal: u32) -> Device {
        Device {
            kind: DeviceKind::Cuda,
            ordinal,
        }
    }

    /// The Intel XPU device with this ordinal.
    pub const fn xpu(ordinal: u32) -> Device {
        Device {
            kind: DeviceKind::Xpu,
            ordinal,
        }
    }

    /// The ROCm device with this ordinal.
    pub const fn rocm(ordinal: u32) -> Device {
        Device {
            kind: DeviceKind::Rocm,
            ordinal,
        }
    }

    /// A device from its parts; the host's ordinal must be 0.
    pub fn new(kind: DeviceKind, ordinal: u32) -> Result<Device> {
        if kind == DeviceKind::Host && ordinal != 0 {
            return Err(Error::InvalidDevice {
                input: format!("host:{ordinal}"),
                reason: "the host has no ordinal other than 0",
            });
        }
        Ok(Device { kind, ordinal })
    }

    /// The kind of memory.
    pub const fn kind(self) -> DeviceKind {
        self.kind
    }

    /// The device ordinal (0 for the host).
    pub const fn ordinal(self) -> u32 {
        self.ordinal
    }

    /// Whether this is host memory.
    pub const fn is_host(self) -> bool {
        matches!(self.kind, DeviceKind::Host)
    }
}

impl Default for Device {
    fn default() -> Self {
        Device::HOST
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Host => f.write_str("cpu"),
            DeviceKind::Cuda => write!(f, "cuda:{}", self.ordinal),
            DeviceKind::Rocm => write!(f, "rocm:{}", self.ordinal),
            DeviceKind::Xpu => write!(f, "xpu:{}", self.ordinal),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(input: &str) -> Result<Device> {
        let invalid = |reason| Error::InvalidDevice {
            input: input.chars().take(64).collect(),
            reason,
        };
        // As Dynamo's validators do (`v.strip().lower()`).
        let trimmed = input.trim_ascii();
        let (name, ordinal) = match trimmed.split_once(':') {
            Some((name, ordinal)) => (name, Some(ordinal)),
            None => (trimmed, None),
        };
        let kind = if name.eq_ignore_ascii_case("cpu") || name.eq_ignore_ascii_case("host") {
            DeviceKind::Host
        } else if name.eq_ignore_ascii_case("cuda") || name.eq_ignore_ascii_case("gpu") {
            DeviceKind::Cuda
        } else if name.eq_ignore_ascii_case("xpu") {
            DeviceKind::Xpu
        } else if name.eq_ignore_ascii_case("rocm") || name.eq_ignore_ascii_case("hip") {
            DeviceKind::Rocm
        } else {
            return Err(invalid(
                "expected cpu, host, cuda[:N], gpu[:N], xpu[:N], rocm[:N] or hip[:N]",
            ));
        };
        let ordinal = match ordinal {
            None => 0,
            Some(digits) => {
                // `u32::from_str` accepts a leading '+'; a device string should not.
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid("the ordinal must be a non-negative decimal number"));
                }
                digits
                    .parse()
                    .map_err(|_| invalid("the ordinal is out of range"))?
            }
        };
        if kind == DeviceKind::Host && ordinal != 0 {
            return Err(invalid("the host has no ordinal other than 0"));
        }
        Ok(Device { kind, ordinal })
    }
}

impl TryFrom<&str> for Device {
    type Error = Error;

    fn try_from(value: &str) -> Result<Device> {
        value.parse()
    }
}

impl serde::Serialize for Device {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Device {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Device, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Device;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a device string such as \"cpu\" or \"cuda:0\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Device, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::cpu("cpu", Device::HOST)]
    #[case::host_upper("HOST", Device::HOST)]
    #[case::bare_cuda_is_ordinal_zero("cuda", Device::cuda(0))]
    #[case::cuda_n("cuda:7", Device::cuda(7))]
    #[case::gpu_alias("Gpu:2", Device::cuda(2))]
    #[case::rocm_n("rocm:1", Device::rocm(1))]
    #[case::hip_alias("hip:4", Device::rocm(4))]
    #[case::host_ordinal_zero("cpu:0", Device::HOST)]
    #[case::max_ordinal("cuda:4294967295", Device::cuda(u32::MAX))]
    #[case::xpu_n("xpu:1", Device::xpu(1))]
    #[case::bare_xpu("XPU", Device::xpu(0))]
    #[case::surrounding_whitespace_as_dynamo(" cuda:0\n", Device::cuda(0))]
    fn parses_dynamo_device_strings(#[case] input: &str, #[case] expected: Device) {
        assert_eq!(input.parse::<Device>().ok(), Some(expected));
    }

    #[rstest]
    #[case::empty("")]
    #[case::unknown_kind("tpu:0")]
    #[case::negative("cuda:-1")]
    #[case::plus_sign("cuda:+1")]
    #[case::empty_ordinal("cuda:")]
    #[case::overflow("cuda:4294967296")]
    #[case::host_with_ordinal("cpu:1")]
    #[case::inner_whitespace("cuda: 0")]
    #[case::two_colons("cuda:1:2")]
    fn rejects_malformed_device_strings(#[case] input: &str) {
        let err = input.parse::<Device>().err();
        assert!(
            matches!(err, Some(Error::InvalidDevice { .. })),
            "{input:?} gave {err:?}"
        );
    }

    #[rstest]
    #[case(Device::HOST, "cpu")]
    #[case(Device::cuda(0), "cuda:0")]
    #[case(Device::rocm(3), "rocm:3")]
    #[case(Device::xpu(2), "xpu:2")]
    fn prints_the_wire_form_and_reads_it_back(#[case] device: Device, #[case] text: &str) {
        assert_eq!(device.to_string(), text);
        assert_eq!(text.parse::<Device>().ok(), Some(device));
        let json = serde_json::to_string(&device).ok();
        assert_eq!(json.as_deref(), Some(format!("\"{text}\"").as_str()));
    }

    #[test]
    fn host_has_only_ordinal_zero() {
        assert!(Device::new(DeviceKind::Host, 1).is_err());
        assert_eq!(Device::new(DeviceKind::Host, 0).ok(), Some(Device::HOST));
    }
}
