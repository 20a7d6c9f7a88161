"""An `RdmaMetadata` changed past its frozen `__setattr__` (`object.__setattr__`
on the model or on one of its `SerializedDescriptor` items, its `__dict__`,
its list in place) is never served by a stale native twin: `model_dump_json()`
is pydantic's dump of the model as it is now, byte for byte, and operations
use the model's current values. Whether the model came from the fast parser
(an exact twin) or from pydantic (a twin remembered on first use).
"""

import base64
import random
import zlib

import pytest
from pydantic import BaseModel

import nixl_connect as nc
from conftest import require_backend, run

KEY = "0f8fad5b-d9cb-469f-a165-70867728950e"
BLOB = "b64:" + base64.b64encode(zlib.compress(bytes(range(256)) * 4, 6)).decode()
OTHER_BLOB = "b64:" + base64.b64encode(zlib.compress(bytes(range(255, -1, -1)) * 4, 6)).decode()


def pydantic_dump(model) -> str:
    return BaseModel.model_dump_json(model)


def document(n: int, kind: int = 1, key: str = KEY) -> str:
    model = nc.RdmaMetadata(
        descriptors=[
            nc.SerializedDescriptor(device="cuda:0", ptr=0x7F00_0000_0000 + i * 4096, size=4096)
            for i in range(n)
        ],
        nixl_metadata=BLOB,
        notification_key=key,
        operation_kind=kind,
    )
    return BaseModel.model_dump_json(model)


def parsed(n: int) -> nc.RdmaMetadata:
    """A model with an exact twin (from the fast parser)."""
    model = nc.RdmaMetadata.model_validate_json(document(n))
    assert nc._twin_of(model, exact=True) is not None
    return model


def built(n: int) -> nc.RdmaMetadata:
    """A model pydantic built, whose twin is remembered once it is used."""
    model = BaseModel.model_validate_json.__func__(nc.RdmaMetadata, document(n))
    nc._native_of(model)
    assert nc._twin_of(model, exact=False) is not None
    return model


def native_view(model) -> tuple:
    """What an operation would use for `model` (its native form)."""
    native = nc._native_of(model)
    return (
        [tuple(d) for d in native.descriptors],
        native.notification_key,
        native.operation_kind,
    )


def model_view(model) -> tuple:
    return (
        [(d.device, d.ptr, d.size) for d in model.descriptors],
        model.notification_key,
        model.operation_kind,
    )


def same_everywhere(model) -> None:
    assert model.model_dump_json() == pydantic_dump(model)
    assert native_view(model) == model_view(model)


# Edits a user can make to a frozen model; each returns a description.
def set_item_field(rng, model):
    item = rng.choice(model.descriptors)
    name, value = rng.choice(
        [("size", rng.randrange(1, 1 << 20)), ("ptr", rng.randrange(1, 1 << 48)), ("device", "cuda:1")]
    )
    object.__setattr__(item, name, value)
    return f"item.{name} = {value!r}"


def set_item_same_value_new_object(rng, model):
    item = rng.choice(model.descriptors)
    object.__setattr__(item, "size", int(str(item.size)))  # equal, another object
    return "item.size = an equal int"


def set_item_dict_entry(rng, model):
    item = rng.choice(model.descriptors)
    item.__dict__["ptr"] = item.ptr + 4096
    return "item.__dict__['ptr'] += 4096"


