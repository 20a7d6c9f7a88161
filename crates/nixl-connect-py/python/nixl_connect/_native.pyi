# SPDX-License-Identifier: Apache-2.0
"""Types of the native module (Rust, ``src/``); `nixl_connect` wraps it.

Statuses and operation kinds are the integers of `nixl_connect.OperationStatus`
and `nixl_connect.OperationKind`.
"""

import asyncio
import os
from collections.abc import Sequence
from typing import Final, Protocol, final

__all__ = [
    "Connector",
    "MemoryBusy",
    "Descriptor",
    "FileSegment",
    "Metadata",
    "Metrics",
    "Snapshot",
    "Operation",
    "Notifier",
    "RegisteredMemory",
    "BACKENDS",
    "TYPE_ERROR_MESSAGE",
    "DEVICE_FORMS",
    "parse_device",
    "set_nixl_log_level",
    "nixl_runtime",
    "close_at_exit",
    "__version__",
]

BACKENDS: Final[list[str]]
"""Backends a `Connector` can be built over: ``"nixl"``, ``"loopback"``."""

__version__: Final[str]
"""The package's version (the crate's)."""

TYPE_ERROR_MESSAGE: Final[str]
"""The ``TypeError`` message for a `Descriptor` source it cannot read."""

DEVICE_FORMS: Final[str]
"""What ``nixl_connect.Device(...)`` takes, as the messages refusing an input say it."""

def parse_device(text: str) -> tuple[int, int]:
    """``(kind, ordinal)`` of a device string (the package's one parser), the
    kind as `nixl_connect.DeviceKind`'s integer; ``ValueError`` naming the
    input and the accepted forms."""

def set_nixl_log_level(
    level: str, site_packages: Sequence[str | os.PathLike[str]] | None = None
) -> None:
    """The native layer's log level (NIXL's, and UCX's unless ``UCX_LOG_LEVEL``
    is set): ``"info"``, ``"warning"``, ``"error"``, ``"fatal"``, ``"off"``.
    Loads the runtime first, as `nixl_runtime` does."""

def nixl_runtime(site_packages: Sequence[str | os.PathLike[str]] | None = None) -> str:
    """Loads the NIXL runtime; the path of its ``libnixl_capi.so``. Looked for
    first in `site_packages` (by default ``nixl_connect._search_paths()``, as
    every entry point that loads it does). ``ImportError`` without one: the
    fix first, then each place looked in once."""

def close_at_exit(to_stderr: bool) -> None:
    """From the package's ``atexit`` hook: no native thread enters the interpreter
    from now on; the library's later records go to stderr (``to_stderr``) or are
    dropped."""

class MemoryBusy(ValueError):
    """A descriptor's memory is still being written by an earlier operation."""

