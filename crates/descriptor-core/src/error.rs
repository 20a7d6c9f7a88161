//! The one error type of this crate and of every backend.

use std::sync::Arc;
use std::time::Duration;

use crate::device::DeviceKind;
use crate::metadata::OperationKind;

/// Which side of a transfer a descriptor belongs to, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Descriptors owned by this process.
    Local,
    /// Descriptors named by a peer's [`RdmaMetadata`](crate::RdmaMetadata).
    Remote,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Remote => "remote",
        })
    }
}

/// Everything that can go wrong, in this crate and in every backend.
///
/// Backends map their own failures into [`Error::Backend`] (or a more specific
/// variant) so that callers match on one type whatever backend they chose.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device string such as `"cuda:1"` could not be parsed.
    #[error("invalid device {input:?}: {reason}")]
    InvalidDevice {
        /// The rejected input (truncated to 64 characters).
        input: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A descriptor could not be built from the given memory.
    #[error("invalid descriptor: {0}")]
    InvalidDescriptor(String),

    /// A descriptor is already registered with another connector.
    #[error("descriptor is registered with connector {registered:?}, not {requested:?}")]
    RegisteredElsewhere {
        /// Name of the connector that holds the registration.
        registered: String,
        /// Name of the connector that was asked to register it.
        requested: String,
    },

    /// [`RdmaMetadata`](crate::RdmaMetadata) failed validation or decoding.
    #[error("invalid RDMA metadata: {field}: {reason}")]
    InvalidMetadata {
        /// The offending field (`"descriptors[3].ptr"`, `"nixl_metadata"`, ...).
        field: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An operation was given no descriptors.
    #[error("{side} descriptor list is empty")]
    EmptyDescriptorList {
        /// The empty side.
        side: Side,
    },

    /// The peer's metadata is for the other kind of operation.
    #[error(
        "the metadata is a {}'s (operation_kind {}), but this call needs a {}'s: a readable pairs with begin_read, a writable with begin_write",
        passive(*found),
        *found as u8,
        passive(*expected)
    )]
    OperationKindMismatch {
        /// The kind the call needs (`Read` for `begin_read`, `Write` for `begin_write`).
        expected: OperationKind,
        /// The kind the metadata carries.
        found: OperationKind,
    },

    /// Local and remote descriptor lists differ in length.
    #[error(
        "{local} local descriptors cannot pair with {remote} remote descriptors (pairs are one to one, as in Dynamo)"
    )]
    DescriptorCountMismatch {
        /// Number of local descriptors.
        local: usize,
        /// Number of remote descriptors.
        remote: usize,
    },

    /// A local descriptor and its remote partner differ in size.
    #[error(
        "descriptor {index}: local size {local} bytes != remote size {remote} bytes (paired descriptors must be the same size)"
    )]
    SizeMismatch {
        /// Position in both lists.
        index: usize,
        /// Local size in bytes.
        local: usize,
        /// Remote size in bytes.
        remote: usize,
    },

    /// A local descriptor cannot hold what its remote partner holds
    /// ([`Connector::begin_read_fit`](crate::Connector::begin_read_fit)).
    #[error(
        "descriptor {index}: the remote descriptor's {remote} bytes do not fit the local descriptor's capacity of {capacity} bytes"
    )]
    CapacityTooSmall {
        /// Position in both lists.
        index: usize,
        /// The local descriptor's capacity in bytes.
        capacity: usize,
        /// The remote descriptor's size in bytes.
        remote: usize,
    },

    /// One side mixes device kinds (e.g. host and CUDA memory).
    #[error("{side} descriptor {index} is {found} memory but descriptor 0 is {expected} memory")]
    MixedDevices {
        /// The side with mixed devices.
        side: Side,
        /// First descriptor whose device kind differs.
        index: usize,
        /// Device kind of descriptor 0.
        expected: DeviceKind,
        /// Device kind found at `index`.
        found: DeviceKind,
    },

    /// A read-only buffer (such as `bytes::Bytes`) was offered where data must be written.
    #[error("local descriptor {index} is read-only but the operation writes into it")]
    ReadOnlyBuffer {
        /// Position of the read-only descriptor.
        index: usize,
    },

    /// A file cannot be a [`FileSegment`](crate::FileSegment): it cannot be
    /// opened or inspected, is not a regular file, or the range does not fit.
    #[error("invalid file segment: {0}")]
    InvalidFile(String),

    /// A file opened read-only was offered where blocks must be written.
    #[error("file segment {index} is of a file opened read-only but the operation writes into it")]
    ReadOnlyFile {
        /// Position of the segment.
        index: usize,
    },

    /// A READ of a file segment that ends past the file's end.
    #[error("file segment {index} ends at byte {end}, past the end of its file ({file_len} bytes)")]
    PastEndOfFile {
        /// Position of the segment.
        index: usize,
        /// One past the segment's last byte.
        end: u64,
        /// The file's size when the READ was begun.
        file_len: u64,
    },

    /// A segment of a file opened with `O_DIRECT`, or the memory paired
    /// with it, is not aligned as the file system needs for direct I/O
    /// ([`FileSegment::direct_io_alignment`](crate::FileSegment::direct_io_alignment)).
    #[error(
        "file segment {index} is of a file opened with O_DIRECT, which needs its {what} ({value}) to be a multiple of {align} bytes"
    )]
    UnalignedDirectIo {
        /// Position of the segment.
        index: usize,
        /// `"offset"`, `"length"` or `"memory address"`.
        what: &'static str,
        /// The value that is not aligned.
        value: u64,
        /// The alignment the file needs.
        align: u64,
    },

    /// The backend cannot do what was asked (device memory on loopback, ...).
    #[error("{backend} backend does not support {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// What was asked.
        what: String,
    },

    /// The backend runtime is missing (e.g. `libnixl_capi.so` not found).
    #[error(
        "{backend} backend is unavailable: {reason}; tried: {}{}",
        tried.join(", "),
        hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default()
    )]
    BackendUnavailable {
        /// Backend name.
        backend: &'static str,
        /// Why it is unavailable.
        reason: String,
        /// Every location or option tried.
        tried: Vec<String>,
        /// What fixes it, as one command or setting, when there is one.
        hint: Option<String>,
    },

    /// The peer named in metadata is unknown, gone, or refused access to a region.
    #[error("{backend} backend: access to peer {peer:?} refused: {reason}")]
    AccessDenied {
        /// Backend name.
        backend: &'static str,
        /// The peer agent.
        peer: String,
        /// What was refused and why.
        reason: String,
    },

    /// Any other backend failure, with the context it happened in and the
    /// backend's own error as its source.
    #[error("{backend} backend: {context} failed: {source}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What the library was doing (`"register"`, `"post READ to worker-2"`, ...).
        context: String,
        /// The backend's own error (a NIXL status, a message).
        #[source]
        source: Cause,
    },

    /// A transfer was posted but ended in failure; the source is the
    /// backend's reason, shared by every waiter of the operation.
    #[error("transfer failed: {source}")]
    TransferFailed {
        /// Why, as the backend reported it.
        #[source]
        source: SharedCause,
    },

    /// A future that already resolved was polled again.
    #[error("the operation's future was polled after it resolved")]
    PolledAfterCompletion,

    /// The operation was cancelled (explicitly or by being dropped).
    #[error("operation was cancelled")]
    Cancelled,

    /// A wait gave up before the operation finished; the operation goes on.
    #[error("operation did not finish within {0:?}")]
    TimedOut(Duration),

    /// A peer's agent blob was refused before the backend saw it: it is not
    /// sealed with a key this connector accepts ([`PeerKeys`](crate::PeerKeys)),
    /// or this connector cannot seal or open blobs (its keys' setting is
    /// invalid).
    #[error("agent blob refused: {reason}")]
    Unauthenticated {
        /// Why.
        reason: String,
    },

    /// A setting (an environment variable, an option) has a value that
    /// cannot be used.
    #[error("{setting}={value:?}: {reason}")]
    InvalidSetting {
        /// The setting's name (`NIXL_CONNECT_QUARANTINE_SECONDS`, ...).
        setting: String,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The passive operation that publishes metadata of this kind.
fn passive(kind: OperationKind) -> &'static str {
    match kind {
        OperationKind::Read => "readable",
        OperationKind::Write => "writable",
    }
}

/// A backend's own error, kept as the source of an [`Error`].
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A [`Cause`] that several receivers share (every waiter of a failed
/// operation gets it).
pub type SharedCause = Arc<dyn std::error::Error + Send + Sync + 'static>;

impl Error {
    /// A [`Error::Backend`] from a backend's own error (or a message).
    #[cold]
    pub fn backend(
        backend: &'static str,
        context: impl Into<String>,
        source: impl Into<Cause>,
    ) -> Error {
        Error::Backend {
            backend,
            context: context.into(),
            source: source.into(),
        }
    }

    /// An [`Error::InvalidMetadata`]: `field` names the offending part of the
    /// document (`"descriptors[3].ptr"`), `reason` says what is wrong with it.
    ///
    /// ```
    /// # use descriptor_core::Error;
    /// let error = Error::invalid_metadata("operation_kind", "3 is neither 1 (read) nor 2 (write)");
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid RDMA metadata: operation_kind: 3 is neither 1 (read) nor 2 (write)"
    /// );
    /// ```
    #[cold]
    pub fn invalid_metadata(field: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::InvalidMetadata {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
