"""The sync engine's cost per operation, in instructions and in CPU time, for two builds:
``python benchmarks/profile_regression.py {run,callgrind,time} ...``.

The project's rule is that the sync engine (chain, tree, no-op) must not regress by more than
5% from one commit to the next. Two builds cannot share one process, so this compares them in
separate processes, each importing ``incr`` from its own work tree (PYTHONPATH):

  run W N            set up workload W, warm it up, then do N operations of it and print
                     JSON: CPU time per op (time.process_time) and the ``incr`` imported.
                     Under callgrind (``--collect-atstart=no``) only the N measured operations
                     are counted: a tiny helper built with <valgrind/callgrind.h> toggles
                     collection around them (without the header, the count includes setup:
                     use ``--subtract``, which runs N=0 too and takes the difference).
  callgrind A B ...  run every workload under callgrind for each tree (A = base, B = new):
                     instructions per operation, and the ratio B/A. Deterministic: the same
                     PYTHONHASHSEED each run, gc disabled while measuring.
  time A B ...       CPU time per op, in processes that alternate A, B, A, B ... over
                     ``--rounds`` rounds: the median of each, and the median of the paired
                     ratios (round i's B over round i's A), which drift in the machine's load
                     affects least.

Workloads (each op is one change or one demand, as named):

  chain     a chain of 1,000 cells, c0 = x + 1, c_i = c_{i-1} + 1: set x, demand c_999
            (all 1,000 recomputed); per op
  hit       10,000 demands of an up-to-date instance from top level (a flat loop of calls,
            ten per turn); per demand
  cutoff    the chain of 1,000 with c0 = (x >= 0): set x to another positive value, demand
            c_999 (c0 runs and is cut off; the other 999 are verified, not run); per op
  tree      a balanced tree of sums over 2^14 inputs, t(i, i+1) = x_i: set one x_i, demand
            t(0, 2^14) (15 runs, 14 siblings verified); per op
  noop      rt.stabilize() with 100 observed instances o(i) = x_i + 1 and nothing changed
  stab1     the same 100 observed instances: set one x_i, rt.stabilize() (one run)
  chainstab the chain of 1,000 with its tail observed: set x, rt.stabilize()
  async     the chain of 1,000 as async cells, c_i = await c_{i-1} + 1, demanded from sync
            code: set x, demand c_999 (all 1,000 recomputed, each finishing in its first
            step); per op -- async / chain is the async cell's overhead per instance
  flat1     1,000 instances of a keyed cell k(i) = x + i, demanded in a flat loop from top
            level: set x, then k(0) ... k(999) (each a recomputed cell); per cell
  flat0     the same with 1,000 zero-parameter cells z_j() = x + j; per cell
  plain1    the baseline of flat1: a shallow plain Python function p(i) = x + i called in
            the same flat loop, 1,000 calls per op (x a global); per call
  plain0    the baseline of flat0: 1,000 zero-argument plain functions, one call each; per call
  lru       the baseline of hit: an functools.lru_cache hit, called as hit calls leaf(7)
  mapsum    one changed key of a 10^4-key input map observed through ``m.map(f).sum()`` (f a
            plain function), outside ``with rt:`` as benchmarks/collections.py does it:
            m.set(key, v), rt.stabilize(), read the observer's value; per change
  coldcell  the cold build of a map with an incr cell per key: a new runtime, an input map of
            2,000 keys, ``m.map(cell).sum()`` observed, the first rt.stabilize(); per instance
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = ("chain", "hit", "cutoff", "tree", "noop", "stab1", "chainstab", "async", "flat1",
             "flat0", "plain1", "plain0", "lru", "mapsum", "coldcell")
NO_WITH = ("mapsum", "coldcell")     # measured outside ``with rt:``
COLD = 2000
FLAT = 1000
# operations measured per workload: enough that the per-op count settles, few enough for
# callgrind (about 50x slower than native) to take seconds
OPS_CALLGRIND = {"chain": 100, "hit": 20, "cutoff": 200, "tree": 2000, "noop": 2000,
                 "stab1": 2000, "chainstab": 100, "async": 20, "flat1": 100, "flat0": 100, "plain1": 100,
                 "plain0": 100, "lru": 20, "mapsum": 3000, "coldcell": 5}
OPS_TIME = {"chain": 300, "hit": 60, "cutoff": 1000, "tree": 20000, "noop": 20000,
            "stab1": 20000, "chainstab": 300, "async": 100, "flat1": 1000, "flat0": 1000, "plain1": 3000,
            "plain0": 3000, "lru": 60, "mapsum": 20000, "coldcell": 30}
HIT_CALLS = 10_000

_HELPER_SRC = r"""
#include <valgrind/callgrind.h>
void incr_cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
int incr_cg_running(void) { return RUNNING_ON_VALGRIND; }
"""


def _helper():
    """ctypes handle to incr_cg_toggle / incr_cg_running, or None (no compiler or header)."""
    d = os.path.join(tempfile.gettempdir(), "incr-cg-helper")
    so = os.path.join(d, "cg.so")
    if not os.path.exists(so):
        if not os.path.exists("/usr/include/valgrind/callgrind.h"):
            return None
        os.makedirs(d, exist_ok=True)
        src = os.path.join(d, "cg.c")
        with open(src, "w") as f:
            f.write(_HELPER_SRC)
        tmp = so + f".{os.getpid()}"
        r = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", tmp, src],
                           capture_output=True)
        if r.returncode:
            return None
        os.replace(tmp, so)
    return ctypes.CDLL(so)


# -- workloads: each returns op(k), doing the k-th operation --------------------------------------

def _chain(incr, rt, x, n, first, is_async=False):
    prev = None
    cells = []

    def make(i, prev):
        if prev is None:
            fn = first
        elif is_async:
            async def fn():
                return await prev() + 1
        else:
            def fn():
                return prev() + 1
        fn.__qualname__ = f"c{i}"
        return incr.cell(fn)

    for i in range(n):
        prev = make(i, prev)
        cells.append(prev)
    with rt:
        for c in cells:     # bottom up: no deep recursion on the first computation
            c()
    return prev


def _mf(k, v):
    return v * 2


def setup(name: str):
    import incr
    rt = incr.Runtime()
    if name in ("chain", "cutoff", "chainstab", "async"):
        x = rt.input("x", 1)
        if name == "cutoff":
            def first():
                return x.get() >= 0
        elif name == "async":
            async def first():
                return x.get() + 1
        else:
            def first():
                return x.get() + 1
        tail = _chain(incr, rt, x, 1000, first, is_async=name == "async")
        if name == "chainstab":
            with rt:
                rt.observe(tail)
                rt.stabilize()

            def op(k):
                x.set(k + 2)
                rt.stabilize()
            return rt, op

        def op(k):
            x.set(k + 2)
            tail()
        return rt, op
    if name == "hit":
        y = rt.input("y", 1)

        @incr.cell
        def leaf(i):
            return y.get() + i

        rng = range(HIT_CALLS // 10)

        def op(k):
            for _ in rng:
                leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7)  # noqa: E501,E702
        with rt:
            leaf(7)
        return rt, op
    if name == "tree":
        n = 1 << 14
        xs = [rt.input(f"x{i}", i) for i in range(n)]

        @incr.cell
        def t(lo, hi):
            if hi - lo == 1:
                return xs[lo].get()
            mid = (lo + hi) // 2
            return t(lo, mid) + t(mid, hi)

        with rt:
            t(0, n)

        def op(k):
            i = (k * 7919) % n
            xs[i].set(xs[i].value + 1)
            t(0, n)
        return rt, op
    if name in ("noop", "stab1"):
        xs = [rt.input(f"x{i}", i) for i in range(100)]

        @incr.cell
        def o(i):
            return xs[i].get() + 1

        with rt:
            for i in range(100):
                rt.observe(o, i)
            rt.stabilize()
        if name == "noop":
            def op(k):
                rt.stabilize()
        else:
            def op(k):
                i = k % 100
                xs[i].set(xs[i].value + 1)
                rt.stabilize()
        return rt, op
    if name in ("flat1", "plain1"):
        x = rt.input("x", 1)
        rng = range(FLAT)
        if name == "flat1":
            @incr.cell
            def k(i):
                return x.get() + i
        else:
            g = {"xv": 1}
            exec("def k(i):\n    return xv + i\n", g)
            k = g["k"]

        def op(n):
            if name == "flat1":
                x.set(n + 2)
            for i in rng:
                k(i)
        with rt:
            op(-1)
        return rt, op
    if name in ("flat0", "plain0"):
        x = rt.input("x", 1)
        fns = []
        for j in range(FLAT):
            if name == "flat0":
                g = {"x": x, "j": j}
                exec("def z():\n    return x.get() + j\n", g)
                z = g["z"]
                z.__qualname__ = f"z{j}"
                fns.append(incr.cell(z))
            else:
                g = {"xv": 1, "j": j}
                exec("def z():\n    return xv + j\n", g)
                fns.append(g["z"])

        def op(n):
            if name == "flat0":
                x.set(n + 2)
            for z in fns:
                z()
        with rt:
            op(-1)
        return rt, op
    if name == "lru":
        import functools
        y = 1

        @functools.lru_cache(maxsize=None)
        def leaf(i):
            return y + i

        rng = range(HIT_CALLS // 10)

        def op(k):
            for _ in rng:
                leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7); leaf(7)  # noqa: E501,E702
        leaf(7)
        return rt, op
    if name == "mapsum":
        n = 10_000
        m = incr.input_map(rt, "m", {i: i for i in range(n)})
        ob = rt.observe(m.map(_mf).sum())
        rt.stabilize()

        def op(k):
            m.set((k * 7919) % n, k)
            rt.stabilize()
            ob.value
        return rt, op
    if name == "coldcell":
        @incr.cell
        def fc(k, v):
            return v * 2

        init = {i: i for i in range(COLD)}

        def op(k):
            r = incr.Runtime()
            mm = incr.input_map(r, "cold", init)
            r.observe(mm.map(fc).sum())
            r.stabilize()
        return rt, op
    raise SystemExit(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")


def per_op_units(name: str) -> int:
    if name in ("hit", "lru"):
        return HIT_CALLS
    if name == "coldcell":
        return COLD
    return FLAT if name in ("flat1", "flat0", "plain1", "plain0") else 1


def cmd_run(name: str, n: int, warm: int = 3) -> dict:
    import incr
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    rt, op = setup(name)
    helper = _helper()
    on_vg = bool(helper and helper.incr_cg_running())
    with rt if name not in NO_WITH else contextlib.nullcontext():
        for k in range(warm):
            op(10**6 + k)
        gc.collect()
        gc.disable()
        if on_vg:
            helper.incr_cg_toggle()
        t0 = time.process_time()
        for k in range(n):
            op(k)
        t1 = time.process_time()
        if on_vg:
            helper.incr_cg_toggle()
        gc.enable()
    return {"workload": name, "ops": n, "incr": os.path.dirname(incr.__file__),
            "toggled": on_vg,
            "cpu_ns_per_unit": (t1 - t0) / max(n, 1) / per_op_units(name) * 1e9}


# -- drivers --------------------------------------------------------------------------------------

def _env(tree: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = tree
    env["PYTHONHASHSEED"] = "0"
    return env


def _run_child(tree: str, name: str, n: int, prefix=()) -> dict:
    r = subprocess.run([*prefix, sys.executable, os.path.abspath(__file__), "run", name, str(n)],
                       env=_env(tree), capture_output=True, text=True, cwd="/")
    if r.returncode:
        raise SystemExit(f"{tree} {name}: exit {r.returncode}\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    want = os.path.join(os.path.abspath(tree), "incr")
    if out["incr"] != want:
        raise SystemExit(f"imported {out['incr']}, not {want}")
    return out


def _callgrind_total(path: str) -> int:
    total = 0
    with open(path) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                total = int(line.split()[1])
    return total


def cmd_callgrind(trees, names, outdir, subtract):
    os.makedirs(outdir, exist_ok=True)
    rows = {}
    for name in names:
        n = OPS_CALLGRIND[name]
        for label, tree in zip(("base", "new"), trees):
            counts = []
            for ops in ((n, 0) if subtract else (n,)):
                f = os.path.join(outdir, f"cg.{label}.{name}.{ops}.out")
                _run_child(tree, name, ops, prefix=(
                    "valgrind", "--tool=callgrind", f"--callgrind-out-file={f}",
                    "--collect-atstart=no" if not subtract else "--collect-atstart=yes"))
                counts.append(_callgrind_total(f))
            ir = counts[0] - (counts[1] if subtract else 0)
            rows.setdefault(name, {})[label] = ir / n / per_op_units(name)
        b, w = rows[name]["base"], rows[name]["new"]
        rows[name]["ratio"] = w / b
        print(f"  {name:<10} base {b:14,.0f}  new {w:14,.0f}  new/base {w / b:6.3f}", flush=True)
    return rows


def cmd_time(trees, names, rounds):
    rows = {}
    for name in names:
        n = OPS_TIME[name]
        samples = {"base": [], "new": []}
        ratios = []
        for r in range(rounds):
            order = (("base", trees[0]), ("new", trees[1]))
            if r % 2:
                order = order[::-1]     # ABBA: neither build always goes first
            got = {}
            for label, tree in order:
                got[label] = _run_child(tree, name, n)["cpu_ns_per_unit"]
                samples[label].append(got[label])
            ratios.append(got["new"] / got["base"])
        b, w = statistics.median(samples["base"]), statistics.median(samples["new"])
        rows[name] = {"base_ns": b, "new_ns": w, "paired_ratio": statistics.median(ratios),
                      "base": samples["base"], "new": samples["new"]}
        print(f"  {name:<10} base {b:12,.1f} ns  new {w:12,.1f} ns  "
              f"median paired new/base {statistics.median(ratios):6.3f}  "
              f"(ratios {min(ratios):.3f}..{max(ratios):.3f})", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/profile_regression.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("workload", choices=WORKLOADS)
    p.add_argument("n", type=int)
    for c in ("callgrind", "time"):
        p = sub.add_parser(c)
        p.add_argument("base")
        p.add_argument("new")
        p.add_argument("--only", nargs="*", choices=WORKLOADS, default=list(WORKLOADS))
        p.add_argument("--json", help="write the rows here")
        if c == "callgrind":
            p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "incr-cg"))
            p.add_argument("--subtract", action="store_true",
                           help="count whole runs and subtract a run with N=0 (no toggle)")
        else:
            p.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        print(json.dumps(cmd_run(a.workload, a.n)))
        return 0
    trees = (os.path.abspath(a.base), os.path.abspath(a.new))
    if a.cmd == "callgrind":
        print("instructions per op (callgrind)")
        rows = cmd_callgrind(trees, a.only, a.out, a.subtract)
    else:
        print(f"CPU time per op, processes alternating base/new, {a.rounds} rounds")
        rows = cmd_time(trees, a.only, a.rounds)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
