//! `cargo xtask bench --two-hosts`: the cross-process rows between two
//! "hosts", network namespaces joined by a veth pair, UCX forced onto TCP over
//! it: the steady-state GB/s of this library against raw nixl-sys (target
//! with NIXL's progress thread) across a real network stack. Needs root and
//! iproute2; says why it cannot run otherwise.

use std::path::Path;
use std::process::Command;

use crate::{Workspace, cargo, run};

/// Two namespaces and a veth pair, deleted on drop.
struct Hosts {
    a: String,
    b: String,
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
    fn new(dev_a: &str, dev_b: &str) -> Result<Hosts, String> {
        let id = std::process::id();
        let hosts = Hosts {
            a: format!("bench-a-{id}"),
            b: format!("bench-b-{id}"),
        };
        let net = format!("10.{}.{}", 100 + id % 100, id / 100 % 250);
        ip(&["netns", "add", &hosts.a])?;
        ip(&["netns", "add", &hosts.b])?;
        ip(&["link", "add", dev_a, "type", "veth", "peer", "name", dev_b])?;
        for (ns, dev, host) in [(&hosts.a, dev_a, 1), (&hosts.b, dev_b, 2)] {
            ip(&["link", "set", dev, "netns", ns])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{net}.{host}/24"),
                "dev",
                dev,
            ])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and the pair.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// Runs the bench's cross-process rows across two namespaces.
pub(crate) fn bench(ws: &Workspace, runtime: &Path, quick: bool) -> Result<(), u8> {
    let root = ws.root.as_path();
    let mut build = cargo();
    build.args(["build", "--quiet", "--release", "-p", "bench"]);
    if !run(root, build) {
        return Err(1);
    }
    let id = std::process::id() % 100_000;
    let (dev_a, dev_b) = (format!("bxa{id}"), format!("bxb{id}"));
    let hosts = Hosts::new(&dev_a, &dev_b).map_err(|e| {
        eprintln!("xtask bench --two-hosts needs root and iproute2 network namespaces: {e}");
        1
    })?;
    let tcp = |dev: &str| {
        [
            "env".to_owned(),
            "UCX_TLS=tcp".into(),
            format!("UCX_NET_DEVICES={dev}"),
        ]
    };
    let wrap = ["ip", "netns", "exec", &hosts.b]
        .map(str::to_owned)
        .into_iter()
        .chain(tcp(&dev_b))
        .collect::<Vec<_>>()
        .join(" ");
    let out = root.join("target/bench/two-hosts");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &hosts.a])
        .args(tcp(&dev_a))
        .arg(ws.target.join("release/bench"))
        .args(["--xproc-only", &wrap])
        .args(["--sizes", "4096x1,1048576x1,1048576x16,1048576x256"])
        .arg("--out")
        .arg(&out)
        .env("NIXL_RUNTIME_DIR", runtime);
    if quick {
        cmd.arg("--quick");
    }
    let ok = run(root, cmd);
    drop(hosts);
    if ok { Ok(()) } else { Err(1) }
}
