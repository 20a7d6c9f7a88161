"""Memory registered once and moved in parts: Dynamo 1.6's pooled components
(peers/pooled.py runs their way of using the API) on both backends in one
process, the `_data_size` / `_status` / `_serialized_request` surface they rely
on, and `RegisteredMemory` / `BlockPool` with the two-level ownership that
keeps a part's bytes while any operation may touch them.

Across processes with the real Dynamo module as the peer: test_interop.py.
"""

import asyncio
import gc
import sys
from pathlib import Path

import numpy as np
import pytest

import nixl_connect as nc
from conftest import pattern, run

sys.path.insert(0, str(Path(__file__).parent / "peers"))
import pooled  # noqa: E402

MIB = 1 << 20
# Payload sizes, in bytes, read into 1 MiB pooled buffers: a byte, a page,
# odd sizes, and a whole buffer.
SIZES = [1, 4096, 123_457, MIB, 700_001, 65_536]


def payload(size: int, seed: int) -> np.ndarray:
    return np.frombuffer(pattern(size, seed=seed), dtype=np.uint8).copy()


@pytest.fixture
def dynamo_env(backend, monkeypatch):
    """The components build their connectors with no arguments: the backend
    comes from the environment, as a deployment would set it."""
    monkeypatch.setenv("NIXL_CONNECT_BACKEND", backend)
    pooled.patch_remote_release(nc)
    return backend


def registrations(connector) -> int:
    return connector._native_connector().registrations


# Dynamo's receiver: a pool of pre-registered buffers, prefix reads.


def test_dynamos_receiver_reads_prefixes_into_its_pool(dynamo_env):
    receiver = pooled.PooledReceiver(nc, count=2, max_bytes=MIB)
    assert receiver.connector.connections_made == 1
    assert registrations(receiver.connector) == 2, "each buffer registered up front"
    source = nc.Connector()

    async def go():
        results = []
        for i, size in enumerate(SIZES):
            data = payload(size, seed=i)
            readable = await source.create_readable(nc.Descriptor((data, "cpu")))
            descriptor, received = await receiver.receive(readable.metadata().model_dump_json())
            await readable.wait_for_completion()
            results.append((bytes(received), data.tobytes(), descriptor))
            # The bytes past the prefix are the buffer's own: what an earlier,
            # longer payload left, or zeros.
            receiver.release(descriptor)
        return results

    for (got, sent, descriptor), size in zip(run(go()), SIZES):
        assert got == sent, f"{size}-byte payload"
        assert descriptor.size == descriptor.capacity == MIB, "_data_size set back"
    # Six reads through two buffers, no registration after the first two:
    # a registration lasts as long as the memory.
    assert registrations(receiver.connector) == 2
    assert receiver.connector.connections_made == 1


def test_a_prefix_read_leaves_the_rest_of_the_buffer_untouched(dynamo_env):
    receiver = pooled.PooledReceiver(nc, count=1, max_bytes=MIB)
    receiver.buffers[0][:] = 0xEE  # canary
    source = nc.Connector()
    data = payload(3000, seed=9)

    async def go():
        readable = await source.create_readable(nc.Descriptor((data, "cpu")))
        _, received = await receiver.receive(readable.metadata().model_dump_json())
        await readable.wait_for_completion()
        return bytes(received)

    assert run(go()) == data.tobytes()
    assert (receiver.buffers[0][3000:] == 0xEE).all()


# Dynamo's sender: slots of pre-registered buffers, one re-armed readable each.


def test_dynamos_sender_rearms_its_non_releasing_readable(dynamo_env):
    sender = pooled.PooledSender(nc, count=2, max_bytes=MIB)
    assert registrations(sender.connector) == 2
    reader = nc.Connector()

    async def go():
        got, keys = [], []
        for i, size in enumerate(SIZES):
            data = payload(size, seed=20 + i)
            slot, metadata = sender.load(data)
            keys.append(metadata.notification_key)
            assert [d.size for d in metadata.descriptors] == [size]
            target = np.zeros(size, dtype=np.uint8)
            read = await reader.begin_read(metadata, nc.Descriptor((target, "cpu")))
            await read.wait_for_completion()
            await sender.finish(slot)
            got.append(target.tobytes() == data.tobytes())
        return got, keys

    got, keys = run(go())
    assert all(got)
    # Each slot's first payload went out on the readable built up front (its
    # metadata lowered to the payload's size); every later one on a re-armed
    # native readable, under a new key.
    assert len(set(keys)) == len(keys)
    assert registrations(sender.connector) == 2, "re-arming registers nothing"


