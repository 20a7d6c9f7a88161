//! Conformance checks of storage transfers: blocks WRITten from memory into
//! files and READ back (contiguous and scattered), the pairing rules, one
//! registration per file, a file kept open while its transfer may touch
//! it, and the faults a disk has: a failed transfer, a full file system, a
//! file truncated under a READ.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

use crate::{Descriptor, Error, FileSegment, OperationStatus};

use super::{Harness, WAIT, assert_pattern, connector, descriptors, faulty, returned, zeroed};

/// A fresh file for a check, removed when dropped.
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    fn new(tag: &str) -> TempFile {
        TempFile::in_dir(std::env::temp_dir(), tag)
    }

    fn in_dir(dir: PathBuf, tag: &str) -> TempFile {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("conformance-{tag}-{}-{n}", std::process::id()));
        TempFile { path }
    }

    /// The file opened for reading and writing (created, empty).
    fn open(&self) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.path)
            .unwrap()
    }

    /// The file opened again for reading and writing, as it is.
    fn open_again(&self) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .unwrap()
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Segments of `file` for `sizes`: laid end to end, or, `scattered`, each
/// block one block-size gap after the last one, in reverse order.
fn segments(file: &FileSegment, sizes: &[usize], scattered: bool) -> Vec<FileSegment> {
    let mut offset = 0u64;
    let mut out: Vec<FileSegment> = sizes
        .iter()
        .map(|&len| {
            let segment = file.at(offset, len).unwrap();
            offset += len as u64 * if scattered { 2 } else { 1 };
            segment
        })
        .collect();
    if scattered {
        out.reverse();
    }
    out
}

/// Blocks WRITten into a file land at their offsets, byte for byte, and
/// READ back into fresh memory equal what was written.
pub fn file_write_then_read_moves_bytes(h: &dyn Harness, sizes: &[usize], scattered: bool) {
    let c = connector(h, "files");
    let temp = TempFile::new("moves");
    let file = FileSegment::from_file(temp.open(), 0, 0).unwrap();
    let mut blocks = segments(&file, sizes, scattered);
    let write = c
        .begin_file_write(descriptors(70, sizes), blocks.clone())
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    let written = returned!(write, "the file WRITE");
    assert_pattern(&written, 70, "memory after its WRITE");
    // The file holds each block at its segment's offset.
    let on_disk = temp.bytes();
    for (i, (segment, d)) in blocks.iter().zip(&written).enumerate() {
        let at = segment.offset() as usize;
        assert!(
            on_disk.get(at..at + d.size()) == d.as_slice(),
            "block {i} is not at offset {at} in the file"
        );
    }
    // READ back, in another order: what each segment holds comes back.
    blocks.reverse();
    let mut expected: Vec<Descriptor> = written;
    expected.reverse();
    let lens: Vec<usize> = blocks.iter().map(FileSegment::len).collect();
    let read = c.begin_file_read(blocks, zeroed(&lens)).unwrap();
    read.wait_timeout(WAIT).unwrap();
    let back = returned!(read, "the file READ");
    for (i, (got, want)) in back.iter().zip(&expected).enumerate() {
        assert!(
            got.as_slice() == want.as_slice(),
            "block {i} came back changed"
        );
    }
}

/// Every pairing rule of a storage transfer is an error naming what is
/// wrong, before anything moves.
pub fn file_pairing_errors_name_the_problem(h: &dyn Harness) {
    let c = connector(h, "file-pairing");
    let temp = TempFile::new("pairing");
    let file = FileSegment::from_file(temp.open(), 0, 4096).unwrap();
    std::fs::write(&temp.path, vec![9u8; 8192]).unwrap();
    let two = vec![file.clone(), file.at(4096, 4096).unwrap()];
    let err = c
        .begin_file_write(descriptors(1, &[4096]), two.clone())
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DescriptorCountMismatch {
                local: 1,
                remote: 2
            }
        ),
        "{err}"
    );
    let err = c.begin_file_read(two, zeroed(&[4096, 100])).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SizeMismatch {
                index: 1,
                local: 100,
                remote: 4096
            }
        ),
        "{err}"
    );
    let err = c
        .begin_file_write(descriptors(1, &[4096]), Vec::new())
        .unwrap_err();
    assert!(matches!(err, Error::EmptyDescriptorList { .. }), "{err}");
    // Read-only memory cannot be READ into; a read-only file not written.
    let frozen = Descriptor::new(bytes::Bytes::from(vec![0u8; 4096])).unwrap();
    let err = c
        .begin_file_read(vec![file.clone()], vec![frozen])
        .unwrap_err();
    assert!(matches!(err, Error::ReadOnlyBuffer { index: 0 }), "{err}");
    let read_only = FileSegment::from_file(File::open(&temp.path).unwrap(), 0, 4096).unwrap();
    let err = c
        .begin_file_write(descriptors(1, &[4096]), vec![read_only.clone()])
        .unwrap_err();
    assert!(matches!(err, Error::ReadOnlyFile { index: 0 }), "{err}");
    // A read-only file is READ, though; past its end it is not.
    let read = c.begin_file_read(vec![read_only], zeroed(&[4096])).unwrap();
    read.wait_timeout(WAIT).unwrap();
    assert!(
        returned!(read, "the READ")[0]
            .as_slice()
            .unwrap()
            .iter()
            .all(|&b| b == 9)
    );
    let past = file.at(8000, 4096).unwrap();
    let err = c.begin_file_read(vec![past], zeroed(&[4096])).unwrap_err();
    match err {
        Error::PastEndOfFile {
            index: 0,
            end: 12096,
            file_len: 8192,
        } => {}
        other => panic!("a READ past the end: {other}"),
    }
    let err = c
        .begin_file_read(vec![file.at(8192, 1).unwrap()], zeroed(&[1]))
        .unwrap_err();
    assert!(
        err.to_string().contains("past the end of its file"),
        "{err}"
    );
}

