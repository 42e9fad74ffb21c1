"""A conformance audit of incr against its public contract, API.md v2.

One test per behaviour the contract states, grouped by the contract's sections (Runtime,
Input, Cells, LLM nodes, Errors, Command line, Reuse, Concurrency and async, Control,
Collections). Each test's docstring quotes the sentence it checks. A test marked
``xfail(strict=True)`` pins a sentence the implementation does not meet today: its reason says
what is missing; when the engine is fixed the xfail turns into a failure (strict) and the mark
is removed.

Engine tests assert what ran (counters in cell bodies), concurrency is proven with barriers and
events (a barrier that times out means "not concurrent"), never with timings.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

import incr

ROOT = Path(incr.__file__).resolve().parent.parent


def missing(what):
    """An xfail for a contract sentence the implementation does not meet (strict: a fix shows)."""
    return pytest.mark.xfail(strict=True, reason=f"contract: {what}")


def run_py(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new Python process importing this checkout's incr."""
    script = cwd / "prog.py"
    script.write_text(textwrap.dedent(code), encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def gen_of(answers, log=None):
    """A generator body returning ``answers`` one after the other (a stand-in for a model)."""
    it = iter(answers)

    def body(*args, previous=None, feedback=()):
        value = next(it)
        if log is not None:
            log.append((value, previous, tuple(feedback)))
        return value
    return body


# ============================================================================================
# Runtime
# ============================================================================================

def test_runtime_options_after_store_are_keyword_only():
    """`incr.Runtime(store=None, *, hash="xxh3_128", max_workers=None)`"""
    with pytest.raises(TypeError):
        incr.Runtime(None, "blake2b")
    rt = incr.Runtime()
    assert rt.hash == "xxh3_128"


def test_runtime_v2_options_are_accepted():
    """v2 adds `max_concurrency=`, `budget=` (§Control), `durability="group" | "sync"` and
    `remote=`"""
    for durability in ("group", "sync"):
        incr.Runtime(durability=durability, max_concurrency=3,
                     budget=incr.Budget(max_attempts=2)).close()
    with pytest.raises(ValueError, match="durability"):
        incr.Runtime(durability="always")


def test_runtime_hash_is_one_of_two_algorithms():
    """`hash`: the content hash for context keys: `"xxh3_128"` (default, fast, for stores you
    own) or `"blake2b"`"""
    assert incr.Runtime(hash="blake2b").hash == "blake2b"
    with pytest.raises(ValueError, match="hash"):
        incr.Runtime(hash="md5")


def test_runtime_store_key_records_the_hash_algorithm(tmp_path):
    """The key records the algorithm. (A store written with one hash and read with the other
    is a miss, never a hit under the wrong algorithm.)"""
    runs = []

    @incr.cell
    def f():
        runs.append("f")
        return 1

    for alg, hits in (("blake2b", 0), ("xxh3_128", 0), ("blake2b", 1)):
        rt = incr.Runtime(store=tmp_path / "s", hash=alg)
        with rt:
            assert f() == 1
        assert rt.stats()["store_hits"] == hits, alg
        rt.close()
    assert runs == ["f", "f"]


def test_runtime_store_path_is_created_owner_only(tmp_path):
    """A path opens (creating if missing, owner-only permissions) an LMDB environment"""
    path = tmp_path / "new" / "store"
    rt = incr.Runtime(store=path)
    rt.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    files = os.listdir(path)
    assert "data.mdb" in files
    for name in files:
        assert stat.S_IMODE(os.stat(path / name).st_mode) & 0o077 == 0, name


class _DictTier:
    """A remote tier (get_many, put_many, close) kept in a dict, shared by two runtimes."""

    def __init__(self):
        self.data = {}

    def get_many(self, keys):
        return [self.data.get(k) for k in keys]

    def put_many(self, items):
        self.data.update(items)

    def close(self):
        pass


def test_remote_tier_is_read_through_and_written_behind(tmp_path):
    """`remote=` (a URL of a shared second tier, e.g. `"redis://host:6379/0"`: read-through,
    write-behind, verified like local records"""
    tier = _DictTier()
    runs = []

    @incr.cell
    def f(k):
        runs.append(k)
        return {"k": k, "v": [k] * 3}

    for local in ("a", "b"):                 # two machines: separate local stores
        rt = incr.Runtime(store=tmp_path / local, remote=tier)
        with rt:
            assert f(1) == {"k": 1, "v": [1, 1, 1]}
        rt.close()
    assert runs == [1] and tier.data


@pytest.mark.parametrize("wrong", ["flipped", "swapped"])
def test_remote_tier_that_is_wrong_is_a_warning_and_a_local_computation(tmp_path, wrong):
    """a remote that is down or wrong is a warning and a local computation, never an error or a
    wrong value."""
    tier = _DictTier()
    runs = []

    @incr.cell
    def f(k):
        runs.append(k)
        return f"value-{k}"

    rt = incr.Runtime(store=tmp_path / "a", remote=tier)
    with rt:
        f(1)
        f(2)
    rt.close()
    keys = sorted(tier.data)
    if wrong == "flipped":
        for k in keys:
            b = bytearray(tier.data[k])
            b[len(b) // 2] ^= 0x01
            tier.data[k] = bytes(b)
    else:                                    # a sound record, under another key
        values = [tier.data[k] for k in keys]
        for k, v in zip(keys, values[1:] + values[:1]):
            tier.data[k] = v
    runs.clear()
    rt = incr.Runtime(store=tmp_path / "b", remote=tier)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rt:
            assert (f(1), f(2)) == ("value-1", "value-2")
    rt.close()
    assert sorted(runs) == [1, 2]
    assert caught, "no warning for a wrong remote record"


def test_remote_tier_that_is_down_is_a_warning_and_a_local_computation(tmp_path):
    """a remote that is down or wrong is a warning and a local computation, never an error or a
    wrong value."""
    pytest.importorskip("redis")
    runs = []

    @incr.cell
    def f():
        runs.append(1)
        return 42

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt = incr.Runtime(store=tmp_path / "s", remote="redis://127.0.0.1:1/0")
        with rt:
            assert f() == 42
        rt.close()
    assert runs == [1]
    assert any("127.0.0.1:1" in str(w.message) for w in caught)


def test_runtime_max_workers_default_is_a_small_pool():
    """`max_workers`: threads used to run independent stale LLM nodes concurrently (default:
    a small pool)."""
    with pytest.raises(ValueError, match="max_workers"):
        incr.Runtime(max_workers=0)
    with pytest.raises(ValueError, match="max_workers"):
        incr.Runtime(max_workers="2")


def test_with_makes_runtime_active_and_restores_the_previous_one():
    """`with rt:` makes `rt` the active runtime for the current context (contextvars); leaving
    restores the previous one. It does not close `rt`."""
    a, b = incr.Runtime(), incr.Runtime()
    before = incr.current()
    with a:
        assert incr.current() is a
        with b:
            assert incr.current() is b
        assert incr.current() is a
    assert incr.current() is before
    assert not a.closed and not b.closed
    x = a.input("x", 1)
    x.set(2)                                 # still usable
    assert a.revision == 1


def test_with_is_per_context_not_per_process():
    """`with rt:` makes `rt` the active runtime for the current context (contextvars)"""
    rt = incr.Runtime()
    seen = []
    with rt:
        t = threading.Thread(target=lambda: seen.append(incr.current()))
        t.start()
        t.join()
    assert seen and seen[0] is not rt


def test_current_outside_with_is_one_process_wide_in_memory_runtime():
    """Outside any `with`, a process-wide in-memory runtime is active: `incr.current()` returns
    whichever is active."""
    default = incr.current()
    seen = []
    t = threading.Thread(target=lambda: seen.append(incr.current()))
    t.start()
    t.join()
    assert isinstance(default, incr.Runtime)
    assert seen == [default]                 # process-wide: the same in every thread
    assert default.store_path is None        # in memory


def test_input_names_are_unique_within_a_runtime():
    """Names are unique within a runtime (`ValueError` on a second declaration)."""
    rt = incr.Runtime()
    rt.input("price", 1)
    with pytest.raises(ValueError, match="price"):
        rt.input("price", 2)
    incr.Runtime().input("price", 3)         # another runtime: fine


def test_batch_forms_one_revision():
    """`rt.batch()` is a context manager: every `set` inside it forms one revision."""
    rt = incr.Runtime()
    a, b = rt.input("a", 1), rt.input("b", 1)
    runs = []

    @incr.cell
    def s():
        runs.append("s")
        return a.get() + b.get()

    with rt:
        s()
        with rt.batch():
            a.set(2)
            b.set(3)
            a.set(4)
        assert rt.revision == 1
        assert s() == 7
    assert runs == ["s", "s"]


def test_revision_grows_by_one_per_committed_change():
    """`rt.revision -> int` grows by one for each committed change (one `set` outside a batch,
    or one batch)."""
    rt = incr.Runtime()
    x = rt.input("x", 0)
    assert rt.revision == 0 and isinstance(rt.revision, int)
    x.set(1)
    x.set(2)
    assert rt.revision == 2
    with rt.batch():
        x.set(3)
        x.set(4)
    assert rt.revision == 3


def test_observe_registers_and_computes_nothing(rt):
    """(v2) Observing registers and computes nothing: the next `stabilize()` computes every
    observed instance"""
    x = rt.input("x", 2)
    runs = []

    @incr.cell
    def sq(k):
        runs.append(k)
        return x.get() * k

    obs = [rt.observe(sq, k) for k in (1, 2, 3)]
    assert isinstance(obs[0], incr.Observer)
    assert runs == []
    report = rt.stabilize()
    assert sorted(runs) == [1, 2, 3]
    assert sorted(report.recomputed) == ["sq(1)", "sq(2)", "sq(3)"]
    assert [o.value for o in obs] == [2, 4, 6]


def test_observer_value_before_stabilize_stabilizes(rt):
    """(reading `Observer.value` before that stabilizes)"""
    x = rt.input("x", 2)
    runs = []

    @incr.cell
    def a():
        runs.append("a")
        return x.get()

    @incr.cell
    def b():
        runs.append("b")
        return -x.get()

    oa, ob = rt.observe(a), rt.observe(b)
    assert oa.value == 2
    assert sorted(runs) == ["a", "b"]        # the whole pass ran, not only a
    assert ob.value == -2 and sorted(runs) == ["a", "b"]


def test_stabilize_computes_independent_observed_sync_cells_concurrently():
    """the next `stabilize()` computes every observed instance, independent ones concurrently"""
    barrier = threading.Barrier(2, timeout=1.5)

    @incr.cell
    def meet(k):
        barrier.wait()                       # both must be running at once
        return k

    rt = incr.Runtime(max_workers=2)
    obs = [rt.observe(meet, k) for k in (1, 2)]
    rt.stabilize()
    assert [o.value for o in obs] == [1, 2]


def test_stabilize_computes_independent_observed_async_cells_concurrently():
    """the next `stabilize()` computes every observed instance, independent ones concurrently"""
    events = {}

    @incr.cell
    async def meet(k):
        events.setdefault(k, asyncio.Event()).set()
        await asyncio.wait_for(events.setdefault(1 - k, asyncio.Event()).wait(), 5)
        return k

    rt = incr.Runtime()
    obs = [rt.observe(meet, k) for k in (0, 1)]
    rt.stabilize()
    assert [o.value for o in obs] == [0, 1]


def test_observer_error_holds_the_exception_until_a_run_succeeds(rt):
    """An instance whose run raises is still observed: `Observer.error` holds the exception
    (and `.value` raises it) until a later run succeeds."""
    x = rt.input("x", 2)
    runs = []

    @incr.cell
    def inv():
        runs.append("inv")
        return 1 / x.get()

    @incr.cell
    def other():
        runs.append("other")
        return x.get() + 1

    o, o2 = rt.observe(inv), rt.observe(other)
    rt.stabilize()
    x.set(0)
    with pytest.raises(ZeroDivisionError):
        rt.stabilize()
    assert isinstance(o.error, ZeroDivisionError)
    assert o2.value == 1 and o2.error is None   # the other observed instance was brought up
    with pytest.raises(ZeroDivisionError):
        o.value
    assert isinstance(o.error, ZeroDivisionError)
    x.set(4)
    rt.stabilize()
    assert o.error is None and o.value == 0.25


def test_observer_stop_and_kwargs(rt):
    """`rt.observe(cell, *args, **kwargs) -> Observer`; `Observer.value`, `Observer.error`,
    `Observer.on_change(callback)`, `Observer.stop()`."""
    x = rt.input("x", 1)
    runs = []

    @incr.cell
    def scaled(k, by=1):
        runs.append((k, by))
        return x.get() * k * by

    obs = rt.observe(scaled, 2, by=3)
    assert obs.value == 6 and obs.error is None
    other = rt.observe(scaled, k=2, by=3)    # the same instance
    assert other.value == 6 and runs == [(2, 3)]
    obs.stop()
    other.stop()
    obs.stop()                               # idempotent
    x.set(2)
    rt.stabilize()
    assert runs == [(2, 3)]                  # no longer refreshed


def test_every_callback_is_called_and_their_exceptions_are_raised_together(rt):
    """Every callback of a pass is called even if one raises; their exceptions are raised
    together afterwards (an `ExceptionGroup`)."""
    x = rt.input("x", 1)

    @incr.cell
    def c():
        return x.get()

    o = rt.observe(c)
    seen = []

    def bad1(v):
        raise ValueError("one")

    def bad2(v):
        raise KeyError("two")

    o.on_change(bad1)
    o.on_change(seen.append)
    o.on_change(bad2)
    with pytest.raises(ExceptionGroup) as info:
        rt.stabilize()
    kinds = sorted(type(e).__name__ for e in info.value.exceptions)
    assert kinds == ["KeyError", "ValueError"]
    assert seen == [1]


def test_interrupted_pass_leaves_instances_up_to_date_or_queued(rt):
    """An interrupted pass (any exception, Ctrl-C included) leaves every observed instance
    either up to date or queued for the next pass."""
    x = rt.input("x", 0)
    runs = []
    interrupt = [True]

    @incr.cell
    def p(k):
        runs.append(k)
        if k == 1 and x.get() == 1 and interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt
        return x.get() + k

    obs = [rt.observe(p, k) for k in range(3)]
    seen = []
    for o in obs:
        o.on_change(seen.append)
    rt.stabilize()
    seen.clear()
    runs.clear()
    x.set(1)
    with pytest.raises(KeyboardInterrupt):
        rt.stabilize()
    ran_before = list(runs)
    runs.clear()
    rt.stabilize()
    assert [o.value for o in obs] == [1, 2, 3]
    assert sorted(seen) == [1, 2, 3]         # no notification lost
    assert not (set(ran_before) - {1}) & set(runs)   # what completed is not run again


def test_stabilize_recomputes_each_stale_instance_once_in_order_without_glitches(rt):
    """`rt.stabilize() -> Stabilization` brings every observed instance up to date in one pass:
    each stale instance is recomputed at most once, in revision-timestamp order, so no instance
    ever sees a mix of old and new values."""
    x = rt.input("x", 1)
    runs = []
    seen = []

    @incr.cell
    def left():
        runs.append("left")
        return x.get() + 1

    @incr.cell
    def right():
        runs.append("right")
        return x.get() * 10

    @incr.cell
    def join():
        runs.append("join")
        a, b, c = left(), right(), x.get()
        seen.append((a, b, c))
        return a + b + c

    rt.observe(join)
    rt.observe(left)
    rt.stabilize()
    runs.clear()
    seen.clear()
    x.set(2)
    report = rt.stabilize()
    assert sorted(runs) == ["join", "left", "right"]
    assert seen == [(3, 20, 2)]              # never (2, 10, 2) or (3, 10, 2)
    assert report.recomputed.index("join()") > report.recomputed.index("left()")
    assert report.recomputed.index("join()") > report.recomputed.index("right()")


def test_stabilization_report_fields(rt):
    """The report has `recomputed` (labels, in order), `cutoff` (labels recomputed to an equal
    value), `reused` (count) and `seconds`."""
    x = rt.input("x", 1)

    @incr.cell
    def parity():
        return x.get() % 2

    @incr.cell
    def name():
        return "odd" if parity() else "even"

    @incr.cell
    def const():
        return 0

    rt.observe(name)
    rt.observe(const)
    rt.stabilize()
    x.set(3)
    report = rt.stabilize()
    assert isinstance(report, incr.Stabilization)
    assert report.recomputed == ["parity()"]
    assert report.cutoff == ["parity()"]
    assert isinstance(report.reused, int) and report.reused >= 1
    assert isinstance(report.seconds, float) and report.seconds >= 0


def test_explain_names_the_changed_dependency_and_revision(rt):
    """`rt.explain(cell, *args, **kwargs) -> str` says why that instance's current value was
    computed, reused or cut off: which dependency changed, at which revision."""
    x = rt.input("x", 1)

    @incr.cell
    def a(k):
        return x.get() % 2 + k

    @incr.cell
    def b(k):
        return a(k=k) + 1

    with rt:
        b(1)
        x.set(2)
        b(1)
        text = rt.explain(b, k=1)
        assert isinstance(text, str)
        assert "a(1)" in text and "revision 1" in text
        assert "input 'x'" in rt.explain(a, 1) and "revision 1" in rt.explain(a, 1)
        x.set(4)                             # a recomputes to the same value: cut off
        b(1)
        assert "cutoff" in rt.explain(a, 1)
        assert "reused" in rt.explain(b, 1)


def test_stats_has_the_counters(rt):
    """`rt.stats() -> dict` cumulative counters (at least `recomputed`, `reused`, `cutoff`,
    `store_hits`, `store_misses`, `generations`, `validations`)."""
    x = rt.input("x", 1)

    @incr.cell
    def parity():
        return x.get() % 2

    @incr.cell
    def top():
        return parity() * 2

    with rt:
        top()
        x.set(3)
        top()
    s = rt.stats()
    for key in ("recomputed", "reused", "cutoff", "store_hits", "store_misses",
                "generations", "validations"):
        assert isinstance(s[key], int), key
    assert s["recomputed"] == 1 and s["cutoff"] == 1 and s["reused"] == 1


@pytest.mark.parametrize("use", ["input", "set", "with", "demand", "observe", "stabilize",
                                 "explain", "batch", "state"])
def test_closed_runtime_raises_incr_error(use):
    """`rt.close()` flushes and closes the store. Using a closed runtime raises
    `incr.IncrError`."""
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    def c():
        return x.get()

    with rt:
        c()
    rt.close()
    rt.close()                               # idempotent
    do = {
        "input": lambda: rt.input("y", 1),
        "set": lambda: x.set(5),
        "with": lambda: rt.__enter__(),
        "demand": lambda: rt.__enter__() and c(),
        "observe": lambda: rt.observe(c),
        "stabilize": rt.stabilize,
        "explain": lambda: rt.explain(c),
        "batch": lambda: rt.batch().__enter__(),
        "state": lambda: rt.state(c),
    }[use]
    with pytest.raises(incr.IncrError):
        do()


def test_close_flushes_the_store(tmp_path):
    """`rt.close()` flushes and closes the store."""
    runs = []

    @incr.cell
    def f():
        runs.append("f")
        return [1, 2]

    for _ in range(2):
        rt = incr.Runtime(store=tmp_path / "s")      # durability="group" by default
        with rt:
            assert f() == [1, 2]
        rt.close()
    assert runs == ["f"]


# ============================================================================================
# Input
# ============================================================================================

def test_input_name_get_set_and_equal_set_changes_nothing(rt):
    """`Input.name`, `Input.get()`, `Input.set(value)`. Setting a value equal to the current
    one changes nothing."""
    x = rt.input("x", [1, {"a": 2}])
    runs = []

    @incr.cell
    def c():
        runs.append("c")
        return len(x.get())

    assert x.name == "x" and isinstance(x, incr.Input)
    with rt:
        c()
        x.set([1, {"a": 2}])                 # an equal (not identical) value
        assert rt.revision == 0
        c()
    assert runs == ["c"]


def test_input_get_records_a_dependency_only_inside_a_cell(rt):
    """`get()` inside a running cell records a dependency; outside, it just returns the
    value."""
    x, y = rt.input("x", 1), rt.input("y", 2)
    runs = []

    @incr.cell
    def c():
        runs.append("c")
        return x.get()

    with rt:
        assert y.get() == 2                  # outside: a plain read
        c()
        y.set(3)
        c()
        assert runs == ["c"]
        x.set(5)
        assert c() == 5
    assert runs == ["c", "c"]


def test_input_value_is_read_only(rt):
    """(v2) `Input.value` is read-only."""
    x = rt.input("x", 1)
    assert x.value == 1
    with pytest.raises(AttributeError):
        x.value = 2
    assert x.get() == 1 and rt.revision == 0


def test_untracked_reads_record_no_dependency(rt):
    """`incr.untracked(fn, *args)` (or `with incr.untracked():`) reads inputs and demands cells
    without recording dependencies."""
    x, y, z = rt.input("x", 1), rt.input("y", 2), rt.input("z", 3)
    runs = []

    @incr.cell
    def side():
        runs.append("side")
        return z.get() * 10

    @incr.cell
    def c():
        runs.append("c")
        a = incr.untracked(lambda k: y.get() + k, 0)
        with incr.untracked():
            b = side()
        return x.get() + a + b

    with rt:
        assert c() == 33
        y.set(20)
        z.set(30)
        assert c() == 33                     # neither y nor side() is a dependency
        assert runs == ["c", "side"]
        assert side() == 300                 # side itself stays incremental
        x.set(2)
        assert c() == 2 + 20 + 300
    assert incr.untracked(lambda a, b: a + b, 1, 2) == 3
    with pytest.raises(TypeError):
        incr.untracked(3)


def test_values_round_trip_exactly_through_the_store(tmp_path):
    """A value returned by a cell, or taken from the store, round-trips exactly (type, order of
    dict keys, `-0.0`)"""
    runs = []
    want = {"z": -0.0, "a": (1, [2.5, frozenset({3})]), "b": b"x", "n": None,
            "t": True, "s": "é", "big": 2 ** 62}

    @incr.cell
    def value():
        runs.append("value")
        return {"z": -0.0, "a": (1, [2.5, frozenset({3})]), "b": b"x", "n": None,
                "t": True, "s": "é", "big": 2 ** 62}

    got = []
    for _ in range(2):
        rt = incr.Runtime(store=tmp_path / "s")
        with rt:
            got.append(value())
        rt.close()
    assert runs == ["value"]
    for v in got:
        assert list(v) == list(want)
        assert repr(v) == repr(want)
        assert type(v["a"]) is tuple and type(v["a"][1]) is list
        assert type(v["a"][1][1]) is frozenset and type(v["t"]) is bool
        assert str(v["z"]) == "-0.0"


def test_instance_runs_on_its_own_copy_of_its_arguments(rt):
    """an instance runs on its own immutable copy of the arguments it is keyed by, so mutating
    an argument after the call (or inside the cell) never changes what that instance
    computes."""
    runs = []

    @incr.cell
    def count(items, opts):
        runs.append(len(items))
        items.append("inside")
        opts["k"].append(1)
        return len(items) + len(opts["k"])

    with rt:
        items, opts = ["a"], {"k": []}
        assert count(items, opts) == 3
        assert items == ["a"] and opts == {"k": []}   # the caller's objects are untouched
        items.append("b")
        assert count(["a"], {"k": []}) == 3
        x = rt.input("x", 0)
        x.set(1)
        assert count(["a"], {"k": []}) == 3
    assert runs == [1]


# ============================================================================================
# Cells
# ============================================================================================

def test_cell_decorator_bare_and_with_options():
    """`@incr.cell` ... `@incr.cell(version="2", cutoff=incr.EQUAL)`  # incr.EQUAL (==, the
    default), incr.IDENTITY, incr.NEVER, or a callable(old, new) -> bool"""
    @incr.cell
    def f(x, y=1):
        return x + y

    @incr.cell(version="2", cutoff=incr.EQUAL)
    def g(x):
        return x

    for co in (incr.IDENTITY, incr.NEVER, lambda old, new: old == new):
        incr.cell(cutoff=co)(lambda: 1)
    assert isinstance(f, incr.Cell) and isinstance(g, incr.Cell)
    with incr.Runtime():
        assert f(1) == 2 and g(3) == 3


@pytest.mark.parametrize("cutoff,rerun", [
    ("default", False), (incr.EQUAL, False), (incr.IDENTITY, True), (incr.NEVER, True),
    ("callable", False)])
def test_cutoff_kinds(cutoff, rerun):
    """incr.EQUAL (==, the default), incr.IDENTITY, incr.NEVER, or a callable(old, new) ->
    bool ... Early cutoff: when a recomputed value is equal (per `cutoff`) to the previous one,
    instances that depend on it are not recomputed."""
    rt = incr.Runtime()
    v = rt.input("v", 1)
    runs = []
    opts = {} if cutoff == "default" else {
        "cutoff": (lambda old, new: old[0] == new[0]) if cutoff == "callable" else cutoff}

    @incr.cell(**opts)
    def base():
        runs.append("base")
        return [v.get() // 10, v.get()] if cutoff == "callable" else [v.get() // 10]

    @incr.cell
    def reader():
        runs.append("reader")
        return base()[0]

    with rt:
        reader()
        v.set(2)                             # base's value: an equal new list
        reader()
    assert runs == ["reader", "base", "base"] + (["reader"] if rerun else [])


def test_cell_garbage_options_are_type_errors():
    """Bad arguments raise `TypeError` or `ValueError` with a message that names the cell and
    the argument."""
    with pytest.raises(TypeError):
        incr.cell(3)

    def named():
        return 1

    with pytest.raises(TypeError, match=r"named.*cutoff|cutoff.*named"):
        incr.cell(cutoff="EQUAL")(named)
    with pytest.raises(TypeError):
        incr.cell(versoin="1")


def test_cell_version_that_cannot_name_a_definition_is_refused():
    """A cell's identity across processes is its module, qualified name and `version` ...
    Bad arguments raise `TypeError` or `ValueError` with a message that names the cell and the
    argument."""
    def named():
        return 1

    with pytest.raises(TypeError, match="version"):
        incr.cell(version=object())(named)


def test_cell_runs_only_when_never_computed_or_a_dependency_changed(rt):
    """It runs the function only if that instance was never computed, or if a dependency it
    read on its last run has changed since."""
    x, y = rt.input("x", 1), rt.input("y", 1)
    runs = []

    @incr.cell
    def a():
        runs.append("a")
        return x.get()

    @incr.cell
    def b():
        runs.append("b")
        return a() + 1

    with rt:
        b()
        b()
        y.set(2)                             # not read by anyone
        b()
        assert runs == ["b", "a"]
        x.set(2)
        assert b() == 3
    assert runs == ["b", "a", "a", "b"]


def test_dependencies_are_recorded_again_on_every_run(rt):
    """Dependencies are whatever it read on its last run (inputs and other cells), recorded
    again on every run."""
    flag, x, y = rt.input("flag", True), rt.input("x", 1), rt.input("y", 10)
    runs = []

    @incr.cell
    def branch():
        runs.append("branch")
        return x.get() if flag.get() else y.get()

    with rt:
        branch()
        y.set(11)                            # not read yet
        branch()
        assert runs == ["branch"]
        flag.set(False)
        assert branch() == 11
        x.set(2)                             # no longer read
        branch()
        assert runs == ["branch", "branch"]


def test_each_distinct_set_of_arguments_is_its_own_instance(rt):
    """Each distinct set of arguments is its own instance."""
    runs = []

    @incr.cell
    def f(x, y=1):
        runs.append((x, y))
        return x + y

    with rt:
        assert f(1) == f(1, 1) == f(x=1) == f(1, y=1) == 2
        assert f(2) == 3 and f(1, 2) == 3
        assert f(1.0) == 2.0                  # 1.0 is another value than 1
    assert runs == [(1, 1), (2, 1), (1, 2), (1.0, 1)]


def test_encodable_argument_types_are_accepted(rt):
    """Arguments must be encodable: `None`, `bool`, `int`, `float`, `str`, `bytes`, `tuple`,
    `list`, `dict` with `str` keys, `frozenset`, `Input`"""
    x = rt.input("x", 5)

    @incr.cell
    def echo(a):
        return a.get() if isinstance(a, incr.Input) else a

    args = [None, True, 3, 2.5, float("nan"), "s", b"b", (1, "a"), [1, [2]], {"k": [1]},
            frozenset({1, 2}), x]
    with rt:
        for a in args:
            out = echo(a)
            assert out == 5 if a is x else repr(out) == repr(a)
        echo(float("nan"))
    assert rt.stats()["instances"] == len(args)   # NaN is one instance


@pytest.mark.parametrize("bad,where", [
    ("object", "argument a"), ("set", "argument a"), ("bytearray", "argument a"),
    ("dict_int_key", "argument a"), ("nested", "argument a[1]['k']"),
    ("keyword", "argument b")])
def test_unencodable_argument_is_a_type_error_naming_cell_and_argument(rt, bad, where):
    """Anything else raises `TypeError` naming the cell and the argument."""
    @incr.cell
    def target(a, b=1):
        return 1

    call = {
        "object": lambda: target(object()),
        "set": lambda: target({1, 2}),
        "bytearray": lambda: target(bytearray(b"x")),
        "dict_int_key": lambda: target({1: 2}),
        "nested": lambda: target([1, {"k": object()}]),
        "keyword": lambda: target(1, b=object()),
    }[bad]
    with rt:
        with pytest.raises(TypeError) as info:
            call()
    assert "target" in str(info.value) and where in str(info.value)
    assert rt.stats()["instances"] == 0


def test_register_type_makes_a_type_encodable(tmp_path):
    """or a type registered with `incr.register_type(cls, encode, decode)`."""
    class Point:
        def __init__(self, x):
            self.x = x

    incr.register_type(Point, lambda p: p.x, Point)
    runs = []

    @incr.cell
    def move(p):
        runs.append(p.x)
        return Point(p.x + 1)

    for _ in range(2):
        rt = incr.Runtime(store=tmp_path / "s")
        with rt:
            out = move(Point(1))
        rt.close()
        assert type(out) is Point and out.x == 2
    assert runs == [1]
    with pytest.raises(TypeError):
        incr.register_type(3, str, str)
    with pytest.raises(TypeError):
        incr.register_type(complex, 3, str)


def test_exception_reaches_the_caller_unchanged_with_a_note(rt):
    """An exception raised by a cell reaches the caller unchanged (a note names the chain of
    cells). Nothing partial is kept: the instance runs again at its next demand, and the
    runtime stays usable."""
    x = rt.input("x", 0)
    runs = []
    err = ValueError("boom")

    @incr.cell
    def inner():
        runs.append("inner")
        if x.get() == 0:
            raise err
        return x.get()

    @incr.cell
    def outer():
        runs.append("outer")
        return inner() + 1

    with rt:
        with pytest.raises(ValueError) as info:
            outer()
        assert info.value is err
        notes = " ".join(getattr(info.value, "__notes__", []))
        assert "inner()" in notes and "outer()" in notes
        with pytest.raises(ValueError):
            outer()                          # runs again: nothing was kept
        assert runs == ["outer", "inner", "outer", "inner"]
        x.set(1)
        assert outer() == 2


def test_cycle_raises_cycle_error_naming_the_cycle(rt):
    """A cell that demands itself, directly or through others, raises `incr.CycleError` naming
    the cycle; the runtime stays usable."""
    @incr.cell
    def c1(k):
        return c2(k)

    @incr.cell
    def c2(k):
        return c1(k) if k else 0

    @incr.cell
    def self_loop():
        return self_loop()

    with rt:
        with pytest.raises(incr.CycleError) as info:
            c1(1)
        assert "c1(1)" in str(info.value) and "c2(1)" in str(info.value)
        with pytest.raises(incr.CycleError, match="self_loop"):
            self_loop()
        assert c1(0) == 0


@pytest.mark.parametrize("change", ["set", "batch", "stabilize", "observe", "close",
                                    "input_map_set"])
def test_change_from_inside_a_running_cell_is_a_reentrancy_error(change):
    """`Input.set` (or any other change) from inside a running cell raises
    `incr.ReentrancyError`."""
    rt = incr.Runtime()
    x = rt.input("x", 1)
    m = rt.input_map("m", {"a": 1})

    @incr.cell
    def other():
        return 1

    do = {"set": lambda: x.set(2), "batch": lambda: rt.batch().__enter__(),
          "stabilize": rt.stabilize, "observe": lambda: rt.observe(other),
          "close": rt.close, "input_map_set": lambda: m.set("b", 2)}[change]

    @incr.cell
    def bad():
        do()
        return 1

    with rt:
        with pytest.raises(incr.ReentrancyError):
            bad()
    assert x.get() == 1 and rt.revision == 0 and not rt.closed


@pytest.mark.parametrize("declare", ["input", "input_map"])
def test_declaring_an_input_inside_a_running_cell_is_a_reentrancy_error(declare):
    """`Input.set` (or any other change) from inside a running cell raises
    `incr.ReentrancyError`."""
    rt = incr.Runtime()

    @incr.cell
    def bad():
        if declare == "input":
            rt.input("new", 1)
        else:
            rt.input_map("new", {})
        return 1

    with rt:
        with pytest.raises(incr.ReentrancyError):
            bad()


def test_propagation_through_a_long_chain_does_not_recurse():
    """Propagation never recurses in proportion to the depth of the graph: a chain of a million
    cells, once built, propagates a change from its head with no recursion error and no raised
    recursion limit. (100,000 cells here, 100 times Python's limit, to keep the test fast.)"""
    n = 100_000
    limit = sys.getrecursionlimit()
    rt = incr.Runtime()
    head = rt.input("head", 0)

    @incr.cell
    def link(i):
        return head.get() if i == 0 else link(i - 1) + 1

    with rt:
        for i in range(0, n, 500):           # built bottom-up: no deep first demand
            for j in range(i, i + 500):
                link(j)
        head.set(1)
        assert link(n - 1) == n
        assert sys.getrecursionlimit() == limit
        obs = rt.observe(link, n - 1)
        head.set(2)
    rt.stabilize()
    assert obs.value == n + 1 and sys.getrecursionlimit() == limit


def test_deep_first_demand_is_a_recursion_error_and_runtime_stays_usable(rt):
    """A first-time demand nests like the Python calls it is made of; past Python's limit it
    fails with a clear `RecursionError` and leaves the runtime usable"""
    @incr.cell
    def d(i):
        return 0 if i == 0 else d(i - 1) + 1

    with rt:
        try:
            assert d(20 * sys.getrecursionlimit()) == 20 * sys.getrecursionlimit()
        except RecursionError as e:
            assert "d(" in " ".join(getattr(e, "__notes__", []))
        assert d(10) == 10
        x = rt.input("x", 1)
        x.set(2)


STORE_PROG = """
import json, sys, warnings
import incr
rt = incr.Runtime(store=sys.argv[1])
x = rt.input("x", int(sys.argv[2]))
runs = []

@incr.cell{decor}
def f(k):
    runs.append(k)
    return {{"k": k + x.get(){edit}, "z": -0.0}}

with rt:
    v = f(3)
print(json.dumps({{"runs": runs, "v": repr(v), "hits": rt.stats()["store_hits"]}}))
rt.close()
"""


def _store_run(tmp_path, x=1, decor="", edit=""):
    proc = run_py(STORE_PROG.format(decor=decor, edit=edit), tmp_path, str(tmp_path / "s"),
                  str(x))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_store_a_new_process_gets_the_value_without_running(tmp_path):
    """A new process that demands the same instance, with dependencies whose values hash the
    same, gets the value without running the function."""
    first = _store_run(tmp_path)
    assert first["runs"] == [3]
    second = _store_run(tmp_path)
    assert second == {"runs": [], "v": first["v"], "hits": 1}
    assert second["v"] == "{'k': 4, 'z': -0.0}"
    third = _store_run(tmp_path, x=2)              # a dependency hashes differently
    assert third["runs"] == [3] and third["v"] == "{'k': 5, 'z': -0.0}"


def test_store_identity_without_version_is_the_code(tmp_path):
    """with no `version`, a hash of its code object stands in, so editing the function body
    invalidates its entries."""
    _store_run(tmp_path)
    edited = _store_run(tmp_path, edit=" * 1")
    assert edited["runs"] == [3]


def test_store_identity_with_version_is_module_qualname_version(tmp_path):
    """A cell's identity across processes is its module, qualified name and `version`"""
    _store_run(tmp_path, decor='(version="1")')
    edited = _store_run(tmp_path, decor='(version="1")', edit=" * 1")
    assert edited["runs"] == []                    # the same identity: the stored value
    bumped = _store_run(tmp_path, decor='(version="2")', edit=" * 1")
    assert bumped["runs"] == [3]


def test_not_persistable_value_stays_in_memory_with_one_warning_per_cell(tmp_path):
    """A value the codec cannot encode stays in memory, with one `incr.NotPersistableWarning`
    per cell."""
    runs = []

    @incr.cell
    def opaque(k):
        runs.append(k)
        return object()

    rt = incr.Runtime(store=tmp_path / "s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rt:
            values = [opaque(k) for k in range(4)]
            assert [opaque(k) for k in range(4)] == values   # kept in memory
    rt.close()
    kinds = [w.category for w in caught]
    assert kinds.count(incr.NotPersistableWarning) == 1
    assert issubclass(incr.NotPersistableWarning, Warning)
    assert runs == [0, 1, 2, 3]


def test_damaged_record_is_a_miss_and_a_warning(tmp_path):
    """A damaged record is a miss (recompute) and a warning, never a wrong value."""
    lmdb = pytest.importorskip("lmdb")
    runs = []

    @incr.cell
    def val(k):
        runs.append(k)
        return {"k": k, "text": "x" * 40}

    def once():
        rt = incr.Runtime(store=tmp_path / "s")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with rt:
                out = [val(k) for k in range(3)]
        rt.close()
        return out, caught

    good, _ = once()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=16)
    db = env.open_db(b"entries", create=False)
    with env.begin(write=True, db=db) as txn:
        for k, v in list(txn.cursor()):
            b = bytearray(v)
            b[len(b) // 2] ^= 0x01
            txn.put(k, bytes(b))
    env.close()
    runs.clear()
    again, caught = once()
    assert again == good
    assert sorted(runs) == [0, 1, 2]
    assert any(issubclass(w.category, UserWarning) and "damage" in str(w.message).lower()
               for w in caught) or any("Damaged" in w.category.__name__ for w in caught)


# ============================================================================================
# LLM nodes
# ============================================================================================

def test_llm_returns_the_accepted_candidate_with_previous_and_feedback(rt):
    """Calling `write_sql(request)` (inside a cell or at top level) returns the accepted
    candidate. ... on rejection it calls the generator again with `previous` (the last
    candidate) and `feedback` (the NACKs, with their counterexamples, that apply to it"""
    log = []

    @incr.validator(version="1")
    def has_x(candidate, request):
        yield (incr.ACK("x") if "x" in candidate
               else incr.NACK("x", counterexample={"want": "x"}))

    @incr.llm(validators=[has_x], version="1")
    def write(request, *, previous=None, feedback=()):
        return gen_body(request, previous=previous, feedback=feedback)

    gen_body = gen_of(["a", "ax"], log)

    @incr.cell
    def inside():
        return write("q").upper()

    with rt:
        assert write("q") == "ax"
        assert inside() == "AX"
    assert log[0] == ("a", None, ())
    assert log[1][:2] == ("ax", "a")
    assert log[1][2] == (incr.NACK("x", counterexample={"want": "x"}),)
    assert len(log) == 2
    stats = rt.stats()
    assert (stats["generations"], stats["validations"]) == (2, 2)


def test_verdicts_have_kind_and_fields():
    """`incr.ACK(case, evidence=None)`, `incr.NACK(case, counterexample=None, message="")`,
    `incr.UNKNOWN(case, reason="")`; each exposes `.kind` (`"ACK"`, `"NACK"`, `"UNKNOWN"`) and
    the fields it was made with."""
    a, n, u = incr.ACK("c"), incr.NACK("c"), incr.UNKNOWN("c")
    assert (a.kind, a.case, a.evidence) == ("ACK", "c", None)
    assert (n.kind, n.case, n.counterexample, n.message) == ("NACK", "c", None, "")
    assert (u.kind, u.case, u.reason) == ("UNKNOWN", "c", "")
    n2 = incr.NACK("d", counterexample={"rows": [1]}, message="m")
    assert (n2.counterexample, n2.message) == ({"rows": [1]}, "m")
    assert incr.ACK("e", evidence=[1]).evidence == [1]
    assert incr.UNKNOWN("f", reason="r").reason == "r"


@pytest.mark.parametrize("make", ["ack_case", "nack_message", "unknown_case"])
def test_verdict_with_garbage_fields_is_refused(make):
    """Bad arguments raise `TypeError` or `ValueError` with a message that names the cell and
    the argument. (A verdict's case is the `str` naming the check.)"""
    do = {"ack_case": lambda: incr.ACK(3), "nack_message": lambda: incr.NACK("c", message=3),
          "unknown_case": lambda: incr.UNKNOWN(None)}[make]
    with pytest.raises((TypeError, ValueError)):
        do()


def test_verdicts_are_bound_to_validator_version_case_and_revision(rt):
    """Every verdict is bound to (validator id, validator version, case, candidate
    revision)."""
    @incr.validator(version="7")
    def check(candidate):
        return incr.ACK("ok") if candidate == "b" else incr.NACK("ok")

    @incr.llm(validators=[check], version="1")
    def node(*, previous=None, feedback=()):
        return body(previous=previous, feedback=feedback)

    body = gen_of(["a", "b"])
    with rt:
        node()
        checks = rt.state(node).checks
    ids = {k[0] for k in checks}
    assert len(ids) == 1 and "check" in ids.pop()
    assert {(k[1], k[2], k[3]): v.kind for k, v in checks.items()} == {
        ("7", "ok", 1): "NACK", ("7", "ok", 2): "ACK"}


def test_raising_validator_yields_unknown_never_nack(rt):
    """A validator that raises or times out yields UNKNOWN, never NACK. UNKNOWN never counts
    toward acceptance."""
    calls = []

    @incr.validator(version="1")
    def broken(candidate):
        raise RuntimeError("validator broke")

    @incr.llm(validators=[broken], version="1", budget=incr.Budget(max_attempts=3))
    def node(*, previous=None, feedback=()):
        calls.append(previous)
        return f"c{len(calls)}"

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
        verdicts = list(rt.state(node).checks.values())
    assert verdicts and all(v.kind == "UNKNOWN" for v in verdicts)
    assert info.value.reason == "unknown"


def test_timed_out_validator_yields_unknown(rt):
    """A validator that raises or times out yields UNKNOWN, never NACK."""
    release = threading.Event()

    @incr.validator(version="1", timeout=0.2)
    def slow(candidate):
        release.wait(10)
        return incr.NACK("slow")

    @incr.llm(validators=[slow], version="1", budget=incr.Budget(max_attempts=1))
    def node(*, previous=None, feedback=()):
        return "c"

    with rt:
        try:
            with pytest.raises(incr.NotAccepted):
                node()
        finally:
            release.set()
        kinds = [v.kind for v in rt.state(node).checks.values()]
    assert kinds == ["UNKNOWN"]


def test_acceptance_required_and_min_cases(rt):
    """the current candidate is accepted when every required validator (default: all of them)
    gave at least one ACK and no NACK and no UNKNOWN for it, and the number of distinct ACKed
    (validator, case) pairs is at least `min_cases`. The same ACK repeated counts once."""
    @incr.validator(version="1")
    def twice_same(candidate):
        yield incr.ACK("one")
        yield incr.ACK("one")

    @incr.validator(version="1")
    def nacks(candidate):
        return incr.NACK("bad")

    @incr.llm(validators=[twice_same], accept=incr.Acceptance(min_cases=2), version="1",
              budget=incr.Budget(max_attempts=2))
    def needs_two(*, previous=None, feedback=()):
        return "same" if previous is None else "other"

    @incr.llm(validators=[twice_same, nacks], accept=incr.Acceptance(required=[twice_same]),
              version="1", budget=incr.Budget(max_attempts=2))
    def only_first_required(*, previous=None, feedback=()):
        return "cand"

    with rt:
        with pytest.raises(incr.NotAccepted):
            needs_two()                      # one distinct ACK, repeated: not two
        # a NACK from a validator that is not required still rejects ("no NACK")
        with pytest.raises(incr.NotAccepted):
            only_first_required()
    assert incr.Acceptance().required is None and incr.Acceptance().min_cases == 0


def test_acceptance_required_subset_accepts_with_its_acks(rt):
    """every required validator (default: all of them) gave at least one ACK"""
    @incr.validator(version="1")
    def req(candidate):
        return incr.ACK("r")

    @incr.validator(version="1")
    def silent(candidate):
        return []

    @incr.llm(validators=[req, silent], accept=incr.Acceptance(required=[req]), version="1")
    def node(*, previous=None, feedback=()):
        return "cand"

    @incr.llm(validators=[req, silent], version="1", budget=incr.Budget(max_attempts=1))
    def all_required(*, previous=None, feedback=()):
        return "cand"

    with rt:
        assert node() == "cand"
        with pytest.raises(incr.NotAccepted):
            all_required()                   # silent gave no ACK


def test_acceptance_garbage_required_names_the_argument():
    """Bad arguments raise `TypeError` or `ValueError` with a message that names the cell and
    the argument."""
    with pytest.raises(TypeError, match="required"):
        incr.Acceptance(required=3)


def test_node_without_validators_accepts_its_first_candidate_unvalidated(rt):
    """A node with no validators accepts its first candidate. ... (v2) `"unvalidated"` for a
    node with no validators that returned a candidate."""
    calls = []

    @incr.llm(version="1")
    def free(*, previous=None, feedback=()):
        calls.append(1)
        return "first"

    with rt:
        assert free() == "first"
        assert rt.state(free).status == "unvalidated"
    assert calls == [1]


def test_ack_for_another_revision_never_changes_the_current_status(rt):
    """An ACK or NACK for another candidate revision never changes the current one's status."""
    @incr.validator(version="1")
    def check(candidate):
        return incr.ACK("ok") if candidate == "b" else incr.NACK("ok")

    @incr.llm(validators=[check], version="1")
    def node(*, previous=None, feedback=()):
        return body(previous=previous, feedback=feedback)

    body = gen_of(["a", "b"])
    with rt:
        assert node() == "b"
        rt.ack(node, revision=1, case="human")
        rt.nack(node, revision=1, case="human2", counterexample="x")
        st = rt.state(node)
        assert (st.status, st.revision, st.candidate) == ("stable", 2, "b")
        assert node() == "b"


def test_budget_defaults_and_not_accepted_fields(rt):
    """`incr.Budget(max_attempts=5, max_seconds=None, max_tokens=None, max_cost=None)` and the
    stop conditions end a node's loop with `incr.NotAccepted`, which carries `.reason`,
    `.report` (readable text: attempts, verdicts, counterexamples) and `.best` ... The
    generator is never called more than the budget allows."""
    b = incr.Budget()
    assert (b.max_attempts, b.max_seconds, b.max_tokens, b.max_cost) == (5, None, None, None)
    calls = []

    @incr.validator(version="1")
    def judge(candidate):
        yield incr.ACK("a") if candidate.endswith(("2", "3")) else incr.NACK("a", "cx-a")
        yield incr.ACK("b") if candidate.endswith("3") else incr.NACK("b", f"cx-{candidate}")

    @incr.llm(validators=[judge], version="1")
    def node(*, previous=None, feedback=()):
        calls.append(1)
        return f"cand{len(calls) if len(calls) < 3 else 2}{'x' * len(calls)}"

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
        e = info.value
        assert len(calls) <= 5
        assert isinstance(e, incr.IncrError)
        assert e.reason in ("budget", "no_progress", "oscillation")
        assert isinstance(e.report, str) and "cand1" in e.report and "cx-" in e.report
        assert e.best is None or e.best.startswith("cand")
        with pytest.raises(incr.NotAccepted):
            node()                           # demanded again: no new generator call
    n = len(calls)
    assert n <= 5


def test_budget_max_attempts_bounds_the_generator(rt):
    """The generator is never called more than the budget allows."""
    calls = []

    @incr.validator(version="1")
    def never(candidate):
        return incr.NACK("c", counterexample=candidate)

    @incr.llm(validators=[never], budget=incr.Budget(max_attempts=3), version="1")
    def node(*, previous=None, feedback=()):
        calls.append(1)
        return f"c{len(calls)}"

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
        with pytest.raises(incr.NotAccepted):
            node()
    assert info.value.reason == "budget" and len(calls) == 3


def test_budget_max_tokens_counts_candidate_tokens(rt):
    """`incr.Budget(..., max_tokens=None, ...)` ... The generator is never called more than the
    budget allows."""
    calls = []

    @incr.validator(version="1")
    def never(candidate):
        return incr.NACK("c", counterexample=candidate)

    @incr.llm(validators=[never], budget=incr.Budget(max_attempts=10, max_tokens=250),
              version="1")
    def node(*, previous=None, feedback=()):
        calls.append(1)
        return incr.Candidate(f"c{len(calls)}", tokens=100)

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
    assert info.value.reason == "budget"
    assert len(calls) <= 3


def test_budget_garbage_is_a_value_error():
    """Bad arguments raise `TypeError` or `ValueError` with a message that names the cell and
    the argument."""
    for kw in ({"max_attempts": 0}, {"max_attempts": "3"}, {"max_attempts": 1.5},
               {"max_seconds": -1}, {"max_tokens": 0}, {"max_cost": -0.5}):
        with pytest.raises((TypeError, ValueError), match=next(iter(kw))):
            incr.Budget(**kw)


@pytest.mark.parametrize("reason", ["oscillation", "no_progress", "validator_unstable",
                                    "unknown"])
def test_not_accepted_reasons(rt, reason):
    """`.reason` (`"budget"`, `"oscillation"` — a candidate seen before came back,
    `"no_progress"` — two attempts in a row brought no new evidence, `"validator_unstable"` —
    the same candidate and case got conflicting verdicts, `"unknown"` — required evidence could
    not be obtained)"""
    if reason == "oscillation":
        answers = ["a", "b", "a", "c", "d", "e"]

        def verdicts(c):
            return [incr.NACK("c", counterexample=c)]
    elif reason == "no_progress":
        answers = ["a", "b", "c", "d", "e", "f"]

        def verdicts(c):
            return [incr.NACK("c", counterexample="same")]
    elif reason == "validator_unstable":
        answers = ["a", "b", "c", "d", "e", "f"]

        def verdicts(c):
            return [incr.ACK("c"), incr.NACK("c", counterexample=1)]
    else:
        answers = ["a", "b", "c", "d", "e", "f"]

        def verdicts(c):
            return [incr.UNKNOWN("c", reason="no oracle")]

    @incr.validator(version="1")
    def judge(candidate):
        return verdicts(candidate)

    calls = []

    @incr.llm(validators=[judge], budget=incr.Budget(max_attempts=6), version="1")
    def node(*, previous=None, feedback=()):
        calls.append(1)
        return answers[len(calls) - 1]

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
    assert info.value.reason == reason
    assert len(calls) < 6


def test_state_fields(rt):
    """`rt.state(llm_node, *args) -> incr.NodeState` with `candidate`, `revision` (candidate
    version, from 1), `context_key` (hex string), `dependency_revisions` (dict: dependency
    label -> revision seen), `checks` (dict: (validator id, validator version, case, revision)
    -> verdict) and `status` ... (v2) `attempts`: per revision, the candidate, its
    rationale/hypothesis/patch, the feedback it was given, its verdicts, and whether it was
    kept or reverted."""
    topic = rt.input("topic", "sql")
    rt.input("noise", 0).set(1)              # revision 1: topic last changed at revision 0

    @incr.validator(version="1")
    def check(candidate, k):
        return incr.ACK("ok") if candidate.startswith("good") else incr.NACK("ok", "cx")

    @incr.llm(validators=[check], version="1")
    def node(k, *, previous=None, feedback=()):
        t = topic.get()
        if previous is None:
            return incr.Candidate(f"bad {t}", rationale="first try", hypothesis="h1")
        return incr.Candidate(f"good {t}", rationale="fixed")

    with rt:
        node(1)
        st = rt.state(node, 1)
    assert isinstance(st, incr.NodeState)
    assert (st.candidate, st.revision, st.status) == ("good sql", 2, "stable")
    int(st.context_key, 16)
    assert isinstance(st.context_key, str)
    assert st.dependency_revisions == {"input 'topic'": 0}
    assert all(isinstance(k, tuple) and len(k) == 4 for k in st.checks)
    assert [a["revision"] for a in st.attempts] == [1, 2]
    first = st.attempts[0]
    assert first["candidate"] == "bad sql" and first["rationale"] == "first try"
    assert first["hypothesis"] == "h1" and "patch" in first
    assert [(vid.rsplit(".", 1)[-1], v.kind) for vid, v in first["verdicts"]] == [
        ("check", "NACK")]
    assert st.attempts[1]["feedback"] and st.attempts[1]["feedback"][0].counterexample == "cx"
    assert [a["outcome"] for a in st.attempts] == ["rejected", "accepted"]


def test_reader_of_a_withdrawn_node_reports_invalid_until_it_reruns(rt):
    """A cell that read a withdrawn node reports `"invalid"` through `rt.state` until it
    re-runs."""
    @incr.llm(version="1")
    def node(*, previous=None, feedback=()):
        return "v2" if feedback else "v1"

    @incr.cell
    def reader():
        return node() + "!"

    with rt:
        assert reader() == "v1!"
        rt.nack(node, revision=1, case="human", counterexample="no")
        assert rt.state(node).status == "invalid"
        assert rt.state(reader).status == "invalid"
        assert reader() == "v2!"
        assert rt.state(reader).status == "stable"


def test_pass_path_calls_neither_generator_nor_validators(rt):
    """PASS path: a stable node whose context key is unchanged returns its candidate without
    calling the generator or any validator."""
    calls, vcalls = [], []
    other = rt.input("other", 0)

    @incr.validator(version="1")
    def check(candidate, q):
        vcalls.append(candidate)
        return incr.ACK("ok")

    @incr.llm(validators=[check], version="1")
    def node(q, *, previous=None, feedback=()):
        calls.append(q)
        return q * 2

    @incr.cell
    def reader():
        other.get()
        return node("a")

    with rt:
        assert reader() == "aa"
        other.set(1)
        assert reader() == "aa" and node("a") == "aa"
    assert calls == ["a"] and vcalls == ["aa"]


def test_pass_path_holds_across_processes(tmp_path):
    """With a store, the PASS path holds across processes."""
    prog = """
    import json, sys
    import incr
    calls, vcalls = [], []

    @incr.validator(version="1")
    def check(candidate, q):
        vcalls.append(candidate)
        return incr.ACK("ok")

    @incr.llm(validators=[check], version="1")
    def node(q, *, previous=None, feedback=()):
        calls.append(q)
        return q.upper()

    rt = incr.Runtime(store=sys.argv[1])
    with rt:
        v = node("abc")
        status = rt.state(node, "abc").status
    rt.close()
    print(json.dumps([v, calls, vcalls, status]))
    """
    outs = []
    for _ in range(2):
        proc = run_py(prog, tmp_path, str(tmp_path / "s"))
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert outs[0] == ["ABC", ["abc"], ["ABC"], "stable"]
    assert outs[1] == ["ABC", [], [], "stable"]


def test_context_key_covers_version_validators_arguments_and_dependencies(rt):
    """The context key covers the node's definition (`version`), its validators' ids and
    versions, its arguments and the content hashes of every dependency it or its validators
    read."""
    dep = rt.input("dep", 1)
    vdep = rt.input("vdep", 1)

    def make(version="1", vversion="1"):
        @incr.validator(version=vversion)
        def check(candidate, q):
            vdep.get()
            return incr.ACK("ok")

        @incr.llm(validators=[check], version=version)
        def node(q, *, previous=None, feedback=()):
            dep.get()
            return "c"
        return node

    with rt:
        base = make()
        base(1)
        key = rt.state(base, 1).context_key
        base(2)
        assert rt.state(base, 2).context_key != key
        dep.set(2)
        base(1)
        key_dep = rt.state(base, 1).context_key
        assert key_dep != key
        vdep.set(2)
        base(1)
        assert rt.state(base, 1).context_key != key_dep
    keys = set()
    # definition and validator versions: separate runtimes with the same inputs
    for version, vversion in (("1", "1"), ("2", "1"), ("1", "2")):
        rt3 = incr.Runtime()
        dep = rt3.input("dep", 1)
        vdep = rt3.input("vdep", 1)
        node = make(version, vversion)
        with rt3:
            node(1)
            keys.add(rt3.state(node, 1).context_key)
    assert len(keys) == 3


def test_dependency_change_revalidates_before_generating(rt):
    """When a dependency changes, the current candidate is first re-validated under the new
    context; the generator runs only if that fails."""
    limit = rt.input("limit", 5)
    calls, vcalls = [], []

    @incr.validator(version="1")
    def short(candidate):
        vcalls.append(candidate)
        return (incr.ACK("short") if len(candidate) <= limit.get()
                else incr.NACK("short", counterexample=len(candidate)))

    @incr.llm(validators=[short], version="1")
    def node(*, previous=None, feedback=()):
        return body(previous=previous, feedback=feedback)

    body = gen_of(["abc", "ab"], calls)
    with rt:
        assert node() == "abc"
        limit.set(4)                         # still valid: re-validated, not regenerated
        assert node() == "abc"
        assert len(calls) == 1 and vcalls == ["abc", "abc"]
        limit.set(2)                         # invalid now: generates
        assert node() == "ab"
    assert len(calls) == 2 and calls[1][1] == "abc"


def test_reject_regenerates_only_the_blamed_node(rt):
    """inside any cell or validator, `raise incr.Reject(llm_node, *args, case=...,
    counterexample=...)` says that the candidate of that node which this computation consumed
    is wrong. ... only that node generates again (with the counterexample as feedback), and
    the nodes that feed it are not regenerated."""
    log = []

    @incr.llm(version="1")
    def upstream(*, previous=None, feedback=()):
        log.append("upstream")
        return "u"

    @incr.llm(version="1")
    def node(*, previous=None, feedback=()):
        log.append(("node", tuple(f.counterexample for f in feedback)))
        return upstream() + str(len(feedback))

    @incr.cell
    def consumer():
        v = node()
        if v.endswith("0"):
            raise incr.Reject(node, case="ends-in-0", counterexample=v)
        return v

    with rt:
        assert consumer() == "u1"
    assert log == [("node", ()), "upstream", ("node", ("u0",))]


def test_reject_in_a_validator_blames_a_consumed_node(rt):
    """inside any cell or validator, `raise incr.Reject(llm_node, *args, case=...,
    counterexample=...)`"""
    log = []

    @incr.llm(version="1")
    def spec(*, previous=None, feedback=()):
        log.append(("spec", len(feedback)))
        return "spec-ok" if feedback else "spec-bad"

    @incr.validator(version="1")
    def uses_spec(candidate):
        s = spec()
        if s == "spec-bad":
            raise incr.Reject(spec, case="spec", counterexample=s)
        return incr.ACK("ok")

    @incr.llm(validators=[uses_spec], version="1")
    def impl(*, previous=None, feedback=()):
        log.append(("impl", len(feedback)))
        return "impl"

    with rt:
        assert impl() == "impl"
    assert ("spec", 1) in log and rt.state(spec).revision == 2


def test_reject_of_something_that_is_not_a_node_is_a_type_error():
    """`raise incr.Reject(llm_node, *args, case=..., counterexample=...)` ... Bad arguments
    raise `TypeError` or `ValueError` with a message that names the cell and the argument."""
    with pytest.raises(TypeError):
        incr.Reject(3)


def test_nack_from_outside_invalidates_at_once_and_keeps_a_regression_case(rt):
    """`rt.nack(llm_node, *args, revision=N, case=..., counterexample=...)` and `rt.ack(...)` do
    the same with an explicit revision. A NACK for the current revision makes that node invalid
    at once; its dependents are invalidated through the same propagation as an input change;
    ... Its counterexample stays as a regression case: it is passed to later generations and,
    where the node declares `recheck=callable(candidate, counterexample, *args) -> verdict`,
    re-checked on every later revision."""
    rechecks = []
    log = []

    def recheck(candidate, counterexample, q):
        rechecks.append((candidate, counterexample, q))
        return incr.ACK("h") if candidate != "bad" else incr.NACK("h")

    @incr.llm(version="1", recheck=recheck)
    def node(q, *, previous=None, feedback=()):
        return body(q, previous=previous, feedback=feedback)

    body = gen_of(["bad", "good", "better"], log)
    seen = []

    @incr.cell
    def reader():
        seen.append(1)
        return node("q")

    with rt:
        assert reader() == "bad"
        rev = rt.revision
        rt.nack(node, "q", revision=1, case="h", counterexample="ce")
        assert rt.revision == rev + 1
        assert rt.state(node, "q").status == "invalid"
        assert reader() == "good"
        assert log[1][2] and log[1][2][0].counterexample == "ce"
        assert ("good", "ce", "q") in rechecks
        rt.nack(node, "q", revision=2, case="other", counterexample="ce2")
        assert reader() == "better"
        assert ("better", "ce", "q") in rechecks       # the first case, re-checked again
        assert [f.counterexample for f in log[2][2]][:2] and "ce" in [
            f.counterexample for f in log[2][2]]
    assert len(seen) == 3


def test_nack_and_ack_check_their_arguments(rt):
    """Bad arguments raise `TypeError` or `ValueError` with a message that names the cell and
    the argument."""
    @incr.llm(version="1")
    def node(*, previous=None, feedback=()):
        return "c"

    with rt:
        node()
        with pytest.raises(ValueError, match="revision"):
            rt.nack(node, revision=9, case="k")
        with pytest.raises(TypeError, match="revision"):
            rt.nack(node, revision="1", case="k")
        with pytest.raises(TypeError, match="case"):
            rt.ack(node, revision=1, case=3)
        assert rt.state(node).status == "unvalidated" and rt.revision == 0


def test_stabilize_runs_observed_llm_generators_concurrently_up_to_max_workers():
    """`rt.stabilize()` runs the generators (and validators) of independent stale LLM instances
    concurrently, up to `max_workers`: observed instances"""
    barrier = threading.Barrier(2, timeout=10)
    lock = threading.Lock()
    active, peak = [0], [0]
    gate = threading.Event()

    @incr.llm(version="1")
    def meet(k, *, previous=None, feedback=()):
        barrier.wait()                       # two at once, or a BrokenBarrierError
        return k

    @incr.llm(version="1")
    def count(k, *, previous=None, feedback=()):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            gate.wait(0.05)
        finally:
            with lock:
                active[0] -= 1
        return k

    rt = incr.Runtime(max_workers=2)
    obs = [rt.observe(meet, k) for k in (1, 2)]
    rt.stabilize()
    assert [o.value for o in obs] == [1, 2]
    rt2 = incr.Runtime(max_workers=2)
    obs2 = [rt2.observe(count, k) for k in range(6)]
    rt2.stabilize()
    assert [o.value for o in obs2] == list(range(6))
    assert 1 <= peak[0] <= 2


def test_stabilize_runs_stale_llm_dependencies_of_observed_cells_concurrently():
    """`rt.stabilize()` runs the generators (and validators) of independent stale LLM instances
    concurrently, up to `max_workers`: observed instances, and instances the observed ones
    depend on."""
    barrier = threading.Barrier(2, timeout=1.5)
    meet_now = [False]
    calls = []

    @incr.llm(version="1")
    def meet(k, *, previous=None, feedback=()):
        calls.append(k)
        s = src.get()
        if meet_now[0]:
            barrier.wait()
        return f"{k}{s}"

    @incr.cell
    def both():
        return [meet(1), meet(2)]

    rt = incr.Runtime(max_workers=2)
    src = rt.input("src", "a")
    obs = rt.observe(both)
    rt.stabilize()                           # the trace now knows both dependencies
    assert obs.value == ["1a", "2a"]
    meet_now[0] = True
    src.set("b")                             # both nodes are stale (no validators: regenerate)
    rt.stabilize()
    assert obs.value == ["1b", "2b"]


def test_effect_runs_once_and_is_not_undone(rt):
    """`@incr.effect` marks a cell with outside effects (sending, writing): ... a later
    invalidation never "undoes" it; it runs again only when its inputs change."""
    sent = []
    other = rt.input("other", 0)

    @incr.validator(version="1")
    def ok(candidate):
        return incr.ACK("ok")

    @incr.llm(validators=[ok], version="1")
    def node(*, previous=None, feedback=()):
        return f"v{len(feedback)}"

    @incr.effect
    def send():
        sent.append(node())
        return len(sent)

    with rt:
        assert send() == 1
        other.set(1)
        assert send() == 1
        rt.nack(node, revision=1, case="x", counterexample="y")
        assert sent == ["v0"]                # the NACK did not undo or re-send
        send()
    assert sent == ["v0", "v1"]              # its input (the candidate) changed


def test_effect_runs_only_when_every_llm_dependency_is_stable(rt):
    """`@incr.effect` ... runs only once every LLM node it depends on is stable"""
    sent = []

    @incr.llm(version="1")
    def unchecked(*, previous=None, feedback=()):
        return "draft"

    @incr.effect
    def send():
        sent.append(unchecked())
        return 1

    with rt:
        try:
            send()
        except incr.IncrError:
            pass
        assert rt.state(unchecked).status == "unvalidated"
    assert sent == []


# ============================================================================================
# Errors
# ============================================================================================

def test_error_hierarchy():
    """`incr.IncrError` is the base of `CycleError`, `ReentrancyError`, `NotAccepted` and
    `StoreError` (store unreadable, unwritable, full or refused)."""
    for cls in (incr.CycleError, incr.ReentrancyError, incr.NotAccepted, incr.StoreError):
        assert issubclass(cls, incr.IncrError)
    assert issubclass(incr.IncrError, Exception)


def test_unusable_store_is_a_store_error(tmp_path):
    """`StoreError` (store unreadable, unwritable, full or refused)."""
    path = tmp_path / "s"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"this is not an LMDB file" * 400)
    with pytest.raises(incr.StoreError) as info:
        incr.Runtime(store=path)
    assert str(path) in str(info.value)
    taken = incr.Runtime(store=tmp_path / "t")
    try:
        with pytest.raises(incr.StoreError):
            incr.Runtime(store=tmp_path / "t")       # refused: open in this process
    finally:
        taken.close()


# ============================================================================================
# Command line
# ============================================================================================

def _cli(tmp_path, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-m", "incr.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_commands_print_text_and_json(tmp_path):
    """`incr demo` runs the main job on the embedded store; `incr inspect STORE` lists
    instances, statuses and verdicts; `incr graph STORE` draws the trace (DOT, and an HTML
    page); `incr gc STORE` drops unreachable entries. Each prints readable text by default and
    `--json` on request."""
    demo = _cli(tmp_path, "demo")
    assert demo.returncode == 0, demo.stderr
    assert (tmp_path / ".incr" / "data.mdb").exists()
    assert not demo.stdout.lstrip().startswith("{")
    json.loads(_cli(tmp_path, "demo", "--json").stdout)
    inspect = _cli(tmp_path, "inspect", ".incr")
    assert inspect.returncode == 0 and "write_sql" in inspect.stdout
    assert "stable" in inspect.stdout or "unvalidated" in inspect.stdout
    assert "instances" in json.loads(_cli(tmp_path, "inspect", ".incr", "--json").stdout)
    graph = _cli(tmp_path, "graph", ".incr")
    assert graph.returncode == 0 and graph.stdout.startswith("digraph")
    json.loads(_cli(tmp_path, "graph", ".incr", "--json").stdout)
    html = _cli(tmp_path, "graph", ".incr", "--format", "html")
    assert html.returncode == 0 and "<html" in html.stdout.lower()
    gc = _cli(tmp_path, "gc", ".incr")
    assert gc.returncode == 0 and "dropped" in gc.stdout
    assert "dropped" in json.loads(_cli(tmp_path, "gc", ".incr", "--json").stdout)


# ============================================================================================
# Reuse across instances (v2)
# ============================================================================================

def test_reuse_revalidate_tries_the_last_accepted_candidate_first(rt):
    """`@incr.llm(..., reuse="revalidate")`: a new instance of a node (other arguments) first
    runs the validators on the accepted candidate of the most recent instance of the same
    definition, under its own context, before any model call; it becomes stable only with its
    own evidence."""
    calls, vcalls = [], []

    @incr.validator(version="1")
    def fits(candidate, q):
        vcalls.append((candidate, q))
        return (incr.ACK("fits") if candidate.startswith("good")
                and (q != 3 or candidate == "good-3") else incr.NACK("fits", counterexample=q))

    @incr.llm(validators=[fits], version="1", reuse="revalidate")
    def node(q, *, previous=None, feedback=()):
        calls.append((q, previous))
        return f"good-{q}"

    with rt:
        assert node(1) == "good-1"
        assert node(2) == "good-1"           # reused: no model call
        assert calls == [(1, None)]
        st = rt.state(node, 2)
        assert st.status == "stable"
        assert ("good-1", 2) in vcalls
        assert any(k[2] == "fits" and v.kind == "ACK" for k, v in st.checks.items())
        assert node(3) == "good-3"           # the reused candidate fails: the model is called
    assert [q for q, _ in calls] == [1, 3]
    assert ("good-1", 3) in vcalls


def test_reuse_default_starts_from_nothing(rt):
    """Default `reuse=None`: a new instance starts from nothing."""
    calls = []

    @incr.validator(version="1")
    def ok(candidate, q):
        return incr.ACK("ok")

    @incr.llm(validators=[ok], version="1")
    def node(q, *, previous=None, feedback=()):
        calls.append((q, previous))
        return f"c{q}"

    with rt:
        node(1)
        node(2)
    assert calls == [(1, None), (2, None)]
    with pytest.raises(ValueError, match="reuse"):
        incr.llm(reuse="always")(lambda *, previous=None, feedback=(): 1)


# ============================================================================================
# Concurrency and async (v2)
# ============================================================================================

def test_async_cell_demands_and_gathers_concurrently(rt):
    """`@incr.cell`, `@incr.llm` and `@incr.validator` accept `async def`. Inside an async
    cell, `await f(*args)` demands an instance; `await asyncio.gather(f(1), g(2))` demands
    several, and independent ones run concurrently."""
    events = {}
    runs = []

    @incr.cell
    async def meet(k):
        runs.append(k)
        events.setdefault(k, asyncio.Event()).set()
        await asyncio.wait_for(events.setdefault(1 - k, asyncio.Event()).wait(), 5)
        return k

    @incr.cell
    async def plus(k):
        return await meet(k) + 10

    @incr.cell
    async def top():
        return await asyncio.gather(plus(0), plus(1))

    with rt:
        assert top() == [10, 11]
        assert top() == [10, 11]
    assert sorted(runs) == [0, 1]


def test_async_llm_node_and_validator(rt):
    """`@incr.cell`, `@incr.llm` and `@incr.validator` accept `async def`."""
    @incr.validator(version="1")
    async def check(candidate):
        await asyncio.sleep(0)
        return incr.ACK("ok") if candidate == "b" else incr.NACK("ok", counterexample="a")

    @incr.llm(validators=[check], version="1")
    async def node(*, previous=None, feedback=()):
        await asyncio.sleep(0)
        return "b" if previous else "a"

    with rt:
        assert node() == "b"
        assert rt.state(node).status == "stable"


def test_sync_code_gets_an_async_cells_value_and_async_api(rt):
    """Sync code that calls an async cell gets its value (the runtime drives an event loop);
    inside a running loop use `await f(...)`, `await rt.astabilize()`, `await rt.aclose()`."""
    @incr.cell
    async def plus1(k):
        await asyncio.sleep(0)
        return k + 1

    with rt:
        assert plus1(1) == 2

    async def main():
        rt2 = incr.Runtime()
        with rt2:
            assert await plus1(5) == 6
        obs = rt2.observe(plus1, 7)
        report = await rt2.astabilize()
        assert report.recomputed == ["plus1(7)"] and obs.value == 8
        await rt2.aclose()
        return rt2.closed

    assert asyncio.run(main()) is True


def test_dependencies_are_recorded_per_task(rt):
    """Dependencies are recorded per task: concurrent computations never mix reads."""
    a, b = rt.input("a", 1), rt.input("b", 2)
    runs = []
    step = {}

    @incr.cell
    async def read_a():
        runs.append("a")
        step.setdefault("a_started", asyncio.Event()).set()
        await asyncio.wait_for(step.setdefault("b_read", asyncio.Event()).wait(), 5)
        return a.get()

    @incr.cell
    async def read_b():
        runs.append("b")
        await asyncio.wait_for(step.setdefault("a_started", asyncio.Event()).wait(), 5)
        v = b.get()                          # while read_a is suspended
        step.setdefault("b_read", asyncio.Event()).set()
        return v

    @incr.cell
    async def top():
        return await asyncio.gather(read_a(), read_b())

    with rt:
        assert top() == [1, 2]
        step.clear()
        runs.clear()
        b.set(20)
        step["a_started"] = asyncio.Event()
        step["a_started"].set()
        step["b_read"] = asyncio.Event()
        step["b_read"].set()
        assert top() == [1, 20]
    assert runs == ["b"]                     # read_a did not record b


def test_incr_gather_demands_llm_nodes_concurrently(rt):
    """`incr.gather(*thunks)` inside a sync cell (and `cell.map(iterable_of_args)`) demands
    several instances concurrently and returns their values in order."""
    barrier = threading.Barrier(2, timeout=10)

    @incr.llm(version="1")
    def meet(k, *, previous=None, feedback=()):
        barrier.wait()
        return k * 10

    @incr.cell
    def both():
        return incr.gather(lambda: meet(1), lambda: meet(2))

    @incr.cell
    def mapped():
        return meet.map([3, 4])

    with rt:
        assert both() == [10, 20]
        assert mapped() == [30, 40]
    with pytest.raises(TypeError):
        incr.gather(3)


def test_incr_gather_demands_plain_cells_concurrently():
    """`incr.gather(*thunks)` inside a sync cell (and `cell.map(iterable_of_args)`) demands
    several instances concurrently and returns their values in order."""
    barrier = threading.Barrier(2, timeout=1.5)

    @incr.cell
    def meet(k):
        barrier.wait()
        return k

    @incr.cell
    def both():
        return incr.gather(lambda: meet(1), lambda: meet(2))

    with incr.Runtime(max_workers=2):
        assert both() == [1, 2]


def test_max_concurrency_bounds_async_generators():
    """`Runtime(max_workers=None, max_concurrency=None)`: threads for sync LLM generators and
    validators; concurrent tasks for async ones."""
    active, peak = [0], [0]

    @incr.llm(version="1")
    async def node(k, *, previous=None, feedback=()):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        for _ in range(5):
            await asyncio.sleep(0)
        active[0] -= 1
        return k

    rt = incr.Runtime(max_concurrency=2)
    obs = [rt.observe(node, k) for k in range(6)]
    rt.stabilize()
    assert [o.value for o in obs] == list(range(6))
    assert peak[0] == 2


def test_sync_generator_returning_an_awaitable_is_a_type_error(rt):
    """A coroutine function where a sync one is expected, or a sync generator that returns an
    awaitable, is a `TypeError` naming the function. A coroutine is never a candidate or a
    value."""
    async def later():
        return "x"

    @incr.llm(version="1")
    def sneaky(*, previous=None, feedback=()):
        return later()

    @incr.cell
    def sneaky_cell():
        return later()

    with rt:
        with pytest.raises(TypeError, match="sneaky"):
            sneaky()
        with pytest.raises(TypeError, match="sneaky_cell"):
            sneaky_cell()
    for opt in ("normalize", "on_failure", "recheck", "apply"):
        async def hook(*a, **k):
            return True
        with pytest.raises(TypeError, match=opt):
            incr.llm(**{opt: hook})(lambda *, previous=None, feedback=(): 1)


async def _async_hook(*args, **kwargs):
    return True


@pytest.mark.parametrize("where", ["cutoff", "on_change", "on_event", "register_type",
                                   "filter", "gather_thunk"])
def test_coroutine_function_where_a_sync_one_is_expected_is_a_type_error(where):
    """A coroutine function where a sync one is expected ... is a `TypeError` naming the
    function. A coroutine is never a candidate or a value."""
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    def c():
        return x.get()

    class Thing:
        pass

    do = {
        "cutoff": lambda: incr.cell(cutoff=_async_hook)(lambda: 1),
        "on_change": lambda: rt.observe(c).on_change(_async_hook),
        "on_event": lambda: rt.on_event(_async_hook),
        "register_type": lambda: incr.register_type(Thing, _async_hook, _async_hook),
        "filter": lambda: rt.input_map("m", {"a": 1}).filter(_async_hook),
        "gather_thunk": lambda: incr.gather(_async_hook),
    }[where]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # "coroutine never awaited"
        with pytest.raises(TypeError, match="_async_hook"):
            do()


def test_async_cutoff_never_yields_a_stale_value():
    """A coroutine is never a candidate or a value. (An async `cutoff` callable must not decide
    that a changed value is unchanged.)"""
    rt = incr.Runtime()
    x = rt.input("x", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            @incr.cell(cutoff=_async_hook)
            def base():
                return x.get()
        except TypeError:
            return                           # refused at definition: the contract is met
        with rt:
            base()
            x.set(2)
            assert base() == 2


def test_each_stale_instance_runs_once_and_untaken_branch_spends_no_model_call():
    """Each stale instance runs at most once per pass and never sees a mix of old and new
    values, whatever runs concurrently; a branch that the new run of its reader no longer
    takes never spends a model call."""
    calls = []

    @incr.llm(version="1")
    def expensive(*, previous=None, feedback=()):
        calls.append(src.get())
        return f"model({src.get()})"

    @incr.cell
    def reader():
        return expensive() if flag.get() else "off"

    @incr.cell
    def a():
        return reader() + "/a"

    @incr.cell
    def b():
        return reader() + "/b"

    rt = incr.Runtime(max_workers=4)
    src, flag = rt.input("src", 1), rt.input("flag", True)
    oa, ob = rt.observe(a), rt.observe(b)
    rt.stabilize()
    assert calls == [1]
    with rt.batch():
        src.set(2)
        flag.set(False)
    report = rt.stabilize()
    assert calls == [1]                      # expensive() is no longer needed: not called
    assert oa.value == "off/a" and ob.value == "off/b"
    assert report.recomputed.count("reader()") == 1


def test_cancelling_an_awaiting_task_records_nothing():
    """Cancelling an awaiting task leaves the trace consistent, with nothing half-recorded."""
    rt = incr.Runtime()
    x = rt.input("x", 1)
    runs = []

    @incr.cell
    async def slow():
        runs.append("slow")
        v = x.get()
        await asyncio.sleep(30)
        return v

    @incr.cell
    async def fast():
        runs.append("fast")
        return x.get()

    async def main():
        with rt:
            task = asyncio.create_task(slow.aget())
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await fast() == 1

    asyncio.run(main())
    assert "never been computed" in rt.explain(slow)
    rt._check()
    assert runs == ["slow", "fast"]


def test_set_from_another_thread_during_a_pass_is_not_seen_by_that_pass():
    """Each stale instance runs at most once per pass and never sees a mix of old and new
    values, whatever runs concurrently (CONCURRENCY.md rule 1: one pass, one revision)."""
    rt = incr.Runtime()
    x = rt.input("x", 1)
    started, set_done = threading.Event(), threading.Event()
    seen = []

    @incr.cell
    def reader():
        first = x.get()
        started.set()
        set_done.wait(10)
        seen.append((first, x.get()))
        return first

    obs = rt.observe(reader)
    values = []
    obs.on_change(values.append)
    errors = []

    def setter():
        started.wait(10)
        try:
            x.set(2)                         # from outside the pass: must not fail
        except Exception as e:               # noqa: BLE001 - reported below
            errors.append(e)
        set_done.set()

    t = threading.Thread(target=setter)
    t.start()
    report = rt.stabilize()
    t.join()
    assert errors == []
    assert seen == [(1, 1)] and report.recomputed == ["reader()"] and values == [1]
    rt.stabilize()
    assert seen == [(1, 1), (2, 2)] and values == [1, 2]


def test_single_flight_across_tasks(rt):
    """(CONCURRENCY.md rule 2, single flight) Each stale instance runs at most once per pass"""
    runs = []

    @incr.cell
    async def shared():
        runs.append("shared")
        await asyncio.sleep(0.01)
        return 5

    @incr.cell
    async def left():
        return await shared() + 1

    @incr.cell
    async def right():
        return await shared() + 2

    @incr.cell
    async def both():
        return await asyncio.gather(left(), right())

    with rt:
        assert both() == [6, 7]
    assert runs == ["shared"]


def test_cycle_across_tasks_is_a_cycle_error(rt):
    """(CONCURRENCY.md rule 3, cycles across tasks) A cell that demands itself, directly or
    through others, raises `incr.CycleError` naming the cycle"""
    @incr.cell
    async def ping(k):
        await asyncio.sleep(0)
        return await pong(k)

    @incr.cell
    async def pong(k):
        await asyncio.sleep(0)
        return await ping(k)

    with rt:
        with pytest.raises(incr.CycleError) as info:
            ping(1)
    assert "ping(1)" in str(info.value) and "pong(1)" in str(info.value)


class _InProcessExecutor:
    """An executor as Runtime(executor=...) takes it: submit() and results(); runs in this
    process, without serializing (as a thread-pool executor would)."""

    def __init__(self):
        self.submitted = 0

    def submit(self, fn, *args):
        self.submitted += 1
        return (fn, args)

    def results(self, handles):
        out = []
        for fn, args in handles:
            try:
                out.append((True, fn(*args)))
            except Exception as e:                    # noqa: BLE001 - travels back
                out.append((False, e))
        return out


def test_executor_receives_first_computations():
    """Executors (`Runtime(executor=...)`) receive first computations too."""
    ex = _InProcessExecutor()
    rt = incr.Runtime(executor=ex)

    @incr.cell
    def sq(i):
        return i * i

    obs = [rt.observe(sq, i) for i in range(3)]
    rt.stabilize()
    assert [o.value for o in obs] == [0, 1, 4]
    assert ex.submitted >= 3
    with pytest.raises(TypeError, match="executor"):
        incr.Runtime(executor=3)


def test_executor_that_does_not_serialize_keeps_dependencies():
    """Executors (`Runtime(executor=...)`) receive first computations too. (Dependencies are
    whatever it read on its last run.)"""
    ex = _InProcessExecutor()
    rt = incr.Runtime(executor=ex)
    x = rt.input("x", 1)

    @incr.cell
    def scaled(i):
        return x.get() * i

    obs = [rt.observe(scaled, i) for i in range(3)]
    rt.stabilize()
    x.set(2)
    rt.stabilize()
    assert [o.value for o in obs] == [0, 2, 4]


# ============================================================================================
# Control (v2)
# ============================================================================================

def _nack_every(name="judge"):
    @incr.validator(version="1")
    def judge(candidate, *args):
        return incr.NACK("c", counterexample=str(candidate))
    judge.__name__ = name
    return judge


def test_runtime_budget_bounds_model_calls_across_nodes():
    """`Runtime(budget=incr.Budget(...))`: model calls, tokens, cost and seconds across every
    node of the runtime; a node that would exceed it ends `NotAccepted(reason="budget")`."""
    calls = []

    @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=10))
    def node(q, *, previous=None, feedback=()):
        calls.append(q)
        return f"{q}-{len(calls)}"

    rt = incr.Runtime(budget=incr.Budget(max_attempts=3))
    with rt:
        with pytest.raises(incr.NotAccepted) as first:
            node(1)
        with pytest.raises(incr.NotAccepted) as second:
            node(2)
    assert first.value.reason == second.value.reason == "budget"
    assert len(calls) == 3
    with pytest.raises(TypeError, match="budget"):
        incr.Runtime(budget=3)


def test_runtime_budget_bounds_tokens_across_nodes():
    """`Runtime(budget=incr.Budget(...))`: model calls, tokens, cost and seconds across every
    node of the runtime; a node that would exceed it ends `NotAccepted(reason="budget")`."""
    calls = []

    @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=10))
    def node(q, *, previous=None, feedback=()):
        calls.append(q)
        return incr.Candidate(f"{q}-{len(calls)}", tokens=100)

    rt = incr.Runtime(budget=incr.Budget(max_tokens=250))
    with rt:
        for q in (1, 2):
            with pytest.raises(incr.NotAccepted) as info:
                node(q)
            assert info.value.reason == "budget"
    assert calls == [1, 1, 1]                # 300 tokens spent: node 2 gets no model call


def test_runtime_budget_without_an_attempt_limit():
    """`Runtime(budget=incr.Budget(...))`: model calls, tokens, cost and seconds across every
    node of the runtime; a node that would exceed it ends `NotAccepted(reason="budget")`.
    (`Budget(max_attempts=None)` is a valid Budget: no limit on calls.)"""
    calls = []

    @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=10))
    def node(*, previous=None, feedback=()):
        calls.append(1)
        return incr.Candidate(f"c{len(calls)}", tokens=100)

    rt = incr.Runtime(budget=incr.Budget(max_attempts=None, max_tokens=250))
    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
    assert info.value.reason == "budget" and len(calls) == 3


