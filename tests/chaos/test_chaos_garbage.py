"""Attacks the public API with garbage and with aliasing: hypothesis-generated arguments (nested
containers, unencodable objects, huge ints, NaN, -0.0, the same dict in another order), an
argument mutated after the call (``buf.append`` after ``total(buf)``), a cell that mutates its
own argument, values that must come back exactly (type, dict order, -0.0) from memory and from
the store, and junk passed to every public entry point.

The rule checked: a value always equals the plain function on arguments equal to the
instance's key, computed from nothing, also after the instance runs again; a refused argument
is a TypeError or ValueError naming the cell and the argument; any other refusal is a
TypeError, ValueError or incr.IncrError — never another exception, never a crash.
"""

from __future__ import annotations

import copy
import math
import os
import pathlib
import tempfile
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import incr
from chaos_util import chaos  # noqa: F401 - a fixture

pytestmark = pytest.mark.hang_limit(300)


def examples(ci, chaos):
    """Hypothesis settings for a loop of ``ci`` examples in CI (times the soak factor)."""
    return settings(max_examples=chaos.n(ci), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


# -- plain functions: what a value must be ---------------------------------------------------------

def shape(x):
    """A canonical picture of ``x``: types kept, -0.0 and every NaN told apart from 0.0 (all
    NaNs alike), dict keys in sorted order (the key of an instance ignores dict order)."""
    t = type(x)
    if t is float:
        return ("float", "nan" if math.isnan(x) else x.hex())
    if t in (bool, int, str, bytes, type(None)):
        return (t.__name__, x)
    if t in (tuple, list):
        return (t.__name__, tuple(shape(e) for e in x))
    if t is dict:
        return ("dict", tuple(sorted((k, shape(v)) for k, v in x.items())))
    if t is frozenset:
        return ("frozenset", tuple(sorted((shape(e) for e in x), key=repr)))
    raise AssertionError(f"not a plain value: {x!r}")


def exact(x):
    """Like shape, but dict keys in their order: what a round trip must keep."""
    if type(x) is dict:
        return ("dict", tuple((k, exact(v)) for k, v in x.items()))
    if type(x) in (tuple, list):
        return (type(x).__name__, tuple(exact(e) for e in x))
    return shape(x)


def drained(xs):
    """The plain function of the cell ``drain``, on a list it may empty."""
    total = 0
    while xs:
        total = total * 31 + len(repr(xs.pop()))
    return total


GARBAGE_TYPES = (set, bytearray, complex, type(Ellipsis), object, type(lambda: 0))


def has_garbage(x):
    t = type(x)
    if t in (tuple, list, frozenset):
        return any(has_garbage(e) for e in x)
    if t is dict:
        return any(type(k) is not str or has_garbage(v) for k, v in x.items())
    return t not in (bool, int, float, str, bytes, type(None))


def reordered(x):
    """An equal value, every dict rebuilt with its keys in reverse order."""
    t = type(x)
    if t is dict:
        return {k: reordered(x[k]) for k in reversed(list(x))}
    if t in (tuple, list):
        return t(reordered(e) for e in x)
    return x


def mutate(x, rng_bits):
    """Change the first list or dict inside ``x`` in place; True if there was one."""
    stack = [x]
    while stack:
        v = stack.pop()
        if type(v) is list:
            v.append(rng_bits)
            return True
        if type(v) is dict:
            if v and rng_bits % 2:
                v[next(iter(v))] = ("mutated", rng_bits)
            else:
                v["zz-new"] = rng_bits
            return True
        if type(v) in (tuple, list):
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v.values())
    return False


# -- strategies ---------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.integers(-3, 3)
           | st.floats(allow_nan=True) | st.sampled_from([0.0, -0.0, math.nan, math.inf])
           | st.text(max_size=5) | st.binary(max_size=5))
