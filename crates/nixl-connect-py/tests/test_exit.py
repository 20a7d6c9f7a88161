"""A process exits with status 0 whatever it leaves to the interpreter's
finalization (issue 46, item 1: `py_exit_crash_native_thread_enters_python.py`).

The native log thread used to deliver a record logged while the interpreter
finalized (a readable cancelled or left unread, torn down at exit):
`Python::try_attach` saw a live interpreter, finalization began before
`PyGILState_Ensure` took the GIL, and CPython 3.11/3.12 ended the thread with
`pthread_exit`, a forced unwind through Rust frames (SIGSEGV in 2-4 of 20 runs
per scenario). A daemon thread coming back from a
blocking `wait()` (GIL released) crashed the same way (9 of 10 exits). The
package's `atexit` hook now stops every thread but the finalizing one from
taking the GIL through the package once finalization can begin.

Each check runs many small child processes, a few at a time (the crash was a
race); 500 with `RELIABILITY_LONG=1` (`cargo xtask test --long`).
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from conftest import NIXL_MISSING, NIXL_REQUIRED

LONG = os.environ.get("RELIABILITY_LONG") == "1"
PROCESSES = 500 if LONG else 50
PARALLEL = max(2, os.cpu_count() or 2)
CHILD_TIMEOUT_S = 120

# The reproducer's child, with two knobs: logging configured at DEBUG (records
# are then made during finalization on either backend, and must reach stderr),
# and the objects kept in a global (torn down only by finalization) or local.
CHILD = r"""
import asyncio, logging, sys
import nixl_connect as nc
backend, scenario, logs, keep = sys.argv[1:5]
if logs == "debug":
    logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
KEPT = []
async def main():
    peer = nc.Connector("exit-peer", backend=backend)
    readable = await peer.create_readable([nc.Descriptor(bytearray(12288))])
    if scenario == "cancel":
        readable.cancel()
    if scenario == "waited":
        # A daemon thread blocked in a wait (GIL released) when the process
        # exits: it must never take the GIL back.
        import threading
        started = threading.Event()
        def wait():
            started.set()
            readable.wait()
        threading.Thread(target=wait, daemon=True).start()
        started.wait()
    if keep == "global":
        KEPT.append((peer, readable))
    return 0
sys.exit(asyncio.run(main()))
"""

# (backend, scenario, logs, keep): the reproducer's two cases first.
NIXL_CASES = [
    ("nixl", "cancel", "default", "local"),
    ("nixl", "left", "default", "local"),
    ("nixl", "left", "debug", "global"),
    ("nixl", "waited", "default", "global"),
]
LOOPBACK_CASES = [
    ("loopback", "left", "debug", "global"),
    ("loopback", "cancel", "debug", "global"),
    ("loopback", "waited", "debug", "global"),
]


def cases():
    if NIXL_MISSING and NIXL_REQUIRED:
        raise AssertionError(f"NIXL runtime required but missing: {NIXL_MISSING}")
    return (LOOPBACK_CASES if NIXL_MISSING else NIXL_CASES + LOOPBACK_CASES)


def run_child(case):
    env = dict(os.environ)
    env.pop("PYTHONFAULTHANDLER", None)
    try:
        p = subprocess.run(
            [sys.executable, "-c", CHILD, *case],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            env=env,
        )
        return case, p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return case, "hung", err


def test_every_process_exits_cleanly_whatever_finalization_tears_down():
    chosen = cases()
    runs = [chosen[i % len(chosen)] for i in range(PROCESSES)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(run_child, runs))
    bad = {}
    for case, code, _ in results:
        if code != 0:
            bad.setdefault(case, []).append(code)
    summary = {
        " ".join(case): f"{len(bad.get(case, []))} of {runs.count(case)} failed {bad.get(case, [])}"
        for case in chosen
    }
    first = next((err for _, code, err in results if code != 0), "")
    assert not bad, f"exit statuses per case: {summary}\nfirst failure's stderr:\n{first[-3000:]}"
    for case, _, err in results:
        at_exit = [line for line in err.splitlines() if line.startswith("nixl_connect (at exit)")]
        if case[1] != "waited" and case[2] == "debug" and case[3] == "global":
            # The connector is torn down by finalization (not when a parked
            # daemon thread keeps it): its engine's last record is written
            # to stderr, after the logger's own records.
            assert any("progress engine stopped" in line for line in at_exit), (case, err[-2000:])
            assert "nixl_connect DEBUG exposed memory" in err, (case, err[-2000:])
        elif case[2] == "default":
            # Logging not configured: nothing of the library on stderr.
            assert at_exit == [], (case, err[-2000:])
