"""Incremental collections: what recomputes after one key changes, and the operators' values."""

from __future__ import annotations

import heapq
import random
import subprocess
import sys
import textwrap

import pytest

import incr
from incr._collections import FoldTree


def test_map_runs_only_the_changed_key_and_the_fold_follows():
    rt = incr.Runtime()
    docs = incr.input_map(rt, "docs", {f"d{i}": "x" * i for i in range(50)})
    ran = []

    @incr.cell
    def summarize(key, text):
        ran.append(key)
        return len(text)

    summaries = docs.map(summarize)
    total = summaries.sum()
    obs = rt.observe(total)
    rt.stabilize()
    assert obs.value == sum(range(50))
    assert sorted(ran) == sorted(f"d{i}" for i in range(50))
    ran.clear()

    docs.set("d7", "y" * 100)
    report = rt.stabilize()
    assert ran == ["d7"]                               # one map instance, no other
    assert obs.value == sum(range(50)) - 7 + 100
    assert [r for r in report.recomputed if r.startswith("summarize")] == \
        ["summarize('d7', '" + "y" * 100 + "')"]
    assert summaries.last_changes == ["d7"]
    assert "docs.map(summarize)() changed" in rt.explain(total)
    rt._check()

    ran.clear()
    docs.delete("d3")                                   # withdrawn: no instance runs
    rt.stabilize()
    assert ran == []
    assert "d3" not in summaries
    assert obs.value == sum(range(50)) - 7 + 100 - 3

    ran.clear()
    docs.update({"d1": "zz", "new": "abc"}, delete=["d2"])   # one revision
    rev = rt.revision
    rt.stabilize()
    assert sorted(ran) == ["d1", "new"]
    assert rt.revision == rev
    assert obs.value == sum(range(50)) - 7 + 100 - 3 - 1 + 2 + 3 - 2


def test_same_value_changes_nothing_and_cutoff_stops_at_the_fold():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": 1, "b": 2})
    seen = []

    @incr.cell
    def report():
        seen.append(1)
        return m.map(lambda k, v: v % 2).sum()()

    parity = m.map(lambda k, v: v % 2)
    s = parity.sum()

    @incr.cell
    def downstream():
        seen.append(s())
        return s()

    rt.observe(downstream)
    rt.stabilize()
    rev = rt.revision
    m.set("a", 1)                       # the same value: no revision
    assert rt.revision == rev
    m.set("a", 3)                       # parity unchanged: map output unchanged, cut off
    seen.clear()
    r = rt.stabilize()
    assert seen == []
    assert "downstream()" not in r.recomputed


def test_llm_node_per_document():
    rt = incr.Runtime()
    calls = []

    @incr.llm(version="1")
    def summary(key, text, *, previous=None, feedback=()):
        calls.append(key)
        return text.upper()

    docs = incr.input_map(rt, "docs", {"a": "one", "b": "two"})
    sums = docs.map(summary)
    index = sums.reduce(lambda a, b: a + "|" + b, "")
    o = rt.observe(index)
    rt.stabilize()
    assert o.value == "ONE|TWO"
    calls.clear()
    docs.set("b", "three")
    rt.stabilize()
    assert calls == ["b"] and o.value == "ONE|THREE"
    # the old value's node and a deleted document's node leave the LLM bookkeeping too
    assert sorted(i.args for i in rt.llm.nodes) == [("a", "one"), ("b", "three")]
    docs.delete("a")
    rt.stabilize()
    assert o.value == "THREE" and [i.args for i in rt.llm.nodes] == [("b", "three")]
    rt._check()


def test_instance_reads_other_inputs_per_key():
    rt = incr.Runtime()
    scale = rt.input("scale", 1)
    other = rt.input("other", 10)
    m = incr.input_map(rt, "m", {i: i for i in range(20)})
    ran = []

    @incr.cell
    def f(k, v):
        ran.append(k)
        return v * (scale.get() if k < 5 else 1)

    total = m.map(f).sum()
    o = rt.observe(total)
    rt.stabilize()
    ran.clear()
    scale.set(2)
    rt.stabilize()
    assert sorted(ran) == [0, 1, 2, 3, 4]          # only the instances that read scale
    assert o.value == sum(range(20)) + sum(range(5))
    ran.clear()
    other.set(11)
    rt.stabilize()
    assert ran == []


