//! Storage WRITEs on NIXL into the page cache, made at post with `pwrite`
//! (`buffered_writes`, on by default, over AIO) or through the POSIX plugin
//! (the switch off, io_uring, `O_DIRECT`): whatever the path, every byte of
//! every block lands where its segment says, and no byte outside them
//! changes. A generator of seeded random batches (block sizes, offsets,
//! order) checks the file byte for byte after each WRITE.
#![allow(clippy::unwrap_used)]

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use backend_nixl::{NixlBackend, Storage};
use descriptor_core::conformance::pattern;
use descriptor_core::{Connector, Descriptor, FileSegment, RegisteredMemory};
use rstest::rstest;
use test_support::runtime_available;

const FILE_LEN: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(20);
const BATCHES: usize = 12;

/// A small xorshift: the batches are the same every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[rstest]
fn every_byte_lands_whatever_the_path(
    #[values(true, false)] fast: bool,
    #[values(Storage::PosixAio, Storage::PosixUring)] storage: Storage,
    #[values(false, true)] direct: bool,
) {
    if !runtime_available() {
        return;
    }
    let name = format!(
        "buffered-{fast}-{storage:?}-{direct}-{}",
        std::process::id()
    );
    let c = Connector::new(
        NixlBackend::builder(&name)
            .storage(storage)
            .buffered_writes(fast)
            .build()
            .unwrap(),
    );
    let path = std::env::temp_dir().join(format!("{name}.bin"));
    let mut expected = pattern(5, FILE_LEN);
    std::fs::write(&path, &expected).unwrap();
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let Ok(file) = options.open(&path) else {
        // A file system without O_DIRECT (tmpfs): nothing to check.
        assert!(direct);
        return;
    };
    let segment = FileSegment::from_file(file, 0, 0).unwrap();
    // O_DIRECT needs aligned offsets, lengths and memory: whole 4 KiB pages.
    let unit = if direct { 4096 } else { 1 };
    let mut rng = Rng(0x5eed ^ u64::from(fast) ^ (u64::from(direct) << 1));
    for batch in 0..BATCHES {
        // Up to 16 blocks of 1 B .. 64 KiB in disjoint slots of the file,
        // listed in a random order (contiguous runs merge, others do not).
        let slots = 1 + rng.below(16);
        let slot = FILE_LEN / 16;
        let mut order: Vec<usize> = (0..16).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        // Block j at a page-aligned place of one registered arena.
        let mut arena = vec![0u8; slots * slot + 4096];
        let skip = arena.as_ptr().align_offset(4096);
        let mut placed = Vec::new();
        for (j, &s) in order[..slots].iter().enumerate() {
            let len = unit * (1 + rng.below(slot / unit));
            let offset = s * slot + unit * rng.below((slot - len) / unit + 1);
            let bytes = pattern((batch * 100 + s) as u64, len);
            expected[offset..offset + len].copy_from_slice(&bytes);
            arena[skip + j * slot..][..len].copy_from_slice(&bytes);
            placed.push((skip + j * slot, offset, len));
        }
        let arena = RegisteredMemory::new(&c, arena).unwrap();
        let memory: Vec<Descriptor> = placed
            .iter()
            .map(|&(at, _, len)| arena.carve(at, len).unwrap())
            .collect();
        let segments: Vec<FileSegment> = placed
            .iter()
            .map(|&(_, offset, len)| segment.at(offset as u64, len).unwrap())
            .collect();
        let write = c.begin_file_write(memory, segments).unwrap();
        write.wait_timeout(WAIT).unwrap();
        drop(write.into_descriptors().unwrap());
        let file = std::fs::read(&path).unwrap();
        let wrong = (0..FILE_LEN).find(|&i| file[i] != expected[i]);
        assert_eq!(
            wrong, None,
            "batch {batch}: the file differs at that byte (fast {fast}, {storage:?}, direct {direct})"
        );
    }
    let _ = std::fs::remove_file(&path);
}
