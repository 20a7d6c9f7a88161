"""`await connector.warm_up()` pays the first operation's set-up at start-up
(Rust's `Connector::warm_up`): the agent exists afterwards (on NIXL, the
runtime loaded and the NIXL agents made), and with a peer's metadata the peer
is loaded and connected, so that the first READ finds it; bytes still move."""

import pytest

import nixl_connect as nc
from conftest import pattern, require_backend, run


def test_warm_up_creates_the_agent_before_any_operation(backend):
    connector = nc.Connector(backend=backend)
    assert connector._native is None  # as in Dynamo, the agent is made on first use
    run(connector.warm_up())
    native = connector._native
    assert native is not None and native.name == connector.name
    assert native.registrations == 0 and native.remote_agents == 0
    # The agent is the one the operations use: no second one is made.
    run(connector.warm_up())
    assert connector._native is native


def test_warm_up_with_a_peer_loads_it_for_the_first_read(backend):
    passive, active = nc.Connector(backend=backend), nc.Connector(backend=backend)
    data = pattern(4096, seed=7)

    async def go():
        readable = await passive.create_readable(nc.Descriptor(data))
        metadata = readable.metadata()
        await active.warm_up(metadata)
        assert active._native.remote_agents == 1
        target = bytearray(4096)
        read = await active.begin_read(metadata, nc.Descriptor(target))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert active._native.remote_agents == 1  # the same peer, not loaded again
        return bytes(target)

    assert run(go()) == data


def test_warm_up_refuses_what_is_not_metadata():
    connector = nc.Connector(backend="loopback")
    with pytest.raises(TypeError, match="remote_metadata"):
        run(connector.warm_up("not metadata"))


def test_warm_up_without_a_runtime_is_the_import_error(monkeypatch):
    """On NIXL the runtime is loaded by warm_up: where it is missing, the
    ImportError comes from warm_up, not from the first operation."""
    from conftest import NIXL_MISSING

    if not NIXL_MISSING:
        pytest.skip("the NIXL runtime is installed here")
    with pytest.raises(ImportError):
        run(nc.Connector(backend="nixl").warm_up())
