//! A NIXL peer that exited: loading its metadata fails in UCX (connection
//! refused, said only on stderr) with the same BACKEND error as a refused
//! region. The error says what happened: "peer unreachable (exited?)".
//!
//! The peer is this test binary run again as a child process
//! (`PEER_METADATA_OUT` set): it exposes memory, prints the metadata and
//! waits to be killed.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stdout)]

use std::process::Command;
use std::time::Duration;

use backend_nixl::NixlBackend;
use descriptor_core::conformance::{filled, zeroed_one};
use descriptor_core::{Connector, RdmaMetadata};
use test_support::{Peer, runtime_available};

const ROLE: &str = "UNREACHABLE_PEER_ROLE";
const PREFIX: &str = "METADATA: ";
const WAIT: Duration = Duration::from_secs(30);

/// The child's part: runs only in the child (the parent's run returns).
#[test]
fn peer_process() {
    let Some(name) = std::env::var_os(ROLE) else {
        return;
    };
    let connector = Connector::new(NixlBackend::new(name.to_str().unwrap()).unwrap());
    let readable = connector.create_readable(filled(7, 4096)).unwrap();
    println!("{PREFIX}{}", readable.metadata());
    // Killed before this ends.
    let _ = readable.wait_timeout(Duration::from_secs(120));
}

/// Starts the peer, takes its metadata and kills it.
fn metadata_of_a_peer_that_exited() -> RdmaMetadata {
    let name = format!("exited-{}", std::process::id());
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "peer_process", "--nocapture", "--test-threads=1"])
        .env(ROLE, &name);
    let mut peer = Peer::spawn(command);
    let metadata = loop {
        let line = peer.line(WAIT);
        // libtest prints the test's name before it, on the same line.
        if let Some((_, json)) = line.split_once(PREFIX) {
            break json.parse().unwrap();
        }
    };
    peer.kill();
    metadata
}

fn assert_unreachable(error: &descriptor_core::Error) {
    let message = error.to_string();
    assert!(
        message.contains("peer unreachable (exited?)") && message.contains("exited-"),
        "{message}"
    );
}

#[test]
fn reading_from_a_peer_that_exited_says_it_is_unreachable() {
    if !runtime_available() || std::env::var_os(ROLE).is_some() {
        return;
    }
    let metadata = metadata_of_a_peer_that_exited();
    let client =
        Connector::new(NixlBackend::new(&format!("survivor-{}", std::process::id())).unwrap());
    let error = client.begin_read(&metadata, zeroed_one(4096)).unwrap_err();
    assert_unreachable(&error);
    // Again (NIXL dropped the name: the peer is loaded under a new one).
    let error = client.begin_read(&metadata, zeroed_one(4096)).unwrap_err();
    assert_unreachable(&error);
    // A warm-up loads the peer as a transfer would, and says so too.
    let error = client.warm_up(&metadata).unwrap_err();
    assert_unreachable(&error);
    assert_eq!(client.remote_agent_count(), 0);
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// A worker that keeps retrying a dead peer (1,000 READs of one exited,
/// never-connected incarnation) keeps its file descriptors within a fixed
/// bound: a peer found unreachable is remembered (for
/// `Tuning::unreachable_for`), and the retries within that time are refused
/// without asking UCX to connect again; each one still says why.
#[test]
fn retrying_a_peer_that_exited_keeps_file_descriptors_bounded() {
    if !runtime_available() || std::env::var_os(ROLE).is_some() {
        return;
    }
    let metadata = metadata_of_a_peer_that_exited();
    let client =
        Connector::new(NixlBackend::new(&format!("retrier-{}", std::process::id())).unwrap());
    let error = client.begin_read(&metadata, zeroed_one(4096)).unwrap_err();
    assert_unreachable(&error);
    let before = open_fds();
    for _ in 0..1000 {
        let error = client.begin_read(&metadata, zeroed_one(4096)).unwrap_err();
        assert_unreachable(&error);
    }
    let grown = open_fds().saturating_sub(before);
    assert!(
        grown <= 8,
        "{grown} file descriptors more after 1,000 failed READs of one dead peer"
    );
    assert_eq!(client.remote_agent_count(), 0);
}
