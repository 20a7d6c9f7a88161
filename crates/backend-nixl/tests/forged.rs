//! Forged metadata against live passive operations on real NIXL: each forgery
//! NIXL can detect is an error and the process survives; what NIXL cannot
//! enforce is pinned down here so the README's account stays true.
#![allow(clippy::unwrap_used, clippy::panic)]

use backend_nixl::MetadataScope;
use descriptor_core::conformance::{
    Harness, filled, forge, pattern, rekeyed, shifted, zeroed_one as zeroed,
};
use descriptor_core::{Connector, Descriptor, Error, OperationKind, RdmaMetadata};
use std::time::Duration;
use test_support::{Nixl, runtime_available};

const WAIT: Duration = Duration::from_secs(30);

fn assert_refused<T: std::fmt::Debug>(result: Result<T, Error>) {
    match result {
        Err(Error::AccessDenied { .. } | Error::Backend { .. }) => {}
        other => panic!("NIXL accepted a forged transfer: {other:?}"),
    }
}

#[test]
fn ranges_outside_the_exposed_regions_are_refused_and_nothing_is_written() {
    if !runtime_available() {
        return;
    }
    for scope in [MetadataScope::Agent, MetadataScope::Exposed] {
        let h = Nixl::new(scope);
        let (server, client) = (
            Connector::new(h.backend("server")),
            Connector::new(h.backend("client")),
        );
        let writable = server.create_writable(zeroed(4096)).unwrap();
        let meta = writable.metadata();
        assert_refused(client.begin_write(
            filled(1, 4096),
            &forge(meta, OperationKind::Write, shifted(meta, 1, 4096)),
        ));
        assert_refused(client.begin_write(
            filled(2, 8192),
            &forge(meta, OperationKind::Write, shifted(meta, 0, 8192)),
        ));
        assert_refused(client.begin_write(
            filled(3, 64),
            &forge(meta, OperationKind::Write, shifted(meta, 1 << 30, 64)),
        ));
        // The server is untouched and still serves an honest peer.
        let write = client.begin_write(filled(4, 4096), meta).unwrap();
        write.wait_timeout(WAIT).unwrap();
        writable.wait_timeout(WAIT).unwrap();
        assert_eq!(
            writable.into_descriptors().unwrap()[0].as_slice().unwrap(),
            pattern(4, 4096).as_slice()
        );
    }
}

/// A blob broken anywhere (every truncation of a real one, garbage, bytes
/// after its end) is `InvalidMetadata` before NIXL sees it: nothing is
/// loaded, and the peer it came from is served as before.
#[test]
fn garbage_agent_metadata_is_refused_before_nixl_sees_it() {
    if !runtime_available() {
        return;
    }
    for scope in [MetadataScope::Agent, MetadataScope::Exposed] {
        let h = Nixl::new(scope);
        let (server, client) = (
            Connector::new(h.backend("server")),
            Connector::new(h.backend("client")),
        );
        let readable = server.create_readable(filled(5, 64)).unwrap();
        let meta = readable.metadata();
        let real = meta.agent_metadata();
        // A two-part blob cut right after its first part is a well-formed
        // connection-only blob, not garbage.
        let first_part = (scope == MetadataScope::Exposed).then(|| {
            let len = u64::from_le_bytes(real[8..16].try_into().unwrap());
            16 + usize::try_from(len).unwrap()
        });
        let mut longer = real.to_vec();
        longer.push(b'|');
        let garbage = (1..real.len())
            .filter(|cut| Some(*cut) != first_part)
            .map(|cut| real[..cut].to_vec())
            .chain([b"not nixl metadata".to_vec(), vec![0xff; 4096], longer]);
        for blob in garbage {
            let forged = RdmaMetadata::new(
                OperationKind::Read,
                meta.descriptors().to_vec(),
                blob.clone(),
                meta.notification_key().into(),
            )
            .unwrap();
            match client.begin_read(&forged, zeroed(64)) {
                Err(Error::InvalidMetadata { field, .. }) => assert_eq!(field, "nixl_metadata"),
                other => panic!(
                    "{scope:?}, {} of {} bytes: {other:?}",
                    blob.len(),
                    real.len()
                ),
            }
        }
        assert_eq!(client.remote_agent_count(), 0);
        let read = client.begin_read(meta, zeroed(64)).unwrap();
        read.wait_timeout(WAIT).unwrap();
        readable.wait_timeout(WAIT).unwrap();
        assert_eq!(
            read.into_descriptors().unwrap()[0].as_slice().unwrap(),
            pattern(5, 64).as_slice()
        );
    }
}

