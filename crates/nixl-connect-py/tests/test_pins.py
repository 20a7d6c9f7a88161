"""What keeps a described object's memory in place (the package README's
"What pins what"), and the checks of the soundness review around it: no pin
is a Python object that Python code can find and undo, buffer exports are
taken natively (no `__buffer__` override consulted), a CUDA array's ordinal is
checked, the metadata cache sees in-place edits, and a fork()ed child fails
clearly or works, never hangs.
"""

import array
import asyncio
import gc
import mmap
import os
import select
import sys
import time

import numpy as np
import pytest

import nixl_connect as nc
from conftest import ArrayInterfaceOnly, DLPackOnly, run


def loopback_pair():
    return nc.Connector(backend="loopback"), nc.Connector(backend="loopback")


def referents_of_pins(obj):
    """Every object gc can see that refers to `obj`, other than this frame's."""
    return [r for r in gc.get_referrers(obj) if r is not sys._getframe()]


@pytest.mark.parametrize(
    "make, resize",
    [
        (lambda: bytearray(4096), lambda o: o.extend(b"x" * 8192)),
        (lambda: array.array("B", bytes(4096)), lambda o: o.extend(bytes(8192))),
        (lambda: mmap.mmap(-1, 4096), lambda o: o.close()),
    ],
    ids=["bytearray", "array.array", "mmap"],
)
def test_a_described_buffer_refuses_to_resize_or_close(make, resize):
    obj = make()
    d = nc.Descriptor(obj)
    assert d.size == 4096 and d.is_writable
    with pytest.raises(BufferError):
        resize(obj)
    # Nothing gc can find pins it: the pin is native.
    assert not any(isinstance(r, memoryview) for r in referents_of_pins(obj))
    del d
    gc.collect()
    resize(obj)  # the export went with the descriptor


def test_a_pin_exposes_nothing_to_python():
    ba = bytearray(64)
    d = nc.Descriptor(ba)
    pins = [o for o in gc.get_objects() if type(o).__name__ == "Pin"]
    for pin in pins:
        assert gc.get_referents(pin) in ([], [type(pin)])  # its type, nothing else
        assert not [a for a in dir(pin) if not a.startswith("__")]
    with pytest.raises(BufferError):
        ba.clear()
    del d


def test_the_pin_outlives_the_descriptor_while_an_operation_holds_the_memory():
    async def main():
        server, client = loopback_pair()
        target = bytearray(4096)
        writable = await server.create_writable(nc.Descriptor(target))
        gc.collect()  # the Python Descriptor is gone; the operation holds the memory
        with pytest.raises(BufferError):
            target.clear()
        write = await client.begin_write(nc.Descriptor(b"\x41" * 4096), writable.metadata())
        await write.wait_for_completion()
        await writable.wait_for_completion()
        assert bytes(target) == b"\x41" * 4096

    run(main())


def test_a_numpy_subclass_cannot_point_the_descriptor_elsewhere():
    class Decoy(np.ndarray):
        @property
        def __array_interface__(self):
            # A temporary array's address: freed as soon as this returns.
            return np.zeros(16, dtype=np.uint8).__array_interface__

    a = np.arange(4096, dtype=np.uint8).view(Decoy)
    for d in (nc.Descriptor((a, "cpu")), nc.Descriptor(a)):
        assert (d.ptr, d.size) == (a.ctypes.data, a.nbytes)


def test_a_numpy_array_refuses_resize_while_described():
    a = np.zeros(4096, dtype=np.uint8)
    d = nc.Descriptor((a, "cpu"))
    with pytest.raises(ValueError):
        a.resize(8192)
    del d


