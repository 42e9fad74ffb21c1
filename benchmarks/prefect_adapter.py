"""Figures for docs/prefect.md: what incr buys a Prefect 3 flow.

    python -m benchmarks.prefect_adapter            # about five minutes
    python -m benchmarks.prefect_adapter --json     # the same figures as JSON on stdout

The flow fans out over W branches, ``load(i, size) -> clean -> feature(k)``, then one
``report`` over all branches: 3W + 1 tasks, called directly in the flow (sequentially). Every
body sleeps ``WORK`` seconds, a stand-in for the I/O or the model call that caching saves; so
the wall time is dominated by bodies that run plus Prefect's own per-task-run overhead, which
no variant avoids. It runs on Prefect's local ephemeral API (a temporary server and database,
under a temporary PREFECT_HOME).

Five variants, each on fresh storage, each through the same four runs:

1. cold: first run;
2. same: the same parameters again;
3. one branch: one branch's size changed (a flow parameter);
4. constant: a module-level constant that ``feature`` reads (``SCALE``) edited, as a code
   change between deployments would; "wrong" counts runs whose result differs from a
   from-scratch evaluation.

Variants: Prefect's default (no cache), ``INPUTS + TASK_SOURCE``, ``INCR_KEY``,
``incremental_task`` on one in-memory runtime (one long-lived process), and
``incremental_task`` on a store with a new runtime and new task objects for every run (a new
process per flow run). Also: the cost of one ``compute_key`` call for both policies.
The wall time reported is the fastest of ``--repeat`` repetitions, not the median: some flow
runs stall for about two seconds outside every task body, with Prefect's own policy as with
an in-memory incr runtime (``--json`` shows each repetition and the time spent outside
bodies), and the fastest run is the one that shows what the variant itself costs. Bias: sleeping bodies make caching
look as good as the work is slow; the counts of bodies executed do not depend on that. Never
asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path

WORK = 0.2                  # seconds per task body
WIDTH = 6                   # branches
SIZES = [40 + 7 * i for i in range(WIDTH)]   # seeded: deterministic sizes per branch
SCALE = 1.5                 # a module-level constant that `feature` reads
RAN: Counter = Counter()
IN_BODIES: Counter = Counter()   # seconds spent inside task bodies (a Counter, not a list:
                                 # a module-level list is keyed by value, see docs/prefect.md)


def _work() -> None:
    t0 = time.perf_counter()
    time.sleep(WORK)
    IN_BODIES["s"] += time.perf_counter() - t0


def _rows(i: int, size: int) -> list:
    return [float((i * 31 + j * 17) % 97) for j in range(size)]


def _clean(rows: list) -> list:
    return [r for r in rows if r % 5 != 0]


def _feature(rows: list, k: float) -> float:
    return round(sum(rows) * k * SCALE / max(len(rows), 1), 6)


def load(i: int, size: int) -> list:
    RAN["load"] += 1
    _work()
    return _rows(i, size)


def clean(rows: list) -> list:
    RAN["clean"] += 1
    _work()
    return _clean(rows)


def feature(rows: list, k: float) -> float:
    RAN["feature"] += 1
    _work()
    return _feature(rows, k)


def report(features: list) -> float:
    RAN["report"] += 1
    _work()
    return round(sum(features), 6)


def scratch(sizes: list, k: float) -> float:
    """The flow's result computed from scratch, without Prefect, incr or sleeping."""
    return round(sum(_feature(_clean(_rows(i, n)), k) for i, n in enumerate(sizes)), 6)


def make_flow(wrap):
    from prefect import flow

    t_load, t_clean, t_feature, t_report = (wrap(f) for f in (load, clean, feature, report))

    @flow(name="fan")
    def fan(sizes: list, k: float) -> float:
        return t_report([t_feature(t_clean(t_load(i, n)), k) for i, n in enumerate(sizes)])

    return fan


def variants(tmp: Path) -> dict:
    from incr.adapters.prefect import INCR_KEY, incremental_task
    from prefect import task
    from prefect.cache_policies import INPUTS, TASK_SOURCE

    import incr

    def policy(p, name):
        p = p.configure(key_storage=tmp / name)
        return lambda: make_flow(lambda f: task(f, cache_policy=p, result_serializer="json"))

    memory_rt = incr.Runtime()
    memory_flow = make_flow(lambda f: incremental_task(f, runtime=memory_rt))
    store = str(tmp / "store")

    def per_process():
        while per_process.open:              # the previous "process" ends
            per_process.open.pop().close()
        rt = incr.Runtime(store=store)
        per_process.open.append(rt)
        return make_flow(lambda f: incremental_task(f, runtime=rt))
    per_process.open = []

    return {
        "prefect default (no cache)": lambda: make_flow(task),
        "INPUTS + TASK_SOURCE": policy(INPUTS + TASK_SOURCE, "keys-ts"),
        "INCR_KEY": policy(INCR_KEY, "keys-incr"),
        "incremental_task, memory": lambda: memory_flow,
        "incremental_task, store, new process": per_process,
    }, per_process.open


