//! Peer keys on real NIXL (issue 43, item 3): connectors that share a key
//! READ and WRITE through sealed agent blobs; a blob sealed with another key,
//! or changed at any byte, is refused with `Error::Unauthenticated` before
//! NIXL (and UCX) sees it: the loader's NIXL agent never learns of the peer.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use backend_nixl::MetadataScope;
use descriptor_core::conformance::{Harness, filled, pattern, reblobbed, zeroed_one};
use descriptor_core::{Connector, Error, PeerKeys, is_sealed};
use test_support::{Nixl, runtime_available};

const WAIT: Duration = Duration::from_secs(30);
const KEY: &[u8] = b"a shared key of thirty-two bytes";
const OTHER: &[u8] = b"another key, thirty-two bytes...";

fn keyed(h: &Nixl, name: &str, key: &[u8]) -> Connector {
    Connector::builder(h.backend(name))
        .peer_keys(PeerKeys::new([key]).unwrap())
        .build()
}

#[test]
fn sealed_blobs_move_bytes_and_forged_ones_never_reach_nixl() {
    if !runtime_available() {
        return;
    }
    let h = Nixl::new(MetadataScope::Agent);
    let (server, client) = (keyed(&h, "server", KEY), keyed(&h, "client", KEY));
    let readable = server.create_readable(filled(1, 8192)).unwrap();
    let sealed = readable.metadata().agent_metadata().to_vec();
    assert!(is_sealed(&sealed));

    // Forged first, so that NIXL has never heard of the server: a changed
    // byte in the header, in the tag and in NIXL's blob itself.
    for at in [0, 12, 30, 48, 60, sealed.len() / 2, sealed.len() - 1] {
        let mut forged = sealed.clone();
        forged[at] ^= 0x01;
        let metadata = reblobbed(readable.metadata(), forged);
        match client.begin_read(&metadata, zeroed_one(8192)) {
            Err(Error::Unauthenticated { reason }) => {
                assert!(
                    reason.contains("verify")
                        || reason.contains("accept")
                        || reason.contains("sealed"),
                    "{reason}"
                );
            }
            other => panic!("byte {at} changed: {other:?}"),
        }
        assert_eq!(client.remote_agent_count(), 0, "NIXL loaded a forged blob");
    }
    let stranger = keyed(&h, "stranger", OTHER);
    match stranger.begin_read(readable.metadata(), zeroed_one(8192)) {
        Err(Error::Unauthenticated { reason }) => {
            assert!(reason.contains("does not accept"), "{reason}")
        }
        other => panic!("another key's connector loaded it: {other:?}"),
    }
    assert_eq!(stranger.remote_agent_count(), 0);

    // The blob as it was: READ, then a WRITE the other way.
    let read = client
        .begin_read(readable.metadata(), zeroed_one(8192))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(
        read.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(1, 8192)
    );
    let writable = client.create_writable(zeroed_one(4096)).unwrap();
    assert!(is_sealed(writable.metadata().agent_metadata()));
    let write = server
        .begin_write(filled(2, 4096), writable.metadata())
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    assert_eq!(
        writable.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(2, 4096)
    );
}
