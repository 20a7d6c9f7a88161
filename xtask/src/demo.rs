//! `cargo xtask demo`: the KV-cache demo crate in a release build, on the
//! backend asked for.

use std::path::Path;

use xshell::{Shell, cmd};

use crate::shell::{cargo, run};
use crate::{flags, nixl};

/// Backends the demo knows, with the demo crate's feature that builds each.
pub(crate) const BACKENDS: &[(&str, &str)] = &[("loopback", "loopback"), ("nixl", "nixl")];

pub(crate) fn backend_names() -> String {
    BACKENDS
        .iter()
        .map(|(b, _)| *b)
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn demo(sh: &Shell, root: &Path, args: &flags::Demo) -> Result<(), u8> {
    let backend = args.backend.as_deref().unwrap_or("loopback");
    let Some((_, feature)) = BACKENDS.iter().find(|(name, _)| *name == backend) else {
        eprintln!(
            "xtask demo: unknown backend {backend:?}; available: {}",
            backend_names()
        );
        return Err(2);
    };
    let cargo = cargo();
    let mut options = Vec::new();
    for (flag, value) in [
        ("--blocks", args.blocks),
        ("--block-size", args.block_size),
        ("--iterations", args.iterations),
    ] {
        if let Some(value) = value {
            options.extend([flag.to_owned(), value.to_string()]);
        }
    }
    if args.offload {
        options.push("--offload".to_owned());
    }
    if let Some(port) = args.metrics_port {
        options.extend(["--metrics-port".to_owned(), port.to_string()]);
    }
    let mut cmd = cmd!(
        sh,
        "{cargo} run --quiet --release -p kv-cache-demo --features {feature} -- --backend {backend} {options...}"
    );
    if backend == "nixl" {
        cmd = cmd.env("NIXL_RUNTIME_DIR", nixl::provision(sh, root, "demo")?.root);
    }
    if run(cmd) { Ok(()) } else { Err(1) }
}
