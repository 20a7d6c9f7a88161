//! Loading the driver once, and mapping its errors.

use std::sync::OnceLock;

use cudarc::driver::{DriverError, result};
use descriptor_core::Error;

pub(crate) const NAME: &str = "cuda";

/// Whether libcuda loaded and `cuInit` succeeded; checked once per process.
pub(crate) fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        // SAFETY: only tries to dlopen libcuda (running its initialisers, as any
        // CUDA program does); cudarc's own calls panic if it is missing, so
        // this check must come first.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            tracing::debug!("no CUDA driver library");
            return false;
        }
        match result::init() {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "cuInit failed");
                false
            }
        }
    })
}

pub(crate) fn unavailable() -> Error {
    Error::BackendUnavailable {
        backend: NAME,
        reason: "no usable CUDA driver".into(),
        tried: vec!["libcuda.so (cudarc dynamic loading) and cuInit".into()],
        hint: Some("install the NVIDIA driver (it provides libcuda.so)".into()),
    }
}

pub(crate) fn error(context: impl Into<String>, e: DriverError) -> Error {
    Error::backend(NAME, context, e)
}
