"""Files as the far side of a transfer (the storage tier): `FileSegment`,
`Connector.begin_file_write` and `Connector.begin_file_read`.

Every transfer is checked byte for byte: what a WRITE put in the file at
each segment's offset (read with plain file I/O), and what a READ brought
back into zeroed memory. Each test runs on loopback and on the real NIXL
backend (its POSIX plugin; skipped without the runtime, as conftest says).
"""

import gc
import io
import os
import stat
import uuid

import numpy as np
import pytest

import nixl_connect as nc

from conftest import pattern, run

BLOCK = 4096

_connectors = {}


@pytest.fixture
def connector(backend):
    """One connector per backend for the module (a NIXL agent costs ~0.1 s)."""
    if backend not in _connectors:
        _connectors[backend] = nc.Connector(f"files-{uuid.uuid4().hex[:8]}", backend=backend)
    return _connectors[backend]


@pytest.fixture
def path(tmp_path):
    """A fresh, empty file's path."""
    p = tmp_path / "blocks.bin"
    p.write_bytes(b"")
    return p


def blocks_of(array, size):
    """Descriptors over consecutive `size`-byte blocks of one NumPy array."""
    return [nc.Descriptor((array[i:i + size], "cpu")) for i in range(0, array.nbytes, size)]


def on_disk(path, offset, size):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


# Moving bytes.


@pytest.mark.parametrize("scattered", [False, True], ids=["contiguous", "scattered"])
def test_blocks_of_an_array_land_at_their_offsets_and_read_back_byte_for_byte(
    connector, path, scattered
):
    """Four blocks of a NumPy array WRITten in one call land at their
    segments' offsets (end to end, or one block apart in reverse order), and
    READ back in another order into zeroed memory they are the same bytes."""
    source = np.frombuffer(bytearray(pattern(4 * BLOCK, seed=7)), dtype=np.uint8)
    base = nc.FileSegment(path)
    assert (base.offset, base.size, base.writable) == (0, 0, True)
    offsets = [i * BLOCK * (2 if scattered else 1) for i in range(4)]
    if scattered:
        offsets.reverse()
    segments = [base.at(o, BLOCK) for o in offsets]

    async def go():
        write = await connector.begin_file_write(blocks_of(source, BLOCK), segments)
        await write.wait_for_completion()
        assert write.status == nc.OperationStatus.COMPLETE
        for i, o in enumerate(offsets):
            assert on_disk(path, o, BLOCK) == source[i * BLOCK:(i + 1) * BLOCK].tobytes(), i
        # Back in the other order, into zeroed memory.
        back = np.zeros(4 * BLOCK, dtype=np.uint8)
        read = await connector.begin_file_read(segments[::-1], blocks_of(back, BLOCK))
        await read.wait_for_completion()
        assert read.status == nc.OperationStatus.COMPLETE
        return back

    back = run(go())
    expected = b"".join(source[i * BLOCK:(i + 1) * BLOCK].tobytes() for i in reversed(range(4)))
    assert back.tobytes() == expected
    if scattered:
        # The gaps between the blocks were never written.
        assert os.path.getsize(path) == 7 * BLOCK
        for gap in (1, 3, 5):
            assert on_disk(path, gap * BLOCK, BLOCK) == bytes(BLOCK)


@pytest.mark.parametrize("sizes", [[1], [100, 4096, 1], [65536, 3, 1 << 20]],
                         ids=["one-byte", "odd-sizes", "large"])
def test_bytearrays_of_any_size_round_trip(connector, path, sizes):
    """Blocks of uneven sizes from bytearrays, laid end to end, each in its
    own bytes; read back into fresh bytearrays."""
    data = [bytearray(pattern(n, seed=n)) for n in sizes]
    base = nc.FileSegment(path)
    offsets = np.cumsum([0] + sizes[:-1]).tolist()
    segments = [base.at(o, n) for o, n in zip(offsets, sizes)]

    async def go():
        write = await connector.begin_file_write([nc.Descriptor(d) for d in data], segments)
        await write.wait_for_completion()
        back = [bytearray(n) for n in sizes]
        read = await connector.begin_file_read(segments, [nc.Descriptor(b) for b in back])
        await read.wait_for_completion()
        return back

    back = run(go())
    assert path.read_bytes() == b"".join(data)
    assert back == data