def test_budget_cooldown_spaces_two_attempts_of_one_node(rt):
    """`incr.Budget(..., cooldown=None)`: seconds between two attempts of one node. (A lower
    bound on the gap between two model calls; no upper bound is asserted.)"""
    import time
    stamps = []

    @incr.llm(validators=[_nack_every()], version="1",
              budget=incr.Budget(max_attempts=3, cooldown=0.05))
    def node(*, previous=None, feedback=()):
        stamps.append(time.monotonic())
        return f"c{len(stamps)}"

    assert incr.Budget().cooldown is None
    with rt:
        with pytest.raises(incr.NotAccepted):
            node()
    assert len(stamps) == 3
    assert all(b - a >= 0.05 for a, b in zip(stamps, stamps[1:]))


def test_normalize_default_folds_whitespace_and_case(rt):
    """`normalize(candidate) -> hashable` for repetition (default for `str`: whitespace and case
    folded)"""
    calls = []

    @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=5))
    def node(*, previous=None, feedback=()):
        calls.append(1)
        return ["SELECT  1", "select 1", "x", "y", "z"][len(calls) - 1]

    seen = []

    @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=5),
              normalize=lambda c: seen.append(c) or c)
    def exact(*, previous=None, feedback=()):
        return ["SELECT  1", "select 1", "x", "y", "z"][len(seen)]

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
        with pytest.raises(incr.NotAccepted) as info2:
            exact()
    assert info.value.reason == "oscillation" and len(calls) == 2
    assert info2.value.reason != "oscillation" or len(seen) > 2