def test_dynamos_sender_and_receiver_pools_together(dynamo_env):
    sender = pooled.PooledSender(nc, count=3, max_bytes=MIB)
    receiver = pooled.PooledReceiver(nc, count=3, max_bytes=MIB)
    sizes = SIZES * 2

    async def one(i: int, size: int):
        data = payload(size, seed=40 + i)
        slot, metadata = sender.load(data)
        descriptor, received = await receiver.receive(metadata.model_dump_json())
        ok = bytes(received) == data.tobytes()
        receiver.release(descriptor)
        await sender.finish(slot)
        return ok

    async def go():
        results = []
        # Three in flight at a time: every slot and buffer busy at once.
        for start in range(0, len(sizes), 3):
            batch = [one(start + j, n) for j, n in enumerate(sizes[start : start + 3])]
            results += await asyncio.gather(*batch)
        return results

    assert all(run(go()))
    assert registrations(sender.connector) == 3
    assert registrations(receiver.connector) == 3


def test_a_rearmed_readable_completes_on_its_own_readers_notification(dynamo_env):
    """After a re-arm, completion means this payload's reader notified, never
    an earlier notification (Dynamo's re-arm keeps its key, and its status
    check finds the old one again)."""
    if dynamo_env != "loopback":
        pytest.skip("loses a notification with loopback's fault injection")
    sender = pooled.PooledSender(nc, count=1, max_bytes=MIB)
    reader = nc.Connector()

    async def go():
        first = payload(5000, seed=60)
        slot, metadata = sender.load(first)
        target = np.zeros(5000, dtype=np.uint8)
        read = await reader.begin_read(metadata, nc.Descriptor((target, "cpu")))
        await read.wait_for_completion()
        await sender.finish(slot)
        assert target.tobytes() == first.tobytes()
        # Re-armed; its reader moves the bytes but its notification is lost.
        second = payload(7000, seed=61)
        slot, metadata = sender.load(second)
        _, _, readable, _ = slot
        target = np.zeros(7000, dtype=np.uint8)
        reader._native_connector()._drop_next_notification()
        read = await reader.begin_read(metadata, nc.Descriptor((target, "cpu")))
        await read.wait_for_completion()
        assert target.tobytes() == second.tobytes()
        assert readable.status == nc.OperationStatus.INITIALIZED, "no notification of its own"
        readable.cancel()  # loopback revokes: the slot's memory comes back

    run(go())


# The private surface, checked one piece at a time.


def test_data_size_is_checked_and_read_back():
    d = nc.Descriptor(bytearray(100))
    assert (d._data_size, d.size, d.capacity) == (100, 100, 100)
    before = d.metadata
    d._data_size = 40
    assert (d._data_size, d.size, d.capacity) == (40, 40, 100)
    assert d.metadata.size == 40 and d.metadata is not before, "the cached metadata is cleared"
    for bad in (0, -1, 101, 1 << 70):
        with pytest.raises(ValueError, match="capacity"):
            d._data_size = bad
    for bad in ("40", 40.0, None, True):
        with pytest.raises(TypeError, match="_data_size"):
            d._data_size = bad
    assert d.size == 40, "a refused value changes nothing"
    d._data_size = 100
    assert d.size == 100


def test_data_size_can_be_set_while_an_operation_holds_the_memory():
    passive, active = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")
    buffer = np.zeros(4096, dtype=np.uint8)
    d = nc.Descriptor((buffer, "cpu"))
    data = pattern(1000, seed=3)

    async def go():
        readable = await passive.create_readable(nc.Descriptor(data))
        writable = await active.create_writable(d)  # holds d
        d._data_size = 1000  # applies when next lent
        writable.cancel()
        read = await active.begin_read(readable.metadata(), d)
        await read.wait_for_completion()
        await readable.wait_for_completion()

    run(go())
    assert buffer[:1000].tobytes() == data and not buffer[1000:].any()


