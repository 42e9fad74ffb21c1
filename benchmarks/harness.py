"""How one (workload, peer) pair is measured. The runner (``__main__``) calls this in a fresh
child process per pair, so that no peer's leftovers (memory, garbage, a broken state after a
RecursionError) can touch another's figures.

Time: build (untimed for the figure, but reported), then DIGEST_OPS ops whose last result is
fingerprinted (every peer must agree), then a warm-up that also sizes the batch: k ops per
repetition so that one repetition lasts about ``rep_seconds``. Each repetition times k ops
(``change`` + ``read``, fresh steps each) with ``time.perf_counter`` and the garbage collector
off, as ``timeit`` does; the figure is the median over repetitions of (repetition time / k).

Memory: ``tracemalloc`` counts the bytes allocated by ``build`` and still alive after a full
collection, divided by the number of instances.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
import tracemalloc
import traceback
from dataclasses import dataclass

from benchmarks import peers
from benchmarks.workloads import Workload, memory_args

DIGEST_OPS = 3


@dataclass(frozen=True)
class Config:
    rep_seconds: float      # target duration of one timed repetition
    min_reps: int
    max_reps: int
    max_seconds: float      # stop adding repetitions (past min_reps) after this long

    @classmethod
    def for_mode(cls, quick: bool) -> "Config":
        if quick:
            return cls(rep_seconds=0.01, min_reps=3, max_reps=5, max_seconds=0.15)
        return cls(rep_seconds=0.1, min_reps=7, max_reps=21, max_seconds=2.5)


def _ops(change, read, state, batch):
    result = None
    for step in batch:
        change(state, step)
        result = read(state)
    return result


def measure_time(mod, wl: Workload, cfg: Config, out: dict) -> dict:
    """Fill and return ``out``; ``out["phase"]`` says how far it got if something raises."""
    pc = time.perf_counter
    out["phase"] = "build"
    gc.collect()
    t0 = pc()
    state = mod.build(wl)
    out["build_s"] = pc() - t0
    change, read = mod.change, mod.read
    steps = wl.steps()

    out["phase"] = "first ops"
    result = _ops(change, read, state, steps.take(DIGEST_OPS))
    out["digest"] = wl.digest(result)

    out["phase"] = "warm-up"
    k = 1
    while True:
        batch = steps.take(k)
        t0 = pc()
        _ops(change, read, state, batch)
        dt = pc() - t0
        if dt >= cfg.rep_seconds / 2 or k >= 1 << 20:
            break
        k *= 2
    k = max(1, round(cfg.rep_seconds / (dt / k)))

    out["phase"] = "timed"
    times = []
    start = pc()
    while len(times) < cfg.max_reps:
        batch = steps.take(k)
        gc.collect()
        gc.disable()
        try:
            t0 = pc()
            _ops(change, read, state, batch)
            dt = pc() - t0
        finally:
            gc.enable()
        times.append(dt / k)
        if len(times) >= cfg.min_reps and pc() - start > cfg.max_seconds:
            break
    del out["phase"]
    out.update(
        status="ok",
        per_op_s=statistics.median(times),
        per_unit_s=statistics.median(times) / wl.units_per_op,
        min_op_s=min(times),
        ops_per_rep=k,
        reps=times,
    )
    return out


def measure_memory(mod, wl: Workload) -> dict:
    pc = time.perf_counter
    memory_args(wl.size)            # the caller's argument objects: made before counting
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = pc()
    state = mod.build(wl)
    build_s = pc() - t0
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    count = mod.read(state)
    if count != wl.size:
        raise AssertionError(f"{mod.NAME} built {count} instances, expected {wl.size}")
    per = (after - before) / wl.size
    return {"status": "ok", "build_s": build_s, "bytes": after - before,
            "per_unit": per, "digest": wl.digest(count)}


def run_one(kind: str, size: int, peer: str, quick: bool) -> dict:
    wl = Workload(kind, size)
    row = {"workload": kind, "size": size, "peer": peer, "unit": wl.unit,
           "units_per_op": wl.units_per_op}
    mod = peers.load(peer)
    if kind not in mod.SUPPORTS:
        row.update(status="skipped", error=f"{peer} does not implement {kind}")
        return row
    info = {}
    try:
        if kind == "memory":
            info = measure_memory(mod, wl)
        else:
            measure_time(mod, wl, Config.for_mode(quick), info)
    except RecursionError as e:
        info.update(status="failed", error=f"RecursionError during {info.get('phase', 'build')}: {e}")
    except Exception as e:  # a peer that breaks is reported as failed, not hidden
        info.update(status="failed",
                    error=f"{type(e).__name__} during {info.get('phase', 'build')}: {e}",
                    traceback=traceback.format_exc(limit=5))
    info.pop("phase", None)
    row.update(info)
    return row


def probe(peer: str, kind: str, size: int) -> dict:
    """Build ``kind[size]`` with ``peer``, apply one change, read: did it work?"""
    wl = Workload(kind, size)
    mod = peers.load(peer)
    try:
        state = mod.build(wl)
        for step in wl.steps().take(2):
            mod.change(state, step)
            mod.read(state)
    except RecursionError:
        return {"ok": False, "error": "RecursionError"}
    return {"ok": True}


def child_main(argv: list[str]) -> int:
    """``python -m benchmarks.harness run KIND SIZE PEER [quick]`` or ``probe PEER KIND SIZE``:
    prints one JSON object on the last line of stdout."""
    if argv[0] == "run":
        res = run_one(argv[1], int(argv[2]), argv[3], len(argv) > 4 and argv[4] == "quick")
    elif argv[0] == "probe":
        res = probe(argv[1], argv[2], int(argv[3]))
    else:
        raise SystemExit(f"unknown child command {argv[0]!r}")
    sys.stdout.write("\n" + json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))
