"""The whole API moving bytes, on the loopback backend and on NIXL, for every
descriptor form that can be tested without a GPU. Every test checks the bytes."""

import asyncio
import threading

import numpy as np
import pytest

import nixl_connect as nc
from conftest import SOURCES, TARGETS, pattern, require_backend, run

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


class SpinRecorder:
    """Stands in for an operation's native object: records `spin` calls, and
    answers the waiter's first "finished yet?" with no, so that the wait's
    policy runs even when a small transfer ended inside `begin_*`."""

    def __init__(self, native):
        self._inner = native
        self.spins = []
        self._asked = False

    def finish(self):
        if not self._asked:
            self._asked = True
            return None
        return self._inner.finish()

    def spin(self, seconds):
        self.spins.append(seconds)
        return self._inner.spin(seconds)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.fixture
def spin_recorders(monkeypatch):
    """Lets operations' native objects be `SpinRecorder`s: the loop's notifier
    is handed the real native object when a wait is armed."""
    real = nc._notifier

    class Unwrapping:
        def __init__(self, notifier):
            self._notifier = notifier

        def arm(self, native, future):
            return self._notifier.arm(getattr(native, "_inner", native), future)

        def __len__(self):
            return len(self._notifier)

        def __getattr__(self, name):
            return getattr(self._notifier, name)

    monkeypatch.setattr(nc, "_notifier", lambda loop: Unwrapping(real(loop)))


def test_spin_settles_an_active_operation_and_never_waits_for_a_peer(pair):
    passive, active = pair
    data = pattern(4096, seed=21)
    dst = bytearray(4096)

    async def go():
        readable = await passive.create_readable(nc.Descriptor(data))
        # A passive operation waits for a peer: the spin returns at once.
        assert readable._native.spin(0.01) is False
        assert readable.status == nc.OperationStatus.INITIALIZED
        read = await active.begin_read(readable.metadata(), nc.Descriptor(dst))
        # Spun until it settles (the run's own timeout bounds the loop): a
        # True answer means the operation has ended.
        while not read._native.spin(0.01):
            pass
        assert read.status == nc.OperationStatus.COMPLETE
        await read.wait_for_completion()
        await readable.wait_for_completion()
        with pytest.raises(ValueError):
            read._native.spin(-1.0)

    run(go())
    assert bytes(dst) == data


@pytest.mark.parametrize("passive_detects, active_detects", [(True, False), (False, True), (False, False)])
def test_transfers_move_the_bytes_without_peer_failure_detection(passive_detects, active_detects):
    require_backend("nixl")
    passive = nc.Connector(backend="nixl", peer_failure_detection=passive_detects)
    active = nc.Connector(backend="nixl", peer_failure_detection=active_detects)
    blocks = [pattern(4096 << (2 * i), seed=50 + i) for i in range(3)]
    read_into = [bytearray(len(b)) for b in blocks]
    written = [bytearray(len(b)) for b in blocks]

    async def go():
        readable = await passive.create_readable([nc.Descriptor(b) for b in blocks])
        read = await active.begin_read(readable.metadata(), [nc.Descriptor(t) for t in read_into])
        await read.wait_for_completion()
        await readable.wait_for_completion()
        writable = await passive.create_writable([nc.Descriptor(t) for t in written])
        write = await active.begin_write([nc.Descriptor(b) for b in blocks], writable.metadata())
        await write.wait_for_completion()
        await writable.wait_for_completion()

    run(go())
    assert [bytes(t) for t in read_into] == blocks
    assert [bytes(t) for t in written] == blocks
    # The agents were built with the setting asked for.
    mode = {True: "peer", False: "none"}
    assert passive._native_connector()._ucx_error_handling_mode == mode[passive_detects]
    assert active._native_connector()._ucx_error_handling_mode == mode[active_detects]


@pytest.mark.parametrize("await_spin", [0, 100e-6, 0.01])
def test_awaited_transfers_move_the_bytes_with_or_without_the_spin(
    backend, await_spin, spin_recorders
):
    passive = nc.Connector(backend=backend, await_spin=await_spin)
    active = nc.Connector(backend=backend, await_spin=await_spin)
    blocks = [pattern(4096, seed=30 + i) for i in range(8)]
    targets = [bytearray(4096) for _ in blocks]
    spun = []

    async def go():
        for block, target in zip(blocks, targets):
            readable = await passive.create_readable(nc.Descriptor(block))
            read = await active.begin_read(readable.metadata(), nc.Descriptor(target))
            read._native = recorder = SpinRecorder(read._native)
            await read.wait_for_completion()
            spun.extend(recorder.spins)
            await readable.wait_for_completion()
            writable = await passive.create_writable(nc.Descriptor(target))
            write = await active.begin_write(nc.Descriptor(block), writable.metadata())
            await write.wait_for_completion()
            await writable.wait_for_completion()

    run(go())
    assert [bytes(t) for t in targets] == blocks
    # One spin per awaited READ, for the connector's window; none when off.
    assert spun == ([await_spin] * len(blocks) if await_spin else [])


def test_no_spin_while_another_operation_is_awaited_on_the_loop(pair, spin_recorders):
    passive, active = pair
    data = pattern(4096, seed=40)
    dst = bytearray(4096)
    late = bytearray(4096)

    async def go():
        # A writable awaited by another task: its wait is armed on the loop.
        writable = await passive.create_writable(nc.Descriptor(late))
        waiting = asyncio.ensure_future(writable.wait_for_completion())
        await asyncio.sleep(0)
        readable = await passive.create_readable(nc.Descriptor(data))
        read = await active.begin_read(readable.metadata(), nc.Descriptor(dst))
        read._native = recorder = SpinRecorder(read._native)
        await read.wait_for_completion()
        assert recorder.spins == []
        await readable.wait_for_completion()
        write = await active.begin_write(nc.Descriptor(data), writable.metadata())
        await write.wait_for_completion()
        await waiting

    run(go())
    assert bytes(dst) == data and bytes(late) == data
