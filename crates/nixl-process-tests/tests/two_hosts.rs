//! Two "hosts": network namespaces joined by a veth pair, one NIXL process in
//! each, UCX forced onto TCP (`UCX_TLS=tcp`) between them; 256 MiB each way,
//! compared by CRC-32. Needs root and iproute2: elsewhere it says why it skips.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stderr)]

use std::time::{Duration, Instant};

use test_support::{Host, Hosts, Peer, runtime_available};

const BLOCKS: &str = "256";
const BLOCK: &str = "1048576";
const WAIT: Duration = Duration::from_secs(120);

/// The test peer inside `host`, talking TCP over its veth device only.
fn peer(host: &Host, args: &[&str]) -> Peer {
    let mut command = host.command(env!("CARGO_BIN_EXE_nixl-test-peer"));
    command.args(args);
    Peer::spawn(command)
}

fn hosts_or_skip() -> Option<Hosts> {
    if !runtime_available() {
        return None;
    }
    match Hosts::new("nixl") {
        Ok(h) => Some(h),
        Err(e) => {
            eprintln!("SKIPPED: two-host test needs root and iproute2 network namespaces: {e}");
            None
        }
    }
}

fn crc(line: &str) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    (v["crc32"].as_u64().unwrap(), v["bytes"].as_u64().unwrap())
}

fn transfer(hosts: &Hosts, passive: &str, active: &str) {
    let target = peer(&hosts.b, &[passive, BLOCKS, BLOCK, "11"]);
    let metadata = target.line(WAIT);
    let mut initiator = peer(&hosts.a, &[active, "11"]);
    let started = Instant::now();
    initiator.send(&metadata);
    assert_eq!(initiator.line(WAIT), r#"{"started":true}"#);
    let (active_crc, active_bytes) = crc(&initiator.line(WAIT));
    let (passive_crc, passive_bytes) = crc(&target.line(WAIT));
    let took = started.elapsed();
    assert_eq!(active_bytes, 256 << 20);
    assert_eq!(
        (active_crc, active_bytes),
        (passive_crc, passive_bytes),
        "the hosts hold different bytes"
    );
    eprintln!(
        "two hosts over TCP: {passive} <- {active} of 256 MiB in {took:?} ({:.2} GB/s including setup), crc32 {active_crc:08x}",
        (256u64 << 20) as f64 / took.as_secs_f64() / 1e9
    );
    initiator.finish();
    target.finish();
}

#[test]
fn readable_to_read_and_writable_to_write_across_two_namespaces_over_tcp() {
    let Some(hosts) = hosts_or_skip() else {
        return;
    };
    transfer(&hosts, "readable", "reader");
    transfer(&hosts, "writable", "writer");
}