@final
class Connector:
    """A core connector over NIXL or the process-wide loopback fabric."""

    def __new__(
        cls,
        name: str,
        backend: str,
        site_packages: Sequence[str | os.PathLike[str]] | None = None,
        peer_failure_detection: bool = True,
        quarantine_seconds: float | None = None,
        quarantine_readable_bytes: int | None = None,
        peer_keys: Sequence[bytes] | None = None,
        *,
        metrics: Metrics | None = None,
    ) -> Connector:
        """`backend` is ``"nixl"`` or ``"loopback"``; NIXL's runtime is looked
        for first in `site_packages` (by default ``nixl_connect._search_paths()``).
        The quarantine settings not given are the environment's (ValueError
        if invalid), else the defaults. With `metrics`, the backend is
        counted into them (``Metered``); without, it is not wrapped."""

    def quarantined(self) -> tuple[int, int, int]:
        """What the quarantine keeps: ``(exposures, bytes, readable_bytes)``."""

    def free_quarantined(self) -> tuple[int, int, int]:
        """Frees what the quarantine keeps; what that was, as `quarantined`."""

    def agent_metadata(self) -> bytes:
        """The agent's metadata: NIXL's full serialized agent (Dynamo's
        ``Connection.metadata``), or loopback's blob."""

    def warm_up(self, metadata: Metadata) -> None:
        """Loads the peer `metadata` names and makes the connection to it now
        (GIL released)."""

    @property
    def remote_agents(self) -> int:
        """Peers loaded, in use or idle."""

    @property
    def name(self) -> str:
        """The agent name peers know this connector by."""

    @property
    def backend(self) -> str:
        """``"nixl"`` or ``"loopback"``."""

    @property
    def revocation_enforced(self) -> bool:
        """Whether the backend can cut a peer off after an operation ends."""

    @property
    def wait_assist(self) -> float:
        """Seconds a blocked waiter polls its transfer before it sleeps (the
        backend's ``wait_assist``); `await_spin`'s default, capped."""

    @property
    def _ucx_error_handling_mode(self) -> str | None:
        """Testing hook: ``"peer"`` or ``"none"`` (NIXL); ``None`` for loopback."""

    def _fail_next_transfer(self, reason: str) -> None:
        """Testing hook (loopback): the next transfer fails with `reason`."""

    def _delay_next_transfer(self, seconds: float) -> None:
        """Testing hook (loopback): the next transfer waits `seconds` first."""

    def _drain_next_transfer(self, seconds: float) -> None:
        """Testing hook (loopback): the next transfer waits `seconds`, then moves its bytes even if cancelled."""

    def _drop_next_notification(self) -> None:
        """Testing hook (loopback): the next transfer's notification is lost."""

    @property
    def registrations(self) -> int:
        """Backend registrations made so far (one per plain descriptor's first
        use, one per pool)."""

    def create_readable(self, descriptors: Sequence[Descriptor]) -> Operation:
        """Exposes the descriptors' memory for one peer to READ."""

    def create_writable(self, descriptors: Sequence[Descriptor]) -> Operation:
        """Exposes the descriptors' memory for one peer to WRITE."""

    def begin_read(self, metadata: Metadata, descriptors: Sequence[Descriptor]) -> Operation:
        """READs the peer's readable memory into the descriptors (posted on return)."""

    def begin_write(self, descriptors: Sequence[Descriptor], metadata: Metadata) -> Operation:
        """WRITEs the descriptors into the peer's writable memory (posted on return)."""

    def begin_file_write(
        self, descriptors: Sequence[Descriptor], segments: Sequence[FileSegment]
    ) -> Operation:
        """WRITEs the descriptors into the file segments, pair by pair (posted
        on return); ``ValueError`` for counts or sizes that differ, or a file
        opened read-only."""

    def begin_file_read(
        self, segments: Sequence[FileSegment], descriptors: Sequence[Descriptor]
    ) -> Operation:
        """READs the file segments into the descriptors, pair by pair (posted
        on return); ``ValueError`` for counts or sizes that differ, read-only
        memory, or a segment past its file's end."""

@final
class FileSegment:
    """A part of a file, `size` bytes from `offset`: the far side of a storage
    transfer. `file` is a path (opened read-write, else read-only; never
    created), an fd or a file object with ``fileno()`` (duplicated: the
    caller may close its own). `size` ``None``: to the end of the file now.
    ``ValueError`` for a file that cannot be a segment or a bad range,
    ``TypeError`` for a `file` of another type."""

    def __new__(
        cls,
        file: str | bytes | os.PathLike[str] | os.PathLike[bytes] | int | _HasFileno,
        offset: int = 0,
        size: int | None = None,
    ) -> FileSegment: ...
    @property
    def offset(self) -> int:
        """Where the segment starts in the file."""

    @property
    def size(self) -> int:
        """How many bytes the segment holds."""

    @property
    def writable(self) -> bool:
        """Whether the file was opened for writing."""

    @property
    def direct_io_alignment(self) -> tuple[int, int] | None:
        """``(memory, offset)`` alignment in bytes if the file was opened with
        ``O_DIRECT`` (memory addresses; offsets and sizes), else ``None``."""

    def at(self, offset: int, size: int) -> FileSegment:
        """Another segment of the same open file (same descriptor and registration)."""

    def same_file(self, other: FileSegment) -> bool:
        """Whether `other` is a segment of the same open file."""

    def file_size(self) -> int:
        """The file's size now, in bytes (``fstat``)."""

class _HasFileno(Protocol):
    """An object with ``fileno()`` (an open file)."""

    def fileno(self) -> int: ...

