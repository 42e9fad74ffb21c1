"""Reuse across processes: a program run again in a new process takes from the store every value
whose dependencies hash the same, and runs exactly the functions whose inputs, code or version
changed (and what reads them).

Each run is a fresh ``python`` process (tests/store_progs/harness.py) that reports which cell
functions ran, in order, next to the values and ``rt.stats()``; the tests compare both with what
the contract says should have happened.
"""

from __future__ import annotations

import gc
import warnings
from collections import Counter

import pytest

import incr
from incr.store import Store
from store_progs.harness import run_program


@pytest.fixture(autouse=True)
def _collect_dead_cells():
    # cells of earlier tests may be alive in reference cycles (cell <-> runtime); a dead cell
    # that shares an identity with a live one would make the live one unstorable (documented)
    gc.collect()


# --- a small graph: x -> ax; y -> by; ax, by -> both; by -> only_y(k); both, only_y -> top(k) ---

GRAPH = '''
x = rt.input("x", P.get("x", 1))
y = rt.input("y", P.get("y", 10))


@incr.cell
def ax():
    ran.append("ax")
    return x.get() * 2


@incr.cell
def by():
    ran.append("by")
    return BY_EXPR


@incr.cell
def both():
    ran.append("both")
    return ax() + by()


@incr.cell
def only_y(k):
    ran.append(f"only_y({k})")
    return by() * k


@incr.cell
def top(k):
    ran.append(f"top({k})")
    return [both(), only_y(k), k]


with rt:
    values = {"top1": top(1), "top2": top(2), "only_y3": only_y(3)}
'''

ALL = ["ax", "by", "both", "only_y(1)", "only_y(2)", "only_y(3)", "top(1)", "top(2)"]


def graph(by_expr="y.get() + 1"):
    return GRAPH.replace("BY_EXPR", by_expr)


def expected(x=1, y=10, by=lambda y: y + 1):
    ax, b = x * 2, by(y)
    return {"top1": [ax + b, b * 1, 1], "top2": [ax + b, b * 2, 2], "only_y3": b * 3}


def ran_set(result):
    ran = result["ran"]
    assert len(ran) == len(set(ran)), f"a function ran twice in one process: {ran}"
    return set(ran)


def test_second_process_runs_nothing(tmp_path):
    store = tmp_path / "store"
    first = run_program(tmp_path, graph(), store)
    assert first["values"] == expected()
    assert ran_set(first) == set(ALL)
    assert first["stats"]["store_hits"] == 0
    assert first["stats"]["computed"] == len(ALL)

    second = run_program(tmp_path, graph(), store)
    assert second["values"] == first["values"]
    assert second["ran"] == []
    assert second["stats"]["store_hits"] == len(ALL)
    assert second["stats"]["store_misses"] == 0
    assert second["stats"]["computed"] == 0
    assert second["warnings"] == []

    # and again: being taken from the store does not lose anything for the run after
    third = run_program(tmp_path, graph(), store)
    assert third["values"] == first["values"] and third["ran"] == []


def test_one_input_changed_recomputes_only_its_readers(tmp_path):
    store = tmp_path / "store"
    run_program(tmp_path, graph(), store, {"x": 1, "y": 10})

    changed_x = run_program(tmp_path, graph(), store, {"x": 5, "y": 10})
    assert changed_x["values"] == expected(x=5)
    # ax reads x; both reads ax; top(k) reads both. by and only_y(k) come from the store.
    assert ran_set(changed_x) == {"ax", "both", "top(1)", "top(2)"}
    assert changed_x["stats"]["store_hits"] == 4   # by, only_y(1), only_y(2), only_y(3)

    changed_y = run_program(tmp_path, graph(), store, {"x": 5, "y": 20})
    assert changed_y["values"] == expected(x=5, y=20)
    assert ran_set(changed_y) == set(ALL) - {"ax"}

    # the same inputs as the previous process: nothing runs
    same = run_program(tmp_path, graph(), store, {"x": 5, "y": 20})
    assert same["values"] == expected(x=5, y=20)
    assert same["ran"] == []


