# SPDX-License-Identifier: Apache-2.0
"""NVIDIA Dynamo's ``dynamo.nixl_connect`` API (1.6.1) over a Rust core.

``import nixl_connect`` replaces ``import dynamo.nixl_connect`` in a worker:
same classes, signatures, enum values, pydantic models and exception types.
The work is done by the native module (``nixl_connect._native``, Rust): memory
descriptors keep their Python objects alive while a transfer may touch them,
operations are the Rust operations, completion wakes the asyncio event loop
from the library's own wake-up (an eventfd the loop watches, no polling), and
the GIL is released around every blocking call and transfer.

Beyond Dynamo, without changing what Dynamo callers see:

- ``wait_for_completion(timeout=None)`` and a blocking ``wait(timeout=None)``
  on every operation, ``cancel()`` on passive operations too;
- descriptors from any object exposing ``__dlpack__`` or
  ``__cuda_array_interface__`` (and ``__array_interface__``);
- ``Connector(backend="loopback")``: a process-wide in-process fabric for tests
  on machines without NIXL (``NIXL_CONNECT_BACKEND=loopback`` sets the default);
- memory registered once and described in parts: `RegisteredMemory` and
  `BlockPool` (Dynamo's pooled components do this by hand, with
  ``Descriptor._data_size``; both work);
- ``Connector(peer_failure_detection=False)``
  (``NIXL_CONNECT_PEER_FAILURE_DETECTION=0``): UCX without peer-failure
  detection (see `Connector`; what it changes, measured: the package README);
- ``await Connector.warm_up()``: the agent made, and the NIXL runtime loaded,
  at start-up instead of at the first operation;
- files as the far side of a transfer (a storage tier): `FileSegment`,
  ``await Connector.begin_file_write(...)`` and
  ``await Connector.begin_file_read(...)``;
- transfer metrics: ``Connector(metrics=Metrics())`` counts transfers, bytes,
  failures and registrations, read as OpenMetrics text, as samples, or
  through ``prometheus_client`` (`Metrics`).
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import inspect
import logging
import os
import socket
import sys
import threading
import uuid
import weakref
import zlib
from abc import ABC, abstractmethod
from enum import IntEnum
from functools import cached_property
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    TypeVar,
    Union,
    cast,
)

from pydantic import BaseModel, ConfigDict, field_validator

from . import _native

if TYPE_CHECKING:
    from typing_extensions import Self, TypeAlias

__all__ = [
    "AbstractOperation",
    "ActiveOperation",
    "BlockPool",
    "Connection",
    "Connector",
    "Descriptor",
    "Device",
    "DeviceKind",
    "FileSegment",
    "Metrics",
    "OperationKind",
    "OperationStatus",
    "PassiveOperation",
    "Quarantined",
    "RdmaMetadata",
    "ReadOperation",
    "ReadableOperation",
    "RegisteredMemory",
    "Remote",
    "SerializedDescriptor",
    "WritableOperation",
    "WriteOperation",
]

__version__: str = _native.__version__
"""The package's version."""

logger = logging.getLogger(__name__)
# The library's own records (the native module's `tracing` events) go to this
# logger too; like any library's, they show only where the application
# configured logging.
logger.addHandler(logging.NullHandler())

BACKENDS = tuple(_native.BACKENDS)
"""Backends a `Connector` can use: ``"nixl"`` (default) and ``"loopback"``."""

AWAIT_SPIN_CAP = 100e-6
"""The longest `Connector`'s default `await_spin` holds the event loop: the
default is the backend's own ``wait_assist`` (NIXL: 200 µs; loopback: 0),
capped at this (100 µs)."""


# Enums: Dynamo's names, values and string forms.


class DeviceKind(IntEnum):
    """Type of memory a descriptor has been allocated to."""

    UNSPECIFIED = 0
    HOST = 1
    """System (CPU) memory."""
    CUDA = 2
    """CUDA addressable device (GPU) memory."""
    XPU = 3
    """Intel XPU (Level-Zero) device memory (named for parity; not supported by the backends here)."""
    ROCM = 4
    """AMD ROCm/HIP device memory (beyond Dynamo)."""

    def __str__(self) -> str:
        return _DEVICE_KIND_NAMES.get(self, "<invalid>")

    @property
    def nixl_mem_type(self) -> str:
        """NIXL's segment name for this kind: ``DRAM`` for host memory, ``VRAM`` otherwise."""
        return "DRAM" if self == DeviceKind.HOST else "VRAM"


_DEVICE_KIND_NAMES = {
    DeviceKind.HOST: "cpu",
    DeviceKind.CUDA: "cuda",
    DeviceKind.XPU: "xpu",
    DeviceKind.ROCM: "rocm",
}


class OperationKind(IntEnum):
    """Kind of an operation."""

    UNSPECIFIED = 0
    READ = 1
    WRITE = 2

    def __str__(self) -> str:
        return {1: "READ", 2: "WRITE"}.get(int(self), "<invalid>")


class OperationStatus(IntEnum):
    """Status of an operation."""

    UNINITIALIZED = 0
    """The operation has not been initialized yet and is not in a valid state."""
    INITIALIZED = 1
    """A passive operation waiting for its peer."""
    IN_PROGRESS = 2
    """An active operation whose transfer is posted and moving."""
    COMPLETE = 3
    """The operation has been completed successfully."""
    CANCELLED = 4
    """The operation has been cancelled by the user or system."""
    ERRORED = 5
    """The operation has encountered an error and cannot be completed."""

    def __str__(self) -> str:
        return {1: "INIT", 2: "PROC", 3: "DONE", 4: "STOP", 5: "ERR"}.get(
            int(self), "<invalid>"
        )


_TERMINAL = (OperationStatus.COMPLETE, OperationStatus.CANCELLED, OperationStatus.ERRORED)
# `OperationKind`'s values as plain ints (an enum's `.value` costs a lookup).
_READ, _WRITE = int(OperationKind.READ), int(OperationKind.WRITE)
_STATUSES = tuple(OperationStatus)


class Device:
    """A device: ``Device("cuda:1")``, ``Device("cpu")``,
    ``Device((DeviceKind.CUDA, 1))`` or (beyond Dynamo) ``Device(torch.device("cuda", 1))``.

    Strings are parsed by the native module, the one parser of device strings
    in the package (`_native.DEVICE_FORMS` lists what it takes)."""

    __slots__ = ("_kind", "_device_id")

    def __init__(self, metadata: str | tuple[DeviceKind, int] | Any) -> None:
        if metadata is None:
            raise ValueError(f"Argument `metadata` cannot be `None`: {_native.DEVICE_FORMS}.")
        if (
            isinstance(metadata, tuple)
            and len(metadata) == 2
            and isinstance(metadata[0], DeviceKind)
            and isinstance(metadata[1], int)
        ):
            kind, device_id = metadata
        elif isinstance(metadata, str):
            kind, device_id = _parse_device(metadata)
        elif _is_torch_device(metadata):
            kind, device_id = _parse_device(str(metadata))
        else:
            raise TypeError(f"{_native.DEVICE_FORMS}; got {metadata!r}.")
        self._kind = kind
        self._device_id = device_id

    def __repr__(self) -> str:
        return f"Device(kind={self._kind}, id={self._device_id})"

    def __str__(self) -> str:
        if self._kind == DeviceKind.HOST:
            return "cpu"
        return f"{self._kind}:{self._device_id}"

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return (self._kind, self._device_id) == (other._kind, other._device_id)

    def __hash__(self) -> int:
        return hash((self._kind, self._device_id))

    @property
    def id(self) -> int:
        """The device ordinal (0 for host memory)."""
        return self._device_id

    @property
    def kind(self) -> DeviceKind:
        """The kind of memory."""
        return self._kind


def _parse_device(text: str) -> tuple[DeviceKind, int]:
    """``(kind, ordinal)`` of a device string; ``ValueError`` naming the input
    and the accepted forms."""
    kind, ordinal = _native.parse_device(text)
    return DeviceKind(kind), ordinal


def _is_torch_device(value: Any) -> bool:
    torch = sys.modules.get("torch")
    device_type = getattr(torch, "device", None) if torch is not None else None
    return isinstance(device_type, type) and isinstance(value, device_type)


def set_nixl_log_level(level: str) -> None:
    """Sets the native layer's log level for the process: ``"info"`` (NIXL's
    default), ``"warning"``, ``"error"``, ``"fatal"`` or ``"off"``; NIXL's, and
    UCX's unless ``UCX_LOG_LEVEL`` is set (``"off"`` leaves UCX only the lines it
    prints before it aborts the process). Beyond Dynamo; loads the NIXL runtime
    as a NIXL connector does, from the same places (``ImportError`` without
    one). NIXL and UCX write their lines to stderr (UCX's unless
    ``UCX_LOG_FILE`` says otherwise); this library's own records go to the
    ``nixl_connect`` logger."""
    _native.set_nixl_log_level(level, _search_paths())


# Wire models: Dynamo's pydantic models, byte-compatible JSON.