@final
class Descriptor:
    """Memory of a Python object, kept alive while a transfer may touch it."""

    def __new__(cls, data: object) -> Descriptor:
        """``TypeError`` (`TYPE_ERROR_MESSAGE`) if `data` describes no memory."""

    @property
    def ptr(self) -> int:
        """Start address of the memory."""

    @property
    def size(self) -> int:
        """Bytes a transfer moves (the capacity unless `set_size` lowered it)."""

    @property
    def capacity(self) -> int:
        """Bytes described (a pool's part: the part's)."""

    def set_size(self, size: int) -> None:
        """Transfers move the first `size` bytes (``0 < size <= capacity``,
        else ``ValueError``), from the next time the memory is lent."""

    @property
    def referent(self) -> object:
        """The object the memory belongs to (a pool's part: the pool's)."""

    @property
    def offset(self) -> int | None:
        """A pool's part: its offset in the pool's memory; ``None`` otherwise."""

    @property
    def device(self) -> str:
        """``cpu``, ``cuda:N`` or ``rocm:N``."""

    @property
    def writable(self) -> bool:
        """Whether transfers may write into the memory (``False`` for ``bytes``)."""

    @property
    def read_only_reason(self) -> str | None:
        """Why the memory is read-only, or ``None``."""

    @property
    def origin(self) -> str:
        """What the memory came from (``bytes``, ``array``, ``DLPack``, ...)."""

    @property
    def is_registered(self) -> bool:
        """Whether the memory is registered with a connector."""

    @property
    def in_use(self) -> bool:
        """Whether an operation holds the memory now."""

    def register(self, connector: Connector) -> None:
        """Registers with `connector`; ``RuntimeError`` if registered with another."""

    def deregister(self) -> None:
        """Deregisters (it registers again on its next use); nothing for a pool's part."""

@final
class RegisteredMemory:
    """A Python object's memory, registered once and described in parts."""

    def __new__(cls, data: object, block_size: int | None = None) -> RegisteredMemory:
        """What `Descriptor` takes; in blocks of `block_size` bytes if given."""

    @property
    def ptr(self) -> int:
        """Start address."""

    @property
    def size(self) -> int:
        """Bytes of the memory."""

    @property
    def device(self) -> str:
        """``cpu``, ``cuda:N`` or ``rocm:N``."""

    @property
    def writable(self) -> bool:
        """Whether transfers may write into the memory."""

    @property
    def origin(self) -> str:
        """What the memory came from."""

    @property
    def referent(self) -> object:
        """The object the memory belongs to."""

    @property
    def block_size(self) -> int | None:
        """Bytes per block; ``None`` for parts at any offset."""

    @property
    def blocks_total(self) -> int:
        """Number of blocks (0 without blocks)."""

    @property
    def free(self) -> int:
        """Blocks (block pools) or bytes no live descriptor owns and no operation holds."""

    @property
    def is_registered(self) -> bool:
        """Whether the memory is registered with a connector."""

    def register(self, connector: Connector) -> None:
        """Registers with `connector` now; ``RuntimeError`` if registered with another."""

    def view(self, offset: int, size: int) -> Descriptor:
        """A part owning `size` bytes at `offset`; ``ValueError`` on overlap or range."""

    def checkout(self, n: int) -> list[Descriptor] | None:
        """`n` one-block parts, lowest first; ``None`` if fewer are free."""

    def blocks(self, indices: list[int]) -> list[Descriptor]:
        """The blocks at `indices`, all or none (``ValueError`` naming one)."""

    def window(self) -> memoryview | None:
        """Host memory as a flat ``memoryview`` of bytes (format ``B``), in
        memory order, keeping the memory valid; ``None`` on a device."""

