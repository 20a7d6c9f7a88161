"""No operation reports DONE while bytes of another operation can still land
in its memory (soundness round 4, item 2).

A cancelled transfer that the backend cannot abort keeps writing until it
drains. A new `Descriptor` over the same memory is therefore not lent to
another operation meanwhile: the Connector's coroutines wait for the drain
(bounded), Dynamo's synchronous operation constructors raise
`_native.MemoryBusy` (a ValueError), and `wait_for_release()` waits for the
drain itself. On loopback a delayed transfer stands in for NIXL's drain; the
NIXL case is the reproducer's (UCX over TCP, a 512 MB READ cancelled in
flight), across processes.
"""

import asyncio
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import nixl_connect as nc
from nixl_connect import _native

from conftest import require_backend, run

SIZE = 1 << 16


async def _readable(peer, fill):
    src = np.full(SIZE, fill, np.uint8)
    return src, await peer.create_readable(nc.Descriptor((src, "cpu")))


def test_a_new_descriptor_over_memory_a_cancelled_read_still_drains_into_waits_for_it():
    async def main():
        peer = nc.Connector("drain-peer", backend="loopback")
        me = nc.Connector("drain-me", backend="loopback")
        _, ra = await _readable(peer, 0xAB)
        _, rb = await _readable(peer, 0xCD)
        out = np.zeros(SIZE, np.uint8)
        me._native_connector()._drain_next_transfer(3.0)
        a = await me.begin_read(ra.metadata(), nc.Descriptor((out, "cpu")))
        a.cancel()
        await a.wait_for_completion()  # returns at once after cancel, as Dynamo's
        assert a.status == nc.OperationStatus.CANCELLED
        # The synchronous constructor cannot wait: it refuses, naming why.
        conn = await me._create_connection()
        with pytest.raises(_native.MemoryBusy, match="still being written by an earlier operation"):
            nc.ReadOperation(conn, rb.metadata(), nc.Descriptor((out, "cpu")))
        # The coroutine waits for the drain, then reads.
        b = await me.begin_read(rb.metadata(), nc.Descriptor((out, "cpu")))
        await b.wait_for_completion()
        assert await a.wait_for_release(timeout=0)
        assert b.status == nc.OperationStatus.COMPLETE
        assert int(np.count_nonzero(out != 0xCD)) == 0
        ra.cancel()

    run(main())


def test_wait_for_release_waits_for_the_drain_and_says_false_on_timeout():
    async def main():
        peer = nc.Connector("release-peer", backend="loopback")
        me = nc.Connector("release-me", backend="loopback")
        _, ra = await _readable(peer, 0x11)
        out = np.zeros(SIZE, np.uint8)
        me._native_connector()._drain_next_transfer(1.0)
        a = await me.begin_read(ra.metadata(), nc.Descriptor((out, "cpu")))
        assert not await a.wait_for_release(timeout=0), "in flight: not released"
        a.cancel()
        assert await a.wait_for_release(timeout=30)
        # Released: the memory is free for any operation at once.
        _, rb = await _readable(peer, 0x22)
        conn = await me._create_connection()
        b = nc.ReadOperation(conn, rb.metadata(), nc.Descriptor((out, "cpu")))
        await b.wait_for_completion()
        assert int(np.count_nonzero(out != 0x22)) == 0
        ra.cancel()

    run(main())


def test_memory_only_read_is_lent_to_many_operations_at_once():
    async def main():
        peer = nc.Connector("ro-peer", backend="loopback")
        me = nc.Connector("ro-me", backend="loopback")
        src = np.full(SIZE, 0x5A, np.uint8)
        # One array exposed twice, read twice: nothing writes it, nothing waits.
        r1 = await peer.create_readable(nc.Descriptor((src, "cpu")))
        r2 = await peer.create_readable(nc.Descriptor((src, "cpu")))
        outs = [np.zeros(SIZE, np.uint8) for _ in range(2)]
        for r, out in zip((r1, r2), outs):
            read = await me.begin_read(r.metadata(), nc.Descriptor((out, "cpu")))
            await read.wait_for_completion()
        assert all(int(np.count_nonzero(o != 0x5A)) == 0 for o in outs)

    run(main())


