"""Store benchmarks: warm start, store hits against joblib.Memory, commit cost, key hashing,
top-level demands per second by durability, and lookup cost against stored history.

    python -m benchmarks.store            # full run (a few minutes)
    python -m benchmarks.store --quick    # smaller sizes
    python -m benchmarks.store --only toplevel,history --before /tmp/incr-before
        # also runs those two in a checkout of an earlier incr (built in place), in the same
        # run, for before/after figures

Warm start runs in fresh processes (the only honest way to measure it): one process computes
N instances into a new store, a second one demands the same root and takes everything from
the store. joblib.Memory is timed in the same run on the same machine, on its own hit path
(a memoized function called with arguments whose result is already on disk). Prints a table
and writes benchmarks/results-store.json. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

WARM_PROGRAM = r'''
import json, sys, time
import incr
path, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rt = incr.Runtime(store=None if mode == "memory" else path)
x = rt.input("x", 3)

@incr.cell(version="1")
def leaf(i):
    return x.get() + i

@incr.cell(version="1")
def group(g):
    return sum(leaf(i) for i in range(g * 100, g * 100 + 100))

@incr.cell(version="1")
def root():
    return sum(group(g) for g in range(n // 100))

t = time.perf_counter()
c = time.process_time()
with rt:
    value = root()
seconds = time.perf_counter() - t
cpu = time.process_time() - c
t = time.perf_counter()
rt.close()
close_s = time.perf_counter() - t
s = rt.stats()
print(json.dumps({"seconds": seconds, "cpu": cpu, "close": close_s, "value": value,
                  "computed": s["computed"], "hits": s["store_hits"]}))
'''


TOPLEVEL_PROGRAM = r'''
import json, os, sys, tempfile, time
import incr
n, modes = int(sys.argv[1]), sys.argv[2].split(",")
out = {}
for mode in modes:
    d = tempfile.mkdtemp()
    path = os.path.join(d, "s")

    accepted = True

    def runtime():
        global accepted
        try:
            return incr.Runtime(store=path, durability=mode)
        except TypeError:            # an incr before durability=: one commit per demand
            accepted = False
            return incr.Runtime(store=path)

    rt = runtime()
    x = rt.input("x", 3)

    @incr.cell(version="1")
    def leaf(i):
        return x.get() + i

    with rt:
        t, c = time.perf_counter(), time.process_time()
        for i in range(n):           # 10^4 top-level demands, each a cold computation
            leaf(i)
        cold, cold_cpu = time.perf_counter() - t, time.process_time() - c
    t = time.perf_counter()
    rt.close()
    cold_close = time.perf_counter() - t
    rt = runtime()
    x = rt.input("x", 3)
    with rt:
        t, c = time.perf_counter(), time.process_time()
        for i in range(n):           # the same, each a hit in the store
            leaf(i)
        hits, hits_cpu = time.perf_counter() - t, time.process_time() - c
    s = rt.stats()
    rt.close()
    # (process time: every thread of the process, the commit thread's included)
    out[mode] = {"cold_per_s": n / cold, "hits_per_s": n / hits,
                 "cold_per_cpu_s": n / cold_cpu, "hits_per_cpu_s": n / hits_cpu,
                 "close_s": cold_close, "store_hits": s["store_hits"], "durability": accepted}
print(json.dumps(out))
'''

HISTORY_PROGRAM = r'''
import json, os, statistics, sys, tempfile, time
import incr
sizes, mode, cycles = [int(a) for a in sys.argv[1].split(",")], sys.argv[2], int(sys.argv[3])
out = []
for traces in sizes:
    d = tempfile.mkdtemp()
    path = os.path.join(d, "s")
    try:
        rt = incr.Runtime(store=path, durability=mode)
    except TypeError:
        rt = incr.Runtime(store=path)
    x = rt.input("x", 0)
    k = rt.input("k", 7)

    @incr.cell(version="1")
    def f():
        return (k.get(), x.get() * 2)

    with rt:
        rt.observe(f)
        for v in range(traces):      # one stored trace of f per value of x
            x.set(v)
            rt.stabilize()
        times = {"new": [], "old": []}
        for c in range(cycles):      # alternately a value never seen and one stored
            for kind, v in (("new", traces + c), ("old", (c * 7919) % traces)):
                x.set(v)
                t = time.perf_counter()
                rt.stabilize()
                times[kind].append(time.perf_counter() - t)
                assert f() == (7, v * 2)
    s = rt.stats()
    rt.close()
    out.append({"traces": traces, "new_s": statistics.median(times["new"]),
                "old_s": statistics.median(times["old"]), "store_hits": s["store_hits"]})
print(json.dumps(out))
'''


REMOTE_PROGRAM = r'''
import json, os, random, shutil, sys, tempfile, time
import incr
url, n, rounds, work, server_pid = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                    int(sys.argv[4]), int(sys.argv[5]))
try:
    import joblib
except ImportError:
    joblib = None


def body(i):
    s = 0
    for j in range(work):
        s += (i * j) % 7
    return s


@incr.cell(version="1")
def leaf(i):
    return body(i)


@incr.cell(version="1")
def root():
    return sum(leaf(i) for i in range(n))


def server_cpu():
    # the Redis server's CPU seconds (utime + stime), so that the remote case is charged for
    # the work done on its behalf
    with open(f"/proc/{server_pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


base = tempfile.mkdtemp()
rt = incr.Runtime(store=os.path.join(base, "a"), remote=url)      # machine a
with rt:
    expect = root()
rt.close()
jdir = os.path.join(base, "joblib")                                # its joblib directory
if joblib is not None:
    f = joblib.Memory(jdir, verbose=0).cache(body)
    for i in range(n):
        f(i)


def incr_run(remote):
    d = tempfile.mkdtemp(dir=base)
    rt = incr.Runtime(store=os.path.join(d, "s"), remote=remote)   # machine b: empty store
    with rt:
        v = root()
    computed = rt.stats()["computed"]
    rt.close()
    shutil.rmtree(d)
    assert v == expect
    return computed


def joblib_run():
    g = joblib.Memory(jdir, verbose=0).cache(body)                 # machine b, shared dir
    assert sum(g(i) for i in range(n)) == expect
    return 0


cases = {"redis": lambda: incr_run(url), "recompute": lambda: incr_run(None)}
if joblib is not None:
    cases["joblib"] = joblib_run
names = list(cases)
out = {k: {"cpu": [], "wall": [], "server_cpu": []} for k in names}
computed = {}
for r in range(rounds + 1):                      # round 0 warms up, not kept
    order = names[r % len(names):] + names[:r % len(names)]
    for k in order:
        s0, c0, t0 = server_cpu(), time.process_time(), time.perf_counter()
        computed[k] = cases[k]()
        t1, c1, s1 = time.perf_counter(), time.process_time(), server_cpu()
        if r:
            out[k]["cpu"].append(c1 - c0)
            out[k]["wall"].append(t1 - t0)
            out[k]["server_cpu"].append(s1 - s0)
shutil.rmtree(base)
print(json.dumps({"n": n, "work": work, "rounds": rounds, "cases": out, "computed": computed,
                  "joblib": None if joblib is None else joblib.__version__}))
'''


def remote_tier(n: int, rounds: int, works: list[int]) -> dict | None:
    """A second machine's warm start through Redis (an empty local store, remote= a server
    machine a filled) vs computing everything (an empty store, no remote) vs joblib.Memory
    reading machine a's cache directory: one process per workload, the cases in rotating
    order in each round, process CPU time (plus the Redis server's CPU for the remote case)
    and wall time."""
    import shutil
    import socket
    server = shutil.which("redis-server")
    if server is None:
        return None
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save",
                                 "", "--appendonly", "no", "--dir", d],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            import redis
            c = redis.Redis(port=port)
            for _ in range(100):
                try:
                    c.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            rows = []
            for work in works:
                c.flushall()
                rows.append(_run_prog(REMOTE_PROGRAM, [f"redis://127.0.0.1:{port}/0", n,
                                                       rounds, work, proc.pid],
                                      str(HERE.parent)))
        finally:
            proc.kill()
            proc.wait()
    return {"rows": rows, "redis_server": subprocess.run([server, "--version"],
                                                         capture_output=True,
                                                         text=True).stdout.strip()}


def soak(steps: int, max_bytes: int, every: int) -> dict:
    """A program that makes a new result every step (a new instance, and a new trace of one
    instance) with Runtime(store=..., max_bytes=...): entry bytes, entries, index nodes and
    data.mdb's size after every ``every`` steps (each a commit)."""
    import incr
    from incr.store import _live
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s")
        rt = incr.Runtime(store=path, max_bytes=max_bytes)
        x = rt.input("x", -1)

        @incr.cell(version="1")
        def blob(k):
            return bytes([k % 256]) * 400

        @incr.cell(version="1")
        def echo():
            return str(x.get()) * 40

        (s,) = [s for s in list(_live) if s.path == path and not s.closed]
        rows = []
        t = time.process_time()
        with rt:
            for k in range(steps):
                blob(k)
                x.set(k)
                echo()
                if k % 50 == 49:
                    rt._commit()              # (a commit every 50 steps)
                if k % every == every - 1:
                    with s._txn("measuring", buffers=True) as txn:
                        eb = sum(len(v) for v in txn.cursor(db=s.entries).iternext(keys=False))
                        rows.append({"step": k + 1, "entry_bytes": eb,
                                     "entries": txn.stat(s.entries)["entries"],
                                     "index_nodes": txn.stat(s.index)["entries"],
                                     "file": os.path.getsize(os.path.join(path, "data.mdb"))})
        cpu = time.process_time() - t
        evicted = s.evicted
        rt.close()
    return {"steps": steps, "max_bytes": max_bytes, "rows": rows, "evicted": evicted,
            "cpu_s": cpu}


def _run_prog(source: str, args: list, pythonpath: str | None) -> object:
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "prog.py")
        Path(prog).write_text(source)
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        out = subprocess.run([sys.executable, prog, *map(str, args)], check=True, env=env,
                             capture_output=True, text=True, cwd=d).stdout
    return json.loads(out.strip().splitlines()[-1])


