"""Concurrency: first runs in parallel, async against threads, and what async costs per cell.

    python -m benchmarks.concurrency            # prints the tables, writes the JSON
    python -m benchmarks.concurrency --quick    # fewer repetitions
    python -m benchmarks.concurrency --overhead-only   # part 3 only (no JSON written)

1. Cold fan-out: 16 independent LLM nodes, each a simulated model call of ``--latency``
   seconds (default 0.2), computed from nothing, four ways: observe + ``stabilize()`` with
   threads (``max_workers=16``); ``asyncio.gather`` in an async cell (async generators);
   ``incr.gather`` in a sync cell; and the serial engine (``max_workers=1``, which is what
   every cold run was before). Beside them, LangGraph's parallel branches (the same 16 calls
   as 16 nodes from START), if LangGraph is installed. Reported as wall time / one call.
2. A 3-level LLM graph (8 nodes, then 4 reading two each, then 1 reading the 4): wall time /
   the critical path (3 calls).
3. Overhead of an async cell against a sync cell per recomputed instance: a chain of ``--n``
   cells recomputed after one change, CPU time (``time.process_time``), interleaved paired
   rounds in one process.

Wall times are of this machine in this run (2 shared cores): the ratios are what to read.
No figure is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, TypedDict

import incr


def _sync_nodes(latency):
    @incr.llm(version="1")
    def node(i, *, previous=None, feedback=()):
        time.sleep(latency)
        return f"answer {i}"

    return node


def _async_nodes(latency):
    @incr.llm(version="1")
    async def anode(i, *, previous=None, feedback=()):
        await asyncio.sleep(latency)
        return f"answer {i}"

    return anode


def fanout(width, latency):
    out = {}
    node = _sync_nodes(latency)
    rt = incr.Runtime(max_workers=width)
    obs = [rt.observe(node, i) for i in range(width)]
    t = time.perf_counter()
    rt.stabilize()
    out["threads: observe + stabilize"] = time.perf_counter() - t
    assert [o.value for o in obs] == [f"answer {i}" for i in range(width)]

    node = _sync_nodes(latency)

    @incr.cell
    def top():
        return incr.gather(*[(lambda i=i: node(i)) for i in range(width)])

    rt = incr.Runtime(max_workers=width)
    with rt:
        t = time.perf_counter()
        top()
        out["threads: incr.gather in a cell"] = time.perf_counter() - t

    anode = _async_nodes(latency)

    @incr.cell
    async def atop():
        return await asyncio.gather(*[anode(i) for i in range(width)])

    async def main():
        with incr.Runtime():
            t = time.perf_counter()
            await atop()
            return time.perf_counter() - t

    out["async: asyncio.gather in an async cell"] = asyncio.run(main())

    node = _sync_nodes(latency)
    rt = incr.Runtime(max_workers=1)
    obs = [rt.observe(node, i) for i in range(width)]
    t = time.perf_counter()
    rt.stabilize()
    out["serial (max_workers=1)"] = time.perf_counter() - t

    lg = _langgraph_fanout(width, latency)
    if lg is not None:
        out["LangGraph: parallel branches (sync nodes)"] = lg
        out["LangGraph: parallel branches (async, ainvoke)"] = _langgraph_fanout(
            width, latency, use_async=True)
    return out


class _FanState(TypedDict):
    answers: Annotated[list, operator.add]


def _langgraph_fanout(width, latency, use_async=False):
    """LangGraph runs sync nodes in its default thread pool (min(32, cores + 4) threads:
    6 on 2 cores), async nodes as tasks."""
    try:
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return None

    g = StateGraph(_FanState)
    for i in range(width):
        if use_async:
            async def call(state, i=i):
                await asyncio.sleep(latency)
                return {"answers": [f"answer {i}"]}
        else:
            def call(state, i=i):
                time.sleep(latency)
                return {"answers": [f"answer {i}"]}
        g.add_node(f"n{i}", call)
        g.add_edge(START, f"n{i}")
        g.add_edge(f"n{i}", END)
    app = g.compile()
    t = time.perf_counter()
    if use_async:
        out = asyncio.run(app.ainvoke({"answers": []}))
    else:
        out = app.invoke({"answers": []})
    took = time.perf_counter() - t
    assert len(out["answers"]) == width
    return took


def levels(latency):
    """8 -> 4 -> 1 async nodes; each level's node reads two (or four) of the level below."""
    @incr.llm(version="1")
    async def leaf(i, *, previous=None, feedback=()):
        await asyncio.sleep(latency)
        return i

    @incr.cell
    async def pair(j):
        a, b = await asyncio.gather(leaf(2 * j), leaf(2 * j + 1))
        return await mid(j, a + b)

    @incr.llm(version="1")
    async def mid(j, s, *, previous=None, feedback=()):
        await asyncio.sleep(latency)
        return s

    @incr.llm(version="1")
    async def root(total, *, previous=None, feedback=()):
        await asyncio.sleep(latency)
        return total

    @incr.cell
    async def top():
        parts = await asyncio.gather(*[pair(j) for j in range(4)])
        return await root(sum(parts))

    async def main():
        with incr.Runtime():
            t = time.perf_counter()
            v = await top()
            took = time.perf_counter() - t
        assert v == sum(range(8))
        return took

    return asyncio.run(main())


