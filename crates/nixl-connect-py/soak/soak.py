"""The soak: `cargo xtask soak [--minutes M] [--impl ours|dyn|both] [--installed]`.

A mixed workload run for minutes to hours, as a KV-transfer worker lives, on
NIXL, with `nixl_connect` (ours) or Dynamo 1.6.1's `dynamo.nixl_connect`
(`dyn`): issue 48. `cargo xtask test --long` runs it for 60 minutes with ours.

Processes (all started by `supervise`, each its own connector):
- `server`, long-lived: the passive side (`create_readable` / `create_writable`)
  of every request;
- `client`, long-lived: the active side (`begin_read` / `begin_write`), 4
  requests in flight;
- `peer`, a third process restarted every 30 s (2 requests in flight); every
  third incarnation is killed (SIGKILL) mid-transfer.

A request: READ or WRITE, 1-64 descriptors of 4 KiB to 4 MiB (log-uniform,
at most 32 MiB a batch), or 1-64 blocks of a 64 KiB `BlockPool` (ours, 30%).
Every byte is checked against a seeded pattern (readers check what they read,
the server what was written). About 5% are abandoned on purpose: exposed and
never read (the server's wait times out; half of those then cancelled), the
active side cancelled at once, or waited with a tiny timeout and cancelled.
Metadata travels over a Unix socket as newline-delimited JSON.

Each process appends a sample every 10 s (and a final one) to
`<role>.samples.jsonl` in the output folder: time, operations ended and
verified, bytes, wrong bytes, errors by kind, fds, threads, RSS, and for ours
the native connector's `registrations` and `remote_agents`; the server also
the metadata size of its latest one-descriptor operation. The supervisor
writes `run.json` (the clock origin and the deadline) and
`supervisor.events.jsonl`. xtask (`xtask/src/soak.rs`) turns these into the
report (`report.json`, `report.md`) and its verdicts.

Run by hand: `python soak.py supervise --impl ours --minutes 3 --out DIR`
(Dynamo: its module and a `torch` stand-in on PYTHONPATH, as xtask sets).
"""

import argparse
import asyncio
import collections
import inspect
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import traceback

KIB, MIB = 1 << 10, 1 << 20
POOL_BLOCK = 64 * KIB
POOL_BLOCKS = 1024  # a 64 MiB pool per process (ours only)
MAX_BATCH_BYTES = 32 * MIB
SAMPLE_PERIOD = 10.0
PEER_PERIOD = 30.0  # a peer incarnation starts every 30 s
PEER_KILL_EVERY = 3  # every third incarnation is killed mid-transfer
CLIENT_CONCURRENCY, PEER_CONCURRENCY = 4, 2
PAGE = os.sysconf("SC_PAGE_SIZE")

IMPL = os.environ.get("SOAK_IMPL", "ours")
nc = None  # the module under test
np = None
BASE = None  # 9 MiB of seeded bytes, the same in every process


def load():
    global nc, np, BASE
    import numpy

    np = numpy
    if IMPL == "ours":
        import nixl_connect as module
    else:
        import dynamo.nixl_connect as module
    nc = module
    BASE = np.random.default_rng(12345).integers(0, 256, size=9 * MIB, dtype=np.uint8)


def expected(seed, j, size):
    off = (seed * 7919 + j * 4099) % MIB
    return BASE[off : off + size]


def resources():
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * PAGE / MIB
    return fds, threads, rss


def kind_of(where, e):
    """An error's kind: where, type, message with numbers folded (so that
    ids and sizes do not make every error a kind of its own)."""
    return f"{where}:{type(e).__name__}:{re.sub(r'[0-9]+', '#', str(e))[:80]}"


