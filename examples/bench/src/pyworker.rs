//! `--python-worker`: the Rust API as a worker of `cargo xtask bench --python`.
//!
//! The Python bench compares `nixl_connect` with Dynamo's module, and its
//! target "within 1.5x of the Rust API" needs the Rust API measured in the
//! same run and the same layout: one process holding two connectors (NIXL
//! backend, defaults), driven by the same rounds as the Python workers,
//! interleaved with them. So this speaks their line protocol: a JSON command
//! on stdin (`{"kind": "check" | "run", "op", "size", "count", "wait"}`),
//! one reply line `BENCH {"samples": [seconds...], "digest": ...}` on stdout.
//!
//! One sample is [`Api`]'s round trip, as in the main bench's `nixl` row: the
//! passive side's operation made untimed, then `begin_*` until the active
//! side learns the end: `"wait": "blocking"` calls `wait()` (the main
//! bench's way), `"wait": "async"` awaits the operation's completion future
//! on a thread-parking executor, as `await op.wait_for_completion()` waits
//! in Python. A `check` runs one round trip into freshly zeroed buffers; the
//! digest is the CRC-32 of the destination, or `MISMATCH` when it differs
//! from the source.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

use crate::movers::{Api, Mover, Op, Res};

/// Serves commands until stdin closes.
pub(crate) fn serve() -> Res<()> {
    let mut api = Api::nixl()?;
    let mut prepared = None;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let command: Value =
            serde_json::from_str(&line).map_err(|e| format!("command {line:?}: {e}"))?;
        let field = |name: &str| {
            command
                .get(name)
                .ok_or_else(|| format!("command {line:?} has no {name:?}"))
        };
        let op = match field("op")?.as_str() {
            Some("read") => Op::Read,
            Some("write") => Op::Write,
            _ => return Err(format!("command {line:?}: op is read or write")),
        };
        let size = field("size")?
            .as_u64()
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| format!("command {line:?}: size is a byte count"))?;
        let kind = field("kind")?.as_str();
        api.awaiting = match command.get("wait").and_then(Value::as_str) {
            None | Some("blocking") => false,
            Some("async") => true,
            Some(other) => return Err(format!("command {line:?}: wait {other:?}")),
        };
        // A check starts from fresh buffers: the destination holds zeros.
        if kind == Some("check") || prepared != Some((op, size)) {
            api.prepare(op, size, 1)?;
            prepared = Some((op, size));
        }
        let samples = match kind {
            Some("check") => vec![api.run(op)?.as_secs_f64()],
            Some("run") => {
                let count = field("count")?
                    .as_u64()
                    .ok_or_else(|| format!("command {line:?}: count is a number"))?;
                (0..count)
                    .map(|_| api.run(op).map(|d| d.as_secs_f64()))
                    .collect::<Res<Vec<f64>>>()?
            }
            _ => return Err(format!("command {line:?}: kind is check or run")),
        };
        let digest = if api.verify(op) {
            format!("crc32:{:08x}", api.destination_crc(op))
        } else {
            "MISMATCH".to_owned()
        };
        let reply = json!({ "samples": samples, "digest": digest });
        writeln!(out, "BENCH {reply}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("stdout: {e}"))?;
    }
    Ok(())
}
