"""Incremental collections: a sum over 10^5 and 10^6 keys with one key changed.

Paired in one process, on CPU time (time.process_time), interleaved rounds: each round changes
one key and times (a) the incremental update — ``m.set(key, v)``, ``rt.stabilize()``, read the
observed sum — and (b) ``sum(xs)`` from scratch over the same values (a plain list). Also timed:
the FoldTree update alone, and ``map(f)`` + ``sum`` (the map instance for the key runs, then
the fold). Prints a table and writes JSON with ``--json PATH``.

    python -m benchmarks.collections            # 10^5 and 10^6
    python -m benchmarks.collections --sizes 100000 --rounds 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import incr
from incr._collections import FoldTree


def _per_op(fn, reps):
    t0 = time.process_time()
    for i in range(reps):
        fn(i)
    return (time.process_time() - t0) / reps


def bench(n: int, rounds: int, reps: int) -> dict:
    rt = incr.Runtime()
    xs = list(range(n))
    m = incr.input_map(rt, f"xs{n}", {i: i for i in range(n)})
    total = m.sum()
    obs = rt.observe(total)
    rt.stabilize()
    rt2 = incr.Runtime()                 # map(f) + sum, on its own runtime
    m2 = incr.input_map(rt2, f"ys{n}", {i: i for i in range(n)})
    obs2 = rt2.observe(m2.map(lambda k, v: v * 2).sum())
    rt2.stabilize()
    tree = FoldTree("sum")
    for i in range(n):
        tree.set(i, i)
    step = 7919

    def incremental(i):
        k = (i * step) % n
        m.set(k, i)
        rt.stabilize()
        obs.value

    def pipeline(i):
        m2.set((i * step) % n, i)
        rt2.stabilize()
        obs2.value

    def tree_only(i):
        tree.set((i * step) % n, i)

    def scratch(i):
        xs[(i * step) % n] = i
        sum(xs)

    inc, scr, tre, pip = [], [], [], []
    for r in range(rounds):
        base = r * reps * 3
        inc.append(_per_op(lambda i: incremental(base + i), reps))
        scr.append(_per_op(lambda i: scratch(base + i), max(1, reps // 50)))
        tre.append(_per_op(lambda i: tree_only(base + i), reps))
        pip.append(_per_op(lambda i: pipeline(base + i), reps))
    assert obs.value == sum(m.values())
    assert obs2.value == 2 * sum(m2.values())
    inc_us = statistics.median(inc) * 1e6
    scr_us = statistics.median(scr) * 1e6
    tree_us = statistics.median(tre) * 1e6
    pip_us = statistics.median(pip) * 1e6
    return {"n": n, "incremental_us": inc_us, "tree_only_us": tree_us, "scratch_sum_us": scr_us,
            "ratio": scr_us / inc_us, "map_sum_us": pip_us, "map_sum_ratio": scr_us / pip_us, "tree_ratio": scr_us / tree_us,
            "tree_depth": tree.depth(), "rounds": rounds}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--json")
    a = p.parse_args(argv)
    rows = [bench(n, a.rounds, a.reps) for n in a.sizes]
    print(f"{'keys':>9} {'incremental':>12} {'tree only':>10} {'sum(xs)':>10} "
          f"{'ratio':>8} {'tree ratio':>10} {'map+sum':>10} {'ratio':>7} {'depth':>6}")
    for r in rows:
        print(f"{r['n']:>9} {r['incremental_us']:>10.2f}µs {r['tree_only_us']:>8.2f}µs "
              f"{r['scratch_sum_us']:>8.0f}µs {r['ratio']:>7.0f}× {r['tree_ratio']:>9.0f}× "
              f"{r['map_sum_us']:>8.2f}µs {r['map_sum_ratio']:>6.0f}× "
              f"{r['tree_depth']:>6}")
    print("(incremental: set one key + stabilize + read the observed sum; map+sum: the same "
          "with a map(f) before the sum; medians of per-round means)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