def test_a_read_pairs_sizes_strictly_with_dynamos_messages():
    passive, active = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")
    big = nc.Descriptor(bytearray(4096))

    async def go():
        readable = await passive.create_readable(nc.Descriptor(b"r" * 1000))
        with pytest.raises(ValueError, match=r"must be the same size\. 4096 != 1000\."):
            await active.begin_read(readable.metadata(), big)
        two = await passive.create_readable([nc.Descriptor(b"a" * 10), nc.Descriptor(b"b" * 20)])
        with pytest.raises(ValueError, match=r"descriptor at 1 must have the same size\. 30 != 20\."):
            await active.begin_read(two.metadata(), [nc.Descriptor(bytearray(10)), nc.Descriptor(bytearray(30))])
        with pytest.raises(ValueError, match="either lists or single descriptors"):
            await active.begin_read(two.metadata(), nc.Descriptor(bytearray(10)))
        # The refused descriptor serves the fitted read.
        big._data_size = 1000
        read = await active.begin_read(readable.metadata(), big)
        await read.wait_for_completion()
        await readable.wait_for_completion()
        two.cancel()

    run(go())


def test_data_ref_is_the_object_or_a_view_of_the_pool():
    array = np.arange(64, dtype=np.uint8)
    assert nc.Descriptor((array, "cpu"))._data_ref is array
    ba = bytearray(b"x" * 32)
    assert nc.Descriptor(ba)._data_ref is ba
    keep = object()
    assert nc.Descriptor((array.ctypes.data, 64, "cpu", keep))._data_ref is keep

    pool = nc.RegisteredMemory(np.arange(256, dtype=np.uint16).reshape(16, 16))
    part = pool.descriptor(32, 64)
    view = part._data_ref
    assert view.dtype == np.uint8 and view.shape == (64,)
    view[:] = 7  # a view, not a copy
    assert (pool._native.referent.reshape(-1).view(np.uint8)[32:96] == 7).all()
    assert part._data_ref is view, "made once"
    with pytest.raises(AttributeError):
        part._data_ref = None

    raw = bytearray(range(100))
    memory = nc.RegisteredMemory(raw)
    ref = memory.descriptor(10, 5)._data_ref
    assert isinstance(ref, memoryview) and bytes(ref) == bytes(range(10, 15))


def test_connection_and_remote_follow_dynamo():
    c = nc.Connector("conn-worker", backend="loopback")
    conn = nc.Connection(c, 3)
    assert (conn.name, str(conn), conn.connector) == ("conn-worker-3", "conn-worker-3", c)
    assert "conn-worker-3" in repr(conn)
    with pytest.raises(TypeError, match="Connector"):
        nc.Connection("not a connector", 1)
    with pytest.raises(TypeError, match="int"):
        nc.Connection(c, "1")
    with pytest.raises(ValueError, match="greater than 0"):
        nc.Connection(c, 0)
    conn.acquire_remote_ref("peer")
    conn.acquire_remote_ref("peer")
    assert (conn.release_remote_ref("peer"), conn.release_remote_ref("peer")) == (False, True)
    assert conn.release_remote_ref("peer") is False
    run(conn.initialize())

    async def shared():
        return [await c._create_connection() for _ in range(3)]

    first, *rest = run(shared())
    assert all(x is first for x in rest) and first.name == "conn-worker-1"
    # The shared connection does not keep its connector alive (no cycle).
    del c, conn, rest
    gc.collect()
    with pytest.raises(RuntimeError, match="gone"):
        first.connector

    with pytest.raises(TypeError):
        nc.Remote("not a connection", "b64:AAAA")
    with pytest.raises(ValueError, match="empty"):
        nc.Remote(first, "")
    with pytest.raises(ValueError, match="agent metadata"):
        nc.Remote(first, "b64:AAAA")


def test_operations_are_built_from_a_connection(backend):
    from conftest import require_backend

    require_backend(backend)
    passive = nc.Connector(f"ctor-p-{backend}", backend=backend)
    active = nc.Connector(f"ctor-a-{backend}", backend=backend)
    target = bytearray(64)

    async def go():
        pc, ac = await passive._create_connection(), await active._create_connection()
        readable = nc.ReadableOperation(pc, nc.Descriptor(b"c" * 64))
        assert readable.connection is pc and readable.connection.connector is passive
        read = nc.ReadOperation(ac, readable.metadata(), nc.Descriptor(target))
        assert read.remote.name == passive._native_connector().name
        read.remote._release()  # does nothing
        await read.wait_for_completion()
        await readable.wait_for_completion()
        writable = nc.WritableOperation(pc, nc.Descriptor(target))
        write = nc.WriteOperation(ac, nc.Descriptor(b"w" * 64), writable.metadata())
        await write.wait_for_completion()
        await writable.wait_for_completion()
        with pytest.raises(TypeError, match="Connection"):
            nc.ReadableOperation(passive, nc.Descriptor(b"x"))
        with pytest.raises(ValueError, match="kind `READ`"):
            nc.ReadOperation(ac, writable.metadata(), nc.Descriptor(bytearray(64)))
        with pytest.raises(ValueError, match="kind `WRITE`"):
            nc.WriteOperation(ac, nc.Descriptor(b"w" * 64), readable.metadata())

    run(go())
    assert bytes(target) == b"w" * 64