class SerializedDescriptor(BaseModel):
    """Pydantic serialization type for memory descriptors."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    device: str = "cpu"
    ptr: int = 0
    size: int = 0

    def to_descriptor(self) -> Descriptor:
        """A `Descriptor` of the (remote) memory this describes."""
        return Descriptor(data=(self.ptr, self.size, self.device, None))

    @field_validator("device")
    @classmethod
    def validate_device(cls, v: str) -> str:
        if not isinstance(v, str):
            raise TypeError("Argument `device` must be `str`.")
        v = v.strip().lower()
        # The native parser (which the transfer uses too): a device string it
        # would refuse later is refused here, with what it takes.
        _native.parse_device(v)
        return v

    @field_validator("ptr")
    @classmethod
    def validate_ptr(cls, v: int) -> int:
        if v == 0:
            raise ValueError("Argument `ptr` cannot be zero (aka `null` or `None`).")
        return v

    @field_validator("size")
    @classmethod
    def validate_size(cls, v: int) -> int:
        if v < 0:
            raise ValueError(
                "Argument `size` must be an integer greater than or equal to zero."
            )
        return v


class RdmaMetadata(BaseModel):
    """Pydantic serialization type for describing the passive side of a transfer."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    descriptors: List[SerializedDescriptor] = []
    nixl_metadata: str = ""
    notification_key: str = ""
    operation_kind: int = 0

    def to_descriptors(self) -> Descriptor | list[Descriptor]:
        """The remote descriptors: one `Descriptor`, or a list of several."""
        if len(self.descriptors) == 0:
            raise ValueError(
                "Request descriptor must contain at least one serialized descriptor."
            )
        if len(self.descriptors) == 1:
            return self.descriptors[0].to_descriptor()
        return [item.to_descriptor() for item in self.descriptors]

    @field_validator("operation_kind")
    @classmethod
    def validate_operation_kind(cls, v: int) -> int:
        if v < 1 or v > 3:
            raise TypeError(
                "Argument `operation_kind` must be an integer value of `dynamo.nixl_connect.OperationKind`."
            )
        return v

    # The fast path (docs/decisions/0011, §6): what pydantic does, without
    # running Python for every descriptor. The native parser reads only
    # documents pydantic would read into the very same model and refuses the
    # rest, which pydantic then reads (or refuses, with its own
    # `ValidationError`) exactly as before; the model is built natively, as
    # pydantic-core builds a validated one, and remembers its native twin,
    # whose JSON is what pydantic would write. Any option, a subclass, or a
    # model nested in another goes through pydantic as before.

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **options: Any) -> Self:
        """pydantic's `model_validate_json`: the same model, or the same
        `ValidationError`."""
        if cls is RdmaMetadata and _default_options(options, _VALIDATE_JSON_OPTIONS):
            try:
                native = _native.Metadata.from_json_exact(json_data)
            except (ValueError, TypeError):
                pass
            else:
                return cast("Self", _model_of(native))
        return super().model_validate_json(json_data, **options)

    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Self:
        """pydantic's `model_validate`: the same model, or the same
        `ValidationError`."""
        if (
            cls is RdmaMetadata
            and type(obj) is dict
            and _default_options(options, _VALIDATE_OPTIONS)
        ):
            try:
                native = _native.Metadata.from_dict_exact(obj)
            except ValueError:
                pass
            else:
                return cast("Self", _model_of(native))
        return super().model_validate(obj, **options)

    def model_dump_json(self, **options: Any) -> str:
        """pydantic's `model_dump_json`, byte for byte."""
        if not options and type(self) is RdmaMetadata:
            native = _twin_of(self, exact=True)
            if native is not None:
                return native.to_json()
        return super().model_dump_json(**options)


# The validated native form of each RdmaMetadata object, by identity, for as
# long as the object lives: metadata made in this process (or parsed once) is
# not encoded and parsed again for every operation. The models are frozen, but
# `object.__setattr__`, their `__dict__` and their `descriptors` list can
# still change them: each entry keeps a native `Snapshot` of the objects the
# model and each of its descriptors held when the twin was made, and the twin
# is used only while the model holds exactly those (identity checks, in Rust).
# An exact twin (the model was built from it) also writes the model's JSON.
_native_metadata: dict[
    int,
    tuple[weakref.ref[RdmaMetadata], _native.Snapshot, _native.Metadata, bool],
] = {}


def _remember_native(
    metadata: RdmaMetadata,
    native: _native.Metadata,
    exact: bool,
    snapshot: Optional[_native.Snapshot],
) -> None:
    """Remembers `native` as `metadata`'s twin while `metadata` holds what
    `snapshot` saw (taken before `native` was made from it); nothing
    without a snapshot."""
    if snapshot is None:
        return
    key = id(metadata)

    def forget(ref: weakref.ref[RdmaMetadata], key: int = key) -> None:
        entry = _native_metadata.get(key)
        if entry is not None and entry[0] is ref:
            del _native_metadata[key]

    _native_metadata[key] = (weakref.ref(metadata, forget), snapshot, native, exact)


def _twin_of(metadata: RdmaMetadata, exact: bool) -> Optional[_native.Metadata]:
    """The remembered native form of `metadata` while it still holds what it
    was made from; with `exact`, only a twin that writes the model's JSON."""
    entry = _native_metadata.get(id(metadata))
    if entry is None or entry[0]() is not metadata:
        return None
    _, snapshot, native, is_exact = entry
    if exact and not is_exact:
        return None
    if not snapshot.holds(metadata):
        return None
    return native


def _native_of(metadata: RdmaMetadata) -> _native.Metadata:
    native = _twin_of(metadata, exact=False)
    if native is not None:
        return native
    # The snapshot first: a change made while the JSON is written leaves the
    # twin unused, never stale.
    ours = isinstance(metadata, RdmaMetadata)
    snapshot = _native.Metadata.snapshot(metadata) if ours else None
    native = _native.Metadata.from_json(metadata.model_dump_json())
    if ours:
        _remember_native(metadata, native, False, snapshot)
    return native


def _model_of(native: _native.Metadata) -> RdmaMetadata:
    """The model of `native`, built without validation, and remembered."""
    model, snapshot = native.model(RdmaMetadata, SerializedDescriptor)
    model = cast(RdmaMetadata, model)
    _remember_native(model, native, True, snapshot)
    return model


def _options_of(method: Any) -> frozenset[str]:
    """The keyword options of a pydantic method (they differ by version)."""
    return frozenset(
        name
        for name, p in inspect.signature(method).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    )


_VALIDATE_OPTIONS = _options_of(BaseModel.model_validate)
_VALIDATE_JSON_OPTIONS = _options_of(BaseModel.model_validate_json)


def _default_options(options: dict[str, Any], known: frozenset[str]) -> bool:
    """Whether `options` asks for nothing but pydantic's defaults (all of
    which are `None`): an unknown one goes to pydantic, which refuses it."""
    return not options or (
        all(value is None for value in options.values()) and options.keys() <= known
    )


def _is_metadata(value: Any) -> bool:
    # Dynamo's own model (same fields, same JSON) is welcome too.
    return isinstance(value, RdmaMetadata) or (
        type(value).__name__ == "RdmaMetadata" and hasattr(value, "model_dump_json")
    )


# Descriptors.

if TYPE_CHECKING:
    # What `Descriptor(data)` takes. Tensors and arrays are `Any`: torch,
    # NumPy and CuPy are optional, and any object exposing `__dlpack__` or an
    # array interface (or a native buffer export) is taken too.
    _DescriptorData: TypeAlias = (
        Any
        | tuple[Any, Device | str]
        | bytes
        | bytearray
        | tuple[int, int, Device | str, Any]
    )


class Descriptor:
    """Memory to transfer: keeps its object alive while a transfer may touch it.

    ``data`` is one of:

    - a ``torch.Tensor`` (a non-contiguous tensor is copied, as Dynamo does, and
      the copy can only be read from);
    - ``(ndarray, Device | str)``: a NumPy (host) or CuPy (CUDA) array;
    - ``bytes`` (read-only: it can back a readable or a write, never receive
      data) or ``bytearray``;
    - ``(ptr, size, Device | str, ref)``: raw memory; ``ref`` is kept alive;
    - beyond Dynamo: any object exposing ``__dlpack__``,
      ``__cuda_array_interface__`` or ``__array_interface__``.

    A descriptor can also be a part of memory registered once
    (`RegisteredMemory.descriptor`, `BlockPool.checkout`): it then owns its
    bytes of that memory until it is dropped.

    `size` is what a transfer moves, `capacity` what is described; assigning
    Dynamo's ``_data_size`` makes transfers move a prefix (see `_data_size`).
    """

    __slots__ = ("_native", "_device", "_serialized", "_pool", "_ref", "__weakref__")

    def __init__(self, data: _DescriptorData) -> None:
        self._native = _native.Descriptor(data)
        self._device: Optional[Device] = None
        self._serialized: Optional[SerializedDescriptor] = None
        self._pool: Optional[RegisteredMemory] = None
        self._ref: Any = _UNSET

    @classmethod
    def _of_part(cls, native: _native.Descriptor, pool: RegisteredMemory) -> Descriptor:
        """The Python descriptor of a pool's part (made by the native pool)."""
        descriptor = cls.__new__(cls)
        descriptor._native = native
        descriptor._device = None
        descriptor._serialized = None
        descriptor._pool = pool
        descriptor._ref = _UNSET
        return descriptor

    def __repr__(self) -> str:
        return f"Descriptor({self})"

    def __str__(self) -> str:
        return f"ptr={hex(self.ptr)}, size={self.size}, device={self.device}"

    @property
    def device(self) -> Device:
        """The device the memory is on."""
        if self._device is None:
            self._device = Device(self._native.device)
        return self._device

    @property
    def ptr(self) -> int:
        """Start address of the memory."""
        return self._native.ptr

    @property
    def size(self) -> int:
        """Bytes a transfer moves: the `capacity` unless ``_data_size`` was set lower."""
        return self._native.size

    @property
    def capacity(self) -> int:
        """Bytes described (beyond Dynamo)."""
        return self._native.capacity

    @property
    def _data_size(self) -> int:
        """Dynamo's field for the bytes a transfer moves (`size`).

        Assigning it makes transfers move the first ``n`` bytes only, as
        Dynamo's pooled components do with a buffer larger than what arrives:
        an ``int`` with ``0 < n <= capacity`` (``ValueError`` otherwise,
        ``TypeError`` for a non-integer). It applies when the memory is next
        lent to an operation, so it can be set while one holds it; it clears
        the cached `metadata`. A READ pairs sizes strictly, as Dynamo does.
        """
        return self._native.size

    @_data_size.setter
    def _data_size(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"`_data_size` must be an `int`; got {type(value).__name__}."
            )
        capacity = self._native.capacity
        if not 0 < value <= capacity:
            raise ValueError(
                f"`_data_size` must be between 1 and the descriptor's capacity "
                f"({capacity} bytes); got {value}."
            )
        self._native.set_size(value)
        self._serialized = None

    @property
    def _data_ref(self) -> Any:
        """Dynamo's field for the object the memory belongs to (read-only).

        For a plain descriptor: the object itself (the tensor, or the
        contiguous copy made of it; the array; the ``bytes``/``bytearray``; the
        raw form's ``ref``). For a pool's part: exactly the part's bytes, a
        slice of the pool's flat view made when the pool was (a flat ``uint8``
        tensor, a NumPy/CuPy ``uint8`` array, a flat ``memoryview`` of a
        buffer's bytes in memory order, whatever its shape); the raw form's
        ``ref`` or a DLPack producer as they are.
        """
        ref = self._ref
        if ref is _UNSET:
            referent = self._native.referent
            offset = self._native.offset
            ref = referent if offset is None else _part_of(
                self._pool, referent, offset, self._native.capacity
            )
            self._ref = ref
        return ref

    @property
    def is_registered(self) -> bool:
        """Whether the memory is registered with a connector."""
        return self._native.is_registered

    @property
    def is_writable(self) -> bool:
        """Whether transfers may write into the memory (``False`` for ``bytes``)."""
        return self._native.writable

    @property
    def metadata(self) -> SerializedDescriptor:
        """The descriptor as a `SerializedDescriptor`."""
        if self._serialized is None:
            self._serialized = SerializedDescriptor(
                device=str(self.device), ptr=self.ptr, size=self.size
            )
        return self._serialized

    @staticmethod
    def from_serialized(serialized: SerializedDescriptor) -> Descriptor:
        """A `Descriptor` from a `SerializedDescriptor`."""
        if not isinstance(serialized, SerializedDescriptor):
            raise TypeError("Argument `serialized` must be `SerializedDescriptor`.")
        return serialized.to_descriptor()

    def register_memory(self, connector: Connector | Connection) -> None:
        """Registers the memory with `connector` now (operations otherwise do it
        on first use). Again with the same connector: nothing; with another:
        ``RuntimeError``. A pool's part registers the pool's memory."""
        self._native.register(
            _connector_of(connector, "connector", "nixl_connect.Connector")._native_connector()
        )

    def register_with_connector(self, connection: Connection | Connector) -> None:
        """Dynamo's name for `register_memory`: registers with the connection's
        connector (a `Connector` is taken too). ``RuntimeError`` if registered
        with another connector."""
        self._native.register(
            _connector_of(connection, "connection", "dynamo.nixl_connect.Connection")
            ._native_connector()
        )

    def deregister_with_connector(self, connection: Connection | Connector) -> None:
        """Deregisters the memory; it registers again when next used. Nothing
        for a pool's part (the pool's memory stays registered until its last
        descriptor and the pool are gone)."""
        _connector_of(connection, "connection", "dynamo.nixl_connect.Connection")
        if self._pool is not None:
            logger.debug(
                "%r is a part of registered memory: not deregistered on its own", self
            )
            return
        self._native.deregister()


