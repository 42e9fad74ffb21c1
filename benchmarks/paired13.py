"""Issue 13's collection targets, two builds paired: ``python benchmarks/paired13.py A B``.

Two builds cannot share one process, so each measurement runs in a child process importing
``incr`` from its own tree (PYTHONPATH); children alternate A, B, B, A ... over ``--rounds``
rounds, and the figure is the median of each build's rounds and the median of the paired
ratios (round i's B over round i's A). All times are CPU time (time.process_time).

  change   one changed key of a 10^6-key input map observed through ``m.map(f).sum()``, as
           benchmarks/collections.py's ``map+sum`` case: ``m.set``, ``rt.stabilize()``, read
           the observer; µs per change (the median of 5 blocks of --reps changes), and
           ``sum(xs)`` from scratch over a 10^6-element list in the same process (the ratio
           target: sum() from scratch ÷ one change)
  cold     the cold build of a map with an incr cell per key, as benchmarks/collections.py's
           ``cold()``: a new runtime, ``input_map`` of 10^5 keys, ``m.map(cell).sum()``
           observed, the first ``rt.stabilize()``, the cyclic collector left on; instances/s

    python benchmarks/paired13.py /work/main /work/wt-perf13 --only change cold --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time


def f(k, v):
    return v * 2


def child_change(reps: int) -> dict:
    import incr
    n = 1_000_000
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {i: i for i in range(n)})
    o = rt.observe(m.map(f).sum())
    rt.stabilize()
    step = 7919
    xs = list(range(n))
    for i in range(200):                     # warm up
        m.set((i * step) % n, i)
        rt.stabilize()
        o.value
    blocks, scratch = [], []
    k = 1000
    for b in range(5):
        t0 = time.process_time()
        for i in range(k, k + reps):
            m.set((i * step) % n, i)
            rt.stabilize()
            o.value
        blocks.append((time.process_time() - t0) / reps)
        k += reps
        t0 = time.process_time()
        for _ in range(3):
            sum(xs)
        scratch.append((time.process_time() - t0) / 3)
    us = statistics.median(blocks) * 1e6
    sc = statistics.median(scratch) * 1e6
    return {"us_per_change": us, "sum_scratch_us": sc, "ratio": sc / us,
            "incr": os.path.dirname(incr.__file__)}


def child_cold() -> dict:
    import incr
    nc = 100_000

    @incr.cell
    def fc(k, v):
        return v * 2

    init = {i: i for i in range(nc)}
    gc.collect()
    t0 = time.process_time()
    rt = incr.Runtime()
    m = incr.input_map(rt, "coldc", init)
    o = rt.observe(m.map(fc).sum())
    rt.stabilize()
    dt = time.process_time() - t0
    assert o.value == nc * (nc - 1)
    return {"per_s": nc / dt, "incr": os.path.dirname(incr.__file__)}


def run_child(tree: str, what: str, reps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, PYTHONHASHSEED="0")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", what,
                        "--reps", str(reps)], env=env, capture_output=True, text=True, cwd="/")
    if r.returncode:
        raise SystemExit(f"{tree} {what}: exit {r.returncode}\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if out["incr"] != os.path.join(os.path.abspath(tree), "incr"):
        raise SystemExit(f"imported {out['incr']}, not {tree}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", nargs="?")
    ap.add_argument("new", nargs="?")
    ap.add_argument("--only", nargs="*", default=["change", "cold"], choices=["change", "cold"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--child", choices=["change", "cold"])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child_change(a.reps) if a.child == "change" else child_cold()))
        return 0
    rows = {}
    for what in a.only:
        key = "us_per_change" if what == "change" else "per_s"
        got = {"base": [], "new": []}
        extra = {"base": [], "new": []}
        ratios = []
        for r in range(a.rounds):
            order = [("base", a.base), ("new", a.new)]
            if r % 2:
                order.reverse()
            this = {}
            for label, tree in order:
                out = run_child(tree, what, a.reps)
                this[label] = out[key]
                got[label].append(out[key])
                if what == "change":
                    extra[label].append(out["ratio"])
            ratios.append(this["new"] / this["base"])
            print(f"  {what} round {r}: base {this['base']:,.2f}  new {this['new']:,.2f}",
                  flush=True)
        row = {"base": got["base"], "new": got["new"], "paired_ratio": statistics.median(ratios),
               "base_median": statistics.median(got["base"]),
               "new_median": statistics.median(got["new"])}
        if what == "change":
            row["sum_ratio_base"] = statistics.median(extra["base"])
            row["sum_ratio_new"] = statistics.median(extra["new"])
        rows[what] = row
        print(f"{what}: base {row['base_median']:,.2f}  new {row['new_median']:,.2f}  "
              f"median paired new/base {row['paired_ratio']:.3f} "
              f"(ratios {min(ratios):.3f}..{max(ratios):.3f})"
              + (f"; sum() from scratch / change: base {row['sum_ratio_base']:.0f}x, "
                 f"new {row['sum_ratio_new']:.0f}x" if what == "change" else ""), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
