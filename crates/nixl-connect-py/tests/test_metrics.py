"""`nixl_connect.Metrics`: what metered connectors count, read back exactly as
OpenMetrics text, as samples, and through `prometheus_client`, on the loopback
backend and on NIXL. The names and labels are the Rust core's
(`descriptor_core::metrics`); every transfer's bytes are checked too."""

import builtins
import uuid

import numpy as np
import pytest

import nixl_connect as nc
from conftest import pattern, run

READ = {"op": "read", "target": "peer"}
WRITE = {"op": "write", "target": "peer"}
READ_SIZES = [4096, 65536, 1]
WRITE_SIZES = [100, 200, 300]


def metered_pair(backend, metrics=None, served=None):
    """Two connectors (passive, active) on `backend`, the active one counting
    into `metrics` and the passive one into `served` (each a new `Metrics`
    when not given)."""
    tag = uuid.uuid4().hex[:8]
    served = served if served is not None else nc.Metrics()
    metrics = metrics if metrics is not None else nc.Metrics()
    return (
        nc.Connector(f"m-passive-{tag}", backend=backend, metrics=served),
        nc.Connector(f"m-active-{tag}", backend=backend, metrics=metrics),
        served,
        metrics,
    )


def value(metrics, name, backend, **labels):
    """The sample `name` of `backend` with `labels`: every series exists from
    the agent's start but a failure reason's, which counts 0 until then."""
    found = metrics.get_sample_value(name, {"backend": backend, **labels})
    if found is None and name == "nixl_connect_transfers_failed_total":
        return 0.0
    assert found is not None, f"no sample {name} {labels} in:\n{metrics.encode_text()}"
    return found


async def reads_and_a_write(passive, active):
    """READs of `READ_SIZES` (one descriptor each) and one WRITE of three
    descriptors of `WRITE_SIZES`, every byte checked; returns nothing."""
    for seed, size in enumerate(READ_SIZES):
        data = pattern(size, seed=seed + 1)
        target = np.zeros(size, dtype=np.uint8)
        readable = await passive.create_readable(nc.Descriptor(data))
        read = await active.begin_read(readable.metadata(), nc.Descriptor((target, "cpu")))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert target.tobytes() == data
    received = [np.zeros(n, dtype=np.uint8) for n in WRITE_SIZES]
    sent = [pattern(n, seed=10 + i) for i, n in enumerate(WRITE_SIZES)]
    writable = await passive.create_writable([nc.Descriptor((r, "cpu")) for r in received])
    write = await active.begin_write([nc.Descriptor(s) for s in sent], writable.metadata())
    await write.wait_for_completion()
    await writable.wait_for_completion()
    assert [r.tobytes() for r in received] == sent


def test_transfers_are_counted_exactly(backend):
    passive, active, served, metrics = metered_pair(backend)
    run(reads_and_a_write(passive, active))

    def count(name, **labels):
        return value(metrics, name, backend, **labels)

    reads, read_bytes = len(READ_SIZES), float(sum(READ_SIZES))
    assert count("nixl_connect_transfers_posted_total", **READ) == reads
    assert count("nixl_connect_transfers_completed_total", **READ) == reads
    assert count("nixl_connect_transfer_posted_bytes_total", **READ) == read_bytes
    assert count("nixl_connect_transfer_completed_bytes_total", **READ) == read_bytes
    assert count("nixl_connect_transfers_posted_total", **WRITE) == 1
    assert count("nixl_connect_transfers_completed_total", **WRITE) == 1
    assert count("nixl_connect_transfer_completed_bytes_total", **WRITE) == sum(WRITE_SIZES)
    # Descriptors per transfer: three READs of one, one WRITE of three (in
    # the bucket of up to 4, not in that of up to 2).
    assert count("nixl_connect_transfer_descriptors_count", **READ) == reads
    assert count("nixl_connect_transfer_descriptors_sum", **READ) == reads
    assert count("nixl_connect_transfer_descriptors_count", **WRITE) == 1
    assert count("nixl_connect_transfer_descriptors_sum", **WRITE) == 3
    assert count("nixl_connect_transfer_descriptors_bucket", le="2.0", **WRITE) == 0
    assert count("nixl_connect_transfer_descriptors_bucket", le="4.0", **WRITE) == 1
    assert count("nixl_connect_transfer_descriptors_bucket", le="+Inf", **WRITE) == 1
    assert count("nixl_connect_transfer_duration_seconds_count", **READ) == reads
    assert count("nixl_connect_transfer_duration_seconds_sum", **READ) > 0
    for direction in (READ, WRITE):
        assert count("nixl_connect_transfers_in_flight", **direction) == 0
        assert count("nixl_connect_transfers_abandoned_total", **direction) == 0
        for reason in ("transfer", "access_denied", "other"):
            assert count("nixl_connect_transfers_failed_total", reason=reason, **direction) == 0
    # Nothing of the active side's transfers is counted in the passive
    # side's metrics, and the other way round: the passive side exposed four
    # times and posted nothing.
    assert value(served, "nixl_connect_transfers_posted_total", backend, **READ) == 0
    assert value(served, "nixl_connect_exposures_total", backend, op="read") == reads
    assert value(served, "nixl_connect_exposures_total", backend, op="write") == 1
    assert value(metrics, "nixl_connect_exposures_total", backend, op="read") == 0