def test_function_edit_reruns_that_function_and_its_readers(tmp_path):
    store = tmp_path / "store"
    run_program(tmp_path, graph("y.get() + 1"), store)

    edited = run_program(tmp_path, graph("y.get() + 5"), store)
    assert edited["values"] == expected(by=lambda y: y + 5)
    assert ran_set(edited) == set(ALL) - {"ax"}
    assert edited["stats"]["store_hits"] == 1      # ax

    again = run_program(tmp_path, graph("y.get() + 5"), store)
    assert again["values"] == edited["values"] and again["ran"] == []

    # editing it back finds the entries of the first definition
    reverted = run_program(tmp_path, graph("y.get() + 1"), store)
    assert reverted["values"] == expected()
    assert reverted["ran"] == []


def test_function_edit_only_reruns_the_edited_leaf(tmp_path):
    # a cell nobody reads: editing it runs it alone
    store = tmp_path / "store"
    body = GRAPH.replace("BY_EXPR", "y.get() + 1").replace(
        "with rt:", "@incr.cell\ndef lonely():\n    ran.append('lonely')\n    return LONELY\n\n\n"
                    "with rt:\n    lonely()")
    run_program(tmp_path, body.replace("LONELY", "'a'"), store)
    edited = run_program(tmp_path, body.replace("LONELY", "'b'"), store)
    assert edited["ran"] == ["lonely"]


VERSIONED = '''
x = rt.input("x", 1)


@incr.cell(version=P["version"])
def scaled():
    ran.append("scaled")
    return x.get() * FACTOR


@incr.cell
def reader():
    ran.append("reader")
    return scaled() + 1


with rt:
    values = [scaled(), reader()]
'''


def versioned(version, factor):
    return VERSIONED.replace("FACTOR", str(factor)), {"version": version}


def test_version_pins_identity(tmp_path):
    store = tmp_path / "store"
    body, params = versioned("1", 10)
    first = run_program(tmp_path, body, store, params)
    assert first["values"] == [10, 11]
    assert ran_set(first) == {"scaled", "reader"}

    # same version, edited body: the version is the identity, so the stored value is reused
    body, params = versioned("1", 20)
    pinned = run_program(tmp_path, body, store, params)
    assert pinned["ran"] == []
    assert pinned["values"] == [10, 11]

    # bumped version: recomputed, and its reader too
    body, params = versioned("2", 20)
    bumped = run_program(tmp_path, body, store, params)
    assert ran_set(bumped) == {"scaled", "reader"}
    assert bumped["values"] == [20, 21]

    again = run_program(tmp_path, body, store, params)
    assert again["ran"] == [] and again["values"] == [20, 21]

    # back to version 1: its entries are still there
    body, params = versioned("1", 10)
    back = run_program(tmp_path, body, store, params)
    assert back["ran"] == [] and back["values"] == [10, 11]


def test_change_and_revert_across_processes(tmp_path):
    store = tmp_path / "store"
    one = run_program(tmp_path, graph(), store, {"x": 1})
    two = run_program(tmp_path, graph(), store, {"x": 2})
    assert two["values"] == expected(x=2)
    assert ran_set(two) == {"ax", "both", "top(1)", "top(2)"}
    reverted = run_program(tmp_path, graph(), store, {"x": 1})
    assert reverted["values"] == one["values"] == expected(x=1)
    assert reverted["ran"] == []
    assert reverted["stats"]["store_hits"] == len(ALL)


def test_change_and_revert_within_one_process(tmp_path, log):
    rt = incr.Runtime(store=tmp_path / "store")
    try:
        x = rt.input("x", 1)

        @incr.cell
        def double():
            log("double")
            return x.get() * 2

        @incr.cell
        def plus(k):
            log(f"plus({k})")
            return double() + k

        with rt:
            assert [plus(1), plus(2)] == [3, 4]
            assert Counter(log.take()) == {"double": 1, "plus(1)": 1, "plus(2)": 1}
            x.set(2)
            assert [plus(1), plus(2)] == [5, 6]
            assert Counter(log.take()) == {"double": 1, "plus(1)": 1, "plus(2)": 1}
            hits = rt.stats()["store_hits"]
            x.set(1)
            assert [plus(1), plus(2)] == [3, 4]
            assert log.take() == []       # the old traces are found in the store
            assert rt.stats()["store_hits"] - hits == 3
            x.set(2)
            assert [plus(1), plus(2)] == [5, 6]
            assert log.take() == []
        rt._check()
    finally:
        rt.close()