def test_a_native_operation_is_wrapped_without_its_constructor():
    passive, active = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")
    d = nc.Descriptor(b"n" * 32)
    target = bytearray(32)

    async def go():
        connection = await passive._create_connection()
        native = connection._native_connector().create_readable([d._native])
        readable = nc.ReadableOperation._wrap(connection, native, [d], True)
        assert readable.connection is connection and readable.operation_kind == nc.OperationKind.READ
        read = await active.begin_read(readable.metadata(), nc.Descriptor(target))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert readable.status == nc.OperationStatus.COMPLETE

    run(go())
    assert bytes(target) == b"n" * 32


def test_a_subclass_create_connection_is_what_operations_use():
    made = []

    class Counting(nc.Connector):
        async def _create_connection(self):
            connection = nc.Connection(self, 7)
            made.append(connection)
            return connection

    c = Counting(backend="loopback")
    reader = nc.Connector(backend="loopback")

    async def go():
        readable = await c.create_readable(nc.Descriptor(b"s" * 16))
        assert readable.connection is made[-1] and readable.connection.name.endswith("-7")
        read = await reader.begin_read(readable.metadata(), nc.Descriptor(bytearray(16)))
        await read.wait_for_completion()
        await readable.wait_for_completion()

    run(go())
    assert len(made) == 1


def test_register_with_connector_takes_a_connection_and_refuses_another_connector():
    a, b = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")
    d = nc.Descriptor(bytearray(64))
    d.register_with_connector(nc.Connection(a, 1))
    d.register_with_connector(nc.Connection(a, 2))  # one agent: accepted (Dynamo refuses)
    with pytest.raises(RuntimeError):
        d.register_with_connector(nc.Connection(b, 1))
    with pytest.raises(TypeError, match="Connection"):
        d.register_with_connector("nope")
    pool = nc.BlockPool(bytearray(256), 64, nc.Connection(a, 1))
    assert pool.is_registered
    with pytest.raises(RuntimeError, match="registered with connector"):
        pool.register_with_connector(b)
    with pytest.raises(RuntimeError, match="registered with connector"):
        pool.checkout(1)[0].register_with_connector(b)


def test_rearming_a_live_readable_keeps_it_and_a_completed_one_starts_anew():
    c, reader = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")
    buffer = np.frombuffer(pattern(1000, seed=5), dtype=np.uint8).copy()
    d = nc.Descriptor((buffer, "cpu"))

    async def go():
        readable = await c.create_readable(d)
        key = readable.metadata().notification_key
        readable._status = nc.OperationStatus.INITIALIZED  # live: nothing
        assert readable._serialized_request is not None, "cache kept"
        assert readable.metadata().notification_key == key
        d._data_size = 600
        assert readable.metadata().descriptors[0].size == 1000, "cached until cleared"
        readable._serialized_request = None
        assert readable.metadata().descriptors[0].size == 600
        assert readable.metadata().notification_key == key, "the same exposure"
        target = np.zeros(600, dtype=np.uint8)
        read = await reader.begin_read(readable.metadata(), nc.Descriptor((target, "cpu")))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert target.tobytes() == buffer[:600].tobytes()
        # Completed: re-arming makes a new native readable at the current size.
        d._data_size = 1000
        readable._status = nc.OperationStatus.INITIALIZED
        assert readable.status == nc.OperationStatus.INITIALIZED
        assert readable._serialized_request is None, "the old metadata is dropped"
        metadata = readable.metadata()
        assert metadata.notification_key != key and metadata.descriptors[0].size == 1000
        target = np.zeros(1000, dtype=np.uint8)
        read = await reader.begin_read(metadata, nc.Descriptor((target, "cpu")))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert target.tobytes() == buffer.tobytes()
        with pytest.raises(ValueError, match="INITIALIZED"):
            readable._status = nc.OperationStatus.COMPLETE

    run(go())