def test_patience_ends_with_divergence(rt):
    """`patience`: attempts in a row below the best revision's distinct ACKs before
    `NotAccepted(reason="divergence")`"""
    @incr.validator(version="1")
    def cases(candidate):
        for k in "abcd":
            yield (incr.ACK(k) if k in candidate.split("-")[0]
                   else incr.NACK(k, counterexample=k))

    answers = ["ab-1", "a-2", "b-3", "c-4", "abcd-5"]
    calls = []

    @incr.llm(validators=[cases], version="1", budget=incr.Budget(max_attempts=5),
              patience=2)
    def node(*, previous=None, feedback=()):
        calls.append(previous)
        return answers[len(calls) - 1]

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
    assert info.value.reason == "divergence" and len(calls) == 3
    with pytest.raises(ValueError, match="patience"):
        incr.llm(patience=0)(lambda *, previous=None, feedback=(): 1)


def test_patch_true_and_apply(rt):
    """`patch=True` (or `apply=callable(previous, patch)`): the generator returns a patch
    against `previous`"""
    @incr.validator(version="1")
    def fixed(candidate):
        return (incr.ACK("fix") if "FIXED" in candidate
                else incr.NACK("fix", counterexample="no FIXED"))

    seen = []

    @incr.llm(validators=[fixed], version="1", patch=True)
    def text(*, previous=None, feedback=()):
        seen.append(previous)
        if previous is None:
            return "line1\nline2\n"
        return "--- a\n+++ b\n@@ -1,2 +1,2 @@\n line1\n-line2\n+line2 FIXED\n"

    applied = []

    def apply(previous, patch):
        applied.append((previous, patch))
        return previous + patch

    @incr.llm(validators=[fixed], version="1", apply=apply)
    def custom(*, previous=None, feedback=()):
        return "base" if previous is None else " FIXED"

    with rt:
        assert text() == "line1\nline2 FIXED\n"
        assert custom() == "base FIXED"
    assert seen == [None, "line1\nline2\n"]
    assert applied == [("base", " FIXED")]


