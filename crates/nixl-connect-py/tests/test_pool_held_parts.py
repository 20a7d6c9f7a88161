"""A pool never counts free, nor hands out, a part whose bytes an operation
still holds (issue 48, item 3).

A part's Python `Descriptor` can be dropped while the core still holds its
bytes: a cancelled transfer still draining, or a NIXL exposure that a cancel
could not revoke (quarantined, decision 0014). `free`, `checkout`, `blocks`
and `descriptor` treat such a part as taken: it comes back by itself once
the core let go (a drain that ended, a quarantine's window that is over),
and stays out for good with a quarantine that keeps it forever. Before the fix, `free` counted it and `checkout` handed it out, and
every operation over it failed ("still held by an operation").
"""

import asyncio
import gc
import math
import random

import numpy as np
import pytest

import nixl_connect as nc

from conftest import require_backend, run

BLOCK = 1 << 16
# A part whose operation was dropped first (it may still drain into it: the
# part is not lent again, the test does not time the drain).
DROPPED = "dropped"


def offsets(pool, parts):
    return [p.ptr - pool.ptr for p in parts]


async def until_free(pool, n, timeout=30.0):
    """Waits (bounded) until `pool.free` is `n`: a held part comes back when
    the core lets go, which the test does not time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pool.free != n and loop.time() < deadline:
        await asyncio.sleep(0.01)
    return pool.free


async def read_fill(peer, me, part, fill, size):
    """READs `size` bytes of `fill` from a readable of `peer` into `part`
    (through `me`); returns the readable, to end later."""
    src = np.full(size, fill, np.uint8)
    readable = await peer.create_readable(nc.Descriptor((src, "cpu")))
    read = await me.begin_read(readable.metadata(), part)
    await read.wait_for_completion()
    assert read.status == nc.OperationStatus.COMPLETE
    await readable.wait_for_completion()
    return readable


def test_nixl_a_part_a_cancelled_readable_leaked_is_never_counted_free_nor_handed_out():
    """The reproducer's case: a readable over block 0 cancelled (NIXL cannot
    revoke it), its objects dropped, with a quarantine that keeps it forever.
    Block 0 stays out of `free`, `checkout`, `blocks` and `descriptor` for
    good; the other blocks move bytes as before."""
    require_backend("nixl")

    async def main():
        c = nc.Connector(backend="nixl", quarantine_seconds=math.inf)
        reader = nc.Connector(backend="nixl")
        assert not c._native_connector().revocation_enforced
        memory = np.zeros(4 * BLOCK, np.uint8)
        pool = nc.BlockPool((memory, "cpu"), BLOCK)
        part = pool.checkout(1)[0]
        assert offsets(pool, [part]) == [0]
        op = await c.create_readable(part)
        op.cancel()
        del op, part
        gc.collect()
        assert pool.free == 3, "the leaked block is not free"
        with pytest.raises(ValueError, match="block 0 is still held by an operation"):
            pool.blocks([0])
        with pytest.raises(ValueError, match="still held by an operation"):
            pool.descriptor(0, BLOCK)
        assert pool.checkout(4) is None
        parts = pool.checkout(3)
        assert offsets(pool, parts) == [BLOCK, 2 * BLOCK, 3 * BLOCK]
        for i in range(1, 4):
            memory[i * BLOCK : (i + 1) * BLOCK] = 0x40 + i
        readable = await c.create_readable(parts)
        outs = [np.zeros(BLOCK, np.uint8) for _ in parts]
        read = await reader.begin_read(readable.metadata(), [nc.Descriptor((o, "cpu")) for o in outs])
        await read.wait_for_completion()
        await readable.wait_for_completion()
        for i, out in enumerate(outs, start=1):
            assert int(np.count_nonzero(out != 0x40 + i)) == 0, f"block {i}"
        del parts, readable, read
        gc.collect()
        # Completed operations let go: their blocks are back; block 0 never.
        assert pool.free == 3
        assert offsets(pool, pool.checkout(3)) == [BLOCK, 2 * BLOCK, 3 * BLOCK]

        # The same over memory described at any offset.
        carved = nc.RegisteredMemory(bytearray(4096), c)
        head = carved.descriptor(0, 1024)
        op = await c.create_readable(head)
        op.cancel()
        del op, head
        gc.collect()
        assert carved.free == 3072
        with pytest.raises(ValueError, match="overlap bytes 0..1024, still held by an operation"):
            carved.descriptor(512, 1024)
        neighbour = await c.create_readable(carved.descriptor(1024, 1024))
        neighbour.cancel()

    run(main())


def test_a_part_a_draining_read_holds_comes_back_after_the_drain():
    """Loopback: a READ into block 0 that cannot be aborted (it drains: moves
    its bytes after the cancel, then lets go), its objects dropped while it
    drains. Block 0 is out while it drains, counted free again after, and
    moves bytes like any other then."""

    async def main():
        peer = nc.Connector("held-drain-peer", backend="loopback")
        me = nc.Connector("held-drain-me", backend="loopback")
        memory = np.zeros(4 * BLOCK, np.uint8)
        pool = nc.BlockPool((memory, "cpu"), BLOCK, me)
        src = np.full(BLOCK, 0xAB, np.uint8)
        drained = await peer.create_readable(nc.Descriptor((src, "cpu")))
        part = pool.checkout(1)[0]
        me._native_connector()._drain_next_transfer(3.0)
        read = await me.begin_read(drained.metadata(), part)
        read.cancel()
        await read.wait_for_completion()
        assert read.status == nc.OperationStatus.CANCELLED
        assert not await read.wait_for_release(timeout=0), "still draining"
        del read, part
        gc.collect()
        assert pool.free == 3, "the draining block is not free"
        with pytest.raises(ValueError, match="block 0 is still held by an operation"):
            pool.blocks([0])
        other = pool.checkout(1)
        assert offsets(pool, other) == [BLOCK]
        del other
        gc.collect()
        # Back by itself once the drain let go, with the drain's bytes in it.
        assert await until_free(pool, 4) == 4
        assert int(np.count_nonzero(memory[:BLOCK] != 0xAB)) == 0
        parts = pool.checkout(4)
        assert offsets(pool, parts) == [0, BLOCK, 2 * BLOCK, 3 * BLOCK]
        readables = [await read_fill(peer, me, p, 0x10 + i, BLOCK) for i, p in enumerate(parts)]
        for i in range(4):
            block = memory[i * BLOCK : (i + 1) * BLOCK]
            assert int(np.count_nonzero(block != 0x10 + i)) == 0, f"block {i}"
        del parts, readables
        drained.cancel()

    run(main())


def test_random_checkouts_cancels_and_drops_count_free_only_usable_parts():
    """The generator (loopback): random checkouts and picks, READs into parts
    that complete, are cancelled, or drain after a cancel, and drops of parts
    and operations in any order. After every step, `checkout(free)` returns
    `free` parts and each one moves a READ whose bytes are checked; at the
    end, with everything dropped and drained, the whole pool is free."""
    rng = random.Random(48)
    count, size = 8, 4096

    async def main():
        peer = nc.Connector("held-gen-peer", backend="loopback")
        me = nc.Connector("held-gen-me", backend="loopback")
        memory = np.zeros(count * size, np.uint8)
        pool = nc.BlockPool((memory, "cpu"), size, me)
        parts = []  # [descriptor, operation, None, or DROPPED]
        readables = []
        fills = iter(range(1 << 30))

        def next_fill():
            return 1 + next(fills) % 255

        async def check(step):
            free = pool.free
            got = pool.checkout(free)
            assert got is not None and len(got) == free, f"step {step}: free {free}, got {got}"
            for d in got:
                fill = next_fill()
                readables.append(await read_fill(peer, me, d, fill, size))
                at = d.ptr - pool.ptr
                wrong = int(np.count_nonzero(memory[at : at + size] != fill))
                assert wrong == 0, f"step {step}: block {at // size}: {wrong} wrong bytes"
            del got
            gc.collect()

        async def one_step(step):
            # A function of its own: its locals (a picked part, the idle
            # list) are gone when it returns, and hold no part.
            kind = rng.random()
            if kind < 0.25:
                parts.extend([d, None] for d in pool.checkout(rng.randint(1, 3)) or [])
            elif kind < 0.35:
                index = rng.randrange(count)
                try:
                    picked = pool.blocks([index])
                except ValueError:
                    pass
                else:
                    fill = next_fill()
                    readables.append(await read_fill(peer, me, picked[0], fill, size))
                    wrong = int(np.count_nonzero(memory[index * size : (index + 1) * size] != fill))
                    assert wrong == 0, f"step {step}: picked block {index}"
                    parts.append([picked[0], None])
            elif kind < 0.7:
                idle = [p for p in parts if p[1] is None]
                if idle:
                    entry = rng.choice(idle)
                    src = np.full(size, next_fill(), np.uint8)
                    readable = await peer.create_readable(nc.Descriptor((src, "cpu")))
                    readables.append(readable)
                    hook = rng.random()
                    if hook < 0.5:
                        me._native_connector()._drain_next_transfer(rng.choice([0.0, 0.02, 0.1, 0.5]))
                    elif hook < 0.7:
                        me._native_connector()._delay_next_transfer(rng.choice([0.0, 0.02]))
                    entry[1] = await me.begin_read(readable.metadata(), entry[0])
                    if rng.random() < 0.7:
                        await asyncio.sleep(rng.choice([0, 0, 0.005]))
                        entry[1].cancel()
            elif parts:
                entry = parts.pop(rng.randrange(len(parts)))
                if entry[1] is not None and rng.random() < 0.3:
                    # The operation dropped first, the part kept a while.
                    entry[1] = DROPPED
                    parts.append(entry)
                del entry

        held_seen = 0
        for step in range(60):
            await one_step(step)
            gc.collect()
            # Blocks neither free nor owned by a live part: held by the core.
            held = count - len(parts) - pool.free
            assert held >= 0, f"step {step}: a live part's block counted free"
            held_seen += held > 0
            await check(step)
        assert held_seen > 0, "the sequence never left a held part"

        parts.clear()
        gc.collect()
        assert await until_free(pool, count) == count
        await check("end")
        for readable in readables:
            readable.cancel()

    run(main(), timeout=120)


def test_nixl_a_part_a_cancelled_readable_held_comes_back_when_its_quarantine_ends():
    """The same cancelled readable over block 0 with a window of 0.2 s: out
    of `free` and `checkout` while quarantined (counted by `quarantined()`),
    back in the pool after the window, and then it moves bytes like any
    other block."""
    require_backend("nixl")

    async def main():
        c = nc.Connector(backend="nixl", quarantine_seconds=0.2)
        reader = nc.Connector(backend="nixl")
        memory = np.zeros(4 * BLOCK, np.uint8)
        pool = nc.BlockPool((memory, "cpu"), BLOCK)
        part = pool.checkout(1)[0]
        op = await c.create_readable(part)
        op.cancel()
        del op, part
        gc.collect()
        assert pool.free == 3, "a quarantined block is not free"
        assert c.quarantined() == nc.Quarantined(1, BLOCK, BLOCK)
        # The window ends; the next look (here `quarantined()`) frees it.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while c.quarantined().exposures and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert c.quarantined() == nc.Quarantined(0, 0, 0)
        assert await until_free(pool, 4) == 4
        part = pool.blocks([0])[0]
        memory[:BLOCK] = 0x5A
        readable = await c.create_readable(part)
        out = np.zeros(BLOCK, np.uint8)
        read = await reader.begin_read(readable.metadata(), nc.Descriptor((out, "cpu")))
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert int(np.count_nonzero(out != 0x5A)) == 0

    run(main())


def test_nixl_a_writable_stays_quarantined_past_the_readables_budget():
    """A cancelled writable is kept for its whole window even with a
    readables budget of 0, where a cancelled readable is freed at once (a
    peer's late WRITE would change freed memory; a late READ would not)."""
    require_backend("nixl")

    async def main():
        c = nc.Connector(backend="nixl", quarantine_seconds=3600, quarantine_readable_bytes=0)
        w = np.zeros(BLOCK, np.uint8)
        writable = await c.create_writable(nc.Descriptor((w, "cpu")))
        writable.cancel()
        r = np.zeros(2 * BLOCK, np.uint8)
        readable = await c.create_readable(nc.Descriptor((r, "cpu")))
        readable.cancel()
        del writable, readable
        gc.collect()
        assert c.quarantined() == nc.Quarantined(1, BLOCK, 0)
        assert c.free_quarantined() == nc.Quarantined(1, BLOCK, 0)
        assert c.quarantined() == nc.Quarantined(0, 0, 0)

    run(main())


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"quarantine_seconds": -1}, ValueError),
        ({"quarantine_seconds": float("nan")}, ValueError),
        ({"quarantine_seconds": "5"}, TypeError),
        ({"quarantine_seconds": True}, TypeError),
        ({"quarantine_readable_bytes": -1}, ValueError),
        ({"quarantine_readable_bytes": 1.5}, TypeError),
    ],
)
def test_bad_quarantine_arguments_are_refused_with_their_name(kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        nc.Connector(backend="loopback", **kwargs)


def test_a_bad_quarantine_variable_is_refused_with_its_name(monkeypatch):
    monkeypatch.setenv("NIXL_CONNECT_QUARANTINE_SECONDS", "soon")
    c = nc.Connector(backend="loopback")
    with pytest.raises(ValueError, match="NIXL_CONNECT_QUARANTINE_SECONDS"):
        c._native_connector()
    monkeypatch.setenv("NIXL_CONNECT_QUARANTINE_SECONDS", "forever")
    monkeypatch.setenv("NIXL_CONNECT_QUARANTINE_READABLE_BYTES", "64MiB")
    with pytest.raises(ValueError, match="NIXL_CONNECT_QUARANTINE_READABLE_BYTES"):
        nc.Connector(backend="loopback")._native_connector()