_UNSET: Any = object()


def _connector_of(value: Any, argument: str, expected: str) -> Connector:
    """The `Connector` of a `Connection`, or `value` if it is one; ``TypeError`` otherwise."""
    if isinstance(value, Connection):
        return value.connector
    if isinstance(value, Connector):
        return value
    raise TypeError(f"Argument `{argument}` must be `{expected}`.")


def _part_of(pool: Any, referent: Any, offset: int, length: int) -> Any:
    """A part's ``_data_ref``: bytes ``[offset, offset + length)`` of the
    pool's flat view (`_flat_of`), or the pool's object itself where it has
    none (raw memory, a DLPack producer)."""
    flat = pool._flat if pool is not None else None
    if flat is None:
        return referent
    return flat[offset : offset + length]


def _flat_of(native: _native.RegisteredMemory) -> Any:
    """The pool's memory as one flat, one-dimensional view of its bytes in
    memory order, which its parts' ``_data_ref`` slice: host memory through
    the flat ``memoryview`` the native side makes of the export it holds
    (for a NumPy array, a ``uint8`` array over it), never through the
    object's own shape or order (a Fortran-ordered array, an ``np.matrix``);
    a tensor as a flat ``uint8`` tensor, a CUDA array as a flat ``u1`` array,
    each checked to be exactly the pool's bytes. ``None`` for raw memory and
    DLPack producers (``_data_ref`` is then the object as it is).
    ``ValueError`` if the object cannot be viewed so."""
    origin = native.origin
    if origin in ("raw pointer", "DLPack"):
        return None
    referent: Any = native.referent
    ptr, size = native.ptr, native.size
    why = "its flat view is not exactly its bytes"
    try:
        if _is_torch_tensor(referent):
            flat = referent.reshape(-1).view(sys.modules["torch"].uint8)
            if flat.dim() == 1 and flat.data_ptr() == ptr and flat.numel() == size:
                return flat
        elif native.device == "cpu":
            window = native.window()
            numpy = sys.modules.get("numpy")
            if numpy is not None and isinstance(referent, numpy.ndarray):
                return numpy.frombuffer(window, dtype=numpy.uint8)
            return window
        elif hasattr(referent, "__cuda_array_interface__") and hasattr(referent, "reshape"):
            flat = referent.reshape(-1, order="A").view("u1")
            interface = flat.__cuda_array_interface__
            if (
                tuple(interface["shape"]) == (size,)
                and interface["data"][0] == ptr
                and interface.get("strides") in (None, (1,))
            ):
                return flat
        else:
            why = "it has no flat view of bytes"
    except Exception as e:  # noqa: BLE001 - any failure is the same refusal
        why = f"{type(e).__name__}: {e}"
    raise ValueError(
        f"the parts of this {type(referent).__name__} cannot be viewed as their bytes "
        f"(`Descriptor._data_ref`): {why}. Make the pool from a contiguous tensor, "
        "array or buffer, or from raw parts `(ptr, size, device, ref)`."
    )


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
    return isinstance(tensor_type, type) and isinstance(value, tensor_type)


# Memory registered once and described in parts.


class RegisteredMemory:
    """Memory registered once, from which descriptors are made at any offset
    (beyond Dynamo; the Rust API's `RegisteredMemory`).

    ``RegisteredMemory(data, connection=None)``: `data` is what `Descriptor`
    takes. It is registered with `connection` (a `Connection` or a
    `Connector`) now, or with the connector of the first operation that uses
    one of its descriptors, and stays registered until the last of its
    descriptors and this object are gone: operations over its descriptors
    register nothing.

    `descriptor(offset, size)` owns its bytes until it is dropped; two live
    descriptors never overlap. An operation holds a descriptor's bytes until
    the backend let go of them, even after the Python objects are gone (a
    cancelled transfer still draining, or a NIXL exposure leaked by a cancel):
    those bytes are then neither counted in `free` nor described again
    (``ValueError``: "still held by an operation") until they come back, by
    themselves once the backend let go (never, for a leaked exposure).
    """

    __slots__ = ("_native", "_flat", "__weakref__")

    def __init__(
        self, data: _DescriptorData, connection: Optional[Connection | Connector] = None
    ) -> None:
        self._native = _native.RegisteredMemory(data)
        self._flat = _flat_of(self._native)
        if connection is not None:
            self.register_with_connector(connection)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(ptr={hex(self.ptr)}, size={self.size}, "
            f"device={self.device}, free={self.free})"
        )

    @property
    def ptr(self) -> int:
        """Start address of the memory."""
        return self._native.ptr

    @property
    def size(self) -> int:
        """Bytes of the memory."""
        return self._native.size

    @property
    def device(self) -> Device:
        """The device the memory is on."""
        return Device(self._native.device)

    @property
    def is_registered(self) -> bool:
        """Whether the memory is registered with a connector."""
        return self._native.is_registered

    @property
    def free(self) -> int:
        """Bytes no live descriptor owns and no operation holds (blocks, for a
        `BlockPool`)."""
        return self._native.free

    def register_with_connector(self, connection: Connection | Connector) -> None:
        """Registers the memory with the connection's connector now (nothing if
        it is registered with it; ``RuntimeError`` if with another)."""
        self._native.register(
            _connector_of(connection, "connection", "nixl_connect.Connection")._native_connector()
        )

    def descriptor(self, offset: int, size: int) -> Descriptor:
        """A descriptor of `size` bytes at `offset`, owning them while it lives:
        ``ValueError`` if the range is empty, runs past the memory (any
        integer, negative or huge), or overlaps a live descriptor of this
        memory; ``TypeError`` for a non-integer."""
        _check_ints(offset=offset, size=size)
        try:
            native = self._native.view(offset, size)
        except OverflowError:
            raise ValueError(
                f"cannot describe {size} bytes at offset {offset} of {self.size} bytes"
            ) from None
        return Descriptor._of_part(native, self)


class BlockPool(RegisteredMemory):
    """Memory registered once and divided into blocks of `block_size` bytes,
    checked out as descriptors (beyond Dynamo; the Rust API's `BlockPool`).

    ``BlockPool(data, block_size, connection=None)``; a tail shorter than a
    block is never handed out. Registration and ownership are
    `RegisteredMemory`'s: a block comes back when its descriptor is dropped.
    """

    __slots__ = ()

    def __init__(
        self,
        data: _DescriptorData,
        block_size: int,
        connection: Optional[Connection | Connector] = None,
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int):
            raise TypeError("Argument `block_size` must be an `int`.")
        if block_size <= 0:
            raise ValueError("Argument `block_size` must be greater than 0.")
        try:
            self._native = _native.RegisteredMemory(data, block_size)
        except OverflowError:
            raise ValueError(
                f"Argument `block_size` must be at most the memory's size; got {block_size}."
            ) from None
        self._flat = _flat_of(self._native)
        if connection is not None:
            self.register_with_connector(connection)

    @property
    def block_size(self) -> int:
        """Bytes per block."""
        return cast(int, self._native.block_size)

    def __len__(self) -> int:
        """Number of blocks."""
        return self._native.blocks_total

    def checkout(self, n: int) -> Optional[list[Descriptor]]:
        """`n` one-block descriptors, the lowest free blocks first (neighbours
        move as one run); ``None``, and nothing checked out, if fewer are free
        (any larger `n`, however large). ``ValueError`` for a negative `n`,
        ``TypeError`` for a non-integer."""
        _check_ints(n=n)
        if n < 0:
            raise ValueError(f"Argument `n` must be at least 0; got {n}.")
        if n > self._native.free:
            return None
        natives = self._native.checkout(n)
        if natives is None:
            return None
        return [Descriptor._of_part(d, self) for d in natives]

    def blocks(self, indices: list[int]) -> list[Descriptor]:
        """The blocks at `indices`, one descriptor each, in that order: all or
        none; ``ValueError`` names an index out of range (any integer,
        negative or huge), checked out, or listed twice; ``TypeError`` for a
        non-integer."""
        indices = list(indices)
        try:
            natives = self._native.blocks(indices)
        except OverflowError:
            # An index no `usize` holds: name the first such one.
            count = len(self)
            for i in indices:
                _check_ints(index=i)
                if not 0 <= i < count:
                    raise ValueError(
                        f"block {i} is out of range (the pool has {count})"
                    ) from None
            raise
        return [Descriptor._of_part(d, self) for d in natives]


# Files: the far side of a storage transfer.

FileSegment = _native.FileSegment
# (The native class itself: see its docstring. Made once per file, the other
# segments of that file with `at`.)


def _segment_list(value: Any) -> list[FileSegment]:
    """`value` (one `FileSegment` or a list of them) as a list; ``TypeError``
    or ``ValueError`` (an empty list) naming the argument."""
    if isinstance(value, FileSegment):
        return [value]
    if isinstance(value, list) and all(isinstance(s, FileSegment) for s in value):
        if len(value) == 0:
            raise ValueError("Argument `segments` must not be an empty list.")
        return value
    raise TypeError(
        "Argument `segments` must be `nixl_connect.FileSegment` or `list[nixl_connect.FileSegment]`."
    )


