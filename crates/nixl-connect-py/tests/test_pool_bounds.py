"""Every integer that crosses from Python into an allocation, an index or a
duration in the native module is checked before it is used: whatever the
value (0, 1, 2**31 ... 2**64 and past, negative, huge or non-finite floats),
a call returns its documented value or raises an `Exception` (never a Rust
panic, whose `PanicException` is a `BaseException`, and never an abort).

Each battery runs in a child process: an abort (a failed allocation) ends a
process, so only a child can show it; the child prints each attempt before
making it, so an abort names the call that made it.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import nixl_connect as nc
from conftest import require_backend

CHILD_TIMEOUT_S = 120

# Boundary, huge and negative integers, and floats of every kind.
VALUES = (
    "0, 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64, 2**70, -1, -(2**63), "
    "1.5, 1e300, float('nan'), float('inf'), -float('inf')"
)

PRELUDE = textwrap.dedent(
    f"""
    import asyncio, sys
    import nixl_connect as nc

    VALUES = [{VALUES}]
    INTS = [v for v in VALUES if isinstance(v, int)]

    def summary(out):
        if out is None or isinstance(out, (bool, int, float, str)):
            return repr(out)
        if isinstance(out, list):
            return f"list[{{len(out)}}]"
        return type(out).__name__

    def attempt(name, value, call):
        print(f"TRY {{name}} {{value!r}}", flush=True)
        try:
            verdict = "ok " + summary(call(value))
        except Exception as e:
            verdict = "exc " + type(e).__name__
        except BaseException as e:  # a Rust panic surfaces as one of these
            verdict = "PANIC " + type(e).__name__ + ": " + str(e)[:100]
        print(f"GOT\t{{name}}\t{{value!r}}\t{{verdict}}", flush=True)
    """
)


def run_child(body: str, backend: str) -> dict:
    """Runs PRELUDE + `body` with `backend` in a child; returns
    {(name, value repr): verdict}, after checking that the child exited 0,
    finished, and that nothing panicked."""
    code = PRELUDE + f"BACKEND = {backend!r}\n" + textwrap.dedent(body) + "\nprint('DONE', flush=True)\n"
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    tried = [line for line in child.stdout.splitlines() if line.startswith("TRY ")]
    last = tried[-1] if tried else "(nothing)"
    assert child.returncode == 0, (
        f"the child died (status {child.returncode}) at {last}:\n{child.stderr[-3000:]}"
    )
    assert child.stdout.rstrip().endswith("DONE"), child.stdout[-2000:] + child.stderr[-2000:]
    verdicts = {}
    for line in child.stdout.splitlines():
        if line.startswith("GOT\t"):
            _, name, value, verdict = line.split("\t")
            verdicts[(name, value)] = verdict
    panics = {k: v for k, v in verdicts.items() if v.startswith("PANIC")}
    assert not panics, panics
    assert verdicts, child.stdout
    if os.environ.get("NIXL_CONNECT_SHOW_VERDICTS"):
        for (name, value), verdict in verdicts.items():
            print(f"{name:40} {value:24} {verdict}")
    return verdicts


def test_a_checkout_of_more_blocks_than_the_pool_has_is_none_however_large():
    # The reproducer's case: 2**40 aborted (an 8 TiB allocation), 2**62
    # panicked (capacity overflow).
    verdicts = run_child(
        """
        pool = nc.BlockPool(bytearray(4 * 64), 64)
        for n in [5, 2**40, 2**62, 2**63 - 1, 2**64, 2**200]:
            attempt("checkout", n, pool.checkout)
            attempt("native.checkout", n, pool._native.checkout)
        attempt("checkout", 4, pool.checkout)
        """,
        "loopback",
    )
    for n in ["5", "1099511627776", "4611686018427387904", "9223372036854775807"]:
        assert verdicts[("checkout", n)] == "ok None", (n, verdicts)
        assert verdicts[("native.checkout", n)] == "ok None", (n, verdicts)
    assert verdicts[("checkout", str(2**64))] == "ok None"
    assert verdicts[("checkout", str(2**200))] == "ok None"
    # Past what a `usize` holds, the native call refuses the integer itself.
    assert verdicts[("native.checkout", str(2**64))] == "exc OverflowError"
    assert verdicts[("checkout", "4")] == "ok list[4]"


def test_no_integer_given_to_a_pool_or_descriptor_aborts_or_panics():
    verdicts = run_child(
        """
        data = bytearray(4 * 64)
        ref = bytearray(64)
        ptr = nc.Descriptor(ref).ptr

        def pool():
            return nc.BlockPool(bytearray(4 * 64), 64)

        for v in VALUES:
            attempt("BlockPool.block_size", v, lambda v: nc.BlockPool(data, v))
            attempt("native.RegisteredMemory.block_size", v, lambda v: nc._native.RegisteredMemory(data, v))
            attempt("checkout", v, lambda v: pool().checkout(v))
            attempt("blocks", v, lambda v: pool().blocks([v]))
            attempt("blocks.second", v, lambda v: pool().blocks([0, v]))
            attempt("pool.descriptor.offset", v, lambda v: pool().descriptor(v, 64))
            attempt("pool.descriptor.size", v, lambda v: pool().descriptor(0, v))
            attempt("memory.descriptor.offset", v, lambda v: nc.RegisteredMemory(bytearray(256)).descriptor(v, 1))
            attempt("memory.descriptor.size", v, lambda v: nc.RegisteredMemory(bytearray(256)).descriptor(0, v))
            attempt("native.view.offset", v, lambda v: nc._native.RegisteredMemory(data).view(v, 1))
            attempt("native.view.size", v, lambda v: nc._native.RegisteredMemory(data).view(1, v))
            attempt("_data_size", v, lambda v: setattr(nc.Descriptor(bytearray(64)), "_data_size", v))
            attempt("part._data_size", v, lambda v: setattr(pool().checkout(1)[0], "_data_size", v))
            attempt("native.set_size", v, lambda v: nc.Descriptor(bytearray(64))._native.set_size(v))
            # Raw parts: the pointer, the size, both wrapping the address space.
            attempt("raw.ptr", v, lambda v: nc.Descriptor((v, 64, "cpu", None)).size)
            attempt("raw.size", v, lambda v: nc.Descriptor((ptr, v, "cpu", ref)).size)
            attempt("raw.pair", v, lambda v: nc.Descriptor((v, v)).size)
            attempt("raw.pool.size", v, lambda v: nc.BlockPool((ptr, v, "cpu", ref), 64).checkout(2**62))
            attempt("raw.memory.size", v, lambda v: nc.RegisteredMemory((ptr, v, "cpu", ref)).descriptor(0, 2**62))
            attempt("device.ordinal", v, lambda v: nc.Descriptor((ptr, 64, f"cuda:{v}", ref)).size)
            attempt("Device", v, lambda v: str(nc.Device(f"cuda:{v}")))
            attempt("SerializedDescriptor.to_descriptor", v,
                    lambda v: nc.SerializedDescriptor(device="cpu", ptr=v, size=v).to_descriptor().size)
        """,
        "loopback",
    )
    # The documented values where there is one.
    for v in ["0", "1", "-1", "-9223372036854775808", "2147483648", str(2**64), str(2**70)]:
        assert verdicts[("checkout", v)] == (
            "exc ValueError" if v.startswith("-") else "ok list[0]" if v == "0"
            else "ok list[1]" if v == "1" else "ok None"
        ), (v, verdicts[("checkout", v)])
    for v in ["1.5", "1e+300", "nan", "inf"]:
        assert verdicts[("checkout", v)] == "exc TypeError"
    for v in ["4", "-1", str(2**64), str(2**70), "9223372036854775807"]:
        if ("blocks", v) in verdicts:
            assert verdicts[("blocks", v)] == "exc ValueError", (v, verdicts[("blocks", v)])
    for name in ("pool.descriptor.offset", "memory.descriptor.size"):
        for v in ["-1", str(2**64), str(2**70), "9223372036854775807"]:
            assert verdicts[(name, v)] == "exc ValueError", (name, v, verdicts[(name, v)])
    assert verdicts[("raw.size", str(2**63))] == "exc ValueError"
    assert verdicts[("raw.size", str(2**64))] == "exc ValueError"
    assert verdicts[("_data_size", str(2**64))] == "exc ValueError"


def test_no_timeout_or_transfer_integer_aborts_or_panics(backend):
    require_backend(backend)
    verdicts = run_child(
        """
        a, b = nc.Connector(backend=BACKEND), nc.Connector(backend=BACKEND)

        async def completed():
            readable = await a.create_readable(nc.Descriptor(bytes(range(64))))
            dst = bytearray(64)
            read = await b.begin_read(readable.metadata(), nc.Descriptor(dst))
            await read.wait_for_completion()
            await readable.wait_for_completion()
            assert bytes(dst) == bytes(range(64))
            return readable, read

        readable, read = asyncio.run(completed())
        pending = asyncio.run(a.create_readable(nc.Descriptor(bytes(64))))
        for v in VALUES:
            attempt("wait.done", v, lambda v: int(read.wait(timeout=v)))
            attempt("wait_for_completion.done", v,
                    lambda v: asyncio.run(read.wait_for_completion(timeout=v)))
            if not (isinstance(v, (int, float)) and v == v and v >= 1):
                # A wait that could end only by its timeout: small or invalid ones.
                attempt("wait.pending", v, lambda v: int(pending.wait(timeout=v)))
                attempt("wait_for_completion.pending", v,
                        lambda v: asyncio.run(pending.wait_for_completion(timeout=v)))
            attempt("Connector.await_spin", v, lambda v: nc.Connector(backend=BACKEND, await_spin=v).await_spin)

            async def remote(v, size=None):
                model = readable.metadata()
                item = nc.SerializedDescriptor(device="cpu", ptr=v, size=v if size is None else size)
                forged = nc.RdmaMetadata(descriptors=[item], nixl_metadata=model.nixl_metadata,
                                         notification_key=model.notification_key,
                                         operation_kind=model.operation_kind)
                op = await b.begin_read(forged, nc.Descriptor(bytearray(64)))
                await op.wait_for_completion(timeout=5)

            if isinstance(v, int) and v > 0:
                attempt("begin_read.remote", v, lambda v: asyncio.run(remote(v)))
                attempt("begin_read.remote_ptr", v, lambda v: asyncio.run(remote(v, 64)))
            attempt("metadata.json", v, lambda v: nc.RdmaMetadata.model_validate_json(
                '{"descriptors":[{"device":"cpu","ptr":%s,"size":%s}],"nixl_metadata":"",'
                '"notification_key":"k","operation_kind":1}' % (v, v)).descriptors[0].size)
        pending.cancel()
        """,
        backend,
    )
    for v in ["nan", "-1", "-inf"]:
        assert verdicts[("wait.pending", v)] == "exc ValueError", (v, verdicts[("wait.pending", v)])
    for v in ["0", "1", str(2**64), str(2**70), "1e+300", "inf"]:
        complete = f"ok {int(nc.OperationStatus.COMPLETE)}"
        assert verdicts[("wait.done", v)] == complete, (v, verdicts[("wait.done", v)])
    for v in ["0", "-1", "nan", "-inf"]:
        assert verdicts[("wait_for_completion.pending", v)] in (
            "exc TimeoutError", "exc ValueError"
        ), (v, verdicts[("wait_for_completion.pending", v)])
    # A forged remote range is refused (never moved): an exception.
    for name in ("begin_read.remote", "begin_read.remote_ptr"):
        for v in ["1", str(2**40), str(2**63), str(2**64), str(2**70)]:
            assert verdicts[(name, v)].startswith("exc "), (name, v, verdicts[(name, v)])
