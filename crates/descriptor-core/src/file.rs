//! [`FileSegment`]: a part of a file that blocks are written to and read
//! back from, the far side of a storage transfer
//! ([`Connector::begin_file_write`], [`Connector::begin_file_read`]).
//!
//! A file is registered once with a connector's backend, the first time an
//! operation uses one of its segments, and deregistered when the last
//! segment of it is dropped; its descriptor is closed only after that, so a
//! backend never reads or writes a closed (or reused) descriptor. Operations
//! own the segments they move while the backend may touch them, as they own
//! memory.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::backend::{FileSpan, RegionId};
use crate::connector::{Connector, check_local};
use crate::descriptor::Descriptor;
use crate::error::{Error, Result, Side};
use crate::metadata::OperationKind;
use crate::region::Registration;

/// A part of a file: `len` bytes from `offset`, of a file opened by this
/// value (or handed to it), shared by every segment made from it with
/// [`at`](Self::at).
///
/// Cheap to clone (an `Arc`). The file stays open while any segment of it
/// is alive, and while an operation that moves it may still touch it.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use descriptor_core::FileSegment;
/// let dir = std::env::temp_dir().join(format!("fs-doc-{}", std::process::id()));
/// let file = std::fs::OpenOptions::new()
///     .read(true).write(true).create(true).truncate(true)
///     .open(&dir)?;
/// let first = FileSegment::from_file(file, 0, 4096)?;
/// let second = first.at(4096, 4096)?; // the same file, the next block
/// assert_eq!((second.offset(), second.len()), (4096, 4096));
/// assert!(second.is_writable());
/// # std::fs::remove_file(dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct FileSegment {
    file: Arc<OpenFile>,
    offset: u64,
    len: usize,
}

/// An open file and its one registration.
struct OpenFile {
    /// `None` once leaked (its registration could not be ended).
    fd: Option<OwnedFd>,
    writable: bool,
    registration: OnceLock<Registration>,
    /// The file's size when last asked ([`FileSegment::file_len`]): a READ
    /// that ends within it is begun without asking again (a file shrunk
    /// since fails that READ in the backend instead).
    seen_len: AtomicU64,
    /// Opened with `O_DIRECT`: what its I/O must be aligned to.
    direct: Option<DirectIoAlignment>,
}

/// What direct I/O (`O_DIRECT`) on a file needs aligned, as the file system
/// reports it (`statx`'s `STATX_DIOALIGN`; 4096 for both on kernels before
/// 6.1, which do not report it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectIoAlignment {
    /// The memory's address, in bytes.
    pub memory: u64,
    /// Offsets and lengths in the file, in bytes.
    pub offset: u64,
}

/// The alignment assumed where the kernel does not report one: a page,
/// which every Linux file system taking `O_DIRECT` accepts.
const DIRECT_IO_FALLBACK: u64 = 4096;

impl FileSegment {
    /// `len` bytes from `offset` of the file at `path`, opened for reading
    /// and writing (not created: open it yourself with the options you need
    /// and use [`from_file`](Self::from_file)).
    pub fn open(path: impl AsRef<Path>, offset: u64, len: usize) -> Result<FileSegment> {
        let path = path.as_ref();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::InvalidFile(format!("cannot open {}: {e}", path.display())))?;
        FileSegment::from_file(file, offset, len)
    }

    /// `len` bytes from `offset` of an open file, which this segment (and
    /// those made from it) now owns. Whether it may be written is read from
    /// the descriptor's access mode (`O_RDONLY` files are never written).
    pub fn from_file(file: File, offset: u64, len: usize) -> Result<FileSegment> {
        FileSegment::from_owned_fd(OwnedFd::from(file), offset, len)
    }

    /// `len` bytes from `offset` of an open file descriptor, which this
    /// segment now owns (closes).
    ///
    /// # Safety
    ///
    /// `fd` is an open descriptor that nothing else closes, as for
    /// [`OwnedFd::from_raw_fd`].
    pub unsafe fn from_raw_fd(fd: RawFd, offset: u64, len: usize) -> Result<FileSegment> {
        // SAFETY: our caller hands over an open descriptor it owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        FileSegment::from_owned_fd(fd, offset, len)
    }

    fn from_owned_fd(fd: OwnedFd, offset: u64, len: usize) -> Result<FileSegment> {
        let (writable, direct) = open_mode(fd.as_fd())?;
        check_range(offset, len)?;
        Ok(FileSegment {
            file: Arc::new(OpenFile {
                fd: Some(fd),
                writable,
                registration: OnceLock::new(),
                seen_len: AtomicU64::new(0),
                direct,
            }),
            offset,
            len,
        })
    }

    /// Another segment of the same file: `len` bytes from `offset`. It
    /// shares this one's descriptor and registration.
    pub fn at(&self, offset: u64, len: usize) -> Result<FileSegment> {
        check_range(offset, len)?;
        Ok(FileSegment {
            file: Arc::clone(&self.file),
            offset,
            len,
        })
    }

    /// Where the segment starts in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// How many bytes the segment holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the file was opened for writing.
    pub fn is_writable(&self) -> bool {
        self.file.writable
    }

    /// Whether `other` is a segment of the same open file.
    pub fn same_file(&self, other: &FileSegment) -> bool {
        Arc::ptr_eq(&self.file, &other.file)
    }

    /// What the file's direct I/O must be aligned to, if it was opened with
    /// `O_DIRECT` (`None`: through the page cache, no alignment needed).
    /// Segments and the memory paired with them are checked against it
    /// when a transfer begins ([`Error::UnalignedDirectIo`]).
    pub fn direct_io_alignment(&self) -> Option<DirectIoAlignment> {
        self.file.direct
    }

    /// The file's size now (`fstat`).
    pub fn file_len(&self) -> Result<u64> {
        let fd = self.file.fd()?;
        let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `fstat` writes one `stat` into the buffer it is given, for
        // a descriptor that stays open for the call (borrowed from `self`).
        if unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) } != 0 {
            return Err(io_error("stat")(std::io::Error::last_os_error()));
        }
        // SAFETY: `fstat` succeeded, so it filled the buffer.
        let size = unsafe { stat.assume_init() }.st_size;
        let len = u64::try_from(size)
            .map_err(|_| Error::InvalidFile(format!("a file size of {size} bytes")))?;
        self.file.seen_len.store(len, Ordering::Relaxed);
        Ok(len)
    }

    /// One past the segment's last byte in the file.
    pub(crate) fn end(&self) -> u64 {
        // `check_range` made sure it fits.
        self.offset + self.len as u64
    }

    /// Registers the file with `connector`'s backend, once (see
    /// [`crate::Descriptor`]'s regions: the same race rules), and the span
    /// a transfer names.
    pub(crate) fn register(&self, connector: &Connector) -> Result<FileSpan> {
        let region = self.file.register(connector)?;
        Ok(FileSpan {
            region,
            fd: self.file.fd()?.as_raw_fd(),
            offset: self.offset,
            len: self.len,
        })
    }
}