def _file_read(
    connection: Connection, segments: list[FileSegment], local: list[Descriptor], single: bool
) -> ReadOperation:
    """A READ of `segments` into `local`, posted (`Connector.begin_file_read`)."""
    native = connection._native_connector().begin_file_read(segments, [d._native for d in local])
    return ReadOperation._wrap(connection, native, local, single)


def _file_write(
    connection: Connection, local: list[Descriptor], single: bool, segments: list[FileSegment]
) -> WriteOperation:
    """A WRITE of `local` into `segments`, posted (`Connector.begin_file_write`)."""
    native = connection._native_connector().begin_file_write([d._native for d in local], segments)
    return WriteOperation._wrap(connection, native, local, single)


def _check_ints(**values: Any) -> None:
    """``TypeError`` naming the first of `values` that is not an ``int``
    (``bool`` neither)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"Argument `{name}` must be an `int`; got {type(value).__name__}.")


def _is_descriptors(value: Any) -> bool:
    return isinstance(value, Descriptor) or (
        isinstance(value, list) and all(isinstance(d, Descriptor) for d in value)
    )


def _descriptor_list(value: Any, what: str = "local_descriptors") -> list[Descriptor]:
    if isinstance(value, Descriptor):
        return [value]
    if isinstance(value, list) and all(isinstance(d, Descriptor) for d in value):
        if len(value) == 0:
            raise ValueError(f"Argument `{what}` must not be an empty list.")
        return value
    raise TypeError(
        f"Argument `{what}` must be `dynamo.nixl_connect.Descriptor` or `list[dynamo.nixl_connect.Descriptor]`."
    )


# Completion into asyncio: one native notifier (an eventfd the loop watches)
# per event loop. The library's own wakers signal it; nothing polls.
_notifiers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _native.Notifier]" = (
    weakref.WeakKeyDictionary()
)
_notifiers_lock = threading.Lock()


def _notifier(loop: asyncio.AbstractEventLoop) -> _native.Notifier:
    notifier = _notifiers.get(loop)
    if notifier is None:
        with _notifiers_lock:
            notifier = _notifiers.get(loop)
            if notifier is None:
                notifier = _native.Notifier()
                loop.add_reader(notifier.fileno(), notifier.on_ready)
                _notifiers[loop] = notifier
    return notifier


# Operations.


class AbstractOperation(ABC):
    """An operation: awaitable, cancellable, a context manager.

    Made by a `Connector` (``create_readable``, ``begin_read``, ...) or, as
    Dynamo allows, by its class over a `Connection`
    (``ReadableOperation(connection, descriptors)``). A subclass may override
    ``_release`` (Dynamo's pooled components do): nothing here is named so.
    """

    _KIND = OperationKind.UNSPECIFIED

    def _setup(
        self,
        connection: Connection,
        native: _native.Operation,
        local_descriptors: list[Descriptor],
        single: bool,
        connector: Optional[Connector] = None,
    ) -> None:
        """Binds the operation to `native`, the native operation over
        `local_descriptors` that `connection`'s connector (`connector`, if
        the caller has it) made."""
        self._connection: Connection = connection
        self._connector: Connector = connection.connector if connector is None else connector
        self._operation_kind: OperationKind = self._KIND
        self._native: _native.Operation = native
        self._local_desc_list: list[Descriptor] = local_descriptors
        self._single: bool = single

    @classmethod
    def _wrap(
        cls,
        connection: Connection,
        native: _native.Operation,
        local_descriptors: list[Descriptor],
        single: bool = False,
    ) -> Self:
        """An operation of this class over `native`, a native operation that
        `connection`'s connector already made (no constructor runs)."""
        op = cls.__new__(cls)
        op._setup(connection, native, local_descriptors, single)
        return op

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # As dropping a Rust operation: an unfinished one is cancelled; its
        # memory goes back to the descriptors once no transfer can touch it.
        if self._native.status() not in _TERMINAL:
            self._native.cancel()
        self._native.reclaim_now()

    def __repr__(self) -> str:
        if getattr(self, "_native", None) is None:
            return f"{self.__class__.__name__}(<not made>)"
        return (
            f"{self.__class__.__name__}(operation_kind={self._operation_kind}, "
            f"local_descriptors={self._local_desc_list}, status='{self.status}')"
        )

    @property
    def connection(self) -> Connection:
        """The connection the operation belongs to (``.connector`` is its `Connector`)."""
        return self._connection

    @property
    def operation_kind(self) -> OperationKind:
        """READ or WRITE."""
        return self._operation_kind

    @property
    def status(self) -> OperationStatus:
        """The status; never blocks."""
        return _STATUSES[self._native.status()]

    @property
    def _status(self) -> OperationStatus:
        """Dynamo's field for the status: reads `status`.

        Assigning ``OperationStatus.INITIALIZED`` re-arms a passive operation
        (see `PassiveOperation`); ``OperationStatus.CANCELLED`` cancels (what
        Dynamo's ``__exit__`` does with it). Other values are refused
        (``ValueError``): the status is the native operation's.
        """
        return self.status

    @_status.setter
    def _status(self, value: OperationStatus) -> None:
        if getattr(self, "_native", None) is None:
            # A subclass's constructor, before ours bound the operation.
            return
        if value == OperationStatus.INITIALIZED:
            self._rearm()
        elif value == OperationStatus.CANCELLED:
            self._native.cancel()
        else:
            raise ValueError(
                "`_status` can be set to INITIALIZED (to re-arm a passive operation) or "
                f"CANCELLED; got {value!r}."
            )

    def _rearm(self) -> None:
        raise RuntimeError(
            f"{type(self).__name__} cannot be re-armed: start a new operation."
        )

    def cancel(self) -> None:
        """Cancels the operation; no effect once it completed or was cancelled.
        ``RuntimeError`` if it errored (as Dynamo)."""
        if self._native.status() == OperationStatus.ERRORED:
            raise RuntimeError("Operation is errored, unable to cancel the operation.")
        self._native.cancel()

    async def wait_for_completion(self, timeout: Optional[float] = None) -> None:
        """Waits, without blocking the event loop, until the operation ends.

        Returns once it completed (or was cancelled, as Dynamo); raises
        ``RuntimeError`` if the transfer errored and ``TimeoutError`` if
        `timeout` seconds passed first (the operation goes on).
        """
        native = self._native
        if native.finish() is not None:
            return
        loop = asyncio.get_running_loop()
        notifier = _notifier(loop)
        # Set: this operation's connector made its native connector.
        spin = cast(float, self._connector._await_spin)
        if timeout is not None:
            spin = min(spin, timeout)
        # A READ or WRITE just posted usually ends within the spin: waiting
        # for it here (GIL released) skips the loop's wake-up. Only when no
        # other operation is awaited on this loop, so that concurrent waits
        # never hold the loop one after another.
        if spin > 0 and len(notifier) == 0 and native.spin(spin):
            native.finish()
            return
        future = loop.create_future()
        token = notifier.arm(native, future)
        if token is not None:
            try:
                if timeout is None:
                    await future
                else:
                    try:
                        await asyncio.wait_for(future, timeout)
                    except asyncio.TimeoutError:
                        raise TimeoutError(
                            f"operation did not finish within {timeout} s"
                        ) from None
            finally:
                notifier.disarm(token)
        native.finish()

    def wait(self, timeout: Optional[float] = None) -> OperationStatus:
        """Blocks the calling thread (GIL released) until the operation ends;
        returns its final status. Raises like `wait_for_completion`."""
        return _STATUSES[self._native.wait(timeout)]

    async def wait_for_release(self, timeout: Optional[float] = None) -> bool:
        """Waits, without blocking the event loop, until the operation ended
        and the backend let go of its memory: after `cancel()`, until a
        transfer NIXL could not abort has drained, from which point none of
        its bytes land any more. True then; False if `timeout` seconds passed
        first. A cancelled passive operation on NIXL never lets go (a peer
        may still write): give a timeout. Not in Dynamo's API (an extension;
        `wait_for_completion` after `cancel()` returns at once, as Dynamo's)."""
        native = self._native
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pause = 0.001
        while True:
            native.reclaim_now()
            if native.reclaimed:
                return True
            if deadline is not None and loop.time() >= deadline:
                return False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)


class ActiveOperation(AbstractOperation):
    """An operation that moves bytes to or from a peer's passive operation."""

    # The peer's agent metadata (not the whole `RdmaMetadata`: a model kept
    # by the operation would outlive its caller's use of it); unset for a
    # storage transfer, which has no peer.
    _remote_nixl_metadata: str
    _remote: Optional[Remote] = None

    @property
    def remote(self) -> Remote:
        """The peer, as Dynamo's `Remote` names it. ``RuntimeError`` for a
        READ or WRITE of files (`Connector.begin_file_read`,
        `Connector.begin_file_write`), which has none."""
        if getattr(self, "_remote_nixl_metadata", None) is None:
            raise RuntimeError("A READ or WRITE of files has no remote peer.")
        if self._remote is None:
            self._remote = Remote(self._connection, self._remote_nixl_metadata)
        return self._remote


def _check_connection(connection: Any) -> None:
    if type(connection) is not Connection and not isinstance(connection, Connection):
        raise TypeError("Argument `connection` must be `dynamo.nixl_connect.Connection`.")


def _local(value: Any) -> tuple[list[Descriptor], bool]:
    """`_descriptor_list(value)` and whether `value` was one descriptor."""
    if type(value) is Descriptor:
        return [value], True
    return _descriptor_list(value), isinstance(value, Descriptor)


