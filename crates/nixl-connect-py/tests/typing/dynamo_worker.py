# SPDX-License-Identifier: Apache-2.0
"""A Dynamo-style worker, written against the package's types.

Two workers share the in-process loopback fabric: a prefill worker exposes its
KV blocks (readable) and a landing buffer (writable), a decode worker READs the
blocks and WRITEs a reply, the metadata crossing as JSON as it would over the
request plane; then Dynamo's pooled components' way (a re-armed readable, a
pooled receiver reading prefixes) and this package's pools. Every public class of `nixl_connect` appears, the abstract ones
in annotations.

Checked, not collected: ``mypy`` and ``pyright`` run in this folder (see
``mypy.ini`` and ``pyrightconfig.json``), and ``../test_typed_worker.py`` runs
``python dynamo_worker.py``, which exits 0 after printing `OK_LINE`.
"""

# Dynamo's pooled components use private names of the API (`_data_size`,
# `_data_ref`, `_status`, `_serialized_request`, `_create_connection`); a
# worker ported from them does too (`pooled_prefixes`).
# pyright: reportPrivateUsage=false

from __future__ import annotations

import asyncio
import ctypes

import numpy as np

from nixl_connect import (
    AbstractOperation,
    ActiveOperation,
    BlockPool,
    Connection,
    Connector,
    Descriptor,
    Device,
    DeviceKind,
    OperationKind,
    OperationStatus,
    PassiveOperation,
    RdmaMetadata,
    ReadableOperation,
    ReadOperation,
    RegisteredMemory,
    Remote,
    SerializedDescriptor,
    WritableOperation,
    WriteOperation,
)

OK_LINE = "dynamo_worker: every transfer arrived"
BLOCK = 4096
TIMEOUT_S = 30.0


def describe(operation: AbstractOperation) -> str:
    """What a Dynamo worker logs about any operation."""
    kind: OperationKind = operation.operation_kind
    status: OperationStatus = operation.status
    owner: Connection = operation.connection
    worker: Connector = owner.connector
    return f"{type(operation).__name__}({kind}, {status}) on {owner} of {worker}"


def wire(operation: PassiveOperation) -> str:
    """The passive side's metadata, as the request plane carries it."""
    return operation.metadata().model_dump_json()


async def finish(operation: ActiveOperation) -> OperationStatus:
    """Waits for an active operation as a Dynamo handler does (bounded)."""
    await asyncio.wait_for(operation.wait_for_completion(), TIMEOUT_S)
    return operation.status