impl std::fmt::Debug for FileSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSegment")
            .field("fd", &self.file.fd.as_ref().map(AsRawFd::as_raw_fd))
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("writable", &self.file.writable)
            .field(
                "registered_with",
                &self
                    .file
                    .registration
                    .get()
                    .map(Registration::connector_name),
            )
            .finish()
    }
}

impl OpenFile {
    fn fd(&self) -> Result<BorrowedFd<'_>> {
        self.fd
            .as_ref()
            .map(AsFd::as_fd)
            .ok_or_else(|| Error::InvalidFile("the file was leaked".into()))
    }

    fn register(&self, connector: &Connector) -> Result<RegionId> {
        if let Some(registration) = self.registration.get() {
            return registration.check(connector);
        }
        let fd = self.fd()?;
        // SAFETY: the descriptor stays open until `Drop` below has
        // deregistered it (and is leaked, never closed, if that fails), and
        // the backend reads or writes it only in transfers, whose segments
        // their operations own until the backend let go of them.
        let id = match unsafe { connector.backend_arc().register_file(fd, self.writable) } {
            Ok(id) => id,
            Err(error) => {
                return match self.registration.get() {
                    Some(winner) => winner.check(connector),
                    None => Err(error),
                };
            }
        };
        connector.count_registration();
        tracing::debug!(
            connector = connector.name(),
            fd = fd.as_raw_fd(),
            region = id.0,
            "registered a file"
        );
        match self.registration.set(Registration::new(connector, id)) {
            Ok(()) => Ok(id),
            Err(mut lost) => {
                // The descriptor stays open as long as this file does: a
                // registration that cannot be ended only costs its entry.
                lost.deregister();
                match self.registration.get() {
                    Some(winner) => winner.check(connector),
                    None => Err(Error::InvalidFile(
                        "the file's registration vanished while it was registered".into(),
                    )),
                }
            }
        }
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if let Some(mut registration) = self.registration.take()
            && !registration.deregister()
        {
            // The backend may still reach the descriptor: never close it, so
            // that its number is never reused for another file under it.
            std::mem::forget(self.fd.take());
        }
    }
}