def replace_item_dict(rng, model):
    item = rng.choice(model.descriptors)
    object.__setattr__(item, "__dict__", {**item.__dict__, "size": item.size // 2 or 1})
    return "item.__dict__ replaced"


def set_model_field(rng, model):
    name, value = rng.choice(
        [("notification_key", f"key-{rng.randrange(1000)}"), ("operation_kind", 3 - model.operation_kind),
         ("nixl_metadata", OTHER_BLOB)]
    )
    object.__setattr__(model, name, value)
    return f"model.{name} = {value!r}"


def replace_list(rng, model):
    object.__setattr__(model, "descriptors", list(reversed(model.descriptors)))
    return "model.descriptors reversed into a new list"


def edit_list_in_place(rng, model):
    if len(model.descriptors) > 1:
        model.descriptors.pop(rng.randrange(len(model.descriptors)))
    else:
        model.descriptors.append(nc.SerializedDescriptor(device="cpu", ptr=8, size=8))
    return "model.descriptors edited in place"


def swap_item(rng, model):
    i = rng.randrange(len(model.descriptors))
    old = model.descriptors[i]
    model.descriptors[i] = nc.SerializedDescriptor(device=old.device, ptr=old.ptr, size=old.size + 1)
    return "an item replaced by another"


EDITS = [
    set_item_field,
    set_item_same_value_new_object,
    set_item_dict_entry,
    replace_item_dict,
    set_model_field,
    replace_list,
    edit_list_in_place,
    swap_item,
]


@pytest.mark.parametrize("make", [parsed, built], ids=["exact twin", "remembered twin"])
def test_an_edited_model_dumps_and_transfers_as_it_is_now(make):
    rng = random.Random(41)
    for round_ in range(60):
        model = make(rng.choice([1, 2, 5, 64]))
        same_everywhere(model)
        done = []
        for _ in range(rng.randrange(1, 4)):
            done.append(rng.choice(EDITS)(rng, model))
            assert model.model_dump_json() == pydantic_dump(model), (round_, done)
            assert native_view(model) == model_view(model), (round_, done)
        # And again, once the twin was made anew for the edited model.
        same_everywhere(model)


def test_an_unedited_model_keeps_its_twin():
    model = parsed(16)
    twin = nc._twin_of(model, exact=True)
    assert model.model_dump_json() == pydantic_dump(model)
    assert nc._twin_of(model, exact=True) is twin
    plain = built(16)
    assert nc._native_of(plain) is nc._native_of(plain)


def test_a_descriptor_size_changed_after_parsing_is_what_dumps_and_pairs():
    # py_metadata_twin_stale_after_field_edit.py (a): the exact twin wrote
    # the old size and begin_read paired on it.
    async def main():
        peer = nc.Connector(backend="loopback")
        me = nc.Connector(backend="loopback")
        readable = await peer.create_readable(nc.Descriptor(bytearray(b"A" * 64)))
        model = nc.RdmaMetadata.model_validate_json(readable.metadata().model_dump_json())
        object.__setattr__(model.descriptors[0], "size", 32)
        assert model.model_dump_json() == pydantic_dump(model)
        assert '"size":32' in model.model_dump_json()
        dst = bytearray(32)
        read = await me.begin_read(model, nc.Descriptor(dst))
        await read.wait_for_completion()
        assert bytes(dst) == b"A" * 32
        readable.cancel()

    run(main())


def test_a_key_set_after_first_use_is_the_key_the_next_transfer_sends(backend):
    # py_metadata_twin_stale_after_field_edit.py (b): a model pydantic built
    # was used once (the twin remembered then) and its key changed after.
    require_backend(backend)

    async def main():
        peer = nc.Connector(backend=backend)
        me = nc.Connector(backend=backend)
        readable = await peer.create_readable(nc.Descriptor(bytearray(b"B" * 64)))
        good = readable.metadata().notification_key
        plain = nc.RdmaMetadata(**{**readable.metadata().model_dump(), "notification_key": "wrong-key"})
        try:
            # Loopback refuses the key no live operation has; NIXL moves the
            # bytes and the peer ignores the notification.
            op = await me.begin_read(plain, nc.Descriptor(bytearray(64)))
            await op.wait_for_completion(timeout=10)
            assert backend == "nixl"
        except RuntimeError:
            assert backend == "loopback"
        assert nc._twin_of(plain, exact=False) is not None, "remembered on first use"
        object.__setattr__(plain, "notification_key", good)
        dst = bytearray(64)
        read = await me.begin_read(plain, nc.Descriptor(dst))
        await read.wait_for_completion()
        # The peer's operation ends only on its own key: the one sent.
        await readable.wait_for_completion()
        assert bytes(dst) == b"B" * 64

    run(main())
