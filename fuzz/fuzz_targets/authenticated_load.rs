//! The authenticated load path: arbitrary bytes as a peer's agent blob, to a
//! connector with peer keys. `PeerKeys::open` refuses them (never a panic)
//! unless the key sealed them; the connector's `begin_read` refuses them
//! before its backend (loopback here: the code in front of NIXL is the same)
//! loads anything; and the blob sealed, then changed at one byte the input
//! picks, is refused.
#![no_main]

use std::sync::OnceLock;

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::{
    Connector, Descriptor, Device, Error, OperationKind, PeerKeys, RdmaMetadata,
    SerializedDescriptor,
};
use libfuzzer_sys::fuzz_target;

const KEY: &[u8] = b"the fuzzing key, 32 bytes long..";

fn connector() -> &'static Connector {
    static CONNECTOR: OnceLock<Connector> = OnceLock::new();
    CONNECTOR.get_or_init(|| {
        let backend = LoopbackBackend::new(&Fabric::new(), "fuzz-authenticated")
            .unwrap_or_else(|e| panic!("loopback agent: {e}"));
        let keys = PeerKeys::new([KEY]).unwrap_or_else(|e| panic!("keys: {e}"));
        Connector::builder(backend).peer_keys(keys).build()
    })
}

fuzz_target!(|data: &[u8]| {
    let keys = PeerKeys::new([KEY]).unwrap_or_else(|e| panic!("keys: {e}"));
    if let Ok(blob) = keys.open(data) {
        // Only what the key sealed opens, and it opens to what was sealed.
        assert_eq!(keys.seal(blob), data, "an unsealed blob opened");
    }
    let sealed = keys.seal(data);
    assert_eq!(keys.open(&sealed).ok(), Some(data));
    if let Some(&at) = data.first() {
        let mut forged = sealed.clone();
        let at = usize::from(at) * 7 % forged.len();
        forged[at] ^= 0x80;
        assert!(keys.open(&forged).is_err(), "a blob changed at {at} opened");
    }
    // Through the connector: refused before the backend loads it.
    let Ok(metadata) = RdmaMetadata::new(
        OperationKind::Read,
        vec![SerializedDescriptor {
            device: Device::HOST,
            ptr: 0x1000,
            size: 16,
        }],
        data.to_vec(),
        "fuzz".into(),
    ) else {
        return;
    };
    let local = Descriptor::new(vec![0u8; 16]).unwrap_or_else(|e| panic!("descriptor: {e}"));
    match connector().begin_read(&metadata, vec![local]) {
        Err(Error::Unauthenticated { .. }) => {}
        Err(other) => panic!("refused for another reason than its seal: {other}"),
        Ok(_) => panic!("a blob no key sealed was loaded"),
    }
    assert_eq!(connector().remote_agent_count(), 0);
});