def toplevel(n: int, before: str | None, rounds: int, n_sync: int) -> dict:
    """10^4 top-level demands of a trivial cell, cold then hits: durability="group" in
    ``rounds`` fresh processes, alternating with ``before`` (a checkout) round by round,
    wall and process CPU time; "sync" (one fdatasync per demand: the disk's rate) once each,
    over ``n_sync`` demands."""
    here = str(HERE.parent)
    out = {"n": n, "n_sync": n_sync, "rounds": rounds, "group": [], "before_group": []}
    for _ in range(rounds):
        out["group"].append(_run_prog(TOPLEVEL_PROGRAM, [n, "group"], here)["group"])
        if before:
            out["before_group"].append(_run_prog(TOPLEVEL_PROGRAM, [n, "group"],
                                                 before)["group"])
    out["sync"] = _run_prog(TOPLEVEL_PROGRAM, [n_sync, "sync"], here)["sync"]
    if before:
        out["before_sync"] = _run_prog(TOPLEVEL_PROGRAM, [n_sync, "sync"], before)["sync"]
    return out


def history(sizes: list[int], cycles: int, before: str | None,
            before_sizes: list[int]) -> dict:
    """One input set + stabilize of an observed cell with N traces of it stored: median time
    for a value never seen (a miss, then a new trace) and for a stored one (a hit). Each size
    is measured twice, in ascending then descending order in one process, and the lower
    median kept (the load of a shared machine moves sub-0.1 ms figures by 2x)."""
    root = str(HERE.parent)

    def go(sz, mode, where):
        both = sz + sz[::-1]
        rows = _run_prog(HISTORY_PROGRAM, [",".join(map(str, both)), mode, cycles], where)
        best: dict[int, dict] = {}
        for r in rows:
            b = best.setdefault(r["traces"], dict(r))
            b["new_s"], b["old_s"] = min(b["new_s"], r["new_s"]), min(b["old_s"], r["old_s"])
        return [best[n] for n in sz]

    out = {"cycles": cycles, "after_group": go(sizes, "group", root),
           "after_sync": go(before_sizes, "sync", root)}
    if before:
        out["before"] = go(before_sizes, "sync", before)
    return out


