//! The other OS process of the NIXL tests.
//!
//! - `readable|writable BLOCKS BLOCK_SIZE [SEED]`: exposes blocks, prints the
//!   RdmaMetadata as one JSON line, waits for the peer's notification, then
//!   prints the CRC-32 of its blocks.
//! - `pool NAME BLOCKS BLOCK_SIZE SEED`: registers one `BlockPool` as agent
//!   NAME (block `i` holding pattern `SEED + i`), then for each line of block
//!   indices on stdin (`3,4,9`) exposes those blocks as a readable, prints
//!   its RdmaMetadata as one JSON line, waits for the peer's notification,
//!   and prints the CRC-32 of the blocks; exits at the end of stdin.
//! - `reader|writer [SEED [DETECT]]`: reads RdmaMetadata from stdin, prints
//!   `{"started":true}` once its READ/WRITE is posted, waits, prints the
//!   CRC-32 of its blocks, and exits at once (without dropping its
//!   connector). DETECT (`true`, the default, or `false`) is UCX's
//!   peer-failure detection.
//! - `offload PATH BLOCKS BLOCK_SIZE`: WRITEs generation 1, 2, ... of every
//!   block (block `i` of generation `g` holds pattern `g * 1_000_003 + i`)
//!   into its slot of the file at PATH through NIXL's POSIX plugin, one
//!   WRITE of all blocks per generation, scattered in the file (slot order
//!   reversed in memory), and prints `done G` once generation G's WRITE
//!   completed; runs until killed.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use std::num::NonZeroUsize;

use backend_nixl::NixlBackend;
use descriptor_core::{BlockPool, Connector, Descriptor};
use test_support::pattern;

fn crc_line(descriptors: &[Descriptor]) -> String {
    let bytes: usize = descriptors.iter().map(Descriptor::size).sum();
    format!(
        "{{\"crc32\":{},\"bytes\":{bytes}}}",
        test_support::crc32_of(descriptors)
    )
}

