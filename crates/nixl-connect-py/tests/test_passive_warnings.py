"""A passive operation dropped before it ended, or still unfinished at
interpreter exit, says so on the `nixl_connect` logger: its peer's transfer
had not finished."""

import gc
import logging
import subprocess
import sys
import textwrap

import nixl_connect as nc
from conftest import pattern, run


def warnings_of(caplog):
    return [
        r for r in caplog.records
        if r.name == "nixl_connect" and r.levelno == logging.WARNING
    ]


def test_a_readable_dropped_before_its_peer_read_it_warns(caplog):
    c = nc.Connector("dropper", backend="loopback")

    async def expose():
        return await c.create_readable(nc.Descriptor(pattern(4096)))

    readable = run(expose())
    caplog.set_level(logging.WARNING, logger="nixl_connect")
    del readable
    gc.collect()
    [record] = warnings_of(caplog)
    assert record.getMessage() == (
        "ReadableOperation of connector 'dropper' (1 descriptor, 4096 bytes) dropped while "
        "INITIALIZED: its peer's READ had not finished and may fail. Keep the operation until "
        "`await op.wait_for_completion()` returns, or cancel() it."
    )


def test_a_writable_dropped_unfinished_names_its_descriptors_and_the_write(caplog):
    c = nc.Connector("dropper-w", backend="loopback")

    async def expose():
        return await c.create_writable([nc.Descriptor(bytearray(100)), nc.Descriptor(bytearray(28))])

    writable = run(expose())
    caplog.set_level(logging.WARNING, logger="nixl_connect")
    del writable
    gc.collect()
    [record] = warnings_of(caplog)
    assert record.getMessage().startswith(
        "WritableOperation of connector 'dropper-w' (2 descriptors, 128 bytes) dropped while "
        "INITIALIZED: its peer's WRITE had not finished"
    )


def test_finished_or_cancelled_passive_operations_drop_silently(caplog, pair):
    passive, active = pair
    data = pattern(4096, seed=3)

    async def go():
        done = await passive.create_readable(nc.Descriptor(data))
        read = await active.begin_read(done.metadata(), nc.Descriptor(bytearray(4096)))
        await read.wait_for_completion()
        await done.wait_for_completion()
        cancelled = await passive.create_writable(nc.Descriptor(bytearray(64)))
        cancelled.cancel()
        with await passive.create_readable(nc.Descriptor(data)):
            pass  # the context manager cancels it
        return done, cancelled

    ops = run(go())
    caplog.set_level(logging.WARNING, logger="nixl_connect")
    del ops
    gc.collect()
    assert warnings_of(caplog) == []


def test_a_passive_operation_unfinished_at_exit_warns():
    script = """
        import asyncio, logging
        import nixl_connect as nc
        logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")

        async def main():
            c = nc.Connector("at-exit", backend="loopback")
            return await c.create_readable(nc.Descriptor(b"x" * 64))

        kept = asyncio.run(main())  # still referenced when the interpreter exits
    """
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == 0, child.stderr
    warnings = [line for line in child.stderr.splitlines() if line.startswith("nixl_connect WARNING")]
    assert warnings == [
        "nixl_connect WARNING ReadableOperation of connector 'at-exit' (1 descriptor, 64 bytes) "
        "left unfinished at interpreter exit while INITIALIZED: its peer's READ had not finished "
        "and may fail. Keep the operation until `await op.wait_for_completion()` returns, or "
        "cancel() it."
    ], child.stderr