class PassiveOperation(AbstractOperation):
    """An operation that exposes local memory to one peer, described by `metadata()`.

    Dropped (or still alive at interpreter exit) before it ended, it logs a
    warning to the ``nixl_connect`` logger: its peer's transfer had not
    finished, and may fail (loopback then refuses a READ or WRITE of it;
    NIXL may still let one that was already connected succeed).

    Dynamo's pooled senders reuse one operation: they lower a descriptor's
    ``_data_size``, clear ``_serialized_request`` (the cached `metadata`) and
    set ``_status = OperationStatus.INITIALIZED``. Here that assignment, on an
    operation that ended and handed its memory back, starts a new native
    operation over the same descriptors at their current sizes (a new
    notification key); on one still waiting for its peer it does nothing, and
    its `metadata` then publishes the lowered sizes of what it exposes (the
    peer moves a prefix); ``RuntimeError`` if the memory cannot come back (a
    cancelled NIXL exposure is never handed back)."""

    _metadata: dict[bool, RdmaMetadata]
    # The descriptors' sizes `_metadata` was made with.
    _metadata_sizes: tuple[int, ...]
    _warned: bool

    def _setup(
        self,
        connection: Connection,
        native: _native.Operation,
        local_descriptors: list[Descriptor],
        single: bool,
        connector: Optional[Connector] = None,
    ) -> None:
        AbstractOperation._setup(self, connection, native, local_descriptors, single, connector)
        self._metadata = {}
        self._metadata_sizes = ()
        self._warned = False
        _live_passive.add(self)

    def _expose(
        self, connection: Connection, local_descriptors: Descriptor | list[Descriptor]
    ) -> None:
        """Dynamo's constructor: exposes `local_descriptors` through `connection`."""
        _check_connection(connection)
        local, single = _local(local_descriptors)
        connector = connection.connector
        native = self._exposed(connection, local)
        self._setup(connection, native, local, single, connector)

    def _exposed(self, connection: Connection, local: list[Descriptor]) -> _native.Operation:
        connector = connection._native_connector()
        descriptors = [d._native for d in local]
        if self._KIND == _READ:
            return connector.create_readable(descriptors)
        return connector.create_writable(descriptors)

    def _rearm(self) -> None:
        native = self._native
        if native.status() not in _TERMINAL:
            return
        native.reclaim_now()
        if not native.reclaimed:
            raise RuntimeError(
                f"{type(self).__name__} cannot be re-armed: the backend still holds its "
                "memory (a transfer draining, or an exposure a cancel could not revoke)."
            )
        try:
            fresh = self._exposed(self._connection, self._local_desc_list)
        except (ValueError, RuntimeError) as e:
            raise RuntimeError(f"{type(self).__name__} cannot be re-armed: {e}") from e
        self._native = fresh
        self._metadata.clear()
        self._warned = False

    @property
    def _serialized_request(self) -> Optional[RdmaMetadata]:
        """Dynamo's cache of `metadata()`; assigning ``None`` drops it, so the
        next `metadata()` is made again (with the descriptors' current sizes)."""
        return self._metadata.get(False)

    @_serialized_request.setter
    def _serialized_request(self, value: Optional[RdmaMetadata]) -> None:
        if getattr(self, "_native", None) is None:
            return
        self._metadata.clear()
        if value is not None:
            self._metadata[False] = value
            self._metadata_sizes = self._sizes()

    def __del__(self) -> None:
        _warn_unfinished(self, "dropped")

    def _sizes(self) -> tuple[int, ...]:
        """The sizes the descriptors would publish now (``_data_size``)."""
        return tuple(d.size for d in self._local_desc_list)

    def metadata(self, hex_encode: bool = False) -> RdmaMetadata:
        """What the peer needs (send it out of band). ``hex_encode=True`` gives
        Dynamo's legacy hex `nixl_metadata` instead of ``b64:``.

        Made once and kept, as Dynamo's (``_serialized_request``): a size
        lowered since (``_data_size``) is published once that is cleared. A
        size grown past what the live operation exposes raises
        ``RuntimeError`` on every call, whether or not `metadata` was asked
        for before: never the old size."""
        hex_encode = bool(hex_encode)
        sizes = self._sizes()
        cached = self._metadata.get(hex_encode)
        if cached is not None:
            if sizes != self._metadata_sizes:
                # Sizes changed since it was made: the native side refuses
                # one grown past what is exposed.
                self._native.metadata()
            return cached
        metadata = _model_of(cast(_native.Metadata, self._native.metadata()))
        if hex_encode:
            raw = base64.b64decode(metadata.nixl_metadata[len("b64:") :])
            metadata = metadata.model_copy(update={"nixl_metadata": raw.hex()})
        self._metadata[hex_encode] = metadata
        self._metadata_sizes = sizes
        return metadata


# Passive operations alive now, for the warning about those still unfinished
# at interpreter exit.
_live_passive: "weakref.WeakSet[PassiveOperation]" = weakref.WeakSet()


def _warn_unfinished(op: PassiveOperation, when: str) -> None:
    """Logs a warning if `op` has not ended (once per operation)."""
    try:
        if op._warned:
            return
        status = op._native.status()
        if status in _TERMINAL:
            return
        op._warned = True
        descriptors = op._local_desc_list
        logger.warning(
            "%s of connector %r (%d descriptor%s, %d bytes) %s while %s: its "
            "peer's %s had not finished and may fail. Keep the operation until "
            "`await op.wait_for_completion()` returns, or cancel() it.",
            type(op).__name__,
            op._connector.name,
            len(descriptors),
            "" if len(descriptors) == 1 else "s",
            sum(d.size for d in descriptors),
            when,
            _STATUSES[status].name,
            op._operation_kind.name,
        )
    except Exception:
        # At interpreter shutdown, or in a forked child: no warning, no error
        # out of a finalizer.
        pass


def _warn_unfinished_at_exit() -> None:
    for op in list(_live_passive):
        _warn_unfinished(op, "left unfinished at interpreter exit")


def _logging_shows_records() -> bool:
    """Whether `logger`'s records reach a handler that shows them (one that is
    not a `logging.NullHandler`, or Python's last resort)."""
    current: Optional[logging.Logger] = logger
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


@atexit.register
def _at_exit() -> None:
    """Runs before the interpreter finalizes (registered at import: after the
    hooks registered later, by code that may still use the package): warns of unfinished
    passive operations, then stops the native module's threads from entering
    the interpreter for good (see the package README, "At exit"). Operations
    and connectors still alive are torn down during finalization without
    Python; the library's records from then on go to stderr if logging shows
    them, and are dropped otherwise."""
    try:
        _warn_unfinished_at_exit()
    finally:
        try:
            shows = _logging_shows_records()
        except Exception:
            shows = False
        _native.close_at_exit(shows)


class ReadOperation(ActiveOperation):
    """READs a peer's `ReadableOperation` into local descriptors.

    ``ReadOperation(connection, remote_metadata, local_descriptors)``, as
    `Connector.begin_read` makes it: the transfer is posted on return. Sizes
    pair strictly (``ValueError``, Dynamo's words): set a larger buffer's
    ``_data_size`` to read into its first bytes."""

    _KIND = OperationKind.READ

    def __init__(
        self,
        connection: Connection,
        remote_metadata: RdmaMetadata,
        local_descriptors: Descriptor | list[Descriptor],
    ) -> None:
        _check_connection(connection)
        if type(remote_metadata) is not RdmaMetadata and not _is_metadata(remote_metadata):
            raise TypeError(
                "Argument `remote_metadata` must be `dynamo.nixl_connect.RdmaMetadata`."
            )
        if remote_metadata.operation_kind != _READ:
            raise ValueError("Argument `remote_metadata` must be of kind `READ`.")
        local, single = _local(local_descriptors)
        connector = connection.connector
        native = connection._native_connector().begin_read(
            _native_of(remote_metadata), [d._native for d in local]
        )
        self._setup(connection, native, local, single, connector)
        self._remote_nixl_metadata = remote_metadata.nixl_metadata

    def results(self) -> list[Descriptor]:
        """The local descriptors, which now hold the data; ``RuntimeError`` before completion."""
        if self.status != OperationStatus.COMPLETE:
            raise RuntimeError("Operation has not completed yet, cannot get results.")
        self._native.reclaim_now()
        return list(self._local_desc_list)


class WriteOperation(ActiveOperation):
    """WRITEs local descriptors into a peer's `WritableOperation`.

    ``WriteOperation(connection, local_descriptors, remote_metadata)``, as
    `Connector.begin_write` makes it: the transfer is posted on return."""

    _KIND = OperationKind.WRITE

    def __init__(
        self,
        connection: Connection,
        local_descriptors: Descriptor | list[Descriptor],
        remote_metadata: RdmaMetadata,
    ) -> None:
        _check_connection(connection)
        if type(remote_metadata) is not RdmaMetadata and not _is_metadata(remote_metadata):
            raise TypeError(
                "Argument `remote_metadata` must be `dynamo.nixl_connect.RdmaMetadata`."
            )
        if remote_metadata.operation_kind != _WRITE:
            raise ValueError("Argument `remote_metadata` must be of kind `WRITE`.")
        local, single = _local(local_descriptors)
        connector = connection.connector
        native = connection._native_connector().begin_write(
            [d._native for d in local], _native_of(remote_metadata)
        )
        self._setup(connection, native, local, single, connector)
        self._remote_nixl_metadata = remote_metadata.nixl_metadata


class ReadableOperation(PassiveOperation):
    """Exposes local memory for a peer to READ; completes when the peer says it is done.

    ``ReadableOperation(connection, local_descriptors)``, as
    `Connector.create_readable` makes it."""

    _KIND = OperationKind.READ

    def __init__(
        self, connection: Connection, local_descriptors: Descriptor | list[Descriptor]
    ) -> None:
        self._expose(connection, local_descriptors)


class WritableOperation(PassiveOperation):
    """Exposes local memory for a peer to WRITE; completes when the peer says it is done.

    ``WritableOperation(connection, local_descriptors)``, as
    `Connector.create_writable` makes it."""

    _KIND = OperationKind.WRITE

    def __init__(
        self, connection: Connection, local_descriptors: Descriptor | list[Descriptor]
    ) -> None:
        self._expose(connection, local_descriptors)


# The connector.


def _search_paths() -> list[str]:
    """Where the NIXL runtime is looked for first, by every entry point that
    loads it (a NIXL connector, `set_nixl_log_level`, ``python -m
    nixl_connect``): the running interpreter's `sys.path`, then its
    site-packages (those `sys.path` leaves out, as under ``python -S``). NIXL
    installed by pip into this interpreter's environment (``nixl_connect[cu12]``,
    ``install-runtime``) is found there with nothing set, whether or not the
    environment is activated."""
    paths: list[str] = [p for p in sys.path if p]
    try:
        import site

        paths.extend(site.getsitepackages())
        paths.append(site.getusersitepackages())
    except (AttributeError, ImportError):
        pass
    seen: set[str] = set()
    out = []
    for p in paths:
        if p not in seen and os.path.isdir(p):
            seen.add(p)
            out.append(p)
    return out


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag_from_env(name: str, default: bool) -> bool:
    """A yes/no setting from the environment variable `name`."""
    value = os.environ.get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(
        f"{name} must be one of {', '.join(_TRUE + _FALSE)}; got {value!r}."
    )


