"""Shared fixtures: connectors on each backend, bounded async runs, memory sources.

NIXL tests run against the real runtime (the `nixl-cu12` wheel in the test
environment). Without it they are skipped, unless NIXL_TESTS_REQUIRED=1
(as under `cargo xtask test`), where a missing runtime fails them.
"""

import asyncio
import ctypes
import os
import uuid

import numpy as np
import pytest

import nixl_connect as nc

# Every test's asyncio run is bounded: a hang fails, it does not block CI.
TIMEOUT_S = 60


def run(coro, timeout: float = TIMEOUT_S):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def _nixl_missing():
    try:
        nc.Connector(f"probe-{uuid.uuid4().hex[:8]}", backend="nixl")._native_connector()
        return None
    except ImportError as e:
        return str(e)


NIXL_MISSING = _nixl_missing()
NIXL_REQUIRED = os.environ.get("NIXL_TESTS_REQUIRED") == "1"


def require_backend(name: str) -> None:
    if name == "nixl" and NIXL_MISSING:
        if NIXL_REQUIRED:
            pytest.fail(f"NIXL runtime required but missing: {NIXL_MISSING}")
        pytest.skip(f"NIXL runtime not installed: {NIXL_MISSING}")


@pytest.fixture(params=["loopback", "nixl"])
def backend(request):
    require_backend(request.param)
    return request.param


_pairs = {}


@pytest.fixture
def pair(backend):
    """Two connectors (passive, active) on `backend`, shared by the session
    (a NIXL agent costs ~0.1 s to create)."""
    if backend not in _pairs:
        tag = uuid.uuid4().hex[:8]
        _pairs[backend] = (
            nc.Connector(f"passive-{tag}", backend=backend),
            nc.Connector(f"active-{tag}", backend=backend),
        )
    return _pairs[backend]


def pattern(size: int, seed: int = 1) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


class DLPackOnly:
    """Exposes a NumPy array through DLPack only (no array interface)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class ArrayInterfaceOnly:
    """Exposes a NumPy array through `__array_interface__` only."""

    def __init__(self, array):
        self._array = array
        self.__array_interface__ = array.__array_interface__


# Every descriptor form testable without a GPU: name -> make(data, writable)
# returning (descriptor, read-back function, objects to keep alive).
def _numpy(data, writable):
    a = np.frombuffer(bytearray(data), dtype=np.uint8)
    return nc.Descriptor((a, "cpu")), lambda: a.tobytes(), a


def _numpy_device(data, writable):
    a = np.frombuffer(bytearray(data), dtype=np.uint32) if len(data) % 4 == 0 else None
    assert a is not None
    return nc.Descriptor((a, nc.Device("cpu"))), lambda: a.tobytes(), a


def _bytearray(data, writable):
    b = bytearray(data)
    return nc.Descriptor(b), lambda: bytes(b), b


def _bytes(data, writable):
    b = bytes(data)
    return nc.Descriptor(b), lambda: b, b


def _raw(data, writable):
    a = np.frombuffer(bytearray(data), dtype=np.uint8)
    ptr = a.__array_interface__["data"][0]
    return nc.Descriptor((ptr, a.nbytes, "cpu", a)), lambda: a.tobytes(), a


def _raw_ctypes(data, writable):
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    return (
        nc.Descriptor((ctypes.addressof(buf), len(data), nc.Device("cpu"), buf)),
        lambda: ctypes.string_at(buf, len(data)),
        buf,
    )


def _dlpack(data, writable):
    a = np.frombuffer(bytearray(data), dtype=np.uint8).reshape(-1, 64)
    return nc.Descriptor(DLPackOnly(a)), lambda: a.tobytes(), a


def _numpy_direct(data, writable):
    a = np.frombuffer(bytearray(data), dtype=np.uint16)
    return nc.Descriptor(a), lambda: a.tobytes(), a


def _array_interface(data, writable):
    a = np.frombuffer(bytearray(data), dtype=np.uint8)
    return nc.Descriptor(ArrayInterfaceOnly(a)), lambda: a.tobytes(), a


SOURCES = {
    "numpy": _numpy,
    "numpy-Device": _numpy_device,
    "bytearray": _bytearray,
    "bytes": _bytes,
    "raw-tuple": _raw,
    "raw-ctypes": _raw_ctypes,
    "dlpack-numpy": _dlpack,
    "numpy-direct": _numpy_direct,
    "array-interface": _array_interface,
}
TARGETS = {k: v for k, v in SOURCES.items() if k != "bytes"}
