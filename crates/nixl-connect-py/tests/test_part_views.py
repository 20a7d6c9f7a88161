"""A pool's part's `_data_ref` is exactly the part's bytes, whatever object
the pool was made from (C- or Fortran-ordered arrays, `np.matrix`, a
memoryview of a Fortran-ordered array, `bytearray`, `array.array`, an
ndarray subclass, an object with only `__array_interface__`): every byte of
every block reads as the pool's memory there, and a write through it lands
in that block and no other. The view is made through a flat window of the
memory the native side holds, never through the object's own shape.
"""

import array
import gc
import warnings

import numpy as np
import pytest

import nixl_connect as nc
from conftest import ArrayInterfaceOnly

BLOCK = 1024
BLOCKS = 4


class Tagged(np.ndarray):
    """An ndarray subclass whose reshape keeps two dimensions (as np.matrix)."""

    def reshape(self, *args, **kwargs):
        return np.asarray(self).reshape(2, -1).view(Tagged)


def _bytes_of(data: np.ndarray) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, data.nbytes, dtype=np.uint8)


def c_array():
    a = _bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).reshape(BLOCKS, BLOCK)
    return (a, "cpu"), a


def f_array():
    a = np.asfortranarray(_bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).reshape(BLOCKS, BLOCK))
    return (a, "cpu"), a


def f_array_bare():
    a = np.asfortranarray(_bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).reshape(8, BLOCK * BLOCKS // 8))
    return a, a


def f_memoryview():
    a = np.asfortranarray(
        _bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).view(np.uint32).reshape(BLOCKS, BLOCK // 4)
    )
    return memoryview(a), a


def matrix():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        m = np.matrix(_bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).reshape(BLOCKS, BLOCK))
    return (m, "cpu"), m


def subclass():
    t = _bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).reshape(BLOCKS, BLOCK).view(Tagged)
    return (t, "cpu"), t


def wide_dtype():
    a = _bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).view(np.float64).reshape(BLOCKS, -1)
    return (a, "cpu"), a


def byte_array():
    b = bytearray(_bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).tobytes())
    return b, b


def array_array():
    a = array.array("I", _bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).tobytes())
    return a, a


def interface_only():
    a = _bytes_of(np.empty(BLOCK * BLOCKS, np.uint8)).reshape(BLOCKS, BLOCK)
    holder = ArrayInterfaceOnly(a)
    return (holder, "cpu"), a


EXPORTERS = {
    "C-ordered ndarray": c_array,
    "F-ordered ndarray": f_array,
    "F-ordered ndarray, bare": f_array_bare,
    "memoryview of an F-ordered array": f_memoryview,
    "np.matrix": matrix,
    "ndarray subclass keeping 2-D": subclass,
    "float64 ndarray": wide_dtype,
    "bytearray": byte_array,
    "array.array": array_array,
    "__array_interface__ only": interface_only,
}


def memory_of(backing) -> bytes:
    """The backing object's bytes in memory order."""
    if isinstance(backing, np.ndarray):
        return np.asarray(backing).tobytes(order="A")
    return bytes(backing)


def as_bytes(ref) -> bytes:
    if isinstance(ref, memoryview):
        return ref.tobytes()
    return np.asarray(ref).tobytes(order="A")


def write_through(ref, data: bytes) -> None:
    if isinstance(ref, memoryview):
        ref[:] = data
    else:
        np.asarray(ref).reshape(-1)[:] = np.frombuffer(data, dtype=np.uint8)


@pytest.mark.parametrize("make", EXPORTERS.values(), ids=EXPORTERS.keys())
def test_every_blocks_data_ref_is_exactly_that_blocks_bytes(make):
    data, backing = make()
    pool = nc.BlockPool(data, BLOCK)
    assert len(pool) == BLOCKS
    whole = memory_of(backing)
    parts = pool.checkout(BLOCKS)
    for i, part in enumerate(parts):
        ref = part._data_ref
        assert part._data_ref is ref, "made once"
        assert len(as_bytes(ref)) == BLOCK
        assert as_bytes(ref) == whole[i * BLOCK : (i + 1) * BLOCK], f"block {i}"
        # Dynamo-style slicing of a prefix stays inside the block.
        assert as_bytes(ref[:16]) == whole[i * BLOCK : i * BLOCK + 16]


@pytest.mark.parametrize("make", EXPORTERS.values(), ids=EXPORTERS.keys())
def test_a_write_through_data_ref_lands_in_its_block_and_no_other(make):
    data, backing = make()
    pool = nc.BlockPool(data, BLOCK)
    before = memory_of(backing)
    part = pool.blocks([2])[0]
    stamp = bytes((i * 7 + 3) % 256 for i in range(BLOCK))
    write_through(part._data_ref, stamp)
    after = memory_of(backing)
    assert after[2 * BLOCK : 3 * BLOCK] == stamp
    assert after[: 2 * BLOCK] == before[: 2 * BLOCK]
    assert after[3 * BLOCK :] == before[3 * BLOCK :]


def test_parts_carved_at_any_offset_view_exactly_their_bytes():
    data, backing = f_memoryview()
    memory = nc.RegisteredMemory(data)
    whole = memory_of(backing)
    for offset, size in [(0, 1), (1, 7), (100, 1000), (4095, 1), (2048, 2048)]:
        part = memory.descriptor(offset, size)
        assert as_bytes(part._data_ref) == whole[offset : offset + size], (offset, size)
        del part


def test_the_reproducers_two_pools_give_the_parts_bytes():
    # py_data_ref_wrong_view_of_part.py: the F-ordered memoryview gave the
    # whole pool, the np.matrix pool 0 bytes.
    for make in (f_memoryview, matrix):
        data, backing = make()
        part = nc.BlockPool(data, BLOCK).blocks([2])[0]
        assert as_bytes(part._data_ref) == memory_of(backing)[2 * BLOCK : 3 * BLOCK]


def test_a_data_ref_outlives_its_pool_and_object_and_pins_the_memory():
    backing = bytearray(range(256)) * (BLOCK * BLOCKS // 256)
    pool = nc.BlockPool(backing, BLOCK)
    ref = pool.blocks([1])[0]._data_ref
    expected = bytes(backing[BLOCK : 2 * BLOCK])
    del pool
    gc.collect()
    # The view still holds the export: the bytearray cannot be resized away.
    with pytest.raises(BufferError):
        backing.extend(b"x" * 65536)
    del backing
    gc.collect()
    assert ref.tobytes() == expected


def test_a_read_only_pools_parts_are_read_only_views():
    pool = nc.BlockPool(bytes(range(256)) * 16, BLOCK)
    ref = pool.blocks([3])[0]._data_ref
    assert ref.readonly
    assert ref.tobytes() == (bytes(range(256)) * 16)[3 * BLOCK : 4 * BLOCK]
    with pytest.raises(TypeError):
        ref[0] = 1


def test_raw_memory_parts_name_the_raw_forms_ref_as_documented():
    keep = bytearray(BLOCK * BLOCKS)
    ptr = nc.Descriptor(keep).ptr
    pool = nc.BlockPool((ptr, len(keep), "cpu", keep), BLOCK)
    assert pool.blocks([1])[0]._data_ref is keep