CUTOFF = '''
x = rt.input("x", P["x"])


@incr.cell
def parity():
    ran.append("parity")
    return PARITY_EXPR


@incr.cell
def word(k):
    ran.append(f"word({k})")
    return f"{k}:" + ("odd" if parity() else "even")


@incr.cell
def summary():
    ran.append("summary")
    return [word(1), word(2)]


with rt:
    values = summary()
'''


def test_cutoff_across_processes(tmp_path):
    store = tmp_path / "store"
    body = CUTOFF.replace("PARITY_EXPR", "x.get() % 2")
    first = run_program(tmp_path, body, store, {"x": 1})
    assert first["values"] == ["1:odd", "2:odd"]
    assert ran_set(first) == {"parity", "word(1)", "word(2)", "summary"}

    # parity recomputes to the value it had: what reads it is taken from the store
    second = run_program(tmp_path, body, store, {"x": 3})
    assert second["values"] == ["1:odd", "2:odd"]
    assert second["ran"] == ["parity"]
    assert second["stats"]["store_hits"] == 3

    third = run_program(tmp_path, body, store, {"x": 4})
    assert third["values"] == ["1:even", "2:even"]
    assert ran_set(third) == {"parity", "word(1)", "word(2)", "summary"}

    fourth = run_program(tmp_path, body, store, {"x": 6})
    assert fourth["values"] == ["1:even", "2:even"]
    assert fourth["ran"] == ["parity"]

    # an edited body that computes the same value: it runs; its direct readers name the old
    # definition in their stored traces, so they may run (an edit re-runs what reads it), but
    # their values come out equal, so summary above them is taken from the store
    edited = run_program(tmp_path, CUTOFF.replace("PARITY_EXPR", "abs(x.get()) % 2"), store,
                         {"x": 6})
    assert edited["values"] == ["1:even", "2:even"]
    assert "parity" in edited["ran"]
    assert ran_set(edited) <= {"parity", "word(1)", "word(2)"}


# --- values of every encodable type ---------------------------------------------------------

TYPES = '''
inf = float("inf")
VALUES = {
    "int": 42, "neg_int": -7, "zero": 0, "max_u64": 2**64 - 1, "min_i64": -2**63,
    "float": 1.5, "neg_zero": -0.0, "pos_zero": 0.0, "nan": float("nan"), "inf": inf,
    "neg_inf": -inf, "tiny": 5e-324, "true": True, "false": False,
    "str": "h\\u00e9llo \\u2603 \\U0001f600", "empty_str": "", "nul_str": "a\\x00b",
    "bytes": b"\\x00\\xff\\x80abc", "empty_bytes": b"", "none": None,
    "tuple": (1, 2), "list": [1, 2], "empty_tuple": (), "empty_list": [], "one_tuple": (1,),
    "dict": {"b": 1, "a": [2.0, None]}, "empty_dict": {},
    "frozenset": frozenset({1, "a", (2, 3), -0.0}), "empty_frozenset": frozenset(),
    "tuple_vs_list": [(1,), [1], ((),), [[]]],
    "bool_int_float": [True, 1, 1.0, False, 0, 0.0, -0.0],
    "nested": {"t": ((1, [2, (3.0, -0.0, float("nan"))]), frozenset({(True, b"x")})),
               "l": [[], (), {"k": (None, {"deep": [frozenset({(1, (2,))})]})}]},
}


def tag(v):
    t = type(v)
    if t is float:
        return ["float", "nan" if v != v else v.hex()]
    if t in (int, bool, str, type(None)):
        return [t.__name__, v]
    if t is bytes:
        return ["bytes", v.hex()]
    if t in (tuple, list):
        return [t.__name__, [tag(x) for x in v]]
    if t is dict:
        return ["dict", [[k, tag(v[k])] for k in sorted(v)]]
    if t is frozenset:
        return ["frozenset", sorted(json.dumps(tag(x)) for x in v)]
    return ["UNEXPECTED", t.__name__, repr(v)]


@incr.cell
def val(name):
    ran.append(name)
    return VALUES[name]


@incr.cell
def count_all():
    ran.append("count_all")
    return len([val(k) for k in sorted(VALUES)])


with rt:
    values = {"vals": {k: [tag(val(k)), tag(VALUES[k])] for k in VALUES}, "n": count_all()}
'''