/// The pairing rules of a storage transfer, checked before the backend is
/// touched: see [`Connector::begin_file_write`] and
/// [`Connector::begin_file_read`].
pub(crate) fn check_file_pairing(
    files: &[FileSegment],
    local: &[Descriptor],
    op: OperationKind,
) -> Result<()> {
    if files.is_empty() {
        return Err(Error::EmptyDescriptorList { side: Side::Remote });
    }
    // A READ writes into local memory.
    check_local(local, op == OperationKind::Read)?;
    if local.len() != files.len() {
        return Err(Error::DescriptorCountMismatch {
            local: local.len(),
            remote: files.len(),
        });
    }
    // The size of the file last asked about: at most one `fstat` per run
    // of segments of one file, and none for segments within the size seen
    // last.
    let mut known: Option<(&FileSegment, u64)> = None;
    for (index, (l, f)) in local.iter().zip(files).enumerate() {
        if l.size() != f.len {
            return Err(Error::SizeMismatch {
                index,
                local: l.size(),
                remote: f.len,
            });
        }
        if let Some(align) = f.file.direct {
            check_direct(index, f, l, align)?;
        }
        match op {
            OperationKind::Write if !f.is_writable() => {
                return Err(Error::ReadOnlyFile { index });
            }
            OperationKind::Write => {}
            OperationKind::Read if f.end() <= f.file.seen_len.load(Ordering::Relaxed) => {}
            OperationKind::Read => {
                let file_len = match known {
                    Some((last, len)) if last.same_file(f) => len,
                    _ => f.file_len()?,
                };
                known = Some((f, file_len));
                if f.end() > file_len {
                    return Err(Error::PastEndOfFile {
                        index,
                        end: f.end(),
                        file_len,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Segment `index` and its memory against the file's direct-I/O alignment.
fn check_direct(
    index: usize,
    segment: &FileSegment,
    local: &Descriptor,
    align: DirectIoAlignment,
) -> Result<()> {
    let checks = [
        ("offset", segment.offset, align.offset),
        ("length", segment.len as u64, align.offset),
        ("memory address", local.ptr() as u64, align.memory),
    ];
    match checks
        .into_iter()
        .find(|&(_, value, align)| !value.is_multiple_of(align))
    {
        Some((what, value, align)) => Err(Error::UnalignedDirectIo {
            index,
            what,
            value,
            align,
        }),
        None => Ok(()),
    }
}

/// Whether an open descriptor may be written (its access mode), and its
/// direct-I/O alignment if it was opened with `O_DIRECT`, for a regular
/// file; anything else is refused.
fn open_mode(fd: BorrowedFd<'_>) -> Result<(bool, Option<DirectIoAlignment>)> {
    let file = File::from(fd.try_clone_to_owned().map_err(io_error("duplicate"))?);
    let meta = file.metadata().map_err(io_error("stat"))?;
    if !meta.is_file() {
        return Err(Error::InvalidFile(
            "not a regular file (storage transfers move blocks of regular files)".into(),
        ));
    }
    // SAFETY: F_GETFL on a descriptor open for the duration of the call
    // reads its flags and touches no memory.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io_error("read the access mode of")(
            std::io::Error::last_os_error(),
        ));
    }
    let writable = matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR);
    let direct = (flags & libc::O_DIRECT != 0).then(|| direct_io_alignment(fd));
    Ok((writable, direct))
}

/// The file system's direct-I/O alignment for `fd` (`statx`), or a page
/// where the kernel does not say.
fn direct_io_alignment(fd: BorrowedFd<'_>) -> DirectIoAlignment {
    let fallback = DirectIoAlignment {
        memory: DIRECT_IO_FALLBACK,
        offset: DIRECT_IO_FALLBACK,
    };
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `statx` of the open descriptor itself (an empty path with
    // AT_EMPTY_PATH) writes one `statx` into the buffer, which is zeroed,
    // so every field is initialized whatever the kernel fills.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            stx.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return fallback;
    }
    // SAFETY: zeroed, then written by a successful `statx`.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return fallback;
    }
    DirectIoAlignment {
        memory: u64::from(stx.stx_dio_mem_align).max(1),
        offset: u64::from(stx.stx_dio_offset_align),
    }
}

/// A segment's end must be a file offset (`off_t`).
fn check_range(offset: u64, len: usize) -> Result<()> {
    let fits = (len as u64)
        .checked_add(offset)
        .is_some_and(|end| end <= i64::MAX as u64);
    if fits {
        Ok(())
    } else {
        Err(Error::InvalidFile(format!(
            "segment of {len} bytes at offset {offset} ends past the largest file offset"
        )))
    }
}

fn io_error(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::InvalidFile(format!("cannot {what} the file: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("file-seg-{tag}-{}", std::process::id()))
    }

    #[test]
    fn the_access_mode_says_whether_a_file_is_written() {
        let path = temp("mode");
        std::fs::write(&path, [7u8; 64]).unwrap();
        let rw = FileSegment::open(&path, 0, 64).unwrap();
        assert!(rw.is_writable());
        assert_eq!(rw.file_len().unwrap(), 64);
        let ro = FileSegment::from_file(File::open(&path).unwrap(), 0, 64).unwrap();
        assert!(!ro.is_writable());
        assert!(!ro.same_file(&rw));
        assert!(ro.same_file(&ro.at(8, 8).unwrap()));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn ranges_past_the_largest_offset_and_non_files_are_refused() {
        let path = temp("range");
        std::fs::write(&path, []).unwrap();
        let seg = FileSegment::open(&path, 0, 0).unwrap();
        assert!(seg.at(i64::MAX as u64, 0).is_ok());
        let err = seg.at(i64::MAX as u64, 1).unwrap_err();
        assert!(matches!(err, Error::InvalidFile(_)), "{err}");
        assert!(seg.at(u64::MAX, 2).is_err());
        std::fs::remove_file(&path).unwrap();
        let dir = File::open(std::env::temp_dir()).unwrap();
        let err = FileSegment::from_file(dir, 0, 1).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let err = FileSegment::open(temp("absent"), 0, 1).unwrap_err();
        assert!(err.to_string().contains("cannot open"), "{err}");
    }
}
