"""The typed Dynamo-style worker (typing/dynamo_worker.py, which mypy and
pyright check) also runs: in a child process, as `python dynamo_worker.py`,
it moves its bytes over the loopback fabric and exits 0."""

import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).parent / "typing" / "dynamo_worker.py"
CHILD_TIMEOUT_S = 120


def test_the_typed_dynamo_worker_runs_and_its_transfers_arrive():
    child = subprocess.run(
        [sys.executable, str(WORKER)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        cwd=WORKER.parent,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    assert child.stdout.splitlines() == ["dynamo_worker: every transfer arrived"], child.stdout
