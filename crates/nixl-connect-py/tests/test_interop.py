"""Interop with the real Dynamo module (`dynamo.nixl_connect` 1.6.1), in
separate processes over NIXL, both directions and both kinds, byte-checked;
and Dynamo 1.6's pooled components' way of using it (peers/pooled.py), with
the real module as the sender and as the receiver.

Both sides run the same worker script (peers/worker.py); only its import line
differs (PEER_IMPL=dynamo imports `dynamo.nixl_connect`). Dynamo's module needs
`torch`: its peers get a stand-in with an empty `Tensor` class on PYTHONPATH
(NIXL_CONNECT_TORCH_STUB), ours never see it.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import NIXL_REQUIRED, require_backend

WORKER = Path(__file__).parent / "peers" / "worker.py"
TIMEOUT_S = 60
DYNAMO_SRC = os.environ.get("NIXL_CONNECT_DYNAMO_SRC")
TORCH_STUB = os.environ.get("NIXL_CONNECT_TORCH_STUB")

sys.path.insert(0, str(WORKER.parent))
from worker import MARK, SIZES, pattern  # noqa: E402


def need_dynamo():
    require_backend("nixl")
    if not (DYNAMO_SRC and TORCH_STUB):
        message = "NIXL_CONNECT_DYNAMO_SRC / NIXL_CONNECT_TORCH_STUB not set (cargo xtask test sets them)"
        if NIXL_REQUIRED:
            pytest.fail(message)
        pytest.skip(message)


def spawn(impl: str, role: str, seed: int, script: Path = WORKER) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("NIXL_CONNECT_BACKEND", None)
    env.pop("NIXL_CONNECT_PEER_FAILURE_DETECTION", None)
    if impl == NO_DETECTION:
        # Ours without UCX's peer-failure detection, set the drop-in way.
        impl = "ours"
        env["NIXL_CONNECT_PEER_FAILURE_DETECTION"] = "0"
    env["PEER_IMPL"] = impl
    if impl == "dynamo":
        env["PYTHONPATH"] = os.pathsep.join([DYNAMO_SRC, TORCH_STUB])
    else:
        env.pop("PYTHONPATH", None)
    return subprocess.Popen(
        [sys.executable, str(script), role, str(seed)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def expected(seed: int) -> list:
    return [hashlib.sha256(pattern(seed, i, n).tobytes()).hexdigest() for i, n in enumerate(SIZES)]


def zeros() -> list:
    return [hashlib.sha256(np.zeros(n, dtype=np.uint8).tobytes()).hexdigest() for n in SIZES]


def exchange(passive_impl: str, passive_role: str, active_impl: str, active_role: str, seed: int):
    passive = spawn(passive_impl, passive_role, seed)
    active = spawn(active_impl, active_role, seed)
    try:
        line = ""
        for line in passive.stdout:
            if line.startswith(MARK):
                break
        assert line.startswith(MARK), f"passive peer ({passive_impl}) said nothing: {passive.stderr.read()[-4000:]}"
        active.stdin.write(line)
        active.stdin.flush()
        a_out, a_err = active.communicate(timeout=TIMEOUT_S)
        p_out, p_err = passive.communicate(timeout=TIMEOUT_S)
    finally:
        for p in (passive, active):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert active.returncode == 0, f"{active_impl} {active_role} failed:\n{a_err[-4000:]}"
    assert passive.returncode == 0, f"{passive_impl} {passive_role} failed:\n{p_err[-4000:]}"
    return last_message(p_out), last_message(a_out)


def last_message(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith(MARK)]
    assert lines, f"no result in {out[-2000:]!r}"
    return json.loads(lines[-1][len(MARK):])


NO_DETECTION = "ours-no-detection"
IMPLS = [
    ("dynamo", "ours"), ("ours", "dynamo"), ("ours", "ours"), ("dynamo", "dynamo"),
    ("dynamo", NO_DETECTION), (NO_DETECTION, "dynamo"),
]
# The NIXL agent's UCX error handling mode each kind of worker reports.
MODES = {"ours": "peer", NO_DETECTION: "none", "dynamo": None}


@pytest.mark.parametrize("passive_impl, active_impl", IMPLS, ids=[f"{p}-readable-{a}-reads" for p, a in IMPLS])
def test_a_readable_is_read_across_processes(passive_impl, active_impl):
    need_dynamo()
    seed = 21
    passive, active = exchange(passive_impl, "readable", active_impl, "read", seed)
    assert active["sha256"] == expected(seed), "the reader received the readable's bytes"
    assert passive["sha256"] == expected(seed)
    assert active["status"] == "DONE" and passive["status"] == "DONE"
    assert (passive["ucx_error_handling_mode"], active["ucx_error_handling_mode"]) == (
        MODES[passive_impl], MODES[active_impl]
    )


@pytest.mark.parametrize("passive_impl, active_impl", IMPLS, ids=[f"{p}-writable-{a}-writes" for p, a in IMPLS])
def test_a_writable_is_written_across_processes(passive_impl, active_impl):
    need_dynamo()
    seed = 34
    passive, active = exchange(passive_impl, "writable", active_impl, "write", seed)
    assert passive["sha256"] == expected(seed), "the writable holds the writer's bytes"
    assert passive["sha256"] != zeros()
    assert active["status"] == "DONE" and passive["status"] == "DONE"
    assert (passive["ucx_error_handling_mode"], active["ucx_error_handling_mode"]) == (
        MODES[passive_impl], MODES[active_impl]
    )


POOLED_WORKER = WORKER.parent / "pooled_worker.py"
POOLED_IMPLS = [("dynamo", "ours"), ("ours", "dynamo"), ("ours", "ours"), ("dynamo", "dynamo")]


def next_line(peer: subprocess.Popen, who: str) -> str:
    """The peer's next marked line (NIXL's own logging shares stdout)."""
    while True:
        line = peer.stdout.readline()
        if not line:
            peer.kill()
            raise AssertionError(f"{who} said nothing more: {peer.stderr.read()[-4000:]}")
        if line.startswith(MARK):
            return line


def tell(peer: subprocess.Popen, line: str) -> None:
    peer.stdin.write(line)
    peer.stdin.flush()


@pytest.mark.parametrize(
    "sender_impl, receiver_impl",
    POOLED_IMPLS,
    ids=[f"{s}-pooled-sender-{r}-pooled-receiver" for s, r in POOLED_IMPLS],
)
def test_pooled_components_across_processes(sender_impl, receiver_impl):
    """Dynamo's mm_kwargs sender (slots, a re-armed `_NonReleasingOp` each)
    serves payloads of six sizes to Dynamo's receiver (a `PersistentConnector`
    with a pool of pre-registered buffers, prefix reads through `_data_size`
    and `_data_ref[:n]`), each side on either implementation."""
    need_dynamo()
    from pooled_worker import SIZES as POOLED_SIZES

    seed = 55
    sender = spawn(sender_impl, "sender", seed, POOLED_WORKER)
    receiver = spawn(receiver_impl, "receiver", seed, POOLED_WORKER)
    received = []
    try:
        for index in range(len(POOLED_SIZES)):
            tell(receiver, next_line(sender, f"{sender_impl} sender"))
            received.append(json.loads(next_line(receiver, f"{receiver_impl} receiver")[len(MARK):]))
            tell(sender, MARK + json.dumps({"ack": index}) + "\n")
        tell(receiver, next_line(sender, f"{sender_impl} sender"))  # done
        final = json.loads(next_line(receiver, f"{receiver_impl} receiver")[len(MARK):])
        s_out, s_err = sender.communicate(timeout=TIMEOUT_S)
        r_out, r_err = receiver.communicate(timeout=TIMEOUT_S)
    finally:
        for p in (sender, receiver):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sender.returncode == 0, f"{sender_impl} sender failed:\n{s_err[-4000:]}"
    assert receiver.returncode == 0, f"{receiver_impl} receiver failed:\n{r_err[-4000:]}"
    assert [r["size"] for r in received] == POOLED_SIZES
    sent = [hashlib.sha256(pattern(seed, i, n).tobytes()).hexdigest() for i, n in enumerate(POOLED_SIZES)]
    assert [r["sha256"] for r in received] == sent, "every prefix holds the sender's bytes"
    if receiver_impl == "ours":
        # Two buffers registered up front, six reads: no registration per read.
        assert final["registrations"] == 2
