//! Two "hosts" on one machine: network namespaces joined by a veth pair, for
//! the tests and benchmarks that need a real network stack between two
//! processes. Needs root and iproute2; [`Hosts::new`] says why it cannot.

use std::process::Command;

/// One end: a network namespace, its veth device and address.
#[derive(Debug)]
pub struct Host {
    /// The namespace's name.
    pub namespace: String,
    /// Its end of the veth pair.
    pub device: String,
    /// Its IPv4 address, with the prefix length (`10.x.y.1/24`).
    pub address: String,
}

impl Host {
    /// The command line that runs a program inside this host with UCX on TCP
    /// over the veth device only (`ip netns exec NS env UCX_TLS=tcp
    /// UCX_NET_DEVICES=DEV`); append the program and its arguments.
    pub fn ucx_over_tcp(&self) -> Vec<String> {
        [
            "ip",
            "netns",
            "exec",
            &self.namespace,
            "env",
            "UCX_TLS=tcp",
            &format!("UCX_NET_DEVICES={}", self.device),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// [`Host::ucx_over_tcp`] as a [`Command`] running `program`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let line = self.ucx_over_tcp();
        let mut command = Command::new(&line[0]);
        command.args(&line[1..]).arg(program);
        command
    }
}

/// Two namespaces `{prefix}-a-{pid}` and `{prefix}-b-{pid}` joined by a veth
/// pair, each end addressed and up (with loopback); deleted on drop.
#[derive(Debug)]
pub struct Hosts {
    /// The first host (address `.1`).
    pub a: Host,
    /// The second host (address `.2`).
    pub b: Host,
}

/// Runs `ip ARGS`; its stderr on failure.
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
    /// Makes the two hosts, names starting with `prefix` (device names take
    /// its first letter: they are limited to 15 bytes). An error says which
    /// `ip` command failed and why (not root, no iproute2, ...); what was made
    /// before it is removed.
    pub fn new(prefix: &str) -> Result<Hosts, String> {
        let id = std::process::id();
        let letter = prefix.chars().next().unwrap_or('t');
        let net = format!("10.{}.{}", 100 + id % 100, id / 100 % 250);
        let host = |side: char, n: u8| Host {
            namespace: format!("{prefix}-{side}-{id}"),
            device: format!("{letter}x{side}{}", id % 100_000),
            address: format!("{net}.{n}/24"),
        };
        // Made first, so that dropping it on an error deletes what exists.
        let hosts = Hosts {
            a: host('a', 1),
            b: host('b', 2),
        };
        ip(&["netns", "add", &hosts.a.namespace])?;
        ip(&["netns", "add", &hosts.b.namespace])?;
        ip(&[
            "link",
            "add",
            &hosts.a.device,
            "type",
            "veth",
            "peer",
            "name",
            &hosts.b.device,
        ])?;
        for host in [&hosts.a, &hosts.b] {
            let (ns, dev) = (host.namespace.as_str(), host.device.as_str());
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&["-n", ns, "addr", "add", &host.address, "dev", dev])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it the
        // pair; a veth pair made before its move into a namespace failed is
        // deleted by name.
        let _ = ip(&["netns", "del", &self.a.namespace]);
        let _ = ip(&["netns", "del", &self.b.namespace]);
        let _ = ip(&["link", "del", &self.a.device]);
    }
}
