//! Conformance checks of peers: one that vanishes (as if its process died)
//! completes nothing more, and the cache of idle peers survives an agent
//! blob the backend refuses.

use std::time::Duration;

use crate::testing::eventually;
use crate::{Connector, Error, OperationKind, RdmaMetadata};

use super::{Harness, WAIT, assert_pattern, connector, descriptors, faulty, zeroed};

/// An agent that vanishes (as if its process died) completes nothing more:
/// a transfer in flight to it ends, the survivor refuses nothing it should
/// not, and completes a fresh transfer with another peer.
pub fn vanished_peer_completes_nothing(h: &dyn Harness) {
    let (server, server_faults) = faulty(h, "gone-server");
    let (client, faults) = faulty(h, "gone-client");
    let writable = server.create_writable(zeroed(&[4096])).unwrap();
    let readable = server.create_readable(descriptors(12, &[4096])).unwrap();
    let stale = readable.metadata().clone();
    let stall = faults.stall_next_transfer();
    let in_flight = client
        .begin_write(descriptors(12, &[4096]), writable.metadata())
        .unwrap();
    assert!(server_faults.vanish());
    assert!(!server_faults.vanish(), "an agent vanishes once");
    stall.release();
    // Where revocation is enforced the write is refused when it runs;
    // elsewhere its bytes may land, but nobody is notified.
    match in_flight.wait_timeout(WAIT) {
        Ok(()) => assert!(
            !server.revocation_enforced(),
            "a revoked exposure was written"
        ),
        Err(Error::TransferFailed { .. }) => {}
        other => panic!("a write to a vanished peer gave {other:?}"),
    }
    match client.begin_read(&stale, zeroed(&[4096])) {
        Ok(read) if server.revocation_enforced() => panic!(
            "a vanished peer's exposure was still readable ({:?})",
            read.status()
        ),
        Ok(read) => drop(read),
        Err(_) => {}
    }
    for (what, passive) in [
        (
            "writable",
            writable.wait_timeout(Duration::from_millis(300)),
        ),
        (
            "readable",
            readable.wait_timeout(Duration::from_millis(300)),
        ),
    ] {
        assert!(
            matches!(passive, Err(Error::TimedOut(_))),
            "the vanished peer's {what} completed: {passive:?}"
        );
    }
    eventually("the survivor released the vanished peer", || {
        client.remote_agent_count() == 0
    });
    // The survivor completes a fresh transfer with a new peer.
    let fresh = connector(h, "gone-server-2");
    let readable = fresh.create_readable(descriptors(13, &[4096])).unwrap();
    let read = client
        .begin_read(readable.metadata(), zeroed(&[4096]))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_pattern(
        &read.into_descriptors().unwrap(),
        13,
        "read from a new peer",
    );
}

/// A well-formed metadata document whose agent blob the backend refuses
/// changes nothing: every idle peer stays loaded. (One refused blob once
/// unloaded every idle peer, the cache retrying after evicting them all.)
pub fn a_refused_agent_blob_keeps_every_idle_peer(h: &dyn Harness) {
    const PEERS: usize = 8;
    let client = connector(h, "idle-cache-client");
    let servers: Vec<Connector> = (0..PEERS)
        .map(|i| {
            let server = connector(h, &format!("idle-cache-server-{i}"));
            let readable = server
                .create_readable(descriptors(150 + i as u64, &[64]))
                .unwrap();
            let read = client
                .begin_read(readable.metadata(), zeroed(&[64]))
                .unwrap();
            read.wait_timeout(WAIT).unwrap();
            readable.wait_timeout(WAIT).unwrap();
            assert_pattern(
                &read.into_descriptors().unwrap(),
                150 + i as u64,
                "a read from an idle-to-be peer",
            );
            server
        })
        .collect();
    assert_eq!(client.idle_remote_agent_count(), PEERS);
    let exposed = servers[0].create_readable(descriptors(99, &[64])).unwrap();
    let junk = RdmaMetadata::new(
        OperationKind::Read,
        exposed.metadata().descriptors().to_vec(),
        b"junk".to_vec(),
        exposed.metadata().notification_key().to_owned(),
    )
    .unwrap();
    assert!(client.begin_read(&junk, zeroed(&[64])).is_err());
    assert_eq!(
        client.idle_remote_agent_count(),
        PEERS,
        "one refused blob unloaded idle peers"
    );
    // The peer is still reached with its real metadata.
    let read = client
        .begin_read(exposed.metadata(), zeroed(&[64]))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert_pattern(
        &read.into_descriptors().unwrap(),
        99,
        "a read after a refused blob",
    );
}
