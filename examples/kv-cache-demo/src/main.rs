//! The main job, end to end: a "prefill" worker and a "decode" worker move
//! KV-cache-like blocks both ways (readable → read, writable → write) through the
//! public API, verify checksums, and report bytes, time, bandwidth and metadata size.
//!
//! `cargo xtask demo [--backend NAME] [--blocks N] [--block-size BYTES] [--iterations N]`
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use descriptor_core::{Connector, Descriptor, RdmaMetadata};

mod flags {
    use crate::Positive;

    xflags::xflags! {
        /// Moves KV-cache-like blocks both ways between two connectors.
        cmd kv-cache-demo {
            /// The backend (default: the first built, loopback before nixl).
            optional --backend name: String
            /// Blocks per transfer (default 64).
            optional --blocks n: Positive
            /// Bytes per block (default 262144).
            optional --block-size bytes: Positive
            /// Transfers each way (default 5).
            optional --iterations n: Positive
        }
    }
}

/// A count or size on the command line: an integer above zero.
#[derive(Debug)]
struct Positive(usize);

impl std::str::FromStr for Positive {
    type Err = String;

    fn from_str(s: &str) -> Result<Positive, String> {
        match s.parse() {
            Ok(n) if n > 0 => Ok(Positive(n)),
            _ => Err(format!("takes a positive integer, not {s:?}")),
        }
    }
}

struct Args {
    backend: String,
    blocks: usize,
    block_size: usize,
    iterations: usize,
}

impl From<flags::KvCacheDemo> for Args {
    fn from(flags: flags::KvCacheDemo) -> Args {
        let first = BACKENDS.first().copied().unwrap_or("loopback");
        Args {
            backend: flags.backend.unwrap_or_else(|| first.into()),
            blocks: flags.blocks.map_or(64, |n| n.0),
            block_size: flags.block_size.map_or(256 << 10, |n| n.0),
            iterations: flags.iterations.map_or(5, |n| n.0),
        }
    }
}

/// Backends compiled into this build, by the crate's features.
const BACKENDS: &[&str] = &[
    #[cfg(feature = "loopback")]
    "loopback",
    #[cfg(feature = "nixl")]
    "nixl",
];

/// Device probes compiled into this build, by the crate's features.
fn probes() -> Vec<Box<dyn descriptor_core::DeviceProbe>> {
    vec![
        #[cfg(feature = "cuda")]
        Box::new(device_cuda::CudaProbe),
        #[cfg(feature = "rocm")]
        Box::new(device_rocm::RocmProbe),
    ]
}

fn list_devices() -> Result<(), String> {
    for probe in probes() {
        let devices = probe.devices().map_err(|e| e.to_string())?;
        println!(
            "{} probe: driver {}, {} device(s)",
            probe.platform(),
            if probe.available() {
                "present"
            } else {
                "absent"
            },
            devices.len()
        );
        for d in devices {
            println!(
                "  {} {} ({} MiB, pci {})",
                d.device,
                d.name,
                d.total_memory >> 20,
                d.pci_bus_id
            );
        }
    }
    Ok(())
}

fn connectors(backend: &str) -> Result<(Connector, Connector), String> {
    match backend {
        #[cfg(feature = "loopback")]
        "loopback" => {
            use backend_loopback::{Fabric, LoopbackBackend};
            let fabric = Fabric::new();
            let make = |name| {
                LoopbackBackend::new(&fabric, name)
                    .map(Connector::new)
                    .map_err(|e| e.to_string())
            };
            Ok((make("prefill-worker")?, make("decode-worker")?))
        }
        #[cfg(feature = "nixl")]
        "nixl" => {
            use backend_nixl::NixlBackend;
            let make = |name| {
                NixlBackend::new(name)
                    .map(Connector::new)
                    .map_err(|e| e.to_string())
            };
            Ok((make("prefill-worker")?, make("decode-worker")?))
        }
        other => Err(format!(
            "unknown backend {other:?}; this build has: {}",
            BACKENDS.join(", ")
        )),
    }
}

