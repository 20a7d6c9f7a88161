"""`cargo xtask bench --python`: steady-state round trips through `nixl_connect`
(ours, NIXL backend) and through the real `dynamo.nixl_connect` 1.6.1.

Same process layout for both, as the Dynamo measurement it is compared with:
one worker process per implementation, holding two connectors (passive and
active). The driver (this script) runs them interleaved: a batch of one, then a
batch of the other, round after round, so machine noise hits both alike.

While one worker is measured the other is stopped (SIGSTOP): Dynamo's NIXL
agents run progress threads that spin even when idle, which on a small machine
would slow whichever process runs next to them.

One round trip: the passive side creates its readable (writable) operation and
its metadata (untimed), then the timed part: `begin_read` (`begin_write`) and
the active side's `wait_for_completion()`; then the passive side's wait
(untimed). The bytes are checked after the warm-up and after the last round.

The baseline for "within 1.5x of the Rust API" is measured in the same run
and layout: a third worker, the bench binary's `--python-worker` mode
(`NIXL_CONNECT_RUST_WORKER`), runs the Rust API's round trip (the main
bench's `nixl` row: `begin_*`, then a blocking `wait`) over the same NIXL
runtime, interleaved with the other two, and with ours' peer-failure
detection (`NIXL_CONNECT_PEER_FAILURE_DETECTION`; Dynamo's workers ignore it).

Metadata rows (`"op": "metadata-dump"`, `"metadata-parse"` and
`"metadata-round-trip"`, `"blocks"` descriptors of 4 KiB blocks): an
`RdmaMetadata` of that many descriptors, parsed from its JSON
(`model_validate_json`), dumped (`model_dump_json()` of the parsed model), and
both (the parsed model dumped and its JSON parsed again: what a request
plane hop costs the two ends), timed in each Python worker with its own
module, freeing the models left out (the same objects on both sides); ours also
through pydantic alone (`"py-nixl-connect-pydantic"`: the models' own
`model_validate_json`/`model_dump_json`, what the package did before its fast
path and still does for what that path leaves to pydantic).
`--metadata-only` measures only these.

Peer-failure detection rows (`"backend": "py-nixl-connect-xproc-pfd"` and
`"py-nixl-connect-xproc-no-pfd"`): ours between two processes (a passive and
an active worker each), one pair with UCX's peer-failure detection on (the
default) and one with it off (`NIXL_CONNECT_PEER_FAILURE_DETECTION=0` in
both), interleaved a batch at a time, 4 KiB READs. `"op": "read"` is the
active side's `begin_read` to its `wait_for_completion()` returning;
`"read-passive-done"` is the same `begin_read` to the passive side's
`wait_for_completion()` returning in the other process (the notification's
trip; both ends read the same monotonic clock). `--pfd-only` measures only
these and merges only them into the report.

Rows go into `report.json` (`--report`, merged: earlier `py-*` rows replaced)
with `"backend": "py-nixl-connect"`, `"py-dynamo"` and `"py-rust-api"`; a
Markdown table and the targets are printed.
"""

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

KIB, MIB = 1 << 10, 1 << 20
MARK = "BENCH "
# (worker, how its active side waits) -> report backend. Dynamo only awaits.
VARIANTS = {
    ("ours", "async"): "py-nixl-connect",
    ("ours", "blocking"): "py-nixl-connect-blocking",
    ("dynamo", "async"): "py-dynamo",
    ("rust", "async"): "py-rust-api-async",
    ("rust", "blocking"): "py-rust-api",
}
# The Python workers fill their buffers alike (NumPy's generator), so their
# digests must agree; the Rust worker checks its own bytes.
PYTHON_IMPLS = ("ours", "dynamo")
# Metadata rows: descriptors per document, the rounds of each, the backend
# of each way a worker parses and dumps.
METADATA_DESCRIPTORS = (1, 256, 4096)
METADATA_ROUNDS = {1: 2000, 256: 400, 4096: 100}
METADATA_BACKENDS = {
    ("ours", "api"): "py-nixl-connect",
    ("ours", "pydantic"): "py-nixl-connect-pydantic",
    ("dynamo", "api"): "py-dynamo",
}
METADATA_OPS = ("metadata-dump", "metadata-parse", "metadata-round-trip")
METADATA_TARGET_MS = 5.0


# Worker: one implementation, two connectors, one process.


