"""A Dynamo `nixl_connect` peer for the interop tests, built on the official
NIXL Python API (the `nixl_cu12` package of the same wheel) and numpy.

It speaks Dynamo's protocol exactly: RdmaMetadata JSON with `nixl_metadata` as
"b64:" + base64(zlib level 6) of the full agent metadata (or legacy hex), the
remote agent added with add_remote_agent, and the passive side's uuid4 key as the
transfer's notification message.

    dynamo_peer.py read              read RdmaMetadata (kind 1) from stdin, READ it,
                                     print {"crc32": ..., "bytes": ...}
    dynamo_peer.py writable SIZES [--hex]
                                     publish a writable (kind 2) on stdout, wait for
                                     the peer's notification, print the crc32
"""

import base64
import json
import sys
import time
import uuid
import zlib

# The protocol owns stdout; NIXL's Python logging writes there too, so route
# everything else to stderr.
_PROTOCOL = sys.stdout
sys.stdout = sys.stderr

import numpy as np  # noqa: E402
import nixl_cu12 as nixl  # noqa: E402

TIMEOUT_S = 60


def decode_nixl_metadata(value: str) -> bytes:
    # As Dynamo's Remote.__init__: "b64:" prefix, else legacy hex; then zlib.
    if value.startswith("b64:"):
        compressed = base64.b64decode(value[len("b64:"):])
    else:
        compressed = bytes.fromhex(value)
    return zlib.decompress(compressed)


def encode_nixl_metadata(blob: bytes, legacy_hex: bool) -> str:
    compressed = zlib.compress(blob, 6)
    if legacy_hex:
        return compressed.hex()
    return "b64:" + base64.b64encode(compressed).decode("ascii")


def device_id(device: str) -> int:
    kind, _, ordinal = device.partition(":")
    assert kind == "cpu", f"this peer moves host memory only, got {device!r}"
    return int(ordinal or 0)


def crc32(buffers) -> int:
    crc = 0
    for b in buffers:
        crc = zlib.crc32(b.tobytes(), crc)
    return crc


def emit(obj) -> None:
    # pydantic's model_dump_json is compact: no spaces.
    print(json.dumps(obj, separators=(",", ":")), file=_PROTOCOL, flush=True)


def new_agent():
    return nixl.nixl_agent("dynamo-py-" + uuid.uuid4().hex, nixl.nixl_agent_config(backends=["UCX"]))


def read() -> None:
    meta = json.loads(sys.stdin.readline())
    assert meta["operation_kind"] == 1, meta["operation_kind"]
    descs = meta["descriptors"]
    agent = new_agent()
    buffers = [np.zeros(d["size"], dtype=np.uint8) for d in descs]
    agent.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in buffers], "DRAM")
    remote_name = agent.add_remote_agent(decode_nixl_metadata(meta["nixl_metadata"]))
    local = agent.get_xfer_descs([(b.ctypes.data, b.nbytes, 0) for b in buffers], "DRAM")
    remote = agent.get_xfer_descs([(d["ptr"], d["size"], device_id(d["device"])) for d in descs], "DRAM")
    key = meta["notification_key"].encode("utf-8")
    handle = agent.initialize_xfer("READ", local, remote, remote_name, key)
    state = agent.transfer(handle, key)
    deadline = time.time() + TIMEOUT_S
    while state == "PROC" and time.time() < deadline:
        time.sleep(0.0005)
        state = agent.check_xfer_state(handle)
    assert state == "DONE", state
    emit({"crc32": crc32(buffers), "bytes": sum(b.nbytes for b in buffers), "agent": agent.name})
    agent.release_xfer_handle(handle)
    agent.remove_remote_agent(remote_name)


def writable(sizes, legacy_hex: bool) -> None:
    agent = new_agent()
    buffers = [np.zeros(s, dtype=np.uint8) for s in sizes]
    agent.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in buffers], "DRAM")
    key = str(uuid.uuid4())
    emit({
        "descriptors": [{"device": "cpu", "ptr": b.ctypes.data, "size": b.nbytes} for b in buffers],
        "nixl_metadata": encode_nixl_metadata(agent.get_agent_metadata(), legacy_hex),
        "notification_key": key,
        "operation_kind": 2,
    })
    deadline = time.time() + TIMEOUT_S
    sender = None
    while sender is None:
        assert time.time() < deadline, "no notification from the Rust peer"
        for name, messages in agent.get_new_notifs().items():
            if any(m.decode("utf-8") == key for m in messages):
                sender = name
        time.sleep(0.0005)
    emit({"crc32": crc32(buffers), "bytes": sum(b.nbytes for b in buffers), "from": sender})


if __name__ == "__main__":
    if sys.argv[1] == "read":
        read()
    elif sys.argv[1] == "writable":
        writable(json.loads(sys.argv[2]), "--hex" in sys.argv[3:])
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")
