"""Dynamo's public API surface: names, enum values, models, validators, errors."""

import json

import numpy as np
import pytest

import nixl_connect as nc
from conftest import run


def test_enum_values_and_strings_match_dynamo():
    assert [(m.name, int(m)) for m in nc.OperationStatus] == [
        ("UNINITIALIZED", 0), ("INITIALIZED", 1), ("IN_PROGRESS", 2),
        ("COMPLETE", 3), ("CANCELLED", 4), ("ERRORED", 5),
    ]
    assert [str(s) for s in nc.OperationStatus][1:] == ["INIT", "PROC", "DONE", "STOP", "ERR"]
    assert [(m.name, int(m)) for m in nc.OperationKind] == [("UNSPECIFIED", 0), ("READ", 1), ("WRITE", 2)]
    assert (str(nc.OperationKind.READ), str(nc.OperationKind.WRITE)) == ("READ", "WRITE")
    assert (int(nc.DeviceKind.HOST), int(nc.DeviceKind.CUDA), int(nc.DeviceKind.XPU)) == (1, 2, 3)
    assert (nc.DeviceKind.HOST.nixl_mem_type, nc.DeviceKind.CUDA.nixl_mem_type) == ("DRAM", "VRAM")


@pytest.mark.parametrize(
    "text, kind, ordinal, shown",
    [("cpu", nc.DeviceKind.HOST, 0, "cpu"), ("HOST", nc.DeviceKind.HOST, 0, "cpu"),
     ("cuda", nc.DeviceKind.CUDA, 0, "cuda:0"), (" cuda:3 ", nc.DeviceKind.CUDA, 3, "cuda:3"),
     ("gpu:1", nc.DeviceKind.CUDA, 1, "cuda:1"), ("xpu:2", nc.DeviceKind.XPU, 2, "xpu:2")],
)
def test_device_parses_dynamos_strings(text, kind, ordinal, shown):
    d = nc.Device(text)
    assert (d.kind, d.id, str(d)) == (kind, ordinal, shown)
    assert nc.Device((kind, ordinal)) == d


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "", "cuda:-1"])
def test_bad_device_strings_are_value_errors(bad):
    with pytest.raises(ValueError):
        nc.Device(bad)


def test_device_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError):
        nc.Device(3)
    with pytest.raises(ValueError):
        nc.Device(None)


def test_connector_properties():
    c = nc.Connector("worker-7", backend="loopback")
    assert (c.name, str(c)) == ("worker-7", "worker-7")
    assert c.hostname and "worker-7" in repr(c)
    assert c.is_cuda_available is False
    assert c == nc.Connector("worker-7", backend="loopback")
    assert c != nc.Connector("worker-8", backend="loopback")
    assert len(nc.Connector(backend="loopback").name) == 32  # a uuid4, hex
    with pytest.raises(TypeError):
        nc.Connector("")
    with pytest.raises(ValueError):
        nc.Connector("x", backend="carrier-pigeon")


def test_a_bad_backend_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("NIXL_CONNECT_BACKEND", "carrier-pigeon")
    with pytest.raises(ValueError) as refused:
        nc.Connector("x")
    assert str(refused.value) == (
        "NIXL_CONNECT_BACKEND must be one of nixl, loopback; got 'carrier-pigeon'."
    )
    # An argument is named as the argument, and wins over the environment.
    with pytest.raises(ValueError, match="^Argument `backend` must be one of"):
        nc.Connector("x", backend="smoke-signal")
    assert nc.Connector("x", backend="loopback").backend == "loopback"


def test_await_spin_is_checked(monkeypatch):
    monkeypatch.delenv("NIXL_CONNECT_AWAIT_SPIN", raising=False)
    # The default is the backend's wait_assist (loopback's: none), capped.
    loopback = nc.Connector(backend="loopback")
    assert loopback.await_spin == loopback._native_connector().wait_assist == 0.0
    assert nc.Connector(backend="loopback", await_spin=0).await_spin == 0.0
    assert nc.Connector(backend="loopback", await_spin=0.001).await_spin == 0.001
    for bad in (-1e-6, float("nan"), float("inf"), 0.5):
        with pytest.raises(ValueError):
            nc.Connector(backend="loopback", await_spin=bad)
    for bad in ("1e-4", True, [0.0001]):
        with pytest.raises(TypeError):
            nc.Connector(backend="loopback", await_spin=bad)


