"""The whole API moving bytes, on the loopback backend and on NIXL, for every
descriptor form that can be tested without a GPU. Every test checks the bytes."""

import asyncio
import threading

import numpy as np
import pytest

import nixl_connect as nc
from conftest import SOURCES, TARGETS, pattern, run

SIZE = 64 * 1024


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("target", ["numpy", "bytearray"])
def test_read_moves_the_readables_bytes(pair, source, target):
    passive, active = pair
    data = pattern(SIZE, seed=len(source))
    src, _, keep_src = SOURCES[source](data, False)
    dst, read_back, keep_dst = TARGETS[target](bytes(SIZE), True)

    async def go():
        readable = await passive.create_readable(src)
        assert readable.status == nc.OperationStatus.INITIALIZED
        read = await active.begin_read(readable.metadata(), dst)
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert read.status == nc.OperationStatus.COMPLETE
        assert readable.status == nc.OperationStatus.COMPLETE
        assert read.results() == [dst]

    run(go())
    assert read_back() == data
    del keep_src, keep_dst


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("source", ["bytes", "numpy"])
def test_write_lands_in_the_writable(pair, source, target):
    passive, active = pair
    data = pattern(SIZE, seed=7 + len(target))
    dst, read_back, keep_dst = TARGETS[target](bytes(SIZE), True)
    src, _, keep_src = SOURCES[source](data, False)

    async def go():
        writable = await passive.create_writable(dst)
        write = await active.begin_write(src, writable.metadata())
        await write.wait_for_completion()
        await writable.wait_for_completion()
        assert write.status == nc.OperationStatus.COMPLETE
        assert writable.status == nc.OperationStatus.COMPLETE

    run(go())
    assert read_back() == data
    del keep_src, keep_dst


def test_several_descriptors_pair_index_by_index(pair):
    passive, active = pair
    sizes = [4096, 65536, 1 << 20]
    blocks = [np.frombuffer(pattern(n, seed=i), dtype=np.uint8).copy() for i, n in enumerate(sizes)]
    targets = [np.zeros(n, dtype=np.uint8) for n in sizes]

    async def go():
        readable = await passive.create_readable([nc.Descriptor((b, "cpu")) for b in blocks])
        assert len(readable.metadata().descriptors) == 3
        read = await active.begin_read(
            readable.metadata(), [nc.Descriptor((t, "cpu")) for t in targets]
        )
        await read.wait_for_completion()
        await readable.wait_for_completion()

    run(go())
    for b, t in zip(blocks, targets):
        assert np.array_equal(b, t)


def test_descriptors_are_reused_across_operations(pair):
    passive, active = pair
    src = np.zeros(4096, dtype=np.uint8)
    dst = np.zeros(4096, dtype=np.uint8)
    d_src, d_dst = nc.Descriptor((src, "cpu")), nc.Descriptor((dst, "cpu"))

    async def go():
        for i in range(20):
            src[:] = i
            readable = await passive.create_readable(d_src)
            read = await active.begin_read(readable.metadata(), d_dst)
            await read.wait_for_completion()
            await readable.wait_for_completion()
            assert (dst == i).all(), i
            # Given back after the wait, still registered: no re-registration.
            assert d_src.is_registered and d_dst.is_registered

    run(go())


def test_metadata_survives_json_both_encodings(pair):
    passive, active = pair
    data = pattern(8192, seed=3)
    for hex_encode in (False, True):
        dst = bytearray(8192)

        async def go():
            readable = await passive.create_readable(nc.Descriptor(data))
            metadata = readable.metadata(hex_encode=hex_encode)
            assert metadata.nixl_metadata.startswith("b64:") != hex_encode
            wire = metadata.model_dump_json()
            received = nc.RdmaMetadata.model_validate_json(wire)
            assert received == metadata
            assert received.operation_kind == nc.OperationKind.READ
            assert received.descriptors[0].size == 8192
            read = await active.begin_read(received, nc.Descriptor(dst))
            await read.wait_for_completion()
            await readable.wait_for_completion()

        run(go())
        assert bytes(dst) == data


def test_many_concurrent_operations_complete_in_one_event_loop(pair):
    passive, active = pair
    n = 16
    blocks = [pattern(4096, seed=100 + i) for i in range(n)]
    targets = [bytearray(4096) for _ in range(n)]

    async def one(i):
        readable = await passive.create_readable(nc.Descriptor(blocks[i]))
        read = await active.begin_read(readable.metadata(), nc.Descriptor(targets[i]))
        await asyncio.gather(read.wait_for_completion(), readable.wait_for_completion())

    async def go():
        await asyncio.gather(*(one(i) for i in range(n)))

    run(go())
    assert [bytes(t) for t in targets] == blocks


def test_blocking_wait_in_threads_releases_the_gil(pair):
    passive, active = pair
    data = pattern(65536, seed=9)
    dst = bytearray(65536)
    seen = {}

    async def go():
        writable = await passive.create_writable(nc.Descriptor(dst))
        # Another Python thread blocks in wait() (GIL released) while this one
        # runs the writer: a waiter holding the GIL would deadlock here.
        waiter = threading.Thread(target=lambda: seen.setdefault("s", writable.wait(timeout=30)))
        waiter.start()
        write = await active.begin_write(nc.Descriptor(data), writable.metadata())
        assert write.wait(timeout=30) == nc.OperationStatus.COMPLETE
        await asyncio.get_running_loop().run_in_executor(None, waiter.join, 30)
        assert not waiter.is_alive()

    run(go())
    assert seen["s"] == nc.OperationStatus.COMPLETE
    assert bytes(dst) == data


def test_operations_are_context_managers(pair):
    passive, active = pair
    data = pattern(4096, seed=11)
    dst = np.zeros(4096, dtype=np.uint8)

    async def go():
        with await passive.create_readable(nc.Descriptor(data)) as readable:
            with await active.begin_read(readable.metadata(), nc.Descriptor((dst, "cpu"))) as read:
                await read.wait_for_completion()
            await readable.wait_for_completion()
        return read, readable

    read, readable = run(go())
    assert dst.tobytes() == data
    assert read.status == readable.status == nc.OperationStatus.COMPLETE


def test_a_passive_wait_times_out_and_the_operation_goes_on(pair):
    passive, active = pair
    data = pattern(4096, seed=12)
    dst = bytearray(4096)

    async def go():
        writable = await passive.create_writable(nc.Descriptor(dst))
        with pytest.raises(TimeoutError):
            await writable.wait_for_completion(timeout=0.05)
        with pytest.raises(TimeoutError):
            writable.wait(timeout=0.01)
        assert writable.status == nc.OperationStatus.INITIALIZED
        write = await active.begin_write(nc.Descriptor(data), writable.metadata())
        await write.wait_for_completion()
        await writable.wait_for_completion(timeout=30)

    run(go())
    assert bytes(dst) == data


def test_wait_for_completion_keeps_dynamos_signature(pair):
    passive, active = pair

    async def go():
        readable = await passive.create_readable(nc.Descriptor(b"x" * 64))
        read = await active.begin_read(readable.metadata(), nc.Descriptor(bytearray(64)))
        # Dynamo callers pass nothing.
        await read.wait_for_completion()
        await readable.wait_for_completion()

    run(go())
