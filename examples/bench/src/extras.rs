//! Everything but bandwidth: completion wake-up, registration, metadata,
//! idle CPU and memory over many operations.

use std::time::{Duration, Instant};

use backend_loopback::{Fabric, LoopbackBackend};
use backend_nixl::{MetadataScope, NixlBackend};
use descriptor_core::{Connector, Descriptor, RdmaMetadata};
use nixl_sys::{Agent, AgentConfig};

use crate::Latencies;
use crate::movers::{Buf, Res, fill, nixl_connector, peer_failure_detection, raw_ucx_params};

/// Named measurements, in the order printed.
#[derive(Default)]
pub(crate) struct Extras {
    pub(crate) items: Vec<(String, f64, &'static str)>,
}

impl Extras {
    pub(crate) fn add(&mut self, name: impl Into<String>, value: f64, unit: &'static str) {
        let name = name.into();
        eprintln!("bench: {name} = {value:.3} {unit}");
        self.items.push((name, value, unit));
    }
}

fn e(e: descriptor_core::Error) -> String {
    e.to_string()
}

fn loopback_pair(tag: &str) -> Res<(Connector, Connector)> {
    let fabric = Fabric::new();
    let make = |n: String| {
        LoopbackBackend::new(&fabric, &n)
            .map(Connector::new)
            .map_err(e)
    };
    Ok((make(format!("{tag}-p"))?, make(format!("{tag}-a"))?))
}

fn nixl_pair(tag: &str) -> Res<(Connector, Connector)> {
    let make = |n: String| nixl_connector(&n, true);
    Ok((make(format!("{tag}-p"))?, make(format!("{tag}-a"))?))
}

/// One 4 KiB readable -> read round trip, buffers reused.
pub(crate) struct RoundTrip {
    passive: Connector,
    active: Connector,
    src: Vec<Descriptor>,
    dst: Vec<Descriptor>,
}

impl RoundTrip {
    pub(crate) fn new((passive, active): (Connector, Connector), size: usize) -> Res<RoundTrip> {
        Ok(RoundTrip {
            passive,
            active,
            src: vec![Descriptor::new(fill(9, size)).map_err(e)?],
            dst: vec![Descriptor::new(vec![0u8; size]).map_err(e)?],
        })
    }

    /// Returns (post -> active waiter wakes, post -> passive waiter wakes).
    fn once(&mut self) -> Res<(Duration, Duration)> {
        let readable = self
            .passive
            .create_readable(std::mem::take(&mut self.src))
            .map_err(e)?;
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| readable.wait().map(|()| Instant::now()));
            // Let the waiter block first.
            std::thread::sleep(Duration::from_micros(200));
            let posted = Instant::now();
            let read = self
                .active
                .begin_read(readable.metadata(), std::mem::take(&mut self.dst))
                .map_err(e)?;
            read.wait().map_err(e)?;
            let active = posted.elapsed();
            let woke = waiter.join().map_err(|_| "waiter panicked")?.map_err(e)?;
            self.dst = read.into_descriptors().map_err(|_| "not returned")?;
            Ok::<_, String>((active, woke.duration_since(posted)))
        })
        .and_then(|t| {
            self.src = readable.into_descriptors().map_err(|_| "not returned")?;
            Ok(t)
        })
    }

    pub(crate) fn fast(&mut self) -> Res<()> {
        let readable = self
            .passive
            .create_readable(std::mem::take(&mut self.src))
            .map_err(e)?;
        let read = self
            .active
            .begin_read(readable.metadata(), std::mem::take(&mut self.dst))
            .map_err(e)?;
        read.wait().map_err(e)?;
        readable.wait().map_err(e)?;
        self.dst = read.into_descriptors().map_err(|_| "not returned")?;
        self.src = readable.into_descriptors().map_err(|_| "not returned")?;
        Ok(())
    }
}

/// CPU time of the whole process (all threads), in nanoseconds.
fn process_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

