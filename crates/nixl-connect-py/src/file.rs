//! The native `FileSegment`: a part of a file that blocks are written to and
//! read back from (`Connector.begin_file_write` / `begin_file_read`), over
//! the core's [`FileSegment`].
//!
//! A segment owns its descriptor. A path is opened here; an fd or a file
//! object is *duplicated* (`F_DUPFD_CLOEXEC`), so that the caller closing
//! its own fd or file never closes (or lets the kernel reuse the number of)
//! the descriptor a transfer may still be using: the core closes the
//! duplicate only after the file's last segment and transfer are gone.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use descriptor_core::FileSegment;
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyString};

use crate::error::to_py;

/// A part of a file, `size` bytes from `offset`: the far side of
/// `Connector.begin_file_write` and `Connector.begin_file_read`.
///
/// ``FileSegment(file, offset=0, size=None)``: `file` is a path (``str``,
/// ``bytes`` or ``os.PathLike``), an open file descriptor (``int``) or a
/// file object with ``fileno()``. A path is opened (never created) for
/// reading and writing, or read-only if this process may not write it (then
/// `writable` is ``False`` and a WRITE into it is refused). A descriptor or
/// file object is duplicated: the segment owns its own descriptor, so the
/// caller may close its fd or file at once, and its access mode (read-only,
/// write-only, read-write) is the segment's. `size` ``None`` is the rest of
/// the file from `offset` now (0 for a new, empty file: make the blocks
/// with `at`).
///
/// `at(offset, size)` makes another segment of the same open file, which
/// shares its descriptor and its one registration with the backend: make
/// one segment per file and the others with `at`. The file stays open while
/// any of its segments, or a transfer that may touch it, is alive.
///
/// ``ValueError`` for a file that cannot be a segment (missing, a directory
/// or another non-regular file, a closed descriptor), a negative or too
/// large `offset` or `size`, or `size` ``None`` with `offset` past the end;
/// ``TypeError`` for a `file` that is none of the above.
//
// Named as the package exports it: `nixl_connect.FileSegment` is this class
// (no Python wrapper), so the API surface test sees it as the package's.
#[pyclass(frozen, module = "nixl_connect", name = "FileSegment")]
pub(crate) struct PyFileSegment {
    inner: FileSegment,
    /// Where the file came from, for `repr`: its path, a file object's
    /// name, or the number of the caller's fd (not the duplicate's).
    origin: String,
}

impl PyFileSegment {
    /// The core segment, for an operation to own.
    pub(crate) fn inner(&self) -> &FileSegment {
        &self.inner
    }
}

/// What `file` names: a path to open, or an open descriptor to duplicate.
enum Named {
    Path(PathBuf),
    Fd(RawFd),
}

/// Reads `file` as a path (`str`, `bytes`, `os.PathLike`), an `int` fd or an
/// object with `fileno()`, and what `repr` shows of it (the path's `repr`, a
/// file object's name's, or `fd N`); `TypeError` for anything else.
fn named(file: &Bound<'_, PyAny>) -> PyResult<(Named, String)> {
    if file.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(
            "Argument `file` must be a path, an int file descriptor or a file object with `fileno()`; got bool.",
        ));
    }
    if file.is_instance_of::<PyString>() || file.is_instance_of::<PyBytes>() {
        return Ok((Named::Path(path_of(file)?), file.repr()?.to_string()));
    }
    if file.hasattr("__fspath__")? {
        let path = file.call_method0("__fspath__")?;
        return Ok((Named::Path(path_of(&path)?), path.repr()?.to_string()));
    }
    match file.extract::<i64>() {
        Ok(fd) => return Ok((Named::Fd(fd_number(fd)?), format!("fd {fd}"))),
        Err(e) if e.is_instance_of::<PyOverflowError>(file.py()) => {
            return Err(PyValueError::new_err(format!(
                "file descriptor {file} is not a valid descriptor number"
            )));
        }
        Err(_) => {}
    }
    if file.hasattr("fileno")? {
        let fd = file.call_method0("fileno")?;
        let fd = fd.extract::<i64>().map_err(|_| {
            PyTypeError::new_err("`file.fileno()` must return an int file descriptor.")
        })?;
        let origin = match file.getattr("name") {
            Ok(name) if name.is_instance_of::<PyString>() => name.repr()?.to_string(),
            _ => format!("fd {fd}"),
        };
        return Ok((Named::Fd(fd_number(fd)?), origin));
    }
    Err(PyTypeError::new_err(format!(
        "Argument `file` must be a path, an int file descriptor or a file object with `fileno()`; got {}.",
        file.get_type().name()?
    )))
}

/// A path from `str` or `bytes` (what `os.fspath` returns).
fn path_of(path: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    if let Ok(bytes) = path.cast::<PyBytes>() {
        return Ok(PathBuf::from(OsStr::from_bytes(bytes.as_bytes())));
    }
    path.extract::<PathBuf>().map_err(|_| {
        PyTypeError::new_err("`__fspath__()` of argument `file` must return `str` or `bytes`.")
    })
}

/// A file descriptor's number, refused (`ValueError`) if it cannot be one.
fn fd_number(fd: i64) -> PyResult<RawFd> {
    RawFd::try_from(fd)
        .ok()
        .filter(|fd| *fd >= 0)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "file descriptor {fd} is not a valid descriptor number"
            ))
        })
}

/// The file at `path`, read-write if this process may write it, else
/// read-only (never created).
fn open_path(path: &PathBuf) -> descriptor_core::Result<File> {
    let cannot = |e: std::io::Error| {
        descriptor_core::Error::InvalidFile(format!("cannot open {}: {e}", path.display()))
    };
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(file) => Ok(file),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY)
            ) =>
        {
            File::open(path).map_err(cannot)
        }
        Err(e) => Err(cannot(e)),
    }
}