def test_peer_failure_detection_is_checked(monkeypatch):
    monkeypatch.delenv("NIXL_CONNECT_PEER_FAILURE_DETECTION", raising=False)
    assert nc.Connector(backend="loopback").peer_failure_detection is True
    off = nc.Connector(backend="loopback", peer_failure_detection=False)
    assert off.peer_failure_detection is False
    for bad in (0, 1, "no", 0.0):
        with pytest.raises(TypeError, match="peer_failure_detection"):
            nc.Connector(backend="loopback", peer_failure_detection=bad)


def test_peer_failure_detection_default_comes_from_the_environment(monkeypatch):
    for word, expected in [("0", False), ("off", False), (" False ", False), ("no", False),
                           ("1", True), ("YES", True), ("on", True), ("true", True)]:
        monkeypatch.setenv("NIXL_CONNECT_PEER_FAILURE_DETECTION", word)
        assert nc.Connector(backend="loopback").peer_failure_detection is expected, word
    # An argument wins over the environment.
    monkeypatch.setenv("NIXL_CONNECT_PEER_FAILURE_DETECTION", "0")
    assert nc.Connector(backend="loopback", peer_failure_detection=True).peer_failure_detection
    for bad in ("", "2", "maybe"):
        monkeypatch.setenv("NIXL_CONNECT_PEER_FAILURE_DETECTION", bad)
        with pytest.raises(ValueError, match="NIXL_CONNECT_PEER_FAILURE_DETECTION"):
            nc.Connector(backend="loopback")


def test_nixl_await_spin_default_is_its_wait_assist_capped(monkeypatch):
    from conftest import require_backend

    require_backend("nixl")
    monkeypatch.delenv("NIXL_CONNECT_AWAIT_SPIN", raising=False)
    c = nc.Connector(backend="nixl")
    # NIXL's waiter polls for 200 us; an await holds the loop for at most 100.
    assert c._native_connector().wait_assist == 200e-6
    assert c.await_spin == nc.AWAIT_SPIN_CAP == 100e-6
    # A number, or the environment, overrides it.
    assert nc.Connector(backend="nixl", await_spin=3e-4).await_spin == 3e-4
    monkeypatch.setenv("NIXL_CONNECT_AWAIT_SPIN", "5e-5")
    assert nc.Connector(backend="nixl").await_spin == 5e-5


def test_await_spin_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("NIXL_CONNECT_AWAIT_SPIN", "0")
    assert nc.Connector(backend="loopback").await_spin == 0.0
    # An explicit argument wins over the environment.
    assert nc.Connector(backend="loopback", await_spin=2e-4).await_spin == 2e-4
    for bad in ("fast", "-1", "1"):
        monkeypatch.setenv("NIXL_CONNECT_AWAIT_SPIN", bad)
        with pytest.raises(ValueError, match="NIXL_CONNECT_AWAIT_SPIN"):
            nc.Connector(backend="loopback")


def test_serialized_descriptor_validators_match_dynamo():
    s = nc.SerializedDescriptor(device=" CUDA:1 ", ptr=4096, size=64)
    assert s.device == "cuda:1"
    for bad in ({"device": "tpu", "ptr": 1, "size": 1}, {"device": "cpu", "ptr": 0, "size": 1},
                {"device": "cpu", "ptr": 1, "size": -1}, {"device": "cpu", "ptr": 1, "size": 1, "x": 1}):
        with pytest.raises(ValueError):
            nc.SerializedDescriptor(**bad)
    with pytest.raises(Exception):
        s.ptr = 5  # frozen


def test_rdma_metadata_model_round_trips_dynamos_json():
    wire = json.dumps({
        "descriptors": [{"device": "cpu", "ptr": 140230000000000, "size": 4096}],
        "nixl_metadata": "b64:eJxLTE/NK9FNyslPAgAVQgPc",
        "notification_key": "4bd9c5f2-0c36-4a1b-9b5e-6f1a1c3e7d10",
        "operation_kind": 1,
    }, separators=(",", ":"))
    m = nc.RdmaMetadata.model_validate_json(wire)
    assert m.model_dump_json() == wire
    assert isinstance(m.to_descriptors(), nc.Descriptor)
    assert m.to_descriptors().size == 4096
    with pytest.raises(TypeError):  # Dynamo's validator raises TypeError itself
        nc.RdmaMetadata.model_validate_json(wire.replace('"operation_kind":1', '"operation_kind":7'))
    with pytest.raises(ValueError):
        nc.RdmaMetadata(descriptors=[]).to_descriptors()


