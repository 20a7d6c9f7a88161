//! The storage tier on NIXL: which plugin moves blocks between memory and
//! files ([`Storage`], the one place that policy lives), the files
//! registered with it, and posting storage transfers.
//!
//! NIXL's POSIX plugin moves between local DRAM and `FILE_SEG` only, with
//! the posting agent itself as the "remote" (a loopback transfer); a
//! `FILE_SEG` descriptor is the file's descriptor as device id and offsets
//! as addresses. The plugin is created on the agent that posts this
//! connector's transfers when the agent is made, so that every region
//! registered afterwards is registered with it too (NIXL picks, per
//! transfer, a plugin holding both sides). Why AIO by default:
//! docs/decisions/0015-storage-tier.md.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::Mutex;

use descriptor_core::{DeviceKind, Error, FileSpan, OperationKind, Result, TransferRequest};
use nixl_sys::{Agent, MemType, RegistrationHandle, XferDescList};

use crate::error::{NAME, nixl_error};
use crate::memory::{Range, mem_of};
use crate::sync::lock;

/// Which NIXL plugin, if any, moves blocks to and from files
/// ([`NixlBackendBuilder::storage`](crate::NixlBackendBuilder::storage)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Storage {
    /// NIXL's POSIX plugin over Linux AIO (the default: as fast as io_uring
    /// from the page cache at 64 KiB blocks or more, faster below, and not
    /// blocked by container seccomp profiles; decision 0015).
    #[default]
    PosixAio,
    /// NIXL's POSIX plugin over io_uring (`use_uring=true`); where io_uring
    /// cannot be set up (Docker's default seccomp profile blocks it), AIO,
    /// with a warning in the log.
    PosixUring,
    /// No storage plugin: storage transfers are
    /// [`Error::Unsupported`].
    Off,
}

/// The storage plugin an agent runs, or why none.
#[derive(Debug)]
pub(crate) enum StorageState {
    /// Runs with these settings (`PosixAio` after a fallback).
    On(Storage),
    /// Off, or its creation failed: the reason, for the error.
    Unavailable(String),
}

impl StorageState {
    /// Creates the plugin `wanted` on `agent` (the one that posts).
    pub(crate) fn create(agent: &Agent, wanted: Storage) -> StorageState {
        let uring = match wanted {
            Storage::Off => {
                return StorageState::Unavailable("the builder turned storage off".into());
            }
            Storage::PosixAio => false,
            Storage::PosixUring => true,
        };
        match posix(agent, uring) {
            Ok(()) => StorageState::On(wanted),
            Err(error) if uring => {
                tracing::warn!(%error, "io_uring cannot be set up for NIXL's POSIX plugin: using AIO");
                match posix(agent, false) {
                    Ok(()) => StorageState::On(Storage::PosixAio),
                    Err(error) => StorageState::Unavailable(error.to_string()),
                }
            }
            Err(error) => {
                tracing::warn!(%error, "NIXL's POSIX plugin cannot be created: no storage transfers");
                StorageState::Unavailable(error.to_string())
            }
        }
    }

    fn check(&self) -> Result<()> {
        match self {
            StorageState::On(_) => Ok(()),
            StorageState::Unavailable(reason) => Err(Error::Unsupported {
                backend: NAME,
                what: format!("storage transfers here ({reason})"),
            }),
        }
    }
}

fn posix(agent: &Agent, uring: bool) -> Result<()> {
    let (_mems, mut params) = agent
        .get_plugin_params("POSIX")
        .map_err(|e| nixl_error("load the POSIX plugin", e))?;
    params
        .set("use_uring", if uring { "true" } else { "false" })
        .map_err(|e| nixl_error("set the POSIX plugin's use_uring", e))?;
    agent
        .create_backend("POSIX", &params)
        .map(drop)
        .map_err(|e| nixl_error("create the POSIX backend", e))
}

/// The I/Os NIXL 1.5.1's POSIX plugin submits when a transfer is posted
/// (its queue's depth, `MAX_OUTSTANDING_IOS`); the rest go out as polls of
/// the transfer reap completed ones.
pub(crate) const POSIX_IOS_AT_POST: usize = 64;

/// Files registered with the posting agent, by region id.
#[derive(Default)]
pub(crate) struct Files(Mutex<HashMap<u64, File>>);

struct File {
    fd: RawFd,
    writable: bool,
    /// Opened with `O_DIRECT`: never read through the page cache.
    direct: bool,
    // Dropping the handle deregisters the file.
    _handle: RegistrationHandle,
}

