//! Arbitrary bytes as RdmaMetadata JSON: never a panic; what parses round-trips.
#![no_main]

use descriptor_core::RdmaMetadata;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(metadata) = RdmaMetadata::from_slice(data) {
        let again = RdmaMetadata::from_json(&metadata.to_json()).expect("re-encoded metadata parses");
        assert_eq!(again, metadata);
    }
});
