"""incr as LangGraph's backend: the LMDB ``BaseCache``, incremental nodes, LLM nodes in a graph.

Every test runs real compiled ``StateGraph``s and counts node executions (not only values);
results are compared with a plain LangGraph run of the same graph. No network anywhere.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections import Counter
from typing import TypedDict

import lmdb
import msgpack
import pytest

pytest.importorskip("langgraph")

from langgraph.cache.memory import InMemoryCache  # noqa: E402
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import CachePolicy  # noqa: E402

import incr  # noqa: E402
from incr import keys  # noqa: E402
from incr.adapters import langgraph as lg  # noqa: E402
from incr.adapters.langgraph import IncrCache, Incremental, incremental  # noqa: E402
from incr.store import HEADER, MAGIC, FORMAT, DamagedRecordWarning  # noqa: E402


class S(TypedDict, total=False):
    a: int
    b: int
    c: int
    da: int
    db: int
    total: int
    label: str


def build(ran: Counter, wrap=lambda f: f, policy=None):
    """A typical graph: two branches (a, b) joined, then a report that reads c and the sum.
    ``wrap`` is applied to every node function (identity: plain LangGraph)."""

    def double_a(state: S) -> dict:
        ran["double_a"] += 1
        return {"da": 2 * state["a"]}

    def double_b(state: S) -> dict:
        ran["double_b"] += 1
        return {"db": 2 * state["b"]}

    def add(state: S) -> dict:
        ran["add"] += 1
        return {"total": state["da"] + state["db"]}

    def report(state: S) -> dict:
        ran["report"] += 1
        return {"label": f"{state['c']}:{state['total']}"}

    g = StateGraph(S)
    for name, fn in [("double_a", double_a), ("double_b", double_b), ("add", add),
                     ("report", report)]:
        g.add_node(name, wrap(fn), cache_policy=policy)
    g.add_edge(START, "double_a")
    g.add_edge(START, "double_b")
    g.add_edge(["double_a", "double_b"], "add")
    g.add_edge("add", "report")
    g.add_edge("report", END)
    return g


INPUTS = [
    {"a": 1, "b": 2, "c": 0},
    {"a": 1, "b": 2, "c": 1},      # only report reads c
    {"a": 5, "b": 2, "c": 1},      # double_a, add, report
    {"a": 5, "b": 2, "c": 1},      # nothing
    {"a": 5, "b": 7, "c": 1},      # double_b, add, report
]
EXPECTED_RUNS = [
    {"double_a", "double_b", "add", "report"},
    {"report"},
    {"double_a", "add", "report"},
    set(),
    {"double_b", "add", "report"},
]


def plain_results():
    app = build(Counter()).compile()
    return [app.invoke(dict(x)) for x in INPUTS]


def test_module_examples_run():
    import doctest

    failed, attempted = doctest.testmod(lg)
    assert failed == 0 and attempted >= 5


# --- (2) incremental nodes ---------------------------------------------------------------------


def test_incremental_graph_equals_plain_and_reruns_only_readers():
    ran = Counter()
    app = build(ran, incremental).compile()
    expected = plain_results()
    rt = incr.Runtime()
    with rt:
        for x, want, runs in zip(INPUTS, expected, EXPECTED_RUNS):
            assert app.invoke(dict(x)) == want
            assert set(ran) == runs, (x, ran)
            assert all(v == 1 for v in ran.values())
            ran.clear()
            rt._check()


def test_early_cutoff_stops_at_an_unchanged_update():
    ran = Counter()

    @incremental
    def bucket(state):
        ran["bucket"] += 1
        return {"da": state["a"] // 10}

    @incremental
    def use(state):
        ran["use"] += 1
        return {"total": state["da"] + 1}

    g = StateGraph(S)
    g.add_node("bucket", bucket)
    g.add_node("use", use)
    g.add_edge(START, "bucket")
    g.add_edge("bucket", "use")
    g.add_edge("use", END)
    app = g.compile()
    with incr.Runtime():
        assert app.invoke({"a": 11})["total"] == 2
        assert app.invoke({"a": 13})["total"] == 2     # bucket reruns to 1 again: cut off
    assert ran == {"bucket": 2, "use": 1}


def test_reads_are_tracked_through_get_contains_and_iteration():
    ran = Counter()

    @incremental
    def optional(state):
        ran["optional"] += 1
        return {"label": f"{state.get('b', 'none')}/{'c' in state}"}

    g = StateGraph(S)
    g.add_node("optional", optional)
    g.add_edge(START, "optional")
    g.add_edge("optional", END)
    app = g.compile()
    with incr.Runtime():
        assert app.invoke({"a": 1})["label"] == "none/False"
        assert app.invoke({"a": 2})["label"] == "none/False"     # a is never read
        assert app.invoke({"a": 2, "b": 3})["label"] == "3/False"
        assert app.invoke({"a": 2, "b": 3, "c": 0})["label"] == "3/True"
    assert ran["optional"] == 3


def test_incremental_under_ainvoke_with_parallel_branches():
    ran = Counter()
    app = build(ran, incremental).compile()
    expected = plain_results()
    rt = incr.Runtime()

    async def main():
        out = []
        for x in INPUTS:
            out.append(await app.ainvoke(dict(x)))
            out.append(set(ran))
            ran.clear()
        return out

    with rt:
        got = asyncio.run(main())
    assert got[0::2] == expected
    assert got[1::2] == EXPECTED_RUNS
    rt._check()


def test_explicit_runtime_and_node_used_twice():
    ran = Counter()
    rt = incr.Runtime()
    inc = Incremental(rt)

    def double(state):
        ran["double"] += 1
        return {"da": 2 * state["a"]}

    def again(state):
        ran["again"] += 1
        return {"db": state["da"] + 1}

    g = StateGraph(S)
    g.add_node("one", inc.node(double))
    g.add_node("two", inc.node(again))
    g.add_edge(START, "one")
    g.add_edge("one", "two")
    g.add_edge("two", END)
    app = g.compile()                  # no `with rt:` needed: the nodes name their runtime
    assert app.invoke({"a": 1})["db"] == 3
    assert app.invoke({"a": 1})["db"] == 3
    assert ran == {"double": 1, "again": 1}


class PS(TypedDict, total=False):
    a: int
    b: int
    left: str
    right: str
    both: str


def test_async_nodes_under_ainvoke_run_parallel_branches_concurrently_and_incrementally():
    ran = Counter()
    state = {"waiting": 0, "event": None, "n": 2}

    async def gate(n):
        n = state["n"]
        # the first invoke's two branches must be in flight at once
        if state["event"] is None:
            state["event"] = asyncio.Event()
        state["waiting"] += 1
        if state["waiting"] >= n:
            state["event"].set()
        await asyncio.wait_for(state["event"].wait(), 5)

    @incremental
    async def left(s):
        ran["left"] += 1
        await gate(2)
        return {"left": f"L{s['a']}"}

    @incremental
    async def right(s):
        ran["right"] += 1
        await gate(2)
        return {"right": f"R{s['b']}"}

    @incremental
    async def join(s):
        ran["join"] += 1
        return {"both": s["left"] + s["right"]}

    g = StateGraph(PS)
    g.add_node("left", left)
    g.add_node("right", right)
    g.add_node("join", join)
    g.add_edge(START, "left")
    g.add_edge(START, "right")
    g.add_edge("left", "join")
    g.add_edge("right", "join")
    g.add_edge("join", END)
    app = g.compile()
    rt = incr.Runtime()

    async def main():
        with rt:
            first = await app.ainvoke({"a": 1, "b": 2})
            assert first["both"] == "L1R2" and ran == {"left": 1, "right": 1, "join": 1}
            ran.clear()
            state["waiting"], state["event"], state["n"] = 0, None, 1
            second = await app.ainvoke({"a": 5, "b": 2})        # only `a` changed
            assert second["both"] == "L5R2"
            assert ran == {"left": 1, "join": 1}                # right did not run
            rt._check()

    state["event"] = None
    asyncio.run(main())


def test_incremental_nodes_persist_across_runtimes(tmp_path):
    ran = Counter()
    # `ran` (a Counter) in the nodes' closure can be named only by its type: versions make
    # their identity exact, as incr asks of such cells
    app = build(ran, lambda f: incremental(f, version="1")).compile()
    store = str(tmp_path / "store")
    rt = incr.Runtime(store=store)
    with rt:
        app.invoke(dict(INPUTS[0]))
    rt.close()
    ran.clear()
    rt = incr.Runtime(store=store)
    with rt:
        assert app.invoke(dict(INPUTS[0])) == plain_results()[0]
        assert not ran                                   # every node taken from the store
        assert app.invoke(dict(INPUTS[1]))["label"] == "1:6"
    rt.close()
    assert set(ran) == {"report"}


# --- (1) the cache -----------------------------------------------------------------------------


def test_cache_on_a_compiled_graph_equals_plain_and_hits(tmp_path):
    ran = Counter()
    builder = build(ran, policy=CachePolicy())
    cache = IncrCache(tmp_path / "c").watch(builder)
    app = builder.compile(cache=cache)
    expected = plain_results()
    for x, want in zip(INPUTS, expected):
        assert app.invoke(dict(x)) == want
    # LangGraph keys on each node's whole input: the cache is reused only for an exact input
    assert ran == {"double_a": 4, "double_b": 4, "add": 4, "report": 4}
    ran.clear()
    for x, want in zip(INPUTS, expected):
        assert app.invoke(dict(x)) == want
    assert not ran                                       # everything from the store
    assert cache.counts["hits"] > 0 and cache.counts["damaged"] == 0
    cache.close()


def test_cache_key_includes_the_code_so_an_edit_is_a_miss(tmp_path):
    """LangGraph's own keys name the function only: an edited body gets the old result."""

    def make(k):
        def step(state: S) -> dict:
            return {"total": state["a"] * k}
        return step

    def graph(k, cache):
        g = StateGraph(S)
        g.add_node("step", make(k), cache_policy=CachePolicy())
        g.add_edge(START, "step")
        g.add_edge("step", END)
        if isinstance(cache, IncrCache):
            cache.watch(g)
        return g.compile(cache=cache)

    mem = InMemoryCache()
    assert graph(2, mem).invoke({"a": 3})["total"] == 6
    assert graph(10, mem).invoke({"a": 3})["total"] == 6     # stale: the edit is invisible

    ours = IncrCache(tmp_path / "c")
    assert graph(2, ours).invoke({"a": 3})["total"] == 6
    assert graph(10, ours).invoke({"a": 3})["total"] == 30   # a new code identity: a miss
    assert graph(2, ours).invoke({"a": 3})["total"] == 6     # the old entry is still there
    assert ours.counts["hits"] == 1
    ours.close()


