"""`RdmaMetadata`'s fast path (docs/decisions/0011, §6): `model_validate_json`,
`model_validate` and `model_dump_json` give what pydantic alone gives (the same
models, the same bytes, the same errors), whichever path a document takes.

"pydantic's own" below is the model's methods past the package's overrides
(`BaseModel`'s), which is what the package did before the fast path."""

import base64
import copy
import json
import os
import pickle
import random
import subprocess
import sys
import zlib
from typing import List

import pytest
from pydantic import BaseModel, ValidationError

import nixl_connect as nc
from nixl_connect import _native

from conftest import run

KEY = "0f8fad5b-d9cb-469f-a165-70867728950e"
BLOB = bytes(range(256)) * 4


def b64(blob: bytes = BLOB, level: int = 6) -> str:
    return "b64:" + base64.b64encode(zlib.compress(blob, level)).decode()


def hexed(blob: bytes = BLOB, level: int = 6) -> str:
    return zlib.compress(blob, level).hex()


def document(descriptors, nixl_metadata=None, key=KEY, kind=1) -> dict:
    return {
        "descriptors": [{"device": d, "ptr": p, "size": s} for d, p, s in descriptors],
        "nixl_metadata": b64() if nixl_metadata is None else nixl_metadata,
        "notification_key": key,
        "operation_kind": kind,
    }