def run_warm(n: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "warm.py")
        Path(prog).write_text(WARM_PROGRAM)
        store = os.path.join(d, "store")

        def go(mode):
            out = subprocess.run([sys.executable, prog, store, str(n), mode], check=True,
                                 capture_output=True, text=True).stdout
            return json.loads(out)

        memory = go("memory")
        cold = go("store")
        warm = go("store")
        size = sum(f.stat().st_size for f in Path(store).iterdir())
    instances = warm["hits"]
    return {"n": n, "instances": instances, "memory_s": memory["seconds"],
            "cold_s": cold["seconds"], "warm_s": warm["seconds"], "warm_cpu_s": warm["cpu"],
            "warm_per_s": instances / warm["seconds"], "store_bytes": size,
            "agree": memory["value"] == cold["value"] == warm["value"],
            "warm_ran": warm["computed"]}


def joblib_hit(n: int) -> dict | None:
    try:
        import joblib
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as d:
        mem = joblib.Memory(d, verbose=0)

        def leaf(x, i):
            return x + i

        f = mem.cache(leaf)
        for i in range(n):
            f(3, i)
        t = time.perf_counter()
        for i in range(n):
            f(3, i)
        seconds = time.perf_counter() - t
    return {"version": joblib.__version__, "n": n, "per_hit_s": seconds / n}


