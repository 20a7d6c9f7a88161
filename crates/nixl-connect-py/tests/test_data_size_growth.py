"""A live passive operation's `metadata()` never publishes a size it does not
expose: one grown (Dynamo's `_data_size`) past what it exposes raises the
documented RuntimeError on every call, whether or not `metadata()` was called
before, never the old size; one lowered is published once the cached
metadata is cleared (Dynamo's `_serialized_request = None`), and the peer
moves that prefix (docs/dynamo-compatibility.md).

Reproducer: ../shared/repros/python/py_grown_data_size_after_metadata_is_silent.py.
"""

import pytest

import nixl_connect as nc
from conftest import pattern, run


def test_a_grown_data_size_raises_on_every_metadata_call(pair):
    passive, _ = pair

    async def go():
        d = nc.Descriptor(bytearray(100))
        d._data_size = 50
        readable = await passive.create_readable(d)
        first = readable.metadata()
        d._data_size = 100
        for _ in range(2):
            with pytest.raises(RuntimeError, match="100 bytes now, but this operation exposes 50"):
                readable.metadata()
            with pytest.raises(RuntimeError, match="exposes 50"):
                readable.metadata(hex_encode=True)
        # Back within what is exposed: the first metadata again.
        d._data_size = 50
        again = readable.metadata()
        readable.cancel()
        return first, again

    first, again = run(go())
    assert first.descriptors[0].size == 50
    assert again == first


def test_a_lowered_data_size_after_metadata_is_published_and_moved(pair):
    passive, active = pair
    data = pattern(100, seed=47)

    async def go():
        d = nc.Descriptor(bytearray(data))
        readable = await passive.create_readable(d)
        assert readable.metadata().descriptors[0].size == 100
        d._data_size = 40
        assert readable.metadata().descriptors[0].size == 100, "kept until cleared, as Dynamo's"
        readable._serialized_request = None
        metadata = readable.metadata()
        assert metadata.descriptors[0].size == 40
        assert readable.metadata(hex_encode=True).descriptors[0].size == 40
        target = bytearray(40)
        read = await active.begin_read(metadata, nc.Descriptor(target))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        return bytes(target)

    assert run(go()) == data[:40]
