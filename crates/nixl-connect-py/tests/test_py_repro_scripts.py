"""The standalone reproducers of ../shared/repros (kept in scripts/), each run
in a child process: a use-after-free ends a process (glibc's abort, exit 134),
so only a child can show it. Each test checks the exit status and what the
script printed.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_backend

SCRIPTS = Path(__file__).parent / "scripts"
CHILD_TIMEOUT_S = 120


def run_script(name: str, **env: str) -> subprocess.CompletedProcess:
    child = subprocess.run(
        [sys.executable, str(SCRIPTS / name)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env={**os.environ, **env},
    )
    assert child.returncode != -signal.SIGABRT and child.returncode != 134, (
        f"{name} aborted (heap corruption):\n{child.stdout}\n{child.stderr}"
    )
    return child


def test_a_bytearray_whose_pin_was_looked_for_through_gc_refuses_to_resize():
    child = run_script("gc_bytearray_uaf.py")
    # The script resizes the described bytearray after releasing every
    # memoryview of it gc can find: the resize must fail, before any write.
    assert child.returncode == 1, child.stdout + child.stderr
    assert "BufferError" in child.stderr, child.stderr
    assert "victim now holds" not in child.stdout


@pytest.mark.skipif(sys.version_info < (3, 12), reason="PEP 688 __buffer__ is Python 3.12+")
def test_a_bytearray_subclass_with_a_decoy_buffer_refuses_to_resize():
    child = run_script("sneaky_bytearray_uaf.py")
    assert child.returncode == 1, child.stdout + child.stderr
    assert "BufferError" in child.stderr, child.stderr
    assert "resized the described bytearray" not in child.stdout


def test_a_cancelled_nixl_read_gives_its_descriptor_back_once_drained():
    require_backend("nixl")
    # TCP keeps the 256 MiB transfer in flight past the cancel.
    child = run_script("nixl_cancel_then_reuse.py", UCX_TLS="tcp")
    out = child.stdout
    assert child.returncode == 0, out + child.stderr
    assert "dst filled (transfer drained): True" in out, out
    assert "descriptor still in use: False" in out, out
    assert "dd reused" in out, out


def test_nixl_abandoned_readables_keep_no_more_than_the_quarantine_allows():
    """Issue 48, item 1: 60 abandoned 16 MiB readables (timed out, cancelled,
    closed unread) grew RSS by about 990 MiB, for the process's life; the
    quarantine's readables budget (64 MiB by default) bounds it."""
    require_backend("nixl")
    child = run_script("py_abandoned_readables_keep_their_memory.py")
    out = child.stdout
    assert child.returncode == 0, out + child.stderr
    for mode in ("timed out", "cancelled", "closed"):
        assert f"readables {mode}: RSS +" in out, out