def test_a_non_contiguous_buffer_is_refused_clearly():
    a = np.zeros((64, 64), dtype=np.uint8)[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        nc.Descriptor((a, "cpu"))


def test_a_read_only_buffer_is_described_read_only():
    a = np.zeros(64, dtype=np.uint8)
    a.flags.writeable = False
    d = nc.Descriptor((a, "cpu"))
    assert not d.is_writable
    assert not nc.Descriptor(memoryview(b"abc")).is_writable


def test_a_dlpack_capsule_is_out_of_reach():
    src = DLPackOnly(np.arange(64, dtype=np.uint8))
    d = nc.Descriptor(src)
    assert d.size == 64
    holders = [o for o in gc.get_objects() if isinstance(o, tuple) and src in o]
    assert holders == []  # no tuple of (object, capsule) for Python to open
    del d


class FakeCudaArray:
    """A `__cuda_array_interface__` producer that names its device, as CuPy does."""

    class _Device:
        def __init__(self, ordinal):
            self.id = ordinal

    def __init__(self, ordinal):
        self.device = self._Device(ordinal)
        self.__cuda_array_interface__ = {
            "data": (0x7F00_0000_0000, False),
            "shape": (1024,),
            "typestr": "|u1",
            "version": 3,
            "strides": None,
        }


def test_a_cuda_array_is_checked_against_the_ordinal_it_names():
    with pytest.raises(ValueError, match="cuda:1"):
        nc.Descriptor((FakeCudaArray(1), "cuda:0"))
    d = nc.Descriptor((FakeCudaArray(1), "cuda:1"))
    assert (str(d.device), d.size) == ("cuda:1", 1024)
    assert str(nc.Descriptor(FakeCudaArray(2)).device) == "cuda:2"


def test_in_place_edits_of_a_metadata_descriptor_list_are_seen():
    async def main():
        server, client = loopback_pair()
        a, b = bytearray(b"a" * 64), bytearray(b"b" * 64)
        first = await server.create_readable(nc.Descriptor(a))
        second = await server.create_readable(nc.Descriptor(b))
        metadata = first.metadata()
        dst = bytearray(64)
        # The native form of `metadata` is cached; the list edited in place
        # now names the other readable's memory and key, so the read is refused
        # or reads those bytes: it never reads the stale cached region.
        metadata.descriptors[0] = second.metadata().descriptors[0]
        try:
            read = await client.begin_read(metadata, nc.Descriptor(dst))
            await read.wait_for_completion()
        except Exception:
            pass
        assert bytes(dst) in (bytes(64), bytes(b)), bytes(dst)
        assert bytes(dst) != bytes(a)
        first.cancel()
        second.cancel()

    run(main())


def test_a_forked_child_fails_clearly_and_never_hangs(backend):
    server = nc.Connector(backend=backend)
    client = nc.Connector(backend=backend)

    async def transfer(passive, active):
        src = bytes(range(64))
        readable = await passive.create_readable(nc.Descriptor(src))
        dst = bytearray(64)
        read = await active.begin_read(readable.metadata(), nc.Descriptor(dst))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        return bytes(dst) == src

    assert run(transfer(server, client))  # threads and agents exist now
    pending = run(server.create_readable(nc.Descriptor(bytes(64))))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every way in is refused, nothing hangs
        os.close(r)
        verdicts = []
        for attempt in (
            lambda: asyncio.run(
                transfer(nc.Connector(backend=backend), nc.Connector(backend=backend))
            ),
            lambda: asyncio.run(transfer(server, client)),
            lambda: pending.status,
            lambda: asyncio.run(pending.wait_for_completion()),
        ):
            try:
                attempt()
                verdicts.append("works")
            except RuntimeError as e:
                verdicts.append("refused" if "fork" in str(e) else f"other: {e}")
            except BaseException as e:
                verdicts.append(f"other: {e!r}")
        del pending  # dropped in the child: leaked, not torn down
        gc.collect()
        os.write(w, ",".join(verdicts).encode())
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 60)
    if not ready:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    verdicts = os.read(r, 4096).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert verdicts == "refused,refused,refused,refused", verdicts
    pending.cancel()


def test_a_huge_timeout_waits_and_bad_timeouts_are_value_errors():
    async def main():
        a, b = loopback_pair()
        readable = await a.create_readable(nc.Descriptor(bytes(64)))
        read = await b.begin_read(readable.metadata(), nc.Descriptor(bytearray(64)))
        for bad in (float("nan"), -1.0, -float("inf")):
            with pytest.raises(ValueError):
                read.wait(timeout=bad)
        assert read.wait(timeout=float("inf")) == nc.OperationStatus.COMPLETE
        assert read.wait(timeout=1e300) == nc.OperationStatus.COMPLETE
        assert readable.wait(timeout=1e20) == nc.OperationStatus.COMPLETE

    run(main())


def test_a_unicode_array_interface_counts_bytes():
    u = np.array(["abcd"] * 4, dtype="U4")
    assert nc.Descriptor((ArrayInterfaceOnly(u), "cpu")).size == u.nbytes == 64
    assert nc.Descriptor((u, "cpu")).size == u.nbytes


def test_status_polling_alone_gives_the_memory_back_after_time():
    async def main():
        a, b = loopback_pair()
        src, dst = bytearray(b"s" * 64), bytearray(64)
        ds, dd = nc.Descriptor(src), nc.Descriptor(dst)
        readable = await a.create_readable(ds)
        read = await b.begin_read(readable.metadata(), dd)
        deadline = time.monotonic() + 10
        while read.status != nc.OperationStatus.COMPLETE and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        assert not dd._native.in_use
        assert bytes(dst) == bytes(src)
        readable.cancel()

    run(main())
