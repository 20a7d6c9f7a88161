//! `Connector::warm_up` on NIXL: loads the peer and makes its connection (a
//! one-byte READ through each agent that posts to it); the peer stays
//! loaded, idle, and the transfers that follow move the right bytes,
//! notifying the passive side, under every agent layout. Timing is not
//! asserted (measured in docs/decisions/0008-no-proactive-make-connection.md).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use backend_nixl::{NixlBackend, NixlBackendBuilder, Notifications};
use descriptor_core::Connector;
use descriptor_core::conformance::{filled, pattern, zeroed_one};
use rstest::rstest;
use test_support::runtime_available;

const WAIT: Duration = Duration::from_secs(20);

#[rstest]
#[case::two_agents_apart("apart", |b: NixlBackendBuilder| b)]
#[case::two_agents_attached("attached", |b: NixlBackendBuilder| b.notifications(Notifications::Attached))]
#[case::one_agent("one", |b: NixlBackendBuilder| b.progress_thread(false))]
fn a_warmed_up_peer_stays_loaded_and_its_transfers_move_the_bytes(
    #[case] tag: &str,
    #[case] configure: fn(NixlBackendBuilder) -> NixlBackendBuilder,
) {
    if !runtime_available() {
        return;
    }
    let build = |role: &str| {
        let name = format!("warm-{tag}-{role}-{}", std::process::id());
        Connector::new(configure(NixlBackend::builder(&name)).build().unwrap())
    };
    let (server, client) = (build("server"), build("client"));
    // A byte the warm-up's READ might touch: it must stay as it was.
    let readable = server.create_readable(filled(3, 64 << 10)).unwrap();
    client.warm_up(readable.metadata()).unwrap();
    assert_eq!(client.idle_remote_agent_count(), 1);
    // Warming up again is harmless.
    client.warm_up(readable.metadata()).unwrap();
    let read = client
        .begin_read(readable.metadata(), zeroed_one(64 << 10))
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    let got = read.into_descriptors().unwrap();
    assert_eq!(got[0].as_slice().unwrap(), pattern(3, 64 << 10));
    let back = readable.into_descriptors().unwrap();
    assert_eq!(back[0].as_slice().unwrap(), pattern(3, 64 << 10));

    let writable = server.create_writable(zeroed_one(4096)).unwrap();
    client.warm_up(writable.metadata()).unwrap();
    // The warm-up READs; it writes nothing into the writable.
    let write = client
        .begin_write(filled(4, 4096), writable.metadata())
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    writable.wait_timeout(WAIT).unwrap();
    let got = writable.into_descriptors().unwrap();
    assert_eq!(got[0].as_slice().unwrap(), pattern(4, 4096));
    assert_eq!(client.remote_agent_count(), 0);
}