class Connection:
    """Dynamo's `Connection`: what a `Connector`'s operations run through.

    ``Connection(connector, number)`` (Dynamo's argument checks), named
    ``f"{connector.name}-{number}"``. Here every connection of a connector is
    a handle on the connector's one native agent: what one registers, another
    moves. `Connector._create_connection()` shares one, as Dynamo 1.6.1 does;
    Dynamo's pooled components make their own (``Connection(self, 1)``), which
    works alike. A descriptor registered through two connections of one
    connector is accepted here (Dynamo refuses it). Peers are kept by the
    connector (loaded once, idle ones kept), so the remote reference counts
    are kept for Dynamo's callers but decide nothing.
    """

    def __init__(self, connector: Connector, number: int) -> None:
        if not isinstance(connector, Connector):
            raise TypeError("Argument `connector` must be `dynamo.nixl_connect.Connector`.")
        if not isinstance(number, int):
            raise TypeError("Argument `number` must be of type `int`.")
        if number <= 0:
            raise ValueError("Argument `number` must be greater than 0.")
        self._connector: Optional[Connector] = connector
        self._connector_ref: Optional[weakref.ref[Connector]] = None
        self._native: Optional[_native.Connector] = None
        self._is_initialized = False
        self._name = f"{connector.name}-{number}"
        self._remote_refs: dict[str, int] = {}
        self._remote_refs_lock = threading.Lock()

    @classmethod
    def _shared(cls, connector: Connector, number: int) -> Connection:
        """The connection `connector` keeps for its operations: it refers to
        its connector weakly, so that the two make no reference cycle (a
        cycle would leave the connector, and its agent, to the garbage
        collector, perhaps at interpreter exit while transfers still run)."""
        connection = cls(connector, number)
        connection._connector_ref = weakref.ref(connector)
        connection._connector = None
        return connection

    def __repr__(self) -> str:
        return f"{type(self).__name__}(is_initialized={self._is_initialized}, name='{self._name}')"

    def __str__(self) -> str:
        return self._name

    @property
    def connector(self) -> Connector:
        """The connector this connection belongs to."""
        connector = self._connector
        if connector is None and self._connector_ref is not None:
            connector = self._connector_ref()
        if connector is None:
            raise RuntimeError(f"the connector of connection {self._name!r} is gone")
        return connector

    @property
    def name(self) -> str | None:
        """``f"{connector.name}-{number}"``."""
        return self._name

    @property
    def metadata(self) -> bytes:
        """The agent's metadata, as Dynamo's (NIXL's ``get_agent_metadata()``):
        NIXL's serialized agent (its connection info and every region
        registered with it), uncompressed; on loopback, the blob naming the
        fabric and the agent. Here it is the connector's one agent (creating
        it if it does not exist yet)."""
        return self._native_connector().agent_metadata()

    def acquire_remote_ref(self, name: str) -> None:
        """Counts a reference to peer `name` (kept for Dynamo's callers; peers
        are loaded and kept by the connector)."""
        with self._remote_refs_lock:
            self._remote_refs[name] = self._remote_refs.get(name, 0) + 1

    def release_remote_ref(self, name: str) -> bool:
        """Drops a reference to peer `name`; whether it was the last."""
        with self._remote_refs_lock:
            count = self._remote_refs.get(name)
            if count is None:
                return False
            if count == 1:
                del self._remote_refs[name]
                return True
            self._remote_refs[name] = count - 1
            return False

    async def initialize(self) -> None:
        """Does nothing (as in Dynamo 1.6.1) but mark the connection initialized."""
        self._is_initialized = True

    def _native_connector(self) -> _native.Connector:
        """The connector's native connector (made on first use)."""
        native = self._native
        if native is None:
            native = self._native = self.connector._native_connector()
        return native


class Remote:
    """Dynamo's `Remote`: a peer as seen from a `Connection`.

    ``Remote(connection, nixl_metadata)`` (Dynamo's argument checks). Peers
    are loaded and kept by the connector (decision 0007), so releasing one
    does nothing; ``_release`` exists so that code replacing it (Dynamo's
    pooled components assign ``Remote._release``) keeps working.
    """

    def __init__(self, connection: Connection, nixl_metadata: bytes | str) -> None:
        if not isinstance(connection, Connection):
            raise TypeError("Argument `connection` must be `dynamo.nixl_connect.Connection`.")
        if not isinstance(nixl_metadata, (bytes, str)):
            raise TypeError("Argument `nixl_metadata` must be `bytes` or `str`.")
        if len(nixl_metadata) == 0:
            raise ValueError("Argument `nixl_metadata` cannot be empty.")
        self._connection = connection
        self._name = _agent_name(nixl_metadata)
        self._released = False

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._release()

    def __repr__(self) -> str:
        return f"Remote(name={self._name}, connection={self._connection.name})"

    def __str__(self) -> str:
        return self._name

    def _release(self) -> None:
        """Does nothing but mark the peer released (the connector keeps peers)."""
        self._released = True

    @property
    def connection(self) -> Connection:
        """The local connection this peer is seen from."""
        return self._connection

    @property
    def name(self) -> str:
        """The peer's agent name."""
        return self._name


# How an agent blob sealed with peer keys starts (descriptor-core's
# `SEALED_MAGIC`), and the length of its header (magic, key id, tag).
_SEALED_MAGIC = b"NXCAUTH1"
_SEALED_HEADER = 48


def _agent_name(nixl_metadata: bytes | str) -> str:
    """The agent name in a peer's metadata blob (NIXL's or loopback's):
    ``b64:``/hex and compressed as `RdmaMetadata` carries it, or raw bytes;
    ``ValueError`` if it names none. Only the blob's head is inflated."""
    try:
        if isinstance(nixl_metadata, str):
            if nixl_metadata.startswith("b64:"):
                packed = base64.b64decode(nixl_metadata[len("b64:") :], validate=True)
            else:
                packed = bytes.fromhex(nixl_metadata)
            blob = zlib.decompressobj().decompress(packed, 4096)
        else:
            blob = bytes(nixl_metadata[:4096])
        if blob.startswith(_SEALED_MAGIC):
            # A sealed blob (peer keys): the name is read, not trusted; the
            # connector verifies the seal before anything is loaded.
            blob = blob[_SEALED_HEADER:]
        if blob.startswith(b"nixlSerDes|Agent"):
            length = int.from_bytes(blob[16:24], "little")
            name = blob[24 : 24 + length]
            if 0 < length == len(name):
                return name.decode("utf-8", "replace")
        elif blob.startswith(b"LBK2") and len(blob) > 20:
            return blob[20:].decode("utf-8", "replace")
    except (ValueError, zlib.error):
        pass
    raise ValueError("Argument `nixl_metadata` is not a peer's agent metadata.")


# How long a Connector's coroutine waits for memory that an earlier
# operation may still write (a cancelled transfer draining: NIXL cannot
# abort a posted one) before it raises `_native.MemoryBusy` (a ValueError).
_BUSY_WAIT = 10.0

_Made = TypeVar("_Made")


async def _when_let_go(make: Callable[..., _Made], *args: Any) -> _Made:
    """`make(*args)` once no earlier operation may still write the memory it
    describes (see `_native.MemoryBusy`), retried with a growing pause for
    up to `_BUSY_WAIT` seconds; then the last `MemoryBusy` is raised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _BUSY_WAIT
    pause = 0.001
    while True:
        await asyncio.sleep(pause)
        try:
            return make(*args)
        except _native.MemoryBusy:
            if loop.time() >= deadline:
                raise
            pause = min(pause * 2, 0.05)


class Quarantined(NamedTuple):
    """What a `Connector`'s quarantine keeps (`Connector.quarantined()`)."""

    exposures: int
    """Abandoned readables and writables whose memory is kept."""
    bytes: int
    """Their bytes."""
    readable_bytes: int
    """The readables' part of `bytes`."""


class Metrics:
    """Transfer metrics, counted by every `Connector` made with them
    (``Connector(..., metrics=m)``; several connectors may share one).

    The names, types and labels are those of the Rust core's
    ``descriptor_core::metrics`` (listed in the package README): every name
    starts with ``nixl_connect_``; series carry the backend's name
    (``backend``: ``loopback`` or ``nixl``), and transfers their direction
    (``op``: ``read`` or ``write``, seen from the agent that posts;
    ``target``: ``peer`` or ``file``). A connector's series appear, at zero,
    once its agent exists (on first use, or `Connector.warm_up`).

    Three views of the same figures: `encode_text` (OpenMetrics text, what a
    Prometheus scrape reads), `samples` and `get_sample_value` (plain Python,
    no dependency), and `register_prometheus` (a collector on a
    ``prometheus_client`` registry, when that package is installed).
    """

    def __init__(self) -> None:
        self._native = _native.Metrics()

    def __repr__(self) -> str:
        return "Metrics()"

    def encode_text(self) -> str:
        """Every metric as OpenMetrics text, ending in ``# EOF``; its content
        type is ``application/openmetrics-text; version=1.0.0; charset=utf-8``."""
        return self._native.encode_text()

    def families(self) -> list[tuple[str, str, str, str, list[tuple[str, dict[str, str], float]]]]:
        """Every metric family, in `encode_text`'s order: ``(name, type,
        unit, help, samples)``, `type` ``"counter"``, ``"gauge"`` or
        ``"histogram"``, `unit` ``""`` if none. A family with no series yet
        (`nixl_connect_transfers_failed` before any failure) is left out."""
        return self._native.families()

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """Every sample of every family: ``(name, labels, value)``, as
        `encode_text` has them: a counter's name ends in ``_total``; a
        histogram's samples are its cumulative ``_bucket``s (labelled ``le``,
        the upper bound as the text writes it: ``"4.0"``, ``"+Inf"``),
        ``_sum`` and ``_count``."""
        return [sample for family in self._native.families() for sample in family[4]]

    def get_sample_value(
        self, name: str, labels: Optional[dict[str, str]] = None
    ) -> Optional[float]:
        """The value of the sample `name` whose labels are exactly `labels`
        (none if omitted), or None if there is none; as
        ``prometheus_client.CollectorRegistry.get_sample_value``."""
        wanted = labels or {}
        for sample_name, sample_labels, value in self.samples():
            if sample_name == name and sample_labels == wanted:
                return value
        return None

    def register_prometheus(self, registry: Any = None) -> Any:
        """Registers a collector of these metrics on the ``prometheus_client``
        `registry` (default ``prometheus_client.REGISTRY``) and returns it:
        each collection (``generate_latest``, the HTTP exporter) reads the
        current figures as counter, gauge and histogram families. Register
        one `Metrics` once per registry (twice is ValueError, duplicated
        names). ImportError if ``prometheus_client`` is not installed."""
        try:
            import prometheus_client
        except ImportError as e:
            raise ImportError(
                "Metrics.register_prometheus needs the `prometheus_client` package "
                "(pip install prometheus_client); encode_text() and samples() do not."
            ) from e
        collector = _PrometheusCollector(self)
        (prometheus_client.REGISTRY if registry is None else registry).register(collector)
        return collector


