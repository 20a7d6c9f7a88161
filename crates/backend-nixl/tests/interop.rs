//! Interop with Dynamo's Python `nixl_connect` protocol, both directions, with a
//! peer written against the official NIXL Python API (tests/interop/dynamo_peer.py).
#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use descriptor_core::conformance::pattern;
use descriptor_core::{Connector, Descriptor, RdmaMetadata};
use rstest::rstest;
use test_support::{Peer, crc32_of, nixl_connector, runtime_available};

const WAIT: Duration = Duration::from_secs(60);

/// Dynamo's module in a `python3` that imports `nixl_cu12` and numpy: with
/// `$NIXL_PYTHONPATH`, else the runtime folder `$NIXL_RUNTIME_DIR` (as
/// `cargo xtask test` sets), else the environment's own (an activated venv).
fn python_peer(args: &[&str]) -> Peer {
    let pythonpath = std::env::var("NIXL_PYTHONPATH").ok().or_else(|| {
        let root = PathBuf::from(std::env::var_os("NIXL_RUNTIME_DIR")?);
        Some(format!(
            "{}:{}",
            root.display(),
            root.join("site").display()
        ))
    });
    let mut command = Command::new("python3");
    command.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/dynamo_peer.py"));
    command.args(args);
    if let Some(pythonpath) = pythonpath {
        command.env("PYTHONPATH", pythonpath);
    }
    Peer::spawn(command)
}

fn blocks(seed: u64, sizes: &[usize]) -> Vec<Descriptor> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| Descriptor::new(pattern(seed + i as u64, n)).unwrap())
        .collect()
}

/// A Rust agent; `detect` is its peer-failure detection (UCX's error handling
/// mode): the Python peer keeps NIXL's default (detection on) either way.
fn connector(role: &str, detect: bool) -> Connector {
    nixl_connector(&format!("rust-{role}"), detect)
}

#[rstest]
fn python_dynamo_peer_reads_a_rust_readable(#[values(true, false)] detect: bool) {
    if !runtime_available() {
        return;
    }
    let rust = connector("readable", detect);
    let source = blocks(1, &[1 << 20, 1 << 20, 4097, 3]);
    let expected = crc32_of(&source);
    let readable = rust.create_readable(source).unwrap();

    let mut python = python_peer(&["read"]);
    python.send(&readable.metadata().to_json());
    let report: serde_json::Value = serde_json::from_str(&python.line(WAIT)).unwrap();

    readable.wait_timeout(WAIT).unwrap();
    assert_eq!(report["bytes"], (2 << 20) + 4097 + 3);
    assert_eq!(
        report["crc32"], expected,
        "Python read other bytes than the readable exposed"
    );
    python.finish();
}

#[rstest]
fn rust_writes_a_python_dynamo_writable(
    #[values(false, true)] legacy_hex: bool,
    #[values(true, false)] detect: bool,
) {
    if !runtime_available() {
        return;
    }
    let sizes = [1 << 20, 4096, 3];
    let mut args = vec!["writable", "[1048576,4096,3]"];
    if legacy_hex {
        args.push("--hex");
    }
    let python = python_peer(&args);
    let published = python.line(WAIT);
    let metadata: RdmaMetadata = published.parse().unwrap();
    if !legacy_hex {
        // Same JSON byte for byte, except the compressed blob: Python's zlib and
        // Rust's deflate may pick different (equally valid) encodings.
        let ours = metadata.to_json();
        let without_blob = |json: &str| {
            let start = json.find("\"nixl_metadata\":\"").unwrap();
            let end = start + json[start..].find("\",\"notification_key\"").unwrap();
            format!("{}{}", &json[..start], &json[end..])
        };
        assert_eq!(without_blob(&ours), without_blob(&published));
        assert_eq!(ours.parse::<RdmaMetadata>().unwrap(), metadata);
    }
    assert_eq!(
        metadata
            .descriptors()
            .iter()
            .map(|d| d.size as usize)
            .collect::<Vec<_>>(),
        sizes
    );

    let rust = connector(if legacy_hex { "writer-hex" } else { "writer" }, detect);
    let source = blocks(2, &sizes);
    let expected = crc32_of(&source);
    let write = rust.begin_write(source, &metadata).unwrap();
    write.wait_timeout(WAIT).unwrap();

    let report: serde_json::Value = serde_json::from_str(&python.line(WAIT)).unwrap();
    assert_eq!(
        report["crc32"], expected,
        "Python received other bytes than were written"
    );
    // The writer's transfers go out through its initiating agent (NIXL's
    // progress thread on, as Dynamo runs it), their notifications through
    // the agent called by the connector's name.
    assert_eq!(
        report["from"],
        rust.name(),
        "the notification names the writer's connector"
    );
    python.finish();
}