def test_plain_function_reading_an_input_reruns_every_key():
    rt = incr.Runtime()
    scale = rt.input("scale", 1)
    m = incr.input_map(rt, "m", {i: i for i in range(5)})
    total = m.map(lambda k, v: v * scale.get()).sum()
    o = rt.observe(total)
    rt.stabilize()
    scale.set(3)
    rt.stabilize()
    assert o.value == 3 * sum(range(5))


def test_input_map_per_key_read_inside_a_cell():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": 1, "b": 2})
    ran = []

    @incr.cell
    def read_a():
        ran.append(1)
        return m["a"] + 1

    with rt:
        assert read_a() == 2
        m.set("b", 5)
        assert read_a() == 2 and ran == [1]       # b changed: a's reader did not run
        m.set("a", 7)
        assert read_a() == 8 and ran == [1, 1]
        m.delete("a")
        with pytest.raises(KeyError):
            read_a()


def test_errors():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": 1})
    with pytest.raises(ValueError):
        incr.input_map(rt, "m")
    with pytest.raises(TypeError):
        m.set(object(), 1)
    with pytest.raises(TypeError):
        m.set(3, 1)                      # one kind of key per map
    with pytest.raises(KeyError):
        m.delete("zz")

    @incr.cell
    def bad():
        m.set("b", 2)

    with rt, pytest.raises(incr.ReentrancyError):
        bad()
    assert "b" not in m
    clash = m.map_keys(lambda k: "same")
    m.set("c", 3)
    with pytest.raises(ValueError, match="both map to"):
        clash()


@pytest.mark.parametrize("kind", ["sum", "min", "max", "top_k", "reduce"])
def test_fold_tree_random(kind):
    rnd = random.Random(kind)
    op = (lambda a, b: a + b) if kind == "reduce" else None
    t = FoldTree(kind, op=op, identity="" if kind == "reduce" else None, k=3)
    d = {}
    for _ in range(2000):
        k = rnd.randrange(300)
        if rnd.random() < 0.3:
            assert t.delete(k) == (k in d)
            d.pop(k, None)
        else:
            v = rnd.randrange(40)
            v = str(v) if kind == "reduce" else v
            t.set(k, v)
            d[k] = v
    t._check()
    items = sorted(d.items())
    want = {
        "sum": lambda: sum(v for _, v in items),
        "min": lambda: min(d.values(), default=None),
        "max": lambda: max(d.values(), default=None),
        "top_k": lambda: tuple(heapq.nlargest(3, items, key=lambda kv: kv[1])),
        "reduce": lambda: "".join(v for _, v in items),
    }[kind]()
    assert t.value == want
    assert t.items() == items
    assert t.depth() < 40


def test_persistence_of_map_instances(tmp_path):
    # an LLM-like cell per key is stored; a new process rebuilds the collection and takes
    # every instance from the store (the function runs for no key)
    prog = textwrap.dedent(f"""
        import sys, incr
        rt = incr.Runtime(store={str(tmp_path / "store")!r})
        ran = []
        @incr.cell(version="1")
        def summarize(key, text):
            ran.append(key)
            return text.upper()
        docs = incr.input_map(rt, "docs", {{"a": "x", "b": "y", "c": sys.argv[1]}})
        total = docs.map(summarize).reduce(lambda a, b: a + b, "")
        print(total(), sorted(ran))
        rt.close()
    """)
    def run(arg):
        out = subprocess.run([sys.executable, "-c", prog, arg], capture_output=True, text=True,
                             check=True)
        return out.stdout.strip()
    assert run("z") == "XYZ ['a', 'b', 'c']"
    assert run("z") == "XYZ []"
    assert run("w") == "XYW ['c']"


