"""Stale cells on a cluster: CPU-bound independent cells computed in the driver and on 2-worker
Dask and Ray clusters started locally, measured in paired, alternating rounds.

    python -m benchmarks.executors            # 8 cells of about 0.35 s each, 5 rounds
    python -m benchmarks.executors --quick    # 4 cells of about 0.06 s, 2 rounds

Two cases, both ``rt.stabilize()`` of one observed ``total`` that sums ``work(i)`` over the
cells with ``work.map`` (``incr.gather``):

  cold   a fresh runtime, nothing computed: the first stabilization computes every cell.
         The engine ships first computations demanded through ``incr.gather``/``cell.map``
         (or observed directly) to the executor.
  warm   the same runtime, after a change of the input every cell reads: one stabilization
         recomputes all of them.

Method: the clusters are measured one at a time (Dask, then Ray), so that only one cluster's
processes are on the machine while it is measured. Its workers are warmed first (one
unmeasured stabilization: they import incr and the cell's function). Then each round runs the
driver and the cluster one after the other, in alternating order (ABBA), each with a fresh
runtime, and records for each the cold and the warm time. A cluster's speedup is the median
over rounds of the paired ratio (driver / cluster in the same round): drift in the machine's
load, which moved one run of the older, unpaired version of this benchmark from 1.37 s to
2.10 s, falls on both sides of each ratio. ``cold/warm`` is the median of the per-round ratios
of one runtime's cold and warm times.

Writes benchmarks/results-executors.json. Never asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def spin(n: int, seed: int, i: int) -> int:
    t = 0
    for k in range(n):
        t += (k * seed + i) % 7
    return t


def one_runtime(executor, cells: int, loops: int, seed_value: int) -> dict:
    """A fresh runtime: the cold stabilization (first computation), then a warm one (after a
    change of the input). Wall times (the work is on other processes)."""
    import incr

    rt = incr.Runtime(executor=executor)
    seed = rt.input("seed", seed_value)

    @incr.cell
    def work(i):
        return spin(loops, seed.get(), i), os.getpid()

    @incr.cell(local=True)
    def total():
        return sum(v for v, _ in work.map(range(cells)))

    out = {}
    with rt:
        obs = rt.observe(total)
        t = time.perf_counter()
        rt.stabilize()
        out["cold_s"] = time.perf_counter() - t
        out["cold_value"] = obs.value
        out["cold_processes"] = len({work(i)[1] for i in range(cells)})
        seed.set(seed_value + 1)
        t = time.perf_counter()
        rt.stabilize()
        out["warm_s"] = time.perf_counter() - t
        out["warm_value"] = obs.value
        out["warm_processes"] = len({work(i)[1] for i in range(cells)})
        stats = rt.stats()
    out["recomputed"] = stats.get("recomputed") if isinstance(stats, dict) else None
    rt.close()
    return out


def paired(name: str, make_executor, cells: int, loops: int, rounds: int) -> dict:
    """Rounds alternating driver and cluster (ABBA), each a fresh runtime."""
    one_runtime(make_executor(), cells, loops, 100)     # warm the workers (unmeasured)
    runs = {"driver": [], name: []}
    for r in range(rounds):
        order = [("driver", None), (name, make_executor)]
        if r % 2:
            order.reverse()
        for label, make in order:
            ex = make() if make is not None else None
            runs[label].append(one_runtime(ex, cells, loops, 2 + 2 * r))
        print(f"  round {r + 1}: driver cold {runs['driver'][-1]['cold_s']:5.2f} s "
              f"warm {runs['driver'][-1]['warm_s']:5.2f} s | {name} cold "
              f"{runs[name][-1]['cold_s']:5.2f} s warm {runs[name][-1]['warm_s']:5.2f} s",
              flush=True)
    return _summarize(name, runs)


def _summarize(name: str, runs: dict) -> dict:
    def med(label, key):
        return statistics.median(r[key] for r in runs[label])

    def ratios(f):
        return [f(d, c) for d, c in zip(runs["driver"], runs[name])]

    out = {
        "driver_cold_s": med("driver", "cold_s"), "driver_warm_s": med("driver", "warm_s"),
        "cluster_cold_s": med(name, "cold_s"), "cluster_warm_s": med(name, "warm_s"),
        # paired: within a round
        "speedup_warm": statistics.median(ratios(lambda d, c: d["warm_s"] / c["warm_s"])),
        "speedup_cold": statistics.median(ratios(lambda d, c: d["cold_s"] / c["cold_s"])),
        "cluster_cold_over_warm": statistics.median(r["cold_s"] / r["warm_s"]
                                                    for r in runs[name]),
        "driver_cold_over_warm": statistics.median(r["cold_s"] / r["warm_s"]
                                                   for r in runs["driver"]),
        "cluster_cold_over_warm_range": [min(r["cold_s"] / r["warm_s"] for r in runs[name]),
                                         max(r["cold_s"] / r["warm_s"] for r in runs[name])],
        "values_agree": all(d[k] == c[k] for d, c in zip(runs["driver"], runs[name])
                            for k in ("cold_value", "warm_value")),
        "cluster_processes": sorted({r[k] for r in runs[name]
                                     for k in ("cold_processes", "warm_processes")}),
        "runs": runs,
    }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.executors")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--only", nargs="*", choices=("dask", "ray"), default=["dask", "ray"])
    a = ap.parse_args(argv)
    cells, loops, rounds = (4, 400_000, 2) if a.quick else (8, 2_500_000, 5)
    if a.rounds:
        rounds = a.rounds
    rows = {}
    t = time.process_time()
    spin(loops, 3, 1)
    cell_s = time.process_time() - t
    print(f"{cells} independent CPU-bound cells of {cell_s:.2f} s (CPU), {rounds} paired rounds, "
          f"{os.cpu_count()} CPUs", flush=True)
    if "dask" in a.only:
        try:
            from distributed import Client, LocalCluster

            from incr.adapters.dask import DaskExecutor
        except ImportError:
            pass
        else:
            import distributed
            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client = Client(cluster)
            try:
                print("Dask", flush=True)
                rows["dask"] = paired("dask", lambda: DaskExecutor(client), cells, loops, rounds)
                rows["dask"]["version"] = distributed.__version__
            finally:
                client.close()
                cluster.close()
    if "ray" in a.only:
        try:
            import ray

            from incr.adapters.ray import RayExecutor
        except ImportError:
            pass
        else:
            ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False)
            try:
                print("Ray", flush=True)
                rows["ray"] = paired("ray", RayExecutor, cells, loops, rounds)
                rows["ray"]["version"] = ray.__version__
            finally:
                ray.shutdown()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    result = {"cells": cells, "loops": loops, "cell_cpu_s": cell_s, "rounds": rounds,
              "cpus": os.cpu_count(), "load_avg": load, "method": "paired, alternating ABBA "
              "rounds of driver and cluster, a fresh runtime each; cold = first stabilization "
              "(work.map in the observed cell), warm = stabilization after a change",
              "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / ("results-executors-quick.json" if a.quick else "results-executors.json")).write_text(
        json.dumps(result, indent=2) + "\n")
    print(f"\n{cells} cells of {cell_s:.2f} s, medians of {rounds} paired rounds")
    print(f"  {'':<6} {'driver warm':>11} {'cluster warm':>12} {'speedup':>8} | "
          f"{'driver cold':>11} {'cluster cold':>12} {'speedup':>8} | cold/warm (driver)  values")
    for name, r in rows.items():
        print(f"  {name:<6} {r['driver_warm_s']:9.2f} s {r['cluster_warm_s']:10.2f} s "
              f"{r['speedup_warm']:7.2f}x | {r['driver_cold_s']:9.2f} s "
              f"{r['cluster_cold_s']:10.2f} s {r['speedup_cold']:7.2f}x | "
              f"{r['cluster_cold_over_warm']:8.2f} ({r['driver_cold_over_warm']:.2f})  "
              f"{'agree' if r['values_agree'] else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