/// A file is registered once, however many operations move its segments,
/// and its descriptor is closed once the last segment and operation are gone.
pub fn a_file_is_registered_once_and_closed_after_its_last_segment(h: &dyn Harness) {
    let c = connector(h, "file-once");
    let temp = TempFile::new("once");
    let file = FileSegment::from_file(temp.open(), 0, 4096).unwrap();
    let block = std::num::NonZeroUsize::new(4096).unwrap();
    let memory = crate::BlockPool::new(&c, vec![0u8; 4 * 4096], block).unwrap();
    let before = c.registrations();
    for round in 0..8u64 {
        let mut blocks = memory.checkout(1).unwrap();
        blocks[0].as_mut_slice().unwrap().fill(round as u8);
        let write = c
            .begin_file_write(blocks, vec![file.at(round * 4096, 4096).unwrap()])
            .unwrap();
        write.wait_timeout(WAIT).unwrap();
        drop(returned!(write, "a WRITE"));
    }
    assert_eq!(
        c.registrations() - before,
        1,
        "one registration for the file, none per operation"
    );
    let fd = file_fd(&file);
    let link = |fd: i32| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
    assert_eq!(link(fd).as_deref(), Some(temp.path.as_path()));
    drop(file);
    assert_ne!(
        link(fd).as_deref(),
        Some(temp.path.as_path()),
        "the file's descriptor is still open after its last segment"
    );
    assert_eq!(std::fs::read(&temp.path).unwrap().len(), 8 * 4096);
}

/// The descriptor a segment's file holds, from its `Debug` (the check
/// needs it; users never do).
fn file_fd(file: &FileSegment) -> i32 {
    let debug = format!("{file:?}");
    let after = debug.split("fd: Some(").nth(1).unwrap();
    after.split(')').next().unwrap().parse().unwrap()
}

