//! Storage READs on NIXL served from the page cache (`cached_reads`, on by
//! default) or through the POSIX plugin: whatever the file's pages are
//! (all cached, none, some), each READ brings back every byte, with the
//! fast path on and off.
#![allow(clippy::unwrap_used)]

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::time::Duration;

use backend_nixl::NixlBackend;
use descriptor_core::conformance::pattern;
use descriptor_core::{Connector, Descriptor, FileSegment};
use rstest::rstest;
use test_support::runtime_available;

const BLOCK: usize = 64 << 10;
const BLOCKS: usize = 8;
const WAIT: Duration = Duration::from_secs(20);

/// What of the file is in the page cache when the READ begins.
#[derive(Debug, Clone, Copy)]
enum Cached {
    All,
    None,
    SecondHalfEvicted,
}

#[rstest]
fn every_byte_comes_back_whatever_the_page_cache_holds(
    #[values(true, false)] fast: bool,
    #[values(Cached::All, Cached::None, Cached::SecondHalfEvicted)] cached: Cached,
    #[values(false, true)] scattered: bool,
) {
    if !runtime_available() {
        return;
    }
    let name = format!(
        "cached-{fast}-{cached:?}-{scattered}-{}",
        std::process::id()
    );
    let c = Connector::new(
        NixlBackend::builder(&name)
            .cached_reads(fast)
            .build()
            .unwrap(),
    );
    let path = std::env::temp_dir().join(format!("{name}.bin"));
    let bytes = pattern(77, BLOCK * BLOCKS);
    std::fs::write(&path, &bytes).unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    file.sync_all().unwrap();
    let evict = |from: usize| {
        // SAFETY: advice on an open descriptor; no memory is touched.
        let rc = unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                from as libc::off_t,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        assert_eq!(rc, 0);
    };
    match cached {
        Cached::All => {}
        Cached::None => evict(0),
        Cached::SecondHalfEvicted => evict(BLOCK * BLOCKS / 2),
    }
    let segment = FileSegment::from_file(file, 0, 0).unwrap();
    // Block i of memory from block i of the file, or from the blocks in
    // reverse order (no two neighbours in one run).
    let order: Vec<usize> = if scattered {
        (0..BLOCKS).rev().collect()
    } else {
        (0..BLOCKS).collect()
    };
    let segments: Vec<FileSegment> = order
        .iter()
        .map(|&b| segment.at((b * BLOCK) as u64, BLOCK).unwrap())
        .collect();
    let memory: Vec<Descriptor> = (0..BLOCKS)
        .map(|_| Descriptor::new(vec![0u8; BLOCK]).unwrap())
        .collect();
    let read = c.begin_file_read(segments, memory).unwrap();
    read.wait_timeout(WAIT).unwrap();
    let back = read.into_descriptors().unwrap();
    for (d, &b) in back.iter().zip(&order) {
        assert!(
            d.as_slice().unwrap() == &bytes[b * BLOCK..][..BLOCK],
            "block {b} ({cached:?}, fast path {fast})"
        );
    }
    let _ = std::fs::remove_file(&path);
}