/// A file registration covers every offset a segment may have
/// (`FileSegment` bounds segments by `off_t`).
const WHOLE_FILE: usize = i64::MAX as usize;

impl Files {
    /// Registers `fd` with `agent` as region `id`.
    pub(crate) fn register(
        &self,
        state: &StorageState,
        agent: &Agent,
        id: u64,
        fd: BorrowedFd<'_>,
        writable: bool,
    ) -> Result<()> {
        state.check()?;
        let fd = fd.as_raw_fd();
        let range = Range {
            addr: 0,
            len: WHOLE_FILE,
            mem: MemType::File,
            device: u64::try_from(fd)
                .map_err(|_| Error::InvalidFile(format!("descriptor {fd}")))?,
        };
        // SAFETY: F_GETFL reads the flags of a descriptor the caller keeps
        // open (`register_file`'s contract) and touches no memory.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        let direct = flags < 0 || flags & libc::O_DIRECT != 0;
        let handle = agent
            .register_memory(&range, None)
            .map_err(|e| nixl_error(format!("register file descriptor {fd}"), e))?;
        lock(&self.0).insert(
            id,
            File {
                fd,
                writable,
                direct,
                _handle: handle,
            },
        );
        Ok(())
    }

    /// Whether `id` was a file's registration (now ended).
    pub(crate) fn remove(&self, id: u64) -> bool {
        lock(&self.0).remove(&id).is_some()
    }

    pub(crate) fn clear(&self) {
        lock(&self.0).clear();
    }

    /// The local and file transfer lists of a storage request, one
    /// descriptor per run ([`TransferRequest::file_runs`]), after checking
    /// every span against the registered files. (A READ past a file's end,
    /// or of a file truncated while it runs, NIXL's POSIX plugin fails
    /// itself: "an io completed short".)
    pub(crate) fn lists(
        &self,
        state: &StorageState,
        request: &TransferRequest<'_>,
        spans: &[FileSpan],
    ) -> Result<(XferDescList<'static>, XferDescList<'static>)> {
        self.check(state, request, spans)?;
        let (mem, _) = mem_of(request.local[0].device)?;
        let mut local =
            XferDescList::new(mem).map_err(|e| nixl_error("create a transfer list", e))?;
        let mut files = XferDescList::new(MemType::File)
            .map_err(|e| nixl_error("create a transfer list", e))?;
        for run in request.file_runs() {
            local.add_desc(run.local.addr, run.local.len, mem_of(run.local.device)?.1);
            let offset = usize::try_from(run.remote.offset)
                .map_err(|_| Error::InvalidFile(format!("offset {}", run.remote.offset)))?;
            // The descriptor was checked non-negative at registration.
            files.add_desc(offset, run.remote.len, run.remote.fd as u64);
        }
        Ok((local, files))
    }

    /// A storage request's spans against the registered files; true if
    /// every file goes through the page cache (none is `O_DIRECT`).
    fn check(
        &self,
        state: &StorageState,
        request: &TransferRequest<'_>,
        spans: &[FileSpan],
    ) -> Result<bool> {
        state.check()?;
        let context = || format!("{:?} of {} file segments", request.op, spans.len());
        if spans.len() != request.local.len() || spans.is_empty() {
            return Err(Error::backend(
                NAME,
                context(),
                format!(
                    "{} local segments for {} file segments",
                    request.local.len(),
                    spans.len()
                ),
            ));
        }
        let mut cached = true;
        {
            let files = lock(&self.0);
            for (index, (span, local)) in spans.iter().zip(request.local).enumerate() {
                let file = files
                    .get(&span.region.0)
                    .filter(|f| f.fd == span.fd)
                    .ok_or_else(|| {
                        Error::backend(
                            NAME,
                            context(),
                            format!(
                                "file segment {index}: descriptor {} is not registered as file {}",
                                span.fd, span.region.0
                            ),
                        )
                    })?;
                if request.op == OperationKind::Write && !file.writable {
                    return Err(Error::ReadOnlyFile { index });
                }
                cached &= !file.direct;
                if local.len != span.len {
                    return Err(Error::SizeMismatch {
                        index,
                        local: local.len,
                        remote: span.len,
                    });
                }
            }
        }
        Ok(cached)
    }