async def read_kv_blocks(prefill: Connector, decode: Connector) -> None:
    """Decode READs prefill's blocks: one NumPy array, one raw pointer."""
    kv = np.arange(BLOCK // 4, dtype=np.float32)
    raw = ctypes.create_string_buffer(bytes(range(256)) * (BLOCK // 256), BLOCK)
    sources = [
        Descriptor((kv, "cpu")),
        Descriptor((ctypes.addressof(raw), BLOCK, Device("cpu"), raw)),
    ]
    out_kv = np.zeros_like(kv)
    out_raw = bytearray(BLOCK)
    targets = [Descriptor((out_kv, Device("cpu"))), Descriptor(out_raw)]

    readable: ReadableOperation
    with await prefill.create_readable(sources) as readable:
        waiting: OperationStatus = readable.status
        assert waiting is OperationStatus.INITIALIZED, describe(readable)
        metadata = RdmaMetadata.model_validate_json(wire(readable))
        assert metadata.operation_kind == OperationKind.READ
        remote = metadata.to_descriptors()
        assert isinstance(remote, list) and [d.size for d in remote] == [BLOCK, BLOCK]

        read: ReadOperation
        with await decode.begin_read(metadata, targets) as read:
            assert await finish(read) is OperationStatus.COMPLETE, describe(read)
            results: list[Descriptor] = read.results()
            assert results == targets
        await asyncio.wait_for(readable.wait_for_completion(), TIMEOUT_S)
        assert readable.status is OperationStatus.COMPLETE, describe(readable)

    assert np.array_equal(out_kv, kv), "READ: the NumPy block did not arrive"
    assert bytes(out_raw) == raw.raw, "READ: the raw block did not arrive"


async def write_reply(prefill: Connector, decode: Connector) -> None:
    """Decode WRITEs a reply (``bytes``, read-only) into prefill's buffer."""
    reply = b"decoded:" + bytes(range(200)) * 20
    landing = bytearray(len(reply))
    target = Descriptor(landing)

    writable: WritableOperation
    with await prefill.create_writable(target) as writable:
        metadata = RdmaMetadata.model_validate_json(wire(writable))
        assert metadata.operation_kind == OperationKind.WRITE
        source = Descriptor(reply)
        assert not source.is_writable

        write: WriteOperation
        with await decode.begin_write(source, metadata) as write:
            assert await finish(write) is OperationStatus.COMPLETE, describe(write)
        await asyncio.wait_for(writable.wait_for_completion(), TIMEOUT_S)
        assert writable.status is OperationStatus.COMPLETE, describe(writable)

    assert bytes(landing) == reply, "WRITE: the reply did not arrive"


async def cancel_unused(prefill: Connector) -> None:
    """A request that was dropped: its writable is cancelled, unused."""
    spare = Descriptor(bytearray(BLOCK))
    writable = await prefill.create_writable(spare)
    writable.cancel()
    await writable.wait_for_completion()
    assert writable.status is OperationStatus.CANCELLED, describe(writable)


def check_descriptors_and_devices() -> None:
    """Descriptors and devices as Dynamo describes them on the wire."""
    kv = np.ones(BLOCK, dtype=np.uint8)
    descriptor = Descriptor((kv, "cpu"))
    serialized: SerializedDescriptor = descriptor.metadata
    assert serialized.size == BLOCK and serialized.device == "cpu"
    parsed = SerializedDescriptor.model_validate_json(serialized.model_dump_json())
    remote = Descriptor.from_serialized(parsed)
    assert (remote.ptr, remote.size) == (descriptor.ptr, descriptor.size)

    host: Device = descriptor.device
    assert host.kind is DeviceKind.HOST and host.id == 0 and str(host) == "cpu"
    assert host == Device("cpu")
    gpu = Device((DeviceKind.CUDA, 1))
    assert (str(gpu), gpu.kind.nixl_mem_type) == ("cuda:1", "VRAM")
    assert Device("cuda:1") == gpu


class PersistentConnector(Connector):
    """Dynamo's pooled components' connector: one connection of its own."""

    def __init__(self) -> None:
        super().__init__(backend="loopback")
        self._connection: Connection | None = None

    async def _create_connection(self) -> Connection:
        if self._connection is None:
            self._connection = Connection(self, 1)
            await self._connection.initialize()
        return self._connection


class NonReleasingReadable(ReadableOperation):
    """The mm_kwargs sender's readable, re-armed per payload."""

    def _release(self) -> None:
        pass


def keep_remote(self: Remote) -> None:
    """The components' replacement for `Remote._release`."""


async def pooled_prefixes(prefill: Connector) -> None:
    """A re-armed readable serves two payloads to a pooled receiver, which
    reads each into the prefix of a pre-registered buffer; then the same
    through this package's own pools."""
    Remote._release = keep_remote  # type: ignore[method-assign]
    receiver = PersistentConnector()
    connection = await receiver._create_connection()
    landing = np.zeros(BLOCK, dtype=np.uint8)
    pooled = Descriptor((landing, "cpu"))
    pooled.register_with_connector(connection)

    staging = np.zeros(BLOCK, dtype=np.uint8)
    slot = Descriptor((staging, "cpu"))
    slot.register_with_connector(await prefill._create_connection())
    readable = NonReleasingReadable(await prefill._create_connection(), slot)
    for size in (100, 3000):
        staging[:size] = size % 251
        slot._data_size = size
        slot._serialized = None
        readable._serialized_request = None
        readable._status = OperationStatus.INITIALIZED
        metadata = readable.metadata()
        pooled._data_size = size
        prefix = pooled._data_ref[:size]
        read = await receiver.begin_read(metadata, pooled)
        assert await finish(read) is OperationStatus.COMPLETE, describe(read)
        await asyncio.wait_for(readable.wait_for_completion(), TIMEOUT_S)
        pooled._data_size = pooled.capacity
        assert bytes(prefix) == bytes([size % 251]) * size, "pooled prefix did not arrive"

    blocks = BlockPool(bytearray(b"k" * 4 * BLOCK), BLOCK, prefill)
    memory = RegisteredMemory(bytearray(2 * BLOCK), connection)
    sources: list[Descriptor] | None = blocks.checkout(2)
    assert sources is not None and blocks.free == 2
    targets = [memory.descriptor(0, BLOCK), memory.descriptor(BLOCK, BLOCK)]
    exposed = await prefill.create_readable(sources)
    moved = await receiver.begin_read(exposed.metadata(), targets)
    assert await finish(moved) is OperationStatus.COMPLETE, describe(moved)
    await asyncio.wait_for(exposed.wait_for_completion(), TIMEOUT_S)
    assert all(bytes(t._data_ref) == b"k" * BLOCK for t in targets)


async def main() -> None:
    prefill = Connector(backend="loopback")
    decode = Connector(worker_id="decode-0", backend="loopback")
    await prefill.initialize()
    assert decode.name == "decode-0" and prefill.hostname == decode.hostname
    cuda: bool = prefill.is_cuda_available
    del cuda

    check_descriptors_and_devices()
    await read_kv_blocks(prefill, decode)
    await write_reply(prefill, decode)
    await cancel_unused(prefill)
    await pooled_prefixes(prefill)
    print(OK_LINE)


if __name__ == "__main__":
    asyncio.run(main())