def test_one_descriptor_and_one_segment_need_no_lists(connector, path):
    block = bytearray(pattern(BLOCK, seed=3))

    async def go():
        segment = nc.FileSegment(path).at(BLOCK, BLOCK)
        write = await connector.begin_file_write(nc.Descriptor(block), segment)
        assert write.wait() == nc.OperationStatus.COMPLETE  # the blocking wait
        back = bytearray(BLOCK)
        read = await connector.begin_file_read(segment, nc.Descriptor(back))
        await read.wait_for_completion()
        assert [bytes(d._data_ref) for d in read.results()] == [bytes(block)]
        return back

    assert run(go()) == block
    assert path.read_bytes() == bytes(BLOCK) + block


def test_blocks_of_a_pool_are_offloaded_and_read_back_into_other_blocks(connector, path):
    """The storage tier's shape: blocks of a `BlockPool` WRITten out, then
    READ back into other blocks of it."""
    data = np.zeros(8 * BLOCK, dtype=np.uint8)
    data[: 4 * BLOCK] = np.frombuffer(pattern(4 * BLOCK, seed=11), dtype=np.uint8)
    pool = nc.BlockPool((data, "cpu"), BLOCK)
    base = nc.FileSegment(path)
    segments = [base.at(i * BLOCK, BLOCK) for i in range(4)]

    async def go():
        write = await connector.begin_file_write(pool.blocks([0, 1, 2, 3]), segments)
        await write.wait_for_completion()
        read = await connector.begin_file_read(segments, pool.blocks([4, 5, 6, 7]))
        await read.wait_for_completion()

    run(go())
    assert path.read_bytes() == data[: 4 * BLOCK].tobytes()
    assert data[4 * BLOCK:].tobytes() == data[: 4 * BLOCK].tobytes()


def test_a_file_is_registered_once_however_many_transfers_use_it(connector, path):
    base = nc.FileSegment(path)
    memory = bytearray(BLOCK)
    desc = nc.Descriptor(memory)
    native = connector._native_connector()

    async def rounds(n, start):
        for r in range(start, start + n):
            memory[:] = bytes([r]) * BLOCK
            op = await connector.begin_file_write(desc, base.at(r * BLOCK, BLOCK))
            await op.wait_for_completion()

    run(rounds(1, 0))
    after_first = native.registrations
    run(rounds(7, 1))
    assert native.registrations == after_first
    assert path.read_bytes() == b"".join(bytes([r]) * BLOCK for r in range(8))


# Constructors.


def test_a_duplicated_fd_outlives_the_callers(connector, path):
    """An fd is duplicated: closing the caller's at once changes nothing,
    and a file that reuses the number is never touched."""
    fd = os.open(path, os.O_RDWR)
    segment = nc.FileSegment(fd, 0, BLOCK)
    assert (segment.offset, segment.size, segment.writable) == (0, BLOCK, True)
    os.close(fd)
    other = path.with_name("bystander.bin")
    other.write_bytes(b"")
    bystander = os.open(other, os.O_RDWR)  # likely the number just closed
    block = bytearray(pattern(BLOCK, seed=5))

    async def go():
        write = await connector.begin_file_write(nc.Descriptor(block), segment)
        await write.wait_for_completion()
        back = bytearray(BLOCK)
        read = await connector.begin_file_read(segment, nc.Descriptor(back))
        await read.wait_for_completion()
        return back

    try:
        assert run(go()) == block
    finally:
        os.close(bystander)
    assert path.read_bytes() == block
    assert other.read_bytes() == b""


