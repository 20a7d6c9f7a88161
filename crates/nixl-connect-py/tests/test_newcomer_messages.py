"""What a newcomer reads when something is off: a missing NIXL runtime, a
device string it does not take, loopback metadata from another process."""

import os
import subprocess
import sys
import textwrap

import pytest

import nixl_connect as nc
from conftest import pattern, run


def run_child(script: str, *args: str, env=None):
    if env is not None and "PYTHONPATH" in os.environ:
        env = {**env, "PYTHONPATH": os.environ["PYTHONPATH"]}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_missing_runtime_says_the_fix_first_and_each_place_once(tmp_path):
    # No runtime anywhere the child looks: its own site-packages are replaced
    # by two empty folders (one given twice, one also $NIXL_RUNTIME_DIR), and
    # no python3 on PATH to name others.
    site, runtime_dir = tmp_path / "site-a", tmp_path / "runtime-dir"
    site.mkdir()
    runtime_dir.mkdir()
    child = run_child(
        """
        import sys
        import nixl_connect as nc
        nc._search_paths = lambda: sys.argv[1:]
        try:
            nc.Connector(backend="nixl")._native_connector()
        except ImportError as e:
            print(e)
        """,
        str(site), str(site), str(runtime_dir),
        env={"NIXL_RUNTIME_DIR": str(runtime_dir), "PATH": str(tmp_path)},
    )
    message = child.stdout.strip()
    assert child.returncode == 0, child.stderr
    assert message.startswith(
        "NIXL runtime (libnixl_capi.so) not found. To fix: python -m nixl_connect install-runtime "
        "(pip install --no-deps nixl-cu12==1.5.1), or set NIXL_RUNTIME_DIR to the folder "
        "holding libnixl_capi.so.\nSearched (site-packages for NIXL wheels, folders for "
        f"the library): {runtime_dir}, {site}, /opt/nvidia/nvda_nixl/lib/x86_64-linux-gnu, "
    ), message
    assert len(message) < 800, (len(message), message)
    # Each place once: no wheel folder named, no place repeated.
    assert message.count(str(site)) == 1 and message.count(str(runtime_dir)) == 1, message
    assert ".mesonpy.libs/" not in message
    assert message.count("the dynamic linker's search") == 1
    assert "\nAlso: python3's site-packages: cannot run python3" in message


def test_the_report_prints_the_fix_first_when_the_runtime_is_missing(tmp_path):
    child = run_child(
        """
        import sys
        import nixl_connect as nc
        import nixl_connect.__main__ as main
        nc._search_paths = lambda: []
        sys.exit(main.main([]))
        """,
        env={"NIXL_RUNTIME_DIR": str(tmp_path), "PATH": str(tmp_path)},
    )
    lines = child.stdout.splitlines()
    assert child.returncode == 1, child.stdout + child.stderr
    at = lines.index("NIXL runtime: missing")
    assert "To fix: python -m nixl_connect install-runtime" in lines[at + 1], lines
    assert lines[at + 2].startswith("  Searched ("), lines


@pytest.mark.parametrize(
    "text, why",
    [
        ("cuda0", 'invalid device "cuda0". '),
        ("tpu:1", 'invalid device "tpu:1". '),
        ("cuda:x", 'invalid device "cuda:x": the ordinal must be a non-negative decimal number. '),
        ("cpu:2", 'invalid device "cpu:2": the host has no ordinal other than 0. '),
    ],
)
def test_a_bad_device_string_is_named_with_the_forms_device_takes(text, why):
    forms = (
        'Device() takes "cpu", "cuda", "cuda:N" (also "host", "gpu[:N]", "xpu[:N]", '
        '"rocm[:N]", "hip[:N]"), a torch.device, or a (DeviceKind, int) tuple.'
    )
    with pytest.raises(ValueError) as raised:
        nc.Device(text)
    assert str(raised.value) == why + forms
    # The same parser refuses it in a serialized descriptor and a raw one.
    with pytest.raises(ValueError, match="Device\\(\\) takes"):
        nc.SerializedDescriptor(device=text, ptr=4096, size=1)
    buf = bytearray(8)
    with pytest.raises(ValueError, match="Device\\(\\) takes"):
        nc.Descriptor((1 << 20, 8, text, buf))


def test_a_device_of_another_type_is_named_with_the_forms_device_takes():
    with pytest.raises(TypeError) as raised:
        nc.Device(3)
    assert str(raised.value).startswith('Device() takes "cpu", "cuda", "cuda:N"')
    assert str(raised.value).endswith("; got 3.")


@pytest.mark.parametrize(
    "text, kind, ordinal",
    [("cpu", nc.DeviceKind.HOST, 0), ("HOST", nc.DeviceKind.HOST, 0),
     ("cuda", nc.DeviceKind.CUDA, 0), (" Cuda:3 ", nc.DeviceKind.CUDA, 3),
     ("gpu:2", nc.DeviceKind.CUDA, 2), ("xpu:1", nc.DeviceKind.XPU, 1),
     ("rocm:1", nc.DeviceKind.ROCM, 1), ("hip", nc.DeviceKind.ROCM, 0)],
)
def test_device_strings_parse_in_one_place(text, kind, ordinal):
    device = nc.Device(text)
    assert (device.kind, device.id) == (kind, ordinal)
    assert nc._native.parse_device(text) == (int(kind), ordinal)


def test_a_torch_device_is_a_device(monkeypatch):
    class device:  # what `torch.device` prints
        def __init__(self, text):
            self.text = text

        def __str__(self):
            return self.text

    class FakeTorch:
        pass

    FakeTorch.device = device
    monkeypatch.setitem(sys.modules, "torch", FakeTorch)
    assert nc.Device(device("cuda:1")) == nc.Device("cuda:1")
    assert nc.Device(device("cpu")) == nc.Device("cpu")


def test_loopback_metadata_from_another_process_says_loopback_is_this_process_only():
    child = run_child(
        """
        import asyncio
        import nixl_connect as nc

        async def main():
            c = nc.Connector("other-process", backend="loopback")
            readable = await c.create_readable(nc.Descriptor(b"x" * 64))
            print(readable.metadata().model_dump_json())

        asyncio.run(main())
        """
    )
    assert child.returncode == 0, child.stderr
    metadata = nc.RdmaMetadata.model_validate_json(child.stdout)
    active = nc.Connector(backend="loopback")

    async def go():
        await active.begin_read(metadata, nc.Descriptor(bytearray(64)))

    with pytest.raises(RuntimeError) as raised:
        run(go())
    message = str(raised.value)
    assert 'access to peer "other-process" refused' in message, message
    assert "another process" in message and "loopback reaches connectors in this process only" in message
    assert "use NIXL across processes" in message
