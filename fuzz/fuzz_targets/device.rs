//! Arbitrary device strings: never a panic; what parses prints and parses back.
#![no_main]

use descriptor_core::Device;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(device) = text.parse::<Device>()
    {
        assert_eq!(device.to_string().parse::<Device>().ok(), Some(device));
    }
});