def run_all(repeat: int = 3) -> dict:
    global SCALE
    tmp = Path(tempfile.mkdtemp(prefix="incr-prefect-bench-"))
    os.environ.update({"PREFECT_HOME": str(tmp / "home"), "PREFECT_LOGGING_LEVEL": "ERROR",
                       "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                       "PREFECT_LOGGING_TO_API_ENABLED": "false"})
    import prefect
    from prefect.testing.utilities import prefect_test_harness

    import incr

    out: dict = {"versions": {"python": platform.python_version(), "prefect": prefect.__version__,
                              "incr": incr.__version__},
                 "tasks_per_run": 3 * WIDTH + 1, "work_seconds": WORK, "repeat": repeat,
                 "rows": []}
    changed = list(SIZES)
    changed[2] += 5
    steps = [("cold", SIZES, 1.0, None), ("same", SIZES, 1.0, None),
             ("one branch", changed, 1.0, None), ("constant", changed, 1.0, 2.5)]
    try:
        with prefect_test_harness(server_startup_timeout=180):
            rows: dict = {}
            for rep in range(repeat):
                table, opened = variants(tmp / f"rep{rep}")
                for name, make in table.items():
                    SCALE = 1.5
                    runs = rows.setdefault(name, [[] for _ in steps])
                    for i, (step, sizes, k, scale) in enumerate(steps):
                        if scale is not None:
                            SCALE = scale
                        fl = make()
                        RAN.clear()
                        IN_BODIES.clear()
                        t0 = time.perf_counter()
                        got = fl(sizes, k)
                        secs = time.perf_counter() - t0
                        runs[i].append((sum(RAN.values()), secs, got != scratch(sizes, k),
                                        secs - IN_BODIES["s"]))
                    SCALE = 1.5
                for rt in opened:
                    rt.close()
            for name, runs in rows.items():
                out["rows"].append({"variant": name, "runs": [
                    {"step": step, "bodies": max(r[0] for r in rs),
                     "seconds": round(min(r[1] for r in rs), 2),
                     "seconds_each": [round(r[1], 2) for r in rs],
                     "outside_bodies_each": [round(r[3], 2) for r in rs],
                     "wrong": any(r[2] for r in rs)}
                    for (step, *_), rs in zip(steps, runs)]})
        out["compute_key_us"] = key_cost()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def key_cost(n: int = 2000) -> dict:
    from incr.adapters.prefect import INCR_KEY
    from prefect import task
    from prefect.cache_policies import INPUTS, TASK_SOURCE

    ctx = types.SimpleNamespace(task=task(feature))
    params = {"rows": [float(i) for i in range(1000)], "k": 1.0}
    res = {}
    for name, p in (("INPUTS + TASK_SOURCE", INPUTS + TASK_SOURCE), ("INCR_KEY", INCR_KEY)):
        p.compute_key(ctx, params, {})
        t0 = time.perf_counter()
        for _ in range(n):
            p.compute_key(ctx, params, {})
        res[name] = round((time.perf_counter() - t0) / n * 1e6, 1)
    return res


def render(out: dict) -> str:
    v = out["versions"]
    lines = [(f"python {v['python']}, prefect {v['prefect']}, incr {v['incr']}; "
              f"{out['tasks_per_run']} tasks per run, {out['work_seconds']} s per body; "
              f"bodies run per flow run, fastest wall time of {out['repeat']}"),
             "",
             "| variant | cold | same | one branch | constant edited |",
             "|---|---|---|---|---|"]
    for row in out["rows"]:
        cells = []
        for r in row["runs"]:
            cells.append(f"{r['bodies']} ran, {r['seconds']:.2f} s"
                         + (" **wrong**" if r["wrong"] else ""))
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    lines += ["", "compute_key, one call (1000-float list argument), microseconds: "
              + ", ".join(f"{k} {v}" for k, v in out["compute_key_us"].items())]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions (fastest wall time)")
    args = ap.parse_args(argv)
    out = run_all(args.repeat)
    print(json.dumps(out, indent=2) if args.json else render(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
