//! `--offload`: a decode worker's storage tier. Its arena (a [`BlockPool`],
//! registered once) holds fewer blocks than the sequences it serves use, so
//! under memory pressure it evicts the least recently used blocks to a file
//! (one [`Connector::begin_file_write`] per batch of evictions) and brings
//! them back on the next hit (one [`Connector::begin_file_read`] per
//! request's misses). Each logical block has a fixed slot in the file; a
//! block's bytes follow from its id and version, so every block brought back
//! is checked against the CRC-32 it was evicted with.

use std::fs::OpenOptions;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use descriptor_core::{BlockPool, Connector, Descriptor, FileSegment};

use crate::{Args, Rng, err, ms, percentile};

/// One logical KV block: where its bytes are now.
struct Block {
    /// Bumped when a request updates the block (it becomes dirty).
    version: u64,
    /// Its view in the arena, if resident.
    resident: Option<Descriptor>,
    /// The version the file's slot holds, if any, and its CRC.
    on_disk: Option<(u64, u32)>,
    /// When a request last touched it, for LRU.
    used: u64,
}

/// One batch moved in one direction.
struct Batch {
    blocks: usize,
    time: Duration,
}

#[derive(Default)]
struct Tally {
    hits: usize,
    misses: usize,
    evictions: usize,
    clean_evictions: usize,
    written: Vec<Batch>,
    read: Vec<Batch>,
    checked: usize,
}

