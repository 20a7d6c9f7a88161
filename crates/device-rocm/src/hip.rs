//! The HIP shim: `libamdhip64` loaded once, a dozen entry points, and the
//! version-dependent decoding of pointer attributes.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

use descriptor_core::Error;

pub(crate) const NAME: &str = "rocm";
const SONAMES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

type Status = c_int;
const HIP_SUCCESS: Status = 0;
pub(crate) const MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub(crate) const MEMCPY_DEVICE_TO_HOST: c_int = 2;

/// `hipPointerAttribute_t`: the same layout in ROCm 5 and 6 (fields renamed),
/// but the memory-type numbering differs; see [`MemoryKind::decode`].
#[repr(C)]
#[derive(Default)]
pub(crate) struct PointerAttributes {
    pub(crate) memory_type: c_int,
    pub(crate) device: c_int,
    pub(crate) device_pointer: usize,
    pub(crate) host_pointer: usize,
    pub(crate) is_managed: c_int,
    pub(crate) allocation_flags: c_uint,
}

/// What kind of memory a pointer refers to, whatever the ROCm version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Not known to HIP (ordinary host memory).
    Unregistered,
    /// Host memory HIP knows (pinned or registered).
    Host,
    /// Device memory.
    Device,
    /// Managed (unified) memory.
    Managed,
    /// A HIP array.
    Array,
    /// Anything else the runtime reports.
    Other(i32),
}

impl MemoryKind {
    /// Decodes `hipMemoryType` as numbered by the runtime that reported it: ROCm
    /// 5 (HIP < 6.0) has Host=0, Device=1, Array=2, Unified=3, Managed=4; ROCm 6
    /// follows CUDA: Unregistered=0, Host=1, Device=2, Managed=3, Array=10,
    /// Unified=11.
    pub fn decode(runtime_version: i32, raw: i32) -> MemoryKind {
        let rocm6 = runtime_version >= 60_000_000;
        match (rocm6, raw) {
            (false, 0) => MemoryKind::Host,
            (false, 1) => MemoryKind::Device,
            (false, 2) => MemoryKind::Array,
            (false, 3 | 4) => MemoryKind::Managed,
            (true, 0) => MemoryKind::Unregistered,
            (true, 1) => MemoryKind::Host,
            (true, 2) => MemoryKind::Device,
            (true, 3 | 11) => MemoryKind::Managed,
            (true, 10) => MemoryKind::Array,
            (_, other) => MemoryKind::Other(other),
        }
    }
}

/// The loaded entry points.
pub(crate) struct Hip {
    _library: libloading::Library,
    pub(crate) runtime_version: i32,
    pub(crate) get_device_count: unsafe extern "C" fn(*mut c_int) -> Status,
    pub(crate) device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Status,
    pub(crate) device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> Status,
    pub(crate) device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Status,
    pub(crate) pointer_get_attributes:
        unsafe extern "C" fn(*mut PointerAttributes, *const c_void) -> Status,
    pub(crate) set_device: unsafe extern "C" fn(c_int) -> Status,
    pub(crate) malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> Status,
    pub(crate) free: unsafe extern "C" fn(*mut c_void) -> Status,
    pub(crate) memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> Status,
    pub(crate) memset: unsafe extern "C" fn(*mut c_void, c_int, usize) -> Status,
}

pub(crate) fn check(status: Status, context: &str) -> Result<(), Error> {
    if status == HIP_SUCCESS {
        Ok(())
    } else {
        Err(Error::backend(
            NAME,
            context,
            format!("hipError_t {status}"),
        ))
    }
}

fn candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(root) = std::env::var_os("ROCM_PATH") {
        dirs.push(PathBuf::from(root).join("lib"));
    }
    dirs.push("/opt/rocm/lib".into());
    let mut out: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| SONAMES.iter().map(move |s| d.join(s)))
        .filter(|p| p.is_file())
        .collect();
    out.extend(SONAMES.iter().map(PathBuf::from));
    out
}

fn load() -> Option<Hip> {
    for path in candidates() {
        // SAFETY: loading the HIP runtime runs its initialisers, as any HIP
        // program does; the library lives in a process-wide static, never unloaded.
        let Ok(library) = (unsafe { libloading::Library::new(&path) }) else {
            continue;
        };
        match bind(library) {
            Ok(hip) => {
                tracing::debug!(library = %path.display(), version = hip.runtime_version, "loaded HIP");
                return Some(hip);
            }
            Err(reason) => {
                tracing::debug!(library = %path.display(), %reason, "unusable HIP runtime")
            }
        }
    }
    None
}

