//! An in-process backend for [`descriptor_core`]: every program and test that
//! uses the connector API runs on a laptop with no GPU, no NIC and no NIXL.
//!
//! Agents join a [`Fabric`] (an explicit one, or [`Fabric::global`]); a transfer
//! is a real `memcpy` between host buffers, made only after checking every range
//! against what both agents registered and exposed. To fail or delay transfers, drop
//! notifications or make an agent vanish, wrap the backend in
//! `descriptor_core::faults::Faulty` (feature `faults`).
//!
//! ```
//! use backend_loopback::{Fabric, LoopbackBackend};
//! use descriptor_core::{Connector, Descriptor};
//!
//! let fabric = Fabric::new();
//! let target = Connector::new(LoopbackBackend::new(&fabric, "target")?);
//! let source = Connector::new(LoopbackBackend::new(&fabric, "source")?);
//!
//! let writable = target.create_writable(vec![Descriptor::new(vec![0u8; 4096])?])?;
//! let write = source.begin_write(vec![Descriptor::new(vec![5u8; 4096])?], writable.metadata())?;
//! write.wait()?;
//! writable.wait()?;
//! let received = writable.into_descriptors().expect("complete").remove(0);
//! assert_eq!(received.as_slice(), Some(&[5u8; 4096][..]));
//! # Ok::<(), descriptor_core::Error>(())
//! ```

mod backend;
mod blob;
mod fabric;
mod files;

pub use backend::LoopbackBackend;
pub use fabric::Fabric;

/// The workspace README's Rust examples, compiled and run as doc tests here
/// (they use this backend, and descriptor-core cannot depend on it).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