def test_on_failure_candidate_is_validated_like_any_other(rt):
    """`on_failure(report) -> candidate | None` is called when a loop ends without acceptance
    (a returned candidate is validated like any other)"""
    @incr.validator(version="1")
    def good(candidate, q):
        return (incr.ACK("good") if candidate.startswith("good")
                else incr.NACK("good", counterexample=candidate))

    asked = []

    @incr.llm(validators=[good], version="1", budget=incr.Budget(max_attempts=1),
              on_failure=lambda r: asked.append(r) or "good-fallback")
    def rescued(q, *, previous=None, feedback=()):
        return "bad"

    @incr.llm(validators=[good], version="1", budget=incr.Budget(max_attempts=1),
              on_failure=lambda r: asked.append(r) or "still-bad")
    def not_rescued(q, *, previous=None, feedback=()):
        return "bad"

    with rt:
        assert rescued(1) == "good-fallback"
        assert rt.state(rescued, 1).status == "stable"
        with pytest.raises(incr.NotAccepted):
            not_rescued(1)
    assert len(asked) == 2


def test_on_failure_is_called_with_the_report(rt):
    """`on_failure(report) -> candidate | None` is called when a loop ends without
    acceptance"""
    asked = []

    @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=1),
              on_failure=lambda r: asked.append(r))
    def node(*, previous=None, feedback=()):
        return "bad"

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
    assert asked == [info.value.report]


