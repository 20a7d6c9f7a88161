//! Two "hosts": network namespaces joined by a veth pair, one NIXL process in
//! each, UCX forced onto TCP (`UCX_TLS=tcp`) between them; 256 MiB each way,
//! compared by CRC-32. Needs root and iproute2: elsewhere it says why it skips.
#![allow(clippy::unwrap_used, clippy::panic, clippy::print_stderr)]

use std::process::Command;
use std::time::{Duration, Instant};

use test_support::{Peer, runtime_available};

const BLOCKS: &str = "256";
const BLOCK: &str = "1048576";
const WAIT: Duration = Duration::from_secs(120);

/// Two namespaces and a veth pair, removed on drop.
struct Hosts {
    a: String,
    b: String,
    dev_a: String,
    dev_b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    fn new() -> Result<Hosts, String> {
        let id = std::process::id();
        let hosts = Hosts {
            a: format!("nixl-a-{id}"),
            b: format!("nixl-b-{id}"),
            dev_a: format!("nxa{}", id % 100_000),
            dev_b: format!("nxb{}", id % 100_000),
        };
        let net = format!("10.{}.{}", 100 + id % 100, id / 100 % 250);
        let addr_a = format!("{net}.1/24");
        let addr_b = format!("{net}.2/24");
        ip(&["netns", "add", &hosts.a])?;
        ip(&["netns", "add", &hosts.b])?;
        ip(&[
            "link",
            "add",
            &hosts.dev_a,
            "type",
            "veth",
            "peer",
            "name",
            &hosts.dev_b,
        ])?;
        ip(&["link", "set", &hosts.dev_a, "netns", &hosts.a])?;
        ip(&["link", "set", &hosts.dev_b, "netns", &hosts.b])?;
        for (ns, dev, addr) in [
            (&hosts.a, &hosts.dev_a, &addr_a),
            (&hosts.b, &hosts.dev_b, &addr_b),
        ] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(hosts)
    }

    /// The test peer, inside namespace `ns`, talking TCP over `dev` only.
    fn peer(&self, ns: &str, dev: &str, args: &[&str]) -> Peer {
        let mut command = Command::new("ip");
        command
            .args([
                "netns",
                "exec",
                ns,
                "env",
                "UCX_TLS=tcp",
                &format!("UCX_NET_DEVICES={dev}"),
            ])
            .arg(env!("CARGO_BIN_EXE_nixl-test-peer"))
            .args(args);
        Peer::spawn(command)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it the pair.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn hosts_or_skip() -> Option<Hosts> {
    if !runtime_available() {
        return None;
    }
    match Hosts::new() {
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
    let target = hosts.peer(&hosts.b, &hosts.dev_b, &[passive, BLOCKS, BLOCK, "11"]);
    let metadata = target.line(WAIT);
    let mut initiator = hosts.peer(&hosts.a, &hosts.dev_a, &[active, "11"]);
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