@pytest.mark.parametrize("mode", ["r+b", "w+b"])
def test_a_file_object_is_duplicated_and_may_be_closed(connector, path, mode):
    block = bytearray(pattern(2 * BLOCK, seed=9))
    with open(path, mode) as f:
        base = nc.FileSegment(f)
        assert base.size == 0 and base.writable
        assert repr(base) == f"FileSegment({str(path)!r}, offset=0, size=0, writable=True)"
    segments = [base.at(BLOCK, BLOCK), base.at(0, BLOCK)]

    async def go():
        write = await connector.begin_file_write(
            [nc.Descriptor(block[:BLOCK]), nc.Descriptor(block[BLOCK:])], segments
        )
        await write.wait_for_completion()

    run(go())
    assert path.read_bytes() == block[BLOCK:] + block[:BLOCK]


def test_the_segments_may_be_dropped_while_their_transfer_runs(connector, path):
    """The operation owns the segments it moves: the file stays open."""
    block = bytearray(pattern(BLOCK, seed=13))

    async def go():
        op = await connector.begin_file_write(nc.Descriptor(block), nc.FileSegment(path, 0, BLOCK))
        gc.collect()
        await op.wait_for_completion()
        assert op.status == nc.OperationStatus.COMPLETE

    run(go())
    assert path.read_bytes() == block


def test_size_none_is_the_rest_of_the_file_and_at_shares_the_file(path):
    path.write_bytes(bytes(10 * BLOCK))
    rest = nc.FileSegment(path, 3 * BLOCK)
    assert (rest.offset, rest.size, rest.file_size()) == (3 * BLOCK, 7 * BLOCK, 10 * BLOCK)
    assert nc.FileSegment(os.fspath(path), size=5).size == 5
    assert nc.FileSegment(os.fsencode(path), 10 * BLOCK).size == 0
    part = rest.at(0, 1)
    assert (part.offset, part.size) == (0, 1)
    assert part.same_file(rest) and rest.same_file(part)
    assert not nc.FileSegment(path).same_file(rest)  # another open of the file
    assert "offset=0, size=1" in repr(part)
    with pytest.raises(TypeError):
        rest.same_file(path)


def test_a_read_only_file_is_read_but_never_written(connector, path):
    path.write_bytes(pattern(BLOCK, seed=17))
    with open(path, "rb") as f:
        segment = nc.FileSegment(f)
    assert not segment.writable and segment.size == BLOCK

    async def go():
        with pytest.raises(ValueError, match="opened read-only"):
            await connector.begin_file_write(nc.Descriptor(bytearray(BLOCK)), segment)
        back = bytearray(BLOCK)
        read = await connector.begin_file_read(segment, nc.Descriptor(back))
        await read.wait_for_completion()
        return back

    assert run(go()) == pattern(BLOCK, seed=17)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only file")
def test_a_path_this_process_may_not_write_is_opened_read_only(path):
    path.write_bytes(b"x" * 64)
    path.chmod(stat.S_IRUSR)
    segment = nc.FileSegment(path)
    assert (segment.writable, segment.size) == (False, 64)


# Refusals: each one a ValueError or TypeError naming the problem, and the
# memory still usable after it.