def test_persistence_of_plain_function_map_instances(tmp_path):
    # map(plain function) on a runtime with a store: each key's result is stored under the
    # identity a cell of the function would have; a new process runs it for no unchanged key,
    # and a function whose code changed runs again for every key
    def prog(body):
        return textwrap.dedent(f"""
            import sys, warnings, incr
            warnings.simplefilter("error")            # nothing here is refused by the store
            rt = incr.Runtime(store={str(tmp_path / "store")!r})
            ran = []
            def shout(key, text):
                ran.append(key)
                return {body}
            docs = incr.input_map(rt, "docs", {{"a": "x", "b": "y", "c": sys.argv[1]}})
            total = docs.map(shout).reduce(lambda a, b: a + b, "")
            lens = docs.map(lambda k, t: len(t)).sum()
            print(total(), lens(), sorted(ran))
            rt.close()
        """)

    def run(arg, body="text.upper()"):
        out = subprocess.run([sys.executable, "-c", prog(body), arg], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()
    assert run("z") == "XYZ 3 ['a', 'b', 'c']"
    assert run("z") == "XYZ 3 []"
    assert run("w") == "XYW 3 ['c']"
    assert run("w", "text.upper() + '!'") == "X!Y!W! 3 ['a', 'b', 'c']"


def test_plain_function_map_with_a_store_tracks_reads_per_key(tmp_path):
    # with a store a plain function's map is a map of a cell of it: what each key's run
    # reads is tracked per key (a change re-runs the keys that read it, not every key)
    rt = incr.Runtime(store=tmp_path / "s")
    scale = rt.input("scale", 1)
    m = incr.input_map(rt, "m", {i: i for i in range(10)})
    ran = []

    def f(k, v):
        ran.append(k)
        return v * (scale.get() if k < 3 else 1)

    o = rt.observe(m.map(f).sum())
    rt.stabilize()
    assert sorted(ran) == list(range(10)) and o.value == 45
    ran.clear()
    scale.set(2)
    rt.stabilize()
    assert sorted(ran) == [0, 1, 2] and o.value == 45 + 3
    assert m.map(f)._fn.fn is m.map(f)._fn.fn       # one cell per function
    rt.close()


def test_docs_collections_examples_run():
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "docs" / "collections.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "docs/collections.md", "exec"), {})  # noqa: S102 - our docs


def test_sum_fold_int_path_and_tree_fallback():
    # the same random operations on SumFold (running total while every value is an int) and on
    # FoldTree("sum"); counts say which path ran
    from incr._collections import SumFold
    rnd = random.Random(5)
    s, t, d = SumFold(0), FoldTree("sum", identity=0), {}
    changes = 0
    for _ in range(3000):
        k = rnd.randrange(200)
        if rnd.random() < 0.3:
            assert s.delete(k) == t.delete(k) == (k in d)
            changes += k in d
            d.pop(k, None)
        else:
            v = rnd.choice([rnd.randrange(-50, 50), True, 2 ** 70 + rnd.randrange(9)])
            s.set(k, v)
            t.set(k, v)
            d[k] = v
            changes += 1
        assert s.value == t.value == sum(d.values())
    assert s.mode == "int" and s.n_tree == 0 and s.n_delta == changes
    assert sorted(s.keys()) == sorted(d) and len(s) == len(d)
    s._check()
    s.set(7, 0.5)                          # the first float: everything moves to a tree once
    d[7] = 0.5
    assert s.mode == "tree" and s.n_tree == 1
    s.set(8, 3)
    d[8] = 3
    assert s.value == sum(d[k] for k in sorted(d))
    assert s.keys() == sorted(d)
    s._check()
    assert SumFold("empty").value == "empty"


def test_collection_sum_float_values_after_ints():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {i: i for i in range(10)})
    total = m.sum()
    o = rt.observe(total)
    rt.stabilize()
    assert o.value == 45 and total._tree.mode == "int"
    m.set(3, 0.25)
    rt.stabilize()
    assert o.value == 42.25 and total._tree.mode == "tree"
    m.delete(3)
    m.set(4, 1.5)
    rt.stabilize()
    assert o.value == 45 - 3 - 4 + 1.5


