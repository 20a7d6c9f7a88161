"""Every entry point that loads the NIXL runtime finds it the same way, from the
running interpreter's `sys.path` first (`nixl_connect._search_paths()`), so a
virtualenv's interpreter run by path (not activated: no VIRTUAL_ENV) finds the
runtime pip installed into it, whichever entry point comes first.

Reproducer: ../shared/repros/python/py_set_nixl_log_level_before_any_connector.py.
"""

import os
import subprocess
import sys
import sysconfig

import pytest

from conftest import require_backend

CHILD_TIMEOUT_S = 120

# Each entry point, first in a fresh process; then the path loaded.
FIRST = {
    "set_nixl_log_level": "nc.set_nixl_log_level('warning')",
    "connector": "nc.Connector(backend='nixl')._native_connector()",
    "nixl_runtime": "nc._native.nixl_runtime()",
}


@pytest.mark.parametrize("entry", sorted(FIRST))
def test_each_entry_point_finds_the_runtime_in_sys_path_first(entry, tmp_path):
    require_backend("nixl")
    site = sysconfig.get_paths()["purelib"]
    if not os.path.isdir(os.path.join(site, ".nixl_cu12.mesonpy.libs")):
        pytest.skip(f"the NIXL runtime is not installed in this interpreter's {site}")
    # Nothing else to find it by: no activated environment, no runtime
    # variable, and no `python3` on PATH for the last-resort search.
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "NIXL_RUNTIME_DIR", "NIXL_CAPI_LIB")}
    env["PATH"] = str(tmp_path)
    code = f"import nixl_connect as nc\n{FIRST[entry]}\nprint(nc._native.nixl_runtime())"
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=CHILD_TIMEOUT_S)
    assert child.returncode == 0, child.stderr
    loaded = child.stdout.strip().splitlines()[-1]
    assert loaded == os.path.join(site, ".nixl_cu12.mesonpy.libs", "libnixl_capi.so")


def test_search_paths_start_with_sys_path():
    import nixl_connect as nc

    paths = nc._search_paths()
    on_sys_path = list(dict.fromkeys(p for p in sys.path if p and os.path.isdir(p)))
    assert paths[: len(on_sys_path)] == on_sys_path
    assert sysconfig.get_paths()["purelib"] in paths