    /// Whether `request` is an `op` between host memory and files that all
    /// go through the page cache (none `O_DIRECT`), its spans checked: what
    /// [`Files::read_cached`] and [`Files::write_buffered`] serve at post.
    fn through_page_cache(
        &self,
        state: &StorageState,
        request: &TransferRequest<'_>,
        spans: &[FileSpan],
        op: OperationKind,
    ) -> Result<bool> {
        let host = request
            .local
            .iter()
            .all(|l| l.device.kind() == DeviceKind::Host);
        Ok(request.op == op && host && self.check(state, request, spans)?)
    }

    /// A READ of host memory from files that go through the page cache,
    /// served at once from cached pages (`preadv2` with `RWF_NOWAIT`, which
    /// never waits for the disk): true if every byte was; false if any run
    /// was not cached whole (or any call failed), and the request then goes
    /// to NIXL whole, which writes every byte again.
    ///
    /// # Safety
    ///
    /// [`RegistrationBackend::post`]'s: the request's local memory is
    /// writable and the backend's alone until the transfer is let go.
    ///
    /// [`RegistrationBackend::post`]: descriptor_core::RegistrationBackend::post
    pub(crate) unsafe fn read_cached(
        &self,
        state: &StorageState,
        request: &TransferRequest<'_>,
        spans: &[FileSpan],
    ) -> Result<bool> {
        if !self.through_page_cache(state, request, spans, OperationKind::Read)? {
            return Ok(false);
        }
        for run in request.file_runs() {
            let Ok(offset) = libc::off_t::try_from(run.remote.offset) else {
                return Ok(false);
            };
            let iov = libc::iovec {
                iov_base: std::ptr::with_exposed_provenance_mut::<u8>(run.local.addr).cast(),
                iov_len: run.local.len,
            };
            // SAFETY: the run's memory is host memory of registered local
            // regions, writable and untouched by anything else until the
            // transfer is let go (our caller's contract); its descriptor is
            // registered (checked above), so open.
            let read = unsafe { libc::preadv2(run.remote.fd, &iov, 1, offset, libc::RWF_NOWAIT) };
            if usize::try_from(read).ok() != Some(run.local.len) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A WRITE of host memory into files that go through the page cache,
    /// made at once with `pwrite`, when the plugin is NIXL's over AIO: true
    /// if every byte was written. Linux AIO writes a buffered file inside
    /// `io_submit`, so NIXL's post of such a WRITE returns only once the
    /// bytes are in the page cache too (measured: a 64 MiB WRITE's post took
    /// all of its 12 ms); this takes the same time, less NIXL's own. False
    /// if the request does not qualify (an `O_DIRECT` file, device memory,
    /// io_uring, which writes asynchronously) or any call failed (ENOSPC,
    /// EIO): the request then goes to NIXL whole, which writes every byte
    /// again and reports the failure. Each byte of the file is old or new
    /// whatever happens, as through NIXL.
    ///
    /// # Safety
    ///
    /// [`RegistrationBackend::post`]'s: the request's local memory is
    /// readable and unchanged until the transfer is let go.
    ///
    /// [`RegistrationBackend::post`]: descriptor_core::RegistrationBackend::post
    pub(crate) unsafe fn write_buffered(
        &self,
        state: &StorageState,
        request: &TransferRequest<'_>,
        spans: &[FileSpan],
    ) -> Result<bool> {
        let aio = matches!(state, StorageState::On(Storage::PosixAio));
        if !aio || !self.through_page_cache(state, request, spans, OperationKind::Write)? {
            return Ok(false);
        }
        for run in request.file_runs() {
            let Ok(mut offset) = libc::off_t::try_from(run.remote.offset) else {
                return Ok(false);
            };
            let mut from = run.local.addr;
            let mut left = run.local.len;
            while left > 0 {
                // SAFETY: the run's memory is host memory of registered
                // local regions, readable and unchanged until the transfer
                // is let go (our caller's contract); its descriptor is
                // registered (checked above), so open.
                let wrote = unsafe {
                    libc::pwrite(
                        run.remote.fd,
                        std::ptr::with_exposed_provenance::<u8>(from).cast(),
                        left,
                        offset,
                    )
                };
                if wrote < 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Ok(false);
                }
                let (Ok(n), Ok(advance)) = (usize::try_from(wrote), libc::off_t::try_from(wrote))
                else {
                    return Ok(false);
                };
                if n == 0 {
                    return Ok(false);
                }
                from += n;
                left -= n;
                offset += advance;
            }
        }
        Ok(true)
    }
}
