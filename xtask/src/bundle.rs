//! `cargo xtask gpu-bundle`: one folder (< 60 MiB) with release builds of the GPU
//! checks and just the NIXL runtime files they load, plus a `run.sh`, for one
//! run on a GPU machine.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cargo_metadata::{Artifact, Message};
use xshell::{Shell, cmd};

use crate::nixl;
use crate::shell::{cargo, run};

const LIMIT: u64 = 60 << 20;

fn fail(what: impl std::fmt::Display) -> u8 {
    eprintln!("xtask gpu-bundle: {what}");
    1
}

/// Files under `root` that `file` loads, by `ldd` (RPATHs resolve inside the wheel).
fn closure(sh: &Shell, root: &Path, file: &Path, out: &mut BTreeSet<PathBuf>) {
    let Ok(output) = cmd!(sh, "ldd {file}").quiet().ignore_status().read() else {
        return;
    };
    for line in output.lines() {
        if let Some(path) = line.split("=> ").nth(1).and_then(|r| r.split(" (").next()) {
            let path = PathBuf::from(path.trim());
            if path.starts_with(root) {
                out.insert(path);
            }
        }
    }
}

fn copy_into(root: &Path, file: &Path, dest: &Path) -> Result<u64, u8> {
    let relative = file.strip_prefix(root).map_err(fail)?;
    let target = dest.join(relative);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    std::fs::copy(file, &target).map_err(|e| fail(format!("{}: {e}", file.display())))
}

pub(crate) fn gpu_bundle(sh: &Shell, root: &Path) -> Result<(), u8> {
    let runtime = nixl::provision(sh, root, "gpu-bundle")?;
    let bundle = root.join("target/gpu-bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    std::fs::create_dir_all(bundle.join("tests")).map_err(fail)?;
    let build_dir = root.join("target/gpu-bundle-build");

    // Release builds without debug info, in their own target folder.
    let cargo = cargo();
    fn release(cmd: xshell::Cmd<'_>) -> xshell::Cmd<'_> {
        cmd.env("CARGO_PROFILE_RELEASE_DEBUG", "0")
            .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
    }
    let check = cmd!(
        sh,
        "{cargo} build --release -p gpu-check --target-dir {build_dir}"
    );
    if !run(release(check)) {
        return Err(fail("building gpu-check failed"));
    }
    // cargo's JSON messages on stdout, its progress on stderr as usual.
    let tests = cmd!(
        sh,
        "{cargo} test --release -p device-cuda --no-run --message-format=json --target-dir {build_dir}"
    );
    let output = release(tests)
        .read()
        .map_err(|e| fail(format!("building the device-cuda tests failed: {e}")))?;
    let mut size = std::fs::copy(
        build_dir.join("release/gpu-check"),
        bundle.join("gpu-check"),
    )
    .map_err(fail)?;
    for message in Message::parse_stream(output.as_bytes()) {
        if let Message::CompilerArtifact(Artifact {
            executable: Some(exe),
            target,
            ..
        }) = message.map_err(fail)?
        {
            let name = format!("device-cuda-{}", target.name);
            size += std::fs::copy(&exe, bundle.join("tests").join(name)).map_err(fail)?;
        }
    }

    // The NIXL runtime: the C API and the UCX plugin, UCX's modules for one
    // machine (not InfiniBand, not the perftest tools), and everything those load
    // from the wheel.
    let libs = runtime.root.join(".nixl_cu12.mesonpy.libs");
    let mut files: BTreeSet<PathBuf> = [
        libs.join("libnixl_capi.so"),
        libs.join("plugins/libplugin_UCX.so"),
    ]
    .into();
    if let Ok(entries) = std::fs::read_dir(runtime.root.join("nixl_cu12.libs/ucx")) {
        files.extend(entries.flatten().map(|e| e.path()).filter(|p| {
            // One machine, one GPU: shared memory, CMA and CUDA transports
            // suffice; the InfiniBand ones would pull in 18 MiB of verbs.
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            !["perftest", "_ib", "rdmacm"]
                .iter()
                .any(|skip| name.contains(skip))
        }));
    }
    for file in files.clone() {
        if file.extension().is_some_and(|e| e != "la") {
            closure(sh, &runtime.root, &file, &mut files);
        }
    }
    for file in &files {
        size += copy_into(&runtime.root, file, &bundle.join("nixl"))?;
    }
    let script = r#"#!/usr/bin/env bash
# GPU checks for descriptor-core: CUDA probe, VRAM descriptors, NIXL VRAM
# registration, VRAM->DRAM, DRAM->VRAM and VRAM->VRAM with checksums and GB/s.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export NIXL_RUNTIME_DIR="$here/nixl"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
status=0
"$here/gpu-check" --require-gpu || status=1
for t in "$here"/tests/*; do echo "== $t"; "$t" --test-threads 1 --nocapture || status=1; done
echo "gpu-bundle: $([ "$status" = 0 ] && echo PASSED || echo FAILED)"
exit "$status"
"#;
    let run_sh = bundle.join("run.sh");
    std::fs::write(&run_sh, script).map_err(fail)?;
    std::fs::set_permissions(&run_sh, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| fail(format!("cannot make run.sh executable: {e}")))?;
    println!(
        "gpu-bundle: {} ({:.1} MiB, {} runtime files); run it with {}/run.sh",
        bundle.display(),
        size as f64 / (1 << 20) as f64,
        files.len(),
        bundle.display()
    );
    if size > LIMIT {
        return Err(fail(format!(
            "the bundle is {size} bytes, over the 60 MiB limit"
        )));
    }
    Ok(())
}
