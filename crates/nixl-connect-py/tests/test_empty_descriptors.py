"""Zero-length buffers move as in Dynamo 1.6.1 (issue 46, item 5:
`py_zero_length_descriptor.py`): `Descriptor((np.zeros(0), "cpu"))`, an empty
`bytearray` or `bytes` describe zero bytes, are published with ``size: 0``, and
a READ or WRITE of them completes on both sides, alone or beside full buffers
(whose bytes arrive); a Dynamo peer's size-0 descriptors are read and written,
and Dynamo reads and writes ours, across processes over NIXL.
"""

import asyncio
import hashlib

import numpy as np
import pytest

import nixl_connect as nc
from conftest import pattern, run
from test_interop import exchange, need_dynamo
from worker import pattern as worker_pattern

WAIT_S = 30


async def both_complete(active, passive):
    await asyncio.wait_for(active.wait_for_completion(), WAIT_S)
    await asyncio.wait_for(passive.wait_for_completion(), WAIT_S)
    assert (active.status, passive.status) == (nc.OperationStatus.COMPLETE, nc.OperationStatus.COMPLETE)


def test_a_zero_length_array_is_read_and_both_sides_complete(pair):
    """The reproducer's case."""
    passive, active = pair

    async def main():
        src = nc.Descriptor((np.zeros(0, np.uint8), "cpu"))
        assert src.size == 0
        readable = await passive.create_readable(src)
        md = nc.RdmaMetadata.model_validate_json(readable.metadata().model_dump_json())
        assert [(d.size, d.ptr != 0) for d in md.descriptors] == [(0, True)]
        dst = nc.Descriptor((np.zeros(0, np.uint8), "cpu"))
        read = await active.begin_read(md, dst)
        await both_complete(read, readable)

    run(main())


def test_empty_buffers_beside_full_ones_move_the_full_ones_bytes(pair):
    passive, active = pair
    full = [pattern(4096, 11), pattern(1, 12)]

    async def main():
        # Two `b""` share one address (an interned singleton), as do two
        # empty bytearrays: each is its own descriptor.
        sources = [nc.Descriptor(b""), nc.Descriptor(full[0]), nc.Descriptor(b""),
                   nc.Descriptor((np.zeros(0, np.uint8), "cpu")), nc.Descriptor(full[1])]
        arrays = [bytearray(), np.zeros(4096, np.uint8), bytearray(), np.zeros(0, np.uint8), np.zeros(1, np.uint8)]
        targets = [nc.Descriptor(a) if isinstance(a, bytearray) else nc.Descriptor((a, "cpu")) for a in arrays]
        readable = await passive.create_readable(sources)
        assert [d.size for d in readable.metadata().descriptors] == [0, 4096, 0, 0, 1]
        read = await active.begin_read(readable.metadata(), targets)
        await both_complete(read, readable)
        assert (arrays[1].tobytes(), arrays[4].tobytes()) == (full[0], full[1])
        assert (len(arrays[0]), len(arrays[2]), arrays[3].size) == (0, 0, 0)

        into = [bytearray(), bytearray(4096), np.zeros(0, np.uint8)]
        writable = await passive.create_writable(
            [nc.Descriptor(into[0]), nc.Descriptor(into[1]), nc.Descriptor((into[2], "cpu"))]
        )
        payload = pattern(4096, 13)
        write = await active.begin_write(
            [nc.Descriptor(bytearray()), nc.Descriptor(payload), nc.Descriptor(b"")], writable.metadata()
        )
        await both_complete(write, writable)
        assert bytes(into[1]) == payload
        assert (len(into[0]), into[2].size) == (0, 0)

    run(main())


def test_an_empty_descriptor_pairs_only_with_an_empty_one(pair):
    passive, active = pair

    async def main():
        readable = await passive.create_readable(nc.Descriptor(bytearray()))
        with pytest.raises(ValueError):
            await active.begin_read(readable.metadata(), nc.Descriptor(bytearray(8)))
        readable.cancel()

    run(main())


INTEROP = [("dynamo", "ours"), ("ours", "dynamo")]
SIZES = "0,4096,0,1"


def digests(seed, sizes):
    return [hashlib.sha256(worker_pattern(seed, i, n).tobytes()).hexdigest() for i, n in enumerate(sizes)]


@pytest.mark.parametrize("passive_impl, active_impl", INTEROP, ids=[f"{p}-readable-{a}-reads" for p, a in INTEROP])
def test_empty_buffers_are_read_across_processes_with_dynamo(monkeypatch, passive_impl, active_impl):
    need_dynamo()
    monkeypatch.setenv("PEER_SIZES", SIZES)
    seed = 46
    passive, active = exchange(passive_impl, "readable", active_impl, "read", seed)
    sizes = [int(n) for n in SIZES.split(",")]
    assert active["sha256"] == digests(seed, sizes), "the reader received the readable's bytes"
    assert (active["status"], passive["status"]) == ("DONE", "DONE")


@pytest.mark.parametrize("passive_impl, active_impl", INTEROP, ids=[f"{p}-writable-{a}-writes" for p, a in INTEROP])
def test_empty_buffers_are_written_across_processes_with_dynamo(monkeypatch, passive_impl, active_impl):
    need_dynamo()
    monkeypatch.setenv("PEER_SIZES", SIZES)
    seed = 47
    passive, active = exchange(passive_impl, "writable", active_impl, "write", seed)
    sizes = [int(n) for n in SIZES.split(",")]
    assert passive["sha256"] == digests(seed, sizes), "the writable holds the writer's bytes"
    assert (active["status"], passive["status"]) == ("DONE", "DONE")
