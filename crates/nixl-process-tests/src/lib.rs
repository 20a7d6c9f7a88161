//! NIXL tests that need more than one OS process: a peer in another process
//! (`tests/two_process.rs`), peers killed mid-transfer (`tests/kill.rs`), and
//! two network namespaces over TCP (`tests/two_hosts.rs`). They drive
//! `nixl-test-peer`, this crate's program. Not published.
