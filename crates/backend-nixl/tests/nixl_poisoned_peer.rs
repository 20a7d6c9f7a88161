//! Drop into crates/backend-nixl/tests/. One malformed metadata blob naming a
//! peer, that NIXL refuses only in its region section (after it accepted the
//! connection info), leaves that peer unreachable from this connector for
//! good: NIXL 1.5.1 erases the peer's entries without disconnecting its UCX
//! engine, so every later load of the peer (its valid metadata included)
//! fails with INVALID_PARAM, and the connector's unload-and-retry path does
//! not recover. A fresh connector reaches the same peer fine.
//! Triggers shown: (a) the blob truncated inside its region section (a peer
//! never loaded before); (b) one byte of a known region's packed rkey changed
//! (on RDMA hosts an honest peer that re-registers memory at the same address
//! publishes such a blob: not verifiable on this host).
#![allow(clippy::unwrap_used, clippy::panic)]
use std::time::Duration;

use backend_nixl::{LogLevel, MetadataScope, NixlBackend};
use descriptor_core::conformance::{filled, pattern, zeroed_one};
use descriptor_core::{Connector, Error, OperationKind, RdmaMetadata, ReadableOperation};
use test_support::runtime_available;

const WAIT: Duration = Duration::from_secs(10);

fn connector(tag: &str) -> Connector {
    let name = format!("poison{}-{tag}", std::process::id());
    Connector::new(
        NixlBackend::builder(&name)
            .metadata_scope(MetadataScope::Agent)
            .log_level(LogLevel::Off)
            .build()
            .unwrap(),
    )
}

fn read_once(server: &Connector, client: &Connector, seed: u64) -> Result<(), Error> {
    let readable = server.create_readable(filled(seed, 4096)).unwrap();
    let outcome = client
        .begin_read(readable.metadata(), zeroed_one(4096))
        .and_then(|read| {
            read.wait_timeout(WAIT)?;
            readable.wait_timeout(WAIT)?;
            let got = read
                .into_descriptors()
                .unwrap()
                .remove(0)
                .into_vec::<u8>()
                .unwrap();
            assert_eq!(got, pattern(seed, 4096));
            Ok(())
        });
    if outcome.is_err() {
        readable.cancel();
    }
    outcome
}

fn malformed(readable: &ReadableOperation, edit: impl FnOnce(&mut Vec<u8>)) -> RdmaMetadata {
    let meta = readable.metadata();
    let mut blob = meta.agent_metadata().to_vec();
    edit(&mut blob);
    RdmaMetadata::new(
        OperationKind::Read,
        meta.descriptors().to_vec(),
        blob,
        meta.notification_key().into(),
    )
    .unwrap()
}

fn check(tag: &str, load_first: bool, edit: impl FnOnce(&mut Vec<u8>)) {
    let (server, client) = (
        connector(&format!("{tag}-server")),
        connector(&format!("{tag}-client")),
    );
    if load_first {
        read_once(&server, &client, 1).unwrap(); // the peer is loaded, now idle
    }
    let readable = server.create_readable(filled(2, 4096)).unwrap();
    let _ = client.begin_read(&malformed(&readable, edit), zeroed_one(4096)); // refused: fine
    readable.cancel();
    read_once(&server, &connector(&format!("{tag}-fresh")), 3).unwrap(); // the server is healthy
    for seed in 4..7 {
        if let Err(e) = read_once(&server, &client, seed) {
            panic!("{tag}: valid metadata of a healthy peer refused after one malformed blob: {e}");
        }
    }
}

#[test]
fn a_blob_truncated_in_its_regions_does_not_cut_the_peer_off() {
    if runtime_available() {
        check("trunc", false, |blob| blob.truncate(blob.len() - 60));
    }
}

#[test]
fn a_changed_rkey_of_a_known_region_does_not_cut_the_peer_off() {
    if runtime_available() {
        check("rkey", true, |blob| {
            let at = blob.len() - 3;
            blob[at] ^= 0xff;
        });
    }
}
