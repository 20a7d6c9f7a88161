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
//! # Policy and tuning
//!
//! Which agent posts a transfer and how its notification travels is
//! [`Notifications`] (set with [`NixlBackendBuilder::notifications`]); every
//! timing knob is a field of [`Tuning`] ([`NixlBackendBuilder::tuning`]),
//! each linked to the decision record that measured it.
//!
//! The first transfer between two fresh processes pays for UCX's connection
//! setup, many times a steady transfer's time (measured in
//! docs/decisions/0008-no-proactive-make-connection.md): a one-shot user
//! calls [`Connector::warm_up`](descriptor_core::Connector::warm_up) with the
//! peer's metadata first. A peer that cannot be reached (exited) makes
//! loading its metadata fail with an error that says "peer unreachable
//! (exited?)".
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

//! # Peer metadata
//!
//! A peer's agent blob is read whole and checked against the format NIXL
//! 1.5.1 writes before NIXL sees it ([`load_remote`] refuses anything else
//! with [`Error::InvalidMetadata`](descriptor_core::Error), nothing loaded):
//! NIXL trusts every length in it, nixl-sys panics on a name that is not
//! UTF-8, and UCX unpacks a region's remote key without its length. A blob of
//! the right form that NIXL still refuses in its region section makes NIXL
//! 1.5.1 drop the peer but keep its UCX connection, after which that name can
//! never be loaded again; such a peer (one that re-registered memory at the
//! same address, with a new key, say) is loaded under a new name that only
//! this backend sees, with what NIXL held for it, so that it stays reachable.
//!
//! What is not checked: the contents of a UCX worker address (connection
//! info) and of a UCX transport key, which UCX parses without lengths and
//! trusts. A peer that can hand this backend metadata can crash the process
//! through them (fuzzing did, in UCX's TCP transport), as it can with NIXL
//! itself: load metadata only from peers you would let write your memory.
//!
//! [`load_remote`]: descriptor_core::RegistrationBackend::load_remote

mod agent_metadata;
mod agents;
mod backend;
mod builder;
mod error;
mod exit;
mod memory;
mod peers;
mod route;
pub mod runtime;
mod scope;
mod spans;
mod storage;
mod sync;
mod transfer;
mod tuning;
mod unreachable;
mod watcher;

pub use backend::NixlBackend;
pub use builder::NixlBackendBuilder;
pub use nixl_sys::ThreadSync;
pub use runtime::LogLevel;
pub use scope::MetadataScope;
pub use storage::Storage;
pub use tuning::{Notifications, Tuning};
