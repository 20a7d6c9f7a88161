"""Peer keys (issue 43, item 3): connectors given the same `peer_keys` move
bytes through sealed agent blobs, on both backends; a blob that no key of the
loader's sealed (another key, no key, a changed byte) is refused with
`PermissionError` before the backend loads it; without keys the blobs are
Dynamo's, unchanged; bad keys are refused with their argument's name."""

import uuid

import numpy as np
import pytest

import nixl_connect as nc

from conftest import require_backend, run

KEY = b"a shared key of thirty-two bytes"
OTHER = "00112233445566778899aabbccddeeff"  # hex, 16 bytes


def connector(backend, keys):
    return nc.Connector(f"keys-{uuid.uuid4().hex[:8]}", backend=backend, peer_keys=keys)


async def read_from(server, client, fill):
    src = np.full(4096, fill, np.uint8)
    dst = np.zeros(4096, np.uint8)
    readable = await server.create_readable(nc.Descriptor((src, "cpu")))
    read = await client.begin_read(readable.metadata(), nc.Descriptor((dst, "cpu")))
    await read.wait_for_completion()
    await readable.wait_for_completion()
    return dst


@pytest.mark.parametrize("backend", ["loopback", "nixl"])
def test_shared_keys_move_bytes_and_strangers_are_refused(backend):
    require_backend(backend)
    server, client = connector(backend, [KEY]), connector(backend, [KEY, OTHER])
    stranger, keyless = connector(backend, [OTHER]), connector(backend, None)

    async def main():
        dst = await read_from(server, client, 0x5A)
        assert int(np.count_nonzero(dst != 0x5A)) == 0
        blob = nc.Connection(server, 1).metadata
        assert blob.startswith(b"NXCAUTH1")
        assert nc.Remote(nc.Connection(client, 1), blob).name == server.name
        for loader, why in ((stranger, "does not accept"), (keyless, "has no key")):
            with pytest.raises(PermissionError, match=why):
                await read_from(server, loader, 1)
            assert loader._native_connector().remote_agents == 0
        with pytest.raises(PermissionError, match="not sealed"):
            await read_from(keyless, server, 2)

    run(main())


def test_a_changed_byte_of_a_sealed_blob_is_refused():
    server, client = connector("loopback", [KEY]), connector("loopback", [KEY])

    async def main():
        src = np.full(4096, 7, np.uint8)
        readable = await server.create_readable(nc.Descriptor((src, "cpu")))
        metadata = readable.metadata()
        text = metadata.nixl_metadata
        assert text.startswith("b64:")
        import base64
        import json
        import zlib

        sealed = bytearray(zlib.decompress(base64.b64decode(text[4:])))
        sealed[20] ^= 1
        doc = json.loads(metadata.model_dump_json())
        doc["nixl_metadata"] = "b64:" + base64.b64encode(zlib.compress(bytes(sealed))).decode()
        forged = nc.RdmaMetadata.model_validate(doc)
        dst = np.zeros(4096, np.uint8)
        with pytest.raises(PermissionError, match="does not verify"):
            await client.begin_read(forged, nc.Descriptor((dst, "cpu")))
        assert client._native_connector().remote_agents == 0
        readable.cancel()

    run(main())


@pytest.mark.parametrize(
    "keys, error, match",
    [
        (b"one key", TypeError, "list of keys"),
        ([123], TypeError, "list of keys"),
        (["not hex"], ValueError, "hex"),
        ([b"short"], ValueError, "peer_keys"),
        ([], ValueError, "peer_keys"),
    ],
)
def test_bad_keys_are_refused_with_their_argument(keys, error, match):
    with pytest.raises(error, match=match):
        nc.Connector(backend="loopback", peer_keys=keys)._native_connector()


def test_a_bad_keys_variable_refuses_every_blob(monkeypatch):
    monkeypatch.setenv("NIXL_CONNECT_PEER_KEYS", "zz")
    c = nc.Connector(backend="loopback")

    async def main():
        with pytest.raises(PermissionError, match="NIXL_CONNECT_PEER_KEYS"):
            await c.create_readable(nc.Descriptor(bytearray(64)))

    run(main())