def compact(doc) -> str:
    """JSON as pydantic writes it."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def pydantic_parse_json(data):
    return BaseModel.model_validate_json.__func__(nc.RdmaMetadata, data)


def pydantic_parse(obj):
    return BaseModel.model_validate.__func__(nc.RdmaMetadata, obj)


def pydantic_dump(model) -> str:
    return BaseModel.model_dump_json(model)


def took_fast_path(model) -> bool:
    return nc._twin_of(model, exact=True) is not None


def outcome(parse, data):
    """("ok", model) or ("error", type, message) of one parse."""
    try:
        return ("ok", parse(data))
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return ("error", type(e), str(e))


def assert_same_models(fast, slow):
    """Equal, field by field, down to pydantic's own bookkeeping."""
    assert type(fast) is type(slow) is nc.RdmaMetadata
    assert fast == slow
    assert list(fast.__dict__) == list(slow.__dict__)
    for name in ("nixl_metadata", "notification_key", "operation_kind"):
        assert getattr(fast, name) == getattr(slow, name)
        assert type(getattr(fast, name)) is type(getattr(slow, name))
    for attr in ("__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
        assert getattr(fast, attr) == getattr(slow, attr), attr
    assert type(fast.descriptors) is list
    assert len(fast.descriptors) == len(slow.descriptors)
    for f, s in zip(fast.descriptors, slow.descriptors):
        assert type(f) is type(s) is nc.SerializedDescriptor
        assert list(f.__dict__.items()) == list(s.__dict__.items())
        assert [type(v) for v in f.__dict__.values()] == [type(v) for v in s.__dict__.values()]
        for attr in ("__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"):
            assert getattr(f, attr) == getattr(s, attr), attr
        assert hash(f) == hash(s)
        assert repr(f) == repr(s)
    assert repr(fast) == repr(slow)
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    # (A lone surrogate, which Python strings may hold, cannot be written.)
    dumps = [outcome(dump, model) for dump, model in
             ((nc.RdmaMetadata.model_dump_json, fast), (pydantic_dump, fast), (pydantic_dump, slow))]
    assert dumps[0] == dumps[1] == dumps[2]


def assert_same_outcome(fast, slow):
    assert fast[0] == slow[0], (fast, slow)
    if fast[0] == "ok":
        assert_same_models(fast[1], slow[1])
    else:
        assert fast[1:] == slow[1:]


CUDA = ["cpu"] + [f"cuda:{i}" for i in range(8)]


def random_document(rng: random.Random, n: int, zero_sizes: bool = False,
                    devices=CUDA + ["xpu:1", "rocm:2"]) -> dict:
    out = []
    for i in range(n):
        device = devices[0] if rng.random() < 0.3 else rng.choice(devices)
        size = rng.choice([1, 4096, 65536, rng.randrange(1, 1 << 40)])
        if zero_sizes and rng.random() < 0.1:
            size = 0
        ptr = rng.choice([rng.randrange(1, 1 << 48), rng.randrange(1, (1 << 64) - size)])
        out.append((device, ptr, size))
    if rng.random() < 0.5:
        nixl_metadata = b64(rng.randbytes(rng.randrange(1, 3000)), rng.choice([1, 6, 9]))
    else:
        nixl_metadata = hexed(rng.randbytes(rng.randrange(1, 3000)), rng.choice([0, 6, 9]))
    key = "".join(rng.choice('abcdef0123456789-"\\/{}:,') for _ in range(rng.randrange(1, 80)))
    return document(out, nixl_metadata, key, rng.choice([1, 2]))


SIZES = [1, 2, 3, 17, 256, 1000, 4096]


@pytest.mark.parametrize("n", SIZES)
def test_a_parsed_document_dumps_to_pydantic_s_bytes(n):
    rng = random.Random(n)
    for _ in range(3 if n < 4096 else 1):
        text = compact(random_document(rng, n))
        fast = nc.RdmaMetadata.model_validate_json(text)
        assert took_fast_path(fast)
        slow = pydantic_parse_json(text)
        assert not took_fast_path(slow)
        assert fast.model_dump_json() == pydantic_dump(fast) == pydantic_dump(slow) == text
        assert_same_models(fast, slow)


@pytest.mark.parametrize("n", SIZES)
def test_a_dict_gives_the_model_pydantic_gives(n):
    rng = random.Random(1000 + n)
    for _ in range(3 if n < 4096 else 1):
        doc = random_document(rng, n)
        fast = nc.RdmaMetadata.model_validate(doc)
        assert took_fast_path(fast)
        slow = pydantic_parse(copy.deepcopy(doc))
        assert_same_models(fast, slow)
        assert fast.model_dump_json() == compact(doc)


@pytest.mark.parametrize("n", [5, 300, 4096])
def test_documents_with_sizes_of_0_take_the_fast_path_and_give_pydantic_s_models(n):
    # Sizes of 0 (empty buffers: Dynamo publishes them, and so does the core).
    rng = random.Random(2000 + n)
    doc = random_document(rng, n, zero_sizes=True)
    doc["descriptors"][n // 2]["size"] = 0
    text = compact(doc)
    fast = nc.RdmaMetadata.model_validate_json(text)
    assert took_fast_path(fast)
    assert_same_models(fast, pydantic_parse_json(text))
    assert fast.model_dump_json() == text
    from_dict = nc.RdmaMetadata.model_validate(doc)
    assert took_fast_path(from_dict)
    assert_same_models(from_dict, pydantic_parse(copy.deepcopy(doc)))
    assert_same_models(from_dict, fast)


def good() -> dict:
    return document([("cuda:0", 4096, 64), ("cpu", 1 << 63, 128)])


def edited(**fields) -> dict:
    doc = good()
    doc.update(fields)
    return doc


def edited_descriptor(**fields) -> dict:
    doc = good()
    doc["descriptors"][1].update(fields)
    return doc


def dropped(name: str, inner: bool = False) -> dict:
    doc = good()
    del (doc["descriptors"][0] if inner else doc)[name]
    return doc


BOMB = "b64:" + base64.b64encode(zlib.compress(b"\0" * (33 << 20), 9)).decode()

# Documents as objects: each is parsed as JSON (compact) and as a dict.
ODD_DOCUMENTS = {
    "good": good(),
    "size 0": edited_descriptor(size=0),
    "operation_kind 3": edited(operation_kind=3),
    "operation_kind 0": edited(operation_kind=0),
    "operation_kind -1": edited(operation_kind=-1),
    "operation_kind 300": edited(operation_kind=300),
    "operation_kind true": edited(operation_kind=True),
    "operation_kind 1.0": edited(operation_kind=1.0),
    "operation_kind 1.5": edited(operation_kind=1.5),
    "operation_kind '1'": edited(operation_kind="1"),
    "operation_kind null": edited(operation_kind=None),
    "bytes after the zlib stream": edited(nixl_metadata=b64() + "AAAA"),
    "hex with trailing bytes": edited(nixl_metadata=hexed() + "00"),
    "agent metadata not base64": edited(nixl_metadata="b64:@@@@"),
    "agent metadata odd hex": edited(nixl_metadata="abc"),
    "agent metadata empty": edited(nixl_metadata=""),
    "agent metadata a zlib bomb": edited(nixl_metadata=BOMB),
    "agent metadata an empty blob": edited(nixl_metadata=b64(b"")),
    "agent metadata not a string": edited(nixl_metadata=12),
    "notification_key empty": edited(notification_key=""),
    "notification_key with a space": edited(notification_key="a b"),
    "notification_key not ASCII": edited(notification_key="ключ"),
    "notification_key 257 bytes": edited(notification_key="k" * 257),
    "notification_key 256 bytes": edited(notification_key="k" * 256),
    "notification_key quotes and backslashes": edited(notification_key='a"b\\c/d'),
    "notification_key a number": edited(notification_key=7),
    "no descriptors": edited(descriptors=[]),
    "descriptors not a list": edited(descriptors={"device": "cpu"}),
    "descriptors null": edited(descriptors=None),
    "a descriptor not an object": edited(descriptors=[["cpu", 4096, 64]]),
    "an empty descriptor": edited(descriptors=[{}]),
    "device GPU:1": edited_descriptor(device="GPU:1"),
    "device ' cuda:0 '": edited_descriptor(device=" cuda:0 "),
    "device cuda": edited_descriptor(device="cuda"),
    "device cuda:01": edited_descriptor(device="cuda:01"),
    "device CPU": edited_descriptor(device="CPU"),
    "device host": edited_descriptor(device="host"),
    "device hip:1": edited_descriptor(device="hip:1"),
    "device xpu:1": edited_descriptor(device="xpu:1"),
    "device bogus": edited_descriptor(device="bogus"),
    "device cpu:1": edited_descriptor(device="cpu:1"),
    "device cuda:-1": edited_descriptor(device="cuda:-1"),
    "device empty": edited_descriptor(device=""),
    "device a number": edited_descriptor(device=0),
    "device null": edited_descriptor(device=None),
    "ptr 0": edited_descriptor(ptr=0),
    "ptr negative": edited_descriptor(ptr=-4096),
    "ptr 2**64": edited_descriptor(ptr=1 << 64),
    "ptr 2**64 - 1": edited_descriptor(ptr=(1 << 64) - 2, size=1),
    "ptr + size overflows": edited_descriptor(ptr=(1 << 64) - 64, size=128),
    "ptr a float": edited_descriptor(ptr=4096.0),
    "ptr a string": edited_descriptor(ptr="4096"),
    "ptr true": edited_descriptor(ptr=True),
    "ptr null": edited_descriptor(ptr=None),
    "size negative": edited_descriptor(size=-1),
    "size 2**64": edited_descriptor(size=1 << 64),
    "size a float": edited_descriptor(size=64.0),
    "an extra field": edited(extra=1),
    "an extra descriptor field": edited_descriptor(extra=1),
    "no descriptors field": dropped("descriptors"),
    "no agent metadata": dropped("nixl_metadata"),
    "no notification_key": dropped("notification_key"),
    "no operation_kind": dropped("operation_kind"),
    "no device": dropped("device", inner=True),
    "no ptr": dropped("ptr", inner=True),
    "no size": dropped("size", inner=True),
    "empty": {},
    "a list": [1, 2],
    "a string": "metadata",
    "null": None,
}


def text_forms() -> dict:
    good_text = compact(good())
    forms = {f"json: {name}": compact(doc) for name, doc in ODD_DOCUMENTS.items()}
    forms.update({
        "json: as an array": compact(list(good().values())),
        "json: spaced": json.dumps(good(), indent=2),
        "json: other key order": compact(dict(reversed(list(good().items())))),
        "json: descriptor keys in another order": compact(edited(descriptors=[
            {"size": 64, "ptr": 4096, "device": "cuda:0"}])),
        "json: a duplicate key": good_text[:-1] + ',"operation_kind":2}',
        "json: a duplicate descriptor key": good_text.replace('"size":64', '"size":64,"size":65'),
        "json: escapes": good_text.replace('"cuda:0"', '"\\u0063uda:0"').replace(
            '"descriptors"', '"\\u0064escriptors"'),
        "json: a lone surrogate escape": good_text.replace(KEY, "\\ud800"),
        "json: trailing garbage": good_text + "x",
        "json: trailing whitespace": good_text + " \n",
        "json: truncated": good_text[:-1],
        "json: empty": "",
        "json: a number with an exponent": good_text.replace('"size":64', '"size":6.4e1'),
        "json: a negative zero": good_text.replace('"size":64', '"size":-0'),
        "json: a huge integer": good_text.replace('"size":64', '"size":' + "9" * 400),
        "json: NaN": good_text.replace('"size":64', '"size":NaN'),
        "json: 64 MiB and more (padding)": good_text + " " * (64 << 20),
        "bytes: good": good_text.encode(),
        "bytearray: good": bytearray(good_text.encode()),
        "bytes: not UTF-8": good_text.replace(KEY, "k").encode().replace(b'"k"', b'"\xff"'),
        "str: a lone surrogate": good_text.replace(KEY, "\ud800"),
        "memoryview": memoryview(good_text.encode()),
        "int": 7,
        "None": None,
    })
    return forms


TEXT_FORMS = text_forms()


@pytest.mark.parametrize("name", list(TEXT_FORMS))
def test_model_validate_json_accepts_and_refuses_exactly_what_pydantic_does(name):
    data = TEXT_FORMS[name]
    fast = outcome(nc.RdmaMetadata.model_validate_json, data)
    slow = outcome(pydantic_parse_json, data)
    assert_same_outcome(fast, slow)
    if fast[0] == "ok":
        # What the native parser read is a model pydantic would write back
        # byte for byte; what it left to pydantic dumps through pydantic.
        assert fast[1].model_dump_json() == pydantic_dump(slow[1])


def test_the_fast_path_takes_the_documents_it_should():
    # The forms above that must not cost pydantic's price (checked on data:
    # only the fast path leaves a twin).
    for name in ("json: good", "json: other key order", "json: descriptor keys in another order",
                 "json: escapes", "json: spaced", "json: trailing whitespace",
                 "json: notification_key quotes and backslashes",
                 "json: notification_key 256 bytes", "json: ptr 2**64 - 1",
                 "json: device xpu:1", "json: size 0",
                 "bytes: good", "bytearray: good"):
        assert took_fast_path(nc.RdmaMetadata.model_validate_json(TEXT_FORMS[name])), name
    for name in ("json: operation_kind 3", "json: bytes after the zlib stream",
                 "json: device GPU:1", "json: a duplicate key", "json: agent metadata a zlib bomb",
                 "json: 64 MiB and more (padding)", "json: ptr negative"):
        model = nc.RdmaMetadata.model_validate_json(TEXT_FORMS[name])
        assert not took_fast_path(model), name


class Text(str):
    pass


class Number(int):
    pass


class Mapping(dict):
    pass


def dict_forms() -> dict:
    forms = {f"dict: {name}": doc for name, doc in ODD_DOCUMENTS.items()}
    doc = good()
    forms.update({
        "dict: a str subclass": edited_descriptor(device=Text("cuda:1")),
        "dict: an int subclass": edited_descriptor(ptr=Number(8192)),
        "dict: an IntEnum kind": edited(operation_kind=nc.OperationKind.WRITE),
        "dict: a dict subclass": Mapping(doc),
        "dict: a descriptor dict subclass": edited(descriptors=[Mapping(doc["descriptors"][0])]),
        "dict: descriptors a tuple": edited(descriptors=tuple(doc["descriptors"])),
        "dict: descriptors models": edited(descriptors=[
            nc.SerializedDescriptor(device="cuda:0", ptr=4096, size=64)]),
        "dict: a str subclass key": {Text(k) if k == "notification_key" else k: v
                                     for k, v in good().items()},
        "dict: a lone surrogate": edited(notification_key="\ud800"),
        "dict: a model": pydantic_parse(good()),
        "dict: bytes agent metadata": edited(nixl_metadata=b64().encode()),
    })
    return forms


DICT_FORMS = dict_forms()


@pytest.mark.parametrize("name", list(DICT_FORMS))
def test_model_validate_accepts_and_refuses_exactly_what_pydantic_does(name):
    data = DICT_FORMS[name]
    fast = outcome(nc.RdmaMetadata.model_validate, copy.deepcopy(data))
    slow = outcome(pydantic_parse, copy.deepcopy(data))
    assert_same_outcome(fast, slow)


def test_model_validate_of_an_exact_dict_takes_the_fast_path_and_of_anything_else_not():
    assert took_fast_path(nc.RdmaMetadata.model_validate(good()))
    assert took_fast_path(nc.RdmaMetadata.model_validate(DICT_FORMS["dict: size 0"]))
    for name in ("dict: a str subclass", "dict: an int subclass", "dict: an IntEnum kind",
                 "dict: a dict subclass", "dict: descriptors a tuple",
                 "dict: device GPU:1"):
        assert not took_fast_path(nc.RdmaMetadata.model_validate(DICT_FORMS[name])), name


def test_a_model_passes_through_model_validate_as_pydantic_returns_it():
    model = nc.RdmaMetadata.model_validate_json(compact(good()))
    assert nc.RdmaMetadata.model_validate(model) is pydantic_parse(model) is model


def test_options_and_subclasses_go_through_pydantic():
    text = compact(good())
    strict = nc.RdmaMetadata.model_validate_json(text, strict=True)
    assert not took_fast_path(strict)
    assert_same_models(strict, pydantic_parse_json(text))
    with_context = nc.RdmaMetadata.model_validate(good(), context={"x": 1})
    assert not took_fast_path(with_context)
    assert_same_models(with_context, pydantic_parse(good()))
    # Defaults given explicitly are defaults.
    assert took_fast_path(nc.RdmaMetadata.model_validate_json(text, strict=None, context=None))
    with pytest.raises(TypeError):
        nc.RdmaMetadata.model_validate_json(text, no_such_option=None)
    with pytest.raises(TypeError):
        nc.RdmaMetadata.model_validate(good(), no_such_option=None)

    class Extended(nc.RdmaMetadata):
        note: str = "n"

    sub = Extended.model_validate_json(text)
    assert type(sub) is Extended and sub.note == "n"
    assert sub.model_dump_json() == text[:-1] + ',"note":"n"}'
    assert type(Extended.model_validate(good())) is Extended


def test_dump_options_and_edited_models_dump_through_pydantic():
    text = compact(good())
    model = nc.RdmaMetadata.model_validate_json(text)
    assert model.model_dump_json(indent=2) == json.dumps(good(), indent=2)
    assert model.model_dump_json(exclude={"nixl_metadata"}) == pydantic_dump(
        model).replace(',"nixl_metadata":"' + good()["nixl_metadata"] + '"', "")
    # The list edited in place: the twin no longer describes the model.
    model.descriptors.append(nc.SerializedDescriptor(device="cpu", ptr=1, size=0))
    assert not took_fast_path(model)
    assert model.model_dump_json() == pydantic_dump(model)
    assert model.model_dump_json().endswith(
        '{"device":"cpu","ptr":1,"size":0}],"nixl_metadata":"' + good()["nixl_metadata"]
        + '","notification_key":"' + KEY + '","operation_kind":1}')
    replaced = nc.RdmaMetadata.model_validate_json(text)
    replaced.descriptors[0] = nc.SerializedDescriptor(device="cuda:0", ptr=4096, size=65)
    assert replaced.model_dump_json() == pydantic_dump(replaced)
    assert '"size":65' in replaced.model_dump_json()
    # A field changed past the frozen model's guard.
    for name, value in (("notification_key", "other"), ("operation_kind", 2),
                        ("operation_kind", True), ("nixl_metadata", hexed())):
        changed = nc.RdmaMetadata.model_validate_json(text)
        object.__setattr__(changed, name, value)
        assert not took_fast_path(changed)
        assert changed.model_dump_json() == pydantic_dump(changed)
    # A copy is a new object: pydantic's dump, the same bytes.
    copied = nc.RdmaMetadata.model_validate_json(text).model_copy()
    assert copied.model_dump_json() == text


def test_fast_models_behave_as_validated_ones():
    text = compact(good())
    fast, slow = nc.RdmaMetadata.model_validate_json(text), pydantic_parse_json(text)
    with pytest.raises(ValidationError) as fast_error:
        fast.notification_key = "x"
    with pytest.raises(ValidationError) as slow_error:
        slow.notification_key = "x"
    assert str(fast_error.value) == str(slow_error.value)
    with pytest.raises(ValidationError) as fast_error:
        fast.descriptors[0].size = 1
    with pytest.raises(ValidationError) as slow_error:
        slow.descriptors[0].size = 1
    assert str(fast_error.value) == str(slow_error.value)
    updated = fast.model_copy(update={"operation_kind": 2})
    assert updated == slow.model_copy(update={"operation_kind": 2})
    assert updated.operation_kind == 2 and fast.operation_kind == 1
    assert updated.model_dump_json() == text.replace('"operation_kind":1', '"operation_kind":2')
    assert fast.model_copy(deep=True) == slow
    assert pickle.loads(pickle.dumps(fast)) == slow
    assert copy.deepcopy(fast.descriptors[1]) == slow.descriptors[1]
    assert fast.descriptors[1].model_dump() == {"device": "cpu", "ptr": 1 << 63, "size": 128}
    assert fast.descriptors[1].to_descriptor().ptr == 1 << 63
    assert nc.RdmaMetadata.model_validate_json(fast.model_dump_json()) == fast
    assert fast.model_dump(mode="json") == good()
    assert nc.RdmaMetadata.model_json_schema() == BaseModel.model_json_schema.__func__(
        nc.RdmaMetadata)


def test_building_models_leaves_the_garbage_collector_as_it_found_it():
    # The builder pauses the collector for its burst of allocations.
    import gc

    text = compact(random_document(random.Random(5), 2000))
    native = _native.Metadata.from_json_exact(text)
    assert gc.isenabled()
    assert took_fast_path(nc.RdmaMetadata.model_validate_json(text))
    assert gc.isenabled()
    with pytest.raises(AttributeError, match="__dict__"):
        native.model(int, int)
    assert gc.isenabled()
    gc.disable()
    try:
        model = nc.RdmaMetadata.model_validate_json(text)
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert_same_models(model, pydantic_parse_json(text))


def test_a_model_nested_in_another_is_pydantic_s_as_before():
    class Request(BaseModel):
        metadata: nc.RdmaMetadata
        blocks: List[int] = []

    doc = {"metadata": good(), "blocks": [1, 2]}
    text = compact(doc)
    request = Request.model_validate_json(text)
    assert request.model_dump_json() == text
    assert request.metadata == nc.RdmaMetadata.model_validate_json(compact(good()))
    built = Request(metadata=nc.RdmaMetadata.model_validate(good()), blocks=[1, 2])
    assert built.model_dump_json() == text
    assert Request.model_validate(doc) == request


def test_the_bounds_on_untrusted_input_still_hold():
    # The native parser refuses a zlib bomb and an over-long document
    # without crashing; pydantic (which does not decode nixl_metadata) reads
    # them as it always did, and `begin_read` then refuses them.
    for name in ("json: agent metadata a zlib bomb", "json: 64 MiB and more (padding)"):
        with pytest.raises(ValueError):
            _native.Metadata.from_json_exact(TEXT_FORMS[name])
    with pytest.raises(ValueError, match="decompresses to more than"):
        _native.Metadata.from_json(TEXT_FORMS["json: agent metadata a zlib bomb"])
    with pytest.raises(ValueError, match="decompresses to more than"):
        _native.Metadata.from_dict_exact(DICT_FORMS["dict: agent metadata a zlib bomb"])
    bomb = nc.RdmaMetadata.model_validate_json(TEXT_FORMS["json: agent metadata a zlib bomb"])
    assert bomb.nixl_metadata == BOMB
    active = nc.Connector(backend="loopback")

    async def read():
        return await active.begin_read(bomb, nc.Descriptor(bytearray(64)))

    with pytest.raises(ValueError, match="decompresses to more than"):
        run(read())


def test_passive_metadata_is_built_without_json_and_dumps_pydantic_s_bytes():
    passive = nc.Connector(backend="loopback")
    active = nc.Connector(backend="loopback")
    blocks = [bytearray(os.urandom(64)) for _ in range(300)]

    async def exchange(hex_encode: bool):
        readable = await passive.create_readable([nc.Descriptor(b) for b in blocks])
        metadata = readable.metadata(hex_encode)
        assert readable.metadata(hex_encode) is metadata
        text = metadata.model_dump_json()
        assert text == pydantic_dump(metadata)
        assert metadata == pydantic_parse_json(text)
        assert took_fast_path(metadata) != hex_encode
        assert metadata.nixl_metadata.startswith("b64:") != hex_encode
        received = nc.RdmaMetadata.model_validate_json(text)
        assert took_fast_path(received)
        assert_same_models(received, pydantic_parse_json(text))
        targets = [bytearray(64) for _ in blocks]
        with await active.begin_read(received, [nc.Descriptor(t) for t in targets]) as read:
            await read.wait_for_completion()
        with readable:
            await readable.wait_for_completion()
        assert targets == blocks

    run(exchange(False))
    run(exchange(True))


def test_metadata_of_two_peers_parsed_in_turns_reaches_each_peer():
    # The agent metadata of each peer in turn, the same one twice in a row
    # too (the native parser remembers the last one it decoded).
    peers = [nc.Connector(backend="loopback") for _ in range(2)]
    active = nc.Connector(backend="loopback")

    async def exchange():
        for turn, index in enumerate([0, 0, 1, 1, 0, 1]):
            data = bytes([turn + 1]) * 256
            readable = await peers[index].create_readable(nc.Descriptor(data))
            metadata = nc.RdmaMetadata.model_validate_json(readable.metadata().model_dump_json())
            assert took_fast_path(metadata)
            target = bytearray(256)
            with await active.begin_read(metadata, nc.Descriptor(target)) as read:
                await read.wait_for_completion()
            with readable:
                await readable.wait_for_completion()
            assert bytes(target) == data, (turn, index)

    run(exchange())


def test_a_fast_parsed_writable_is_written():
    passive = nc.Connector(backend="loopback")
    active = nc.Connector(backend="loopback")
    targets = [bytearray(128) for _ in range(64)]
    data = [bytes([i]) * 128 for i in range(64)]

    async def exchange():
        writable = await passive.create_writable([nc.Descriptor(t) for t in targets])
        doc = json.loads(writable.metadata().model_dump_json())
        metadata = nc.RdmaMetadata.model_validate(doc)
        assert took_fast_path(metadata)
        with await active.begin_write([nc.Descriptor(d) for d in data], metadata) as write:
            await write.wait_for_completion()
        with writable:
            await writable.wait_for_completion()

    run(exchange())
    assert [bytes(t) for t in targets] == data


DYNAMO_SRC = os.environ.get("NIXL_CONNECT_DYNAMO_SRC")
TORCH_STUB = os.environ.get("NIXL_CONNECT_TORCH_STUB")

DYNAMO_ROUND_TRIP = """
import sys
from dynamo.nixl_connect import RdmaMetadata
for line in sys.stdin:
    print(RdmaMetadata.model_validate_json(line).model_dump_json(), flush=True)
"""


def test_dynamo_s_own_model_writes_the_bytes_ours_writes():
    if not (DYNAMO_SRC and TORCH_STUB):
        if os.environ.get("NIXL_TESTS_REQUIRED") == "1":
            pytest.fail("NIXL_CONNECT_DYNAMO_SRC / NIXL_CONNECT_TORCH_STUB not set")
        pytest.skip("Dynamo's module is not available (cargo xtask test provides it)")
    try:
        import nixl  # noqa: F401 - Dynamo's module imports it
    except ImportError:
        if os.environ.get("NIXL_TESTS_REQUIRED") == "1":
            raise
        pytest.skip("NIXL's `nixl` package is not installed (Dynamo's module imports it)")
    rng = random.Random(7)
    texts = [compact(random_document(rng, n, devices=CUDA)) for n in (1, 2, 33, 4096)]
    ours = [nc.RdmaMetadata.model_validate_json(t).model_dump_json() for t in texts]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([DYNAMO_SRC, TORCH_STUB]))
    done = subprocess.run([sys.executable, "-c", DYNAMO_ROUND_TRIP], input="\n".join(texts) + "\n",
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    theirs = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert theirs == ours == texts
