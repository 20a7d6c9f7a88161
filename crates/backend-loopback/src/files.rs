//! Storage transfers on loopback: the files registered with an agent, and
//! moving blocks between them and host memory with `pread`/`pwrite`, in
//! `post` (like its memory copies), so that offload code runs and is tested
//! without NIXL.

use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use descriptor_core::{
    Error, FileSpan, OperationKind, RegionId, Result, TransferRequest, TransferState,
};

use crate::backend::LocalRegions;
use crate::fabric::{IdMap, lock, next_id};

const NAME: &str = "loopback";

/// The files registered with one agent: descriptor and writability, by id.
#[derive(Default)]
pub(crate) struct Files(Mutex<IdMap<RegionId, (RawFd, bool)>>);

impl Files {
    pub(crate) fn insert(&self, fd: RawFd, writable: bool) -> RegionId {
        let id = RegionId(next_id());
        lock(&self.0).insert(id, (fd, writable));
        id
    }

    /// Whether `id` was a file's registration (now ended).
    pub(crate) fn remove(&self, id: RegionId) -> bool {
        lock(&self.0).remove(&id).is_some()
    }

    /// Checks a storage request against what was registered: every local
    /// segment inside its region (writable if READ into), every span a
    /// registered file's, under the descriptor it was registered with,
    /// writable if written, as long as its local partner.
    pub(crate) fn plan<'r>(
        &self,
        request: &'r TransferRequest<'r>,
        spans: &'r [FileSpan],
        regions: &LocalRegions,
        agent: &str,
    ) -> Result<FileJob<'r>> {
        let context = || format!("{:?} of {} file segments", request.op, spans.len());
        crate::backend::check_counts(request, spans.len(), context)?;
        let files = lock(&self.0);
        let mut last = None;
        for (index, ((local, span), region)) in request
            .local
            .iter()
            .zip(spans)
            .zip(request.local_regions)
            .enumerate()
        {
            regions.check(&mut last, index, local, *region, request.op, context, agent)?;
            if local.len != span.len {
                return Err(Error::SizeMismatch {
                    index,
                    local: local.len,
                    remote: span.len,
                });
            }
            match files.get(&span.region) {
                Some(&(fd, _)) if fd != span.fd => {
                    return Err(Error::backend(
                        NAME,
                        context(),
                        format!(
                            "file segment {index} names descriptor {} but file {} was registered as {fd}",
                            span.fd, span.region.0
                        ),
                    ));
                }
                Some(&(_, false)) if request.op == OperationKind::Write => {
                    return Err(Error::ReadOnlyFile { index });
                }
                Some(_) if span.end().is_none_or(|end| end > i64::MAX as u64) => {
                    return Err(Error::InvalidFile(format!(
                        "file segment {index} ends past the largest file offset"
                    )));
                }
                Some(_) => {}
                None => {
                    return Err(Error::backend(
                        NAME,
                        context(),
                        format!(
                            "file segment {index}: file {} is not registered",
                            span.region.0
                        ),
                    ));
                }
            }
        }
        Ok(FileJob { request })
    }
}

/// A checked storage request, ready to run.
pub(crate) struct FileJob<'r> {
    request: &'r TransferRequest<'r>,
}

impl FileJob<'_> {
    /// Moves every run with one `pread`/`pwrite` loop; the first error (a
    /// short READ past the end of a file, ENOSPC, EIO) fails the transfer,
    /// with the bytes moved before it in place.
    pub(crate) fn run(self) -> TransferState {
        for run in self.request.file_runs() {
            // The descriptor is the registered file's, open until its
            // registration ends (the registration's contract): borrowed
            // here, never closed.
            // SAFETY: `run.remote.fd` is open for the whole call (above);
            // `ManuallyDrop` keeps the `File` from closing it.
            let file = ManuallyDrop::new(unsafe { File::from_raw_fd(run.remote.fd) });
            let (ptr, len) = (run.local.addr, run.local.len);
            let moved = match self.request.op {
                OperationKind::Write => {
                    // SAFETY: the run's local bytes are its pairs', each
                    // inside a region registered with this agent (checked in
                    // `plan`), valid and untouched by anything else until
                    // `release` lets go of the transfer (`post`'s contract),
                    // which cannot happen before `post`, which runs this,
                    // returns.
                    let src = unsafe {
                        std::slice::from_raw_parts(
                            std::ptr::with_exposed_provenance::<u8>(ptr),
                            len,
                        )
                    };
                    file.write_all_at(src, run.remote.offset)
                }
                OperationKind::Read => {
                    // SAFETY: as above, and the regions are writable (`plan`).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            std::ptr::with_exposed_provenance_mut::<u8>(ptr),
                            len,
                        )
                    };
                    file.read_exact_at(dst, run.remote.offset)
                }
            };
            if let Err(e) = moved {
                let verb = match self.request.op {
                    OperationKind::Write => "write",
                    OperationKind::Read => "read",
                };
                let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    "the file ends before the segment does".to_owned()
                } else {
                    e.to_string()
                };
                return TransferState::failed(format!(
                    "{verb} of {len} bytes at offset {} of file segment {} (descriptor {}): {why}",
                    run.remote.offset, run.first, run.remote.fd
                ));
            }
        }
        TransferState::Done
    }
}