def overhead(n, rounds):
    """CPU seconds per recomputed instance: a chain of n sync cells, and of n async cells,
    recomputed after one change (paired: the two alternate within each round)."""
    def build(kind):
        rt = incr.Runtime()
        x = rt.input("x", 0)
        if kind == "sync":
            @incr.cell
            def c(i):
                return x.get() + 1 if i == 0 else c(i - 1) + 1
        else:
            @incr.cell
            async def c(i):
                return x.get() + 1 if i == 0 else await c(i - 1) + 1
        return rt, x, c

    out = {"sync": [], "async": []}
    for kind in ("sync", "async"):      # warm both up
        rt, x, c = build(kind)
        with rt:
            c(n - 1)
    setups = {k: build(k) for k in ("sync", "async")}
    for k, (rt, x, c) in setups.items():
        with rt:
            c(n - 1)
    for r in range(rounds):
        for k in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
            rt, x, c = setups[k]
            with rt:
                x.set(r + 1)
                t = time.process_time()
                v = c(n - 1)
                out[k].append((time.process_time() - t) / n)
                assert v == r + 1 + n
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--overhead-only", action="store_true",
                    help="only the per-cell overhead (part 3); prints one JSON line")
    ap.add_argument("--rounds", type=int, default=None, help="overhead rounds (default 15)")
    ap.add_argument("--json", default=str(Path(__file__).with_name("results-concurrency.json")))
    a = ap.parse_args(argv)
    reps = 1 if a.quick else 3
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * a.n + 1000))
    rounds = a.rounds or (5 if a.quick else 15)
    if a.overhead_only:
        oh = overhead(a.n, rounds)
        print(json.dumps({"incr": str(Path(incr.__file__).parent), "n": a.n, "rounds": rounds,
                          "overhead_us": {k: v * 1e6 for k, v in oh.items()},
                          "async_over_sync": oh["async"] / oh["sync"]}))
        return oh
    fan = {}
    for _ in range(reps):
        for k, v in fanout(a.width, a.latency).items():
            fan.setdefault(k, []).append(v)
    fan = {k: statistics.median(v) for k, v in fan.items()}
    lv = statistics.median(levels(a.latency) for _ in range(reps))
    oh = overhead(a.n, rounds)
    print(f"cold fan-out: {a.width} LLM nodes x {a.latency:.2f} s (wall / one call)")
    for k, v in fan.items():
        print(f"  {k:<42} {v:6.2f} s   {v / a.latency:5.2f}x")
    print(f"3-level graph 8 -> 4 -> 1: {lv:.2f} s, {lv / (3 * a.latency):.2f}x the critical "
          f"path (3 calls)")
    print(f"per recomputed instance (CPU): sync {oh['sync'] * 1e6:.2f} us, async "
          f"{oh['async'] * 1e6:.2f} us: async / sync = {oh['async'] / oh['sync']:.2f}x")
    res = {"python": platform.python_version(), "machine": platform.machine(),
           "latency": a.latency, "width": a.width,
           "fanout_seconds": fan, "fanout_ratio": {k: v / a.latency for k, v in fan.items()},
           "levels_seconds": lv, "levels_ratio": lv / (3 * a.latency),
           "overhead_us": {k: v * 1e6 for k, v in oh.items()},
           "async_over_sync": oh["async"] / oh["sync"]}
    Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
