//! Two OS processes over NIXL (UCX on one machine): the passive side runs in a
//! spawned `nixl-test-peer`, RdmaMetadata crosses a pipe, and 64 MiB move in
//! 1 MiB descriptors each way, checked by CRC-32.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::process::Command;
use std::time::Duration;

use backend_nixl::NixlBackend;
use descriptor_core::{Connector, Descriptor, RdmaMetadata};
use test_support::{Peer, crc32_of, pattern, runtime_available};

const BLOCKS: usize = 64;
const BLOCK: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(120);

fn peer(mode: &str) -> Peer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nixl-test-peer"));
    command.args([mode, &BLOCKS.to_string(), &BLOCK.to_string(), "7"]);
    Peer::spawn(command)
}

fn report(peer: &Peer) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(&peer.line(WAIT)).unwrap();
    (v["crc32"].as_u64().unwrap(), v["bytes"].as_u64().unwrap())
}

fn connector(role: &str) -> Connector {
    Connector::new(NixlBackend::new(&format!("{role}-{}", std::process::id())).unwrap())
}

#[test]
fn read_64_mib_from_another_process() {
    if !runtime_available() {
        return;
    }
    let peer = peer("readable");
    let metadata: RdmaMetadata = peer.line(WAIT).parse().unwrap();
    assert_eq!(metadata.descriptors().len(), BLOCKS);
    let local = (0..BLOCKS)
        .map(|_| Descriptor::new(vec![0u8; BLOCK]).unwrap())
        .collect::<Vec<_>>();
    let read = connector("reader").begin_read(&metadata, local).unwrap();
    read.wait_timeout(WAIT).unwrap();
    let local = read.into_descriptors().unwrap();
    let (crc, bytes) = report(&peer);
    assert_eq!(bytes, (BLOCKS * BLOCK) as u64);
    assert_eq!(
        u64::from(crc32_of(&local)),
        crc,
        "the bytes read differ from the peer's"
    );
    // The peer filled block i from seed 7 + i, as `pattern` does.
    assert_eq!(local[5].as_slice().unwrap(), pattern(12, BLOCK).as_slice());
    peer.finish();
}

#[test]
fn write_64_mib_into_another_process() {
    if !runtime_available() {
        return;
    }
    let peer = peer("writable");
    let metadata: RdmaMetadata = peer.line(WAIT).parse().unwrap();
    let source = (0..BLOCKS)
        .map(|i| Descriptor::new(pattern(100 + i as u64, BLOCK)).unwrap())
        .collect::<Vec<_>>();
    let expected = crc32_of(&source);
    let write = connector("writer").begin_write(source, &metadata).unwrap();
    write.wait_timeout(WAIT).unwrap();
    let (crc, bytes) = report(&peer);
    assert_eq!(bytes, (BLOCKS * BLOCK) as u64);
    assert_eq!(
        crc,
        u64::from(expected),
        "the peer received other bytes than were written"
    );
    peer.finish();
}

/// An active peer that exits as soon as its operation ended, the first
/// between the two agents: the passive side still gets the notification.
/// (It did not when the notification could still wait in UCX, behind the
/// handshake of a new endpoint, as the operation ended: this test then
/// failed in 3 of 10 runs. A race: not every run catches it.) Both kinds,
/// each pairing of UCX's peer-failure detection, the passive side with and
/// without NIXL's thread, several rounds each.
#[test]
fn an_active_peer_that_exits_at_once_still_notifies() {
    if !runtime_available() {
        return;
    }
    const ROUNDS: u64 = 3;
    let pairings = [(true, false), (false, false), (true, true), (false, true)];
    for (thread, (serves, detect)) in [false, true]
        .into_iter()
        .flat_map(|t| pairings.map(|p| (t, p)))
    {
        // With NIXL's thread the passive side answers a new endpoint's
        // handshake when that thread wakes, without it when its watcher
        // polls: the race above runs differently.
        let name = format!("server-{serves}-{thread}-{}", std::process::id());
        let server = Connector::new(
            NixlBackend::builder(&name)
                .peer_failure_detection(serves)
                .progress_thread(thread)
                .build()
                .unwrap(),
        );
        for round in 0..ROUNDS {
            for role in ["reader", "writer"] {
                let seed = 40 + round * 10;
                let blocks = |seed: Option<u64>| {
                    (0..4)
                        .map(|i| {
                            Descriptor::new(match seed {
                                Some(seed) => pattern(seed + i, 4096),
                                None => vec![0u8; 4096],
                            })
                            .unwrap()
                        })
                        .collect::<Vec<_>>()
                };
                let mut command = Command::new(env!("CARGO_BIN_EXE_nixl-test-peer"));
                command.args([role, &seed.to_string(), &detect.to_string()]);
                let mut peer = Peer::spawn(command);
                let (passive, expected) = if role == "reader" {
                    let source = blocks(Some(seed));
                    let expected = crc32_of(&source);
                    let readable = server.create_readable(source).unwrap();
                    peer.send(&readable.metadata().to_json());
                    let wait = readable.wait_timeout(Duration::from_secs(10));
                    let held = wait.map(|()| readable.into_descriptors().unwrap());
                    (held, expected)
                } else {
                    let expected = crc32_of(&blocks(Some(seed)));
                    let writable = server.create_writable(blocks(None)).unwrap();
                    peer.send(&writable.metadata().to_json());
                    let wait = writable.wait_timeout(Duration::from_secs(10));
                    let held = wait.map(|()| writable.into_descriptors().unwrap());
                    (held, expected)
                };
                assert_eq!(peer.line(WAIT), r#"{"started":true}"#);
                let report: serde_json::Value = serde_json::from_str(&peer.line(WAIT)).unwrap();
                peer.finish();
                let held = passive.unwrap_or_else(|e| {
                    panic!("round {round}, passive NIXL thread {thread}, detection {serves} (passive) / {detect} (active): the {role} ended and exited, but its notification never came: {e}")
                });
                assert_eq!(report["crc32"], expected, "the {role}'s bytes");
                assert_eq!(crc32_of(&held), expected, "the passive side's bytes");
            }
        }
    }
}