def test_a_live_readable_cannot_publish_more_than_it_exposes():
    c = nc.Connector(backend="loopback")
    d = nc.Descriptor(bytearray(100))

    async def go():
        d._data_size = 50
        readable = await c.create_readable(d)
        d._data_size = 80
        readable._serialized_request = None
        with pytest.raises(RuntimeError, match="exposes 50"):
            readable.metadata()
        readable.cancel()

    run(go())


@pytest.mark.parametrize("backend_name", ["loopback", "nixl"])
def test_rearming_needs_the_memory_back(backend_name):
    from conftest import require_backend

    require_backend(backend_name)
    c = nc.Connector(backend=backend_name)
    d = nc.Descriptor(bytearray(64))

    async def go():
        readable = await c.create_readable(d)
        readable.cancel()
        if c._native_connector().revocation_enforced:
            readable._status = nc.OperationStatus.INITIALIZED  # came back: re-armed
            assert readable.status == nc.OperationStatus.INITIALIZED
            readable.cancel()
        else:
            # NIXL cannot cut a peer off: a cancelled exposure keeps the memory.
            with pytest.raises(RuntimeError, match="cannot be re-armed"):
                readable._status = nc.OperationStatus.INITIALIZED

    run(go())


def test_an_active_operation_is_not_rearmed():
    passive, active = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")

    async def go():
        readable = await passive.create_readable(nc.Descriptor(b"a" * 8))
        read = await active.begin_read(readable.metadata(), nc.Descriptor(bytearray(8)))
        await read.wait_for_completion()
        with pytest.raises(RuntimeError, match="cannot be re-armed"):
            read._status = nc.OperationStatus.INITIALIZED
        await readable.wait_for_completion()

    run(go())


# RegisteredMemory and BlockPool.


def test_block_pool_checks_out_registers_once_and_moves_blocks(backend):
    from conftest import require_backend

    require_backend(backend)
    passive = nc.Connector(f"pool-p-{backend}", backend=backend)
    active = nc.Connector(f"pool-a-{backend}", backend=backend)
    src = np.frombuffer(pattern(16 * 4096, seed=11), dtype=np.uint8).copy()
    dst = np.zeros(16 * 4096 + 100, dtype=np.uint8)  # a tail shorter than a block
    src_pool = nc.BlockPool((src, "cpu"), 4096, passive)
    dst_pool = nc.BlockPool((dst, "cpu"), 4096)
    assert (len(dst_pool), dst_pool.free, dst_pool.block_size) == (16, 16, 4096)
    before = registrations(active)

    async def go():
        for round_ in range(3):
            picked = [3, 0, 15, 7 + round_]
            sources = src_pool.blocks(picked)
            targets = dst_pool.checkout(4)
            assert [t.ptr - dst_pool.ptr for t in targets] == [0, 4096, 8192, 12288]
            readable = await passive.create_readable(sources)
            read = await active.begin_read(readable.metadata(), targets)
            await read.wait_for_completion()
            await readable.wait_for_completion()
            assert [bytes(t._data_ref) for t in targets] == [bytes(s._data_ref) for s in sources]
            del sources, targets, readable, read

    run(go())
    gc.collect()
    assert dst_pool.free == 16 and src_pool.free == 16
    assert registrations(active) == before + 1, "the pool registered once"
    assert not dst[16 * 4096 :].any()


def test_pool_parts_are_disjoint_and_come_back_when_dropped():
    pool = nc.BlockPool(bytearray(10 * 64), 64)
    a = pool.blocks([2, 5])
    with pytest.raises(ValueError, match="block 5 is checked out"):
        pool.blocks([4, 5])
    assert pool.free == 8, "a refused checkout takes nothing"
    with pytest.raises(ValueError, match="out of range"):
        pool.blocks([10])
    with pytest.raises(ValueError, match="listed twice"):
        pool.blocks([1, 1])
    assert [d.ptr - pool.ptr for d in pool.checkout(3)] == [0, 64, 3 * 64]  # dropped at once
    held = pool.checkout(8)
    assert held is not None and pool.checkout(1) is None
    del held
    gc.collect()
    assert pool.free == 8
    del a
    gc.collect()
    assert pool.free == 10

    memory = nc.RegisteredMemory(bytearray(1000))
    head = memory.descriptor(0, 100)
    with pytest.raises(ValueError, match="overlap the live descriptor of bytes 0..100"):
        memory.descriptor(50, 100)
    for offset, size in [(0, 0), (990, 11), (-1, 5)]:
        with pytest.raises((ValueError, OverflowError)):
            memory.descriptor(offset, size)
    tail = memory.descriptor(100, 900)
    assert memory.free == 0 and (head.capacity, tail.capacity) == (100, 900)
    del head
    gc.collect()
    assert memory.free == 100
    with pytest.raises(ValueError, match="whole blocks"):
        pool.descriptor(10, 64)
    assert tail.deregister_with_connector(nc.Connector(backend="loopback")) is None


