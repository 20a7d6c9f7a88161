//! Property tests: metadata and device strings from peers are untrusted input.
//! Arbitrary and mutated input never panics, never decodes past the caps, and
//! whatever is accepted survives a round trip unchanged.
#![allow(clippy::unwrap_used)]

use descriptor_core::{
    Device, MAX_AGENT_METADATA_BYTES, OperationKind, RdmaMetadata, SerializedDescriptor,
    decode_agent_metadata,
};
use proptest::prelude::*;

fn valid_json() -> String {
    RdmaMetadata::new(
        OperationKind::Write,
        vec![
            SerializedDescriptor {
                device: Device::cuda(1),
                ptr: 0x7f00_0000_1000,
                size: 4096,
            },
            SerializedDescriptor {
                device: Device::cuda(1),
                ptr: 0x7f00_0000_9000,
                size: 65536,
            },
        ],
        b"some agent metadata blob".repeat(8),
        "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
    )
    .unwrap()
    .to_json()
}

fn device() -> impl Strategy<Value = Device> {
    prop_oneof![
        Just(Device::HOST),
        any::<u32>().prop_map(Device::cuda),
        any::<u32>().prop_map(Device::rocm),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(m) = RdmaMetadata::from_slice(&bytes) {
            prop_assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
        }
    }

    #[test]
    fn mutated_valid_metadata_never_panics(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8)
    ) {
        let mut bytes = valid_json().into_bytes();
        for (at, byte, kind) in edits {
            if bytes.is_empty() { break; }
            let i = at.index(bytes.len());
            match kind {
                0 => bytes[i] = byte,
                1 => { bytes.remove(i); }
                _ => bytes.insert(i, byte),
            }
        }
        if let Ok(m) = RdmaMetadata::from_slice(&bytes) {
            prop_assert!(m.descriptors().iter().all(|d| d.ptr != 0));
            prop_assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
        }
    }

    #[test]
    fn arbitrary_nixl_metadata_strings_decode_within_the_cap(s in ".{0,512}") {
        if let Ok(blob) = decode_agent_metadata(&s) {
            prop_assert!(blob.len() <= MAX_AGENT_METADATA_BYTES);
        }
        let prefixed = format!("b64:{s}");
        if let Ok(blob) = decode_agent_metadata(&prefixed) {
            prop_assert!(blob.len() <= MAX_AGENT_METADATA_BYTES);
        }
    }

    #[test]
    fn arbitrary_device_strings_never_panic_and_round_trip(s in ".{0,24}") {
        if let Ok(d) = s.parse::<Device>() {
            prop_assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }
    }

    #[test]
    fn every_device_prints_and_parses_back(d in device()) {
        prop_assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
    }

    #[test]
    fn structured_metadata_is_accepted_exactly_when_valid(
        // Size 0 (an empty descriptor, as Dynamo publishes one) is valid.
        descs in proptest::collection::vec((device(), any::<u64>(), prop_oneof![Just(0u64), any::<u64>()]), 0..16),
        blob in proptest::collection::vec(any::<u8>(), 0..256),
        key in "[ -~]{0,40}",
        kind in prop_oneof![Just(OperationKind::Read), Just(OperationKind::Write)],
    ) {
        let descriptors: Vec<SerializedDescriptor> = descs
            .iter()
            .map(|&(device, ptr, size)| SerializedDescriptor { device, ptr, size })
            .collect();
        let valid = !descriptors.is_empty()
            && descriptors.iter().all(|d| d.ptr != 0 && d.ptr.checked_add(d.size).is_some())
            && !blob.is_empty()
            && !key.is_empty()
            && key.bytes().all(|b| b.is_ascii_graphic());
        match RdmaMetadata::new(kind, descriptors, blob, key) {
            Ok(m) => {
                prop_assert!(valid);
                prop_assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
            }
            Err(_) => prop_assert!(!valid),
        }
    }
}