fn bind(library: libloading::Library) -> Result<Hip, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is declared with the signature of the HIP
            // runtime API (unchanged between ROCm 5 and 7 for these functions).
            *unsafe { library.get($name) }.map_err(|e| e.to_string())?
        };
    }
    let init: unsafe extern "C" fn(c_uint) -> Status = sym!(b"hipInit\0");
    let version: unsafe extern "C" fn(*mut c_int) -> Status = sym!(b"hipRuntimeGetVersion\0");
    // SAFETY: plain C calls with valid out-pointers.
    let (status, runtime_version) = unsafe {
        let status = init(0);
        let mut v = 0;
        (status.max(version(&mut v)), v)
    };
    if status != HIP_SUCCESS {
        return Err(format!("hipInit/hipRuntimeGetVersion returned {status}"));
    }
    Ok(Hip {
        runtime_version,
        get_device_count: sym!(b"hipGetDeviceCount\0"),
        device_get_name: sym!(b"hipDeviceGetName\0"),
        device_total_mem: sym!(b"hipDeviceTotalMem\0"),
        device_get_pci_bus_id: sym!(b"hipDeviceGetPCIBusId\0"),
        pointer_get_attributes: sym!(b"hipPointerGetAttributes\0"),
        set_device: sym!(b"hipSetDevice\0"),
        malloc: sym!(b"hipMalloc\0"),
        free: sym!(b"hipFree\0"),
        memcpy: sym!(b"hipMemcpy\0"),
        memset: sym!(b"hipMemset\0"),
        _library: library,
    })
}

/// The runtime, loaded on first use; `None` without ROCm.
pub(crate) fn hip() -> Option<&'static Hip> {
    static HIP: OnceLock<Option<Hip>> = OnceLock::new();
    HIP.get_or_init(load).as_ref()
}

pub(crate) fn unavailable() -> Error {
    Error::BackendUnavailable {
        backend: NAME,
        reason: "no usable HIP runtime".into(),
        tried: candidates()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        hint: Some(
            "install ROCm's HIP runtime (libamdhip64.so), or put its folder on LD_LIBRARY_PATH"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::rocm5_host(50_422_000, 0, MemoryKind::Host)]
    #[case::rocm5_device(50_422_000, 1, MemoryKind::Device)]
    #[case::rocm5_array(50_422_000, 2, MemoryKind::Array)]
    #[case::rocm5_unified(50_422_000, 3, MemoryKind::Managed)]
    #[case::rocm6_unregistered(60_100_000, 0, MemoryKind::Unregistered)]
    #[case::rocm6_host(60_100_000, 1, MemoryKind::Host)]
    #[case::rocm6_device(60_100_000, 2, MemoryKind::Device)]
    #[case::rocm6_managed(60_100_000, 3, MemoryKind::Managed)]
    #[case::rocm6_array(60_100_000, 10, MemoryKind::Array)]
    #[case::rocm7_device(70_000_000, 2, MemoryKind::Device)]
    #[case::unknown(60_100_000, 42, MemoryKind::Other(42))]
    fn memory_type_numbering_follows_the_runtime_version(
        #[case] version: i32,
        #[case] raw: i32,
        #[case] expected: MemoryKind,
    ) {
        assert_eq!(MemoryKind::decode(version, raw), expected);
    }

    #[test]
    fn the_same_raw_value_means_device_on_rocm5_and_host_on_rocm6() {
        assert_eq!(MemoryKind::decode(50_700_000, 1), MemoryKind::Device);
        assert_eq!(MemoryKind::decode(60_000_000, 1), MemoryKind::Host);
    }

    #[test]
    fn pointer_attributes_match_the_c_layout() {
        // enum + int + two pointers + int + unsigned, 8-byte aligned pointers.
        assert_eq!(std::mem::size_of::<PointerAttributes>(), 32);
        assert_eq!(std::mem::offset_of!(PointerAttributes, device_pointer), 8);
        assert_eq!(std::mem::offset_of!(PointerAttributes, is_managed), 24);
    }

    #[test]
    fn searches_rocm_path_and_every_soname() {
        let c = candidates();
        for soname in SONAMES {
            assert!(
                c.iter().any(|p| p.as_os_str() == *soname),
                "{soname} missing from {c:?}"
            );
        }
    }
}