def test_recheck_every_revisions_and_seconds_at_stabilize():
    """`recheck_every`: re-validate a stable node's candidate every N revisions of its context
    or S seconds (`("revisions", N)` / `("seconds", S)`)."""
    import time
    vcalls = []

    @incr.validator(version="1")
    def ok(candidate, k):
        vcalls.append(k)
        return incr.ACK("ok")

    @incr.llm(validators=[ok], version="1", recheck_every=("revisions", 2))
    def by_revisions(k, *, previous=None, feedback=()):
        return "cand"

    @incr.llm(validators=[ok], version="1", recheck_every=("seconds", 0.05))
    def by_seconds(k, *, previous=None, feedback=()):
        return "cand"

    rt = incr.Runtime()
    tick = rt.input("tick", 0)
    rt.observe(by_revisions, "r")
    rt.stabilize()
    for i in range(1, 5):
        tick.set(i)
        rt.stabilize()
    assert 2 <= vcalls.count("r") <= 4
    rt.observe(by_seconds, "s")
    rt.stabilize()
    rt.stabilize()
    assert vcalls.count("s") == 1
    time.sleep(0.06)
    rt.stabilize()
    assert vcalls.count("s") == 2
    with pytest.raises(ValueError, match="recheck_every"):
        incr.llm(validators=[ok], recheck_every=("days", 1))(
            lambda k, *, previous=None, feedback=(): 1)


