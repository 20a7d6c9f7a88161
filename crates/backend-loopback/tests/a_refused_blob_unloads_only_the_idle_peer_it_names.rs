//! A refused agent blob that names an idle peer unloads that peer only (the
//! review's defect 9 in issue "Hardening": one unloadable blob once unloaded
//! every idle peer). The blob is forged in loopback's own format, so this
//! stays a loopback test; that a refused blob keeps every other idle peer is
//! the conformance check `a_refused_agent_blob_keeps_every_idle_peer`.
#![allow(clippy::unwrap_used, clippy::panic)]

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::conformance::{filled, zeroed_one};
use descriptor_core::{Connector, OperationKind, RdmaMetadata};

/// A client that read once from each of `n` servers, which it keeps idle.
fn client_with_idle_peers(fabric: &Fabric, n: u64) -> (Connector, Vec<Connector>) {
    let client = Connector::new(LoopbackBackend::new(fabric, "client").unwrap());
    let servers: Vec<Connector> = (0..n)
        .map(|i| {
            let server = Connector::new(LoopbackBackend::new(fabric, &format!("s{i}")).unwrap());
            let readable = server.create_readable(filled(i, 64)).unwrap();
            let read = client
                .begin_read(readable.metadata(), zeroed_one(64))
                .unwrap();
            read.wait().unwrap();
            readable.wait().unwrap();
            server
        })
        .collect();
    assert_eq!(client.idle_remote_agent_count(), n as usize);
    (client, servers)
}

/// A refused blob that names a peer kept idle (what a peer restarted under the
/// same name sends) unloads that peer only, to load the blob again; every
/// other idle peer stays.
#[test]
fn a_refused_blob_naming_an_idle_peer_unloads_that_peer_only() {
    let fabric = Fabric::new();
    let (client, servers) = client_with_idle_peers(&fabric, 4);
    let m = servers[0].create_readable(filled(99, 64)).unwrap();
    // s0's blob, as if from another fabric: refused, but it names s0.
    let mut blob = m.metadata().agent_metadata().to_vec();
    blob[4] ^= 0xFF;
    let forged = RdmaMetadata::new(
        OperationKind::Read,
        m.metadata().descriptors().to_vec(),
        blob,
        m.metadata().notification_key().to_owned(),
    )
    .unwrap();
    assert!(client.begin_read(&forged, zeroed_one(64)).is_err());
    assert_eq!(client.idle_remote_agent_count(), 3);
    // s0 is reached again with its real metadata.
    let read = client.begin_read(m.metadata(), zeroed_one(64)).unwrap();
    read.wait().unwrap();
    assert_eq!(
        read.into_descriptors().unwrap()[0].as_slice().unwrap(),
        filled(99, 64)[0].as_slice().unwrap()
    );
}
