//! The errors this backend makes: each names the backend ([`NAME`]) and
//! what it was doing.

use descriptor_core::Error;
use nixl_sys::NixlError;

use crate::agent_metadata;

/// The backend's name, in every error it returns.
pub(crate) const NAME: &str = "nixl";

/// NIXL refused `context`.
#[cold]
pub(crate) fn nixl_error(context: impl Into<String>, error: NixlError) -> Error {
    Error::backend(NAME, context, error)
}

/// A peer's agent blob that is not in the form NIXL 1.5.1 writes.
pub(crate) fn malformed(error: agent_metadata::Malformed) -> Error {
    Error::InvalidMetadata {
        field: "nixl_metadata".into(),
        reason: error.to_string(),
    }
}