/// An injected failure (the disk's EIO) errors the operation; a stalled
/// WRITE that is cancelled hands its memory back only once the backend let
/// go, and its file stays open meanwhile.
pub fn a_failed_or_cancelled_file_transfer_keeps_memory_and_file_until_let_go(h: &dyn Harness) {
    let (c, faults) = faulty(h, "file-faults");
    let temp = TempFile::new("faults");
    let file = FileSegment::from_file(temp.open(), 0, 65536).unwrap();
    faults.fail_next_transfer("injected EIO");
    let write = c
        .begin_file_write(descriptors(3, &[65536]), vec![file.clone()])
        .unwrap();
    let err = write.wait_timeout(WAIT).unwrap_err();
    assert!(err.to_string().contains("injected EIO"), "{err}");
    assert_eq!(write.status(), OperationStatus::Errored);
    assert_pattern(
        &returned!(write, "the failed WRITE"),
        3,
        "memory after a failed WRITE",
    );
    assert!(temp.bytes().is_empty(), "a failed WRITE wrote");

    // A WRITE the transport cannot abort: cancelled, it still runs, and
    // until it has, its memory is not handed back nor its file closed,
    // though the caller dropped every segment of it.
    faults.drain_next_transfer(std::time::Duration::from_millis(300));
    let write = c
        .begin_file_write(descriptors(4, &[65536]), vec![file.clone()])
        .unwrap();
    let fd = file_fd(&file);
    drop(file);
    write.cancel();
    assert!(matches!(write.wait_timeout(WAIT), Err(Error::Cancelled)));
    let link = || std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
    let write = match write.into_descriptors() {
        Err(write) => write,
        Ok(_) => panic!("memory handed back while its WRITE drains"),
    };
    assert_eq!(
        link().as_deref(),
        Some(temp.path.as_path()),
        "closed while its transfer drains"
    );
    let back = returned!(write, "the cancelled WRITE");
    assert_pattern(&back, 4, "memory after a cancelled WRITE");
    // The drained WRITE landed whole, into the file it named.
    assert!(
        temp.bytes() == super::pattern(4, 65536),
        "the drained WRITE"
    );
    // Closed by the thread that settled the WRITE, after it handed the
    // memory back: soon, not necessarily before `into_descriptors` returned.
    let deadline = std::time::Instant::now() + WAIT;
    while link().as_deref() == Some(temp.path.as_path()) {
        assert!(
            std::time::Instant::now() < deadline,
            "open after the WRITE drained"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A file truncated after its READ was begun (and checked) but before the
/// backend moved it fails the READ: bytes past the new end are never
/// reported read.
pub fn a_file_truncated_under_a_read_fails_it(h: &dyn Harness) {
    let (c, faults) = faulty(h, "file-truncated");
    let temp = TempFile::new("truncated");
    let file = FileSegment::from_file(temp.open(), 0, 0).unwrap();
    std::fs::write(&temp.path, vec![5u8; 3 * 65536]).unwrap();
    let blocks = segments(&file, &[65536; 3], false);
    let stall = faults.stall_next_transfer();
    let read = c.begin_file_read(blocks, zeroed(&[65536; 3])).unwrap();
    OpenOptions::new()
        .write(true)
        .open(&temp.path)
        .unwrap()
        .set_len(65536)
        .unwrap();
    stall.release();
    let err = read.wait_timeout(WAIT).unwrap_err();
    assert!(matches!(err, Error::TransferFailed { .. }), "{err}");
    let back = returned!(read, "the truncated READ");
    // What was there is read; nothing claims the rest.
    assert!(back[0].as_slice().unwrap().iter().all(|&b| b == 5));
    // Begun after the truncation, within the size seen before it: refused
    // up front or failed by the backend, never reported read.
    let late = file.at(2 * 65536, 65536).unwrap();
    match c.begin_file_read(vec![late], zeroed(&[65536])) {
        Err(Error::PastEndOfFile { .. }) => {}
        Err(other) => panic!("a READ past a truncated end: {other}"),
        Ok(read) => {
            let err = read.wait_timeout(WAIT).unwrap_err();
            assert!(matches!(err, Error::TransferFailed { .. }), "{err}");
        }
    }
}

/// A file opened with `O_DIRECT`: a segment or memory off the file
/// system's direct-I/O alignment is refused before the backend sees it
/// (the kernel would fail it with EINVAL), and aligned blocks move, byte
/// for byte. Skipped where the temporary directory does not take O_DIRECT.
pub fn direct_io_is_aligned_or_refused(h: &dyn Harness) {
    use std::os::unix::fs::OpenOptionsExt;
    let temp = TempFile::new("direct");
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&temp.path);
    let Ok(opened) = opened else {
        tracing::warn!(
            "direct_io_is_aligned_or_refused: no O_DIRECT in the temporary directory: skipped"
        );
        return;
    };
    let c = connector(h, "file-direct");
    let file = FileSegment::from_file(opened, 0, 0).unwrap();
    let align = file.direct_io_alignment().expect("opened with O_DIRECT");
    let plain = FileSegment::from_file(temp.open_again(), 0, 0).unwrap();
    assert_eq!(plain.direct_io_alignment(), None);
    let block = usize::try_from(align.offset.max(align.memory).max(4096)).unwrap();
    let mut arena = vec![0u8; 3 * block];
    let skip = arena.as_ptr().align_offset(block);
    arena[skip..skip + 2 * block].copy_from_slice(&super::pattern(80, 2 * block));
    let memory = crate::RegisteredMemory::new(&c, arena).unwrap();
    let views = || {
        vec![
            memory.carve(skip, block).unwrap(),
            memory.carve(skip + block, block).unwrap(),
        ]
    };
    let write = c
        .begin_file_write(views(), segments(&file, &[block, block], false))
        .unwrap();
    write.wait_timeout(WAIT).unwrap();
    drop(returned!(write, "the direct WRITE"));
    assert!(
        temp.bytes() == super::pattern(80, 2 * block),
        "the direct WRITE"
    );
    let refused = |local: Descriptor, segment: FileSegment| match c
        .begin_file_write(vec![local], vec![segment])
    {
        Err(Error::UnalignedDirectIo { what, align, .. }) => (what, align),
        Err(other) => panic!("an unaligned direct WRITE: {other}"),
        Ok(_) => panic!("an unaligned direct WRITE was begun"),
    };
    if align.offset > 1 {
        let at = refused(
            memory.carve(skip, block).unwrap(),
            file.at(1, block).unwrap(),
        );
        assert_eq!(at, ("offset", align.offset));
        let short = refused(
            memory.carve(skip, block - 1).unwrap(),
            file.at(0, block - 1).unwrap(),
        );
        assert_eq!(short, ("length", align.offset));
    }
    if align.memory > 1 {
        let off = refused(
            memory.carve(skip + 1, block).unwrap(),
            file.at(0, block).unwrap(),
        );
        assert_eq!(off, ("memory address", align.memory));
    }
    // Read back into the same (zeroed) memory.
    let zeroed: Vec<Descriptor> = views()
        .into_iter()
        .map(|mut d| {
            d.as_mut_slice().unwrap().fill(0);
            d
        })
        .collect();
    let read = c
        .begin_file_read(segments(&file, &[block, block], false), zeroed)
        .unwrap();
    read.wait_timeout(WAIT).unwrap();
    let back = returned!(read, "the direct READ");
    let bytes: Vec<u8> = back
        .iter()
        .flat_map(|d| d.as_slice().unwrap().to_vec())
        .collect();
    assert!(bytes == super::pattern(80, 2 * block), "the direct READ");
    drop(back);

    // Random offsets, lengths and memory positions, aligned or not: each
    // WRITE is refused up front or lands byte for byte (so the alignment
    // the file reports is the kernel's: what it would refuse, EINVAL, would
    // fail the transfer here).
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let units = [1u64, 8, 512, 4096];
    let scratch = vec![0u8; 10 * block];
    let skip = scratch.as_ptr().align_offset(block);
    let memory = crate::RegisteredMemory::new(&c, scratch).unwrap();
    for round in 0..24u64 {
        let offset = next(8) * units[next(4) as usize];
        let len = ((1 + next(4)) * units[next(4) as usize]).min(block as u64) as usize;
        let at = skip + (next(8) * units[next(4) as usize]) as usize;
        let aligned = offset.is_multiple_of(align.offset)
            && (len as u64).is_multiple_of(align.offset)
            && ((memory.ptr() + at) as u64).is_multiple_of(align.memory);
        let mut local = memory.carve(at, len).unwrap();
        let seed = 90 + round;
        local
            .as_mut_slice()
            .unwrap()
            .copy_from_slice(&super::pattern(seed, len));
        let begun = c.begin_file_write(vec![local], vec![file.at(offset, len).unwrap()]);
        match (aligned, begun) {
            (true, Ok(write)) => {
                write.wait_timeout(WAIT).unwrap_or_else(|e| {
                    panic!("an aligned direct WRITE of {len} B at {offset} (memory +{at}): {e}")
                });
                drop(returned!(write, "a random direct WRITE"));
                let on_disk = temp.bytes();
                assert!(
                    on_disk[offset as usize..][..len] == super::pattern(seed, len),
                    "a direct WRITE of {len} B at {offset}"
                );
            }
            (false, Err(Error::UnalignedDirectIo { .. })) => {}
            (aligned, begun) => panic!(
                "{len} B at {offset} (memory +{at}), aligned {aligned}: {:?}",
                begun.map(|_| "begun")
            ),
        }
    }
}

/// A WRITE into a full file system fails with the system's error (ENOSPC),
/// and the memory comes back unchanged. Needs a small tmpfs: mounted here
/// when the process may (root); otherwise the check says so and returns.
pub fn a_full_file_system_fails_the_write(h: &dyn Harness) {
    let Some(mount) = SmallTmpfs::mount() else {
        tracing::warn!(
            "a_full_file_system_fails_the_write: cannot mount a tmpfs here (not root?): skipped"
        );
        return;
    };
    let c = connector(h, "file-full");
    let temp = TempFile::in_dir(mount.dir.clone(), "full");
    let file = FileSegment::from_file(temp.open(), 0, 0).unwrap();
    // 2 MiB into a 1 MiB file system.
    let blocks = segments(&file, &[1 << 20, 1 << 20], false);
    let write = c
        .begin_file_write(descriptors(6, &[1 << 20, 1 << 20]), blocks)
        .unwrap();
    let err = write.wait_timeout(WAIT).unwrap_err();
    assert!(matches!(err, Error::TransferFailed { .. }), "{err}");
    assert_pattern(
        &returned!(write, "the WRITE to a full disk"),
        6,
        "memory after ENOSPC",
    );
    drop(file);
    drop(temp);
    drop(mount);
}

/// A 1 MiB tmpfs, unmounted when dropped.
struct SmallTmpfs {
    dir: PathBuf,
}

impl SmallTmpfs {
    fn mount() -> Option<SmallTmpfs> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("conformance-tmpfs-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(SmallTmpfs { dir })
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}