hashables = st.none() | st.integers(-5, 5) | st.text(max_size=3) | st.sampled_from([-0.0, 0.0])
garbage = st.sampled_from(["set", "bytearray", "complex", "object", "lambda", "int-keyed"]).map(
    lambda g: {"set": {1, 2}, "bytearray": bytearray(b"x"), "complex": 1j, "object": object(),
               "lambda": (lambda: 0), "int-keyed": {1: "a"}}[g])


def containers(leaves):
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                        | st.lists(inner, max_size=4).map(tuple)
                        | st.dictionaries(st.text(max_size=3), inner, max_size=4)
                        | st.frozensets(hashables, max_size=3), max_leaves=10)


clean_args = containers(scalars)
any_args = containers(scalars | garbage) | clean_args

ops = st.lists(st.one_of(
    st.tuples(st.just("call"), any_args),
    st.tuples(st.just("recall"), st.integers(0, 30)),
    st.tuples(st.just("mutate"), st.integers(0, 30), st.integers(0, 1000)),
    st.tuples(st.just("drain"), st.lists(scalars, max_size=5)),
    st.tuples(st.just("bump"))), min_size=1, max_size=25)


# -- the cells ------------------------------------------------------------------------------------

class Cells:
    def __init__(self, rt):
        self.rt = rt
        k = self.k = rt.input("k", 0)

        @incr.cell(version="1")
        def echo(x):
            return (shape(x), k.get())

        @incr.cell(version="1")
        def drain(xs):
            return (drained(xs), k.get())      # empties its own argument

        self.echo, self.drain = echo, drain


# stores of many small examples: in memory-backed /dev/shm when there is one (no disk syncs)
SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def runtime(on_store):
    if not on_store:
        return incr.Runtime(), None
    d = tempfile.TemporaryDirectory(dir=SHM)
    return incr.Runtime(store=os.path.join(d.name, "store")), d


def run_ops(on_store, script):
    rt, tmp = runtime(on_store)
    cells = Cells(rt)
    live, copies = [], []          # the objects passed, and copies of them as they were
    tally = {"calls": 0, "refused": 0, "wrong": 0}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", incr.NotPersistableWarning)
            with rt:
                for op in script:
                    if op[0] == "call" or (op[0] == "recall" and copies):
                        x = op[1] if op[0] == "call" else reordered(copies[op[1] % len(copies)])
                        tally["calls"] += 1
                        if has_garbage(x):
                            with pytest.raises((TypeError, ValueError)) as info:
                                cells.echo(x)
                            msg = str(info.value)
                            assert "echo" in msg and "x" in msg, msg
                            tally["refused"] += 1
                            continue
                        want = (shape(copy.deepcopy(x)), cells.k.get())
                        if op[0] == "call":
                            live.append(x)
                            copies.append(copy.deepcopy(x))
                        got = cells.echo(x)
                        if got != want:
                            tally["wrong"] += 1
                        assert got == want, f"echo({x!r}): got {got!r}, want {want!r}"
                    elif op[0] == "mutate" and live:
                        mutate(live[op[1] % len(live)], op[2])
                    elif op[0] == "drain":
                        xs = list(op[1])
                        want = (drained(list(xs)), cells.k.get())
                        tally["calls"] += 1
                        got = cells.drain(xs)
                        assert got == want, f"drain: got {got!r}, want {want!r}"
                        # and again, from an equal list, after it ran on its own copy
                        assert cells.drain(list(op[1])) == want
                    elif op[0] == "bump":
                        cells.k.set(cells.k.get() + 1)   # every instance must run again
            rt._check()
    finally:
        rt.close()
        if tmp is not None:
            tmp.cleanup()
    return tally


@pytest.mark.parametrize("on_store", [False, True], ids=["memory", "store"])
def test_arguments_are_keyed_and_copied(chaos, on_store):
    @examples(40 if on_store else 150, chaos)
    @given(ops)
    def run(script):
        t = run_ops(on_store, script)
        chaos.count("examples")
        for k, v in t.items():
            chaos.count(k, v)

    run()


