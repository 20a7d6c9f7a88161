//! The NVIDIA NIXL backend for [`descriptor_core`], through `nixl-sys`.
//!
//! `nixl-sys` is built with its `stub-api` feature, so this crate builds on
//! machines without NIXL; the runtime (`libnixl_capi.so`, its plugins and UCX) is
//! located and loaded when the first [`NixlBackend`] is created, and a missing
//! runtime is an [`Error::BackendUnavailable`](descriptor_core::Error) listing
//! every place tried, never a crash. A NIXL installed by pip (`pip install
//! nixl-cu12==1.5.1`, as Dynamo users have) is found with nothing set: see
//! [`runtime::load`] for the search order.
//!
//! ```no_run
//! use backend_nixl::NixlBackend;
//! use descriptor_core::{Connector, Descriptor};
//!
//! let connector = Connector::new(NixlBackend::new("worker-7")?);
//! let readable = connector.create_readable(vec![Descriptor::new(vec![1u8; 4096])?])?;
//! println!("{}", readable.metadata()); // hand this JSON to the peer
//! readable.wait()?;
//! # Ok::<(), descriptor_core::Error>(())
//! ```
//!
//! # What NIXL enforces
//!
//! NIXL checks remote ranges against the peer metadata the *initiator* loaded,
//! so it stops honest mistakes, not a hostile peer; on shared-memory and TCP
//! transports nothing below NIXL enforces them either (RDMA NICs enforce keys in
//! hardware). Deregistering memory does not revoke a peer that loaded it earlier.
//! This backend therefore reports `revocation_enforced() == false`, and the
//! connector never frees memory a peer that was given its metadata might still
//! write: a passive operation dropped before its peer finished leaks its buffers.

mod backend;
mod progress;
pub mod runtime;

pub use backend::{MetadataScope, NixlBackend, NixlBackendBuilder};
pub use nixl_sys::ThreadSync;
pub use runtime::LogLevel;