def commit_cost(size: int, steps: int) -> dict:
    """Cost of one stabilization after one input change, with and without the store."""
    import incr

    out = {}
    for mode in ("memory", "store"):
        with tempfile.TemporaryDirectory() as d:
            rt = incr.Runtime(store=None if mode == "memory" else os.path.join(d, "s"))
            xs = [rt.input(f"x{i}", i) for i in range(size)]

            @incr.cell(version="1")
            def node(lo, hi):
                if hi - lo == 1:
                    return xs[lo].get()
                mid = (lo + hi) // 2
                return node(lo, mid) + node(mid, hi)

            with rt:
                rt.observe(node, 0, size)
                times = []
                for k in range(steps):
                    xs[(k * 7919) % size].set(10_000 + k)
                    t = time.perf_counter()
                    rt.stabilize()
                    times.append(time.perf_counter() - t)
            rt.close()
        out[mode] = statistics.median(times)
    return {"size": size, "memory_s": out["memory"], "store_s": out["store"],
            "commit_overhead_s": out["store"] - out["memory"]}


def hashing(small: int, big_mb: int) -> list[dict]:
    from incr import keys

    rows = []
    args = (12345, "customer-42", 3.5)
    for algo in ("xxh3_128", "blake2b"):
        t = time.perf_counter()
        for _ in range(small):
            keys.digest("cell", keys.encode(args), algo)
        dt = time.perf_counter() - t
        rows.append({"what": "small argument tuple", "algorithm": algo,
                     "per_s": small / dt, "unit": "keys/s"})
        blob = os.urandom(big_mb << 20)
        reps = 5
        t = time.perf_counter()
        for _ in range(reps):
            keys.digest("value", keys.encode(blob), algo)
        dt = time.perf_counter() - t
        rows.append({"what": f"{big_mb} MB bytes argument", "algorithm": algo,
                     "per_s": reps * big_mb / dt, "unit": "MB/s"})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.store")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="warm,joblib,commit,hashing,toplevel,history,remote,soak",
                    help="comma-separated parts to run")
    ap.add_argument("--before", default=None,
                    help="a checkout of an earlier incr, built in place: toplevel and history "
                         "run there too, in this run")
    a = ap.parse_args(argv)
    only = set(a.only.split(","))
    n = 10_000 if a.quick else 100_000
    warm = run_warm(n) if "warm" in only else None
    jl = joblib_hit(2_000 if a.quick else 20_000) if "joblib" in only else None
    commit = (commit_cost(1_000 if a.quick else 100_000, 20 if a.quick else 50)
              if "commit" in only else None)
    hashes = hashing(20_000 if a.quick else 200_000, 10) if "hashing" in only else []
    top = (toplevel(2_000 if a.quick else 10_000, a.before, 2 if a.quick else 5,
                    200 if a.quick else 1_000) if "toplevel" in only else None)
    hist = (history([10, 1_000] if a.quick else [10, 1_000, 10_000], 20 if a.quick else 100,
                    a.before, [10, 300] if a.quick else [10, 1_000, 3_000])
            if "history" in only else None)
    remote = (remote_tier(500 if a.quick else 2_000, 3 if a.quick else 7,
                          [0, 2_000] if a.quick else [0, 2_000, 20_000])
              if "remote" in only else None)
    soaked = (soak(3_000 if a.quick else 30_000, 256_000, 500 if a.quick else 2_500)
              if "soak" in only else None)
    import incr

    result = {"incr": incr.__version__, "python": sys.version.split()[0], "warm": warm,
              "joblib": jl, "commit": commit, "hashing": hashes, "toplevel": top,
              "history": hist, "before": a.before, "remote": remote, "soak": soaked,
              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    name = "results-store-quick.json" if a.quick else "results-store.json"
    if only != {"warm", "joblib", "commit", "hashing", "toplevel", "history", "remote", "soak"}:
        name = name.replace(".json", "-" + "-".join(sorted(only)) + ".json")
    (HERE / name).write_text(json.dumps(result, indent=2) + "\n")
    if top:
        print(f"{top['n']:,} top-level demands of a trivial cell, with a store, "
              f"durability='group', median of {top['rounds']} rounds (wall / process CPU):")
        for label in ("group", "before_group"):
            rs = top.get(label) or []
            if not rs:
                continue
            med = {k: statistics.median(r[k] for r in rs) for k in
                   ("cold_per_s", "cold_per_cpu_s", "hits_per_s", "hits_per_cpu_s")}
            print(f"  {label:<14} cold {med['cold_per_s']:>9,.0f} / {med['cold_per_cpu_s']:>9,.0f}"
                  f" /s   hits {med['hits_per_s']:>9,.0f} / {med['hits_per_cpu_s']:>9,.0f} /s")
        for label in ("sync", "before_sync"):
            r = top.get(label)
            if r:
                print(f"  {label:<14} cold {r['cold_per_s']:>9,.0f} /s   hits "
                      f"{r['hits_per_s']:>9,.0f} /s  ({top['n_sync']:,} demands)")
    if hist:
        print(f"one set + stabilize with N traces stored (median of {hist['cycles']}):")
        for label in ("before", "after_sync", "after_group"):
            for r in hist.get(label) or []:
                print(f"  {label:<12} N={r['traces']:>6,}  new value {r['new_s'] * 1e3:8.2f} ms"
                      f"   stored value {r['old_s'] * 1e3:8.2f} ms")
    if "remote" in only and remote is None:
        print("remote tier: redis-server is not installed; not measured")
    for row in (remote or {}).get("rows", []):
        med = {k: {m: statistics.median(v[m]) for m in ("cpu", "wall", "server_cpu")}
               for k, v in row["cases"].items()}
        print(f"second machine's warm start, {row['n']:,} leaves of {row['work']:,} steps each, "
              f"median of {row['rounds']} rotating rounds (computed: {row['computed']}):")
        for k, m in med.items():
            extra = (f" + server {m['server_cpu'] * 1e3:.1f} ms" if k == "redis" else "")
            print(f"  {k:<10} CPU {m['cpu'] * 1e3:9.1f} ms{extra:<22} wall {m['wall'] * 1e3:9.1f} ms")
        r = med["redis"]
        rcpu = r["cpu"] + r["server_cpu"]
        print(f"  recompute / redis (CPU incl. server): {med['recompute']['cpu'] / rcpu:.2f}x"
              + (f"; joblib / redis: {med['joblib']['cpu'] / rcpu:.2f}x" if "joblib" in med
                 else ""))
    if soaked:
        print(f"soak: {soaked['steps']:,} steps, max_bytes={soaked['max_bytes']:,}, "
              f"{soaked['evicted']:,} evicted, {soaked['cpu_s']:.1f} s CPU")
        for r in soaked["rows"]:
            print(f"  step {r['step']:>7,}  entries {r['entries']:>5}  entry bytes "
                  f"{r['entry_bytes']:>9,}  index nodes {r['index_nodes']:>5}  data.mdb "
                  f"{r['file']:>10,}")
    if warm is None:
        return 0
    per_instance = warm["warm_s"] / max(warm["instances"], 1)
    print(f"incr {incr.__version__}, Python {result['python']}"
          + (f", joblib {jl['version']}" if jl else ", joblib not installed"))
    print(f"warm start, {warm['instances']:,} instances from the store: "
          f"{warm['warm_per_s']:,.0f} instances/s ({per_instance * 1e6:.1f} µs each); "
          f"values agree: {warm['agree']}; functions run: {warm['warm_ran']}")
    print(f"  process CPU time of the warm start {warm['warm_cpu_s']:.2f} s "
          f"({warm['instances'] / warm['warm_cpu_s']:,.0f} instances per CPU second; wall time "
          f"above it means the machine was busy)")
    print(f"  first run with the store {warm['cold_s']:.2f} s, in memory {warm['memory_s']:.2f} s, "
          f"warm {warm['warm_s']:.2f} s -> warm is {warm['cold_s'] / warm['warm_s']:.1f}x faster "
          f"than computing into the store, {warm['memory_s'] / warm['warm_s']:.2f}x vs computing "
          f"in memory; store size {warm['store_bytes'] / 1e6:.1f} MB")
    if jl:
        print(f"store hit vs joblib.Memory hit: {per_instance * 1e6:.1f} µs vs "
              f"{jl['per_hit_s'] * 1e6:.1f} µs -> incr is {jl['per_hit_s'] / per_instance:.1f}x "
              f"cheaper")
    print(f"one change + stabilize over {commit['size']:,} inputs (tree sum): in memory "
          f"{commit['memory_s'] * 1e6:.0f} µs, with the store {commit['store_s'] * 1e6:.0f} µs "
          f"(commit and records: +{commit['commit_overhead_s'] * 1e6:.0f} µs)")
    for h in hashes:
        print(f"key hashing, {h['what']:<22} {h['algorithm']:<9} {h['per_s']:>14,.0f} {h['unit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