def test_recheck_every_applies_to_a_directly_demanded_node(rt):
    """`recheck_every`: re-validate a stable node's candidate every N revisions of its context
    or S seconds"""
    vcalls = []
    tick = rt.input("tick", 0)

    @incr.validator(version="1")
    def ok(candidate):
        vcalls.append(1)
        return incr.ACK("ok")

    @incr.llm(validators=[ok], version="1", recheck_every=("revisions", 1))
    def node(*, previous=None, feedback=()):
        return "cand"

    @incr.cell
    def reader():
        tick.get()
        return node()

    with rt:
        reader()
        for i in range(1, 4):
            tick.set(i)
            reader()
    assert len(vcalls) >= 3


def test_regression_builds_on_the_best_revision(rt):
    """A revision that loses a case an earlier revision had ACKed is a regression: the next
    generation gets the best revision so far as `previous`, with the regression in
    `feedback`."""
    @incr.validator(version="1")
    def cases(candidate):
        for k in "abc":
            yield incr.ACK(k) if k in candidate else incr.NACK(k, counterexample=k)

    answers = ["ab", "a", "abc"]
    log = []

    @incr.llm(validators=[cases], version="1", patience=3)
    def node(*, previous=None, feedback=()):
        log.append((previous, sorted(f.case for f in feedback)))
        return answers[len(log) - 1]

    events = []
    rt.on_event(events.append)
    with rt:
        assert node() == "abc"
    assert log[2][0] == "ab"                 # the best so far, not the last ("a")
    assert "b" in log[2][1]                  # the lost case is in the feedback
    names = [type(e).__name__ for e in events]
    assert "Regression" in names and "Reverted" in names


