"""Cancellation, dropping operations mid-transfer, errored transfers, and how
long Python objects are kept alive."""

import gc
import weakref

import numpy as np
import pytest

import nixl_connect as nc
from conftest import pattern, require_backend, run


def loopback_pair(tag):
    return (
        nc.Connector(f"lc-passive-{tag}", backend="loopback"),
        nc.Connector(f"lc-active-{tag}", backend="loopback"),
    )


def test_an_errored_transfer_raises_runtime_error():
    passive, active = loopback_pair("err")
    dst = bytearray(4096)

    async def go():
        readable = await passive.create_readable(nc.Descriptor(b"\x01" * 4096))
        active._native_connector()._fail_next_transfer("injected: peer GPU went away")
        read = await active.begin_read(readable.metadata(), nc.Descriptor(dst))
        with pytest.raises(RuntimeError, match="ERRORED"):
            await read.wait_for_completion()
        assert read.status == nc.OperationStatus.ERRORED
        with pytest.raises(RuntimeError, match="errored"):
            read.cancel()
        with pytest.raises(RuntimeError):
            read.results()
        with pytest.raises(RuntimeError, match="injected"):
            read.wait(timeout=5)
        readable.cancel()

    run(go())
    assert bytes(dst) == bytes(4096), "a failed transfer touches no memory"


def test_cancel_mid_transfer_then_reuse_the_memory():
    passive, active = loopback_pair("cancel")
    src = nc.Descriptor(pattern(4096, seed=2))
    dst_array = np.zeros(4096, dtype=np.uint8)
    dst = nc.Descriptor((dst_array, "cpu"))

    async def go():
        readable = await passive.create_readable(src)
        active._native_connector()._delay_next_transfer(3600)
        read = await active.begin_read(readable.metadata(), dst)
        assert read.status == nc.OperationStatus.IN_PROGRESS
        read.cancel()
        await read.wait_for_completion()  # Dynamo: returns on CANCELLED
        assert read.status == nc.OperationStatus.CANCELLED
        assert not dst_array.any(), "the delayed copy never ran"
        with pytest.raises(RuntimeError):
            read.results()
        # The memory came back: the same descriptors serve the next transfer.
        read = await active.begin_read(readable.metadata(), dst)
        await read.wait_for_completion()
        await readable.wait_for_completion()

    run(go())
    assert dst_array.tobytes() == pattern(4096, seed=2)


def test_dropping_an_operation_mid_transfer_cancels_it():
    passive, active = loopback_pair("drop")
    dst_array = np.zeros(4096, dtype=np.uint8)
    dst = nc.Descriptor((dst_array, "cpu"))

    async def go():
        writable = await passive.create_writable(dst)
        active._native_connector()._delay_next_transfer(3600)
        write = await active.begin_write(nc.Descriptor(b"\x07" * 4096), writable.metadata())
        assert write.status == nc.OperationStatus.IN_PROGRESS
        del write
        gc.collect()
        with pytest.raises(TimeoutError):
            await writable.wait_for_completion(timeout=0.1)
        assert writable.status == nc.OperationStatus.INITIALIZED
        assert not dst_array.any()
        writable.cancel()
        await writable.wait_for_completion()
        assert writable.status == nc.OperationStatus.CANCELLED

    run(go())
    # Loopback revokes exposures: the memory is back and usable again.
    assert not dst.is_registered or not dst._native.in_use


def test_leaving_a_with_block_early_cancels_and_returns_the_memory():
    passive, active = loopback_pair("with")
    buf = bytearray(4096)
    d = nc.Descriptor(buf)

    async def go():
        with await passive.create_writable(d) as writable:
            metadata = writable.metadata()
        assert writable.status == nc.OperationStatus.CANCELLED
        # The peer is refused once the operation ended (loopback revokes).
        with pytest.raises(RuntimeError):
            write = await active.begin_write(nc.Descriptor(b"\x09" * 4096), metadata)
            await write.wait_for_completion()
        # And the descriptor serves a new operation.
        writable = await passive.create_writable(d)
        write = await active.begin_write(nc.Descriptor(b"\x05" * 4096), writable.metadata())
        await write.wait_for_completion()
        await writable.wait_for_completion()

    run(go())
    assert bytes(buf) == b"\x05" * 4096


def test_the_descriptor_keeps_its_array_alive_until_the_operation_lets_go():
    passive, active = loopback_pair("alive")
    array = np.frombuffer(bytearray(pattern(4096, seed=5)), dtype=np.uint8)
    gone = weakref.ref(array)
    dst = bytearray(4096)

    async def go():
        nonlocal array
        readable = await passive.create_readable(nc.Descriptor((array, "cpu")))
        del array
        gc.collect()
        assert gone() is not None, "the readable keeps the array alive"
        read = await active.begin_read(readable.metadata(), nc.Descriptor(dst))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        return readable

    readable = run(go())
    assert gone() is not None, "its Descriptor is still referenced by the operation"
    del readable
    gc.collect()
    assert gone() is None, "released once nothing can touch it"
    assert bytes(dst) == pattern(4096, seed=5)


def test_a_described_bytearray_cannot_be_resized():
    buf = bytearray(4096)
    d = nc.Descriptor(buf)
    with pytest.raises(BufferError):
        buf.extend(b"more")
    del d
    gc.collect()
    buf.extend(b"more")
    assert len(buf) == 4100


def test_a_descriptor_in_use_cannot_join_a_second_operation():
    passive, _ = loopback_pair("busy")
    d = nc.Descriptor(bytearray(64))

    async def go():
        writable = await passive.create_writable(d)
        with pytest.raises(ValueError, match="in use"):
            await passive.create_writable(d)
        with pytest.raises(ValueError, match="in use"):
            await passive.create_readable([nc.Descriptor(b"y" * 64), d])
        writable.cancel()

    run(go())


@pytest.mark.parametrize("backend", ["loopback", "nixl"])
def test_a_cancelled_passive_operation_gives_memory_back_only_if_revocable(backend):
    require_backend(backend)
    c = nc.Connector(f"revoke-{backend}", backend=backend)
    d = nc.Descriptor(bytearray(64))

    async def go():
        readable = await c.create_readable(d)
        readable.cancel()
        await readable.wait_for_completion()
        assert readable.status == nc.OperationStatus.CANCELLED
        if c._native_connector().revocation_enforced:
            again = await c.create_readable(d)  # memory came back
            again.cancel()
        else:
            # NIXL cannot cut a peer off: the memory stays held (quarantined,
            # never handed back to this descriptor).
            with pytest.raises(ValueError, match="in use"):
                await c.create_readable(d)

    run(go())