/// The active side: a READ or WRITE against metadata read from stdin.
fn active(mode: &str, seed: u64, detect: bool) -> Result<(), String> {
    let err = |e: descriptor_core::Error| e.to_string();
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let metadata: descriptor_core::RdmaMetadata = line.trim().parse().map_err(err)?;
    let connector = Connector::new(
        NixlBackend::builder(&format!("peer-{mode}-{}", std::process::id()))
            .peer_failure_detection(detect)
            .build()
            .map_err(err)?,
    );
    let sizes: Vec<usize> = metadata
        .descriptors()
        .iter()
        .map(|d| d.size as usize)
        .collect();
    let wait = Duration::from_secs(120);
    let descriptors = if mode == "reader" {
        let local = sizes
            .iter()
            .map(|&n| Descriptor::new(vec![0u8; n]))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        let op = connector.begin_read(&metadata, local).map_err(err)?;
        println!("{{\"started\":true}}");
        op.wait_timeout(wait).map_err(err)?;
        op.into_descriptors()
            .map_err(|op| format!("not released: {op:?}"))?
    } else {
        let local = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Descriptor::new(pattern(seed + i as u64, n)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        let op = connector.begin_write(local, &metadata).map_err(err)?;
        println!("{{\"started\":true}}");
        op.wait_timeout(wait).map_err(err)?;
        op.into_descriptors()
            .map_err(|op| format!("not released: {op:?}"))?
    };
    println!("{}", crc_line(&descriptors));
    // Gone at once, the connector not even dropped: what the operation's end
    // promised (its notification on its way) must not depend on this
    // process living on.
    if std::io::stdout().flush().is_err() {
        std::process::exit(1);
    }
    std::process::exit(0)
}

/// `pool`: a named agent serving readables over blocks of one pool.
fn pool(name: &str, blocks: usize, size: usize, seed: u64) -> Result<(), String> {
    let err = |e: descriptor_core::Error| e.to_string();
    let connector = Connector::new(NixlBackend::new(name).map_err(err)?);
    let block = NonZeroUsize::new(size).ok_or("BLOCK_SIZE must not be 0")?;
    let arena: Vec<u8> = (0..blocks)
        .flat_map(|i| pattern(seed + i as u64, size))
        .collect();
    let pool = BlockPool::new(&connector, arena, block).map_err(err)?;
    for line in std::io::stdin().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let indices = line
            .split(',')
            .map(|i| i.trim().parse::<usize>().map_err(|e| format!("{i:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let readable = connector
            .create_readable(pool.checkout_blocks(&indices).map_err(err)?)
            .map_err(err)?;
        println!("{}", readable.metadata());
        readable
            .wait_timeout(Duration::from_secs(120))
            .map_err(err)?;
        let views = readable
            .into_descriptors()
            .map_err(|op| format!("completed but not released: {op:?}"))?;
        println!("{}", crc_line(&views));
    }
    if connector.registrations() != 1 {
        return Err(format!(
            "{} registrations, not 1",
            connector.registrations()
        ));
    }
    Ok(())
}

/// The pattern of block `i` of generation `g` (see the module's docs).
fn generation(g: u64, i: usize, size: usize) -> Vec<u8> {
    pattern(g * 1_000_003 + i as u64, size)
}

/// `offload`: generations of blocks WRITten to a file until killed.
fn offload(path: &str, blocks: usize, size: usize) -> Result<(), String> {
    let err = |e: descriptor_core::Error| e.to_string();
    let connector = Connector::new(
        NixlBackend::new(&format!("peer-offload-{}", std::process::id())).map_err(err)?,
    );
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("{path}: {e}"))?;
    let file = descriptor_core::FileSegment::from_file(file, 0, 0).map_err(err)?;
    for g in 1.. {
        // Slot `i` gets block `i`; memory lists them last slot first.
        let mut local = Vec::with_capacity(blocks);
        let mut slots = Vec::with_capacity(blocks);
        for i in (0..blocks).rev() {
            local.push(Descriptor::new(generation(g, i, size)).map_err(err)?);
            slots.push(file.at((i * size) as u64, size).map_err(err)?);
        }
        let write = connector.begin_file_write(local, slots).map_err(err)?;
        write.wait_timeout(Duration::from_secs(120)).map_err(err)?;
        println!("done {g}");
        std::io::stdout().flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn run(args: &[String]) -> Result<(), String> {
    if let [mode, path, blocks, size] = args
        && mode == "offload"
    {
        let number = |s: &String| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
        return offload(path, number(blocks)?, number(size)?);
    }
    if let [mode, name, blocks, size, seed] = args
        && mode == "pool"
    {
        let number = |s: &String| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
        return pool(name, number(blocks)?, number(size)?, number(seed)? as u64);
    }
    if let [mode, rest @ ..] = args
        && (mode == "reader" || mode == "writer")
    {
        let seed = rest
            .first()
            .map(|s| s.parse::<u64>().map_err(|e| e.to_string()))
            .transpose()?;
        let detect = rest
            .get(1)
            .map(|s| s.parse::<bool>().map_err(|e| format!("{s:?}: {e}")))
            .transpose()?;
        return active(mode, seed.unwrap_or(1), detect.unwrap_or(true));
    }
    let [mode, blocks, size, rest @ ..] = args else {
        return Err("usage: nixl-test-peer readable|writable BLOCKS BLOCK_SIZE [SEED]".into());
    };
    let number = |s: &String| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}"));
    let (blocks, size) = (number(blocks)?, number(size)?);
    let seed = rest.first().map(number).transpose()?.unwrap_or(1) as u64;
    let err = |e: descriptor_core::Error| e.to_string();
    let connector = Connector::new(
        NixlBackend::new(&format!("peer-{mode}-{}", std::process::id())).map_err(err)?,
    );
    let descriptors = (0..blocks)
        .map(|i| match mode.as_str() {
            "readable" => Descriptor::new(pattern(seed + i as u64, size)),
            _ => Descriptor::new(vec![0u8; size]),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    // Publish, wait for the peer's notification, take the blocks back.
    macro_rules! serve {
        ($op:expr) => {{
            let op = $op.map_err(err)?;
            println!("{}", op.metadata());
            op.wait_timeout(Duration::from_secs(120)).map_err(err)?;
            op.into_descriptors()
                .map_err(|op| format!("completed but not released: {op:?}"))?
        }};
    }
    let descriptors = match mode.as_str() {
        "readable" => serve!(connector.create_readable(descriptors)),
        "writable" => serve!(connector.create_writable(descriptors)),
        other => return Err(format!("unknown mode {other:?}")),
    };
    println!("{}", crc_line(&descriptors));
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nixl-test-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
