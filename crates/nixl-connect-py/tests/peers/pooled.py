"""How Dynamo 1.6's first-party multimodal components drive `nixl_connect`'s
private pooled surface, rewritten against an injected module so that the
same code runs over `nixl_connect` and over the real `dynamo.nixl_connect`.

What the components do, and what this module does the same way (NumPy
`uint8` arrays stand for their `torch.uint8` tensors: the test environment
has no torch):

- a `Connector` subclass that sets ``self._connection = None`` in its
  constructor and overrides ``_create_connection()`` to build
  ``Connection(self, 1)`` itself, once (`persistent_connector_class`);
- ``Remote._release`` replaced by a no-op at import (`patch_remote_release`);
- the receiver (embedding and mm_kwargs receivers): a pool of buffers, each
  described once and registered up front with
  ``register_with_connector(<the connection>)``, the connection obtained by
  running ``_create_connection()`` with ``asyncio.run`` in a worker thread;
  per payload it takes a buffer, sets ``_data_size`` to the payload's size,
  slices ``_data_ref[:n]``, ``begin_read``s, awaits, and sets
  ``_data_size`` back (`PooledReceiver`);
- the mm_kwargs sender: slots of (buffer, descriptor registered up front, a
  ``ReadableOperation`` subclass with a no-op ``_release`` built as
  ``Sub(connection, descriptor)``); per payload it copies the bytes in, sets
  ``_data_size``, clears ``_serialized`` and ``_serialized_request``, sets
  ``_status = OperationStatus.INITIALIZED``, publishes ``metadata()`` and
  awaits ``wait_for_completion()``, then sets ``_data_size`` back to the
  slot's capacity (`PooledSender`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
from queue import Queue
from typing import Any

import numpy as np


def patch_remote_release(nixl_connect: Any) -> None:
    """The components' module-level patch: a `Remote` is never released."""

    def keep(self: Any) -> None:
        pass

    nixl_connect.Remote._release = keep


def persistent_connector_class(nixl_connect: Any) -> type:
    """A `Connector` subclass keeping one `Connection(self, 1)` of its own."""

    class PersistentConnector(nixl_connect.Connector):
        def __init__(self) -> None:
            super().__init__()
            self._connection = None
            self.connections_made = 0

        async def _create_connection(self) -> Any:
            if self._connection is None:
                self._connection = nixl_connect.Connection(self, 1)
                self.connections_made += 1
                await self._connection.initialize()
            return self._connection

    return PersistentConnector


def connection_from_a_thread(connector: Any) -> Any:
    """``_create_connection()`` run to completion on a fresh event loop in a
    worker thread, as the components do from a constructor that may be
    called inside a running loop."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, connector._create_connection()).result(timeout=30)


def digest(data: Any) -> str:
    return hashlib.sha256(np.asarray(data, dtype=np.uint8).tobytes()).hexdigest()


class PooledReceiver:
    """Reads payloads into pre-registered buffers of `max_bytes`, a prefix
    each (the receiver pattern)."""

    def __init__(self, nixl_connect: Any, count: int, max_bytes: int) -> None:
        self.nc = nixl_connect
        self.connector = persistent_connector_class(nixl_connect)()
        self.connection = connection_from_a_thread(self.connector)
        self.max_bytes = max_bytes
        self.buffers: list[np.ndarray] = []
        self.free: Queue = Queue()
        for _ in range(count):
            buffer = np.zeros(max_bytes, dtype=np.uint8)
            descriptor = nixl_connect.Descriptor((buffer, "cpu"))
            descriptor.register_with_connector(self.connection)
            self.buffers.append(buffer)
            self.free.put(descriptor)

    async def receive(self, metadata_json: str) -> tuple[Any, np.ndarray]:
        """Reads the payload `metadata_json` describes into a pooled buffer;
        returns the descriptor (give it back with `release`) and the bytes
        received, a view of the buffer."""
        metadata = self.nc.RdmaMetadata.model_validate_json(metadata_json)
        size = metadata.descriptors[0].size
        descriptor = self.free.get_nowait()
        full = descriptor._data_size
        descriptor._data_size = size
        received = descriptor._data_ref[:size]
        operation = await self.connector.begin_read(metadata, descriptor)
        await operation.wait_for_completion()
        descriptor._data_size = full
        return descriptor, received

    def release(self, descriptor: Any) -> None:
        self.free.put(descriptor)


class PooledSender:
    """Serves payloads from pre-registered slots of `max_bytes`, re-arming
    one readable per slot (the mm_kwargs sender pattern)."""

    def __init__(self, nixl_connect: Any, count: int, max_bytes: int) -> None:
        self.nc = nixl_connect
        self.connector = nixl_connect.Connector()
        connection = connection_from_a_thread(self.connector)

        class NonReleasingOp(nixl_connect.ReadableOperation):
            def _release(self) -> None:
                pass

        self.slots: Queue = Queue()
        for _ in range(count):
            buffer = np.zeros(max_bytes, dtype=np.uint8)
            descriptor = nixl_connect.Descriptor((buffer, "cpu"))
            descriptor.register_with_connector(connection)
            operation = NonReleasingOp(connection, descriptor)
            self.slots.put((buffer, descriptor, operation, max_bytes))

    def load(self, payload: np.ndarray) -> tuple[tuple, Any]:
        """Copies `payload` into a free slot and re-arms its readable;
        returns the slot and the metadata to send."""
        slot = self.slots.get_nowait()
        buffer, descriptor, operation, _ = slot
        size = len(payload)
        buffer[:size] = payload
        descriptor._data_size = size
        descriptor._serialized = None
        operation._serialized_request = None
        operation._status = self.nc.OperationStatus.INITIALIZED
        return slot, operation.metadata()

    async def finish(self, slot: tuple) -> None:
        """Awaits the peer's read of the slot, then returns it to the pool."""
        _, descriptor, operation, capacity = slot
        await operation.wait_for_completion()
        descriptor._data_size = capacity
        self.slots.put(slot)