def test_every_counterexample_is_rechecked_by_its_validator(rt):
    """Every counterexample of a NACK is a regression case re-checked on every later revision
    (by the validator that produced it, or `recheck=`); one nothing can re-check is
    UNKNOWN."""
    seen = []

    @incr.validator(version="1")
    def check(candidate):
        seen.append(candidate)
        return (incr.ACK("len") if len(candidate) > 2
                else incr.NACK("len", counterexample=len(candidate)))

    @incr.llm(validators=[check], version="1")
    def node(*, previous=None, feedback=()):
        return "abc" if previous else "a"

    with rt:
        assert node() == "abc"
        rt.nack(node, revision=2, case="human", counterexample="from outside")
        with pytest.raises(incr.NotAccepted) as info:
            node()                           # the same candidate comes back: no recheck
    kinds = {(k[2], k[3]): v.kind for k, v in rt.state(node).checks.items()}
    assert seen[:2] == ["a", "abc"]
    assert info.value.reason in ("oscillation", "unknown", "no_progress")
    assert any(kind == "UNKNOWN" and case == "human" for (case, _), kind in kinds.items()) \
        or "human" in info.value.report


def test_halt_from_another_thread_stops_before_the_next_model_call_and_resume_lifts_it(rt):
    """`rt.halt(reason)` from any thread or a signal handler: every LLM loop stops before its
    next model call with `NotAccepted(reason="halted")`; `rt.resume()` lifts it."""
    calls = []

    @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=5))
    def node(*, previous=None, feedback=()):
        calls.append(1)
        if len(calls) == 2:
            t = threading.Thread(target=rt.halt, args=("operator said stop",))
            t.start()
            t.join()
        return f"c{len(calls)}"

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
        assert info.value.reason == "halted" and len(calls) == 2
        assert "operator said stop" in info.value.report
        rt.resume()
        with pytest.raises(incr.NotAccepted) as again:
            node()
    assert again.value.reason == "budget" and len(calls) == 5
    with pytest.raises((TypeError, ValueError)):
        rt.halt("")


