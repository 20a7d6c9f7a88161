"""The native layer's log lines (NIXL's and UCX's) never reach stdout, and obey
`set_nixl_log_level`: "off" silences UCX too (UCX prints on stdout by
default, which corrupts a worker whose stdout carries data). Each case runs
in a child process: log settings are process-wide, and UCX reads its own
variables once, when the first agent loads it.

Reproducer: ../shared/repros/python/py_ucx_lines_on_stdout_with_nixl_log_off.py.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import require_backend

CHILD_TIMEOUT_S = 120

# A READ refused by the peer (a forged remote address) after the level is
# set: NIXL and UCX both have something to say about it.
REFUSED_READ = r'''
import asyncio, json, sys, nixl_connect as nc
async def main():
    c, d = nc.Connector(), nc.Connector()
    r0 = await c.create_readable(nc.Descriptor(bytearray(8))); r0.cancel()
    nc.set_nixl_log_level("off")
    r = await c.create_readable(nc.Descriptor(bytearray(16)))
    j = json.loads(r.metadata().model_dump_json()); j["descriptors"][0]["ptr"] += 1 << 30
    try:
        op = await d.begin_read(nc.RdmaMetadata.model_validate_json(json.dumps(j)), nc.Descriptor(bytearray(16)))
        await op.wait_for_completion(timeout=5)
    except Exception as e:
        print("refused:", type(e).__name__, file=sys.stderr)
asyncio.run(main())
print("MARK", flush=True)
import os; os._exit(0)
'''

# UCX's own view of its log settings, read from the libucs this process
# loaded (with the first agent), after `set_nixl_log_level(LEVEL)` at WHEN.
UCX_SETTINGS = r'''
import ctypes, json, sys, nixl_connect as nc
level, when = sys.argv[1], sys.argv[2]
if when == "before":
    nc.set_nixl_log_level(level)
nc.Connector()._native_connector()
if when == "after":
    nc.set_nixl_log_level(level)
path = next(l.split()[-1] for l in open("/proc/self/maps") if "/libucs-" in l or "/libucs.so" in l)
ucs = ctypes.CDLL(path)
ucs.ucs_global_opts_get_value.restype = ctypes.c_int8
def get(name):
    value = ctypes.create_string_buffer(256)
    status = ucs.ucs_global_opts_get_value(name.encode(), value, ctypes.c_size_t(256))
    return value.value.decode() if status == 0 else f"status {status}"
# UCX read its file from the environment when it was loaded (os.environ is
# Python's copy, made at start-up).
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
log_file = libc.getenv(b"UCX_LOG_FILE")
print(json.dumps({"LOG_LEVEL": get("LOG_LEVEL"), "UCX_LOG_FILE": log_file and log_file.decode()}))
import os; os._exit(0)
'''


def child(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("UCX_LOG")}
    base.pop("NIXL_LOG_LEVEL", None)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True,
        timeout=CHILD_TIMEOUT_S, env={**base, **env},
    )


def test_native_lines_never_reach_stdout_and_off_silences_ucx():
    require_backend("nixl")
    p = child(REFUSED_READ)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == ["MARK"], p.stdout
    assert "refused: RuntimeError" in p.stderr, p.stderr
    # "off": neither NIXL's E lines nor UCX's ERROR lines, on either stream.
    assert "UCX" not in p.stderr and "createXferReq" not in p.stderr, p.stderr


@pytest.mark.parametrize("level, when, ucx_level", [
    ("off", "before", "FATAL"), ("off", "after", "FATAL"),
    ("error", "before", "ERROR"), ("error", "after", "ERROR"),
    ("warning", "after", "WARN"), ("info", "after", "WARN"),
])
def test_ucx_logs_to_stderr_at_the_level_set(level, when, ucx_level):
    """UCX's log goes to stderr, at the level set before the first agent (it
    reaches UCX through its environment) or after (set on the UCX loaded)."""
    require_backend("nixl")
    p = child(UCX_SETTINGS, level, when)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"LOG_LEVEL": ucx_level, "UCX_LOG_FILE": "stderr"}


def test_the_users_ucx_variables_win(tmp_path):
    require_backend("nixl")
    log = str(tmp_path / "ucx-%p.log")
    for when in ("before", "after"):
        p = child(UCX_SETTINGS, "off", when, UCX_LOG_LEVEL="diag", UCX_LOG_FILE=log)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == {"LOG_LEVEL": "DIAG", "UCX_LOG_FILE": log}, when
