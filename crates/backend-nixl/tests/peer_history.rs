//! A long-lived client of a server that registers a fresh buffer per
//! operation (issue 48): the client's record of the peer, and what NIXL holds
//! for it, keep the regions of the peer's recent metadata only, not every
//! region the peer ever published; a region the peer still publishes is
//! served again when its metadata comes back. Counted, not timed: NIXL
//! refusing a READ of a region the record dropped is what shows it dropped.
#![allow(clippy::unwrap_used, clippy::panic)]

use backend_nixl::{MetadataScope, NixlBackend, Tuning};
use descriptor_core::conformance::{Harness, forge, pattern, zeroed_one as zeroed};
use descriptor_core::{Connector, Descriptor, Error, OperationKind};
use std::time::Duration;
use test_support::{Nixl, runtime_available};

const WAIT: Duration = Duration::from_secs(30);
const LEN: usize = 4096;
/// The client compacts from this many regions on (the least it may).
const COMPACT_ABOVE: usize = 4096;
/// More than that and the recent window.
const OPS: u64 = COMPACT_ABOVE as u64 + 256;

#[test]
fn a_peers_old_regions_are_dropped_and_its_live_ones_served_again() {
    if !runtime_available() {
        return;
    }
    let h = Nixl::new(MetadataScope::Exposed);
    let mut tuning = Tuning::default();
    tuning.compact_peers_above = COMPACT_ABOVE;
    let client = NixlBackend::builder(&format!("history-client-{}", std::process::id()))
        .metadata_scope(MetadataScope::Exposed)
        .tuning(tuning)
        .build()
        .unwrap();
    let (server, client) = (Connector::new(h.backend("server")), Connector::new(client));
    // Exposed throughout; its metadata loaded once, at the start.
    let old = server
        .create_readable(vec![Descriptor::new(pattern(1, LEN)).unwrap()])
        .unwrap();
    client.warm_up(old.metadata()).unwrap();
    // Each READ's region at an address of its own (the buffers are kept, so
    // none is handed out again), deregistered once read.
    let mut spent: Vec<Vec<u8>> = Vec::new();
    for i in 0..OPS {
        let readable = server
            .create_readable(vec![Descriptor::new(pattern(i + 2, LEN)).unwrap()])
            .unwrap();
        let read = client.begin_read(readable.metadata(), zeroed(LEN)).unwrap();
        read.wait_timeout(WAIT).unwrap();
        assert_eq!(
            read.into_descriptors().unwrap()[0].as_slice().unwrap(),
            pattern(i + 2, LEN).as_slice(),
            "READ {i}"
        );
        readable.wait_timeout(WAIT).unwrap();
        let buffer: Vec<u8> = readable
            .into_descriptors()
            .unwrap()
            .pop()
            .unwrap()
            .into_buffer()
            .unwrap();
        spent.push(buffer);
    }
    // `old`'s region, through a fresh operation's metadata (which holds only
    // its own region): NIXL no longer holds it for the client.
    let fresh = server.create_readable(zeroed(LEN)).unwrap();
    let forged = forge(
        fresh.metadata(),
        OperationKind::Read,
        old.metadata().descriptors().to_vec(),
    );
    match client.begin_read(&forged, zeroed(LEN)) {
        Err(Error::AccessDenied { .. }) => {}
        other => panic!("NIXL still held a region from {OPS} loads ago: {other:?}"),
    }
    fresh.cancel();
    // Its own metadata brings it back: read, bytes checked.
    let read = client.begin_read(old.metadata(), zeroed(LEN)).unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_eq!(
        read.into_descriptors().unwrap()[0].as_slice().unwrap(),
        pattern(1, LEN).as_slice()
    );
    old.wait_timeout(WAIT).unwrap();
    assert_eq!(spent.len() as u64, OPS);
}
