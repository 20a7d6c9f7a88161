//! Arbitrary `nixl_metadata` strings (both encodings): never a panic, never
//! more than the cap.
#![no_main]

use descriptor_core::{MAX_AGENT_METADATA_BYTES, decode_agent_metadata};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for candidate in [text.to_string(), format!("b64:{text}")] {
        if let Ok(blob) = decode_agent_metadata(&candidate) {
            assert!(blob.len() <= MAX_AGENT_METADATA_BYTES);
        }
    }
});