def test_group_by_is_maintained_in_place():
    # one changed key: its group's value is a new Group over the same live members dict (no
    # copy of the group), unequal to the old one; a cell per group runs for that group only
    import copy
    from incr.collections import Group
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {i: i for i in range(3000)})
    groups = m.group_by(lambda k, v: k % 3)
    ran = []

    @incr.cell
    def size(g, members):
        ran.append(g)
        return len(members), sum(members.values())

    sizes = rt.observe(groups.map(size))
    obs = rt.observe(groups)
    rt.stabilize()
    assert sorted(ran) == [0, 1, 2]
    g1 = obs.value[1]
    assert type(g1) is Group and list(g1)[:3] == [1, 4, 7] and len(g1) == 1000
    members = groups._members[1]
    ran.clear()
    m.set(4, -4)
    rt.stabilize()
    assert ran == [1]                                   # one group's instance, no other
    new = obs.value[1]
    assert new is not g1 and new != g1 and new._members is members   # updated in place
    assert new == {k: (-4 if k == 4 else k) for k in range(1, 3000, 3)}
    assert dict(sizes.value)[1] == (1000, sum(range(1, 3000, 3)) - 8)
    snap = copy.copy(new)
    assert type(snap) is dict and snap == new
    m.set(4, 5)                                          # the same group, another value
    m.delete(7)
    m.set(3001, 1)                                       # new key joins group 1
    rt.stabilize()
    assert list(obs.value[1])[:3] == [1, 4, 10] and 3001 in obs.value[1]
    rt._check()


def test_cold_build_in_one_pass_then_per_key():
    # the first run of a plain-function map and of a sum takes every key at once (each function
    # call once per key), and later changes go key by key as before
    calls = []

    def f(k, v):
        calls.append(k)
        return v * 2

    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {i: i for i in range(100)})
    doubled = m.map(f)
    odd = doubled.filter(lambda k, v: k % 2)
    total = odd.sum()
    o = rt.observe(total)
    rt.stabilize()
    assert sorted(calls) == list(range(100)) and o.value == sum(2 * i for i in range(1, 100, 2))
    assert total._tree.mode == "int" and total._tree.n_delta == 50
    assert doubled._bulk_builds == odd._bulk_builds == 1
    calls.clear()
    m.set(3, 10)
    m.set(500, 1)
    rt.stabilize()
    assert sorted(calls) == [3, 500]            # the changed and the new key, no other
    assert sorted(doubled.last_changes) == [3, 500]
    assert o.value == sum(2 * i for i in range(1, 100, 2)) - 6 + 20     # 500 is even
    assert total._tree.n_delta == 51
    assert doubled._bulk_builds == odd._bulk_builds == 1
    assert odd.to_dict() == {k: v for k, v in doubled.to_dict().items() if k % 2}
    rt._check()


def test_input_map_cell_does_not_run_per_change():
    # a fold or map over an input map reads the input's change counter: per change, the
    # engine runs the operators' cells and not the input map's own cell
    rt = incr.Runtime()
    m = incr.input_map(rt, "docs", {i: i for i in range(10)})
    doubled = m.map(lambda k, v: 2 * v)
    total = doubled.sum()
    direct = m.sum()
    o, o2 = rt.observe(total), rt.observe(direct)
    rt.stabilize()
    m.set(3, 30)
    report = rt.stabilize()
    assert sorted(report.recomputed) == sorted(
        ["docs.map(<lambda>)()", "docs.map(<lambda>).sum()", "docs.sum()"])
    assert o.value == 2 * (45 + 27) and o2.value == 45 + 27
    assert "because input 'docs' changed" in rt.explain(direct)
    assert dict(m().items()) == {i: (30 if i == 3 else i) for i in range(10)}   # its cell answers


@pytest.mark.parametrize("kind", ["min", "max"])
def test_min_max_fold_int_path_and_tree_fallback(kind):
    # the same random operations on MinMaxFold (heap with lazy deletion while every value is
    # an int) and on FoldTree(kind); counts say which path ran; the heap stays bounded
    from incr._collections import MinMaxFold
    pick = max if kind == "max" else min
    rnd = random.Random(kind)
    s, t, d = MinMaxFold(kind, None), FoldTree(kind), {}
    for _ in range(4000):
        k = rnd.randrange(150)
        if rnd.random() < 0.3:
            assert s.delete(k) == t.delete(k) == (k in d)
            d.pop(k, None)
        else:
            v = rnd.randrange(-40, 40)
            s.set(k, v)
            t.set(k, v)
            d[k] = v
        assert s.value == t.value == pick(d.values(), default=None)
    assert s.mode == "int" and s.n_tree == 0 and s.n_heap > 2000
    s._check()
    s.set(7, 0.5)                          # the first float: everything moves to a tree once
    d[7] = 0.5
    assert s.mode == "tree" and s.n_tree == 1
    assert s.value == pick(d.values()) and s.keys() == sorted(d)
    s._check()
    assert MinMaxFold(kind, "none").value == "none"
    s2 = MinMaxFold(kind)
    s2.set("a", True)                      # a bool is not an int here: tree from the start
    assert s2.mode == "tree" and s2.value is True


