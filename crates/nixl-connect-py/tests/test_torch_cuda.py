"""torch tensors and CUDA memory: run where torch / CuPy with a GPU are
installed, skipped (with the reason) elsewhere."""

import pytest

import nixl_connect as nc
from conftest import pattern, require_backend, run


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed in this environment")


def test_a_cpu_tensor_round_trips(pair):
    torch = _torch()
    passive, active = pair
    src = torch.frombuffer(bytearray(pattern(4096, seed=31)), dtype=torch.uint8)
    dst = torch.zeros(4096, dtype=torch.uint8)

    async def go():
        readable = await passive.create_readable(nc.Descriptor(src))
        read = await active.begin_read(readable.metadata(), nc.Descriptor(dst))
        await read.wait_for_completion()
        await readable.wait_for_completion()

    run(go())
    assert bytes(dst.numpy()) == pattern(4096, seed=31)


def test_a_non_contiguous_tensor_is_copied_and_readable_only(pair):
    torch = _torch()
    passive, _ = pair
    t = torch.arange(64, dtype=torch.int32).reshape(8, 8).t()
    d = nc.Descriptor(t)
    assert d.size == 256 and not d.is_writable

    async def go():
        with pytest.raises(ValueError, match="read-only"):
            await passive.create_writable(d)
        readable = await passive.create_readable(d)
        readable.cancel()

    run(go())


def _cupy():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (GPU bundle only)")
    try:
        if not cupy.cuda.is_available():
            pytest.skip("no CUDA device")
    except Exception as e:  # noqa: BLE001 - CuPy raises its own runtime errors
        pytest.skip(f"no CUDA device: {e}")
    return cupy


def test_cupy_device_arrays_move_over_nixl():
    cupy = _cupy()
    require_backend("nixl")
    passive = nc.Connector("cuda-passive")
    active = nc.Connector("cuda-active")
    assert passive.is_cuda_available
    data = pattern(1 << 20, seed=41)
    src = cupy.asarray(bytearray(data), dtype=cupy.uint8)
    dst = cupy.zeros(1 << 20, dtype=cupy.uint8)

    async def go():
        readable = await passive.create_readable(nc.Descriptor((src, "cuda:0")))
        # Beyond Dynamo: the bare array (its __cuda_array_interface__).
        read = await active.begin_read(readable.metadata(), nc.Descriptor(dst))
        await read.wait_for_completion()
        await readable.wait_for_completion()

    run(go())
    assert bytes(cupy.asnumpy(dst)) == data