def worker(impl: str) -> None:
    import numpy as np

    if impl == "dynamo":
        import dynamo.nixl_connect as nixl_connect
    else:
        import nixl_connect

    async def main() -> None:
        passive = nixl_connect.Connector()
        active = nixl_connect.Connector()
        buffers = {}

        def prepare(op: str, size: int):
            key = (op, size)
            if key not in buffers:
                rng = np.random.default_rng(size)
                src = rng.integers(0, 256, size, dtype=np.uint8)
                dst = np.zeros(size, dtype=np.uint8)
                # READ: the passive side holds the data; WRITE: the active side.
                p, a = (src, dst) if op == "read" else (dst, src)
                buffers[key] = (
                    p,
                    a,
                    nixl_connect.Descriptor((p, "cpu")),
                    nixl_connect.Descriptor((a, "cpu")),
                )
            return buffers[key]

        async def once(op: str, size: int, blocking: bool = False) -> float:
            _, _, pd, ad = prepare(op, size)
            if op == "read":
                passive_op = await passive.create_readable(pd)
                metadata = passive_op.metadata()
                started = time.perf_counter()
                active_op = await active.begin_read(metadata, ad)
            else:
                passive_op = await passive.create_writable(pd)
                metadata = passive_op.metadata()
                started = time.perf_counter()
                active_op = await active.begin_write(ad, metadata)
            with active_op:
                if blocking:
                    active_op.wait()
                else:
                    await active_op.wait_for_completion()
                elapsed = time.perf_counter() - started
            with passive_op:
                await passive_op.wait_for_completion()
            return elapsed

        def digest(op: str, size: int) -> str:
            p, a, _, _ = prepare(op, size)
            same = bool((p == a).all())
            return hashlib.sha256(p.tobytes()).hexdigest() if same else "MISMATCH"

        for line in sys.stdin:
            command = json.loads(line)
            if command["kind"] == "metadata":
                reply = time_metadata(nixl_connect, command["descriptors"], command["count"],
                                      command["via"])
                sys.stdout.write(MARK + json.dumps(reply) + "\n")
                sys.stdout.flush()
                continue
            op, size = command["op"], command["size"]
            if command["kind"] == "check":
                prepare(op, size)[1 if op == "read" else 0][:] = 0
                await once(op, size)
                reply = {"digest": digest(op, size)}
            else:
                blocking = command.get("wait") == "blocking"
                samples = [await once(op, size, blocking) for _ in range(command["count"])]
                reply = {"samples": samples, "digest": digest(op, size)}
            sys.stdout.write(MARK + json.dumps(reply) + "\n")
            sys.stdout.flush()

    asyncio.run(main())


def time_metadata(module, descriptors: int, count: int, via: str) -> dict:
    """Times parsing, dumping and both, `count` times each, of an
    `RdmaMetadata` of `descriptors` descriptors (4 KiB blocks of one GPU
    buffer, as a KV-cache pool publishes them), made with `module`'s models.
    `via`: "api" (the model's methods) or "pydantic" (pydantic's own, past
    any override)."""
    import base64
    import uuid
    import zlib

    from pydantic import BaseModel

    model = module.RdmaMetadata
    blob = bytes(range(256)) * 8
    base = 0x7F3A_0000_0000
    metadata = model(
        descriptors=[
            module.SerializedDescriptor(device="cuda:0", ptr=base + i * 4 * KIB, size=4 * KIB)
            for i in range(descriptors)
        ],
        nixl_metadata="b64:" + base64.b64encode(zlib.compress(blob, 6)).decode(),
        notification_key=str(uuid.uuid4()),
        operation_kind=1,
    )
    text = metadata.model_dump_json()
    if via == "pydantic":
        parse = BaseModel.model_validate_json.__func__.__get__(model)
        dump = BaseModel.model_dump_json
    else:
        parse, dump = model.model_validate_json, model.model_dump_json
    parsed = parse(text)
    if parsed != metadata or dump(parsed) != text:
        raise RuntimeError(f"metadata of {descriptors} descriptors ({via}) did not round-trip")
    samples = {op: [] for op in METADATA_OPS}
    for _ in range(count):
        # Freeing the models is left out of every timing: both
        # implementations hold as many Python objects, and free them alike.
        parsed = again = None
        started = time.perf_counter()
        parsed = parse(text)
        parsed_at = time.perf_counter()
        dump(parsed)
        dumped_at = time.perf_counter()
        again = parse(dump(parsed))
        done = time.perf_counter()
        samples["metadata-parse"].append(parsed_at - started)
        samples["metadata-dump"].append(dumped_at - parsed_at)
        samples["metadata-round-trip"].append(done - dumped_at)
    if again != metadata:
        raise RuntimeError(f"metadata of {descriptors} descriptors ({via}) did not round-trip")
    return {"samples": samples, "json_bytes": len(text)}


