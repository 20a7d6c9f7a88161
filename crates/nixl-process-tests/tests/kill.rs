//! Peers that die mid-transfer, as real OS processes over NIXL: the survivor
//! sees a bounded error (active side) or a timeout (passive side), then completes
//! a fresh transfer with a new peer. 256 MiB transfers (1 GiB with
//! `RELIABILITY_LONG`, as `cargo xtask test --long` sets).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

use std::process::Command;
use std::time::{Duration, Instant};

use descriptor_core::{Connector, Descriptor, Error, RdmaMetadata};
use test_support::{Peer, crc32_of, nixl_connector, pattern, runtime_available};

const BLOCK: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

fn blocks() -> usize {
    if std::env::var_os("RELIABILITY_LONG").is_some() {
        1024
    } else {
        256
    }
}

fn peer(args: &[&str]) -> Peer {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nixl-test-peer"));
    command.args(args);
    Peer::spawn(command)
}

/// A small checked transfer with a brand-new peer process.
fn fresh_write_succeeds(connector: &Connector) {
    let peer = peer(&["writable", "4", "4096"]);
    let metadata: RdmaMetadata = peer.line(WAIT).parse().unwrap();
    let source: Vec<Descriptor> = (0..4)
        .map(|i| Descriptor::new(pattern(900 + i, 4096)).unwrap())
        .collect();
    let expected = crc32_of(&source);
    let write = connector.begin_write(source, &metadata).unwrap();
    write.wait_timeout(WAIT).unwrap();
    let report: serde_json::Value = serde_json::from_str(&peer.line(WAIT)).unwrap();
    assert_eq!(report["crc32"], expected);
    peer.finish();
}

/// Kills `peer` after `delay` on another thread.
fn kill_after(peer: Peer, delay: Duration) -> std::thread::JoinHandle<()> {
    let mut peer = peer;
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        peer.kill();
    })
}

/// Over shared memory, UCX moves the bytes inside the post itself, so the kill
/// must land while `begin_write` is still copying: it comes from another thread
/// after a delay, tried at growing delays until one lands mid-transfer.
#[test]
fn killing_the_passive_process_mid_write_errors_the_write_in_bounded_time() {
    kill_the_passive_process_mid_write(true);
}

/// Without peer-failure detection UCX promises nothing about a dead peer; on
/// one host the copy into the dead process still fails, and this checks that
/// the write ends failed all the same (the builder's documentation says so).
#[test]
fn without_peer_failure_detection_killing_the_passive_process_still_errors_the_write() {
    kill_the_passive_process_mid_write(false);
}

fn kill_the_passive_process_mid_write(detect: bool) {
    if !runtime_available() {
        return;
    }
    let writer = nixl_connector("writer", detect);
    let n = blocks();
    let mut detected = None;
    for delay_ms in [30u64, 40, 50, 60, 70, 80, 100, 120, 150, 200] {
        let target = peer(&["writable", &n.to_string(), &BLOCK.to_string()]);
        let metadata: RdmaMetadata = target.line(WAIT).parse().unwrap();
        let source: Vec<Descriptor> = (0..n)
            .map(|_| Descriptor::new(vec![0xa5u8; BLOCK]).unwrap())
            .collect();
        let killer = kill_after(target, Duration::from_millis(delay_ms));
        let started = Instant::now();
        let outcome = writer
            .begin_write(source, &metadata)
            .and_then(|write| write.wait_timeout(WAIT));
        let elapsed = started.elapsed();
        killer.join().unwrap();
        match outcome {
            Ok(()) => eprintln!("kill after {delay_ms} ms: the write finished first; again"),
            Err(Error::TimedOut(_)) => {
                panic!("the write neither failed nor completed within {WAIT:?} of the kill")
            }
            // Killed before the connection was up: not the case under test.
            Err(e) if e.to_string().contains("load remote") => {
                eprintln!(
                    "kill after {delay_ms} ms: the peer died before the connection ({e}); later"
                );
            }
            Err(e) => {
                detected = Some((delay_ms, elapsed, e));
                break;
            }
        }
    }
    let (delay_ms, elapsed, error) = detected.expect("no kill landed mid-transfer");
    eprintln!(
        "detection {detect}: killed passive peer {delay_ms} ms into a {n} MiB write: the writer got an error after {elapsed:?}: {error}"
    );
    assert!(elapsed < WAIT);
    assert!(
        matches!(error, Error::TransferFailed { .. }),
        "the write itself ends Errored: {error:?}"
    );
    fresh_write_succeeds(&writer);
}

#[test]
fn killing_the_active_process_leaves_the_passive_wait_timing_out() {
    if !runtime_available() {
        return;
    }
    let server = nixl_connector("server", true);
    let n = blocks();
    let mut timed_out = None;
    for delay_ms in [150u64, 100, 50, 20] {
        let source: Vec<Descriptor> = (0..n)
            .map(|_| Descriptor::new(vec![0x5au8; BLOCK]).unwrap())
            .collect();
        let readable = server.create_readable(source).unwrap();
        let mut reader = peer(&["reader"]);
        reader.send(&readable.metadata().to_json());
        let killer = kill_after(reader, Duration::from_millis(delay_ms));
        killer.join().unwrap();
        let result = readable.wait_timeout(Duration::from_secs(2));
        // NIXL cannot revoke: dropping the readable quarantines its memory
        // (decision 0014) rather than free at once what a dead (or not quite
        // dead) peer might still touch.
        drop(readable);
        match result {
            Ok(()) => eprintln!("kill after {delay_ms} ms: the read finished first; again"),
            Err(Error::TimedOut(d)) => {
                assert_eq!(d, Duration::from_secs(2));
                timed_out = Some(delay_ms);
                break;
            }
            Err(other) => panic!("a passive wait whose peer died gave {other:?}"),
        }
    }
    let delay_ms = timed_out.expect("the reader always finished before the kill");
    eprintln!(
        "killed the active peer {delay_ms} ms after it got the metadata: the passive wait timed out cleanly"
    );

    // The survivor serves a new peer.
    let source: Vec<Descriptor> = (0..4)
        .map(|i| Descriptor::new(pattern(700 + i, 4096)).unwrap())
        .collect();
    let expected = crc32_of(&source);
    let readable = server.create_readable(source).unwrap();
    let mut reader = peer(&["reader"]);
    reader.send(&readable.metadata().to_json());
    assert_eq!(reader.line(WAIT), r#"{"started":true}"#);
    let report: serde_json::Value = serde_json::from_str(&reader.line(WAIT)).unwrap();
    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(report["crc32"], expected);
    reader.finish();
}
