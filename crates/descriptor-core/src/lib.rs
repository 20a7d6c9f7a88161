//! Dynamo's `nixl_connect` API for Rust: register memory, describe it to a peer,
//! and let the peer READ or WRITE it, over a pluggable transport.
//!
//! - [`Descriptor`]: an owned view of memory on one [`Device`]: a buffer of
//!   its own, or part of memory registered once ([`BlockPool`],
//!   [`RegisteredMemory`]).
//! - [`Connector`]: creates the four operations over a [`RegistrationBackend`].
//! - [`ReadableOperation`] / [`WritableOperation`]: expose memory and publish
//!   [`RdmaMetadata`] (Dynamo's wire format) for a peer.
//! - [`ReadOperation`] / [`WriteOperation`]: READ from / WRITE to a peer's
//!   exposed memory, given its metadata.
//!
//! # KV caches: register once, move blocks
//!
//! Register each side's arena once as a [`BlockPool`] and move blocks by
//! index: operations over its views register nothing, neighbouring blocks go
//! to the backend as one descriptor, and blocks go back to the pool when
//! their descriptors drop. The code is the same over every backend.
//!
//! ```
//! use std::num::NonZeroUsize;
//! use descriptor_core::{BlockPool, Connector, RdmaMetadata};
//!
//! fn move_blocks(prefill: &Connector, decode: &Connector) -> descriptor_core::Result<()> {
//!     let block = NonZeroUsize::new(64 << 10).expect("not zero");
//!     let kv_prefill = BlockPool::new(prefill, vec![0u8; 256 << 16], block)?;
//!     let kv_decode = BlockPool::new(decode, vec![0u8; 256 << 16], block)?;
//!
//!     // One request: prefill exposes its blocks 3, 4, 5 and 9 ...
//!     let readable = prefill.create_readable(kv_prefill.checkout_blocks(&[3, 4, 5, 9])?)?;
//!     let wire: String = readable.metadata().to_json();
//!
//!     // ... and decode READs them into four free blocks of its own.
//!     let remote: RdmaMetadata = wire.parse()?;
//!     let read = decode.begin_read(&remote, kv_decode.checkout(4).expect("free blocks"))?;
//!     read.wait()?;
//!     readable.wait()?;
//!     let blocks = read.into_descriptors().expect("complete");
//!     assert_eq!(blocks.len(), 4);
//!     assert_eq!(decode.registrations(), 1); // the pool's, however many requests
//!     Ok(())
//! }
//! ```
//!
//! To read a peer's descriptor into a larger view (a prefix of a pooled
//! buffer), see [`Connector::begin_read_fit`] and [`Descriptor::set_size`].
//!
//! # Quickstart: one buffer per operation
//!
//! A server exposes a block and publishes its metadata; a client READs it.
//! The code is the same over every backend: only the constructor of the
//! [`Connector`]s changes (`backend_loopback::LoopbackBackend` in one
//! process, whose crate docs run such an exchange, or
//! `backend_nixl::NixlBackend` across processes and hosts).
//!
//! ```
//! use descriptor_core::{Connector, Descriptor, RdmaMetadata};
//!
//! fn exchange(server: &Connector, client: &Connector) -> descriptor_core::Result<()> {
//!     // The server exposes a block for reading and publishes the metadata.
//!     let block = Descriptor::new(vec![42u8; 1 << 20])?;
//!     let readable = server.create_readable(vec![block])?;
//!     let wire: String = readable.metadata().to_json();
//!
//!     // The client READs it into its own buffer.
//!     let remote: RdmaMetadata = wire.parse()?;
//!     let read = client.begin_read(&remote, vec![Descriptor::new(vec![0u8; 1 << 20])?])?;
//!     read.wait()?;
//!     readable.wait()?; // the client's notification arrived
//!
//!     let local = read.into_descriptors().expect("complete").remove(0);
//!     assert!(local.into_vec::<u8>().expect("a Vec<u8>").iter().all(|&b| b == 42));
//!     Ok(())
//! }
//! ```
//!
//! # Safety model
//!
//! A peer reads and writes registered memory behind the compiler's back, so
//! operations take descriptors (and their buffers) by value and hand them back
//! only when no transfer can touch them any more. Dropping an unfinished
//! operation cancels it; `mem::forget` leaks; neither lets safe code free memory
//! a transfer may still use. Descriptors that share a registration are
//! disjoint views, each owned by one operation or by safe code; the
//! registration ends after the last of them (and the last pool handle) is
//! gone, and only then is the memory released. See
//! [`RegistrationBackend::revocation_enforced`] for what a backend can and
//! cannot promise about peers.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod auth;
mod backend;
mod buffer;
mod connector;
mod descriptor;
mod device;
mod engine;
mod error;
mod file;
mod metadata;
mod operation;
mod pool;
mod probe;
mod quarantine;
mod reach;
mod region;
mod remote;
mod runs;
mod sync;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
#[cfg(feature = "faults")]
#[cfg_attr(docsrs, doc(cfg(feature = "faults")))]
pub mod faults;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;

pub use auth::{ENV_PEER_KEYS, MIN_KEY_BYTES, PeerKeys, SEALED_MAGIC, is_sealed};
pub use backend::{
    EventHook, Exposed, Exposure, ExposureId, FileSpan, Notification, PeerTarget, Posted, RegionId,
    RegistrationBackend, Release, Segment, Target, TransferId, TransferRequest, TransferState,
};
pub use buffer::{MemoryBuffer, RawMemory};
pub use connector::{Connector, ConnectorBuilder};
pub use descriptor::Descriptor;
pub use device::{Device, DeviceKind};
pub use error::{Cause, Error, Result, SharedCause, Side};
pub use file::{DirectIoAlignment, FileSegment};
pub use metadata::{
    MAX_AGENT_METADATA_BYTES, MAX_DESCRIPTORS, MAX_JSON_BYTES, MAX_NOTIFICATION_KEY_LEN,
    OperationKind, RdmaMetadata, SerializedDescriptor, check_descriptor_count, check_json_len,
    decode_agent_metadata, decode_agent_metadata_cached, encode_agent_metadata,
};
pub use operation::{
    Completion, OperationFuture, OperationStatus, ReadOperation, ReadableOperation,
    WritableOperation, WriteOperation,
};
pub use pool::{BlockPool, RegisteredMemory};
pub use probe::{DeviceInfo, DeviceProbe};
pub use quarantine::{
    ENV_QUARANTINE_READABLE_BYTES, ENV_QUARANTINE_SECONDS, QuarantinePolicy, Quarantined,
};
pub use remote::DEFAULT_MAX_IDLE_PEERS;
pub use runs::{Run, Runs};