def test_every_encodable_type_round_trips_with_its_type(tmp_path):
    store = tmp_path / "store"
    first = run_program(tmp_path, TYPES, store)
    n = len(first["values"]["vals"])
    assert len(first["ran"]) == n + 1
    assert first["warnings"] == []   # everything here is encodable
    second = run_program(tmp_path, TYPES, store)
    assert second["ran"] == []
    assert second["stats"]["store_hits"] == n + 1
    for name, (got, want) in second["values"]["vals"].items():
        assert got == want, f"{name}: stored {got}, expected {want}"
    assert second["values"]["n"] == n
    # a sanity check of the comparison itself: -0.0 and 0.0, (1,) and [1] are told apart
    vals = second["values"]["vals"]
    assert vals["neg_zero"][0] != vals["pos_zero"][0]
    assert vals["one_tuple"][0] != vals["list"][0][:1]
    assert vals["tuple_vs_list"][0][1][0][0] == "tuple"
    assert vals["tuple_vs_list"][0][1][1][0] == "list"


# --- values that cannot be encoded ----------------------------------------------------------

UNENCODABLE = '''
k = rt.input("k", P["k"])


@incr.cell
def as_set(i):
    ran.append(f"as_set({i})")
    return {i, k.get()}


@incr.cell
def as_object(i):
    ran.append(f"as_object({i})")
    return object()


@incr.cell
def nested_set(i):
    ran.append(f"nested_set({i})")
    return [i, {"s": {i}}]


@incr.cell
def huge(i):
    ran.append(f"huge({i})")
    return 2**70 + i


@incr.cell
def size(i):
    ran.append(f"size({i})")
    return len(as_set(i))


@incr.cell
def plain(i):
    ran.append(f"plain({i})")
    return i * k.get()


def demand_all():
    return [[sorted(as_set(i)), type(as_object(i)).__name__, nested_set(i)[0], huge(i) - 2**70,
             size(i), plain(i)] for i in range(3)]


with rt:
    first_pass = demand_all()
    n_ran = len(ran)
    second_pass = demand_all()
values = {"first": first_pass, "second": second_pass, "n_ran": n_ran}
'''

UNSTORABLE = ["as_set", "as_object", "nested_set", "huge"]


def _expected_unencodable(k):
    return [[sorted({i, k}), "object", i, i, len({i, k}), i * k] for i in range(3)]


def test_unencodable_value_stays_in_memory_with_one_warning_per_cell(tmp_path):
    store = tmp_path / "store"
    for attempt in range(2):   # the second process recomputes what could not be stored
        res = run_program(tmp_path, UNENCODABLE, store, {"k": 7})
        assert res["values"]["first"] == res["values"]["second"] == _expected_unencodable(7)
        # in memory: the second pass in the same process ran nothing
        assert res["values"]["n_ran"] == len(res["ran"])
        ran = Counter(r.split("(")[0] for r in res["ran"])
        for name in UNSTORABLE + ["size"]:
            assert ran[name] == 3, (attempt, res["ran"])
        # plain(i) is stored: computed by the first process only
        assert ran["plain"] == (3 if attempt == 0 else 0), (attempt, res["ran"])
        assert res["stats"]["store_hits"] == (0 if attempt == 0 else 3)
        warned = [msg for cat, msg in res["warnings"] if cat == "NotPersistableWarning"]
        for name in UNSTORABLE:
            mine = [m for m in warned if f"{name}(" in m]
            assert len(mine) == 1, (name, res["warnings"])
        assert len(warned) >= len(UNSTORABLE)
        other = [w for w in res["warnings"] if w[0] != "NotPersistableWarning"]
        assert other == []