def test_a_part_the_backend_still_holds_is_refused_to_its_next_owner(backend):
    """Python ownership ends with the Python objects; the core's ends when the
    backend let go. A NIXL exposure that a cancel could not revoke keeps its
    bytes for good, after its descriptor and operation are gone: no new
    descriptor of those bytes is made (nor counted free; see
    test_pool_held_parts.py), and the memory stays pinned. Loopback revokes,
    so there the bytes come back at once."""
    from conftest import require_backend

    require_backend(backend)
    c = nc.Connector(backend=backend)
    backing = bytearray(4096)
    pool = nc.RegisteredMemory(backing, c)

    async def go():
        part = pool.descriptor(0, 1024)
        readable = await c.create_readable(part)
        readable.cancel()
        del part, readable
        gc.collect()
        if c._native_connector().revocation_enforced:
            again = pool.descriptor(0, 1024)
            readable = await c.create_readable(again)
            readable.cancel()
        else:
            assert pool.free == 3072
            with pytest.raises(ValueError, match="still held by an operation"):
                pool.descriptor(0, 1024)
        # The neighbours are unaffected.
        neighbour = await c.create_readable(pool.descriptor(1024, 1024))
        neighbour.cancel()

    run(go())
    with pytest.raises(BufferError):
        backing.extend(b"x")  # pinned while the pool or the backend holds it


def test_a_refused_operation_gives_the_part_back_without_registering_again():
    passive, active = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")
    pool = nc.BlockPool(bytearray(4 * 256), 256)
    part = pool.checkout(1)[0]

    async def go():
        readable = await passive.create_readable(nc.Descriptor(b"q" * 100))
        for _ in range(3):
            with pytest.raises(ValueError, match="same size"):
                await active.begin_read(readable.metadata(), part)  # 256 != 100
        registered = registrations(active)
        part._data_size = 100
        read = await active.begin_read(readable.metadata(), part)
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert registrations(active) == registered == 1
        return bytes(part._data_ref[:100])

    assert run(go()) == b"q" * 100


def test_nothing_python_does_frees_pooled_memory_early():
    """The pool's object stays pinned while any part or operation lives, in
    whatever order the Python objects go."""
    passive, active = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")
    backing = bytearray(2048)
    pool = nc.RegisteredMemory(backing)
    part = pool.descriptor(1024, 1024)
    del pool
    gc.collect()
    with pytest.raises(BufferError):
        backing.clear()  # the part keeps the memory

    async def go():
        nonlocal part
        writable = await passive.create_writable(part)
        del part
        gc.collect()
        with pytest.raises(BufferError):
            backing.clear()  # the operation keeps it
        write = await active.begin_write(nc.Descriptor(b"\x5a" * 1024), writable.metadata())
        await write.wait_for_completion()
        await writable.wait_for_completion()
        return writable

    writable = run(go())
    assert bytes(backing[1024:]) == b"\x5a" * 1024
    del writable
    gc.collect()
    backing.clear()  # everything gone: the pin went with the last holder
    assert len(backing) == 0


def test_a_pool_registered_on_first_use_takes_the_lending_connector():
    c, reader = nc.Connector(backend="loopback"), nc.Connector(backend="loopback")
    pool = nc.BlockPool(bytearray(b"z" * 512), 128)
    assert not pool.is_registered
    parts = pool.checkout(2)
    assert not any(p.is_registered for p in parts)

    async def go():
        readable = await c.create_readable(parts)
        assert pool.is_registered and all(p.is_registered for p in parts)
        read = await reader.begin_read(readable.metadata(), [nc.Descriptor(bytearray(128)) for _ in parts])
        await read.wait_for_completion()
        await readable.wait_for_completion()
        with pytest.raises(RuntimeError, match="registered with connector"):
            await reader.create_readable(pool.checkout(1))

    run(go())