class _PrometheusCollector:
    """A ``prometheus_client`` collector (its ``Collector`` protocol:
    `collect`, and `describe` for the registry's duplicate check) of one
    `Metrics`."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        return _prometheus_families(self._metrics.families())

    def describe(self) -> Iterator[Any]:
        # The names without the figures, known before any connector exists.
        return _prometheus_families(_native.Metrics.described())


def _prometheus_families(
    families: list[tuple[str, str, str, str, list[tuple[str, dict[str, str], float]]]],
) -> Iterator[Any]:
    """`Metrics.families` as ``prometheus_client`` metric families."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )

    for name, kind, unit, help_text, samples in families:
        names = [k for k in samples[0][1] if k != "le"] if samples else []
        family: Metric
        if kind == "counter":
            counter = CounterMetricFamily(name, help_text, labels=names, unit=unit)
            for sample_name, labels, value in samples:
                if sample_name == name + "_total":
                    counter.add_metric([labels[k] for k in names], value)
            family = counter
        elif kind == "gauge":
            gauge = GaugeMetricFamily(name, help_text, labels=names, unit=unit)
            for _, labels, value in samples:
                gauge.add_metric([labels[k] for k in names], value)
            family = gauge
        elif kind == "histogram":
            histogram = HistogramMetricFamily(name, help_text, labels=names, unit=unit)
            # Per series (its labels but `le`): cumulative buckets, and sum.
            series: dict[tuple[str, ...], tuple[list[tuple[str, float]], list[float]]] = {}
            for sample_name, labels, value in samples:
                buckets, total = series.setdefault(tuple(labels[k] for k in names), ([], []))
                if sample_name == name + "_bucket":
                    buckets.append((labels["le"], value))
                elif sample_name == name + "_sum":
                    total.append(value)
            for key, (buckets, total) in series.items():
                histogram.add_metric(list(key), buckets, total[0] if total else 0.0)
            family = histogram
        else:
            family = Metric(name, help_text, kind, unit)
            for sample_name, labels, value in samples:
                family.add_sample(sample_name, labels, value)
        yield family


