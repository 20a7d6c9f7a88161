//! GPU checks for a machine with an NVIDIA GPU (shipped by `cargo xtask
//! gpu-bundle`): the CUDA probe against the real device, VRAM descriptors, NIXL
//! registration of VRAM, and VRAM->DRAM, DRAM->VRAM and VRAM->VRAM transfers with
//! checksums and GB/s. Without a GPU it says so and exits 0, unless
//! `--require-gpu` is given.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::time::Instant;

use backend_loopback::{Fabric, LoopbackBackend};
use backend_nixl::NixlBackend;
use descriptor_core::{Connector, Descriptor, Device, DeviceProbe, Error};
use device_cuda::{CudaBuffer, CudaProbe};
use test_support::pattern;

type Res<T> = Result<T, String>;

const SIZE: usize = 64 << 20;
const ITERATIONS: usize = 5;

fn crc(bytes: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(bytes);
    c.sum()
}

fn e(e: Error) -> String {
    e.to_string()
}

/// Bytes of a descriptor, wherever it lives.
fn contents(d: Descriptor) -> Res<Vec<u8>> {
    match d.into_buffer::<CudaBuffer>() {
        Ok(vram) => vram.to_host().map_err(e),
        Err(d) => d
            .into_vec::<u8>()
            .map_err(|_| "unexpected buffer type".to_string()),
    }
}

fn vram(seed: Option<u64>) -> Res<Descriptor> {
    let mut b = CudaBuffer::alloc(0, SIZE).map_err(e)?;
    if let Some(seed) = seed {
        b.copy_from_host(&pattern(seed, SIZE)).map_err(e)?;
    }
    Descriptor::new(b).map_err(e)
}

fn dram(seed: Option<u64>) -> Res<Descriptor> {
    Descriptor::new(seed.map_or_else(|| vec![0u8; SIZE], |s| pattern(s, SIZE))).map_err(e)
}

/// READs `source` (exposed by `server`) into `target` (`client`), `ITERATIONS`
/// times; checks the CRC each time and prints GB/s of the median.
fn transfer(
    name: &str,
    server: &Connector,
    client: &Connector,
    mut source: Descriptor,
    mut target: Descriptor,
    expected: u32,
) -> Res<()> {
    let mut times = Vec::new();
    for _ in 0..ITERATIONS {
        let readable = server.create_readable(vec![source]).map_err(e)?;
        let started = Instant::now();
        let read = client
            .begin_read(readable.metadata(), vec![target])
            .map_err(e)?;
        read.wait().map_err(e)?;
        times.push(started.elapsed());
        readable.wait().map_err(e)?;
        source = readable
            .into_descriptors()
            .map_err(|_| "source not returned")?
            .remove(0);
        target = read
            .into_descriptors()
            .map_err(|_| "target not returned")?
            .remove(0);
    }
    times.sort();
    let median = times[times.len() / 2];
    let got = crc(&contents(target)?);
    let ok = got == expected;
    println!(
        "  {name:<14} {} MiB: median {:>8.3} ms = {:>6.2} GB/s, crc32 {got:08x} {}",
        SIZE >> 20,
        median.as_secs_f64() * 1e3,
        SIZE as f64 / median.as_secs_f64() / 1e9,
        if ok { "OK" } else { "MISMATCH" }
    );
    if ok {
        Ok(())
    } else {
        Err(format!("{name}: checksum mismatch"))
    }
}

fn run(require_gpu: bool) -> Res<()> {
    let probe = CudaProbe;
    let devices = probe.devices().map_err(e)?;
    println!("CUDA driver available: {}", probe.available());
    for d in &devices {
        println!(
            "  {} {} {:.1} GiB pci {} cc {:?} gpudirect_rdma {:?}",
            d.device,
            d.name,
            d.total_memory as f64 / (1u64 << 30) as f64,
            d.pci_bus_id,
            d.compute_capability,
            d.gpudirect_rdma
        );
    }
    if devices.is_empty() {
        println!("no CUDA device: GPU checks skipped");
        return if require_gpu {
            Err("--require-gpu: no CUDA device".into())
        } else {
            Ok(())
        };
    }

    // VRAM descriptors and pointer location.
    let seeded = vram(Some(1))?;
    let located = probe.locate(seeded.ptr()).map_err(e)?;
    println!(
        "VRAM descriptor: device {}, locate() says {located:?}",
        seeded.device()
    );
    if seeded.device() != Device::cuda(0) || located != Some(Device::cuda(0)) {
        return Err("VRAM descriptor or pointer location is wrong".into());
    }
    let host = vec![0u8; 4096];
    if probe.locate(host.as_ptr() as usize).map_err(e)?.is_some() {
        return Err("host memory located on a GPU".into());
    }
    let expected = crc(&pattern(1, SIZE));
    let fabric = Fabric::new();
    let refused = Connector::new(LoopbackBackend::new(&fabric, "loopback").map_err(e)?)
        .create_readable(vec![seeded]);
    match refused {
        Err(Error::Unsupported { what, .. }) => println!("loopback refuses VRAM: {what}"),
        other => return Err(format!("loopback accepted VRAM: {other:?}")),
    }

    // NIXL: VRAM registration and the three directions.
    let server = Connector::new(NixlBackend::new("gpu-server").map_err(e)?);
    let client = Connector::new(NixlBackend::new("gpu-client").map_err(e)?);
    println!("NIXL transfers ({ITERATIONS} each, checksums checked):");
    transfer(
        "VRAM -> DRAM",
        &server,
        &client,
        vram(Some(1))?,
        dram(None)?,
        expected,
    )?;
    let dram_expected = crc(&pattern(2, SIZE));
    transfer(
        "DRAM -> VRAM",
        &server,
        &client,
        dram(Some(2))?,
        vram(None)?,
        dram_expected,
    )?;
    transfer(
        "VRAM -> VRAM",
        &server,
        &client,
        vram(Some(1))?,
        vram(None)?,
        expected,
    )?;
    println!("all GPU checks passed");
    Ok(())
}

fn main() -> ExitCode {
    let require_gpu = std::env::args().any(|a| a == "--require-gpu");
    match run(require_gpu) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("gpu-check: {msg}");
            ExitCode::FAILURE
        }
    }
}
