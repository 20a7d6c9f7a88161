"""``python -m nixl_connect``: the report a user runs first, and its exit status."""

import subprocess
import sys

import nixl_connect as nc
from conftest import NIXL_MISSING


def run_main(*args):
    return subprocess.run(
        [sys.executable, "-m", "nixl_connect", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_report_names_the_version_the_runtime_cuda_and_the_self_tests():
    child = run_main()
    out = child.stdout
    assert out.startswith(f"nixl_connect {nc.__version__} (Python "), out
    assert nc.__version__ == "0.1.0"
    assert "CUDA: " in out
    assert "self-test (loopback): 1 MiB READ, bytes checked: " in out and " GB/s " in out, out
    if NIXL_MISSING:
        assert child.returncode == 1, out + child.stderr
        assert "NIXL runtime: missing\n  NIXL runtime (libnixl_capi.so) not found. To fix: " in out, out
        assert "python -m nixl_connect install-runtime" in out and "\n  Searched (" in out, out
    else:
        assert child.returncode == 0, out + child.stderr
        assert "NIXL runtime: /" in out and "libnixl_capi.so (nixl-cu12 1.5.1)" in out, out
        assert "UCX" in out.split("plugin files:")[1].splitlines()[0]
        assert "self-test (nixl): 1 MiB READ, bytes checked: " in out, out


def test_install_runtime_installs_the_wheel_without_torch():
    child = run_main("install-runtime", "--dry-run")
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == f"$ {sys.executable} -m pip install --no-deps nixl-cu12==1.5.1"