def test_module_level_node_is_found_without_watch(tmp_path):
    cache = IncrCache(tmp_path / "c")
    g = StateGraph(S)
    g.add_node("node", module_level_node, cache_policy=CachePolicy())
    g.add_edge(START, "node")
    g.add_edge("node", END)
    app = g.compile(cache=cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        app.invoke({"a": 4})
        app.invoke({"a": 4})
    assert cache.counts["hits"] == 1
    cache.close()


CALLS = Counter()


def module_level_node(state: S) -> dict:
    CALLS["module_level_node"] += 1
    return {"total": state["a"] + 1}


def test_unknown_code_is_never_cached(tmp_path):
    cache = IncrCache(tmp_path / "c")
    ns = ("__pregel_ns_writes", "somewhere.<locals>.node", "node")
    with pytest.warns(incr.NotPersistableWarning, match="cannot find the code"):
        cache.set({(ns, "k"): ([("x", 1)], None)})
    assert cache.get([(ns, "k")]) == {}
    assert len(cache) == 0
    cache.close()


NS = ("__pregel_ns_writes", "tests.test_adapter_langgraph.module_level_node", "node")
NS2 = ("__pregel_ns_writes", "tests.test_adapter_langgraph.module_level_node", "other")


def _cache(tmp_path, **kw):
    return IncrCache(tmp_path / "c", nodes={"node": module_level_node,
                                            "other": module_level_node}, **kw)


def test_ttl_is_honoured(tmp_path, monkeypatch):
    cache = _cache(tmp_path)
    now = [1000.0]
    monkeypatch.setattr(lg.time, "time", lambda: now[0])
    cache.set({(NS, "short"): ([("x", 1)], 10), (NS, "forever"): ([("x", 2)], None)})
    assert cache.get([(NS, "short"), (NS, "forever")]) == {
        (NS, "short"): [("x", 1)], (NS, "forever"): [("x", 2)]}
    now[0] += 11
    assert cache.get([(NS, "short"), (NS, "forever")]) == {(NS, "forever"): [("x", 2)]}
    assert cache.counts["expired"] == 1 and len(cache) == 1      # the expired entry is gone
    cache.close()


def test_clear_namespaces_and_all(tmp_path):
    cache = _cache(tmp_path)
    cache.set({(NS, "k1"): ([("x", 1)], None), (NS, "k2"): ([("x", 2)], None),
               (NS2, "k1"): ([("y", 3)], None)})
    assert len(cache) == 3
    cache.clear([NS])
    assert cache.get([(NS, "k1"), (NS, "k2"), (NS2, "k1")]) == {(NS2, "k1"): [("y", 3)]}
    cache.clear()
    assert len(cache) == 0 and cache.get([(NS2, "k1")]) == {}
    cache.close()


def test_async_methods(tmp_path):
    cache = _cache(tmp_path)

    async def main():
        await cache.aset({(NS, "k"): ([("x", (1, 2.5, None))], None)})
        got = await cache.aget([(NS, "k"), (NS, "missing")])
        await cache.aclear([NS])
        return got, await cache.aget([(NS, "k")])

    got, after = asyncio.run(main())
    assert got == {(NS, "k"): [("x", (1, 2.5, None))]} and after == {}
    cache.close()


def test_cache_under_ainvoke(tmp_path):
    ran = Counter()
    builder = build(ran, policy=CachePolicy())
    cache = IncrCache(tmp_path / "c").watch(builder)
    app = builder.compile(cache=cache)
    expected = plain_results()

    async def main():
        return [await app.ainvoke(dict(x)) for x in INPUTS + INPUTS]

    assert asyncio.run(main()) == expected + expected
    assert ran == {"double_a": 4, "double_b": 4, "add": 4, "report": 4}
    cache.close()


def _raw_put(cache, key, raw):
    cache._env()
    with cache._store.env.begin(write=True, db=cache._db) as txn:
        txn.put(key, raw)


def _only_key(cache):
    cache._env()
    with cache._store.env.begin(db=cache._db) as txn:
        (k,) = [k for k, _ in txn.cursor()]
        return k, txn.get(k)


def test_damaged_record_is_a_miss_and_a_warning(tmp_path):
    cache = _cache(tmp_path)
    cache.set({(NS, "k"): ([("x", "value")], None)})
    k, raw = _only_key(cache)
    _raw_put(cache, k, raw[:-3] + b"XYZ")                     # bit rot in the payload
    with pytest.warns(DamagedRecordWarning, match="checksum"):
        assert cache.get([(NS, "k")]) == {}
    assert len(cache) == 0                                    # dropped: the node runs again
    cache.set({(NS, "k"): ([("x", "value")], None)})
    assert cache.get([(NS, "k")]) == {(NS, "k"): [("x", "value")]}
    cache.close()


def test_a_pickle_record_is_never_loaded(tmp_path, monkeypatch):
    import pickle

    loaded = []
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: loaded.append(a))
    cache = _cache(tmp_path, serde=JsonPlusSerializer(pickle_fallback=True))
    cache.set({(NS, "k"): ([("x", 1)], None)})
    k, _ = _only_key(cache)
    code = cache._code_of(NS)
    body = msgpack.packb({"ns": list(NS), "key": "k", "code": code, "enc": "pickle",
                          "val": pickle.dumps([["x", 1]]), "exp": None, "t": 0.0},
                         use_bin_type=True)
    _raw_put(cache, k, HEADER.pack(MAGIC, FORMAT, lg.KIND_LANGGRAPH, len(body),
                                   keys.checksum(body)) + body)
    with pytest.warns(DamagedRecordWarning, match="pickle"):
        assert cache.get([(NS, "k")]) == {}
    assert loaded == []
    cache.close()


