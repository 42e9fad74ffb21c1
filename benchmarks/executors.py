"""Stale cells on a cluster: one stabilization of CPU-bound independent cells, run in the
driver and on 2-worker Dask and Ray clusters started locally, in the same run.

    python -m benchmarks.executors            # 8 cells of about 0.3 s each, 5 repetitions
    python -m benchmarks.executors --quick    # 4 cells of about 0.1 s

Each repetition changes the input every cell reads and times ``rt.stabilize()``; the table
gives the median and the speedup over the driver. Writes benchmarks/results-executors.json.
Never asserts a time.
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


def measure(executor, cells: int, loops: int, reps: int) -> dict:
    import incr

    rt = incr.Runtime(executor=executor)
    seed = rt.input("seed", 1)

    @incr.cell
    def work(i):
        return spin(loops, seed.get(), i), os.getpid()

    @incr.cell(local=True)
    def total():
        return sum(work(i)[0] for i in range(cells))

    times, value, pids = [], None, set()
    with rt:
        obs = rt.observe(total)
        for r in range(reps):
            seed.set(r + 2)
            t = time.perf_counter()
            rt.stabilize()
            times.append(time.perf_counter() - t)
            value = obs.value
            pids = {work(i)[1] for i in range(cells)}
    return {"median_s": statistics.median(times), "times": times, "value": value,
            "processes": len(pids)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.executors")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    cells, loops, reps = (4, 400_000, 2) if a.quick else (8, 2_500_000, 5)
    rows = {}
    rows["driver"] = measure(None, cells, loops, reps)
    try:
        from distributed import Client, LocalCluster

        from incr.adapters.dask import DaskExecutor

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
        try:
            measure(DaskExecutor(client), cells, loops, 1)   # warm the workers once, as for Ray
            rows["dask"] = measure(DaskExecutor(client), cells, loops, reps)
            import distributed
            rows["dask"]["version"] = distributed.__version__
        finally:
            client.close()
            cluster.close()
    except ImportError:
        pass
    try:
        import ray

        from incr.adapters.ray import RayExecutor

        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
        try:
            measure(RayExecutor(), cells, loops, 1)      # warm the worker pool once
            rows["ray"] = measure(RayExecutor(), cells, loops, reps)
            rows["ray"]["version"] = ray.__version__
        finally:
            ray.shutdown()
    except ImportError:
        pass
    base = rows["driver"]["median_s"]
    result = {"cells": cells, "loops": loops, "reps": reps, "cpus": os.cpu_count(),
              "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    (HERE / ("results-executors-quick.json" if a.quick else "results-executors.json")).write_text(
        json.dumps(result, indent=2) + "\n")
    print(f"{cells} independent CPU-bound cells, one stabilization after a change, "
          f"median of {reps} ({os.cpu_count()} CPUs)")
    for name, r in rows.items():
        agree = "same value" if r["value"] == rows["driver"]["value"] else "DIFFERENT VALUE"
        print(f"  {name:<7} {r['median_s']:7.2f} s   speedup {base / r['median_s']:4.2f}x   "
              f"{r['processes']} process(es)   {agree}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
