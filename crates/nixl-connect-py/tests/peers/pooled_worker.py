"""A worker running Dynamo 1.6's pooled components' way of using the API
(pooled.py), for the interop tests: over the real `dynamo.nixl_connect`
(PEER_IMPL=dynamo) or over `nixl_connect`; only the import line differs.

Roles (one JSON object per line after "NIXLPEER ", as worker.py):

- ``sender``: a pool of two slots with one re-armed readable each; for
  payload i it prints ``{"index": i, "metadata": ...}``, waits for
  ``{"ack": i}`` on stdin (the receiver has read it), then awaits the
  readable's completion and returns the slot; finally ``{"done": true}``.
- ``receiver``: a pool of two pre-registered buffers; for each metadata line
  on stdin it reads the payload into a buffer (``_data_size``,
  ``_data_ref[:n]``) and prints ``{"index": i, "size": n, "sha256": ...}``;
  on ``{"done": true}`` it prints ``{"registrations": N}`` (ours only:
  backend registrations of its connector) and exits.

Payload i is `worker.pattern(seed, i, SIZES[i])`, into buffers of MAX_BYTES.
"""

import asyncio
import json
import os
import sys

if os.environ.get("PEER_IMPL") == "dynamo":
    import dynamo.nixl_connect as nixl_connect  # noqa: E402
else:
    import nixl_connect  # noqa: E402

import pooled  # noqa: E402
from worker import MARK, hear, pattern, say  # noqa: E402

MAX_BYTES = 1 << 20
SIZES = [1, 4096, 123_457, 1 << 20, 700_001, 65_536]
WAIT_S = 30


async def sender(seed: int) -> None:
    pool = pooled.PooledSender(nixl_connect, count=2, max_bytes=MAX_BYTES)
    for index, size in enumerate(SIZES):
        slot, metadata = pool.load(pattern(seed, index, size))
        say(index=index, metadata=metadata.model_dump_json())
        ack = hear()
        assert ack == {"ack": index}, ack
        await asyncio.wait_for(pool.finish(slot), WAIT_S)
    say(done=True)


async def receiver() -> None:
    pool = pooled.PooledReceiver(nixl_connect, count=2, max_bytes=MAX_BYTES)
    while True:
        message = hear()
        if message.get("done"):
            break
        descriptor, received = await asyncio.wait_for(pool.receive(message["metadata"]), WAIT_S)
        say(index=message["index"], size=len(received), sha256=pooled.digest(received))
        pool.release(descriptor)
    native = getattr(pool.connector, "_native", None)
    say(registrations=getattr(native, "registrations", None))


if __name__ == "__main__":
    pooled.patch_remote_release(nixl_connect)
    role = sys.argv[1]
    asyncio.run(sender(int(sys.argv[2])) if role == "sender" else receiver())
    sys.stdout.flush()
    os._exit(0)