class Stats:
    """One process's counters; `sample` appends them to its samples file."""

    def __init__(self, role, inc, out):
        self.role, self.inc, self.out = role, inc, out
        self.ops = 0  # requests that ended, however
        self.ok = 0  # completed and verified transfers
        self.bytes_ok = 0
        self.wrong_bytes = 0
        self.intended = collections.Counter()  # abandoned on purpose, by how
        self.errors = collections.Counter()
        self.hangs = 0
        self.inflight = 0
        self.begin_s = 0.0  # in begin_read/begin_write (active) or create_* (server)
        self.wait_s = 0.0  # in wait_for_completion of completed transfers
        self.md_last = None  # server: metadata bytes of the latest 1-descriptor op
        self.pool = None
        self.conn = None

    def err(self, where, e):
        k = kind_of(where, e)
        self.errors[k] += 1
        if self.errors[k] <= 2:
            with open(os.path.join(self.out, f"{self.role}.tracebacks"), "a") as f:
                f.write(f"--- {self.role}{self.inc} {k}\n{traceback.format_exc()}\n")

    def native_counts(self):
        native = getattr(self.conn, "_native", None) if self.conn is not None else None
        if native is None:
            return None, None
        try:
            return native.registrations, native.remote_agents
        except Exception:
            return None, None

    def sample(self, final=False):
        fds, threads, rss = resources()
        registrations, remote_agents = self.native_counts()
        rec = dict(
            ts=time.time(), role=self.role, inc=self.inc, pid=os.getpid(), final=final,
            ops=self.ops, ok=self.ok, bytes_ok=self.bytes_ok, wrong_bytes=self.wrong_bytes,
            hangs=self.hangs, inflight=self.inflight, fds=fds, threads=threads,
            rss_mib=round(rss, 1), begin_s=round(self.begin_s, 4), wait_s=round(self.wait_s, 4),
            md_last=self.md_last, registrations=registrations, remote_agents=remote_agents,
            pool_free=(self.pool.free if self.pool is not None else None),
            intended=dict(self.intended), errors=dict(self.errors),
        )
        # One write of one line in append mode: incarnations share the file.
        with open(os.path.join(self.out, f"{self.role}.samples.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")


async def sampler(stats):
    while True:
        stats.sample()
        await asyncio.sleep(SAMPLE_PERIOD)


_has_timeout = {}


async def wait_op(op, timeout):
    """Waits at most `timeout` s: ours' `timeout=` where there is one,
    `asyncio.wait_for` otherwise (Dynamo); TimeoutError when it ran out."""
    fn = op.wait_for_completion
    kind = type(op)
    if kind not in _has_timeout:
        try:
            _has_timeout[kind] = "timeout" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            _has_timeout[kind] = False
    if _has_timeout[kind]:
        await fn(timeout=timeout)
        return
    try:
        await asyncio.wait_for(fn(), timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no completion within {timeout}s") from None


def status_name(op):
    try:
        st = op.status
        return "COMPLETE" if st == nc.OperationStatus.COMPLETE else getattr(st, "name", str(st))
    except Exception as e:
        return f"?{type(e).__name__}"


async def make_connector():
    c = nc.Connector()
    init = getattr(c, "initialize", None)  # Dynamo's
    if init is not None:
        r = init()
        if inspect.isawaitable(r):
            await r
    return c


class Bufs:
    """One batch's buffers: plain NumPy arrays, or blocks of a BlockPool (ours)."""

    def __init__(self, pool, sizes, use_pool):
        if use_pool and pool is not None:
            parts = pool.checkout(len(sizes))
            if parts is not None:
                self.views = [p._data_ref for p in parts]
                self.descs = parts
                return
        self.views = [np.zeros(s, dtype=np.uint8) for s in sizes]
        self.descs = [nc.Descriptor((a, "cpu")) for a in self.views]

    def sizes(self):
        return [len(v) for v in self.views]

    def fill(self, seed):
        for j, v in enumerate(self.views):
            v[:] = expected(seed, j, len(v))

    def clear(self):
        for v in self.views:
            v[:] = 0

    def wrong(self, seed):
        return sum(int(np.count_nonzero(v != expected(seed, j, len(v)))) for j, v in enumerate(self.views))


def desc_arg(descs):
    return descs[0] if len(descs) == 1 else descs


def new_pool():
    if IMPL == "ours" and hasattr(nc, "BlockPool"):
        return nc.BlockPool((np.zeros(POOL_BLOCK * POOL_BLOCKS, dtype=np.uint8), "cpu"), POOL_BLOCK)
    return None


def send(writer, msg):
    writer.write((json.dumps(msg) + "\n").encode())


# ---------------------------------------------------------------- server
async def server_main(a):
    stats = Stats("server", 0, a.out)
    conn = stats.conn = await make_connector()
    pool = stats.pool = new_pool()
    asyncio.get_running_loop().create_task(sampler(stats))
    tasks = set()

    async def create(kind, sizes, seed, use_pool):
        bufs = Bufs(pool, sizes, use_pool)
        t = time.perf_counter()
        if kind == "read":
            bufs.fill(seed)
            op = await conn.create_readable(desc_arg(bufs.descs))
        else:
            bufs.clear()
            op = await conn.create_writable(desc_arg(bufs.descs))
        stats.begin_s += time.perf_counter() - t
        return bufs, op

    async def passive(req, writer):
        kind, seed, mode, sizes = req["kind"], req["seed"], req["mode"], req["sizes"]
        stats.inflight += 1
        try:
            try:
                try:
                    bufs, op = await create(kind, sizes, seed, req.get("pool", False))
                except ValueError as e:
                    if "in use" not in str(e):
                        raise
                    stats.errors["server:pool part in use (fell back to plain arrays)"] += 1
                    bufs, op = await create(kind, sizes, seed, False)
            except Exception as e:
                send(writer, dict(id=req["id"], err=f"{type(e).__name__}:{str(e)[:80]}"))
                raise
            with op:
                md = op.metadata().model_dump_json()
                if len(sizes) == 1:
                    stats.md_last = len(md)
                send(writer, dict(id=req["id"], md=md, sizes=bufs.sizes()))
                await writer.drain()
                if mode == "passive_timeout":
                    # Exposed, never read: the wait runs out; half are then cancelled
                    # (Dynamo's passive operations have no cancel()).
                    try:
                        await wait_op(op, 0.3)
                        stats.errors["server:passive_timeout completed unexpectedly"] += 1
                    except TimeoutError:
                        stats.intended["passive_timeout"] += 1
                    if hasattr(op, "cancel") and random.random() < 0.5:
                        try:
                            op.cancel()
                            stats.intended["passive_cancel"] += 1
                        except Exception as e:
                            stats.err("server:passive_cancel", e)
                    return
                aborted = mode in ("cancel_active", "timeout_active")
                limit = 5.0 if aborted else 60.0
                t = time.perf_counter()
                try:
                    await wait_op(op, limit)
                except TimeoutError:
                    if aborted:
                        stats.intended["passive_after_" + mode] += 1
                    elif req.get("doomed"):
                        # Its peer is killed mid-transfer on purpose.
                        stats.intended["passive_timeout_peer_killed"] += 1
                    else:
                        stats.hangs += 1
                        stats.errors[f"server:{kind}:timeout {int(limit)}s (peer {req.get('who')})"] += 1
                    return
                st = status_name(op)
                if st != "COMPLETE":
                    stats.errors[f"server:{kind}:final status {st}:{mode}"] += 1
                    return
                stats.wait_s += time.perf_counter() - t
                if kind == "write":
                    w = bufs.wrong(seed)
                    if w and aborted:
                        # A cancelled WRITE may have moved only part of its bytes.
                        stats.intended["write_partial_after_" + mode] += 1
                    else:
                        stats.wrong_bytes += w
                stats.ok += 1
                stats.bytes_ok += sum(sizes)
        except Exception as e:
            stats.err(f"server:{kind}", e)
        finally:
            stats.ops += 1
            stats.inflight -= 1

    async def handle(reader, writer):
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                t = asyncio.get_running_loop().create_task(passive(json.loads(line), writer))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
        except Exception as e:
            stats.err("server:connection", e)
        finally:
            try:
                writer.close()
            except Exception:
                pass

    srv = await asyncio.start_unix_server(handle, path=a.sock, limit=64 * MIB)
    open(os.path.join(a.out, "server.ready"), "w").close()
    while time.time() < a.deadline + 200 and not os.path.exists(os.path.join(a.out, "STOP")):
        await asyncio.sleep(0.5)
    srv.close()
    if tasks:
        await asyncio.wait(list(tasks), timeout=70)
    stats.sample(final=True)


# ---------------------------------------------------------------- client / peer
async def active_main(a):
    stats = Stats(a.role, a.inc, a.out)
    conn = stats.conn = await make_connector()
    pool = stats.pool = new_pool()
    reader, writer = await asyncio.open_unix_connection(a.sock, limit=64 * MIB)
    pending = {}
    rng = random.Random(os.getpid() * 1000003 + int(time.time()))
    loop = asyncio.get_running_loop()
    loop.create_task(sampler(stats))
    who = f"{a.role}{a.inc or ''}"

    async def rx():
        while True:
            line = await reader.readline()
            if not line:
                break
            m = json.loads(line)
            fut = pending.pop(m["id"], None)
            if fut is not None and not fut.done():
                fut.set_result(m)

    loop.create_task(rx())
    counter = [0]
    seed_base = rng.randrange(1 << 30)

    def request():
        counter[0] += 1
        oid = counter[0]
        kind = "read" if rng.random() < 0.5 else "write"
        use_pool = pool is not None and rng.random() < 0.3
        n = rng.randint(1, 64)
        if use_pool:
            sizes = [POOL_BLOCK] * n
        else:
            sizes = [int(4 * KIB * (2 ** (rng.random() * 10))) for _ in range(n)]
            while sum(sizes) > MAX_BATCH_BYTES and len(sizes) > 1:
                sizes.pop()
        r = rng.random()
        mode = "ok"
        if r < 0.02:
            mode = "passive_timeout"
            # Abandoned exposures kept small: at most 4 x 256 KiB each.
            sizes = [min(x, 256 * KIB) for x in sizes[:4]]
        elif r < 0.035:
            mode = "cancel_active"
        elif r < 0.05:
            mode = "timeout_active"
        return dict(id=oid, kind=kind, sizes=sizes, seed=seed_base + oid, mode=mode, pool=use_pool, who=who,
                    doomed=a.doomed)

    async def begin(m, req, use_pool):
        bufs = Bufs(pool, m["sizes"], use_pool)
        md = nc.RdmaMetadata.model_validate_json(m["md"])
        t = time.perf_counter()
        if req["kind"] == "write":
            bufs.fill(req["seed"])
            op = await conn.begin_write(desc_arg(bufs.descs), md)
        else:
            bufs.clear()
            op = await conn.begin_read(md, desc_arg(bufs.descs))
        stats.begin_s += time.perf_counter() - t
        return bufs, op

    async def one():
        req = request()
        kind, mode = req["kind"], req["mode"]
        fut = loop.create_future()
        pending[req["id"]] = fut
        try:
            send(writer, req)
            await writer.drain()
            m = await asyncio.wait_for(fut, 60)
        finally:
            pending.pop(req["id"], None)
        if "err" in m:
            raise RuntimeError("server: " + m["err"])
        if mode == "passive_timeout":
            stats.intended["passive_timeout (not read)"] += 1
            return
        try:
            bufs, op = await begin(m, req, req["pool"])
        except ValueError as e:
            if "in use" not in str(e):
                raise
            stats.errors[f"{a.role}:pool part in use (fell back to plain arrays)"] += 1
            bufs, op = await begin(m, req, False)
        with op:
            if mode == "cancel_active":
                try:
                    if rng.random() < 0.5:
                        await asyncio.sleep(0)
                    op.cancel()
                    stats.intended["active_cancel"] += 1
                except Exception as e:
                    stats.err(f"{a.role}:cancel", e)
                try:
                    await wait_op(op, 10)
                except Exception as e:
                    stats.err(f"{a.role}:wait after cancel", e)
                return
            t = time.perf_counter()
            if mode == "timeout_active":
                try:
                    await wait_op(op, rng.choice([0.0, 0.0002]))
                    stats.intended["active_timeout but completed"] += 1
                except TimeoutError:
                    stats.intended["active_timeout"] += 1
                    try:
                        op.cancel()
                    except Exception as e:
                        stats.err(f"{a.role}:cancel after timeout", e)
                    try:
                        await wait_op(op, 10)
                    except Exception as e:
                        stats.err(f"{a.role}:wait after timeout and cancel", e)
                    return
            else:
                try:
                    await wait_op(op, 60)
                except TimeoutError:
                    stats.hangs += 1
                    stats.errors[f"{a.role}:{kind}:timeout 60s"] += 1
                    return
            st = status_name(op)
            if st != "COMPLETE":
                stats.errors[f"{a.role}:{kind}:final status {st}"] += 1
                return
            stats.wait_s += time.perf_counter() - t
            if kind == "read":
                stats.wrong_bytes += bufs.wrong(req["seed"])
            stats.ok += 1
            stats.bytes_ok += sum(m["sizes"])

    async def worker():
        while time.time() < a.stop_at:
            try:
                await one()
            except Exception as e:
                stats.err(f"{a.role}:op", e)
                await asyncio.sleep(0.05)
            finally:
                stats.ops += 1

    workers = [loop.create_task(worker()) for _ in range(a.conc)]
    await asyncio.wait(workers, timeout=max(1.0, a.stop_at - time.time()) + 90)
    stats.sample(final=True)
    writer.close()


# ---------------------------------------------------------------- supervisor
def supervise(a):
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, SOAK_IMPL=a.impl)
    sock = os.path.join(a.out, "s.sock")
    for stale in ("s.sock", "server.ready", "STOP"):
        if os.path.exists(os.path.join(a.out, stale)):
            os.unlink(os.path.join(a.out, stale))
    me = [sys.executable, os.path.abspath(__file__)]
    logs = {}

    def log(role):
        if role not in logs:
            logs[role] = open(os.path.join(a.out, role + ".log"), "ab")
        return logs[role]

    events = open(os.path.join(a.out, "supervisor.events.jsonl"), "a")

    def event(**k):
        k["ts"] = time.time()
        events.write(json.dumps(k) + "\n")
        events.flush()

    def start(role, *args):
        return subprocess.Popen(me + [role, *args], env=env, stdout=log(role), stderr=subprocess.STDOUT)

    startup = time.time() + 120
    srv = start("server", "--out", a.out, "--sock", sock, "--deadline", str(startup + a.minutes * 60))
    event(ev="start", role="server", pid=srv.pid)
    while not os.path.exists(os.path.join(a.out, "server.ready")):
        if srv.poll() is not None or time.time() > startup:
            event(ev="server_failed_to_start", rc=srv.poll())
            if srv.poll() is None:
                srv.kill()
            return 3
        time.sleep(0.2)
    # The clock starts once the server is up.
    t0 = time.time()
    deadline = t0 + a.minutes * 60
    with open(os.path.join(a.out, "run.json"), "w") as f:
        json.dump(dict(impl=a.impl, minutes=a.minutes, t0=t0, deadline=deadline,
                       sample_period_s=SAMPLE_PERIOD, peer_period_s=PEER_PERIOD,
                       peer_kill_every=PEER_KILL_EVERY), f)
    common = ["--out", a.out, "--sock", sock, "--deadline", str(deadline)]
    cli = start("client", "--stop-at", str(deadline), "--conc", str(CLIENT_CONCURRENCY), *common)
    event(ev="start", role="client", pid=cli.pid)
    inc = 0
    while time.time() < deadline - 5:
        inc += 1
        kill = inc % PEER_KILL_EVERY == 0
        ts = time.time()
        stop_at = ts + (2 * PEER_PERIOD if kill else PEER_PERIOD - 2)
        doomed = ["--doomed"] if kill else []
        p = start("peer", "--inc", str(inc), "--stop-at", str(stop_at), "--conc", str(PEER_CONCURRENCY), *doomed, *common)
        event(ev="start", role="peer", inc=inc, pid=p.pid, sigkill=kill)
        try:
            if kill:
                time.sleep(max(0.0, min(PEER_PERIOD, deadline - time.time())))
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                rc = p.wait(30)
            else:
                rc = p.wait(120)
        except subprocess.TimeoutExpired:
            event(ev="peer_hang", inc=inc, pid=p.pid)
            p.kill()
            rc = p.wait()
        event(ev="exit", role="peer", inc=inc, rc=rc, sigkill=kill)
        if time.time() < deadline - 1 and (srv.poll() is not None or cli.poll() is not None):
            event(ev="long_lived_died", server=srv.returncode, client=cli.returncode)
            break
        time.sleep(max(0.0, PEER_PERIOD - (time.time() - ts)))
    failed = False
    for role, proc in (("client", cli), ("server", srv)):
        if role == "server":
            open(os.path.join(a.out, "STOP"), "w").close()
        try:
            rc = proc.wait(200)
        except subprocess.TimeoutExpired:
            event(ev="hang", role=role)
            proc.kill()
            rc = proc.wait()
        event(ev="exit", role=role, rc=rc)
        failed |= rc != 0
    return 1 if failed else 0


def main():
    global IMPL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["supervise", "server", "client", "peer"])
    ap.add_argument("--impl", choices=["ours", "dyn"], default=IMPL)
    ap.add_argument("--minutes", type=float, default=1)
    ap.add_argument("--out", default="soak-out")
    ap.add_argument("--sock")
    ap.add_argument("--deadline", type=float)
    ap.add_argument("--stop-at", type=float, dest="stop_at")
    ap.add_argument("--conc", type=int, default=CLIENT_CONCURRENCY)
    ap.add_argument("--inc", type=int, default=0)
    ap.add_argument("--doomed", action="store_true", help="a peer the supervisor kills mid-transfer")
    a = ap.parse_args()
    if a.role == "supervise":
        a.out = os.path.abspath(a.out)
        return supervise(a)
    load()
    if a.role == "server":
        asyncio.run(server_main(a))
    else:
        asyncio.run(active_main(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