class Opaque:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.v == self.v


def test_pickle_is_never_written(tmp_path):
    cache = _cache(tmp_path, serde=JsonPlusSerializer(pickle_fallback=True))
    with pytest.warns(incr.NotPersistableWarning, match="not cached"):
        cache.set({(NS, "k"): ([("x", Opaque(1))], None)})
    assert len(cache) == 0 and cache.counts["refused"] == 1
    cache.close()


def test_serde_values_round_trip_under_the_strict_allowlist(tmp_path):
    import datetime

    from langchain_core.messages import AIMessage

    cache = _cache(tmp_path)
    value = [("messages", [AIMessage(content="hi")]), ("when", datetime.date(2024, 1, 2))]
    cache.set({(NS, "k"): (value, None)})
    assert cache.get([(NS, "k")]) == {(NS, "k"): value}
    cache.close()


# --- (3) LLM nodes inside a graph --------------------------------------------------------------


class Q(TypedDict, total=False):
    question: str
    rows: list
    plan: str
    sql: str
    answer: int


def llm_graph(ran: Counter, gen_calls: list):
    @incr.validator(version="1")
    def upper_case(sql, plan):
        yield incr.ACK("syntax") if sql.startswith("SELECT") else incr.NACK(
            "syntax", counterexample={"sql": sql})

    @incr.llm(validators=[upper_case], budget=incr.Budget(max_attempts=4), version="p1")
    def write_sql(plan, *, previous=None, feedback=()):
        gen_calls.append([f.case for f in feedback])
        if previous is None:
            return "select count(*) from orders where paid"          # NACKed by upper_case
        if any(f.case == "refunds" for f in feedback):
            return "SELECT count(*) FROM orders WHERE paid AND NOT refunded"
        return "SELECT count(*) FROM orders WHERE paid"

    @incremental
    def plan(state):
        ran["plan"] += 1
        return {"plan": "count paid orders: " + state["question"]}

    @incremental
    def sql(state):
        ran["sql"] += 1
        return {"sql": write_sql(state["plan"])}

    @incremental
    def run(state):
        ran["run"] += 1
        s = write_sql(state["plan"])        # consumes the candidate (memo, no generation)
        rows = state["rows"]
        n = sum(1 for r in rows if r["paid"] and not ("refunded" in s and r["refunded"]))
        if "refunded" not in s and any(r["refunded"] for r in rows):
            raise incr.Reject(write_sql, state["plan"], case="refunds",
                              counterexample={"rows": rows, "got": n})
        return {"answer": n}

    g = StateGraph(Q)
    for name, fn in [("plan", plan), ("sql", sql), ("run", run)]:
        g.add_node(name, fn)
    g.add_edge(START, "plan")
    g.add_edge("plan", "sql")
    g.add_edge("sql", "run")
    g.add_edge("run", END)
    return g.compile(), write_sql


