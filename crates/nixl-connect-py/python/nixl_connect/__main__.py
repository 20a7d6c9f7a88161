"""``python -m nixl_connect``: what this environment has, for a user's first
look when something is wrong, and ``python -m nixl_connect install-runtime``.

The report: the package's version; the NIXL runtime found (its path, version
and plugin files) or every place looked in and what to run; whether a CUDA
driver is present; a 1 MiB loopback READ (bytes checked, GB/s) and, with a
runtime, the same READ through NIXL in this process. Exit status 1 when the
runtime is missing or a self-test failed.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import nixl_connect as nc
from nixl_connect import _native

#: The runtime ``install-runtime`` installs: the NIXL wheel Dynamo 1.6 uses,
#: without its dependencies (torch and about 15 CUDA wheels: a 5.6 GB venv
#: instead of 267 MB), which the runtime does not need.
RUNTIME_PACKAGES = {"12": ["nixl-cu12==1.5.1"], "13": ["nixl-cu13==1.5.1"]}
SELF_TEST_BYTES = 1 << 20
SELF_TEST_ROUNDS = 20


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _runtime_distribution(library: Path) -> str:
    """Which pip distribution the runtime came from, by its libs folder."""
    for folder, distribution in (
        (".nixl_cu12.mesonpy.libs", "nixl-cu12"),
        (".nixl_cu13.mesonpy.libs", "nixl-cu13"),
        (".nixl.mesonpy.libs", "nixl"),
    ):
        if library.parent.name == folder:
            version = _version(distribution)
            return f"{distribution} {version}" if version else distribution
    return "not a pip-installed wheel"


def _cuda() -> str:
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 not found)"
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return "CUDA driver present, but cuInit or cuDeviceGetCount failed"
    return f"CUDA driver present, {count.value} device(s)"


async def _read_once(passive: nc.Connector, active: nc.Connector, src: bytes) -> float:
    dst = bytearray(len(src))
    started = time.perf_counter()
    readable = await passive.create_readable(nc.Descriptor(src))
    read = await active.begin_read(readable.metadata(), nc.Descriptor(dst))
    await asyncio.wait_for(read.wait_for_completion(), 30)
    await asyncio.wait_for(readable.wait_for_completion(), 30)
    took = time.perf_counter() - started
    if dst != src:
        raise RuntimeError("the bytes read differ from the bytes exposed")
    return took


def _self_test(backend: str) -> str:
    """The best of a few 1 MiB READs (each: expose, read, both ends waited)."""

    async def main() -> float:
        tag = os.urandom(4).hex()
        passive = nc.Connector(f"selftest-{tag}-a", backend=backend)
        active = nc.Connector(f"selftest-{tag}-b", backend=backend)
        src = os.urandom(SELF_TEST_BYTES)
        return min([await _read_once(passive, active, src) for _ in range(SELF_TEST_ROUNDS)])

    best = asyncio.run(main())
    return f"1 MiB READ, bytes checked: {SELF_TEST_BYTES / best / 1e9:.2f} GB/s (best of {SELF_TEST_ROUNDS}, {best * 1e6:.0f} us)"


def report() -> int:
    ok = True
    print(f"nixl_connect {nc.__version__} (Python {sys.version.split()[0]}, {sys.executable})")
    try:
        library = Path(_native.nixl_runtime(nc._search_paths()))
        plugins = sorted(p.name[len("libplugin_"):-3] for p in (library.parent / "plugins").glob("libplugin_*.so"))
        print(f"NIXL runtime: {library} ({_runtime_distribution(library)})")
        print(f"  plugin files: {', '.join(plugins) or 'none next to it'}")
    except ImportError as e:
        # The message starts with the fix (install-runtime), then where it looked.
        library = None
        ok = False
        print("NIXL runtime: missing")
        print("\n".join(f"  {line}" for line in str(e).splitlines()))
    print(f"CUDA: {_cuda()}")
    for backend in ("loopback", "nixl") if library else ("loopback",):
        try:
            print(f"self-test ({backend}): {_self_test(backend)}")
        except Exception as e:  # a report, not a crash
            ok = False
            print(f"self-test ({backend}): FAILED: {type(e).__name__}: {e}")
    return 0 if ok else 1


def install_runtime(cuda: str, dry_run: bool) -> int:
    command = [sys.executable, "-m", "pip", "install", "--no-deps", *RUNTIME_PACKAGES[cuda]]
    print("$", " ".join(command))
    if dry_run:
        return 0
    return subprocess.call(command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nixl_connect",
        description="Reports the NIXL runtime, CUDA and a loopback self-test; install-runtime installs the runtime.",
    )
    commands = parser.add_subparsers(dest="command")
    install = commands.add_parser(
        "install-runtime",
        help="pip-install the NIXL runtime into this environment without torch (nixl-cu12 --no-deps)",
    )
    install.add_argument("--cuda", choices=sorted(RUNTIME_PACKAGES), default="12", help="CUDA major version (default 12)")
    install.add_argument("--dry-run", action="store_true", help="print the pip command only")
    args = parser.parse_args(argv)
    if args.command == "install-runtime":
        return install_runtime(args.cuda, args.dry_run)
    return report()


if __name__ == "__main__":
    sys.exit(main())