#[test]
fn scoped_metadata_keeps_a_peer_out_of_another_operations_memory() {
    if !runtime_available() {
        return;
    }
    // Both scopes publish only the exposure's regions.
    for scope in [MetadataScope::Agent, MetadataScope::Exposed] {
        let h = Nixl::new(scope);
        let (server, client) = (
            Connector::new(h.backend("server")),
            Connector::new(h.backend("client")),
        );
        let other = server.create_writable(zeroed(4096)).unwrap();
        let mine = server.create_writable(zeroed(4096)).unwrap();
        let forged = forge(
            mine.metadata(),
            OperationKind::Write,
            other.metadata().descriptors().to_vec(),
        );
        assert_refused(client.begin_write(filled(6, 4096), &forged));
        other.cancel();
        mine.cancel();
    }
}

/// NIXL keeps every region a peer loaded, whatever metadata a later transfer
/// came with, and has no access modes at all: these pass through. The
/// README says so.
#[test]
fn what_nixl_does_not_enforce() {
    if !runtime_available() {
        return;
    }
    let h = Nixl::new(MetadataScope::Agent);
    let (server, client) = (
        Connector::new(h.backend("server")),
        Connector::new(h.backend("client")),
    );
    // Another operation's region, whose metadata the peer loaded before,
    // through this operation's metadata.
    let other = server.create_writable(zeroed(4096)).unwrap();
    let mine = server.create_writable(zeroed(4096)).unwrap();
    client.warm_up(other.metadata()).unwrap();
    let forged = forge(
        mine.metadata(),
        OperationKind::Write,
        other.metadata().descriptors().to_vec(),
    );
    let write = client.begin_write(filled(7, 4096), &forged).unwrap();
    write.wait_timeout(WAIT).unwrap();
    // A readable's memory written by flipping the operation kind.
    let readable = server.create_readable(filled(8, 4096)).unwrap();
    let flipped = forge(
        readable.metadata(),
        OperationKind::Write,
        readable.metadata().descriptors().to_vec(),
    );
    let write = client.begin_write(filled(9, 4096), &flipped).unwrap();
    write.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(
        readable.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(9, 4096).as_slice()
    );
    // Read-only memory: the flipped write is accepted too, but lands in the
    // private copy NIXL was given (`access_enforced`): the memory itself
    // never changes (`nixl_readable_bytes_written_by_forged_write.rs`).
    let shared = bytes::Bytes::from(pattern(10, 4096));
    let readable = server
        .create_readable(vec![Descriptor::from_bytes(shared).unwrap()])
        .unwrap();
    let flipped = forge(
        readable.metadata(),
        OperationKind::Write,
        readable.metadata().descriptors().to_vec(),
    );
    let write = client.begin_write(filled(11, 4096), &flipped).unwrap();
    write.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(
        readable.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(10, 4096).as_slice()
    );
    // And a notification is taken at its word: a transfer into `other` that
    // carries `victim`'s key completes `victim`, whose memory was never
    // written (NIXL does not say which memory a transfer reached).
    let victim = server.create_writable(zeroed(4096)).unwrap();
    let other = server.create_writable(zeroed(4096)).unwrap();
    let keyed = rekeyed(other.metadata(), victim.metadata());
    client
        .begin_write(filled(12, 4096), &keyed)
        .unwrap()
        .wait_timeout(WAIT)
        .unwrap();
    victim.wait_timeout(WAIT).unwrap();
    assert!(
        victim.into_descriptors().unwrap()[0]
            .as_slice()
            .unwrap()
            .iter()
            .all(|&b| b == 0)
    );
    other.cancel();
}
