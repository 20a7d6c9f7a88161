"""Resource defect: every begin_read() against the metadata of a peer process that has exited
(never connected before) leaks 2 sockets in the reader, per attempt, without bound; a worker
that retries a dead peer runs out of file descriptors (~500 retries at ulimit -n 1024).
(Distinct from the known "~2 fds per peer incarnation": here it is one dead incarnation, N attempts.)
Real Dynamo 1.6.1 also leaks, 1 socket per attempt.

Expected: fd count bounded (each failed load/connect cleans up).  Actual: +200 fds per 100 attempts.
Run: python ../shared/repros/python/py_fd_leak_dead_peer_retry.py    (exit 1 = defect)
"""
import os, sys, asyncio, subprocess
import numpy as np
import nixl_connect as nc
PEER = r'''
import asyncio, numpy as np, nixl_connect as nc
async def main():
    c = nc.Connector()
    op = await c.create_readable(nc.Descriptor((np.ones(4096, np.uint8), "cpu")))
    print("MD:" + op.metadata().model_dump_json(), flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
'''
def fds(): return len(os.listdir("/proc/self/fd"))
async def main():
    c = nc.Connector()
    p = subprocess.Popen([sys.executable, "-c", PEER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    md = next(l[3:] for l in p.stdout if l.startswith("MD:"))
    p.kill(); p.wait()
    m = nc.RdmaMetadata.model_validate_json(md)
    d = nc.Descriptor((np.zeros(4096, np.uint8), "cpu"))
    async def attempt():
        try:
            rd = await c.begin_read(m, d); await rd.wait_for_completion(timeout=10)
            raise SystemExit("READ of a dead peer succeeded?")
        except RuntimeError:
            pass
    await attempt()                      # first attempt: connection machinery set up
    f0 = fds()
    for _ in range(1000):
        await attempt()
    grown = fds() - f0
    print(f"fds grew by {grown} over 1000 failed attempts against one dead peer")
    return 1 if grown > 20 else 0
sys.exit(asyncio.run(main()))