def test_descriptor_properties_and_metadata():
    a = np.arange(16, dtype=np.float32)
    d = nc.Descriptor((a, "cpu"))
    assert (d.ptr, d.size, str(d.device)) == (a.__array_interface__["data"][0], 64, "cpu")
    assert d.metadata == nc.SerializedDescriptor(device="cpu", ptr=d.ptr, size=64)
    assert nc.Descriptor.from_serialized(d.metadata).size == 64
    assert not d.is_registered
    assert f"size=64" in repr(d)


def test_register_memory_is_idempotent_and_refuses_a_second_connector():
    a = nc.Connector("reg-a", backend="loopback")
    b = nc.Connector("reg-b", backend="loopback")
    d = nc.Descriptor(bytearray(256))
    d.register_memory(a)
    assert d.is_registered
    d.register_memory(a)
    d.register_with_connector(a)
    with pytest.raises(RuntimeError):
        d.register_memory(b)
    d.deregister_with_connector(a)
    assert not d.is_registered
    d.register_with_connector(b)
    assert d.is_registered
    with pytest.raises(TypeError):
        d.register_memory("not a connector")


@pytest.mark.parametrize(
    "data, error",
    [(None, ValueError), (42, TypeError), ("text", TypeError), ([1, 2], TypeError),
     ((1,), TypeError), ((np.zeros(4), 5), TypeError), ((0, 64, "cpu", None), ValueError),
     ((4096, -1, "cpu"), ValueError), ((4096, 64, "tpu:0"), ValueError), ((4096, 64, 3.5), TypeError),
     ((np.zeros(4), "cuda:0"), ValueError),
     (np.zeros((4, 4))[:, 1], ValueError)],
    ids=["none", "int", "str", "list", "1-tuple", "array-bad-device", "null-ptr", "negative-size",
         "bad-device", "device-type", "host-array-as-cuda", "strided-array"],
)
def test_bad_descriptor_input_raises_dynamos_exceptions(data, error):
    with pytest.raises(error):
        nc.Descriptor(data)


def test_bad_operation_input_raises_dynamos_exceptions():
    passive = nc.Connector("bad-p", backend="loopback")
    active = nc.Connector("bad-a", backend="loopback")

    async def go():
        with pytest.raises(TypeError):
            await passive.create_readable("nope")
        with pytest.raises(TypeError):
            await passive.create_readable([nc.Descriptor(b"x"), "nope"])
        with pytest.raises(ValueError, match="empty"):
            await passive.create_writable([])
        readable = await passive.create_readable([nc.Descriptor(b"a" * 64), nc.Descriptor(b"b" * 64)])
        writable = await passive.create_writable(nc.Descriptor(bytearray(64)))
        with pytest.raises(TypeError):
            await active.begin_read(readable.metadata().model_dump_json(), nc.Descriptor(bytearray(64)))
        with pytest.raises(TypeError):
            await active.begin_read(None, nc.Descriptor(bytearray(64)))
        with pytest.raises(RuntimeError):  # a writable's metadata given to begin_read
            await active.begin_read(writable.metadata(), nc.Descriptor(bytearray(64)))
        with pytest.raises(RuntimeError):
            await active.begin_write(nc.Descriptor(b"z" * 64), readable.metadata())
        with pytest.raises(ValueError):  # two remote descriptors, one local
            await active.begin_read(readable.metadata(), nc.Descriptor(bytearray(64)))
        with pytest.raises(ValueError):  # sizes differ
            await active.begin_read(readable.metadata(), [nc.Descriptor(bytearray(64)), nc.Descriptor(bytearray(65))])
        with pytest.raises(ValueError, match="read-only"):  # bytes cannot receive a READ
            await active.begin_read(readable.metadata(), [nc.Descriptor(b"r" * 64), nc.Descriptor(bytearray(64))])
        with pytest.raises(ValueError, match="read-only"):  # nor be exposed as writable
            await passive.create_writable(nc.Descriptor(b"w" * 64))
        ro = np.zeros(64, dtype=np.uint8)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            await passive.create_writable(nc.Descriptor((ro, "cpu")))
        # After every refusal the real transfer still works, descriptors intact.
        target = [bytearray(64), bytearray(64)]
        read = await active.begin_read(readable.metadata(), [nc.Descriptor(t) for t in target])
        await read.wait_for_completion()
        await readable.wait_for_completion()
        writable.cancel()
        return target

    target = run(go())
    assert [bytes(t) for t in target] == [b"a" * 64, b"b" * 64]