/// A fast 64-bit checksum over 8-byte words, then the tail bytes.
fn checksum(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
        h = (h ^ w).wrapping_mul(0x0100_0000_01b3).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn fill(descs: &mut [Descriptor], seed: u64) -> Vec<u64> {
    descs
        .iter_mut()
        .enumerate()
        .map(|(i, d)| {
            let mut x = (seed << 20 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let bytes = d.as_mut_slice().unwrap_or_default();
            for chunk in bytes.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            checksum(bytes)
        })
        .collect()
}

fn checksums(descs: &[Descriptor]) -> Vec<u64> {
    descs
        .iter()
        .map(|d| checksum(d.as_slice().unwrap_or_default()))
        .collect()
}

fn blocks(args: &Args) -> Result<Vec<Descriptor>, String> {
    (0..args.blocks)
        .map(|_| Descriptor::new(vec![0u8; args.block_size]).map_err(|e| e.to_string()))
        .collect()
}

struct Run {
    times: Vec<Duration>,
    json_bytes: usize,
    agent_metadata_bytes: usize,
}

/// One direction, `iterations` times, reusing (registered) buffers as a KV pool would.
fn run(args: &Args, prefill: &Connector, decode: &Connector, write: bool) -> Result<Run, String> {
    let err = |e: descriptor_core::Error| e.to_string();
    let mut source = blocks(args)?;
    let mut target = blocks(args)?;
    let mut run = Run {
        times: Vec::new(),
        json_bytes: 0,
        agent_metadata_bytes: 0,
    };
    for iteration in 0..args.iterations {
        let expected = fill(&mut source, iteration as u64 + if write { 1000 } else { 0 });
        for d in &mut target {
            d.as_mut_slice().unwrap_or_default().fill(0);
        }
        let started;
        let (passive_back, active_back) = if write {
            // decode exposes its pool for writing; prefill pushes blocks into it.
            let writable = decode
                .create_writable(std::mem::take(&mut target))
                .map_err(err)?;
            let json = writable.metadata().to_json();
            started = Instant::now();
            let metadata: RdmaMetadata = json.parse().map_err(err)?;
            let op = prefill
                .begin_write(std::mem::take(&mut source), &metadata)
                .map_err(err)?;
            op.wait().map_err(err)?;
            writable.wait().map_err(err)?;
            run.json_bytes = json.len();
            run.agent_metadata_bytes = metadata.agent_metadata().len();
            (writable.into_descriptors().ok(), op.into_descriptors().ok())
        } else {
            // prefill exposes its blocks for reading; decode pulls them.
            let readable = prefill
                .create_readable(std::mem::take(&mut source))
                .map_err(err)?;
            let json = readable.metadata().to_json();
            started = Instant::now();
            let metadata: RdmaMetadata = json.parse().map_err(err)?;
            let op = decode
                .begin_read(&metadata, std::mem::take(&mut target))
                .map_err(err)?;
            op.wait().map_err(err)?;
            readable.wait().map_err(err)?;
            run.json_bytes = json.len();
            run.agent_metadata_bytes = metadata.agent_metadata().len();
            (readable.into_descriptors().ok(), op.into_descriptors().ok())
        };
        run.times.push(started.elapsed());
        let (Some(passive), Some(active)) = (passive_back, active_back) else {
            return Err("completed operations did not return their buffers".into());
        };
        (source, target) = if write {
            (active, passive)
        } else {
            (passive, active)
        };
        if checksums(&target) != expected {
            return Err(format!(
                "iteration {iteration}: checksums differ after the transfer"
            ));
        }
    }
    Ok(run)
}

fn report(args: &Args, name: &str, run: &Run) {
    let bytes = args.blocks * args.block_size;
    let mut sorted = run.times.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    let gbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    println!(
        "  {name:<17} {:>8.2} MiB  first {:>9.3} ms ({:>6.2} GB/s)  median {:>9.3} ms ({:>6.2} GB/s)  metadata {} B json / {} B agent blob",
        bytes as f64 / (1 << 20) as f64,
        run.times[0].as_secs_f64() * 1e3,
        gbps(run.times[0]),
        median.as_secs_f64() * 1e3,
        gbps(median),
        run.json_bytes,
        run.agent_metadata_bytes,
    );
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = match flags::KvCacheDemo::from_env() {
        Ok(flags) => Args::from(flags),
        Err(e) if e.is_help() => {
            println!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kv-cache-demo: {e} (--help lists the options)");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = list_devices() {
        eprintln!("kv-cache-demo: {e}");
        return ExitCode::FAILURE;
    }
    if BACKENDS.is_empty() {
        println!(
            "kv-cache-demo: built without a backend feature (loopback, nixl): nothing to move"
        );
        return ExitCode::SUCCESS;
    }
    let result = connectors(&args.backend).and_then(|(prefill, decode)| {
        println!(
            "kv-cache-demo: backend {}, {} blocks x {} KiB, {} iterations, checksums verified each time",
            args.backend,
            args.blocks,
            args.block_size / 1024,
            args.iterations
        );
        let read = run(&args, &prefill, &decode, false)?;
        report(&args, "readable -> read", &read);
        let write = run(&args, &prefill, &decode, true)?;
        report(&args, "writable -> write", &write);
        if prefill.remote_agent_count() + decode.remote_agent_count() != 0 {
            return Err("remote agents left loaded after all operations ended".into());
        }
        Ok(())
    });
    match result {
        Ok(()) => {
            println!("  OK: all blocks verified in both directions");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kv-cache-demo: {e}");
            ExitCode::FAILURE
        }
    }
}
