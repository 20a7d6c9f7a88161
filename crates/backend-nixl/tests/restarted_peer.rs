//! A peer that restarts under the same name (a worker process restarted by its
//! orchestrator) must be reachable again by a connector that still keeps the
//! old incarnation loaded, idle.
#![allow(clippy::unwrap_used, clippy::panic)]

use backend_nixl::NixlBackend;
use descriptor_core::Connector;
use descriptor_core::conformance::{filled, pattern, zeroed_one};

#[test]
fn a_peer_restarted_under_the_same_name_is_reached_again() {
    if !test_support::runtime_available() {
        return;
    }
    let name = format!("restarted-{}", std::process::id());
    let client = Connector::new(NixlBackend::new(&format!("{name}-client")).unwrap());
    for incarnation in 0..3u64 {
        let server = Connector::new(NixlBackend::new(&name).unwrap());
        let readable = server.create_readable(filled(incarnation, 4096)).unwrap();
        let read = client
            .begin_read(readable.metadata(), zeroed_one(4096))
            .unwrap_or_else(|e| panic!("incarnation {incarnation}: {e}"));
        read.wait_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        readable
            .wait_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        let got = read.into_descriptors().unwrap();
        assert_eq!(got[0].as_slice().unwrap(), pattern(incarnation, 4096));
        assert_eq!(client.idle_remote_agent_count(), 1);
    }
}