def test_pairing_mistakes_are_value_errors(connector, path):
    path.write_bytes(pattern(2 * BLOCK, seed=19))
    base = nc.FileSegment(path)
    two = [base.at(0, BLOCK), base.at(BLOCK, BLOCK)]
    memory = bytearray(BLOCK)

    async def go():
        with pytest.raises(ValueError, match=r"`segments` must be as many: 1 != 2"):
            await connector.begin_file_write(nc.Descriptor(memory), two)
        with pytest.raises(ValueError, match=r"file segment 1 must be the same size\. 100 != 4096"):
            await connector.begin_file_read(
                two, [nc.Descriptor(bytearray(BLOCK)), nc.Descriptor(bytearray(100))]
            )
        with pytest.raises(ValueError, match="must not be an empty list"):
            await connector.begin_file_write(nc.Descriptor(memory), [])
        with pytest.raises(ValueError, match="must not be an empty list"):
            await connector.begin_file_read(two[:1], [])
        # READ past the end: refused, not shortened.
        with pytest.raises(ValueError, match=r"ends at byte 12288, past the end of its file \(8192 bytes\)"):
            await connector.begin_file_read(base.at(2 * BLOCK, BLOCK), nc.Descriptor(memory))
        with pytest.raises(ValueError, match="past the end"):
            await connector.begin_file_read(base.at(2 * BLOCK, 1), nc.Descriptor(bytearray(1)))
        # Read-only memory cannot be READ into.
        with pytest.raises(ValueError, match="read-only"):
            await connector.begin_file_read(two[0], nc.Descriptor(bytes(BLOCK)))
        # Wrong types.
        with pytest.raises(TypeError, match="`segments`"):
            await connector.begin_file_write(nc.Descriptor(memory), str(path))
        with pytest.raises(TypeError, match="`segments`"):
            await connector.begin_file_read([two[0], "x"], nc.Descriptor(memory))
        with pytest.raises(TypeError, match="local_descriptors"):
            await connector.begin_file_write(memory, two[0])
        # After every refusal the memory and the file still work.
        read = await connector.begin_file_read(two[1], nc.Descriptor(memory))
        await read.wait_for_completion()

    run(go())
    assert memory == pattern(2 * BLOCK, seed=19)[BLOCK:]


