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
//!
//! `"op": "pooled-read"` (with `"capacity"`) is [`Pooled`]'s round trip
//! instead: a prefix of `size` bytes READ from one registered buffer of
//! `capacity` bytes into another, no registration per round trip.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use descriptor_core::RegisteredMemory;
use serde_json::{Value, json};

use crate::movers::{Api, Mover, Op, Res, blocks, nixl_connector};

/// Serves commands until stdin closes.
pub(crate) fn serve() -> Res<()> {
    let mut api = Api::nixl()?;
    let mut pooled: Option<Pooled> = None;
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
        if field("op")?.as_str() == Some("pooled-read") {
            let number = |name: &str| {
                field(name)?
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| format!("command {line:?}: {name} is a number"))
            };
            let (size, capacity) = (number("size")?, number("capacity")?);
            if pooled.as_ref().map(|p| p.capacity) != Some(capacity) {
                // The old pool's registrations end before new ones are made.
                drop(pooled.take());
                pooled = Some(Pooled::new(capacity)?);
            }
            let Some(pool) = pooled.as_mut() else {
                return Err("no pool".into());
            };
            pool.awaiting = command.get("wait").and_then(Value::as_str) == Some("async");
            let samples = match field("kind")?.as_str() {
                Some("check") => {
                    pool.clear()?;
                    vec![pool.run(size)?.as_secs_f64()]
                }
                Some("run") => (0..number("count")?)
                    .map(|_| pool.run(size).map(|d| d.as_secs_f64()))
                    .collect::<Res<Vec<f64>>>()?,
                _ => return Err(format!("command {line:?}: kind is check or run")),
            };
            let reply = json!({ "samples": samples, "digest": pool.digest(size)? });
            writeln!(out, "BENCH {reply}")
                .and_then(|()| out.flush())
                .map_err(|e| format!("stdout: {e}"))?;
            continue;
        }
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

/// Dynamo 1.6's multimodal transfer in the Rust API: the sender's payload
/// sits in a buffer of `capacity` bytes registered once, the receiver reads
/// it into another registered once. One round trip: the sender exposes a
/// view of its buffer set to the payload's size (untimed), then, timed,
/// [`begin_read_fit`](descriptor_core::Connector::begin_read_fit) into a
/// view of the receiver's buffer until the receiver learns the end and has
/// the view back (the Python workers time dropping their operation too).
struct Pooled {
    passive: descriptor_core::Connector,
    active: descriptor_core::Connector,
    source: RegisteredMemory,
    target: RegisteredMemory,
    capacity: usize,
    awaiting: bool,
}

impl Pooled {
    fn new(capacity: usize) -> Res<Pooled> {
        let e = |e: descriptor_core::Error| e.to_string();
        let passive = nixl_connector("nixl-pooled-passive", true)?;
        let active = nixl_connector("nixl-pooled-active", true)?;
        let payload = blocks(Some(37), capacity, 1).pop().ok_or("no payload")?;
        let source = RegisteredMemory::new(&passive, payload).map_err(e)?;
        let target = RegisteredMemory::new(&active, vec![0u8; capacity]).map_err(e)?;
        Ok(Pooled {
            passive,
            active,
            source,
            target,
            capacity,
            awaiting: false,
        })
    }

    fn run(&mut self, size: usize) -> Res<Duration> {
        let e = |e: descriptor_core::Error| e.to_string();
        let mut sent = self.source.carve(0, self.capacity).map_err(e)?;
        sent.set_size(size).map_err(e)?;
        let readable = self.passive.create_readable(vec![sent]).map_err(e)?;
        let landing = self.target.carve(0, self.capacity).map_err(e)?;
        let started = Instant::now();
        let read = self
            .active
            .begin_read_fit(readable.metadata(), vec![landing])
            .map_err(e)?;
        if self.awaiting {
            futures::executor::block_on(read.completion()).map_err(e)?;
        } else {
            read.wait().map_err(e)?;
        }
        // Back to its buffer, for the next round trip's carve.
        drop(
            read.into_descriptors()
                .map_err(|_| "landing view not returned")?,
        );
        let elapsed = started.elapsed();
        readable.wait().map_err(e)?;
        drop(
            readable
                .into_descriptors()
                .map_err(|_| "sent view not returned")?,
        );
        Ok(elapsed)
    }

    /// Zeroes the receiver's buffer (a check starts from it).
    fn clear(&mut self) -> Res<()> {
        let mut all = self
            .target
            .carve(0, self.capacity)
            .map_err(|e| e.to_string())?;
        all.as_full_mut_slice().ok_or("host memory")?.fill(0);
        Ok(())
    }

    /// CRC-32 of the `size` bytes received, or `MISMATCH` if they are not the
    /// sender's.
    fn digest(&self, size: usize) -> Res<String> {
        let e = |e: descriptor_core::Error| e.to_string();
        let sent = self.source.carve(0, size).map_err(e)?;
        let got = self.target.carve(0, size).map_err(e)?;
        Ok(if sent.as_slice() == got.as_slice() {
            format!(
                "crc32:{:08x}",
                test_support::crc32_of(std::slice::from_ref(&got))
            )
        } else {
            "MISMATCH".to_owned()
        })
    }
}
