//! Drop into crates/backend-nixl/tests/. A peer's metadata whose agent name is
//! not UTF-8 makes `begin_read` panic (nixl-sys `load_remote_md` unwraps
//! `CStr::to_str`) instead of returning an error; NIXL has by then loaded the
//! peer, which nothing tracks or unloads.
#![allow(clippy::unwrap_used, clippy::panic)]
use std::panic::{AssertUnwindSafe, catch_unwind};

use backend_nixl::MetadataScope;
use descriptor_core::conformance::{Harness, filled, zeroed_one};
use descriptor_core::{Connector, OperationKind, RdmaMetadata};
use test_support::{Nixl, runtime_available};

#[test]
fn a_peer_name_that_is_not_utf8_is_an_error_not_a_panic() {
    if !runtime_available() {
        return;
    }
    let h = Nixl::new(MetadataScope::Agent);
    let (server, client) = (
        Connector::new(h.backend("server")),
        Connector::new(h.backend("client")),
    );
    let readable = server.create_readable(filled(5, 64)).unwrap();
    let meta = readable.metadata();
    let mut blob = meta.agent_metadata().to_vec();
    // "nixlSerDes|Agent" + u64 length, then the name: its first byte.
    assert!(blob.starts_with(b"nixlSerDes|Agent"));
    blob[24] = 0xff;
    let forged = RdmaMetadata::new(
        OperationKind::Read,
        meta.descriptors().to_vec(),
        blob,
        meta.notification_key().into(),
    )
    .unwrap();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        client.begin_read(&forged, zeroed_one(64))
    }));
    match outcome {
        Err(_) => panic!("begin_read panicked on a malformed peer name (expected an Err)"),
        Ok(Ok(_)) => panic!("begin_read accepted the forged metadata"),
        Ok(Err(_)) => {}
    }
    readable.cancel();
}
