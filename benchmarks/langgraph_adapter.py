"""LangGraph adapter: what a second invoke with one state field changed costs.

    python -m benchmarks.langgraph_adapter            # prints the table, writes the JSON
    python -m benchmarks.langgraph_adapter --quick    # fewer repetitions

A typical six-node app (retrieve -> rank -> draft -> restyle, plus title and greet, which read
other fields) whose nodes stand for model or tool calls: each sleeps ``--latency`` ms (default
20) and counts its executions. Four ways to run the same compiled graph:

- plain LangGraph;
- LangGraph's ``InMemoryCache`` with ``CachePolicy()`` on every node;
- ``IncrCache`` (incr's LMDB store) with ``CachePolicy()`` on every node;
- incr incremental nodes (``@incremental``) on an in-memory ``incr.Runtime``.

For each: a first invoke, the same input again, then one field (``style``) changed. We count
node executions and time each invoke (median of ``--repeat`` fresh setups). The same runs with
``--latency 0`` give the bookkeeping overhead per invoke. Timings are of this machine, in this
run; the table never asserts a time. ``--json PATH`` also writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TypedDict

import langgraph
from langgraph.cache.memory import InMemoryCache
from langgraph.graph import END, START, StateGraph
from langgraph.types import CachePolicy

import incr
from incr.adapters.langgraph import IncrCache, incremental

HERE = Path(__file__).resolve().parent


class State(TypedDict, total=False):
    question: str
    corpus: list
    style: str
    user: str
    hits: list
    ranked: list
    draft: str
    answer: str
    title: str
    greeting: str


def make_nodes(ran: Counter, latency: float):
    def work(name):
        ran[name] += 1
        if latency:
            time.sleep(latency)

    def retrieve(state: State) -> dict:
        work("retrieve")
        words = set(state["question"].split())
        return {"hits": [d for d in state["corpus"] if words & set(d.split())]}

    def rank(state: State) -> dict:
        work("rank")
        return {"ranked": sorted(state["hits"], key=len)[:3]}

    def draft(state: State) -> dict:
        work("draft")
        return {"draft": f"{state['question']}: " + " / ".join(state["ranked"])}

    def restyle(state: State) -> dict:
        work("restyle")
        d = state["draft"]
        return {"answer": d.upper() if state["style"] == "loud" else d}

    def title(state: State) -> dict:
        work("title")
        return {"title": state["question"].title()}

    def greet(state: State) -> dict:
        work("greet")
        return {"greeting": f"Hello {state['user']}"}

    return [retrieve, rank, draft, restyle, title, greet]


def build(ran: Counter, latency: float, wrap=lambda f: f, policy=None) -> StateGraph:
    g = StateGraph(State)
    for fn in make_nodes(ran, latency):
        g.add_node(fn.__name__, wrap(fn), cache_policy=policy)
    g.add_edge(START, "retrieve")
    g.add_edge("retrieve", "rank")
    g.add_edge("rank", "draft")
    g.add_edge("draft", "restyle")
    g.add_edge(START, "title")
    g.add_edge(START, "greet")
    g.add_edge(["restyle", "title", "greet"], END)
    return g


CORPUS = [f"doc {i} about {'orders refunds payments shipping'.split()[i % 4]} number {i}"
          for i in range(200)]
FIRST = {"question": "refunds of paid orders", "corpus": CORPUS, "style": "plain",
         "user": "ada"}
CHANGED = dict(FIRST, style="loud")


def one(way: str, latency: float) -> dict:
    ran: Counter = Counter()
    ctx = None
    cache = None
    if way == "plain":
        app = build(ran, latency).compile()
    elif way == "InMemoryCache":
        app = build(ran, latency, policy=CachePolicy()).compile(cache=InMemoryCache())
    elif way == "IncrCache":
        b = build(ran, latency, policy=CachePolicy())
        cache = IncrCache(tempfile.mkdtemp(prefix="incr-lg-")).watch(b)
        app = b.compile(cache=cache)
    else:
        app = build(ran, latency, wrap=incremental).compile()
        ctx = incr.Runtime()
    out = {}
    results = []
    for step, state in [("first", FIRST), ("same", FIRST), ("one field", CHANGED)]:
        ran.clear()
        t = time.perf_counter()
        if ctx is not None:
            with ctx:
                results.append(app.invoke(dict(state)))
        else:
            results.append(app.invoke(dict(state)))
        out[step] = {"seconds": time.perf_counter() - t, "executions": sum(ran.values()),
                     "nodes": sorted(ran)}
    if cache is not None:
        cache.close()
    out["results"] = results
    return out


WAYS = ["plain", "InMemoryCache", "IncrCache", "incremental"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=20.0, help="ms per node execution")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args(argv)
    repeat = 2 if a.quick else a.repeat
    report = {"versions": {"python": platform.python_version(), "incr": incr.__version__,
                           "langgraph": getattr(langgraph, "__version__", None) or
                           _dist_version("langgraph")},
              "latency_ms": a.latency, "repeat": repeat, "rows": []}
    reference = one("plain", 0)["results"]
    for latency in (a.latency / 1000, 0.0):
        for way in WAYS:
            runs = [one(way, latency) for _ in range(repeat)]
            assert all(r["results"] == reference for r in runs), f"{way}: results differ"
            row = {"way": way, "latency_ms": latency * 1000}
            for step in ("first", "same", "one field"):
                row[step] = {
                    "executions": runs[0][step]["executions"],
                    "nodes": runs[0][step]["nodes"],
                    "ms": 1000 * statistics.median(r[step]["seconds"] for r in runs)}
            report["rows"].append(row)
    print(f"versions: {report['versions']}; median of {repeat}; node latency "
          f"{a.latency:g} ms (rows at 0 ms: bookkeeping only)")
    print(f"{'way':<15}{'latency':>8}  {'first':>16}  {'same input':>16}  "
          f"{'one field changed':>18}  {'vs. plain':>9}")
    base = {}
    for row in report["rows"]:
        if row["way"] == "plain":
            base[row["latency_ms"]] = row["one field"]["ms"]
        cells = [f"{row[s]['executions']} runs {row[s]['ms']:6.1f} ms"
                 for s in ("first", "same", "one field")]
        vs = base[row["latency_ms"]] / row["one field"]["ms"]
        print(f"{row['way']:<15}{row['latency_ms']:>6.0f}ms  {cells[0]:>16}  {cells[1]:>16}  "
              f"{cells[2]:>18}  {vs:>8.1f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return report


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main(sys.argv[1:])
