"""Incremental collections: one key changed in a map of 10^5 / 10^6 keys.

Paired in one process, on CPU time (time.process_time), interleaved rounds: each round runs
every case for the same number of single-key changes, in turn, and the figure of a case is the
median of its per-round means. The cases:

- ``sum``: ``m.set(key, v)``, ``rt.stabilize()``, read the observed ``m.sum()``;
- ``map+sum``: the same with a ``map(f)`` (a plain function) before the sum;
- ``chain``: ``m.map(f).filter(p).map(g).sum()`` (map + filter + fold);
- ``SumFold`` / ``FoldTree``: the compiled fold structures alone (``set(key, v)``);
- peers, from scratch on a plain list / dict: ``sum(xs)`` and the chain as a comprehension
  pipeline (``sum(g(f(v)) for v in xs if p(f(v)))``, the same functions).

Also measured once per size: the cold build (``input_map`` + ``map(f)`` + ``sum`` + the first
stabilize, in instances per second) and the memory per key (tracemalloc, the whole
collection: input map, map node, fold). Prints a table; ``--json PATH`` writes the rows.

    python -m benchmarks.collections            # 10^5 and 10^6
    python -m benchmarks.collections --sizes 100000 --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc

import incr
from incr._collections import FoldTree, SumFold


def f(k, v):
    return v * 2


def p(k, v):
    return v % 3 != 0


def g(k, v):
    return v + 1


def _per_op(fn, start, reps):
    t0 = time.process_time()
    for i in range(start, start + reps):
        fn(i)
    return (time.process_time() - t0) / reps


def cold(n: int) -> dict:
    gc.collect()
    t0 = time.process_time()
    rt = incr.Runtime()
    m = incr.input_map(rt, f"cold{n}", {i: i for i in range(n)})
    o = rt.observe(m.map(f).sum())
    rt.stabilize()
    dt = time.process_time() - t0
    assert o.value == n * (n - 1)
    del o, m, rt
    gc.collect()
    # the same with an incr cell per key (one instance per key)
    nc = min(n, 100_000)

    @incr.cell
    def fc(k, v):
        return v * 2

    t0 = time.process_time()
    rt = incr.Runtime()
    m = incr.input_map(rt, f"coldc{n}", {i: i for i in range(nc)})
    o = rt.observe(m.map(fc).sum())
    rt.stabilize()
    dtc = time.process_time() - t0
    assert o.value == nc * (nc - 1)
    t0 = time.process_time()
    xs = {i: i for i in range(n)}
    s = sum(f(k, v) for k, v in xs.items())
    dtp = time.process_time() - t0
    assert s == n * (n - 1)
    return {"cold_build_s": dt, "cold_keys_per_s": n / dt, "cold_cells_n": nc,
            "cold_cell_instances_per_s": nc / dtc, "plain_build_s": dtp,
            "cold_overhead": dt / dtp}


def memory(n: int) -> dict:
    gc.collect()
    values = list(range(n))           # the values themselves are not the collection's cost
    tracemalloc.start()
    rt = incr.Runtime()
    m = incr.input_map(rt, f"mem{n}", {i: values[i] for i in range(n)})
    a = tracemalloc.get_traced_memory()[0]
    o = rt.observe(m.map(f).sum())
    rt.stabilize()
    b = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del o, m, rt
    return {"bytes_per_key_input": a / n, "bytes_per_key_map_sum": b / n,
            "bytes_per_key_total": b / n}


def bench(n: int, rounds: int, reps: int) -> dict:
    xs = list(range(n))
    step = 7919
    cases = {}

    rt1 = incr.Runtime()
    m1 = incr.input_map(rt1, f"s{n}", {i: i for i in range(n)})
    o1 = rt1.observe(m1.sum())
    rt1.stabilize()

    def c_sum(i):
        m1.set((i * step) % n, i)
        rt1.stabilize()
        o1.value
    cases["sum"] = c_sum

    rt2 = incr.Runtime()
    m2 = incr.input_map(rt2, f"m{n}", {i: i for i in range(n)})
    o2 = rt2.observe(m2.map(f).sum())
    rt2.stabilize()

    def c_map_sum(i):
        m2.set((i * step) % n, i)
        rt2.stabilize()
        o2.value
    cases["map+sum"] = c_map_sum

    rt3 = incr.Runtime()
    m3 = incr.input_map(rt3, f"c{n}", {i: i for i in range(n)})
    o3 = rt3.observe(m3.map(f).filter(p).map(g).sum())
    rt3.stabilize()

    def c_chain(i):
        m3.set((i * step) % n, i)
        rt3.stabilize()
        o3.value
    cases["chain"] = c_chain

    sf = SumFold()
    ft = FoldTree("sum")
    for i in range(n):
        sf.set(i, i)
        ft.set(i, i)

    def c_sumfold(i):
        sf.set((i * step) % n, i)
    cases["SumFold"] = c_sumfold

    def c_foldtree(i):
        ft.set((i * step) % n, i)
    cases["FoldTree"] = c_foldtree

    def c_scratch_sum(i):
        xs[(i * step) % n] = i
        sum(xs)
    cases["sum(xs)"] = c_scratch_sum

    ys = list(range(n))

    def c_scratch_chain(i):
        ys[(i * step) % n] = i
        sum([g(k, f(k, v)) for k, v in enumerate(ys) if p(k, f(k, v))])
    cases["chain from scratch"] = c_scratch_chain

    slow = {"sum(xs)", "chain from scratch"}
    res: dict = {k: [] for k in cases}
    for r in range(rounds):
        base = r * reps
        for name, fn in cases.items():
            k = max(1, reps // (200 if name == "chain from scratch" else 50)) if name in slow else reps
            res[name].append(_per_op(fn, base, k))
    assert o1.value == sum(m1.values())
    assert o2.value == 2 * sum(m2.values())
    assert o3.value == sum(2 * v + 1 for v in m3.values() if (2 * v) % 3 != 0)
    us = {k: statistics.median(v) * 1e6 for k, v in res.items()}
    row = {"n": n, "rounds": rounds, "us": us,
           "sum_ratio": us["sum(xs)"] / us["sum"],
           "map_sum_ratio": us["sum(xs)"] / us["map+sum"],
           "chain_ratio": us["chain from scratch"] / us["chain"],
           "sumfold_ratio": us["sum(xs)"] / us["SumFold"],
           "foldtree_ratio": us["sum(xs)"] / us["FoldTree"],
           "tree_depth": ft.depth()}
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold build and memory")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = []
    for n in a.sizes:
        row = bench(n, a.rounds, a.reps)
        gc.collect()
        if not a.no_cold:
            row.update(cold(n))
            gc.collect()
            row.update(memory(n))
        rows.append(row)
    for r in rows:
        us = r["us"]
        print(f"n = {r['n']:,} (medians of {r['rounds']} paired rounds, CPU time per change)")
        for name, v in us.items():
            print(f"  {name:<20} {v:>10.2f} µs")
        print(f"  ratios vs from scratch: sum {r['sum_ratio']:.0f}×, map+sum "
              f"{r['map_sum_ratio']:.0f}×, chain {r['chain_ratio']:.0f}×, SumFold alone "
              f"{r['sumfold_ratio']:.0f}×, FoldTree alone {r['foldtree_ratio']:.0f}× "
              f"(treap depth {r['tree_depth']})")
        if "cold_keys_per_s" in r:
            print(f"  cold build (input_map + map(f) + sum + first stabilize): "
                  f"{r['cold_keys_per_s'] / 1e3:,.0f} k keys/s ({r['cold_overhead']:.1f}× the "
                  f"plain dict + sum(f(k, v) ...)); with an incr cell per key at "
                  f"{r['cold_cells_n']:,}: {r['cold_cell_instances_per_s'] / 1e3:,.0f} k "
                  f"instances/s; memory "
                  f"{r['bytes_per_key_total']:.0f} B/key (input map alone "
                  f"{r['bytes_per_key_input']:.0f} B/key)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