ROWS = [{"paid": True, "refunded": False}, {"paid": True, "refunded": False}]
ROWS_R = ROWS + [{"paid": True, "refunded": True}]


def test_validator_nack_regenerates_inside_the_node():
    ran, gen = Counter(), []
    app, write_sql = llm_graph(ran, gen)
    rt = incr.Runtime()
    with rt:
        out = app.invoke({"question": "q", "rows": ROWS})
        assert out["sql"] == "SELECT count(*) FROM orders WHERE paid" and out["answer"] == 2
        assert gen == [[], ["syntax"]]                       # NACK -> one more generation
        assert ran == {"plan": 1, "sql": 1, "run": 1}
        assert rt.state(write_sql, out["plan"]).status == "stable"
        ran.clear()
        app.invoke({"question": "q", "rows": ROWS})
        assert not ran and len(gen) == 2                     # PASS: nothing runs


def test_reject_downstream_reopens_only_the_llm_node():
    ran, gen = Counter(), []
    app, write_sql = llm_graph(ran, gen)
    rt = incr.Runtime()
    with rt:
        app.invoke({"question": "q", "rows": ROWS})
        ran.clear()
        out = app.invoke({"question": "q", "rows": ROWS_R})   # run rejects the candidate
        assert out["answer"] == 2
        assert gen[-1] == ["refunds", "syntax"] and len(gen) == 3   # one regeneration
        assert ran == {"run": 2}                  # plan and sql untouched; run, then re-run
        ran.clear()
        out = app.invoke({"question": "q", "rows": ROWS_R})
        assert out["sql"].endswith("NOT refunded")           # the host node catches up
        assert ran == {"sql": 1} and len(gen) == 3           # without calling the model