/// The bytes of block `id` at `version`.
fn fill(view: &mut Descriptor, id: usize, version: u64) -> Result<(), String> {
    let bytes = view
        .as_mut_slice()
        .ok_or("a block that is not host memory")?;
    let mut rng = Rng::new((id as u64) << 20 ^ version);
    for chunk in bytes.chunks_mut(8) {
        let word = rng.next().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    Ok(())
}

fn crc(view: &Descriptor) -> u32 {
    crc32fast::hash(view.as_slice().unwrap_or_default())
}

/// Runs the offload workload on `connector` and prints its table.
pub(crate) fn run(args: &Args, connector: &Connector) -> Result<(), String> {
    let size = args.block_size;
    let resident = args.blocks;
    let logical = resident * 4;
    let block = NonZeroUsize::new(size).ok_or("a block size of 0")?;
    let pool =
        BlockPool::new(connector, vec![0u8; resident * size], block).map_err(err("the arena"))?;
    let dir = std::env::var_os("KV_OFFLOAD_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("kv-offload-{}.bin", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    // Unlinked at once, as Dynamo's disk tier does: the space goes with the process.
    let _ = std::fs::remove_file(&path);
    let file = FileSegment::from_file(file, 0, 0).map_err(err("the offload file"))?;
    let slot = |id: usize| {
        file.at((id * size) as u64, size)
            .map_err(err("a file slot"))
    };

    let mut blocks: Vec<Block> = (0..logical)
        .map(|_| Block {
            version: 0,
            resident: None,
            on_disk: None,
            used: 0,
        })
        .collect();
    let mut rng = Rng::new(args.seed);
    let mut tally = Tally::default();
    let registrations = connector.registrations();
    let started = Instant::now();
    for clock in 1..=args.requests as u64 {
        // A request touches a few blocks, mostly of a hot set of half the
        // arena (the sequences being decoded), sometimes of the rest.
        let n = rng.between(1, args.request_blocks);
        let mut wanted: Vec<usize> = Vec::with_capacity(n);
        while wanted.len() < n {
            let id = if rng.below(10) < 8 {
                rng.below(resident / 2)
            } else {
                rng.below(logical)
            };
            if !wanted.contains(&id) {
                wanted.push(id);
            }
        }
        let misses: Vec<usize> = wanted
            .iter()
            .copied()
            .filter(|&id| blocks[id].resident.is_none())
            .collect();
        tally.hits += n - misses.len();
        tally.misses += misses.len();
        // Room first: the least recently used resident blocks that this
        // request does not touch go, dirty ones through one WRITE.
        let free = (0..pool.blocks()).filter(|&i| pool.is_free(i)).count();
        if misses.len() > free {
            let mut lru: Vec<usize> = (0..logical)
                .filter(|&id| blocks[id].resident.is_some() && !wanted.contains(&id))
                .collect();
            lru.sort_unstable_by_key(|&id| blocks[id].used);
            lru.truncate(misses.len() - free);
            evict(connector, &mut blocks, &lru, &slot, &mut tally)?;
        }
        // Misses come back in one READ (those on disk), or are new.
        let views = pool
            .checkout(misses.len())
            .ok_or("no free blocks after eviction")?;
        let mut from_disk = (Vec::new(), Vec::new(), Vec::new());
        for (id, mut view) in misses.iter().copied().zip(views) {
            match blocks[id].on_disk {
                Some(_) => {
                    from_disk.0.push(slot(id)?);
                    from_disk.1.push(view);
                    from_disk.2.push(id);
                }
                None => {
                    fill(&mut view, id, blocks[id].version)?;
                    blocks[id].resident = Some(view);
                }
            }
        }
        if !from_disk.0.is_empty() {
            let t = Instant::now();
            let read = connector
                .begin_file_read(from_disk.0, from_disk.1)
                .map_err(err("READ of evicted blocks"))?;
            read.wait().map_err(err("READ of evicted blocks"))?;
            tally.read.push(Batch {
                blocks: from_disk.2.len(),
                time: t.elapsed(),
            });
            let views = read
                .into_descriptors()
                .map_err(|_| "a completed READ kept its blocks")?;
            for (id, view) in from_disk.2.into_iter().zip(views) {
                let expected = blocks[id].on_disk.map(|(_, crc)| crc);
                if Some(crc(&view)) != expected {
                    return Err(format!("block {id} came back from the file changed"));
                }
                tally.checked += 1;
                blocks[id].resident = Some(view);
            }
        }
        // Decoding updates some of the blocks it touched.
        for &id in &wanted {
            let b = &mut blocks[id];
            b.used = clock;
            if rng.below(4) == 0
                && let Some(view) = b.resident.as_mut()
            {
                b.version += 1;
                fill(view, id, b.version)?;
            }
        }
    }
    let wall = started.elapsed();
    let per_op = connector.registrations() - registrations;
    report(args, logical, &tally, wall, per_op);
    // One registration for the arena, one for the file; none per operation.
    if per_op > 1 {
        return Err(format!(
            "{per_op} registrations during the run (expected the file's one)"
        ));
    }
    Ok(())
}

/// Evicts `ids`: dirty blocks (resident version not on disk) are written
/// to their slots in one WRITE, then every view goes back to the arena.
fn evict(
    connector: &Connector,
    blocks: &mut [Block],
    ids: &[usize],
    slot: &impl Fn(usize) -> Result<FileSegment, String>,
    tally: &mut Tally,
) -> Result<(), String> {
    let mut dirty = (Vec::new(), Vec::new(), Vec::new());
    for &id in ids {
        let b = &mut blocks[id];
        let view = b
            .resident
            .take()
            .ok_or("evicting a block that is not resident")?;
        tally.evictions += 1;
        if b.on_disk.is_some_and(|(v, _)| v == b.version) {
            tally.clean_evictions += 1;
            continue; // the file holds it already; the view goes back to the pool
        }
        dirty.0.push(view);
        dirty.1.push(slot(id)?);
        dirty.2.push(id);
    }
    if dirty.2.is_empty() {
        return Ok(());
    }
    let crcs: Vec<u32> = dirty.0.iter().map(crc).collect();
    let t = Instant::now();
    let write = connector
        .begin_file_write(dirty.0, dirty.1)
        .map_err(err("WRITE of evicted blocks"))?;
    write.wait().map_err(err("WRITE of evicted blocks"))?;
    tally.written.push(Batch {
        blocks: dirty.2.len(),
        time: t.elapsed(),
    });
    // Recorded as stored only now that the WRITE completed.
    for (id, crc) in dirty.2.into_iter().zip(crcs) {
        blocks[id].on_disk = Some((blocks[id].version, crc));
    }
    drop(write.into_descriptors());
    Ok(())
}

fn report(args: &Args, logical: usize, tally: &Tally, wall: Duration, registrations: u64) {
    println!(
        "  {} logical blocks over an arena of {} (x {} KiB): {} hits, {} misses, {} evictions ({} clean, no WRITE)",
        logical,
        args.blocks,
        args.block_size / 1024,
        tally.hits,
        tally.misses,
        tally.evictions,
        tally.clean_evictions
    );
    println!(
        "  {:<6} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "", "batches", "blocks", "GB/s", "p50 ms", "p99 ms"
    );
    for (label, batches) in [("WRITE", &tally.written), ("READ", &tally.read)] {
        if batches.is_empty() {
            println!("  {label:<6} {:>8}", 0);
            continue;
        }
        let blocks: usize = batches.iter().map(|b| b.blocks).sum();
        let total: Duration = batches.iter().map(|b| b.time).sum();
        let mut times: Vec<Duration> = batches.iter().map(|b| b.time).collect();
        times.sort_unstable();
        println!(
            "  {label:<6} {:>8} {:>8} {:>8.2} {:>9.3} {:>9.3}",
            batches.len(),
            blocks,
            (blocks * args.block_size) as f64 / total.as_secs_f64().max(1e-9) / 1e9,
            ms(percentile(&times, 50.0)),
            ms(percentile(&times, 99.0)),
        );
    }
    println!(
        "  {} blocks read back, CRC-32 equal to the evicted bytes; {registrations} registration(s) during the run; {:.3} s",
        tally.checked,
        wall.as_secs_f64()
    );
}