def test_halt_from_a_signal_handler(rt):
    """`rt.halt(reason)` from any thread or a signal handler: every LLM loop stops before its
    next model call with `NotAccepted(reason="halted")`"""
    import signal
    calls = []
    previous_handler = signal.signal(signal.SIGUSR1, lambda *a: rt.halt("signalled"))
    try:
        @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=5))
        def node(*, previous=None, feedback=()):
            calls.append(1)
            if len(calls) == 2:
                signal.raise_signal(signal.SIGUSR1)
            return f"c{len(calls)}"

        with rt:
            with pytest.raises(incr.NotAccepted) as info:
                node()
    finally:
        signal.signal(signal.SIGUSR1, previous_handler)
        rt.resume()
    assert info.value.reason == "halted" and len(calls) == 2


def test_halt_emits_a_halted_event(rt):
    """`rt.on_event(callback) -> unsubscribe`: typed events (`incr.events.*`): ... halted."""
    events = []
    rt.on_event(events.append)

    @incr.llm(version="1")
    def node(*, previous=None, feedback=()):
        return "c"

    with rt:
        rt.halt("stop")
        with pytest.raises(incr.NotAccepted):
            node()
    assert any("halt" in type(e).__name__.lower() or getattr(e, "reason", "") == "halted"
               for e in events)


def test_on_event_typed_events_and_unsubscribe(rt):
    """`rt.on_event(callback) -> unsubscribe`: typed events (`incr.events.*`): generation
    started and finished (tokens, cost, seconds), verdict, accepted, withdrawn, regression,
    reverted, warning (a monitor past 80% of its threshold), halted."""
    for name in ("GenerationStarted", "GenerationFinished", "Verdict", "Accepted", "Withdrawn",
                 "Regression", "Reverted", "Warning"):
        assert isinstance(getattr(incr.events, name), type), name
    events = []
    unsubscribe = rt.on_event(events.append)

    @incr.validator(version="1")
    def check(candidate):
        return incr.ACK("ok") if candidate == "b" else incr.NACK("ok", counterexample="a")

    @incr.llm(validators=[check], version="1", budget=incr.Budget(max_attempts=2))
    def node(*, previous=None, feedback=()):
        return incr.Candidate("b" if previous else "a", tokens=7, cost=0.5)

    @incr.llm(validators=[_nack_every()], version="1", budget=incr.Budget(max_attempts=5))
    def spender(*, previous=None, feedback=()):
        spent.append(1)
        return "y" * len(spent)

    spent = []

    with rt:
        node()
        rt.nack(node, revision=2, case="human", counterexample="x")
        with pytest.raises(incr.NotAccepted):
            spender()                        # 4 of 5 attempts: past 80%
    kinds = [type(e) for e in events]
    for cls in (incr.events.GenerationStarted, incr.events.GenerationFinished,
                incr.events.Verdict, incr.events.Accepted, incr.events.Withdrawn,
                incr.events.Warning):
        assert cls in kinds, cls.__name__
    fin = next(e for e in events if isinstance(e, incr.events.GenerationFinished))
    assert (fin.tokens, fin.cost) == (7, 0.5) and fin.seconds >= 0
    warn = next(e for e in events if isinstance(e, incr.events.Warning))
    assert warn.used / warn.limit >= 0.8
    n = len(events)
    unsubscribe()

    @incr.llm(version="1")
    def fresh(*, previous=None, feedback=()):
        return "f"

    with rt:
        assert fresh() == "f"                # a generation: no event reaches the callback
    assert len(events) == n
    with pytest.raises(TypeError):
        rt.on_event(3)


def test_not_accepted_report_shows_revisions_reason_and_next_step(rt):
    """`NotAccepted.reason` adds `"divergence"` and `"halted"`; `.report` shows every revision's
    candidate (truncated), rationale and patch, verdicts and counterexamples, the stop reason
    and a suggested next step."""
    @incr.validator(version="1")
    def judge(candidate):
        return incr.NACK("c", counterexample=f"cx-{candidate[:11]}")

    @incr.llm(validators=[judge], version="1", budget=incr.Budget(max_attempts=2))
    def node(*, previous=None, feedback=()):
        n = 2 if previous else 1
        return incr.Candidate(f"candidate-{n}-" + "z" * 5000, rationale=f"because {n}")

    with rt:
        with pytest.raises(incr.NotAccepted) as info:
            node()
    report = info.value.report
    assert "candidate-1-" in report and "candidate-2-" in report
    assert "because 1" in report and "because 2" in report
    assert "z" * 5000 not in report                       # truncated
    assert "NACK" in report and "cx-candidate-" in report and "budget" in report
    assert "next step" in report.lower()


# ============================================================================================
# Collections (v2)
# ============================================================================================

def test_input_map_api(rt):
    """`rt.input_map(name, mapping) -> InputMap`: `m.set(key, value)`, `m.delete(key)`,
    `m.update(mapping)` (one revision), `m.get(key)`, `len(m)`, iteration in key order."""
    m = rt.input_map("m", {"b": 2, "a": 1, "c": 3})
    assert isinstance(m, incr.InputMap)
    assert list(m) == ["a", "b", "c"] and len(m) == 3 and m.get("a") == 1
    r = rt.revision
    m.update({"a": 10, "d": 4})
    assert rt.revision == r + 1 and list(m) == ["a", "b", "c", "d"] and m.get("a") == 10
    m.set("e", 5)
    m.delete("e")
    assert list(m) == ["a", "b", "c", "d"] and rt.revision == r + 3
    tm = rt.input_map("t", {(2, "a"): 1, (1, "b"): 2})
    assert list(tm) == [(1, "b"), (2, "a")]
    with pytest.raises(ValueError):
        rt.input_map("m", {})


@pytest.mark.parametrize("bad", ["list_key", "mapping_int"])
def test_input_map_garbage_names_the_map_and_argument(rt, bad):
    """Keys are encodable scalars or tuples of them. ... Bad arguments raise `TypeError` or
    `ValueError` with a message that names the cell and the argument."""
    with pytest.raises(TypeError) as info:
        if bad == "list_key":
            rt.input_map("m", {"a": 1}).set([1], 1)
        else:
            rt.input_map("m", 3)
    assert "'m'" in str(info.value) or "m:" in str(info.value)


def test_input_map_key_of_another_kind_is_a_type_error(rt):
    """Keys are encodable scalars or tuples of them."""
    m = rt.input_map("m", {"a": 1})
    with pytest.raises(TypeError, match="m"):
        m.set(object(), 1)
    with pytest.raises(TypeError, match="m"):
        m.set(1, 1)                          # one kind of key per map
    assert list(m) == ["a"]


def test_collection_operators(rt):
    """Operators return incremental maps (`IncrMap`), usable inside cells and observable:
    `m.map(fn_or_cell)` (one instance per key: `fn(key, value)`...), `m.filter(pred)` with
    `pred(key, value) -> bool`, `m.map_keys(fn)`, `m.join(other)`, `m.group_by(fn)`, and folds
    that return a cell-like value: `m.sum()`, `m.count()`, `m.min()`, `m.max()`,
    `m.top_k(k, key=None)`, `m.fold(add, remove, init)` (associative: `m.reduce(op,
    identity)`)."""
    m = rt.input_map("m", {"a": 1, "b": 2, "c": 3})
    other = rt.input_map("o", {"a": "A", "b": "B"})
    sq = m.map(lambda k, v: v * v)
    assert isinstance(sq, incr.IncrMap)
    with rt:
        assert dict(sq().items()) == {"a": 1, "b": 4, "c": 9}
        assert dict(m.filter(lambda k, v: v % 2 == 1)().items()) == {"a": 1, "c": 3}
        assert dict(m.map_keys(str.upper)().items()) == {"A": 1, "B": 2, "C": 3}
        assert dict(m.join(other)().items()) == {"a": (1, "A"), "b": (2, "B")}
        groups = m.group_by(lambda k, v: v % 2)()
        assert {g: dict(items.items()) for g, items in groups.items()} == {
            0: {"b": 2}, 1: {"a": 1, "c": 3}}
        assert (m.sum()(), m.count()(), m.min()(), m.max()()) == (6, 3, 1, 3)
        assert m.top_k(2)() == (("c", 3), ("b", 2))
        assert m.reduce(lambda a, b: a + b, 0)() == 6
        assert m.fold(lambda acc, k, v: acc + v, lambda acc, k, v: acc - v, 100)() == 106


def test_folds_are_observable_and_readable_inside_cells(rt):
    """Maps and folds are observable (`rt.observe(total)`); inside a cell, `total()` returns
    the fold's value and `m[key]` / `m.items()` read a map, recording dependencies."""
    m = rt.input_map("m", {"a": 1, "b": 2})
    total = m.sum()
    obs = rt.observe(total)
    seen = []
    obs.on_change(seen.append)
    rt.stabilize()
    runs = []

    @incr.cell
    def only_b():
        runs.append("only_b")
        return m["b"] * 10

    @incr.cell
    def all_items():
        runs.append("all_items")
        return sorted(m.items())

    @incr.cell
    def doubled_total():
        runs.append("doubled_total")
        return total() * 2

    with rt:
        assert (only_b(), all_items(), doubled_total()) == (20, [("a", 1), ("b", 2)], 6)
        runs.clear()
        m.set("a", 5)
        assert (only_b(), all_items(), doubled_total()) == (20, [("a", 5), ("b", 2)], 14)
    assert sorted(runs) == ["all_items", "doubled_total"]     # only_b read "b" only
    rt.stabilize()
    assert seen == [3, 7] and obs.value == 7


def test_changed_key_reruns_only_its_map_instance_and_folds_in_log_n(rt):
    """A changed key re-runs only its own `map` instance and updates each fold along one path
    (O(log n)); a deleted key withdraws its instances."""
    n = 1024
    runs = []
    ops = [0]

    def square(k, v):
        runs.append(k)
        return v * v

    def add(a, b):
        ops[0] += 1
        return a + b

    m = rt.input_map("m", {i: i for i in range(n)})
    sq = m.map(square)
    total = sq.reduce(add, 0)
    with rt:
        assert total() == sum(i * i for i in range(n))
        runs.clear()
        ops[0] = 0
        m.set(500, 0)
        assert total() == sum(i * i for i in range(n)) - 500 * 500
        assert runs == [500]
        assert ops[0] <= 3 * 10 + 4          # one path of a tree over 1024 leaves
        runs.clear()
        m.delete(3)
        assert 3 not in dict(sq().items()) and total() == sum(
            i * i for i in range(n)) - 500 * 500 - 9
        assert runs == []


def test_map_with_an_llm_node(rt):
    """`m.map(fn_or_cell)` (one instance per key: `fn(key, value)`; an `@incr.llm` node
    works)"""
    calls = []

    @incr.llm(version="1")
    def up(k, v, *, previous=None, feedback=()):
        calls.append(k)
        return v.upper()

    m = rt.input_map("m", {"a": "x", "b": "y"})
    out = m.map(up)
    with rt:
        assert dict(out().items()) == {"a": "X", "b": "Y"}
        m.set("b", "z")
        assert dict(out().items()) == {"a": "X", "b": "Z"}
    assert sorted(calls) == ["a", "b", "b"]   # model calls of a map may run concurrently


def test_collections_explain_and_cut_off_like_cells(rt):
    """Collections persist in the store, explain and cut off like cells."""
    m = rt.input_map("m", {"a": 2, "b": 3})
    runs = []
    sq = m.map(lambda k, v: v * v)

    def after(k, v):
        runs.append(k)
        return v + 1

    nxt = sq.map(after)
    total = m.map(lambda k, v: abs(v)).sum()
    readers = []

    @incr.cell
    def reads_total():
        readers.append(1)
        return total()

    with rt:
        dict(nxt().items())
        reads_total()
        runs.clear()
        m.set("a", -2)                       # the square is the same: cut off
        dict(nxt().items())
        assert runs == []
        reads_total()
        assert readers == [1]                # the fold recomputed to an equal value
        text = rt.explain(total)
        assert isinstance(text, str) and "revision" in text


def test_collections_with_a_cell_persist_in_the_store(tmp_path):
    """Collections persist in the store"""
    runs = []

    @incr.cell
    def square(k, v):
        runs.append(k)
        return v * v

    for _ in range(2):
        rt = incr.Runtime(store=tmp_path / "s")
        m = rt.input_map("m", {"a": 1, "b": 2})
        with rt:
            assert m.map(square).sum()() == 5
        rt.close()
    assert sorted(runs) == ["a", "b"]


def test_collections_with_a_plain_function_persist_in_the_store(tmp_path):
    """Collections persist in the store"""
    runs = []

    def square(k, v):
        runs.append(k)
        return v * v

    for _ in range(2):
        rt = incr.Runtime(store=tmp_path / "s")
        m = rt.input_map("m", {"a": 1, "b": 2})
        with rt:
            assert m.map(square).sum()() == 5
        rt.close()
    assert sorted(runs) == ["a", "b"]


def test_map_with_an_async_function_never_yields_a_coroutine(rt):
    """A coroutine is never a candidate or a value."""
    async def tenfold(k, v):
        return v * 10

    m = rt.input_map("m", {"a": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            out = m.map(tenfold)
        except TypeError:
            return                           # refused: the contract is met
        with rt:
            values = dict(out().items())
    assert values == {"a": 10}