def test_forged_metadata_is_refused(pair):
    passive, active = pair

    async def go():
        readable = await passive.create_readable(nc.Descriptor(b"s" * 4096))
        md = readable.metadata()
        forged = md.model_copy(update={"nixl_metadata": "b64:AAAA"})
        with pytest.raises(ValueError):
            await active.begin_read(forged, nc.Descriptor(bytearray(4096)))
        read = await active.begin_read(md, nc.Descriptor(bytearray(4096)))
        await read.wait_for_completion()
        await readable.wait_for_completion()

    run(go())


# Deliberate differences from Dynamo 1.6.1's module, each documented in
# docs/dynamo-compatibility.md ("The Python surface"). Anything else that
# differs fails the comparison below.
OPERATIONS = {"AbstractOperation", "ActiveOperation", "PassiveOperation", "ReadOperation",
              "WriteOperation", "ReadableOperation", "WritableOperation"}
PASSIVE = {"AbstractOperation", "PassiveOperation", "ReadableOperation", "WritableOperation"}
EXTRA_NAMES = {"BlockPool", "FileSegment", "Metrics", "Quarantined", "RegisteredMemory",
               "set_nixl_log_level"}
EXTRA_MEMBERS = {  # member -> the classes that have it beyond Dynamo
    "wait": OPERATIONS,
    "wait_for_release": OPERATIONS,
    "cancel": PASSIVE,
    "status": {"AbstractOperation"},
    "await_spin": {"Connector"},
    "backend": {"Connector"},
    "peer_failure_detection": {"Connector"},
    "warm_up": {"Connector"},
    "begin_file_write": {"Connector"},
    "begin_file_read": {"Connector"},
    "quarantined": {"Connector"},
    "free_quarantined": {"Connector"},
    "metrics": {"Connector"},
    "capacity": {"Descriptor"},
    "is_writable": {"Descriptor"},
    "register_memory": {"Descriptor"},
}
EXTRA_PARAMETERS = {  # (class, member) -> parameters appended, each with a default
    **{(op, "wait_for_completion"): ["timeout"] for op in OPERATIONS},
    ("Connector", "__init__"): ["backend", "await_spin", "peer_failure_detection",
                                "quarantine_seconds", "quarantine_readable_bytes", "peer_keys",
                                "metrics"],
}
# Dynamo's abstract bases take constructor arguments; here their subclasses
# build them (their own constructors are Dynamo's).
NO_CONSTRUCTOR = {"AbstractOperation", "ActiveOperation", "PassiveOperation"}
EXTRA_ENUM_MEMBERS = {"DeviceKind": {"ROCM": 4}}