pub(crate) fn measure(quick: bool) -> Res<Extras> {
    let mut x = Extras { items: Vec::new() };

    // What the transfer metrics cost, first: before this run's other agents
    // (the cancelled ones below leak theirs) add to the noise.
    crate::metered::measure(&mut x, quick)?;

    // Completion reaching waiters, 4 KiB.
    for (name, pair) in [
        ("loopback", loopback_pair("lat")?),
        ("nixl", nixl_pair("lat")?),
    ] {
        let mut rt = RoundTrip::new(pair, 4096)?;
        rt.once()?;
        let (mut active, mut passive) = (Latencies::new()?, Latencies::new()?);
        for _ in 0..if quick { 200 } else { 1000 } {
            let (a, p) = rt.once()?;
            active.record(a)?;
            passive.record(p)?;
        }
        let (a50, a99) = (active.us(0.5), active.us(0.99));
        let (p50, p99) = (passive.us(0.5), passive.us(0.99));
        x.add(
            format!("{name}: 4 KiB post -> active waiter wakes, p50"),
            a50,
            "us",
        );
        x.add(
            format!("{name}: 4 KiB post -> active waiter wakes, p99"),
            a99,
            "us",
        );
        x.add(
            format!("{name}: 4 KiB post -> passive waiter (other thread) wakes, p50"),
            p50,
            "us",
        );
        x.add(
            format!("{name}: 4 KiB post -> passive waiter (other thread) wakes, p99"),
            p99,
            "us",
        );
    }

    // One thread, back-to-back 4 KiB round trips (two operations each).
    let mut rt = RoundTrip::new(loopback_pair("ops")?, 4096)?;
    let n = if quick { 100_000 } else { 500_000 };
    let started = Instant::now();
    for _ in 0..n {
        rt.fast()?;
    }
    let per = started.elapsed().as_secs_f64() / n as f64;
    x.add(
        "loopback: 4 KiB readable+read round trip, one thread",
        per * 1e6,
        "us",
    );
    x.add(
        "loopback: operations per second, one thread (2 per round trip)",
        2.0 / per,
        "ops/s",
    );

    // Registration of 1,000 regions.
    let regions = 1000;
    let bufs: Vec<Vec<u8>> = (0..regions).map(|_| vec![0u8; 4096]).collect();
    for (name, connector) in [
        ("loopback", loopback_pair("reg")?.0),
        ("nixl", nixl_pair("reg")?.0),
    ] {
        let mut descs: Vec<Descriptor> = bufs
            .iter()
            .map(|b| Descriptor::new(b.clone()))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        let started = Instant::now();
        for d in &mut descs {
            d.register_memory(&connector).map_err(e)?;
        }
        x.add(
            format!("{name}: register 1,000 regions"),
            started.elapsed().as_secs_f64() * 1e3,
            "ms",
        );
    }
    {
        backend_nixl::runtime::load().map_err(e)?;
        let config = AgentConfig {
            enable_prog_thread: false,
            ..AgentConfig::default()
        };
        let agent = Agent::new_configured("raw-reg", &config).map_err(|e| e.to_string())?;
        agent
            .create_backend("UCX", &raw_ucx_params(&agent)?)
            .map_err(|e| e.to_string())?;
        let raw: Vec<Buf> = bufs.iter().map(|b| Buf(b.clone())).collect();
        let started = Instant::now();
        let handles = raw
            .iter()
            .map(|b| agent.register_memory(b, None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        x.add(
            "nixl-sys-raw: register 1,000 regions",
            started.elapsed().as_secs_f64() * 1e3,
            "ms",
        );
        drop(handles);
    }

    // Read-only memory on NIXL is registered as a private copy (a peer may
    // write any registered byte): what registering a `Bytes` costs against
    // a `Vec` of the same size, interleaved, register + deregister each.
    {
        let connector = nixl_pair("ro")?.0;
        for (label, size, rounds) in [
            ("4 KiB", 4usize << 10, if quick { 200 } else { 1000 }),
            ("1 MiB", 1 << 20, if quick { 50 } else { 200 }),
            ("16 MiB", 16 << 20, if quick { 5 } else { 20 }),
        ] {
            let vec = fill(5, size);
            let bytes = bytes::Bytes::from(vec.clone());
            let (mut writable, mut read_only) = (Duration::ZERO, Duration::ZERO);
            for _ in 0..rounds {
                let mut d = Descriptor::new(vec.clone()).map_err(e)?;
                let started = Instant::now();
                d.register_memory(&connector).map_err(e)?;
                drop(d);
                writable += started.elapsed();
                let mut d = Descriptor::from_bytes(bytes.clone()).map_err(e)?;
                let started = Instant::now();
                d.register_memory(&connector).map_err(e)?;
                drop(d);
                read_only += started.elapsed();
            }
            let per = |d: Duration| d.as_secs_f64() * 1e6 / rounds as f64;
            x.add(
                format!("nixl: register+deregister a {label} Vec"),
                per(writable),
                "us",
            );
            x.add(
                format!("nixl: register+deregister a {label} read-only Bytes (private copy)"),
                per(read_only),
                "us",
            );
        }
    }

    // Idle CPU: connectors that did work, then sit idle for a second (one
    // pair at a time: the other is made only after).
    for name in ["loopback", "nixl"] {
        let pair = if name == "loopback" {
            loopback_pair("idle")?
        } else {
            nixl_pair("idle")?
        };
        let mut rt = RoundTrip::new(pair, 4096)?;
        rt.fast()?;
        std::thread::sleep(Duration::from_millis(200));
        let before = process_cpu_ns();
        let started = Instant::now();
        std::thread::sleep(Duration::from_secs(1));
        let used =
            process_cpu_ns().saturating_sub(before) as f64 / started.elapsed().as_nanos() as f64;
        x.add(
            format!("{name}: idle pair of connectors, CPU (whole process)"),
            used * 100.0,
            "% of a core",
        );
    }

    // Memory across many small operations.
    for (name, pair, n) in [
        (
            "loopback",
            loopback_pair("mem")?,
            if quick { 200_000 } else { 1_000_000 },
        ),
        // The count in both modes: 50,000 take about 2 s here.
        ("nixl", nixl_pair("mem")?, 50_000),
    ] {
        let mut rt = RoundTrip::new(pair, 4096)?;
        for _ in 0..n / 10 {
            rt.fast()?;
        }
        let before = test_support::rss_bytes();
        for _ in 0..n {
            rt.fast()?;
        }
        let after = test_support::rss_bytes();
        x.add(
            format!("{name}: RSS before {} more round trips", n),
            before as f64 / 1048576.0,
            "MiB",
        );
        x.add(
            format!("{name}: RSS after {n} round trips"),
            after as f64 / 1048576.0,
            "MiB",
        );
    }
    // Metadata: size and encode+decode, Dynamo's full-agent encoding vs scoped,
    // from an agent that also holds 1,000 unrelated registrations. Last: the
    // readables are cancelled, which on NIXL leaks them and keeps their agents
    // (and NIXL's progress threads) alive, so nothing idle is measured after.
    for scope in [MetadataScope::Agent, MetadataScope::Exposed] {
        let connector = Connector::new(
            NixlBackend::builder(&format!("md-{scope:?}"))
                .peer_failure_detection(peer_failure_detection())
                .metadata_scope(scope)
                .build()
                .map_err(e)?,
        );
        let mut others: Vec<Descriptor> = bufs
            .iter()
            .map(|b| Descriptor::new(b.clone()))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        for d in &mut others {
            d.register_memory(&connector).map_err(e)?;
        }
        for count in [1usize, 64] {
            let descs: Vec<Descriptor> = (0..count)
                .map(|_| Descriptor::new(vec![1u8; 4096]))
                .collect::<Result<_, _>>()
                .map_err(e)?;
            let readable = connector.create_readable(descs).map_err(e)?;
            let reps = 50;
            let started = Instant::now();
            let mut json = String::new();
            for _ in 0..reps {
                json = readable.metadata().to_json();
                let parsed: RdmaMetadata = json.parse().map_err(e)?;
                std::hint::black_box(parsed);
            }
            let label = match scope {
                MetadataScope::Agent => "Dynamo encoding (full agent metadata)",
                MetadataScope::Exposed => "scoped metadata",
            };
            x.add(
                format!("nixl {label}, {count} descriptors: JSON size"),
                json.len() as f64,
                "B",
            );
            x.add(
                format!("nixl {label}, {count} descriptors: encode+decode"),
                started.elapsed().as_secs_f64() * 1e6 / reps as f64,
                "us",
            );
            readable.cancel();
        }
    }

    Ok(x)
}