def test_an_o_direct_file_refuses_unaligned_blocks_and_moves_aligned_ones(connector, path):
    """O_DIRECT: the file system's alignment is known before any transfer;
    an unaligned offset or size is a ValueError, not the kernel's EINVAL."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    except OSError:
        pytest.skip("no O_DIRECT here")
    try:
        base = nc.FileSegment(fd)
    finally:
        os.close(fd)
    assert nc.FileSegment(path).direct_io_alignment is None
    memory_align, offset_align = base.direct_io_alignment
    block = max(memory_align, offset_align, BLOCK)
    # NumPy's page-aligned memory: a larger array, viewed from a page boundary.
    raw = np.zeros(3 * block, dtype=np.uint8)
    skip = (-raw.ctypes.data) % block
    source = raw[skip:skip + block]
    source[:] = np.frombuffer(pattern(block, seed=31), dtype=np.uint8)

    async def go():
        if offset_align > 1:
            with pytest.raises(ValueError, match="O_DIRECT, which needs its offset"):
                await connector.begin_file_write(nc.Descriptor((source, "cpu")), base.at(1, block))
            with pytest.raises(ValueError, match="O_DIRECT, which needs its length"):
                await connector.begin_file_write(
                    nc.Descriptor((source[:block - 1], "cpu")), base.at(0, block - 1)
                )
        write = await connector.begin_file_write(nc.Descriptor((source, "cpu")), base.at(0, block))
        await write.wait_for_completion()
        back = raw[skip + block:skip + 2 * block]
        read = await connector.begin_file_read(base.at(0, block), nc.Descriptor((back, "cpu")))
        await read.wait_for_completion()
        return bytes(back)

    assert run(go()) == pattern(block, seed=31)
    assert on_disk(path, 0, block) == pattern(block, seed=31)


def test_a_write_from_bytes_is_allowed(connector, path):
    """`bytes` is read-only memory: a WRITE only reads it."""
    data = pattern(BLOCK, seed=23)

    async def go():
        op = await connector.begin_file_write(nc.Descriptor(data), nc.FileSegment(path, 0, BLOCK))
        await op.wait_for_completion()

    run(go())
    assert path.read_bytes() == data


def _bad_files(tmp_path):
    """`FileSegment` arguments that are refused: (args, exception, message)."""
    f = tmp_path / "f.bin"
    f.write_bytes(bytes(100))
    read_end, write_end = os.pipe()
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    closed = os.open(f, os.O_RDONLY)  # opened last: nothing reuses its number
    os.close(closed)
    cases = [
        ((f, -1), ValueError, "`offset` must not be negative"),
        ((f, 0, -1), ValueError, "`size` must not be negative"),
        ((f, 1 << 64), ValueError, "`offset` is too large"),
        ((f, 0, 1 << 64), ValueError, "`size` is too large"),
        ((f, 1 << 63, 1), ValueError, "largest file offset"),
        ((f, (1 << 63) - 1, 2), ValueError, "largest file offset"),
        ((f, 101), ValueError, "past the end of the file"),
        ((f, 0.5), TypeError, "`offset` must be an `int`"),
        ((f, True), TypeError, "`offset` must be an `int`"),
        ((f, 0, "1"), TypeError, "`size` must be an `int`"),
        ((tmp_path / "missing",), ValueError, "cannot open"),
        ((tmp_path,), ValueError, "cannot open"),
        ((closed,), ValueError, "cannot duplicate file descriptor"),
        ((-1,), ValueError, "not a valid descriptor number"),
        ((1 << 40,), ValueError, "not a valid descriptor number"),
        ((1 << 70,), ValueError, "not a valid descriptor number"),
        ((-(1 << 70),), ValueError, "not a valid descriptor number"),
        ((read_end,), ValueError, "not a regular file"),
        ((dir_fd,), ValueError, "not a regular file"),
        ((io.BytesIO(b"x"),), io.UnsupportedOperation, "fileno"),
        ((True,), TypeError, "Argument `file`"),
        ((3.0,), TypeError, "Argument `file`"),
        ((None,), TypeError, "Argument `file`"),
        ((str(f) + "\0",), ValueError, "cannot open"),
    ]
    return cases, [read_end, write_end, dir_fd]


def test_bad_files_and_ranges_are_refused_without_a_crash(tmp_path):
    cases, fds = _bad_files(tmp_path)
    try:
        for args, error, message in cases:
            with pytest.raises(error, match=message):
                nc.FileSegment(*args)
    finally:
        for fd in fds:
            os.close(fd)
    segment = nc.FileSegment(tmp_path / "f.bin")
    for args, error in [((-1, 1), ValueError), ((0, -1), ValueError), ((1 << 63, 1), ValueError),
                        ((0, None), TypeError), (("0", 1), TypeError)]:
        with pytest.raises(error):
            segment.at(*args)


def test_a_closed_file_object_is_refused(path):
    f = open(path, "rb")
    f.close()
    with pytest.raises(ValueError, match="closed file"):
        nc.FileSegment(f)


# Completion: status, wait, cancel, failure.


def test_status_and_wait_report_the_end(connector, path):
    block = bytearray(pattern(BLOCK, seed=29))

    async def go():
        op = await connector.begin_file_write(nc.Descriptor(block), nc.FileSegment(path, 0, BLOCK))
        assert op.status in (nc.OperationStatus.IN_PROGRESS, nc.OperationStatus.COMPLETE)
        assert op.operation_kind == nc.OperationKind.WRITE
        await op.wait_for_completion(timeout=30)
        assert op.status == nc.OperationStatus.COMPLETE
        assert op.wait(timeout=0) == nc.OperationStatus.COMPLETE
        op.cancel()  # no effect once complete
        assert op.status == nc.OperationStatus.COMPLETE
        with pytest.raises(RuntimeError, match="no remote peer"):
            op.remote
        read = await connector.begin_file_read(nc.FileSegment(path, 0, BLOCK), nc.Descriptor(bytearray(BLOCK)))
        assert read.operation_kind == nc.OperationKind.READ
        await read.wait_for_completion()
        return bytes(read.results()[0]._data_ref)

    assert run(go()) == block


def test_a_cancelled_write_on_loopback_moves_no_byte(path):
    """On loopback a delayed transfer cancelled before it moves never moves
    a byte; the memory comes back and is used at once."""
    connector = nc.Connector(f"files-cancel-{uuid.uuid4().hex[:8]}", backend="loopback")
    path.write_bytes(bytes(BLOCK))
    block = bytearray(b"\xaa" * BLOCK)
    segment = nc.FileSegment(path, 0, BLOCK)

    async def go():
        connector._native_connector()._delay_next_transfer(2.0)
        op = await connector.begin_file_write(nc.Descriptor(block), segment)
        assert op.status == nc.OperationStatus.IN_PROGRESS
        op.cancel()
        await op.wait_for_completion()
        assert op.status == nc.OperationStatus.CANCELLED
        assert await op.wait_for_release(timeout=10)
        assert path.read_bytes() == bytes(BLOCK)
        again = await connector.begin_file_write(nc.Descriptor(block), segment)
        await again.wait_for_completion()
        assert again.status == nc.OperationStatus.COMPLETE

    run(go())
    assert path.read_bytes() == block


def test_a_cancel_ends_the_operation_either_way(connector, path):
    """A cancel right after the post: the transfer is cancelled or had
    completed (NIXL may have finished it); either way the wait returns and,
    if it completed, every byte is there."""
    big = 8 << 20
    data = np.frombuffer(bytearray(pattern(big, seed=31)), dtype=np.uint8)

    async def go():
        op = await connector.begin_file_write(nc.Descriptor((data, "cpu")), nc.FileSegment(path, 0, big))
        op.cancel()
        await op.wait_for_completion()
        assert await op.wait_for_release(timeout=30)
        return op.status

    status = run(go())
    assert status in (nc.OperationStatus.CANCELLED, nc.OperationStatus.COMPLETE)
    if status == nc.OperationStatus.COMPLETE:
        assert path.read_bytes() == data.tobytes()


def test_a_failed_transfer_is_errored_on_loopback(path):
    connector = nc.Connector(f"files-fail-{uuid.uuid4().hex[:8]}", backend="loopback")
    segment = nc.FileSegment(path, 0, BLOCK)

    async def go():
        connector._native_connector()._fail_next_transfer("the disk is on fire")
        op = await connector.begin_file_write(nc.Descriptor(bytearray(BLOCK)), segment)
        with pytest.raises(RuntimeError, match="the disk is on fire") as failed:
            await op.wait_for_completion()
        # A file has no remote agent to blame (Dynamo's wording for a peer).
        assert "remote agent" not in str(failed.value)
        assert op.status == nc.OperationStatus.ERRORED
        with pytest.raises(RuntimeError, match="errored"):
            op.cancel()

    run(go())


def test_a_segment_belongs_to_the_connector_that_first_moved_it(path):
    """A file is registered with one connector: another's transfer of it is
    refused (not a crash)."""
    a = nc.Connector(f"files-a-{uuid.uuid4().hex[:8]}", backend="loopback")
    b = nc.Connector(f"files-b-{uuid.uuid4().hex[:8]}", backend="loopback")
    segment = nc.FileSegment(path, 0, BLOCK)

    async def go():
        op = await a.begin_file_write(nc.Descriptor(bytearray(BLOCK)), segment)
        await op.wait_for_completion()
        with pytest.raises((RuntimeError, ValueError)):
            await b.begin_file_write(nc.Descriptor(bytearray(BLOCK)), segment)
        # Another open of the same path is another file: it may be used.
        op = await b.begin_file_write(nc.Descriptor(bytearray(b"z" * BLOCK)), nc.FileSegment(path, 0, BLOCK))
        await op.wait_for_completion()

    run(go())
    assert path.read_bytes() == b"z" * BLOCK


def test_a_read_of_a_write_only_fd_errors_and_leaves_the_memory_alone(connector, path):
    """A descriptor opened write-only is `writable`; a READ of it fails in
    the backend (EBADF): the operation is ERRORED, not a crash, and the
    memory is untouched and usable again."""
    path.write_bytes(b"a" * BLOCK)
    fd = os.open(path, os.O_WRONLY)
    segment = nc.FileSegment(fd, 0, BLOCK)
    os.close(fd)
    memory = bytearray(b"m" * BLOCK)

    async def go():
        op = await connector.begin_file_read(segment, nc.Descriptor(memory))
        with pytest.raises(RuntimeError, match="ERRORED"):
            await op.wait_for_completion(timeout=30)
        assert op.status == nc.OperationStatus.ERRORED
        assert memory == b"m" * BLOCK
        read = await connector.begin_file_read(nc.FileSegment(path), nc.Descriptor(memory))
        await read.wait_for_completion()

    run(go())
    assert memory == b"a" * BLOCK
