//! What the transfer metrics cost (issue 43: at most 2% at 4 KiB): the 4 KiB
//! readable -> read round trip bare and with both sides wrapped in
//! [`Metered`], in batches that take turns on one thread (each batch in a
//! rotated order), so that drift and the other work on the machine hit
//! all alike. A batch's value is its mean round trip; see [`compare`] for
//! the cost and the row's resolution.

use std::time::Instant;

use backend_loopback::{Fabric, LoopbackBackend};
use descriptor_core::Connector;
use descriptor_core::metrics::{Metered, Metrics};

use crate::extras::{Extras, RoundTrip};
use crate::median;
use crate::movers::{Res, nixl_backend};

/// Batches of each side, and round trips per batch.
#[derive(Clone, Copy)]
struct Plan {
    batches: usize,
    round_trips: usize,
}

/// The plan per backend: loopback's as in decision 0016 (200 batches of
/// 5,000 round trips of about 1 us); NIXL's round trip is about 20 times
/// longer, so fewer per batch.
fn plan(backend: &str, quick: bool) -> Plan {
    match (backend, quick) {
        ("loopback", false) => Plan {
            batches: 200,
            round_trips: 5000,
        },
        ("loopback", true) => Plan {
            batches: 100,
            round_trips: 2000,
        },
        (_, false) => Plan {
            batches: 200,
            round_trips: 250,
        },
        (_, true) => Plan {
            batches: 100,
            round_trips: 100,
        },
    }
}

/// The extras' name of one backend's cost.
pub(crate) fn cost_name(backend: &str) -> String {
    format!(
        "{backend}: metrics cost at a 4 KiB round trip (metered / mean of two bare pairs - 1, median of batches)"
    )
}

/// The extras' name of one backend's resolution: one bare pair against
/// the other.
pub(crate) fn twin_name(backend: &str) -> String {
    format!("{backend}: the same, a bare pair against its twin (the row's resolution)")
}

/// Measures loopback, then NIXL, into `x`.
pub(crate) fn measure(x: &mut Extras, quick: bool) -> Res<()> {
    let e = |e: descriptor_core::Error| e.to_string();
    let fabric = Fabric::new();
    let metrics = Metrics::new();
    let loopback = |name: &str| LoopbackBackend::new(&fabric, name).map_err(e);
    let bare = (
        Connector::new(loopback("cost-bare-p")?),
        Connector::new(loopback("cost-bare-a")?),
    );
    let metered = (
        Connector::new(Metered::new(loopback("cost-metered-p")?, &metrics)),
        Connector::new(Metered::new(loopback("cost-metered-a")?, &metrics)),
    );
    let twin = (
        Connector::new(loopback("cost-twin-p")?),
        Connector::new(loopback("cost-twin-a")?),
    );
    compare(x, "loopback", plan("loopback", quick), bare, metered, twin)?;

    let nixl = |name: &str| nixl_backend(name, true);
    let bare = (
        Connector::new(nixl("cost-bare-p")?),
        Connector::new(nixl("cost-bare-a")?),
    );
    let metered = (
        Connector::new(Metered::new(nixl("cost-metered-p")?, &metrics)),
        Connector::new(Metered::new(nixl("cost-metered-a")?, &metrics)),
    );
    let twin = (
        Connector::new(nixl("cost-twin-p")?),
        Connector::new(nixl("cost-twin-a")?),
    );
    compare(x, "nixl", plan("nixl", quick), bare, metered, twin)
}

/// min / p10 / p50 of `values`, in microseconds.
fn spread(values: &[f64]) -> String {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q) as usize];
    format!(
        "{:.3} / {:.3} / {:.3} us",
        at(0.0) * 1e6,
        at(0.1) * 1e6,
        at(0.5) * 1e6
    )
}

/// The median over batches `i` of `a[i] / base[i] - 1`.
fn relative(a: &[f64], base: &[f64]) -> f64 {
    let mut ratios: Vec<f64> = a.iter().zip(base).map(|(a, b)| a / b - 1.0).collect();
    median(&mut ratios)
}

/// Bare, metered, and a second bare pair (the twin) in turns, each batch in
/// a rotated order. Two bare pairs differ by where their buffers and
/// agents lie (on this machine by up to about 1%), so the cost is taken
/// against their mean, and the twin's own difference is reported as the
/// resolution of the row.
fn compare(
    x: &mut Extras,
    backend: &str,
    plan: Plan,
    bare: (Connector, Connector),
    metered: (Connector, Connector),
    twin: (Connector, Connector),
) -> Res<()> {
    let mut sides = [
        RoundTrip::new(bare, 4096)?,
        RoundTrip::new(metered, 4096)?,
        RoundTrip::new(twin, 4096)?,
    ];
    // Seconds per round trip of one batch.
    let batch = |rt: &mut RoundTrip, n: usize| -> Res<f64> {
        let started = Instant::now();
        for _ in 0..n {
            rt.fast()?;
        }
        Ok(started.elapsed().as_secs_f64() / n as f64)
    };
    // Warm-up: peers loaded, connections made, caches and branch
    // predictors trained on every side.
    for side in &mut sides {
        batch(side, plan.round_trips)?;
    }
    let mut times: [Vec<f64>; 3] = Default::default();
    for i in 0..plan.batches {
        for k in 0..3 {
            let side = (i + k) % 3;
            times[side].push(batch(&mut sides[side], plan.round_trips)?);
        }
    }
    let [b, m, t] = &times;
    let both: Vec<f64> = b.iter().zip(t).map(|(b, t)| (b + t) / 2.0).collect();
    let cost = relative(m, &both);
    let twin = relative(t, b);
    eprintln!(
        "bench: {backend} 4 KiB round trip, {} batches of {} (min / p10 / p50 of the batches' means): bare {}, metered {}, bare twin {}; metered {:+.2}% of the bare pairs, twin {:+.2}% of bare",
        plan.batches,
        plan.round_trips,
        spread(b),
        spread(m),
        spread(t),
        cost * 100.0,
        twin * 100.0,
    );
    x.add(
        format!("{backend}: 4 KiB round trip in interleaved batches, bare, p50"),
        median(&mut b.clone()) * 1e6,
        "us",
    );
    x.add(
        format!("{backend}: 4 KiB round trip in interleaved batches, metered (both sides), p50"),
        median(&mut m.clone()) * 1e6,
        "us",
    );
    x.add(cost_name(backend), cost * 100.0, "%");
    x.add(twin_name(backend), twin * 100.0, "%");
    Ok(())
}
