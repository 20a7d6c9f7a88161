//! Peer keys on loopback (issue 43, item 3): connectors that share a key
//! move bytes through sealed agent blobs; a blob no key of the loader's
//! sealed (another key, a changed byte, no seal, a seal where it has no
//! key) is refused with `Error::Unauthenticated` before the backend loads
//! anything; a key list rotates.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::conformance::{filled, pattern, reblobbed, zeroed_one};
use descriptor_core::{Connector, Error, PeerKeys, is_sealed};

const WAIT: Duration = Duration::from_secs(10);
const OLD: &[u8] = b"the old shared key, 32 bytes....";
const NEW: &[u8] = b"the new shared key, 32 bytes....";

fn connector(fabric: &Fabric, name: &str, keys: &[&[u8]]) -> Connector {
    let builder = Connector::builder(LoopbackBackend::new(fabric, name).unwrap());
    if keys.is_empty() {
        builder.build()
    } else {
        builder.peer_keys(PeerKeys::new(keys).unwrap()).build()
    }
}

/// READs a readable of `server` from `client`; the bytes read, or why not.
fn read(server: &Connector, client: &Connector, seed: u64) -> Result<Vec<u8>, Error> {
    let readable = server.create_readable(filled(seed, 4096))?;
    let read = client.begin_read(readable.metadata(), zeroed_one(4096))?;
    read.wait_timeout(WAIT)?;
    readable.wait_timeout(WAIT)?;
    Ok(read.into_descriptors().unwrap()[0]
        .as_slice()
        .unwrap()
        .to_vec())
}

fn refused(result: Result<Vec<u8>, Error>, why: &str) {
    match result {
        Err(Error::Unauthenticated { reason }) => assert!(reason.contains(why), "{reason}"),
        other => panic!("expected a refusal ({why}), got {other:?}"),
    }
}

#[test]
fn connectors_sharing_a_key_move_bytes_through_sealed_blobs_both_ways() {
    let fabric = Fabric::new();
    let (server, client) = (
        connector(&fabric, "server", &[NEW]),
        connector(&fabric, "client", &[NEW]),
    );
    let readable = server.create_readable(filled(1, 64)).unwrap();
    assert!(is_sealed(readable.metadata().agent_metadata()));
    drop(readable);
    assert_eq!(read(&server, &client, 2).unwrap(), pattern(2, 4096));
    // A WRITE into the client's writable, through the server's key check.
    let writable = client.create_writable(zeroed_one(4096)).unwrap();
    let write = server
        .begin_write(filled(3, 4096), writable.metadata())
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    let written = writable.into_descriptors().unwrap();
    assert_eq!(written[0].as_slice().unwrap(), pattern(3, 4096));
}

#[test]
fn a_blob_no_key_of_the_loader_sealed_is_refused_before_the_backend_loads_it() {
    let fabric = Fabric::new();
    let server = connector(&fabric, "server", &[NEW]);
    let stranger = connector(&fabric, "stranger", &[OLD]);
    let keyless = connector(&fabric, "keyless", &[]);
    refused(read(&server, &stranger, 1), "does not accept");
    refused(read(&server, &keyless, 2), "has no key");
    refused(read(&keyless, &server, 3), "not sealed");
    for c in [&stranger, &keyless, &server] {
        assert_eq!(c.remote_agent_count(), 0, "a refused blob was loaded");
    }

    // The right key, but a byte of the blob changed: every position.
    let client = connector(&fabric, "client", &[NEW]);
    let readable = server.create_readable(filled(4, 4096)).unwrap();
    let sealed = readable.metadata().agent_metadata().to_vec();
    for at in (0..sealed.len()).step_by(7) {
        let mut forged = sealed.clone();
        forged[at] ^= 0x20;
        let metadata = reblobbed(readable.metadata(), forged);
        match client.begin_read(&metadata, zeroed_one(4096)) {
            Err(Error::Unauthenticated { .. }) => {}
            other => panic!("byte {at} changed: {other:?}"),
        }
    }
    assert_eq!(client.remote_agent_count(), 0);
    // The blob as it was still serves.
    let read = client
        .begin_read(readable.metadata(), zeroed_one(4096))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_eq!(
        read.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(4, 4096)
    );
}

#[test]
fn a_key_rotates_by_accepting_both_then_signing_with_the_new_one() {
    let fabric = Fabric::new();
    // Step 1: everyone signs with OLD and accepts both.
    let a = connector(&fabric, "a", &[OLD, NEW]);
    // Step 2: `b` moved to NEW first; `a` still reads it, and `b` reads `a`.
    let b = connector(&fabric, "b", &[NEW, OLD]);
    assert_eq!(read(&b, &a, 1).unwrap(), pattern(1, 4096));
    assert_eq!(read(&a, &b, 2).unwrap(), pattern(2, 4096));
    // Step 3: `c` dropped OLD: it no longer reads `a`, which still signs with it.
    let c = connector(&fabric, "c", &[NEW]);
    assert_eq!(read(&b, &c, 3).unwrap(), pattern(3, 4096));
    refused(read(&a, &c, 4), "does not accept");
}
