//! `cargo xtask bench --two-hosts`: the cross-process rows between two
//! "hosts", network namespaces joined by a veth pair, UCX forced onto TCP over
//! it: the steady-state GB/s of this library against raw nixl-sys (target
//! with NIXL's progress thread) across a real network stack. Needs root and
//! iproute2; says why it cannot run otherwise.

use std::path::Path;

use xshell::{Shell, cmd};

use crate::{Workspace, cargo, run};

/// Two namespaces and a veth pair, deleted on drop.
struct Hosts<'a> {
    sh: &'a Shell,
    a: String,
    b: String,
}

/// `ip ARGS...`, its error output in the error.
fn ip(sh: &Shell, args: &[&str]) -> Result<(), String> {
    let out = cmd!(sh, "ip {args...}")
        .ignore_status()
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

impl<'a> Hosts<'a> {
    fn new(sh: &'a Shell, dev_a: &str, dev_b: &str) -> Result<Hosts<'a>, String> {
        let id = std::process::id();
        let hosts = Hosts {
            sh,
            a: format!("bench-a-{id}"),
            b: format!("bench-b-{id}"),
        };
        let net = format!("10.{}.{}", 100 + id % 100, id / 100 % 250);
        ip(sh, &["netns", "add", &hosts.a])?;
        ip(sh, &["netns", "add", &hosts.b])?;
        ip(
            sh,
            &["link", "add", dev_a, "type", "veth", "peer", "name", dev_b],
        )?;
        for (ns, dev, host) in [(&hosts.a, dev_a, 1), (&hosts.b, dev_b, 2)] {
            ip(sh, &["link", "set", dev, "netns", ns])?;
            ip(
                sh,
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{net}.{host}/24"),
                    "dev",
                    dev,
                ],
            )?;
            ip(sh, &["-n", ns, "link", "set", "lo", "up"])?;
            ip(sh, &["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts<'_> {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and the pair.
        let _ = ip(self.sh, &["netns", "del", &self.a]);
        let _ = ip(self.sh, &["netns", "del", &self.b]);
    }
}

/// Runs the bench's cross-process rows across two namespaces.
pub(crate) fn bench(sh: &Shell, ws: &Workspace, runtime: &Path, quick: bool) -> Result<(), u8> {
    let root = ws.root.as_path();
    let cargo = cargo();
    if !run(cmd!(sh, "{cargo} build --quiet --release -p bench")) {
        return Err(1);
    }
    let id = std::process::id() % 100_000;
    let (dev_a, dev_b) = (format!("bxa{id}"), format!("bxb{id}"));
    let hosts = Hosts::new(sh, &dev_a, &dev_b).map_err(|e| {
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
    let (ns_a, env_a) = (&hosts.a, tcp(&dev_a));
    let bench = ws.target.join("release/bench");
    let sizes = "4096x1,1048576x1,1048576x16,1048576x256";
    let quick_flag = quick.then_some("--quick");
    let ok = run(cmd!(
        sh,
        "ip netns exec {ns_a} {env_a...} {bench} --xproc-only {wrap} --sizes {sizes} --out {out} {quick_flag...}"
    )
    .env("NIXL_RUNTIME_DIR", runtime));
    drop(hosts);
    if ok { Ok(()) } else { Err(1) }
}
