"""In a fork()ed child of a process that made a connector, the `Descriptor`
getters that ask the operation holding the memory to hand it back
(`in_use`, `is_registered`) refuse with `RuntimeError`, like every other
call that reaches the core: the child never settles its parent's operation
(its engine and backend threads did not survive the fork). The parent's
operation is untouched and hands the memory back there as usual.
"""

import gc
import os
import select

import pytest

import nixl_connect as nc
from conftest import run

CHILD_TIMEOUT_S = 60


def child_verdicts(attempts) -> str:
    """Forks; the child makes each attempt and reports `refused` (a
    RuntimeError naming fork), `works`, or what else happened, through a
    pipe. Returns the child's report; fails if it hung or died."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        verdicts = []
        for attempt in attempts:
            try:
                attempt()
                verdicts.append("works")
            except RuntimeError as e:
                verdicts.append("refused" if "fork" in str(e) else f"other: {e}")
            except BaseException as e:  # noqa: BLE001 - reported, not raised
                verdicts.append(f"other: {e!r}")
        gc.collect()
        os.write(w, ",".join(verdicts).encode())
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], CHILD_TIMEOUT_S)
    if not ready:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    report = os.read(r, 4096).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert status == 0, report
    return report


def test_a_forked_childs_loan_getters_refuse_and_leave_the_parents_operation_alone(backend):
    server = nc.Connector(backend=backend)
    client = nc.Connector(backend=backend)
    src = bytearray(range(64))
    lent = nc.Descriptor(src)
    pool = nc.BlockPool(bytearray(4 * 64), 64)
    part = pool.checkout(1)[0]
    part._data_ref[:] = bytes(range(64, 128))

    async def exchange():
        readable = await server.create_readable([lent, part])
        dst = [bytearray(64), bytearray(64)]
        read = await client.begin_read(readable.metadata(), [nc.Descriptor(d) for d in dst])
        await read.wait_for_completion()
        return readable, dst

    # The peer's READ is over; the readable holding `lent` and `part` has
    # not been looked at since: its loan is still out.
    readable, dst = run(exchange())
    assert dst == [bytes(range(64)), bytes(range(64, 128))]
    report = child_verdicts(
        [
            lambda: lent.is_registered,
            lambda: lent._native.in_use,
            lambda: part.is_registered,
            lambda: part._native.in_use,
        ]
    )
    assert report == "refused,refused,refused,refused", report
    # The parent settles its own operation, and gets its memory back.
    run(readable.wait_for_completion())
    assert readable.status == nc.OperationStatus.COMPLETE
    assert not lent._native.in_use and not part._native.in_use
    assert lent.is_registered
    assert bytes(src) == bytes(range(64))