def test_connectors_sharing_metrics_add_up(backend):
    shared = nc.Metrics()
    passive, active, _, _ = metered_pair(backend, metrics=shared, served=shared)
    run(reads_and_a_write(passive, active))
    assert value(shared, "nixl_connect_transfers_completed_total", backend, **READ) == len(READ_SIZES)
    assert value(shared, "nixl_connect_exposures_total", backend, op="read") == len(READ_SIZES)
    # Registrations: each side's descriptors, added up; none left when the
    # operations are gone (the agents may keep some memory registered).
    assert value(shared, "nixl_connect_registrations_total", backend, kind="memory") >= 2 * (
        len(READ_SIZES) + 1
    )
    assert value(shared, "nixl_connect_registration_failures_total", backend, kind="memory") == 0


def test_failed_transfers_are_counted_with_their_reason(backend):
    """A range past what the peer exposed is refused at posting, by the
    loopback and by NIXL (reason ``access_denied``); on loopback, whose fault
    injection sits inside the meter, an injected link failure is what the
    connector sees (``transfer``). Neither moves a byte nor counts as
    completed."""
    passive, active, _, metrics = metered_pair(backend)
    target = bytearray(4096)
    injected = backend == "loopback"

    async def go():
        readable = await passive.create_readable(nc.Descriptor(b"\x01" * 4096))
        if injected:
            active._native_connector()._fail_next_transfer("injected: link down")
            read = await active.begin_read(readable.metadata(), nc.Descriptor(target))
            with pytest.raises(RuntimeError, match="ERRORED"):
                await read.wait_for_completion()
        md = readable.metadata()
        d = md.descriptors[0]
        forged = md.model_copy(
            update={"descriptors": [d.model_copy(update={"ptr": d.ptr + 1})]}
        )
        with pytest.raises(RuntimeError, match="refused"):
            await active.begin_read(forged, nc.Descriptor(target))
        readable.cancel()

    run(go())
    assert bytes(target) == bytes(4096), "a failed transfer moves no byte"

    def count(name, **labels):
        return value(metrics, name, backend, **labels)

    posted = 1 + injected
    assert count("nixl_connect_transfers_posted_total", **READ) == posted
    assert count("nixl_connect_transfer_posted_bytes_total", **READ) == posted * 4096
    assert count("nixl_connect_transfers_failed_total", reason="transfer", **READ) == injected
    assert count("nixl_connect_transfers_failed_total", reason="access_denied", **READ) == 1
    assert count("nixl_connect_transfers_completed_total", **READ) == 0
    assert count("nixl_connect_transfer_completed_bytes_total", **READ) == 0
    assert count("nixl_connect_transfers_in_flight", **READ) == 0
    assert count("nixl_connect_transfers_abandoned_total", **READ) == 0
    failed = [s for s in metrics.samples() if s[0] == "nixl_connect_transfers_failed_total"]
    assert sum(v for _, _, v in failed) == posted


def test_a_cancelled_transfer_is_abandoned_not_in_flight():
    backend = "loopback"
    passive, active, _, metrics = metered_pair(backend)
    target = np.zeros(4096, dtype=np.uint8)

    async def go():
        readable = await passive.create_readable(nc.Descriptor(pattern(4096)))
        active._native_connector()._delay_next_transfer(3600)
        read = await active.begin_read(readable.metadata(), nc.Descriptor((target, "cpu")))
        assert value(metrics, "nixl_connect_transfers_in_flight", backend, **READ) == 1
        read.cancel()
        await read.wait_for_completion()
        assert await read.wait_for_release(timeout=10)
        readable.cancel()

    run(go())
    assert not target.any(), "the delayed copy never ran"
    assert value(metrics, "nixl_connect_transfers_in_flight", backend, **READ) == 0
    assert value(metrics, "nixl_connect_transfers_abandoned_total", backend, **READ) == 1
    assert value(metrics, "nixl_connect_transfers_completed_total", backend, **READ) == 0