def test_deleted_and_changed_keys_withdraw_their_instances():
    # a map holds one instance of its cell per present key: a deleted key's instance and the
    # instance of a changed key's old value leave the runtime (rt._drop), so set/delete churn
    # does not grow the trace; a key set back to an old value runs again
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {i: i for i in range(10)})
    ran = []

    @incr.cell
    def f(k, v):
        ran.append(k)
        return v + 1

    fm = m.map(f)
    o = rt.observe(fm.sum())
    rt.stabilize()

    def held():
        return sorted(i.args for i in rt._instances() if i.cell is f)

    assert held() == [(i, i) for i in range(10)]
    m.delete(3)
    rt.stabilize()
    assert held() == [(i, i) for i in range(10) if i != 3] and o.value == 55 - 4
    assert fm._fn.n_dropped == 1
    m.set(4, 40)
    rt.stabilize()
    assert (4, 4) not in held() and (4, 40) in held() and len(held()) == 9
    ran.clear()
    m.set(4, 4)                      # back to the old value: its instance was withdrawn
    rt.stabilize()
    assert ran == [4] and o.value == 55 - 4
    assert rt.extensions["incr.collections"] == {i: 1 for i in rt._instances() if i.cell is f}


def test_shared_observed_or_read_instances_are_not_dropped():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": 1, "b": 2})

    @incr.cell
    def f(k, v):
        return v * 10

    @incr.cell
    def reader():
        return f("b", 2) + 1

    one, two = m.map(f), m.map(f)            # two maps of one cell share the instances
    o1, o2 = rt.observe(one), rt.observe(two)
    keep = rt.observe(reader)                # f('b', 2) has a dependent
    rt.stabilize()
    assert rt.extensions["incr.collections"][rt._instance(f, ("a", 1), {})] == 2
    m.delete("a")
    m.delete("b")
    rt.stabilize()
    # f('a', 1) was held by two maps: withdrawn when both let go; f('b', 2) is read by
    # `reader`: kept
    assert rt._instance(f, ("a", 1), {}, False) is None
    assert rt._instance(f, ("b", 2), {}, False) is not None and keep.value == 21
    assert dict(o1.value.items()) == {} == dict(o2.value.items())
    assert rt._drop(rt._instance(reader, (), {})) is False    # observed: kept
    rt._check()


def test_set_delete_churn_does_not_grow_memory():
    # the instance count is the test (exact); tracemalloc bounds what else could leak (the
    # change log is trimmed past 4,096 entries, so it is part of the warm-up)
    import gc
    import tracemalloc

    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {i: i for i in range(100)})

    @incr.cell
    def f(k, v):
        return (k, v)

    o = rt.observe(m.map(f).count())
    rt.stabilize()

    def churn(start, n):
        for i in range(start, start + n):
            m.set(1000 + i % 50, i)        # a new key, or a key's new value
            rt.stabilize()
            if i % 2:
                m.delete(1000 + i % 50)
                rt.stabilize()

    churn(0, 6000)                          # warm-up: logs at their trimmed length
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    churn(6000, 6000)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    n = len(m)
    assert o.value == n
    assert len([i for i in rt._instances() if i.cell is f]) == n
    # without the withdrawal: 6,000 instances of about 500 B each (3 MB)
    assert after - before < 300_000, after - before


def test_an_async_function_is_refused_and_a_coroutine_is_never_a_value():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": 1})

    async def tenfold(k, v):
        return v * 10

    with pytest.raises(TypeError, match=r"m\.map: fn.*tenfold' is an async function"):
        m.map(tenfold)
    made = []

    def sneaky(k, v):                # a sync function that returns a coroutine
        c = tenfold(k, v)
        made.append(c)
        return c

    o = rt.observe(m.map(sneaky).count())
    with pytest.raises(TypeError, match="returned a coroutine for key 'a'"):
        rt.stabilize()               # the first run, built in bulk
    m.set("b", 2)
    with pytest.raises(TypeError, match="returned a coroutine for key"):
        rt.stabilize()               # key by key
    assert made and all(c.cr_frame is None for c in made)   # each closed, none kept
    del o