def test_rt_nack_between_invokes_reopens_only_that_node():
    ran, gen = Counter(), []
    app, write_sql = llm_graph(ran, gen)
    rt = incr.Runtime()
    with rt:
        out = app.invoke({"question": "q", "rows": ROWS})
        ran.clear()
        st = rt.state(write_sql, out["plan"])
        rt.nack(write_sql, out["plan"], revision=st.revision, case="refunds",
                counterexample={"rows": ROWS_R})
        assert rt.state(write_sql, out["plan"]).status == "invalid"
        out = app.invoke({"question": "q", "rows": ROWS})
        assert out["sql"].endswith("NOT refunded")
        assert len(gen) == 3 and gen[-1][0] == "refunds"
        assert ran == {"sql": 1, "run": 1}                   # plan is not re-run


# --- a worker killed mid-task ------------------------------------------------------------------


def hanging(fn):
    """``fn`` as an incremental node; ``report`` hangs (to be killed) when HANG is set."""
    def node(state):
        if fn.__name__ == "report" and os.environ.get("HANG"):
            open(os.environ["HANG"], "w").close()
            time.sleep(60)                       # killed here, mid-task
        return fn(state)
    node.__name__, node.__qualname__ = fn.__name__, fn.__qualname__
    return incremental(node, version="1")