def test_the_text_samples_and_families_agree(backend):
    """`samples()` is `encode_text()` parsed, and parses as prometheus_client's
    own OpenMetrics parser does (where it is installed)."""
    passive, active, _, metrics = metered_pair(backend)
    run(reads_and_a_write(passive, active))
    text = metrics.encode_text()
    assert text.endswith("# EOF\n")
    samples = metrics.samples()
    families = metrics.families()
    assert samples == [s for f in families for s in f[4]]
    kinds = {name: kind for name, kind, _, _, _ in families}
    assert kinds["nixl_connect_transfers_posted"] == "counter"
    assert kinds["nixl_connect_transfers_in_flight"] == "gauge"
    assert kinds["nixl_connect_transfer_descriptors"] == "histogram"
    units = {name: unit for name, _, unit, _, _ in families}
    assert units["nixl_connect_transfer_duration_seconds"] == "seconds"
    assert units["nixl_connect_transfer_completed_bytes"] == "bytes"
    assert all(name.startswith("nixl_connect_") for name, _, _ in samples)
    assert {labels["backend"] for _, labels, _ in samples} == {backend}
    # Every sample line of the text is one sample.
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(lines) == len(samples)

    parser = pytest.importorskip("prometheus_client.openmetrics.parser")
    theirs = [
        (s.name, dict(s.labels), s.value)
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    ]
    assert sorted(theirs, key=repr) == sorted(samples, key=repr)


def test_prometheus_client_collects_the_same_figures(backend):
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    passive, active, _, metrics = metered_pair(backend)
    registry = CollectorRegistry()
    metrics.register_prometheus(registry)
    run(reads_and_a_write(passive, active))

    labels = {"backend": backend, **READ}
    read_bytes = float(sum(READ_SIZES))
    expected = {
        ("nixl_connect_transfers_posted_total", ()): len(READ_SIZES),
        ("nixl_connect_transfers_completed_total", ()): len(READ_SIZES),
        ("nixl_connect_transfer_completed_bytes_total", ()): read_bytes,
        ("nixl_connect_transfers_in_flight", ()): 0,
        ("nixl_connect_transfer_descriptors_count", ()): len(READ_SIZES),
        ("nixl_connect_transfer_descriptors_bucket", (("le", "1.0"),)): len(READ_SIZES),
        ("nixl_connect_transfer_duration_seconds_count", ()): len(READ_SIZES),
    }
    for (name, extra), want in expected.items():
        assert registry.get_sample_value(name, {**labels, **dict(extra)}) == want, name
    # Every sample of ours is in the registry, with the same value.
    for name, sample_labels, want in metrics.samples():
        assert registry.get_sample_value(name, sample_labels) == want, (name, sample_labels)

    text = generate_latest(registry).decode()
    line = 'nixl_connect_transfer_completed_bytes_total{backend="%s",op="read",target="peer"} %r'
    assert line % (backend, read_bytes) in text
    assert "# TYPE nixl_connect_transfer_descriptors histogram" in text
    assert "# TYPE nixl_connect_transfers_posted_total counter" in text
    # The figures are read at each collection, not at registration.
    run(reads_and_a_write(passive, active))
    assert registry.get_sample_value(
        "nixl_connect_transfers_completed_total", labels
    ) == 2 * len(READ_SIZES)
    # One Metrics once per registry: twice would duplicate every name.
    with pytest.raises(ValueError):
        metrics.register_prometheus(registry)
    assert prometheus_client is not None


def test_register_prometheus_without_prometheus_client_is_an_import_error(monkeypatch):
    real_import = builtins.__import__

    def no_prometheus(name, *args, **kwargs):
        if name == "prometheus_client" or name.startswith("prometheus_client."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_prometheus)
    metrics = nc.Metrics()
    with pytest.raises(ImportError, match="needs the `prometheus_client` package"):
        metrics.register_prometheus()
    # Everything else works without it.
    assert metrics.encode_text().endswith("# EOF\n")
    assert metrics.samples() == []


def test_metrics_are_opt_in_and_checked():
    plain = nc.Connector(backend="loopback")
    assert plain.metrics is None
    metrics = nc.Metrics()
    assert nc.Connector(backend="loopback", metrics=metrics).metrics is metrics
    with pytest.raises(TypeError, match="metrics"):
        nc.Connector(backend="loopback", metrics="yes")
    with pytest.raises(TypeError):
        nc.Connector(None, "loopback", None, None, None, None, None, metrics)  # keyword only
    # Series appear once an agent exists, at zero.
    assert metrics.samples() == []
    nc.Connector(backend="loopback", metrics=metrics)._native_connector()
    assert metrics.get_sample_value(
        "nixl_connect_transfers_posted_total", {"backend": "loopback", **READ}
    ) == 0
    assert metrics.get_sample_value("nixl_connect_no_such_metric") is None
