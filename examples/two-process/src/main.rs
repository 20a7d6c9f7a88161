//! Two OS processes move KV-cache blocks over NIXL; the metadata goes
//! through files in a folder both can see.
//!
//! ```text
//! two-process prefill DIR   # exposes blocks, writes DIR/readable.json, waits
//! two-process decode DIR    # reads DIR/readable.json, READs the blocks and
//!                           # checks them, then WRITEs blocks back into
//!                           # prefill's memory (DIR/writable.json)
//! ```
//!
//! Start `prefill` first. Both sides compute the blocks' bytes from the same
//! pattern, so each checks what it received by checksum.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use backend_nixl::NixlBackend;
use descriptor_core::{Connector, Descriptor, RdmaMetadata};

mod flags {
    use std::path::PathBuf;

    xflags::xflags! {
        /// Two OS processes moving KV-cache blocks over NIXL.
        cmd two-process {
            /// Expose blocks for decode to READ, then for it to WRITE into.
            cmd prefill {
                /// Where the metadata files go.
                required dir: PathBuf
            }
            /// READ prefill's blocks and check them, then WRITE blocks back.
            cmd decode {
                /// Where prefill writes its metadata files.
                required dir: PathBuf
            }
        }
    }
}

const BLOCKS: usize = 8;
const BLOCK_SIZE: usize = 64 << 10;
/// How long a side waits for the other: for a file, for a transfer.
const PATIENCE: Duration = Duration::from_secs(60);
/// prefill's blocks (round 1) and the blocks decode writes back (round 2).
const READ_ROUND: usize = 1;
const WRITE_ROUND: usize = 2;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The bytes of block `block` in round `round`, which both sides can compute.
fn pattern(round: usize, block: usize) -> Vec<u8> {
    (0..BLOCK_SIZE)
        .map(|j| ((j * 31 + block * 7 + round) % 251) as u8)
        .collect()
}

/// FNV-1a, 64 bits.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Checks every block against its pattern in `round`, by checksum.
fn check(blocks: &[Descriptor], round: usize) -> Result<()> {
    for (i, block) in blocks.iter().enumerate() {
        let got = checksum(block.as_slice().unwrap_or_default());
        let want = checksum(&pattern(round, i));
        if got != want {
            return Err(format!("block {i}: checksum {got:#018x}, expected {want:#018x}").into());
        }
    }
    Ok(())
}

/// A connector over a NIXL agent; agent names must differ between the peers.
fn connector(role: &str) -> Result<Connector> {
    let name = format!("two-process-{role}-{}", std::process::id());
    Ok(Connector::new(NixlBackend::new(&name)?))
}

/// Publishes `metadata` as `dir/name`: written beside it, then renamed, so
/// the peer never reads half a file.
fn publish(dir: &Path, name: &str, metadata: &RdmaMetadata) -> Result<PathBuf> {
    let path = dir.join(name);
    let partial = dir.join(format!("{name}.partial"));
    std::fs::write(&partial, metadata.to_json())?;
    std::fs::rename(&partial, &path)?;
    Ok(path)
}

/// Waits for `dir/name` to appear, then parses it.
fn receive(dir: &Path, name: &str) -> Result<RdmaMetadata> {
    let path = dir.join(name);
    let deadline = Instant::now() + PATIENCE;
    loop {
        match std::fs::read_to_string(&path) {
            Ok(json) => return Ok(json.parse()?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("{}: {e}", path.display()).into()),
        }
    }
}

fn prefill(dir: &Path) -> Result<()> {
    let connector = connector("prefill")?;
    for stale in ["readable.json", "writable.json"] {
        let _ = std::fs::remove_file(dir.join(stale));
    }

    // 1. Expose blocks for decode to READ. The operation completes when
    //    decode's notification arrives.
    let blocks = (0..BLOCKS)
        .map(|i| Descriptor::new(pattern(READ_ROUND, i)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let readable = connector.create_readable(blocks)?;
    let path = publish(dir, "readable.json", readable.metadata())?;
    println!(
        "prefill: {BLOCKS} blocks of {} KiB readable; metadata in {}",
        BLOCK_SIZE >> 10,
        path.display()
    );
    readable.wait_timeout(PATIENCE)?;
    let mut blocks = readable
        .into_descriptors()
        .map_err(|_| "the readable kept its blocks")?;
    println!("prefill: decode has read them");

    // 2. The same memory, zeroed, exposed for decode to WRITE into.
    for block in &mut blocks {
        block.as_mut_slice().unwrap_or_default().fill(0);
    }
    let writable = connector.create_writable(blocks)?;
    publish(dir, "writable.json", writable.metadata())?;
    writable.wait_timeout(PATIENCE)?;
    let blocks = writable
        .into_descriptors()
        .map_err(|_| "the writable kept its blocks")?;
    check(&blocks, WRITE_ROUND)?;
    println!("prefill: decode wrote {BLOCKS} blocks back; checksums match");
    Ok(())
}

fn decode(dir: &Path) -> Result<()> {
    let connector = connector("decode")?;

    // 1. READ prefill's blocks into as many local blocks of the same sizes.
    let remote = receive(dir, "readable.json")?;
    let local = remote
        .descriptors()
        .iter()
        .map(|d| Descriptor::new(vec![0u8; d.size as usize]))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let read = connector.begin_read(&remote, local)?;
    read.wait_timeout(PATIENCE)?;
    let took = started.elapsed();
    let mut blocks = read
        .into_descriptors()
        .map_err(|_| "the read kept its blocks")?;
    check(&blocks, READ_ROUND)?;
    // The first transfer between two processes also sets up their connection.
    println!(
        "decode: read {} blocks in {:.1} ms (connection setup included); checksums match",
        blocks.len(),
        took.as_secs_f64() * 1e3
    );

    // 2. WRITE blocks of the next round back into prefill's memory.
    for (i, block) in blocks.iter_mut().enumerate() {
        if let Some(bytes) = block.as_mut_slice() {
            bytes.copy_from_slice(&pattern(WRITE_ROUND, i));
        }
    }
    let remote = receive(dir, "writable.json")?;
    let write = connector.begin_write(blocks, &remote)?;
    write.wait_timeout(PATIENCE)?;
    println!("decode: wrote {BLOCKS} blocks back");
    Ok(())
}

fn main() -> ExitCode {
    let command = match flags::TwoProcess::from_env() {
        Ok(flags) => flags.subcommand,
        Err(e) if e.is_help() => {
            println!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("two-process: {e} (--help lists the commands)");
            return ExitCode::from(2);
        }
    };
    // Without the NIXL runtime there is nothing to show: say so and stop,
    // unless the caller requires it (as `cargo xtask test` does).
    if let Err(e) = backend_nixl::runtime::load() {
        if std::env::var_os("NIXL_TESTS_REQUIRED").is_some() {
            eprintln!("two-process: the NIXL runtime is required but unavailable: {e}");
            return ExitCode::FAILURE;
        }
        println!("two-process: skipped: the NIXL runtime is unavailable: {e}");
        return ExitCode::SUCCESS;
    }
    let result = match command {
        flags::TwoProcessCmd::Prefill(args) => prefill(&args.dir),
        flags::TwoProcessCmd::Decode(args) => decode(&args.dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("two-process: {e}");
            ExitCode::FAILURE
        }
    }
}
