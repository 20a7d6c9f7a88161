//! Criterion micro-benchmarks of the hot paths: the metadata codec, device
//! parsing, registration and a loopback round trip (status polling included),
//! bare and with metrics.
#![allow(missing_docs, clippy::unwrap_used)]

use backend_loopback::{Fabric, LoopbackBackend};
use criterion::{Criterion, criterion_group, criterion_main};
use descriptor_core::metrics::{Metered, Metrics};
use descriptor_core::{
    Connector, Descriptor, Device, OperationKind, RdmaMetadata, SerializedDescriptor,
    decode_agent_metadata, encode_agent_metadata,
};
use std::hint::black_box;

fn metadata(descriptors: usize) -> RdmaMetadata {
    let blob: Vec<u8> = (0..670u32).map(|i| (i * 31 % 251) as u8).collect();
    RdmaMetadata::new(
        OperationKind::Read,
        (0..descriptors as u64)
            .map(|i| SerializedDescriptor {
                device: Device::cuda(0),
                ptr: 0x7f00_0000_0000 + i * 4096,
                size: 4096,
            })
            .collect(),
        blob,
        "0f8fad5b-d9cb-469f-a165-70867728950e".into(),
    )
    .unwrap()
}

fn codec(c: &mut Criterion) {
    for n in [1, 64] {
        let m = metadata(n);
        let json = m.to_json();
        c.bench_function(&format!("metadata/to_json/{n}"), |b| {
            b.iter(|| black_box(&m).to_json())
        });
        c.bench_function(&format!("metadata/from_json/{n}"), |b| {
            b.iter(|| RdmaMetadata::from_json(black_box(&json)).unwrap())
        });
    }
    let blob = vec![7u8; 670];
    let encoded = encode_agent_metadata(&blob);
    // Two blobs in turn: each call compresses (the thread remembers only
    // the last blob it encoded).
    let other = vec![8u8; 670];
    let mut turn = false;
    c.bench_function("metadata/encode_blob_670B", |b| {
        b.iter(|| {
            turn = !turn;
            encode_agent_metadata(black_box(if turn { &blob } else { &other }))
        })
    });
    c.bench_function("metadata/encode_blob_670B_again", |b| {
        b.iter(|| encode_agent_metadata(black_box(&blob)))
    });
    c.bench_function("metadata/decode_blob_670B", |b| {
        b.iter(|| decode_agent_metadata(black_box(&encoded)).unwrap())
    });
    c.bench_function("device/parse", |b| {
        b.iter(|| black_box("cuda:3").parse::<Device>().unwrap())
    });
}

fn loopback(c: &mut Criterion) {
    let fabric = Fabric::new();
    let server = Connector::new(LoopbackBackend::new(&fabric, "server").unwrap());
    let client = Connector::new(LoopbackBackend::new(&fabric, "client").unwrap());
    c.bench_function("loopback/register+deregister", |b| {
        let mut spare = Some(vec![0u8; 4096]);
        b.iter(|| {
            let mut d = Descriptor::new(spare.take().unwrap()).unwrap();
            d.register_memory(&server).unwrap();
            spare = Some(d.into_vec::<u8>().unwrap());
        })
    });
    roundtrip(c, "loopback/4KiB_readable_read_roundtrip", &server, &client);
    // The same over `Metered` on both sides (the `metrics` feature): the
    // cost of the metrics is the difference between the two rows.
    let metrics = Metrics::new();
    let metered = |name| {
        Connector::new(Metered::new(
            LoopbackBackend::new(&fabric, name).unwrap(),
            &metrics,
        ))
    };
    let (server, client) = (metered("metered-server"), metered("metered-client"));
    roundtrip(
        c,
        "loopback/4KiB_readable_read_roundtrip_metered",
        &server,
        &client,
    );
}

/// A 4 KiB readable on `server` READ by `client`, both sides waited for.
fn roundtrip(c: &mut Criterion, name: &str, server: &Connector, client: &Connector) {
    let mut src = vec![Descriptor::new(vec![1u8; 4096]).unwrap()];
    let mut dst = vec![Descriptor::new(vec![0u8; 4096]).unwrap()];
    c.bench_function(name, |b| {
        b.iter(|| {
            let readable = server.create_readable(std::mem::take(&mut src)).unwrap();
            let read = client
                .begin_read(readable.metadata(), std::mem::take(&mut dst))
                .unwrap();
            while !read.status().is_terminal() {}
            readable.wait().unwrap();
            dst = read.into_descriptors().unwrap();
            src = readable.into_descriptors().unwrap();
        })
    });
}

criterion_group!(benches, codec, loopback);
criterion_main!(benches);
