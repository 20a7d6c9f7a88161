"""A peer whose registrations overlap (X = [0, 8 KiB), Y = [4 KiB, 12 KiB)
of one buffer) exposes three 4 KiB ranges end to end, each inside X or Y
(pairs of neighbours too), all three inside neither. Read into three
contiguous blocks of a pool, the transfer is merged into runs that each lie
in one registration (NIXL refuses a descriptor that lies in none), and every
byte arrives; read into separate buffers, likewise.
(py_nixl_merged_run_across_overlapping_registrations.py.)
"""

import nixl_connect as nc
from conftest import run

B = 4096


def test_a_pooled_read_over_overlapping_peer_registrations_moves_every_byte(backend):
    async def main():
        peer = nc.Connector(backend=backend)
        reader = nc.Connector(backend=backend)
        backing = bytearray(bytes(range(256)) * (3 * B // 256))
        mv = memoryview(backing)
        x = nc.RegisteredMemory(mv[0 : 2 * B], peer)
        y = nc.RegisteredMemory(mv[B : 3 * B], peer)
        parts = [x.descriptor(0, B), x.descriptor(B, B), y.descriptor(B, B)]
        assert [p.ptr - x.ptr for p in parts] == [0, B, 2 * B]

        # Into separate buffers: nothing to merge locally.
        readable = await peer.create_readable(parts)
        outs = [bytearray(B) for _ in range(3)]
        read = await reader.begin_read(readable.metadata(), [nc.Descriptor(o) for o in outs])
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert b"".join(outs) == bytes(backing)
        del read, readable

        # Into a pool's contiguous blocks: merged, run by run.
        readable = await peer.create_readable(parts)
        pool = nc.BlockPool(bytearray(3 * B), B, reader)
        targets = pool.checkout(3)
        assert [t.ptr - pool.ptr for t in targets] == [0, B, 2 * B]
        read = await reader.begin_read(readable.metadata(), targets)
        await read.wait_for_completion()
        await readable.wait_for_completion()
        assert b"".join(bytes(t._data_ref) for t in targets) == bytes(backing)

    run(main())
