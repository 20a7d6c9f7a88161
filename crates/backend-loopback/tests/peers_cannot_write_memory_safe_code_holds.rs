//! With safe code only, a peer cannot write memory that safe code holds,
//! whatever metadata it forges (the review's defect 2 in issue "Hardening"):
//! `Connector::backend()` handed safe code the raw backend, whose `expose` let
//! a peer write into a descriptor that no operation owned, under a live
//! `&mut [u8]`. The accessor is gone and `RegistrationBackend::expose` is
//! `unsafe` (the compiler now refuses the reviewer's exploit: see the
//! `compile_fail` example on `RegistrationBackend`). Loopback only: it needs
//! a backend that checks every access against what was exposed (NIXL does
//! not: `backend-nixl/tests/forged.rs` pins down what it accepts).
#![allow(clippy::unwrap_used, clippy::panic)]

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::conformance::{filled, forge, zeroed_one};
use descriptor_core::{
    Connector, Descriptor, Device, Error, OperationKind, RdmaMetadata, SerializedDescriptor,
};

#[test]
fn safe_code_cannot_expose_memory_it_still_holds() {
    let fabric = Fabric::new();
    let server = Connector::new(LoopbackBackend::new(&fabric, "server").unwrap());
    let client = Connector::new(LoopbackBackend::new(&fabric, "client").unwrap());

    let mut held = Descriptor::new(vec![0u8; 64]).unwrap();
    held.register_memory(&server).unwrap(); // safe, public
    let ptr = held.ptr() as u64;

    // Every safe way to make the server publish metadata: its operations.
    // Forge each one's metadata to name the held descriptor instead.
    let writable = server.create_writable(zeroed_one(64)).unwrap();
    let readable = server.create_readable(filled(1, 64)).unwrap();
    let target = vec![SerializedDescriptor {
        device: Device::HOST,
        ptr,
        size: 64,
    }];
    let forged: Vec<RdmaMetadata> = [writable.metadata(), readable.metadata()]
        .into_iter()
        .map(|m| forge(m, OperationKind::Write, target.clone()))
        .collect();

    let slice: &mut [u8] = held.as_mut_slice().unwrap();
    slice[0] = 1;
    for meta in &forged {
        // A peer writes while safe code holds `&mut` to the same bytes: refused.
        match client.begin_write(filled(5, 64), meta) {
            Err(Error::AccessDenied { .. }) => {}
            other => panic!("a peer was let at held memory: {other:?}"),
        }
    }
    let seen = slice[0]; // no unsafe anywhere in this test
    assert_eq!(
        seen, 1,
        "memory behind a live &mut [u8] was overwritten by a peer"
    );
    assert!(held.as_slice().unwrap()[1..].iter().all(|&b| b == 0));
}
