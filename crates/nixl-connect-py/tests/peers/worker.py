"""A Dynamo-style worker, for the interop tests: the same code runs against
the real `dynamo.nixl_connect` (PEER_IMPL=dynamo) and against `nixl_connect`;
only the import line differs.

Protocol (one JSON object per line, after "NIXLPEER "): the worker prints
`{"metadata": <RdmaMetadata JSON>}` (passive roles) or reads one such line
from stdin (active roles), then prints `{"sha256": [...], "status": "..."}`
with the checksum of each of its buffers after the transfer (and, for ours,
`"ucx_error_handling_mode"`: the NIXL agent's).

Roles: readable, writable (passive); read, write (active, which exit at
once after printing, without closing their connector).
Buffers: SIZES bytes each (PEER_SIZES overrides them); a sender fills buffer
i with pattern(seed, i).
"""

import asyncio
import hashlib
import json
import os
import sys

import numpy as np

if os.environ.get("PEER_IMPL") == "dynamo":
    import dynamo.nixl_connect as nixl_connect  # noqa: E402
else:
    import nixl_connect  # noqa: E402

# PEER_SIZES (comma-separated) overrides them, e.g. with empty buffers.
SIZES = [int(n) for n in os.environ.get("PEER_SIZES", "4096,65536,1048576").split(",")]


def pattern(seed: int, index: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed * 1000 + index).integers(0, 256, size, dtype=np.uint8)


MARK = "NIXLPEER "


def say(**fields) -> None:
    # Marked: NIXL's own logging also writes to stdout.
    sys.stdout.write(MARK + json.dumps(fields) + "\n")
    sys.stdout.flush()


def hear() -> dict:
    for line in sys.stdin:
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise EOFError("no message on stdin")


async def main(role: str, seed: int) -> None:
    connector = nixl_connect.Connector()
    sending = role in ("readable", "write")
    arrays = [
        pattern(seed, i, n) if sending else np.zeros(n, dtype=np.uint8)
        for i, n in enumerate(SIZES)
    ]
    descriptors = [nixl_connect.Descriptor((a, "cpu")) for a in arrays]
    if role in ("readable", "writable"):
        create = connector.create_readable if role == "readable" else connector.create_writable
        with await create(descriptors) as op:
            say(metadata=op.metadata().model_dump_json())
            await op.wait_for_completion()
            status = str(op.status)
    else:
        metadata = nixl_connect.RdmaMetadata.model_validate_json(
            hear()["metadata"]
        )
        if role == "read":
            op = await connector.begin_read(metadata, descriptors)
        else:
            op = await connector.begin_write(descriptors, metadata)
        with op:
            await op.wait_for_completion()
            status = str(op.status)
    # Ours only: UCX's error handling mode as the agent reports it.
    mode = getattr(getattr(connector, "_native", None), "_ucx_error_handling_mode", None)
    say(
        sha256=[hashlib.sha256(a.tobytes()).hexdigest() for a in arrays],
        status=status,
        ucx_error_handling_mode=mode,
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    if sys.argv[1] in ("read", "write"):
        # An active worker gone as soon as its operation ended, its connector
        # not even closed: the end it was told of (the peer notified) must not
        # depend on this process living on.
        sys.stdout.flush()
        os._exit(0)
