"""The cost of one cell against a shallow plain Python call, paired in one process:
``python -m benchmarks.profile_cell [--rounds 15]``.

Workloads (those of benchmarks/profile_regression.py: flat1, flat0, plain1, plain0, hit, lru):

  recomputed keyed cell   set x, then k(0) ... k(999) from top level, k(i) = x.get() + i:
                          every call recomputes one instance; per call
  recomputed zero-param   the same with 1,000 cells z_j() = x.get() + j; per call
  shallow plain call      p(i) = xv + i (and 1,000 functions z_j() = xv + j) in the same flat
                          loop: the baseline of the two above; per call
  no-op demand            f(7) of an up-to-date instance, ten calls a loop turn; per call
  lru_cache hit           the same loop on a functools.lru_cache'd function; per call

Each round times every workload once (CPU time, time.process_time, gc off), in an order
that alternates between rounds; the ratios are taken within a round (a round's cell over
the same round's plain call), so the machine's load drifting between rounds affects them
least. Prints the median and range of each over the rounds, as JSON with --json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_regression as pr  # noqa: E402

NAMES = ("flat1", "plain1", "flat0", "plain0", "hit", "lru")
OPS = {"flat1": 60, "plain1": 200, "flat0": 60, "plain0": 200, "hit": 6, "lru": 6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile_cell")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import incr
    built = {name: pr.setup(name) for name in NAMES}
    for name, (rt, op) in built.items():   # warm up
        with rt:
            for k in range(3):
                op(10**6 + k)
    ns = {name: [] for name in NAMES}
    k = 0
    for r in range(a.rounds):
        order = NAMES if r % 2 == 0 else NAMES[::-1]
        for name in order:
            rt, op = built[name]
            n = OPS[name]
            with rt:
                gc.collect()
                gc.disable()
                t0 = time.process_time()
                for _ in range(n):
                    op(k)
                    k += 1
                t1 = time.process_time()
                gc.enable()
            ns[name].append((t1 - t0) / n / pr.per_op_units(name) * 1e9)
    ratio = {
        "recomputed keyed cell / shallow call": [c / p for c, p in zip(ns["flat1"], ns["plain1"])],
        "recomputed zero-param cell / shallow call":
            [c / p for c, p in zip(ns["flat0"], ns["plain0"])],
        "no-op demand / lru_cache hit": [c / p for c, p in zip(ns["hit"], ns["lru"])],
    }
    out = {"incr": os.path.dirname(incr.__file__), "rounds": a.rounds,
           "ns_per_call": {n: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                           for n, v in ns.items()},
           "paired_ratio": {n: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                            for n, v in ratio.items()}}
    print(f"incr from {out['incr']}, {a.rounds} rounds, CPU time per call (median, range)")
    labels = {"flat1": "recomputed keyed cell", "plain1": "shallow plain call (1 arg)",
              "flat0": "recomputed zero-param cell", "plain0": "shallow plain call (0 args)",
              "hit": "no-op demand f(7)", "lru": "lru_cache hit"}
    for n in NAMES:
        s = out["ns_per_call"][n]
        print(f"  {labels[n]:<30} {s['median']:8.1f} ns  ({s['min']:.1f}-{s['max']:.1f})")
    for n, s in out["paired_ratio"].items():
        print(f"  {n:<42} {s['median']:5.2f}x  ({s['min']:.2f}-{s['max']:.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