def test_buf_append_after_the_call(chaos):
    # the example of the contract, step by step
    rt = incr.Runtime()
    k = rt.input("k", 0)

    @incr.cell
    def total(buf):
        return sum(buf) + k.get()

    with rt:
        buf = [1, 2]
        assert total(buf) == 3
        buf.append(5)
        assert total(buf) == 8
        k.set(10)                     # total([1, 2]) runs again: on [1, 2], not on buf
        chaos.count("calls", 3)
        assert total([1, 2]) == 13
        assert total([1, 2, 5]) == 18
    rt._check()


# -- values round-trip exactly ---------------------------------------------------------------------

VALUE = {}


@incr.cell(version="1")
def produce():
    return copy.deepcopy(VALUE["v"])


@pytest.mark.parametrize("on_store", [False, True], ids=["memory", "store"])
def test_values_round_trip_exactly(chaos, on_store):
    n = [0]
    tmp = tempfile.TemporaryDirectory(dir=SHM)
    tmp_path = pathlib.Path(tmp.name)

    @examples(60 if on_store else 150, chaos)
    @given(containers(scalars.filter(lambda v: type(v) is not int or -2**63 <= v < 2**64)))
    def run(v):
        VALUE["v"] = v
        n[0] += 1
        path = tmp_path / f"store{n[0]}"
        rt = incr.Runtime(store=path) if on_store else incr.Runtime()
        with rt:
            first = produce()
        rt.close()
        assert exact(first) == exact(v), (first, v)
        if on_store:
            VALUE["v"] = "the function must not run: the value comes from the store"
            rt = incr.Runtime(store=path)
            with rt:
                again = produce()
            st_ = rt.stats()
            rt.close()
            chaos.count("store_hits", st_["store_hits"])
            assert exact(again) == exact(v), f"through the store: {again!r} is not {v!r}"
        chaos.count("values")

    try:
        run()
    finally:
        tmp.cleanup()


# -- junk to every public entry point ---------------------------------------------------------------

junk = any_args | st.sampled_from([None, "", "x" * 300, -1, 0, 2**100, math.nan, b"\x00",
                                   object(), incr, print, type])


ENTRY_POINTS = ["input", "set", "observe", "explain", "cell_args", "cell_arity", "make_cell",
                "runtime", "nack", "state", "batch_set"]


def test_junk_to_public_entry_points(chaos):
    @examples(200, chaos)
    @given(st.sampled_from(ENTRY_POINTS), junk, junk)
    def run(what, a, b):
        chaos.count("calls")
        chaos.count("refused", not junk_call(what, a, b))

    run()


def junk_call(what, a, b):
    """One call with junk; True if it worked, False if refused as the contract allows."""
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    def f(p, q=0):
        return (x.get(), shape(p) if not has_garbage(p) else None)

    calls = {
        "input": lambda: rt.input(a, b),
        "set": lambda: x.set(a),
        "observe": lambda: rt.observe(a, b),
        "explain": lambda: rt.explain(f, a, q=b),
        "cell_args": lambda: rt.observe(f, a, b),
        "cell_arity": lambda: rt.observe(f, a, b, a),
        "make_cell": lambda: incr.cell(a, version=b) if not callable(a) else incr.cell(
            version=b, cutoff=a)(lambda: 0),
        "runtime": lambda: incr.Runtime(hash=a, max_workers=b).close(),
        "nack": lambda: rt.nack(f, a, revision=b, case="c"),
        "state": lambda: rt.state(f, a),
        "batch_set": lambda: _batch_set(rt, x, a),
    }
    worked = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calls[what]()
    except (TypeError, ValueError, incr.IncrError):
        worked = False
    rt._check()
    rt.stabilize()
    with rt:
        got, now = f(1)[0], x.get()
        assert got is now or got == now or (got != got and now != now)  # usable, and right
    rt.close()
    return worked


def _batch_set(rt, x, v):
    with rt.batch():
        x.set(v)
        x.set(v)
