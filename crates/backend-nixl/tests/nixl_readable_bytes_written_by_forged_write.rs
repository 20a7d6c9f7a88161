//! Read-only memory stays read-only on NIXL (soundness round 4, item 4):
//! connector A exposes `Descriptor::from_bytes(bytes)` as a readable while
//! safe code keeps a clone; connector B re-kinds that readable's metadata to
//! WRITE with the public `RdmaMetadata::new` and WRITEs into it. NIXL/UCX keys
//! grant remote write to every registered byte, so the core registers a
//! private copy of read-only memory on a backend that does not enforce access
//! (`RegistrationBackend::access_enforced`): the clone keeps its bytes under
//! every `MetadataScope`. Every forged form, on every backend, is in the
//! conformance check `read_only_memory_never_changes_whatever_a_peer_writes`.
#![allow(clippy::unwrap_used, clippy::panic)]
use std::time::Duration;

use backend_nixl::MetadataScope;
use bytes::Bytes;
use descriptor_core::conformance::Harness;
use descriptor_core::{Connector, Descriptor, OperationKind, RdmaMetadata};
use test_support::{Nixl, runtime_available};

#[test]
fn a_forged_write_never_changes_an_immutable_bytes() {
    if !runtime_available() {
        return;
    }
    for scope in [MetadataScope::Agent, MetadataScope::Exposed] {
        let h = Nixl::new(scope);
        let (a, b) = (
            Connector::new(h.backend("a")),
            Connector::new(h.backend("b")),
        );
        let bytes = Bytes::from(vec![0x33u8; 4096]);
        let alias = bytes.clone();
        let readable = a
            .create_readable(vec![Descriptor::from_bytes(bytes).unwrap()])
            .unwrap();
        let m = readable.metadata();
        let forged = RdmaMetadata::new(
            OperationKind::Write,
            m.descriptors().to_vec(),
            m.agent_metadata().to_vec(),
            m.notification_key().to_string(),
        )
        .unwrap();
        let wrote = b
            .begin_write(vec![Descriptor::new(vec![0xEEu8; 4096]).unwrap()], &forged)
            .and_then(|w| w.wait_timeout(Duration::from_secs(5)))
            .is_ok();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            alias[0], 0x33,
            "immutable Bytes mutated through the safe API ({scope:?}, WRITE ok = {wrote})"
        );
    }
}