def test_random_cancels_over_reused_memory_never_leave_foreign_bytes():
    """The generator: rounds of READs into one array through fresh
    Descriptors, each from a peer readable of its own fill, some delayed and
    cancelled at random points; every READ that reports DONE holds its own
    fill in every byte."""
    rng = random.Random(46)

    async def main():
        peer = nc.Connector("gen-peer", backend="loopback")
        me = nc.Connector("gen-me", backend="loopback")
        out = np.zeros(SIZE, np.uint8)
        done = 0
        for round_ in range(40):
            fill = 1 + round_ % 250
            _, readable = await _readable(peer, fill)
            hold = rng.random()
            if hold < 0.4:
                me._native_connector()._drain_next_transfer(rng.choice([0.0, 0.01, 0.05, 0.2]))
            elif hold < 0.6:
                me._native_connector()._delay_next_transfer(rng.choice([0.0, 0.01, 0.05]))
            op = await me.begin_read(readable.metadata(), nc.Descriptor((out, "cpu")))
            if rng.random() < 0.5:
                await asyncio.sleep(rng.choice([0, 0, 0.005, 0.03]))
                op.cancel()
            await op.wait_for_completion()
            if op.status == nc.OperationStatus.COMPLETE:
                done += 1
                foreign = int(np.count_nonzero(out != fill))
                assert foreign == 0, f"round {round_}: {foreign} bytes are not this READ's"
            readable.cancel()
        assert done > 0

    run(main(), timeout=120)


def test_nixl_cancelled_read_drains_before_a_new_descriptor_reads(tmp_path):
    """The reproducer's case on NIXL, across processes: a 512 MB READ over
    UCX/TCP cancelled in flight, then a READ of another peer into the same
    array through a new Descriptor: every byte is the second peer's."""
    require_backend("nixl")
    script = os.path.join(os.path.dirname(__file__), "scripts", "cancel_drain_foreign_bytes.py")
    env = dict(os.environ, UCX_TLS="tcp,self")
    p = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "bytes that are not B's: 0 of" in p.stdout


def test_nixl_retrying_a_dead_peer_keeps_file_descriptors_bounded():
    """1,000 failed READs of one exited peer's metadata (soundness round 4,
    item 3): the peer's connection info is remembered as unreachable, so the
    retries leave no socket behind (2 per retry before)."""
    require_backend("nixl")
    script = os.path.join(os.path.dirname(__file__), "scripts", "fd_leak_dead_peer_retry.py")
    p = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "over 1000 failed attempts" in p.stdout


@pytest.mark.parametrize("backend_name", ["loopback", "nixl"])
def test_a_bytes_object_never_changes_whatever_a_peer_writes(backend_name):
    """A `bytes` exposed for reading, its metadata re-kinded to WRITE by the
    peer (soundness round 4, item 4): loopback refuses the WRITE; NIXL lets it
    land in the private copy registered in the object's place."""
    require_backend(backend_name)

    async def main():
        a = nc.Connector(f"ro-a-{backend_name}", backend=backend_name)
        b = nc.Connector(f"ro-b-{backend_name}", backend=backend_name)
        data = bytes(range(256)) * 16
        readable = await a.create_readable(nc.Descriptor(data))
        honest = bytearray(len(data))
        read = await b.begin_read(readable.metadata(), nc.Descriptor(honest))
        await read.wait_for_completion()
        assert bytes(honest) == data
        forged = readable.metadata().model_copy(update={"operation_kind": 2})
        forged = nc.RdmaMetadata.model_validate_json(forged.model_dump_json())
        try:
            w = await b.begin_write(nc.Descriptor(bytearray([0xEE]) * len(data)), forged)
            await w.wait_for_completion()
        except (RuntimeError, ValueError):
            pass  # refused: the backend enforces access
        assert data == bytes(range(256)) * 16
        readable.cancel()

    run(main())