def dynamos_surface():
    """Dynamo 1.6.1's real module, described by tests/surface.py in a child
    process (its imports stay out of this one)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src, stub = os.environ.get("NIXL_CONNECT_DYNAMO_SRC"), os.environ.get("NIXL_CONNECT_TORCH_STUB")
    if not src or not stub:
        pytest.skip("NIXL_CONNECT_DYNAMO_SRC / NIXL_CONNECT_TORCH_STUB not set (cargo xtask test sets them)")
    child = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "surface.py"), "dynamo.nixl_connect"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([src, stub])},
        capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


def surface_differences(theirs, ours):
    """What differs between two surfaces beyond the allow-lists above."""
    out = []
    for name in sorted(set(theirs) | set(ours)):
        t, o = theirs.get(name), ours.get(name)
        if t is None:
            if name not in EXTRA_NAMES:
                out.append(f"{name}: not in Dynamo's module")
            continue
        if o is None:
            out.append(f"{name}: missing")
            continue
        for key in ("kind", "bases", "fields"):
            if t.get(key) != o.get(key):
                out.append(f"{name} {key}: Dynamo {t.get(key)}, ours {o.get(key)}")
        if t.get("signature") != o.get("signature"):
            out.append(f"{name}(): Dynamo {t.get('signature')}, ours {o.get('signature')}")
        if "enum" in t or "enum" in o:
            expected = {**t.get("enum", {}), **EXTRA_ENUM_MEMBERS.get(name, {})}
            if o.get("enum") != expected:
                out.append(f"{name} members: Dynamo {t.get('enum')}, ours {o.get('enum')}")
        tm, om = t.get("members", {}), o.get("members", {})
        for member in sorted(set(tm) | set(om)):
            a, b = tm.get(member), om.get(member)
            where = f"{name}.{member}"
            if a is None:
                if member == "__init__" and name in NO_CONSTRUCTOR:
                    continue
                if name not in EXTRA_MEMBERS.get(member, ()):
                    out.append(f"{where}: not in Dynamo's module")
                continue
            if b is None:
                if not (member == "__init__" and name in NO_CONSTRUCTOR):
                    out.append(f"{where}: missing")
                continue
            if a["kind"] != b["kind"]:
                out.append(f"{where}: Dynamo's is a {a['kind']}, ours a {b['kind']}")
                continue
            if a.get("signature") != b.get("signature"):
                extra = EXTRA_PARAMETERS.get((name, member), [])
                sa, sb = a.get("signature") or [], b.get("signature") or []
                appended = sb[len(sa):]
                if not (sb[: len(sa)] == sa and [p[0] for p in appended] == extra
                        and all(p[2] is not None for p in appended)):
                    out.append(f"{where}(): Dynamo {sa}, ours {sb}")
    return out


def test_the_public_surface_is_dynamos():
    """Dynamo 1.6.1's module and this package, compared mechanically: every
    public class and function, each member's kind (property, method,
    coroutine, ...), each signature (names, kinds, defaults), enum members and
    values, pydantic fields and defaults. The documented differences are the
    allow-lists above; any other is a gap."""
    from surface import surface

    assert surface_differences(dynamos_surface(), json.loads(json.dumps(surface(nc)))) == []


def test_the_surface_comparison_finds_a_gap():
    """The comparison itself: a member, a property, a parameter or an enum
    member that Dynamo has and we lack is reported."""
    theirs = {
        "Connection": {"kind": "class", "bases": ["object"], "members": {
            "metadata": {"kind": "property"},
            "initialize": {"kind": "coroutine", "signature": [["self", "POSITIONAL_OR_KEYWORD", None]]},
        }},
        "OperationKind": {"kind": "class", "bases": ["IntEnum"], "members": {},
                          "enum": {"READ": 1, "WRITE": 2}},
    }
    ours = {
        "Connection": {"kind": "class", "bases": ["object"], "members": {
            "initialize": {"kind": "method", "signature": [["self", "POSITIONAL_OR_KEYWORD", None]]},
        }},
        "OperationKind": {"kind": "class", "bases": ["IntEnum"], "members": {}, "enum": {"READ": 1}},
    }
    assert surface_differences(theirs, ours) == [
        "Connection.initialize: Dynamo's is a coroutine, ours a method",
        "Connection.metadata: missing",
        "OperationKind members: Dynamo {'READ': 1, 'WRITE': 2}, ours {'READ': 1}",
    ]


def test_connection_metadata_is_the_agents_metadata(pair):
    """Dynamo's `Connection.metadata`: the agent's NIXL metadata (bytes,
    uncompressed), what peers load: it names the agent, and on NIXL it is
    the blob the connector's readables publish (zlib'd, ``b64:``)."""
    import base64
    import zlib

    passive, _ = pair

    async def go():
        connection = await passive._create_connection()
        readable = await passive.create_readable(nc.Descriptor(bytearray(64)))
        blob = connection.metadata
        published = zlib.decompress(base64.b64decode(readable.metadata().nixl_metadata[4:]))
        readable.cancel()
        return blob, published

    blob, published = run(go())
    assert isinstance(blob, bytes) and len(blob) > 0
    assert nc.Remote(nc.Connection(passive, 2), blob).name == passive.name
    assert blob == published


def test_every_public_name_of_dynamos_module_is_here():
    """The private names Dynamo's own pooled components use (the public ones:
    test_the_public_surface_is_dynamos)."""
    for owner, name in [("Connector", "_create_connection"), ("Descriptor", "_data_size"),
                        ("Descriptor", "_data_ref"), ("PassiveOperation", "_serialized_request"),
                        ("AbstractOperation", "_status"), ("Remote", "_release")]:
        assert hasattr(getattr(nc, owner), name), f"{owner}.{name}"
    assert {"Connection", "Remote", "RegisteredMemory", "BlockPool"} <= set(nc.__all__)