class Connector:
    """Creates the four operations for one worker.

    ``Connector(worker_id=None, backend=None, await_spin=None,
    peer_failure_detection=None, quarantine_seconds=None,
    quarantine_readable_bytes=None, peer_keys=None, *, metrics=None)``: `worker_id`
    names the worker (a new UUID by default); `backend` is ``"nixl"``
    (default, or ``$NIXL_CONNECT_BACKEND``) or ``"loopback"`` (a process-wide
    in-process fabric, for tests). As with Dynamo, the NIXL agent is created on
    first use.

    `await_spin` (seconds, from 0 to 0.05; 0 turns it off): how long
    ``await op.wait_for_completion()`` of a READ or WRITE first waits for the
    transfer in the calling thread, GIL released, holding the event loop,
    before the loop takes over the wait. It is the same setting as the
    backend's ``wait_assist`` (how long a blocked waiter polls its transfer
    before it sleeps; NIXL: 200 µs, loopback: 0), seen from asyncio: by
    default (``None``) it is ``$NIXL_CONNECT_AWAIT_SPIN`` if set, else the
    backend's ``wait_assist`` capped at `AWAIT_SPIN_CAP` (100 µs), so NIXL's is
    100 µs and loopback's 0; a number overrides both. A small transfer usually
    ends within it and then skips the loop's wake-up (why and how much:
    docs/decisions/0010-python-await-spin.md). It is skipped while another
    operation is awaited on the same loop; it never applies to passive
    operations, which wait for a peer.

    `peer_failure_detection` (default ``$NIXL_CONNECT_PEER_FAILURE_DETECTION``
    as ``1``/``0``, ``true``/``false``, ``yes``/``no`` or ``on``/``off``, else
    ``True``, NIXL's default; NIXL only): whether UCX must detect a peer that
    dies (its ``ucx_error_handling_mode``, ``peer`` or ``none``). Off, a host
    without RDMA devices sends notifications through shared memory instead of
    TCP (faster between two processes on such a host: the numbers are in
    docs/decisions/0005-peer-failure-detection-default.md), and only the
    initiator's setting counts. But UCX then does not promise that a transfer to a peer that dies
    ends at all: bound the waits where peers can die.

    `quarantine_seconds` and `quarantine_readable_bytes` (NIXL; loopback cuts
    peers off and needs none): the memory of a readable or writable that ended
    without its peer's notification (cancelled, timed out, dropped) stays
    reachable by a peer that loaded its metadata, so it is kept, out of every
    pool and never handed back, for `quarantine_seconds` (default
    ``$NIXL_CONNECT_QUARANTINE_SECONDS``, else 5; ``math.inf``: for the
    process's life), then freed. Readables are freed sooner, oldest first,
    while the readables kept exceed `quarantine_readable_bytes` (default
    ``$NIXL_CONNECT_QUARANTINE_READABLE_BYTES``, else 32 MiB): a peer only
    reads them. `quarantined()` says what is kept; what a late peer can still
    do, per transport, is in the package README.

    `peer_keys` (default ``$NIXL_CONNECT_PEER_KEYS``, hex keys separated by
    commas; none when unset): shared keys of at least 16 bytes, the signing
    key first. With keys, every agent blob this connector publishes is sealed
    (an HMAC-SHA256 tag) and every blob it is given that none of its keys
    sealed is refused before NIXL sees it; without, blobs are Dynamo's. What
    that protects: the package README.

    `metrics` (keyword only; a `Metrics`): where this connector counts its
    transfers, bytes, failures and registrations (several connectors may
    share one). Without (the default), nothing is counted and nothing is
    paid.
    """

    def __init__(
        self,
        worker_id: Optional[str] = None,
        backend: Optional[str] = None,
        await_spin: Optional[float] = None,
        peer_failure_detection: Optional[bool] = None,
        quarantine_seconds: Optional[float] = None,
        quarantine_readable_bytes: Optional[int] = None,
        peer_keys: Optional[Sequence[Union[bytes, str]]] = None,
        *,
        metrics: Optional[Metrics] = None,
    ) -> None:
        worker_id = worker_id if worker_id is not None else uuid.uuid4().hex
        if not isinstance(worker_id, str) or len(worker_id) == 0:
            raise TypeError("Argument `worker_id` must be a non-empty `str` or `None`.")
        spin_source = "Argument `await_spin`"
        if await_spin is None:
            from_env = os.environ.get("NIXL_CONNECT_AWAIT_SPIN")
            if from_env is not None:
                spin_source = "NIXL_CONNECT_AWAIT_SPIN"
                try:
                    await_spin = float(from_env)
                except ValueError:
                    raise ValueError(
                        f"{spin_source} must be a number of seconds; got {from_env!r}."
                    ) from None
        if await_spin is not None:
            if isinstance(await_spin, bool) or not isinstance(await_spin, (int, float)):
                raise TypeError(f"{spin_source} must be a number of seconds or `None`.")
            if not 0 <= await_spin <= 0.05:
                raise ValueError(
                    f"{spin_source} must be between 0 and 0.05 seconds; got {await_spin!r}."
                )
        if quarantine_seconds is not None:
            if isinstance(quarantine_seconds, bool) or not isinstance(quarantine_seconds, (int, float)):
                raise TypeError("Argument `quarantine_seconds` must be a number of seconds or `None`.")
            if not quarantine_seconds >= 0:
                raise ValueError(
                    "Argument `quarantine_seconds` must be a non-negative number of seconds "
                    f"or `math.inf`; got {quarantine_seconds!r}."
                )
        if quarantine_readable_bytes is not None:
            if isinstance(quarantine_readable_bytes, bool) or not isinstance(quarantine_readable_bytes, int):
                raise TypeError("Argument `quarantine_readable_bytes` must be an `int` or `None`.")
            if quarantine_readable_bytes < 0:
                raise ValueError(
                    "Argument `quarantine_readable_bytes` must not be negative; "
                    f"got {quarantine_readable_bytes!r}."
                )
        keys: Optional[List[bytes]] = None
        if peer_keys is not None:
            if isinstance(peer_keys, (bytes, str)) or not all(
                isinstance(k, (bytes, str)) for k in peer_keys
            ):
                raise TypeError(
                    "Argument `peer_keys` must be a list of keys (`bytes`, or `str` of hex digits) or `None`."
                )
            try:
                keys = [bytes.fromhex(k) if isinstance(k, str) else bytes(k) for k in peer_keys]
            except ValueError:
                raise ValueError("Argument `peer_keys`: a `str` key is not hex digits.") from None
        if metrics is not None and not isinstance(metrics, Metrics):
            raise TypeError("Argument `metrics` must be a `nixl_connect.Metrics` or `None`.")
        if peer_failure_detection is None:
            peer_failure_detection = _flag_from_env("NIXL_CONNECT_PEER_FAILURE_DETECTION", True)
        elif not isinstance(peer_failure_detection, bool):
            raise TypeError("Argument `peer_failure_detection` must be a `bool` or `None`.")
        backend_source = "Argument `backend`"
        if backend is None:
            backend = os.environ.get("NIXL_CONNECT_BACKEND", "nixl")
            if "NIXL_CONNECT_BACKEND" in os.environ:
                backend_source = "NIXL_CONNECT_BACKEND"
        if backend not in BACKENDS:
            raise ValueError(
                f"{backend_source} must be one of {', '.join(BACKENDS)}; got {backend!r}."
            )
        self._worker_id = worker_id
        self._hostname = socket.gethostname()
        self._backend = backend
        # `None` until the native connector tells its backend's wait_assist.
        self._await_spin: Optional[float] = None if await_spin is None else float(await_spin)
        self._peer_failure_detection = peer_failure_detection
        self._quarantine = (
            None if quarantine_seconds is None else float(quarantine_seconds),
            quarantine_readable_bytes,
        )
        self._peer_keys = keys
        self._metrics = metrics
        self._native: Optional[_native.Connector] = None
        self._native_lock = threading.Lock()
        # Dynamo's names: a subclass may read or replace them (Dynamo's
        # pooled components set `_connection` and override `_create_connection`).
        self._connection_count = 0
        self._shared_connection: Optional[Connection] = None
        self._shared_connection_lock = threading.Lock()

    def _native_connector(self) -> _native.Connector:
        """The native connector (the agent), made on first use."""
        native = self._native
        if native is None:
            with self._native_lock:
                if self._native is None:
                    native = _native.Connector(
                        self._worker_id,
                        self._backend,
                        _search_paths(),
                        self._peer_failure_detection,
                        *self._quarantine,
                        self._peer_keys,
                        metrics=None if self._metrics is None else self._metrics._native,
                    )
                    if self._await_spin is None:
                        self._await_spin = min(native.wait_assist, AWAIT_SPIN_CAP)
                    self._native = native
                native = self._native
        return native

    def quarantined(self) -> "Quarantined":
        """What this connector's quarantine keeps now: the memory of
        exposures that ended without their peer's word (see the class), freed
        once their window is over. All zero before the agent exists."""
        native = self._native
        if native is None:
            return Quarantined(0, 0, 0)
        return Quarantined(*native.quarantined())

    def free_quarantined(self) -> "Quarantined":
        """Frees everything the quarantine keeps now, whatever its window,
        and returns what that was: for a worker that knows the peers of its
        abandoned exposures are gone (they exited, or cannot reach it any
        more). A peer that still holds their metadata may read and write the
        freed memory (see the class)."""
        native = self._native
        if native is None:
            return Quarantined(0, 0, 0)
        return Quarantined(*native.free_quarantined())

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Connector):
            return False
        return self._worker_id == other._worker_id

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Connector(worker_id='{self._worker_id}', hostname={self._hostname})"

    def __str__(self) -> str:
        return self._worker_id

    @property
    def hostname(self) -> str:
        """The name of this worker's host."""
        return self._hostname

    @property
    def name(self) -> str | None:
        """The worker's name (its `worker_id`)."""
        return self._worker_id

    @property
    def backend(self) -> str:
        """``"nixl"`` or ``"loopback"``."""
        return self._backend

    @property
    def await_spin(self) -> float:
        """Seconds an awaited READ or WRITE is first waited for in the calling
        thread (see the class's documentation). The default comes from the
        backend: reading it creates the agent if it does not exist yet."""
        if self._await_spin is None:
            self._native_connector()
        return cast(float, self._await_spin)

    @property
    def metrics(self) -> Optional[Metrics]:
        """The `Metrics` this connector counts into, or None."""
        return self._metrics

    @property
    def peer_failure_detection(self) -> bool:
        """Whether UCX must detect a peer that dies (see the class's
        documentation)."""
        return self._peer_failure_detection

    @cached_property
    def is_cuda_available(self) -> bool:
        """Whether CUDA memory can be used (CuPy or an imported torch says so)."""
        try:
            import cupy  # type: ignore[import-not-found]

            return cupy.cuda is not None and bool(cupy.cuda.is_available())
        except Exception:
            pass
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                return bool(torch.cuda.is_available())
            except Exception:
                return False
        return False

    async def initialize(self) -> None:
        """Deprecated in Dynamo; does nothing."""

    async def warm_up(self, remote_metadata: Optional[RdmaMetadata] = None) -> None:
        """Pays the first operation's set-up now (beyond Dynamo): creates the
        agent, which on NIXL loads the runtime the first time in the process
        and creates the NIXL agents (hundreds of milliseconds, in a worker
        thread: the event loop keeps running). With `remote_metadata` (a
        peer's `RdmaMetadata`), also loads that peer and makes the connection
        to it (Rust's ``Connector::warm_up``), so that the first READ or WRITE
        to it does not pay for the connection either; the peer stays loaded
        for the operations that follow. ``ImportError`` without a NIXL
        runtime, ``ValueError`` for metadata no peer could be loaded from."""
        if remote_metadata is not None and not _is_metadata(remote_metadata):
            raise TypeError("Argument `remote_metadata` must be `RdmaMetadata` or `None`.")
        native = await asyncio.to_thread(self._native_connector)
        if remote_metadata is not None:
            await asyncio.to_thread(native.warm_up, _native_of(remote_metadata))

    async def _create_connection(self) -> Connection:
        """The connection operations run through: one, shared, made under a
        lock (Dynamo 1.6.1's). `begin_*` and `create_*` await it (once it is
        made, only if a subclass overrides it), so a subclass's override is
        what they use."""
        connection = self._shared_connection
        if connection is None:
            with self._shared_connection_lock:
                if self._shared_connection is None:
                    self._connection_count += 1
                    self._shared_connection = Connection._shared(self, self._connection_count)
                connection = self._shared_connection
        if not connection._is_initialized:
            await connection.initialize()
        return connection

    async def begin_read(
        self,
        remote_metadata: RdmaMetadata,
        local_descriptors: Descriptor | list[Descriptor],
    ) -> ReadOperation:
        """READs a peer's readable memory (`remote_metadata`) into
        `local_descriptors`; the transfer is posted before this returns."""
        if remote_metadata is None or not _is_metadata(remote_metadata):
            raise TypeError("Argument `remote_metadata` must be `RdmaMetadata`.")
        if type(local_descriptors) is not Descriptor and not _is_descriptors(local_descriptors):
            raise TypeError(
                "Argument `local_descriptors` must be `dynamo.nixl_connect.Descriptor` or `list[dynamo.nixl_connect.Descriptor]`."
            )
        if remote_metadata.operation_kind != _READ:
            raise RuntimeError(
                "Cannot create a `dynamo.nixl_connect.ReadOperation` to read from a remote `dynamo.nixl_connect.WritableOperation`."
            )
        connection = self._shared_connection
        if connection is None or type(self)._create_connection is not _CREATE_CONNECTION:
            connection = await self._create_connection()
        try:
            return ReadOperation(connection, remote_metadata, local_descriptors)
        except _native.MemoryBusy:
            return await _when_let_go(ReadOperation, connection, remote_metadata, local_descriptors)

    async def begin_write(
        self,
        local_descriptors: Descriptor | list[Descriptor],
        remote_metadata: RdmaMetadata,
    ) -> WriteOperation:
        """WRITEs `local_descriptors` into a peer's writable memory
        (`remote_metadata`); the transfer is posted before this returns."""
        if remote_metadata is None or not _is_metadata(remote_metadata):
            raise TypeError("Argument `remote_metadata` must be `RdmaMetadata`.")
        if type(local_descriptors) is not Descriptor and not _is_descriptors(local_descriptors):
            raise TypeError(
                "Argument `local_descriptors` must be `Descriptor` or `list[Descriptor]`."
            )
        if remote_metadata.operation_kind != _WRITE:
            raise RuntimeError(
                "Cannot create a `WriteOperation` to write to a remote `ReadableOperation`."
            )
        if not isinstance(remote_metadata.nixl_metadata, str):
            raise TypeError("Argument `remote_metadata.nixl_metadata` must be `str`.")
        connection = self._shared_connection
        if connection is None or type(self)._create_connection is not _CREATE_CONNECTION:
            connection = await self._create_connection()
        try:
            return WriteOperation(connection, local_descriptors, remote_metadata)
        except _native.MemoryBusy:
            return await _when_let_go(WriteOperation, connection, local_descriptors, remote_metadata)

    async def begin_file_write(
        self,
        local_descriptors: Descriptor | list[Descriptor],
        segments: FileSegment | list[FileSegment],
    ) -> WriteOperation:
        """WRITEs `local_descriptors` into parts of files, pair by pair:
        descriptor ``i`` into `segments` ``i`` (a storage tier's offload);
        the transfer is posted before this returns. Not in Dynamo's API (an
        extension).

        ``ValueError`` unless there are as many segments as descriptors,
        each of its descriptor's ``size``, and every file was opened for
        writing (`FileSegment.writable`); a file grows as the WRITE reaches
        past its end. Once ``await op.wait_for_completion()`` returned, every
        byte is in its file (in the page cache: not synced to the disk; call
        ``os.fsync`` for that). A WRITE that did not complete (errored,
        cancelled, or its process died) may have written any part of any
        block: record a block as stored only once its WRITE completed."""
        local, single = _local(local_descriptors)
        files = _segment_list(segments)
        connection = self._shared_connection
        if connection is None or type(self)._create_connection is not _CREATE_CONNECTION:
            connection = await self._create_connection()
        try:
            return _file_write(connection, local, single, files)
        except _native.MemoryBusy:
            return await _when_let_go(_file_write, connection, local, single, files)

    async def begin_file_read(
        self,
        segments: FileSegment | list[FileSegment],
        local_descriptors: Descriptor | list[Descriptor],
    ) -> ReadOperation:
        """READs parts of files into `local_descriptors`, pair by pair:
        `segments` ``i`` into descriptor ``i`` (a storage tier's hit); the
        transfer is posted before this returns. Not in Dynamo's API (an
        extension).

        ``ValueError`` unless there are as many segments as descriptors,
        each of its descriptor's ``size``, the descriptors are writable
        memory (not ``bytes``), and every segment lies inside its file when
        the READ begins (a READ past the end is refused, not shortened)."""
        files = _segment_list(segments)
        local, single = _local(local_descriptors)
        connection = self._shared_connection
        if connection is None or type(self)._create_connection is not _CREATE_CONNECTION:
            connection = await self._create_connection()
        try:
            return _file_read(connection, files, local, single)
        except _native.MemoryBusy:
            return await _when_let_go(_file_read, connection, files, local, single)

    async def create_readable(
        self, local_descriptors: Descriptor | list[Descriptor]
    ) -> ReadableOperation:
        """Exposes `local_descriptors` for one peer to READ; send it `metadata()`."""
        connection = self._shared_connection
        if connection is None or type(self)._create_connection is not _CREATE_CONNECTION:
            connection = await self._create_connection()
        try:
            return ReadableOperation(connection, local_descriptors)
        except _native.MemoryBusy:
            return await _when_let_go(ReadableOperation, connection, local_descriptors)

    async def create_writable(
        self, local_descriptors: Descriptor | list[Descriptor]
    ) -> WritableOperation:
        """Exposes `local_descriptors` for one peer to WRITE; send it `metadata()`."""
        connection = self._shared_connection
        if connection is None or type(self)._create_connection is not _CREATE_CONNECTION:
            connection = await self._create_connection()
        try:
            return WritableOperation(connection, local_descriptors)
        except _native.MemoryBusy:
            return await _when_let_go(WritableOperation, connection, local_descriptors)


# `Connector`'s own `_create_connection`: while a connector's class keeps it,
# its operations take the shared connection without awaiting a coroutine.
_CREATE_CONNECTION = Connector._create_connection