def test_unencodable_value_in_process(tmp_path, log):
    rt = incr.Runtime(store=tmp_path / "store")
    try:
        @incr.cell
        def bag(i):
            log(f"bag({i})")
            return {i}

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with rt:
                assert [bag(i) for i in range(5)] == [{i} for i in range(5)]
                assert [bag(i) for i in range(5)] == [{i} for i in range(5)]
        assert log.take() == [f"bag({i})" for i in range(5)]
        ours = [w for w in caught if issubclass(w.category, incr.NotPersistableWarning)]
        assert len(ours) == 1, [str(w.message) for w in caught]
        assert "bag" in str(ours[0].message)
    finally:
        rt.close()
    s = Store(tmp_path / "store")
    try:
        assert list(s.iter_records()) == []   # nothing of bag was stored
    finally:
        s.close()


# --- hash algorithms ------------------------------------------------------------------------

def test_blake2b_store_is_a_separate_key_space(tmp_path):
    store = tmp_path / "store"
    xxh = run_program(tmp_path, graph(), store, {"hash": "xxh3_128"})
    assert ran_set(xxh) == set(ALL)

    blake = run_program(tmp_path, graph(), store, {"hash": "blake2b"})
    assert blake["values"] == xxh["values"] == expected()
    assert ran_set(blake) == set(ALL)          # no false hits from the xxh3 entries
    assert blake["stats"]["store_hits"] == 0

    blake2 = run_program(tmp_path, graph(), store, {"hash": "blake2b"})
    assert blake2["ran"] == [] and blake2["values"] == expected()
    assert blake2["stats"]["store_hits"] == len(ALL)

    xxh2 = run_program(tmp_path, graph(), store, {"hash": "xxh3_128", "x": 3})
    assert xxh2["values"] == expected(x=3)
    assert ran_set(xxh2) == {"ax", "both", "top(1)", "top(2)"}
    blake3 = run_program(tmp_path, graph(), store, {"hash": "blake2b", "x": 3})
    assert ran_set(blake3) == {"ax", "both", "top(1)", "top(2)"}

    s = Store(store)
    try:
        recs = list(s.iter_records())
    finally:
        s.close()
    assert all(rec is not None for _k, rec, _n in recs)
    prefixes = Counter(k[:1] for k, _rec, _n in recs)
    assert prefixes == {b"x": len(ALL) + 4, b"b": len(ALL) + 4}
    # dependency hashes inside the records carry their algorithm too
    for k, rec, _n in recs:
        assert rec["vh"][:1] == k[:1]
        assert all(d[2][:1] == k[:1] for d in rec["deps"])


DEEP = '''
@incr.cell
def nested(depth):
    ran.append(f"nested({depth})")
    v = ()
    for _ in range(depth):
        v = (v, [depth])
    return v


def depth_of(v):
    d = 0
    while v != ():
        assert type(v) is tuple and type(v[1]) is list and v[1] == [P["depth"]]
        v, d = v[0], d + 1
    return d


with rt:
    values = depth_of(nested(P["depth"]))
'''


@pytest.mark.parametrize("depth", [50, 250, 1000])
def test_deeply_nested_value_in_the_next_process(tmp_path, depth):
    # A value is either stored (and the next process loads it without running the cell) or,
    # if the codec cannot take it, a NotPersistableWarning and a recompute. Never a crash.
    store = tmp_path / "store"
    first = run_program(tmp_path, DEEP, store, {"depth": depth})
    assert first["values"] == depth
    second = run_program(tmp_path, DEEP, store, {"depth": depth})
    assert second["values"] == depth
    warned = [w for w in first["warnings"] if w[0] == "NotPersistableWarning"]
    if warned:
        assert second["ran"] == [f"nested({depth})"]
    else:
        assert second["ran"] == [] and second["stats"]["store_hits"] == 1
    if depth <= 50:
        assert not warned
