"""Probe of issue 48's long-lived-client cause: does the ACTIVE side's cost
grow with the history of its passive peer's registrations, with nothing
abandoned?

Two processes. The server, each operation, exposes a readable over a fresh
buffer (registered, then completed and deregistered: its metadata and RSS stay
flat); `--slice`: the last 4 KiB of a fresh buffer of 4 KiB to 1 MiB (so
every region lies at a new address, as in the soak), `--vary`: the whole fresh
buffer (the client's buffer then changes too), `--reuse`: one buffer for all
(one registration), default: a fresh 4 KiB array (malloc hands back the same
address). The client READs each into one 4 KiB buffer and prints per 1,000
READs: its ms per READ and in begin_read, its RSS, registrations and
remote_agents, the metadata size, the server's registrations and RSS.

Exit 1 when the client's begin_read time of the last round is over 2x the
second round's or its RSS grew by more than 4 MiB (the defect present).
Run: target/py-venv/bin/python crates/nixl-connect-py/soak/client_history.py --slice
"""
import asyncio, json, multiprocessing as mp, os, sys, time
N, ROUNDS = 1000, int(os.environ.get("ROUNDS", "20"))
REUSE = "--reuse" in sys.argv
SLICE = "--slice" in sys.argv
VARY = "--vary" in sys.argv or SLICE

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

def server(conn):
    import numpy as np, nixl_connect as nc
    async def main():
        c = nc.Connector()
        import random; rng = random.Random(1)
        keep = np.ones(4096, np.uint8); kd = nc.Descriptor((keep, "cpu"))
        while True:
            msg = conn.recv()
            if msg == "stop": break
            if msg == "stats":
                conn.send(dict(registrations=c._native.registrations, rss=rss())); continue
            if REUSE:
                d = kd
            else:
                size = int(4096 * 2 ** (rng.random() * 8)) if VARY else 4096
                a = np.ones(size, np.uint8)
                d = nc.Descriptor((a[-4096:] if SLICE else a, "cpu"))
            r = await c.create_readable(d)
            conn.send(r.metadata().model_dump_json())
            await r.wait_for_completion()
            del r, d
    asyncio.run(main())

def client(conn):
    import numpy as np, nixl_connect as nc
    async def main():
        c = nc.Connector(); dst = np.zeros(4096, np.uint8); dd = nc.Descriptor((dst, "cpu"))
        for rnd in range(ROUNDS):
            t = time.perf_counter(); md_len = 0; tb = 0.0
            for _ in range(N):
                conn.send("op"); md = conn.recv(); md_len = len(md)
                m = nc.RdmaMetadata.model_validate_json(md)
                size = m.descriptors[0].size
                if len(dst) != size:
                    dst = np.zeros(size, np.uint8); dd = nc.Descriptor((dst, "cpu"))
                t1 = time.perf_counter()
                rd = await c.begin_read(m, dd)
                tb += time.perf_counter() - t1
                await rd.wait_for_completion()
                assert dst[0] == 1
                dst[:] = 0
                del rd
            per = (time.perf_counter() - t) / N * 1e3
            conn.send("stats"); s = conn.recv()
            print(json.dumps(dict(round=rnd, ops=(rnd + 1) * N, client_ms_per_read=round(per, 3),
                  client_begin_ms=round(tb / N * 1e3, 3), client_rss=round(rss(), 1),
                  client_regs=c._native.registrations, client_remote_agents=c._native.remote_agents,
                  md_bytes=md_len, server_regs=s["registrations"], server_rss=round(s["rss"], 1))), flush=True)
            rounds.append((tb / N, rss()))
        conn.send("stop")
        grew = rounds[-1][0] > 2 * rounds[1][0] or rounds[-1][1] - rounds[1][1] > 4
        sys.exit(1 if grew else 0)
    rounds = []
    asyncio.run(main())

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    ps = [ctx.Process(target=server, args=(a,)), ctx.Process(target=client, args=(b,))]
    for p in ps: p.start()
    for p in ps: p.join()
    sys.exit(ps[1].exitcode)