@final
class Metadata:
    """Validated ``RdmaMetadata``; made by `from_json`, `from_json_exact`,
    `from_dict_exact` or `Operation.metadata`."""

    @staticmethod
    def from_json(json: str | bytes | bytearray) -> Metadata:
        """Parses Dynamo's JSON; ``ValueError`` if invalid or over the bounds."""

    @staticmethod
    def from_json_exact(json: str | bytes | bytearray) -> Metadata:
        """Parses only a document pydantic reads into the model `model`
        builds (every field present once, objects, devices as Dynamo writes
        them), validated as `from_json`; ``ValueError`` otherwise."""

    @staticmethod
    def from_dict_exact(document: object) -> Metadata:
        """`from_json_exact` for a ``dict`` of exact ``dict``, ``list``,
        ``str`` and ``int`` objects; ``ValueError`` otherwise."""

    def to_json(self) -> str:
        """Dynamo's JSON: what pydantic writes for the model `model` builds."""

    def model(
        self, cls: type[object], descriptor_cls: type[object]
    ) -> tuple[object, Snapshot]:
        """The metadata as an instance of `cls` (``RdmaMetadata``) holding
        instances of `descriptor_cls` (``SerializedDescriptor``), built as
        pydantic-core builds validated ones, without validation; with the
        `Snapshot` of what it was built with."""

    @staticmethod
    def snapshot(model: object) -> Snapshot | None:
        """The `Snapshot` of `model` as it is now; ``None`` if its fields are
        not where pydantic keeps them."""

    @property
    def nixl_metadata(self) -> str:
        """``nixl_metadata`` as `to_json` writes it."""

    @property
    def operation_kind(self) -> int:
        """1 (the peer READs) or 2 (the peer WRITEs)."""

    @property
    def notification_key(self) -> str:
        """The key the peer's notification carries."""

    @property
    def descriptors(self) -> list[tuple[str, int, int]]:
        """``(device, ptr, size)`` of each remote descriptor."""

@final
class Snapshot:
    """What a model and its descriptors held (by identity) when their native
    twin was made; made by `Metadata.model` and `Metadata.snapshot`."""

    def holds(self, model: object) -> bool:
        """Whether `model` holds exactly what it held then."""

@final
class Metrics:
    """Transfer metrics (``descriptor_core::metrics::Metrics``) that
    connectors made with them count into."""

    def __new__(cls) -> Metrics: ...
    def encode_text(self) -> str:
        """Every metric as OpenMetrics text, ending in ``# EOF``."""

    def families(
        self,
    ) -> list[tuple[str, str, str, str, list[tuple[str, dict[str, str], float]]]]:
        """``(name, type, unit, help, samples)`` per family of `encode_text`,
        each sample ``(name, labels, value)``."""

    @staticmethod
    def described() -> list[tuple[str, str, str, str, list[tuple[str, dict[str, str], float]]]]:
        """The families a metered backend adds, without samples."""

@final
class Operation:
    """One of the core's four operations and the descriptors it borrowed."""

    def status(self) -> int:
        """The status; never blocks."""

    def cancel(self) -> None:
        """Cancels the operation unless it already ended."""

    def settled(self) -> bool:
        """Whether a wait would return at once."""

    def finish(self) -> int | None:
        """The final status once settled (``RuntimeError`` if it failed), else ``None``."""

    def wait(self, timeout: float | None = None) -> int:
        """Blocks (GIL released) until the end; ``TimeoutError`` after `timeout` s."""

    def spin(self, window: float) -> bool:
        """Waits at most `window` s for an active operation; whether it settled."""

    def reclaim_now(self) -> None:
        """Hands the memory back to the descriptors if the operation ended."""

    @property
    def reclaimed(self) -> bool:
        """Whether the memory was handed back."""

    def metadata(self) -> Metadata | None:
        """A passive operation's metadata; ``None`` if active."""

    def __len__(self) -> int:
        """Number of descriptors."""

@final
class Notifier:
    """Resolves asyncio futures when operations settle (one per event loop)."""

    def __new__(cls) -> Notifier:
        """``OSError`` if no eventfd can be made."""

    def fileno(self) -> int:
        """The eventfd the event loop watches."""

    def arm(self, operation: Operation, future: asyncio.Future[None]) -> int | None:
        """Resolves `future` once `operation` settles; the token, or ``None`` if
        it already settled."""

    def disarm(self, token: int) -> None:
        """Forgets an armed operation."""

    def on_ready(self) -> None:
        """The loop's reader callback: resolves the settled operations' futures."""

    def __len__(self) -> int:
        """Number of armed operations."""