def crash_graph(tmp_path, ran):
    builder = build(ran, hanging, policy=CachePolicy())
    cache = IncrCache(tmp_path / "cache").watch(builder)
    return builder.compile(cache=cache), cache


WORKER = """
import sys
from collections import Counter
from pathlib import Path
sys.path.insert(0, {path!r})
import incr
from {module} import crash_graph, INPUTS
app, cache = crash_graph(Path({tmp!r}), Counter())
with incr.Runtime(store={store!r}, durability="sync"):  # each finished node is durable
    app.invoke(dict(INPUTS[0]))
"""


def test_worker_killed_mid_task_leaves_the_store_sound(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    path = here if "." not in __name__ else os.path.dirname(here)
    store = str(tmp_path / "store")
    flag = str(tmp_path / "inside")
    script = WORKER.format(path=path, module=__name__, tmp=str(tmp_path), store=store)
    p = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, HANG=flag),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not os.path.exists(flag):
        assert p.poll() is None, p.stderr.read().decode()
        assert time.time() < deadline
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)                  # mid-task: report is running
    p.wait()
    ran = Counter()
    app, cache = crash_graph(tmp_path, ran)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt = incr.Runtime(store=store)
        with rt:
            assert app.invoke(dict(INPUTS[0])) == plain_results()[0]
            assert app.invoke(dict(INPUTS[1])) == plain_results()[1]
        rt.close()
    assert not [w for w in caught if issubclass(w.category, DamagedRecordWarning)]
    # the nodes that finished before the kill are not run again; report (killed) is, and
    # then only report again for the second input (only it reads c)
    assert ran == {"report": 2}
    cache.close()