def test_bad_mapping_or_key_names_the_map_and_changes_nothing():
    """Garbage given to an input map is a TypeError naming the map; nothing changed: the name
    is not reserved by a refused declaration, and a refused set/delete/update leaves the map
    and rt.revision as they were."""
    rt = incr.Runtime()
    with pytest.raises(TypeError, match="input_map 'm'"):
        rt.input_map("m", 3)
    m = rt.input_map("m", {"a": 1})              # the name was not taken by the refusal
    rev = rt.revision
    for bad in (lambda: m.set([1], 2), lambda: m.delete({}), lambda: m.update(7),
                lambda: m.update({"b": 2}, delete=5)):
        with pytest.raises(TypeError, match="'m'"):
            bad()
    assert dict(m.items()) == {"a": 1} and rt.revision == rev


def test_cold_build_of_a_cell_map_in_one_loop():
    # the first run of map(cell) / filter(cell) creates and runs every key's instance in one
    # compiled loop: each instance runs once, what they read besides their arguments is
    # tracked per key, the collector is back on afterwards, and a run that raises part-way
    # keeps what ran (the next pass runs the key that failed and the ones not reached)
    import gc
    rt = incr.Runtime()
    scale = rt.input("scale", 1)
    bad = rt.input("bad", True)
    m = incr.input_map(rt, "m", {i: i for i in range(50)})
    ran, kept = [], []

    @incr.cell
    def f(k, v):
        ran.append(k)
        if k == 7 and bad.get():          # (only key 7 reads `bad`)
            raise ValueError(f"key {k}")
        return v * (scale.get() if k < 5 else 1)

    @incr.cell
    def even(k, v):
        kept.append(k)
        return v % 2 == 0

    total = m.map(f).sum()
    evens = m.filter(even)
    o, oe = rt.observe(total), rt.observe(evens.count())
    assert gc.isenabled()
    with pytest.raises(ValueError, match="key 7"):
        rt.stabilize()
    assert gc.isenabled()
    assert sorted(ran) == list(range(8))           # up to the key that raised
    assert sorted(kept) == list(range(50)) and oe.value == 25
    assert evens.to_dict() == {i: i for i in range(0, 50, 2)}
    ran.clear()
    bad.set(False)
    rt.stabilize()
    assert sorted(ran) == list(range(7, 50))        # 0-6 ran already: not again
    assert o.value == sum(range(50))
    ran.clear()
    scale.set(3)
    rt.stabilize()
    assert sorted(ran) == [0, 1, 2, 3, 4]           # only the instances that read scale
    assert o.value == sum(range(50)) + 2 * sum(range(5))
    assert rt.extensions["incr.collections"][rt._instance(f, (3, 3), {})] == 1
    rt._check()


def test_filter_cell_reading_an_input_re_evaluates_the_keys_it_left_out():
    # a key the predicate leaves out stays in the upstream map: its predicate instance (and
    # what it read) must stay, so that a change there brings the key back (it was withdrawn
    # like a deleted key's, and the key never came back)
    rt = incr.Runtime()
    th = rt.input("th", 5)
    m = incr.input_map(rt, "m", {i: i for i in range(10)})
    ran = []

    @incr.cell
    def big(k, v):
        ran.append(k)
        return v >= th.get()

    kept = m.filter(big)
    o = rt.observe(kept.count())
    rt.stabilize()
    assert o.value == 5
    th.set(2)                              # the cold build's keys
    rt.stabilize()
    assert o.value == 8 and sorted(kept.keys()) == list(range(2, 10))
    m.set(0, 0)                            # (a key through the per-key path)
    th.set(8)
    rt.stabilize()
    assert o.value == 2
    ran.clear()
    th.set(0)                              # keys left out by the per-key path come back
    rt.stabilize()
    assert o.value == 10 and sorted(ran) == list(range(10))
    m.delete(3)                            # a deleted key's instance is withdrawn
    rt.stabilize()
    assert o.value == 9 and rt._instance(big, (3, 3), {}, False) is None
    rt._check()