# Driver.


class Peer:
    def __init__(self, impl: str, pooled: bool = False) -> None:
        env = dict(os.environ)
        env.pop("NIXL_CONNECT_BACKEND", None)
        command = [sys.executable, __file__, "--pooled-worker" if pooled else "--worker", impl]
        if impl == "dynamo":
            env["PYTHONPATH"] = os.pathsep.join(
                [env["NIXL_CONNECT_DYNAMO_SRC"], env["NIXL_CONNECT_TORCH_STUB"]]
            )
        elif impl == "rust":
            # The NIXL runtime this environment's nixl-cu12 installed, as ours uses.
            env["NIXL_RUNTIME_DIR"] = sysconfig.get_paths()["purelib"]
            command = [env["NIXL_CONNECT_RUST_WORKER"], "--python-worker"]
            # Ours reads NIXL_CONNECT_PEER_FAILURE_DETECTION: the baseline
            # runs with the same setting.
            from nixl_connect import _flag_from_env

            if not _flag_from_env("NIXL_CONNECT_PEER_FAILURE_DETECTION", True):
                command.append("--no-peer-failure-detection")
        else:
            env.pop("PYTHONPATH", None)
        self.impl = impl
        self.others: list = []
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def pause(self, paused: bool) -> None:
        # Dynamo's NIXL agents run progress threads that spin even when idle
        # (two cores on this machine): a peer not being measured is stopped,
        # so it cannot steal the CPU from the one that is.
        os.kill(self.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def ask(self, **command) -> dict:
        assert self.process.stdin and self.process.stdout
        for other in self.others:
            other.pause(True)
        self.pause(False)
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise RuntimeError(f"{self.impl} worker exited ({self.process.wait()})")

    def close(self) -> None:
        self.pause(False)
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def percentile(sorted_samples: list, p: float) -> float:
    return sorted_samples[round((len(sorted_samples) - 1) * p)]


def measure_metadata(peers: list, quick: bool) -> list:
    """The metadata rows: each worker's ways in turns, a batch at a time."""
    rows = []
    for descriptors in METADATA_DESCRIPTORS:
        total = METADATA_ROUNDS[descriptors] // (2 if quick else 1)
        batch = max(total // 10, 1)
        ways = [(peer, via) for peer in peers
                for (impl, via) in METADATA_BACKENDS if impl == peer.impl]
        samples = {(peer.impl, via): {op: [] for op in METADATA_OPS} for peer, via in ways}
        json_bytes = {}
        for _ in range(total // batch):
            for peer, via in ways:
                reply = peer.ask(kind="metadata", descriptors=descriptors, count=batch, via=via)
                json_bytes[(peer.impl, via)] = reply["json_bytes"]
                for op in METADATA_OPS:
                    samples[(peer.impl, via)][op].extend(reply["samples"][op])
        for way, by_op in samples.items():
            for op, s in by_op.items():
                s.sort()
                rows.append({
                    "backend": METADATA_BACKENDS[way], "op": op, "block_bytes": 4 * KIB,
                    "blocks": descriptors, "json_bytes": json_bytes[way],
                    "p50_us": percentile(s, 0.5) * 1e6, "p99_us": percentile(s, 0.99) * 1e6,
                    "iterations": len(s),
                })
        print(f"bench --python: metadata of {descriptors} descriptors done ({total} rounds each)",
              file=sys.stderr)
    return rows


def measure(quick: bool, metadata_only: bool = False) -> list:
    sizes = [4 * KIB, 64 * KIB, MIB, 16 * MIB] + ([] if quick else [64 * MIB])
    impls = ["ours", "dynamo"]
    if os.environ.get("NIXL_CONNECT_RUST_WORKER") and not metadata_only:
        impls.append("rust")
    peers = [Peer(impl) for impl in impls]
    for peer in peers:
        peer.others = [p for p in peers if p is not peer]
    rows = []
    try:
        rows += measure_metadata([p for p in peers if p.impl in PYTHON_IMPLS], quick)
        if metadata_only:
            sizes = []
        for size in sizes:
            # Small rows are cheap and noisy on a small machine: full count
            # even with --quick (its 40 round trips gave 4 KiB ratios from
            # 0.65x to 2.1x between runs).
            total = 40 if quick and size > 64 * KIB else 200
            batch = 10 if quick and size > 64 * KIB else 20
            if size >= 16 * MIB:
                total, batch = (10, 5) if quick else (40, 10)
            for op in ("read", "write"):
                expected = {}
                for peer in peers:
                    digest = peer.ask(kind="check", op=op, size=size)["digest"]
                    same = expected.get("python") if peer.impl in PYTHON_IMPLS else None
                    if digest == "MISMATCH" or (same and digest != same):
                        raise RuntimeError(f"{peer.impl}: {op} of {size} B moved wrong bytes")
                    if peer.impl in PYTHON_IMPLS:
                        expected["python"] = digest
                    expected[peer.impl] = digest
                variants = [(peer, wait) for peer in peers
                            for (impl, wait) in VARIANTS if impl == peer.impl]
                samples = {(peer.impl, wait): [] for peer, wait in variants}
                for _ in range(total // batch):
                    for peer, wait in variants:
                        reply = peer.ask(kind="run", op=op, size=size, count=batch, wait=wait)
                        if reply["digest"] != expected[peer.impl]:
                            raise RuntimeError(f"{peer.impl}: {op} of {size} B moved wrong bytes")
                        samples[(peer.impl, wait)].extend(reply["samples"])
                for variant, s in samples.items():
                    s.sort()
                    p50 = percentile(s, 0.5)
                    rows.append({
                        "backend": VARIANTS[variant], "op": op, "block_bytes": size, "blocks": 1,
                        "gbps": size / p50 / 1e9, "p50_us": p50 * 1e6,
                        "p99_us": percentile(s, 0.99) * 1e6, "iterations": len(s),
                    })
                print(f"bench --python: {op} 1 x {size} B done ({total} iterations each)",
                      file=sys.stderr)
    finally:
        for peer in peers:
            peer.close()
    return rows


def human(size: int) -> str:
    return f"{size >> 20} MiB" if size >= MIB else f"{size >> 10} KiB"


def find(rows: list, backend: str, op: str, size: int):
    for r in rows:
        if (r["backend"], r["op"], r["block_bytes"], r["blocks"]) == (backend, op, size, 1):
            return r
    return None


def is_transfer(row: dict) -> bool:
    return row["op"] in ("read", "write")


def metadata_target(rows: list) -> list:
    """The metadata round trip at 4096 descriptors against its budget."""
    for r in rows:
        if (r["backend"], r["op"], r["blocks"]) == ("py-nixl-connect", "metadata-round-trip", 4096):
            ms = r["p50_us"] / 1e3
            return [{"target": f"metadata round trip at 4096 descriptors <= {METADATA_TARGET_MS:g} ms",
                     "value": round(ms, 2), "met": ms <= METADATA_TARGET_MS}]
    return []


def targets(rows: list) -> list:
    out = metadata_target(rows)
    for r in rows:
        if r["backend"] != "py-nixl-connect" or not is_transfer(r):
            continue
        d = find(rows, "py-dynamo", r["op"], r["block_bytes"])
        if d is None:
            continue
        size, op = r["block_bytes"], r["op"]
        if size in (4 * KIB, 64 * KIB):
            ratio = d["p50_us"] / r["p50_us"]
            out.append({"target": f"{op} {human(size)}: p50 >= 20x lower than Dynamo's",
                        "value": round(ratio, 1), "met": ratio >= 20})
        if size >= MIB:
            out.append({"target": f"{op} {human(size)}: GB/s >= Dynamo's",
                        "value": round(r["gbps"] / d["gbps"], 2), "met": r["gbps"] >= d["gbps"]})
    # The cost of the Python layer: each way of waiting against the Rust
    # API's same way, same run.
    for ours, rust, how in (
        ("py-nixl-connect", "py-rust-api-async", "awaited"),
        ("py-nixl-connect-blocking", "py-rust-api", "blocking wait"),
    ):
        for op in ("read", "write"):
            r, base = find(rows, ours, op, 4 * KIB), find(rows, rust, op, 4 * KIB)
            if r is not None and base is not None:
                ratio = r["p50_us"] / base["p50_us"]
                out.append({"target": f"{op} 4 KiB, {how}: p50 within 1.5x of the Rust API's",
                            "value": round(ratio, 2), "met": ratio <= 1.5})
    return out


def table(rows: list) -> str:
    lines = [
        "| op | block | nixl_connect p50 µs | Dynamo p50 µs | p50 × lower | nixl_connect GB/s"
        " | Dynamo GB/s | Rust API awaited p50 µs | nixl_connect wait() p50 µs | Rust API wait() p50 µs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def p50(backend: str, r: dict) -> str:
        other = find(rows, backend, r["op"], r["block_bytes"])
        return f"{other['p50_us']:.0f}" if other else "-"

    for r in rows:
        if r["backend"] != "py-nixl-connect" or not is_transfer(r):
            continue
        d = find(rows, "py-dynamo", r["op"], r["block_bytes"])
        lines.append(
            f"| {r['op']} | {human(r['block_bytes'])} | {r['p50_us']:.0f} | "
            f"{d['p50_us']:.0f} | {d['p50_us'] / r['p50_us']:.1f} | {r['gbps']:.2f} | "
            f"{d['gbps']:.2f} | {p50('py-rust-api-async', r)} | "
            f"{p50('py-nixl-connect-blocking', r)} | {p50('py-rust-api', r)} |"
        )
    return "\n".join(lines)


def metadata_table(rows: list) -> str:
    """p50 µs of each metadata op: ours, ours through pydantic alone, Dynamo's."""
    lines = [
        "| descriptors | JSON bytes | op | nixl_connect p50 µs | nixl_connect via pydantic p50 µs"
        " | Dynamo p50 µs | × lower than Dynamo |",
        "|---|---|---|---|---|---|---|",
    ]

    def p50(backend: str, n: int, op: str):
        for r in rows:
            if (r["backend"], r["op"], r["blocks"]) == (backend, op, n):
                return r["p50_us"]
        return None

    for n in METADATA_DESCRIPTORS:
        for op in METADATA_OPS:
            ours, before, dynamo = (p50(b, n, op) for b in
                                    ("py-nixl-connect", "py-nixl-connect-pydantic", "py-dynamo"))
            if ours is None:
                continue
            size = next(r["json_bytes"] for r in rows
                        if (r["backend"], r["op"], r["blocks"]) == ("py-nixl-connect", op, n))
            shown = [f"{v:.1f}" if v is not None else "-" for v in (ours, before, dynamo)]
            ratio = f"{dynamo / ours:.1f}" if dynamo is not None else "-"
            lines.append(f"| {n} | {size} | {op[len('metadata-'):]} | {' | '.join(shown)} | {ratio} |")
    return "\n".join(lines)


# Pooled prefix reads: Dynamo 1.6's multimodal components (embedding and
# mm_kwargs transfer) keep pre-registered 8 MB buffers and move a 3.7 MB
# payload (Dynamo's figure for a Qwen3-VL-2B image) as a prefix of one. Each
# worker does it its own way, in one process with two connectors:
# - "ours" and "dynamo": the components' own code path: the sender re-arms a
#   `ReadableOperation` subclass over its registered buffer (`_data_size`,
#   `_serialized_request = None`, `_status = INITIALIZED`, `metadata()`), the
#   receiver (a `Connector` subclass with its own `Connection(self, 1)`)
#   sets its registered buffer's `_data_size` and `begin_read`s; Dynamo's
#   ReadOperation deregisters the buffer when it is dropped, so each of its
#   reads registers it again;
# - "rust": `RegisteredMemory` on both sides, `begin_read_fit` into a view.
# Timed, as the components' receive does it per payload: the receiver's
# `begin_read`, its awaited completion, and dropping the operation (Rust:
# taking the view back).

POOLED_PAYLOAD = 3_700_000
POOLED_CAPACITY = 8 * MIB
POOLED_BACKENDS = {
    "ours": "py-nixl-connect-pooled",
    "dynamo": "py-dynamo-pooled",
    "rust": "py-rust-api-pooled",
}


def pooled_worker(impl: str) -> None:
    import numpy as np

    if impl == "dynamo":
        import dynamo.nixl_connect as nixl_connect
    else:
        import nixl_connect

    def keep(self) -> None:
        pass

    nixl_connect.Remote._release = keep

    class PersistentConnector(nixl_connect.Connector):
        def __init__(self) -> None:
            super().__init__()
            self._connection = None

        async def _create_connection(self):
            if self._connection is None:
                self._connection = nixl_connect.Connection(self, 1)
                await self._connection.initialize()
            return self._connection

    class NonReleasingOp(nixl_connect.ReadableOperation):
        def _release(self) -> None:
            pass

    async def main() -> None:
        sender, receiver = nixl_connect.Connector(), PersistentConnector()
        staging = np.random.default_rng(37).integers(0, 256, POOLED_CAPACITY, dtype=np.uint8)
        slot = nixl_connect.Descriptor((staging, "cpu"))
        slot.register_with_connector(await sender._create_connection())
        readable = NonReleasingOp(await sender._create_connection(), slot)
        landing = np.zeros(POOLED_CAPACITY, dtype=np.uint8)
        pooled = nixl_connect.Descriptor((landing, "cpu"))
        pooled.register_with_connector(await receiver._create_connection())

        async def once(size: int) -> float:
            slot._data_size = size
            slot._serialized = None
            readable._serialized_request = None
            readable._status = nixl_connect.OperationStatus.INITIALIZED
            metadata = readable.metadata()
            started = time.perf_counter()
            pooled._data_size = size
            read = await receiver.begin_read(metadata, pooled)
            await read.wait_for_completion()
            del read  # done with it: Dynamo's deregisters the buffer here
            elapsed = time.perf_counter() - started
            pooled._data_size = POOLED_CAPACITY
            await readable.wait_for_completion()
            slot._data_size = POOLED_CAPACITY
            return elapsed

        def digest(size: int) -> str:
            got = landing[:size]
            same = bool((got == staging[:size]).all())
            return hashlib.sha256(got.tobytes()).hexdigest() if same else "MISMATCH"

        for line in sys.stdin:
            command = json.loads(line)
            size = command["size"]
            if command["kind"] == "check":
                landing[:] = 0
                samples = [await once(size)]
            else:
                samples = [await once(size) for _ in range(command["count"])]
            reply = {"samples": samples, "digest": digest(size)}
            sys.stdout.write(MARK + json.dumps(reply) + "\n")
            sys.stdout.flush()

    asyncio.run(main())


def measure_pooled(quick: bool) -> list:
    impls = ["ours", "dynamo"] + (["rust"] if os.environ.get("NIXL_CONNECT_RUST_WORKER") else [])
    peers = [Peer(impl, pooled=True) for impl in impls]
    for peer in peers:
        peer.others = [p for p in peers if p is not peer]
    total, batch = (40, 10) if quick else (200, 20)
    command = {"op": "pooled-read", "size": POOLED_PAYLOAD, "capacity": POOLED_CAPACITY, "wait": "async"}
    samples: dict = {peer.impl: [] for peer in peers}
    digests = {}
    try:
        for peer in peers:
            digest = peer.ask(kind="check", **command)["digest"]
            if digest == "MISMATCH":
                raise RuntimeError(f"{peer.impl}: the pooled read moved wrong bytes")
            digests[peer.impl] = digest
        if digests["ours"] != digests["dynamo"]:
            raise RuntimeError("ours and Dynamo's pooled reads received different bytes")
        for _ in range(total // batch):
            for peer in peers:
                reply = peer.ask(kind="run", count=batch, **command)
                if reply["digest"] != digests[peer.impl]:
                    raise RuntimeError(f"{peer.impl}: the pooled read moved wrong bytes")
                samples[peer.impl].extend(reply["samples"])
    finally:
        for peer in peers:
            peer.close()
    rows = []
    for impl, s in samples.items():
        s.sort()
        p50 = percentile(s, 0.5)
        rows.append({
            "backend": POOLED_BACKENDS[impl], "op": "read", "block_bytes": POOLED_PAYLOAD,
            "blocks": 1, "capacity_bytes": POOLED_CAPACITY, "gbps": POOLED_PAYLOAD / p50 / 1e9,
            "p50_us": p50 * 1e6, "p99_us": percentile(s, 0.99) * 1e6, "iterations": len(s),
        })
    print(f"bench --python: pooled prefix read of {POOLED_PAYLOAD} B done ({total} iterations each)",
          file=sys.stderr)
    return rows


def pooled_targets(rows: list) -> list:
    def p50(impl: str):
        found = find(rows, POOLED_BACKENDS[impl], "read", POOLED_PAYLOAD)
        return None if found is None else found["p50_us"]

    ours, rust, dynamo = p50("ours"), p50("rust"), p50("dynamo")
    out = []
    if ours is not None and rust is not None:
        out.append({"target": "pooled 3.7 MB prefix read: p50 within 1.3x of the Rust API's",
                    "value": round(ours / rust, 2), "met": ours / rust <= 1.3})
    if ours is not None and dynamo is not None:
        out.append({"target": "pooled 3.7 MB prefix read: p50 >= 8x lower than Dynamo's",
                    "value": round(dynamo / ours, 1), "met": dynamo / ours >= 8})
    return out


def pooled_table(rows: list) -> str:
    cells = []
    for impl in ("ours", "rust", "dynamo"):
        r = find(rows, POOLED_BACKENDS[impl], "read", POOLED_PAYLOAD)
        cells.append("-" if r is None else f"{r['p50_us']:.0f} µs ({r['gbps']:.2f} GB/s)")
    return "\n".join([
        "| pooled prefix read | nixl_connect p50 | Rust API p50 | Dynamo p50 |",
        "|---|---|---|---|",
        f"| 3.7 MB into 8 MB | {cells[0]} | {cells[1]} | {cells[2]} |",
    ])


# Peer-failure detection rows: ours across two processes, on and off.

PFD_BACKENDS = {True: "py-nixl-connect-xproc-pfd", False: "py-nixl-connect-xproc-no-pfd"}
PFD_SIZE = 4 * KIB
PFD_WARM_UP = 20


def xproc_worker(role: str) -> None:
    """One side of a cross-process READ, commanded line by line; the
    passive side keeps serving its peer while it waits for the next line."""
    import numpy as np

    import nixl_connect

    async def main() -> None:
        loop = asyncio.get_running_loop()
        connector = nixl_connect.Connector()
        buffers: dict = {}
        pending: "asyncio.Task | None" = None

        def buffer(size: int):
            if size not in buffers:
                data = (np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
                        if role == "passive" else np.zeros(size, dtype=np.uint8))
                buffers[size] = (data, nixl_connect.Descriptor((data, "cpu")))
            return buffers[size]

        async def finished(op) -> float:
            with op:
                await op.wait_for_completion()
            return time.perf_counter()

        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            command = json.loads(line)
            if command["kind"] == "expose":
                readable = await connector.create_readable(buffer(command["size"])[1])
                reply = {"metadata": readable.metadata().model_dump_json()}
                pending = asyncio.ensure_future(finished(readable))
            elif command["kind"] == "result":
                assert pending is not None
                reply = {"done_at": await pending}
                pending = None
            else:  # "read"
                data, descriptor = buffer(command["size"])
                metadata = nixl_connect.RdmaMetadata.model_validate_json(command["metadata"])
                started = time.perf_counter()
                read = await connector.begin_read(metadata, descriptor)
                with read:
                    await read.wait_for_completion()
                done = time.perf_counter()
                reply = {"started": started, "done": done,
                         "digest": hashlib.sha256(data.tobytes()).hexdigest()}
            sys.stdout.write(MARK + json.dumps(reply) + "\n")
            sys.stdout.flush()

    asyncio.run(main())


class XprocPeer(Peer):
    """A cross-process worker of ours with peer-failure detection on or off."""

    def __init__(self, role: str, detect: bool) -> None:
        env = dict(os.environ)
        env.pop("NIXL_CONNECT_BACKEND", None)
        env.pop("PYTHONPATH", None)
        env["NIXL_CONNECT_PEER_FAILURE_DETECTION"] = "1" if detect else "0"
        self.impl = f"{role}-{'pfd' if detect else 'no-pfd'}"
        self.others = []
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--xproc-worker", role],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )

    def ask(self, **command) -> dict:
        # Both sides of a pair run at once (no pausing).
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise RuntimeError(f"{self.impl} worker exited ({self.process.wait()})")


def measure_pfd(quick: bool) -> list:
    """READ latency and the passive side's completion, with UCX's
    peer-failure detection on and off, two processes per pair, interleaved."""
    total, batch = (100, 20) if quick else (400, 20)
    pairs = {detect: (XprocPeer("passive", detect), XprocPeer("active", detect))
             for detect in (True, False)}
    samples = {(detect, op): [] for detect in pairs for op in ("read", "read-passive-done")}
    expected = None

    def once(detect: bool):
        passive, active = pairs[detect]
        metadata = passive.ask(kind="expose", size=PFD_SIZE)["metadata"]
        read = active.ask(kind="read", size=PFD_SIZE, metadata=metadata)
        done_at = passive.ask(kind="result")["done_at"]
        return read, done_at

    try:
        for detect in pairs:
            for _ in range(PFD_WARM_UP):
                read, _ = once(detect)
            if expected is None:
                expected = read["digest"]
            if read["digest"] != expected:
                raise RuntimeError("the peer-failure detection pairs moved different bytes")
        for _ in range(total // batch):
            for detect in pairs:
                for _ in range(batch):
                    read, done_at = once(detect)
                    samples[(detect, "read")].append(read["done"] - read["started"])
                    samples[(detect, "read-passive-done")].append(done_at - read["started"])
                if read["digest"] != expected:
                    raise RuntimeError("a peer-failure detection READ moved wrong bytes")
    finally:
        for pair in pairs.values():
            for peer in pair:
                peer.close()
    rows = []
    for (detect, op), s in samples.items():
        s.sort()
        p50 = percentile(s, 0.5)
        rows.append({
            "backend": PFD_BACKENDS[detect], "op": op, "block_bytes": PFD_SIZE, "blocks": 1,
            "gbps": PFD_SIZE / p50 / 1e9, "p50_us": p50 * 1e6,
            "p99_us": percentile(s, 0.99) * 1e6, "iterations": len(s),
        })
    print(f"bench --python: peer-failure detection on/off, 4 KiB READs across processes "
          f"done ({total} iterations each)", file=sys.stderr)
    return rows


def pfd_table(rows: list) -> str:
    lines = ["| 4 KiB READ, two processes | detection on p50 (p99) | off p50 (p99) | on / off |",
             "|---|---|---|---|"]
    for op, what in (("read", "active side: begin_read to its wait"),
                     ("read-passive-done", "begin_read to the passive side's wait")):
        on, off = find(rows, PFD_BACKENDS[True], op, PFD_SIZE), find(rows, PFD_BACKENDS[False], op, PFD_SIZE)
        if on is None or off is None:
            continue
        lines.append(f"| {what} | {on['p50_us']:.0f} µs ({on['p99_us']:.0f}) | "
                     f"{off['p50_us']:.0f} µs ({off['p99_us']:.0f}) | {on['p50_us'] / off['p50_us']:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=sorted({w for w, _ in VARIANTS}))
    parser.add_argument("--pooled-worker", choices=["ours", "dynamo"])
    parser.add_argument("--xproc-worker", choices=["passive", "active"])
    parser.add_argument("--pfd-only", action="store_true",
                        help="only the peer-failure detection rows (ours, across processes)")
    parser.add_argument("--report", type=Path, default=Path("target/bench/report.json"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--metadata-only", action="store_true",
                        help="only the metadata rows (no NIXL transfers)")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    if args.pooled_worker:
        pooled_worker(args.pooled_worker)
        return 0
    if args.xproc_worker:
        xproc_worker(args.xproc_worker)
        return 0
    if args.pfd_only:
        rows = measure_pfd(args.quick)
        report = json.loads(args.report.read_text()) if args.report.is_file() else {}
        report["results"] = [r for r in report.get("results", [])
                             if r.get("backend") not in PFD_BACKENDS.values()] + rows
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report, indent=2))
        print("\n== peer-failure detection (ours, NIXL, two processes), 4 KiB READs ==")
        print(pfd_table(rows))
        print(f"\nwrote {args.report}")
        return 0
    for var in ("NIXL_CONNECT_DYNAMO_SRC", "NIXL_CONNECT_TORCH_STUB"):
        if not os.environ.get(var):
            print(f"bench.py: {var} is not set (cargo xtask bench --python sets it)", file=sys.stderr)
            return 2
    rows = measure(args.quick, args.metadata_only)
    pooled_rows = [] if args.metadata_only else measure_pooled(args.quick)
    pfd_rows = [] if args.metadata_only else measure_pfd(args.quick)
    report = {}
    if args.report.is_file():
        report = json.loads(args.report.read_text())

    def replaced(row: dict) -> bool:
        # Every earlier Python row, or only its metadata rows.
        python = str(row.get("backend", "")).startswith("py-")
        return python and (not args.metadata_only or str(row.get("op", "")).startswith("metadata-"))

    results = [r for r in report.get("results", []) if not replaced(r)]
    report["results"] = results + rows + pooled_rows + pfd_rows
    if args.metadata_only:
        kept = [t for t in report.get("python_targets", []) if not t["target"].startswith("metadata ")]
        report["python_targets"] = metadata_target(rows) + kept
    else:
        report["python_targets"] = targets(rows) + pooled_targets(pooled_rows)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2))
    if not args.metadata_only:
        print("\n== nixl_connect (ours, NIXL) vs dynamo.nixl_connect 1.6.1, one block, p50 ==")
        print(table(rows))
        print("\n== pooled prefix read (Dynamo 1.6's multimodal transfer), awaited, p50 ==")
        print(pooled_table(pooled_rows))
        print("\n== peer-failure detection (ours, NIXL, two processes), 4 KiB READs ==")
        print(pfd_table(pfd_rows))
    print("\n== RdmaMetadata: nixl_connect vs dynamo.nixl_connect 1.6.1, p50 ==")
    print(metadata_table(rows))
    for t in report["python_targets"]:
        print(f"  [{'met' if t['met'] else 'MISSED'}] {t['target']}: {t['value']}")
    if not os.environ.get("NIXL_CONNECT_RUST_WORKER"):
        print("  (NIXL_CONNECT_RUST_WORKER is not set: no Rust API rows, no 1.5x comparison)")
    print(f"\nwrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
