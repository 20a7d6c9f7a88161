//! What the transfer metrics cost (issue 43: at most 2% at 4 KiB): the 4 KiB
//! readable -> read round trip bare and with both sides wrapped in
//! [`Metered`], in batches that take turns on one thread (bare first in
//! even batches, metered first in odd ones), so that drift and the other
//! work on the machine hit both alike. A batch's value is its mean round
//! trip; the cost is the median over the batch pairs of metered / bare - 1.

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

/// The extras' names of one backend's rows.
pub(crate) fn cost_name(backend: &str) -> String {
    format!(
        "{backend}: metrics cost at a 4 KiB round trip (metered / bare - 1, median of batch pairs)"
    )
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
    compare(x, "loopback", plan("loopback", quick), bare, metered)?;

    let nixl = |name: &str| nixl_backend(name, true);
    let bare = (
        Connector::new(nixl("cost-bare-p")?),
        Connector::new(nixl("cost-bare-a")?),
    );
    let metered = (
        Connector::new(Metered::new(nixl("cost-metered-p")?, &metrics)),
        Connector::new(Metered::new(nixl("cost-metered-a")?, &metrics)),
    );
    compare(x, "nixl", plan("nixl", quick), bare, metered)
}

/// min / p10 / p50 of `values`, in microseconds.
fn spread(values: &mut [f64]) -> String {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q) as usize];
    format!(
        "{:.3} / {:.3} / {:.3} us",
        at(0.0) * 1e6,
        at(0.1) * 1e6,
        at(0.5) * 1e6
    )
}

fn compare(
    x: &mut Extras,
    backend: &str,
    plan: Plan,
    bare: (Connector, Connector),
    metered: (Connector, Connector),
) -> Res<()> {
    let mut bare = RoundTrip::new(bare, 4096)?;
    let mut metered = RoundTrip::new(metered, 4096)?;
    // Seconds per round trip of one batch.
    let batch = |rt: &mut RoundTrip, n: usize| -> Res<f64> {
        let started = Instant::now();
        for _ in 0..n {
            rt.fast()?;
        }
        Ok(started.elapsed().as_secs_f64() / n as f64)
    };
    // Warm-up: peers loaded, connections made, caches and branch
    // predictors trained on both sides.
    batch(&mut bare, plan.round_trips)?;
    batch(&mut metered, plan.round_trips)?;
    let (mut b, mut m) = (Vec::new(), Vec::new());
    for i in 0..plan.batches {
        if i % 2 == 0 {
            b.push(batch(&mut bare, plan.round_trips)?);
            m.push(batch(&mut metered, plan.round_trips)?);
        } else {
            m.push(batch(&mut metered, plan.round_trips)?);
            b.push(batch(&mut bare, plan.round_trips)?);
        }
    }
    let mut ratios: Vec<f64> = m.iter().zip(&b).map(|(m, b)| m / b - 1.0).collect();
    let cost = median(&mut ratios);
    let (mut bs, mut ms) = (b.clone(), m.clone());
    let (bare_p50, metered_p50) = (median(&mut bs), median(&mut ms));
    eprintln!(
        "bench: {backend} 4 KiB round trip, {} batches of {} (min / p10 / p50 of the batches' means): bare {}, metered {}",
        plan.batches,
        plan.round_trips,
        spread(&mut b),
        spread(&mut m),
    );
    x.add(
        format!("{backend}: 4 KiB round trip in interleaved batches, bare, p50"),
        bare_p50 * 1e6,
        "us",
    );
    x.add(
        format!("{backend}: 4 KiB round trip in interleaved batches, metered (both sides), p50"),
        metered_p50 * 1e6,
        "us",
    );
    x.add(cost_name(backend), cost * 100.0, "%");
    Ok(())
}
