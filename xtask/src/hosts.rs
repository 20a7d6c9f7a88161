//! `cargo xtask bench --two-hosts`: the cross-process rows between two
//! "hosts", network namespaces joined by a veth pair, UCX forced onto TCP over
//! it: the steady-state GB/s of this library against raw nixl-sys (target
//! with NIXL's progress thread) across a real network stack. Needs root and
//! iproute2; says why it cannot run otherwise.

use std::path::Path;

use test_support::Hosts;
use xshell::{Shell, cmd};

use crate::Workspace;
use crate::shell::{cargo, run};

/// Runs the bench's cross-process rows across two namespaces.
pub(crate) fn bench(sh: &Shell, ws: &Workspace, runtime: &Path, quick: bool) -> Result<(), u8> {
    let root = ws.root.as_path();
    let cargo = cargo();
    if !run(cmd!(sh, "{cargo} build --quiet --release -p bench")) {
        return Err(1);
    }
    let hosts = Hosts::new("bench").map_err(|e| {
        eprintln!("xtask bench --two-hosts needs root and iproute2 network namespaces: {e}");
        1
    })?;
    let wrap = hosts.b.ucx_over_tcp().join(" ");
    let out = root.join("target/bench/two-hosts");
    // `ip netns exec NS env UCX_TLS=tcp UCX_NET_DEVICES=DEV`.
    let in_a = hosts.a.ucx_over_tcp();
    let (ip, in_a) = (&in_a[0], &in_a[1..]);
    let bench = ws.target.join("release/bench");
    let sizes = "4096x1,1048576x1,1048576x16,1048576x256";
    let quick_flag = quick.then_some("--quick");
    let ok = run(cmd!(
        sh,
        "{ip} {in_a...} {bench} --xproc-only {wrap} --sizes {sizes} --out {out} {quick_flag...}"
    )
    .env("NIXL_RUNTIME_DIR", runtime));
    drop(hosts);
    if ok { Ok(()) } else { Err(1) }
}