/// A duplicate (`F_DUPFD_CLOEXEC`) of the open descriptor `fd`, owned by
/// the returned file.
fn duplicate(fd: RawFd) -> descriptor_core::Result<File> {
    // SAFETY: `fd` is not -1 (`fd_number` refused negative numbers, which
    // `borrow_raw` requires), and the borrow lives only for the one `fcntl`
    // that duplicates it, which touches no memory: a closed descriptor is
    // `EBADF`, refused below. A number another thread closes and reuses
    // meanwhile duplicates that file, as `os.dup` would.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned().map(File::from).map_err(|e| {
        descriptor_core::Error::InvalidFile(format!("cannot duplicate file descriptor {fd}: {e}"))
    })
}

/// A byte count or offset from Python: `TypeError` unless an int (`bool`
/// neither), `ValueError` if negative or too large.
fn non_negative(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "Argument `{what}` must be an `int`; got bool."
        )));
    }
    match value.extract::<u64>() {
        Ok(n) => Ok(n),
        Err(e) if e.is_instance_of::<PyOverflowError>(value.py()) => {
            let negative = value.lt(0)?;
            Err(PyValueError::new_err(if negative {
                format!("Argument `{what}` must not be negative; got {value}.")
            } else {
                format!("Argument `{what}` is too large; got {value}.")
            }))
        }
        Err(_) => Err(PyTypeError::new_err(format!(
            "Argument `{what}` must be an `int`; got {}.",
            value.get_type().name()?
        ))),
    }
}

/// A size as the core takes it (`usize`).
fn size_of(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    usize::try_from(non_negative(value, "size")?)
        .map_err(|_| PyValueError::new_err(format!("Argument `size` is too large; got {value}.")))
}

/// A segment of `first`'s file from `offset`: `size` bytes, or (`None`) to
/// the file's end now.
fn segment(first: &FileSegment, offset: u64, size: Option<usize>) -> PyResult<FileSegment> {
    let len = match size {
        Some(len) => len,
        None => {
            let file_len = first.file_len().map_err(to_py)?;
            let rest = file_len.checked_sub(offset).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "offset {offset} is past the end of the file ({file_len} bytes): give `size`"
                ))
            })?;
            usize::try_from(rest).map_err(|_| {
                PyValueError::new_err(format!(
                    "the file's {rest} bytes from {offset} are too many"
                ))
            })?
        }
    };
    first.at(offset, len).map_err(to_py)
}

#[pymethods]
impl PyFileSegment {
    /// `size` bytes from `offset` of `file` (see `nixl_connect.FileSegment`).
    #[new]
    #[pyo3(signature = (file, offset=None, size=None), text_signature = "(file, offset=0, size=None)")]
    fn new(
        py: Python<'_>,
        file: &Bound<'_, PyAny>,
        offset: Option<&Bound<'_, PyAny>>,
        size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyFileSegment> {
        let offset = offset.map(|o| non_negative(o, "offset")).transpose()?;
        let offset = offset.unwrap_or(0);
        let size = size.map(size_of).transpose()?;
        let (named, origin) = named(file)?;
        let inner = crate::exit::detach(py, || {
            let file = match named {
                Named::Path(path) => open_path(&path)?,
                Named::Fd(fd) => duplicate(fd)?,
            };
            FileSegment::from_file(file, 0, 0)
        })
        .map_err(to_py)?;
        let inner = crate::exit::detach(py, || segment(&inner, offset, size))?;
        Ok(PyFileSegment { inner, origin })
    }

    /// Where the segment starts in the file.
    #[getter]
    fn offset(&self) -> u64 {
        self.inner.offset()
    }

    /// How many bytes the segment holds.
    #[getter]
    fn size(&self) -> usize {
        self.inner.len()
    }

    /// Whether the file was opened for writing (a WRITE into a read-only
    /// one is refused).
    #[getter]
    fn writable(&self) -> bool {
        self.inner.is_writable()
    }

    /// What direct I/O on the file must be aligned to, if it was opened
    /// with `O_DIRECT`: `(memory, offset)` in bytes (memory addresses;
    /// offsets and sizes), as the file system reports it; `None` through
    /// the page cache. Transfers off it raise `ValueError`.
    #[getter]
    fn direct_io_alignment(&self) -> Option<(u64, u64)> {
        self.inner
            .direct_io_alignment()
            .map(|align| (align.memory, align.offset))
    }

    /// Another segment of the same open file (same descriptor, same
    /// registration): `size` bytes from `offset`.
    fn at(&self, offset: &Bound<'_, PyAny>, size: &Bound<'_, PyAny>) -> PyResult<PyFileSegment> {
        let offset = non_negative(offset, "offset")?;
        let len = size_of(size)?;
        let inner = self.inner.at(offset, len).map_err(to_py)?;
        Ok(PyFileSegment {
            inner,
            origin: self.origin.clone(),
        })
    }

    /// Whether `other` is a segment of the same open file (made from this
    /// one, or it from this, with `at`).
    fn same_file(&self, other: &PyFileSegment) -> bool {
        self.inner.same_file(&other.inner)
    }

    /// The file's size now, in bytes (`fstat`).
    fn file_size(&self, py: Python<'_>) -> PyResult<u64> {
        crate::exit::detach(py, || self.inner.file_len()).map_err(to_py)
    }

    fn __repr__(&self) -> String {
        format!(
            "FileSegment({}, offset={}, size={}, writable={})",
            self.origin,
            self.inner.offset(),
            self.inner.len(),
            if self.inner.is_writable() {
                "True"
            } else {
                "False"
            }
        )
    }
}
